//! `hkpack verify`: every digest a bundle records, checked against its files, one verdict a
//! file. The index (`bundle.msgpack`) is the root: its own SHA-256 and BLAKE3 cover every
//! record, and its records give each module file's size, SHA-256 and BLAKE3, each code
//! image's, and each ABI file's SHA-256. The readable copies (`bundle.toml`, the ABI files)
//! must say what the index says. A bundle split into packages is checked the same way, package
//! by package ([`packages`]).
//!
//! `hkpack extract`: one code image of a bundle, checked, as a file for LLVM's and NVIDIA's own
//! tools.

pub mod packages;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use serde::Serialize;

use hk_format::index::{INDEX_FILE, Index};
use hk_format::manifest::{
    Blake3Digest, BundleManifest, Digests, EntryRecord, MANIFEST_FILE, ModuleAbi, ModuleRecord,
    Sha256Digest,
};
use hk_format::offload;
use hk_format::signing::{PublicKey, SIGNATURE_FILE, SignatureError, SignatureFile};
use hk_format::target::{EntryId, TargetId};

use crate::error::Error;

/// What one file of the bundle was found to be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileVerdict {
    pub file: String,
    pub intact: bool,
    /// What was checked, or what is wrong.
    pub detail: String,
}

impl FileVerdict {
    fn of(file: &str, result: Result<String, String>) -> Self {
        Self {
            file: file.to_owned(),
            intact: result.is_ok(),
            detail: result.unwrap_or_else(|e| e),
        }
    }
}

/// Checks every file of the bundle folder `dir` against its index, and with `keys` the index's
/// signature. The verdicts come in file order: the index, its signature, `bundle.toml`, then
/// each module's file and ABI file. An index that fails its own digest ends the check there:
/// nothing else can be trusted.
pub fn verify(dir: &Path, keys: &[PublicKey]) -> Vec<FileVerdict> {
    let (mut verdicts, opened) = index_files(dir, keys);
    if let Some((index, manifest)) = opened {
        for (i, module) in manifest.modules.iter().enumerate() {
            verdicts.push(FileVerdict::of(&module.file, module_file(dir, module)));
            verdicts.push(abi_verdict(dir, &index, i, module));
        }
    }
    verdicts
}

/// The verdicts on the files every index travels with (the index, its signature,
/// `bundle.toml`), and the index opened if it is intact.
fn index_files(
    dir: &Path,
    keys: &[PublicKey],
) -> (Vec<FileVerdict>, Option<(Index, BundleManifest)>) {
    let mut verdicts = Vec::new();
    let verdict = FileVerdict::of;
    let bytes = match std::fs::read(dir.join(INDEX_FILE)) {
        Ok(bytes) => bytes,
        Err(e) => {
            verdicts.push(verdict(INDEX_FILE, Err(format!("cannot be read: {e}"))));
            return (verdicts, None);
        }
    };
    // The signature is of the index's bytes, which opening the index then takes.
    let signed = signature(dir, &bytes, keys);
    // Both of the index's digests of itself: opening checks the BLAKE3 where there is one.
    let opened = Index::open(bytes, true)
        .and_then(|index| index.check_sha256().map(|()| index))
        .map_err(|e| e.to_string())
        .and_then(|index| {
            let manifest = index.manifest().map_err(|e| e.to_string())?.clone();
            Ok((index, manifest))
        });
    let (index, manifest) = match opened {
        Ok(opened) => opened,
        Err(problem) => {
            verdicts.push(verdict(INDEX_FILE, Err(problem)));
            return (verdicts, None);
        }
    };
    verdicts.push(verdict(
        INDEX_FILE,
        Ok(format!(
            "its SHA-256 and BLAKE3 cover {} modules of format {}",
            manifest.modules.len(),
            manifest.format_version
        )),
    ));
    if let Some(signed) = signed {
        verdicts.push(verdict(SIGNATURE_FILE, signed));
    }
    verdicts.push(verdict(MANIFEST_FILE, readable_manifest(dir, &manifest)));
    (verdicts, Some((index, manifest)))
}

