//! The digest a local cache entry carries of its own files, so that a hit is checked, not
//! trusted: a bad disk or a stray write changes a file, not the digest it was stored with.
//!
//! An entry's folder holds [`FILE`], one line per other file in `sha256sum`'s format
//! (`<SHA-256 hex>  <name>`), so `sha256sum -c contents.sha256` in the folder checks it too.
//! It is written into the job's outputs before they are moved into the cache, so an entry is
//! never seen without it.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

/// The digest file of an entry's folder.
pub const FILE: &str = "contents.sha256";

/// Why an entry's files are not the ones it was stored with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("it has no readable {FILE} ({0}): damaged, or not written by this hkpack")]
    NoDigest(String),
    #[error("`{0}` does not match the SHA-256 it was stored with (corrupted)")]
    Corrupted(String),
    #[error("`{0}` is missing (deleted or truncated)")]
    Missing(String),
    #[error("`{0}` was not there when it was stored (added since)")]
    Added(String),
}

/// Writes [`FILE`] for the files now in `dir`.
pub fn write(dir: &Path) -> std::io::Result<()> {
    let lines: String = digests(dir)?
        .iter()
        .map(|(name, digest)| format!("{digest}  {name}\n"))
        .collect();
    std::fs::write(dir.join(FILE), lines)
}

/// Checks the files of `dir` against its [`FILE`]: the same names, each of the same digest.
pub fn check(dir: &Path) -> Result<(), Mismatch> {
    let recorded =
        std::fs::read_to_string(dir.join(FILE)).map_err(|e| Mismatch::NoDigest(e.to_string()))?;
    let mut found = digests(dir).map_err(|e| Mismatch::NoDigest(e.to_string()))?;
    for line in recorded.lines() {
        let Some((digest, name)) = line.split_once("  ") else {
            return Err(Mismatch::NoDigest(format!(
                "line `{line}` is not `<SHA-256>  <name>`"
            )));
        };
        match found.remove(name) {
            Some(actual) if actual == digest => {}
            Some(_) => return Err(Mismatch::Corrupted(name.to_owned())),
            None => return Err(Mismatch::Missing(name.to_owned())),
        }
    }
    match found.into_keys().next() {
        Some(name) => Err(Mismatch::Added(name)),
        None => Ok(()),
    }
}

/// The SHA-256 of each plain file of `dir` but [`FILE`], by name.
fn digests(dir: &Path) -> std::io::Result<BTreeMap<String, String>> {
    let mut digests = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == FILE || !entry.file_type()?.is_file() {
            continue;
        }
        let bytes = std::fs::read(entry.path())?;
        digests.insert(name, hk_format::manifest::hex(&Sha256::digest(bytes)));
    }
    Ok(digests)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("code.co"), b"object").unwrap();
        std::fs::write(dir.path().join("deps.d"), b"code: k.hip\n").unwrap();
        write(dir.path()).unwrap();
        dir
    }

    #[test]
    fn an_entry_checks_only_as_it_was_stored() {
        let dir = entry();
        assert_eq!(check(dir.path()), Ok(()));

        std::fs::write(dir.path().join("code.co"), b"objecu").unwrap();
        assert_eq!(
            check(dir.path()),
            Err(Mismatch::Corrupted("code.co".into()))
        );

        let dir = entry();
        std::fs::remove_file(dir.path().join("deps.d")).unwrap();
        assert_eq!(check(dir.path()), Err(Mismatch::Missing("deps.d".into())));

        let dir = entry();
        std::fs::write(dir.path().join("extra"), b"").unwrap();
        assert_eq!(check(dir.path()), Err(Mismatch::Added("extra".into())));

        let dir = entry();
        std::fs::remove_file(dir.path().join(FILE)).unwrap();
        assert!(matches!(check(dir.path()), Err(Mismatch::NoDigest(_))));
    }
}
