//! `hkpack verify` over a bundle split into packages ([`hkload::package_set`]): the index
//! package (or the full bundle) checked as a bundle is, and each target package given beside
//! it against the same index: its `target.toml` names this package, version and index, and
//! each module file holds exactly the index's code images for its target, each of the size
//! and digests the index records. A host installs the packages of its own GPUs only, so a
//! target whose package is not given is no damage.

use std::path::{Path, PathBuf};

use hk_format::index::{INDEX_FILE, Index};
use hk_format::manifest::{BundleManifest, ModuleRecord};
use hk_format::offload::{self, OffloadBundle};
use hk_format::signing::PublicKey;
use hk_format::target::TargetId;
use hkload::package_set::{TARGET_FILE, TargetPackage};

use super::{FileVerdict, abi_verdict, check_image, index_files, module_file};

/// Checks the bundle or package set made of the folders `dirs`: one full bundle or index
/// package, and any number of target packages split from it. Given several folders, the
/// verdicts name each file by its folder (`hk-kernels-0.1.0-sm_90/rmsnorm.hipfb`); given one,
/// as [`super::verify`] names them.
///
/// Fails, checking nothing, when `dirs` is not such a set: no index among them, two, or a
/// folder that is neither a bundle nor a package.
pub fn verify_set(dirs: &[PathBuf], keys: &[PublicKey]) -> Result<Vec<FileVerdict>, String> {
    let mut index_dir: Option<&Path> = None;
    let mut targets = Vec::new();
    for dir in dirs {
        if dir.join(TARGET_FILE).is_file() {
            targets.push(dir.as_path());
        } else if dir.join(INDEX_FILE).is_file() {
            if let Some(first) = index_dir.replace(dir) {
                return Err(format!(
                    "{} and {} both hold an index ({INDEX_FILE}); give one bundle or index \
                     package, and the target packages split from it",
                    first.display(),
                    dir.display()
                ));
            }
        } else {
            return Err(format!(
                "{} is neither a bundle, an index package nor a target package: it holds \
                 neither {INDEX_FILE} nor {TARGET_FILE}",
                dir.display()
            ));
        }
    }
    let Some(index_dir) = index_dir else {
        return Err(format!(
            "no index among {}: give the index package (`<name>-<version>-index`, as `hkpack \
             split` writes it) or the full bundle too",
            list(dirs)
        ));
    };

    let several = dirs.len() > 1;
    let named = |dir: &Path, verdicts: Vec<FileVerdict>| match several {
        true => named(dir, verdicts),
        false => verdicts,
    };
    let (mut index_verdicts, opened) = index_files(index_dir, keys);
    let Some((index, manifest)) = opened else {
        return Ok(named(index_dir, index_verdicts));
    };
    // A full bundle holds its module files; an index package none.
    let whole = manifest
        .modules
        .iter()
        .any(|module| index_dir.join(&module.file).exists());
    for (i, module) in manifest.modules.iter().enumerate() {
        if whole {
            index_verdicts.push(FileVerdict::of(
                &module.file,
                module_file(index_dir, module),
            ));
        }
        index_verdicts.push(abi_verdict(index_dir, &index, i, module));
    }
    let mut verdicts = named(index_dir, index_verdicts);
    for dir in targets {
        verdicts.extend(named(
            dir,
            target_package(dir, index_dir, &index, &manifest),
        ));
    }
    Ok(verdicts)
}