/// The verdict on module `i`'s ABI file.
fn abi_verdict(dir: &Path, index: &Index, i: usize, module: &ModuleRecord) -> FileVerdict {
    let abi = index.module_abi(i).map_err(|e| e.to_string());
    FileVerdict::of(
        &module.abi_file,
        abi.and_then(|abi| abi_file(dir, module, &abi)),
    )
}

/// The signature's verdict: checked against `keys` if any are given, else only mentioned if
/// there is one.
fn signature(dir: &Path, index: &[u8], keys: &[PublicKey]) -> Option<Result<String, String>> {
    let text = match std::fs::read_to_string(dir.join(SIGNATURE_FILE)) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && keys.is_empty() => return None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some(Err(SignatureError::Unsigned.to_string()));
        }
        Err(e) => return Some(Err(format!("cannot be read: {e}"))),
    };
    Some(
        SignatureFile::from_toml(&text)
            .and_then(|file| {
                if keys.is_empty() {
                    return Ok(format!(
                        "by {}, not checked: give the keys to trust with --key",
                        file.key
                    ));
                }
                file.check(index, keys)
                    .map(|()| format!("a valid signature of the index by {}", file.key))
            })
            .map_err(|e| e.to_string()),
    )
}

/// `bundle.toml` must hold the records of the index.
fn readable_manifest(dir: &Path, manifest: &BundleManifest) -> Result<String, String> {
    let text = std::fs::read_to_string(dir.join(MANIFEST_FILE))
        .map_err(|e| format!("cannot be read: {e}"))?;
    let read = BundleManifest::from_toml(&text).map_err(|e| e.to_string())?;
    if &read == manifest {
        Ok("holds the index's records".into())
    } else {
        Err("does not hold the index's records: it was edited after the build".into())
    }
}

/// The module file's bytes, after its size and every digest against the index (what
/// `inspect` and `explain` check of it).
pub(crate) fn module_bytes(dir: &Path, module: &ModuleRecord) -> Result<Vec<u8>, String> {
    let bytes =
        std::fs::read(dir.join(&module.file)).map_err(|e| format!("cannot be read: {e}"))?;
    if bytes.len() as u64 != module.size {
        return Err(format!(
            "is {} bytes, the index says {}",
            bytes.len(),
            module.size
        ));
    }
    every_digest(&bytes, &module.digests()).map_err(|e| format!("has {e}"))?;
    Ok(bytes)
}

/// The module file as [`module_bytes`] checks it, and each code image in it readable and of
/// its size and digests.
fn module_file(dir: &Path, module: &ModuleRecord) -> Result<String, String> {
    let bytes = module_bytes(dir, module)?;
    for entry in &module.entries {
        let image = offload::extract_entry(&bytes, &entry.id.to_string())
            .map_err(|e| format!("entry {}: {e}", entry.id))?;
        check_image(&image, entry)?;
    }
    Ok(format!(
        "{} bytes and {} code images match their SHA-256 and BLAKE3",
        bytes.len(),
        module.entries.len(),
    ))
}

/// The code image of `entry`: its size and every digest against the index.
fn check_image(image: &[u8], entry: &EntryRecord) -> Result<(), String> {
    let id = entry.id;
    if image.len() as u64 != entry.size {
        return Err(format!(
            "entry {id} is {} bytes, the index says {}",
            image.len(),
            entry.size
        ));
    }
    every_digest(image, &entry.digests()).map_err(|e| format!("entry {id} has {e}"))
}

/// Checks `bytes` against both digests recorded, SHA-256 and BLAKE3 (hkload checks the
/// BLAKE3; this, both).
fn every_digest(bytes: &[u8], recorded: &Digests) -> Result<(), String> {
    let found = Sha256Digest::of(bytes);
    if found != recorded.sha256 {
        return Err(format!(
            "SHA-256 {found}, the index says {}",
            recorded.sha256
        ));
    }
    let found = Blake3Digest::of(bytes);
    if found != recorded.blake3 {
        return Err(format!(
            "BLAKE3 {found}, the index says {}",
            recorded.blake3
        ));
    }
    Ok(())
}

