//! `hkpack split`: a bundle cut into an index package and one package per build target, so a
//! host installs the code of its own GPUs only. The layout and why it needs no signature of its
//! own are hkload's to define ([`hkload::package_set`]); this writes it.
//!
//! Every package is assembled in a staging folder and moved into place whole, as a bundle is;
//! a package that already holds exactly these bytes is left alone.

use std::path::{Path, PathBuf};

use hk_format::index::INDEX_FILE;
use hk_format::manifest::{MANIFEST_FILE, ModuleRecord, Sha256Digest};
use hk_format::offload;
use hk_format::signing::SIGNATURE_FILE;
use hk_format::target::TargetId;
use hkload::package_set::{TARGET_FILE, TargetPackage, index_package_name, target_package_name};
use hkload::{Bundle, OpenOptions};

use crate::package::{PackageError, ZSTD_LEVEL, write_folder};

/// Writes the packages of the bundle folder `bundle` into `out` (the bundle's own parent
/// folder by default) and returns their folders: the index package first, then one per
/// target in build order.
pub fn split(bundle: &Path, out: &Path) -> Result<Vec<PathBuf>, crate::Error> {
    // Opened verified: every image copied is checked against the index's digest below, and the
    // index against its own.
    let opened = Bundle::open_with(bundle, OpenOptions::DEFAULT)?;
    let manifest = opened.manifest()?;
    let name = format!("{}-{}", manifest.package.name, manifest.package.version);
    let read = |file: &str| {
        let path = bundle.join(file);
        std::fs::read(&path).map_err(|e| hkload::Error::Io {
            path,
            detail: e.to_string(),
        })
    };

    let mut index_files = vec![
        (INDEX_FILE.to_owned(), read(INDEX_FILE)?),
        (MANIFEST_FILE.to_owned(), read(MANIFEST_FILE)?),
    ];
    for module in &manifest.modules {
        index_files.push((module.abi_file.clone(), read(&module.abi_file)?));
    }
    if bundle.join(SIGNATURE_FILE).is_file() {
        index_files.push((SIGNATURE_FILE.to_owned(), read(SIGNATURE_FILE)?));
    }
    let mut written = vec![write_folder(out, &index_package_name(&name), &index_files)?];

    let module_files: Vec<Vec<u8>> = manifest
        .modules
        .iter()
        .map(|module| read(&module.file))
        .collect::<Result<_, _>>()?;
    for target in &manifest.targets {
        let description = TargetPackage {
            target: *target,
            index_digest: opened.index_digest(),
            package: manifest.package.clone(),
        };
        let mut files = vec![(TARGET_FILE.to_owned(), description.to_toml().into_bytes())];
        for (module, bytes) in manifest.modules.iter().zip(&module_files) {
            if let Some(file) = target_module_file(bundle, module, bytes, target)? {
                files.push((module.file.clone(), file));
            }
        }
        written.push(write_folder(
            out,
            &target_package_name(&name, target),
            &files,
        )?);
    }
    Ok(written)
}

/// `module`'s file for `target`'s package: a clang offload bundle of the target's entries
/// alone, each checked against its SHA-256 in the index, compressed as the bundle's file is.
/// `None` when the module has no code for the target (it skips it).
fn target_module_file(
    bundle: &Path,
    module: &ModuleRecord,
    bytes: &[u8],
    target: &TargetId,
) -> Result<Option<Vec<u8>>, crate::Error> {
    let format = |source| PackageError::Format {
        module: module.name.clone(),
        source,
    };
    let mut images = Vec::new();
    for entry in module.entries.iter().filter(|e| e.id.target() == *target) {
        let id = entry.id.to_string();
        let image = offload::extract_entry(bytes, &id).map_err(format)?;
        if Sha256Digest::of(&image) != entry.sha256 {
            return Err(hkload::Error::Mismatch {
                what: format!("entry `{id}` of {}", bundle.join(&module.file).display()),
                detail: format!("its SHA-256 is not the {} the index records", entry.sha256),
            }
            .into());
        }
        images.push((id, image.into_owned()));
    }
    if images.is_empty() {
        return Ok(None);
    }
    let borrowed: Vec<(&str, &[u8])> = images
        .iter()
        .map(|(id, image)| (id.as_str(), image.as_slice()))
        .collect();
    let plain = offload::write_bundle(&borrowed).map_err(format)?;
    let file = if module.compressed {
        offload::compress(&plain, ZSTD_LEVEL).map_err(format)?
    } else {
        plain
    };
    Ok(Some(file))
}