/// The verdicts on the target package at `dir` against the index at `index_dir`: its
/// description, then each module file the index says it holds.
fn target_package(
    dir: &Path,
    index_dir: &Path,
    index: &Index,
    manifest: &BundleManifest,
) -> Vec<FileVerdict> {
    let described = std::fs::read_to_string(dir.join(TARGET_FILE))
        .map_err(|e| format!("cannot be read: {e}"))
        .and_then(|text| {
            TargetPackage::from_toml(&text)
                .map_err(|e| format!("is not a target package's description: {e}"))
        });
    let target = match described {
        Ok(found) => {
            let expected = TargetPackage {
                target: found.target,
                index_digest: index.digest(),
                package: manifest.package.clone(),
            };
            if found != expected || !manifest.targets.contains(&found.target) {
                let error = format!(
                    "the package is {}, but the index at {} is {} for targets {}: it was split \
                     from another build",
                    describe(&found),
                    index_dir.display(),
                    describe(&expected),
                    manifest
                        .targets
                        .iter()
                        .map(TargetId::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                return vec![FileVerdict::of(TARGET_FILE, Err(error))];
            }
            found.target
        }
        Err(problem) => return vec![FileVerdict::of(TARGET_FILE, Err(problem))],
    };
    let mut verdicts = vec![FileVerdict::of(
        TARGET_FILE,
        Ok(format!(
            "{}'s package of {} {}, split from this index",
            target, manifest.package.name, manifest.package.version
        )),
    )];
    let held: Vec<&ModuleRecord> = manifest
        .modules
        .iter()
        .filter(|module| module.entries.iter().any(|e| e.id.target() == target))
        .collect();
    for module in &held {
        verdicts.push(FileVerdict::of(
            &module.file,
            target_module_file(dir, module, &target),
        ));
    }
    verdicts.extend(stray_files(dir, manifest, &held, &target));
    verdicts
}

/// A verdict on each file of the target package at `dir` that is neither its description nor
/// one of the module files `held` of `target`, in name order. Such a file is no part of the
/// package `hkpack split` writes: another target's module file left there would be read by
/// nothing, yet a package that holds it is not the one its index vouches for.
fn stray_files(
    dir: &Path,
    manifest: &BundleManifest,
    held: &[&ModuleRecord],
    target: &TargetId,
) -> Vec<FileVerdict> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            return vec![FileVerdict::of(
                ".",
                Err(format!("the package's folder cannot be listed: {e}")),
            )];
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name != TARGET_FILE && !held.iter().any(|m| m.file == *name))
        .collect();
    names.sort_unstable();
    names
        .iter()
        .map(|name| {
            let problem = match manifest.modules.iter().find(|m| m.file == *name) {
                Some(module) => {
                    let why = module
                        .not_built
                        .iter()
                        .find(|n| n.target == *target)
                        .map_or(String::new(), |n| {
                            format!(" (it is not built for {target}: {})", n.reason)
                        });
                    format!(
                        "is the file of module {}, but the index lists no code of it for                          {target}{why}; it does not belong in this package: remove it",
                        module.name
                    )
                }
                None => format!(
                    "is no file of {target}'s package: it holds {TARGET_FILE} and the module                      files the index lists for {target} alone; remove it"
                ),
            };
            FileVerdict::of(name, Err(problem))
        })
        .collect()
}

/// `module`'s file in `target`'s package at `dir`: exactly the index's code images of the
/// target, each of its size and digests.
fn target_module_file(
    dir: &Path,
    module: &ModuleRecord,
    target: &TargetId,
) -> Result<String, String> {
    let bytes = std::fs::read(dir.join(&module.file)).map_err(|e| {
        format!(
            "cannot be read ({e}); the index lists code of module {} for {target}",
            module.name
        )
    })?;
    let plain = offload::decompress(&bytes).map_err(|e| e.to_string())?;
    let held = OffloadBundle::parse(&plain).map_err(|e| e.to_string())?;
    let expected: Vec<_> = module
        .entries
        .iter()
        .filter(|e| e.id.target() == *target)
        .collect();
    let mut held_ids: Vec<&str> = held.entries().iter().map(|e| e.id).collect();
    let mut expected_ids: Vec<String> = expected.iter().map(|e| e.id.to_string()).collect();
    held_ids.sort_unstable();
    expected_ids.sort_unstable();
    if held_ids != expected_ids {
        return Err(format!(
            "holds entries [{}], the index lists [{}] for {target}",
            held_ids.join(", "),
            expected_ids.join(", ")
        ));
    }
    for entry in &expected {
        let id = entry.id.to_string();
        let image = held
            .entry(&id)
            .ok_or_else(|| format!("entry {id} is missing"))?;
        check_image(image.bytes, entry)?;
    }
    Ok(format!(
        "{} code image{} for {target}, each matching its SHA-256 and BLAKE3",
        expected.len(),
        if expected.len() == 1 { "" } else { "s" },
    ))
}

/// `hk-kernels 0.1.0 for gfx942, index 3b1f…`.
fn describe(package: &TargetPackage) -> String {
    format!(
        "{} {} for {}, index {}",
        package.package.name, package.package.version, package.target, package.index_digest
    )
}

/// The verdicts with each file named inside its folder: `hk-kernels-0.1.0-sm_90/rmsnorm.hipfb`.
fn named(dir: &Path, verdicts: Vec<FileVerdict>) -> Vec<FileVerdict> {
    let folder = dir.file_name().map_or_else(
        || dir.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    );
    verdicts
        .into_iter()
        .map(|v| FileVerdict {
            file: format!("{folder}/{}", v.file),
            ..v
        })
        .collect()
}

fn list(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