/// The ABI file's SHA-256, and its records against the index's.
fn abi_file(dir: &Path, module: &ModuleRecord, abi: &ModuleAbi) -> Result<String, String> {
    let text = std::fs::read_to_string(dir.join(&module.abi_file))
        .map_err(|e| format!("cannot be read: {e}"))?;
    let found = Sha256Digest::of(text.as_bytes());
    if found != module.abi_sha256 {
        return Err(format!(
            "has SHA-256 {found}, the index says {}",
            module.abi_sha256
        ));
    }
    let read = ModuleAbi::from_toml(&text, module).map_err(|e| e.to_string())?;
    if &read != abi {
        return Err("does not hold the index's kernel records".into());
    }
    Ok(format!(
        "holds the records of {} kernels",
        abi.kernels.len()
    ))
}

/// The verdicts as lines for people, the last one the bundle's: `ok` or `DAMAGED` and the file.
pub fn report(dirs: &[PathBuf], verdicts: &[FileVerdict]) -> String {
    let what = dirs
        .iter()
        .map(|dir| dir.display().to_string())
        .collect::<Vec<_>>()
        .join(" + ");
    let width = verdicts.iter().map(|v| v.file.len()).max().unwrap_or(0);
    let mut out = String::new();
    for v in verdicts {
        let status = if v.intact { "ok" } else { "DAMAGED" };
        out.push_str(&format!("{status:<8} {:<width$}  {}\n", v.file, v.detail));
    }
    let damaged = verdicts.iter().filter(|v| !v.intact).count();
    out.push_str(&if damaged == 0 {
        format!("{what}: every file matches its index\n")
    } else {
        format!(
            "{what}: {damaged} file(s) damaged; rebuild the bundle with `hkpack build` (and \
             split it again with `hkpack split`)\n"
        )
    });
    out
}

/// Which code image `extract` writes.
#[derive(Debug, Clone)]
pub enum Pick {
    /// The native image built for a target: the AMD code object, or the cubin for `sm_NN`.
    Target(TargetId),
    /// An exact entry ID (`cuda-nvptx64-nvidia-cuda-compute_90` for the PTX).
    Entry(String),
}

/// Writes the code image `pick` of module `module` of the bundle `dir` to `out`, after checking
/// its size and SHA-256 against the index. Returns the entry written.
pub fn extract(dir: &Path, module: &str, pick: &Pick, out: &Path) -> Result<EntryId, Error> {
    let invalid = |detail: String| Error::Extract {
        bundle: dir.to_owned(),
        detail,
    };
    let index = Index::open(
        std::fs::read(dir.join(INDEX_FILE)).map_err(|e| invalid(format!("{INDEX_FILE}: {e}")))?,
        true,
    )
    .map_err(|e| invalid(e.to_string()))?;
    let manifest = index.manifest().map_err(|e| invalid(e.to_string()))?;
    let record = manifest
        .modules
        .iter()
        .find(|m| m.name == module)
        .ok_or_else(|| {
            let names: Vec<&str> = manifest.modules.iter().map(|m| m.name.as_str()).collect();
            invalid(format!("no module `{module}`; it has {}", names.join(", ")))
        })?;
    let ids = || {
        record
            .entries
            .iter()
            .map(|e| e.id.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let entry = record
        .entries
        .iter()
        .find(|e| match pick {
            Pick::Target(target) => e.id.target() == *target && !matches!(e.id, EntryId::Ptx(_)),
            Pick::Entry(id) => e.id.to_string() == *id,
        })
        .ok_or_else(|| {
            invalid(format!(
                "module `{module}` has no such entry; it has {}",
                ids()
            ))
        })?;
    let path: PathBuf = dir.join(&record.file);
    let bytes = std::fs::read(&path).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    let image: Cow<'_, [u8]> = offload::extract_entry(&bytes, &entry.id.to_string())
        .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    check_image(&image, entry).map_err(invalid)?;
    std::fs::write(out, &image).map_err(|e| invalid(format!("{}: {e}", out.display())))?;
    Ok(entry.id)
}
