//! What the remote cache stores: each value is *sealed* with the name it answers and the
//! SHA-256 of its contents, so that whatever comes back is checked before it is used.
//!
//! A sealed entry is one MessagePack map: `format` (this layout's version), `answers` (the
//! entry's own path in the store, e.g. `objects/<key>`), `sha256` (lower-case hex, of
//! `payload`) and `payload`. A truncated or corrupted entry fails to decode or to match its
//! digest; a different job's entry stored under this name (a swapped or misplaced object)
//! answers another name. The payload of a job's outputs is itself a MessagePack map from file
//! name to contents.
//!
//! The seal protects against damage, not against a writer who means harm: anyone who may write
//! to the store can seal bytes of their choosing. Untrusted builds (pull requests from forks)
//! read the cache with `--cache-readonly`; every output is still checked as a compiled one is
//! (its target, code-object version and kernel signatures) before it is stored locally.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use sha2::{Digest, Sha256};

/// The layout's version; an entry of another version is a miss, rebuilt and overwritten.
const FORMAT: &str = "hkpack-remote-entry-1";

#[derive(Serialize, Deserialize)]
struct Sealed<'a> {
    format: &'a str,
    answers: &'a str,
    sha256: &'a str,
    #[serde(with = "serde_bytes")]
    payload: &'a [u8],
}

/// Why an entry that came back cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Defect {
    #[error("it is not a sealed hkpack entry (truncated or overwritten): {0}")]
    Unreadable(String),
    #[error("it is of layout `{0}`, this hkpack writes `{FORMAT}`")]
    OtherFormat(String),
    #[error("it holds the entry of `{0}`, another job's outputs")]
    Foreign(String),
    #[error("its contents do not match the SHA-256 it was stored with (corrupted)")]
    Corrupted,
    #[error("its contents are not a job's output files: {0}")]
    NotOutputs(String),
    /// Shown only by a build that succeeds, so its job's outputs from elsewhere passed.
    #[error("its outputs are another job's or damaged: they fail this job's checks ({0})")]
    FailsCheck(String),
}

/// `payload` sealed as the answer to `answers`.
pub fn seal(answers: &str, payload: &[u8]) -> Vec<u8> {
    let sha256 = hkload::manifest::hex(&Sha256::digest(payload));
    rmp_serde::to_vec_named(&Sealed {
        format: FORMAT,
        answers,
        sha256: &sha256,
        payload,
    })
    .expect("a map of strings and bytes always encodes")
}

/// The payload of `bytes` if they are a sealed entry answering `answers` whose contents match
/// their digest.
pub fn open<'a>(answers: &str, bytes: &'a [u8]) -> Result<&'a [u8], Defect> {
    let sealed: Sealed<'a> =
        rmp_serde::from_slice(bytes).map_err(|e| Defect::Unreadable(e.to_string()))?;
    if sealed.format != FORMAT {
        return Err(Defect::OtherFormat(sealed.format.to_owned()));
    }
    if sealed.answers != answers {
        return Err(Defect::Foreign(sealed.answers.to_owned()));
    }
    if hkload::manifest::hex(&Sha256::digest(sealed.payload)) != sealed.sha256 {
        return Err(Defect::Corrupted);
    }
    Ok(sealed.payload)
}

/// The files of a job's output folder, by name, as one payload; not the local entry's
/// digest, which the seal replaces and the reader writes afresh.
pub fn pack_outputs(dir: &Path) -> std::io::Result<Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == super::contents::FILE || !entry.file_type()?.is_file() {
            continue;
        }
        files.insert(name, ByteBuf::from(std::fs::read(entry.path())?));
    }
    Ok(rmp_serde::to_vec(&files).expect("a map of strings and bytes always encodes"))
}

/// Writes the files of a payload made by [`pack_outputs`] into the empty folder `dir`.
/// Returns the defect if the payload is not such a map or names a file outside `dir`.
pub fn unpack_outputs(payload: &[u8], dir: &Path) -> Result<(), UnpackError> {
    let files: BTreeMap<String, ByteBuf> = rmp_serde::from_slice(payload)
        .map_err(|e| UnpackError::Defect(Defect::NotOutputs(e.to_string())))?;
    for (name, bytes) in &files {
        if !is_plain_file_name(name) {
            return Err(UnpackError::Defect(Defect::NotOutputs(format!(
                "`{name}` is not a plain file name"
            ))));
        }
        std::fs::write(dir.join(name), bytes).map_err(UnpackError::Io)?;
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(transparent)]
    Defect(Defect),
    #[error("cannot write the entry's files: {0}")]
    Io(std::io::Error),
}

/// A name that stays inside the folder it is joined to.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_opens_only_as_what_it_answers_and_only_whole() {
        let sealed = seal("objects/abc", b"code");
        assert_eq!(open("objects/abc", &sealed), Ok(&b"code"[..]));
        assert_eq!(
            open("objects/def", &sealed),
            Err(Defect::Foreign("objects/abc".into()))
        );
        assert!(matches!(
            open("objects/abc", &sealed[..sealed.len() - 1]),
            Err(Defect::Unreadable(_))
        ));
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(open("objects/abc", &flipped), Err(Defect::Corrupted));
    }

    #[test]
    fn outputs_round_trip_and_no_name_escapes_the_folder() {
        let from = tempfile::tempdir().unwrap();
        std::fs::write(from.path().join("code.co"), b"elf").unwrap();
        std::fs::write(from.path().join("deps.d"), b"code: k.hip\n").unwrap();
        let payload = pack_outputs(from.path()).unwrap();
        let to = tempfile::tempdir().unwrap();
        unpack_outputs(&payload, to.path()).unwrap();
        assert_eq!(std::fs::read(to.path().join("code.co")).unwrap(), b"elf");
        assert_eq!(
            std::fs::read(to.path().join("deps.d")).unwrap(),
            b"code: k.hip\n"
        );

        let evil: BTreeMap<String, ByteBuf> =
            [("../escape".to_owned(), ByteBuf::from(b"x".to_vec()))].into();
        let evil = rmp_serde::to_vec(&evil).unwrap();
        let err = unpack_outputs(&evil, to.path()).unwrap_err();
        assert!(err.to_string().contains("not a plain file name"), "{err}");
        assert!(!to.path().parent().unwrap().join("escape").exists());
    }
}
