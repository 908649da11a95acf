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
//! to the store can seal bytes of their choosing. Against them, a writer holding an ed25519
//! key (the format of `hkpack keygen`, as bundles are signed) adds `signature`: a map of
//! `key` (`ed25519:` and 64 hex digits) and `signature` (128 hex digits), bundle.sig's fields,
//! signing the seal (`format`, `answers` and `sha256`, see [`signed_message`]). A reader given
//! trusted keys uses only entries one of them signed ([`Opened::check_signature`]): a copied
//! signature answers another name or another digest, and a writer without the key can make
//! none. Without trusted keys the signature is not looked at, and an entry without one is
//! sealed exactly as before signing existed, so signed and unsigned entries share the layout
//! `hkpack-remote-entry-1` (a reader that predates signing ignores the extra field). Every
//! output is still checked as a compiled one is (its target, code-object version and kernel
//! signatures) before it is stored locally.

use std::collections::BTreeMap;
use std::path::Path;

use hk_format::signing::{PublicKey, SecretKey, SignatureError, SignatureFile};
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
    /// Left out, not written as nil, when unsigned: an unsigned entry's bytes stay those of
    /// the layout before signing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signature: Option<Signature>,
}

/// bundle.sig's two fields, kept as text until a build that trusts keys reads them, so that a
/// damaged signature costs only such a build the entry.
#[derive(Serialize, Deserialize)]
struct Signature {
    key: String,
    signature: String,
}

/// What a signature signs: the seal, after a line no bundle index starts with, so that a
/// key used for both bundles and cache entries never has one signature taken for the other.
fn signed_message(answers: &str, sha256: &str) -> Vec<u8> {
    format!("{FORMAT} signature\nanswers {answers}\nsha256 {sha256}\n").into_bytes()
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

/// `payload` sealed as the answer to `answers`, and signed with `key` when there is one.
pub fn seal(answers: &str, payload: &[u8], key: Option<&SecretKey>) -> Vec<u8> {
    let sha256 = hk_format::manifest::hex(&Sha256::digest(payload));
    let signature = key.map(|key| {
        let signed = key.sign(&signed_message(answers, &sha256));
        Signature {
            key: signed.key.to_string(),
            signature: signed.signature,
        }
    });
    rmp_serde::to_vec_named(&Sealed {
        format: FORMAT,
        answers,
        sha256: &sha256,
        payload,
        signature,
    })
    .expect("a map of strings and bytes always encodes")
}

/// A sealed entry whose seal holds: it answers the name asked for and its contents match
/// their digest. Whether a trusted key signed it is [`Opened::check_signature`]'s to say.
pub struct Opened<'a> {
    pub payload: &'a [u8],
    answers: &'a str,
    sha256: &'a str,
    signature: Option<Signature>,
}

/// The entry in `bytes` if it is sealed as the answer to `answers` and its contents match
/// their digest.
pub fn open<'a>(answers: &str, bytes: &'a [u8]) -> Result<Opened<'a>, Defect> {
    let sealed: Sealed<'a> =
        rmp_serde::from_slice(bytes).map_err(|e| Defect::Unreadable(e.to_string()))?;
    if sealed.format != FORMAT {
        return Err(Defect::OtherFormat(sealed.format.to_owned()));
    }
    if sealed.answers != answers {
        return Err(Defect::Foreign(sealed.answers.to_owned()));
    }
    if hk_format::manifest::hex(&Sha256::digest(sealed.payload)) != sealed.sha256 {
        return Err(Defect::Corrupted);
    }
    Ok(Opened {
        payload: sealed.payload,
        answers: sealed.answers,
        sha256: sealed.sha256,
        signature: sealed.signature,
    })
}

/// Why an entry whose seal holds is still not used by a build that trusts keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    #[error("unsigned")]
    Unsigned,
    #[error("signed by {0}, which is not a trusted key")]
    OtherKey(PublicKey),
    #[error(
        "with a signature by {0} that does not match the entry (copied from another entry, or the entry changed after signing)"
    )]
    Mismatch(PublicKey),
    #[error("with a signature that cannot be read ({0})")]
    Malformed(String),
}

impl Opened<'_> {
    /// Whether one of `trusted` signed this entry's seal.
    pub fn check_signature(&self, trusted: &[PublicKey]) -> Result<(), Untrusted> {
        let signature = self.signature.as_ref().ok_or(Untrusted::Unsigned)?;
        // Not quoted: whoever wrote the entry chose it, and it would go into the warning.
        let key: PublicKey = signature.key.parse().map_err(|_: SignatureError| {
            Untrusted::Malformed("its key is not `ed25519:` and 64 hex digits".into())
        })?;
        let file = SignatureFile {
            key,
            signature: signature.signature.clone(),
        };
        file.check(&signed_message(self.answers, self.sha256), trusted)
            .map_err(|e| match e {
                SignatureError::UntrustedKey { found, .. } => Untrusted::OtherKey(found),
                SignatureError::Mismatch { key } => Untrusted::Mismatch(key),
                SignatureError::Malformed(detail) => Untrusted::Malformed(detail),
                // `check` returns none of the others; should that change, they are said as
                // they are.
                other => Untrusted::Malformed(other.to_string()),
            })
    }
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

    /// What `open` makes of `bytes` asked for as `answers`: the payload or the defect.
    fn opened<'a>(answers: &str, bytes: &'a [u8]) -> Result<&'a [u8], Defect> {
        open(answers, bytes).map(|opened| opened.payload)
    }

    #[test]
    fn an_entry_opens_only_as_what_it_answers_and_only_whole() {
        let sealed = seal("objects/abc", b"code", None);
        assert_eq!(opened("objects/abc", &sealed), Ok(&b"code"[..]));
        assert_eq!(
            opened("objects/def", &sealed),
            Err(Defect::Foreign("objects/abc".into()))
        );
        assert!(matches!(
            opened("objects/abc", &sealed[..sealed.len() - 1]),
            Err(Defect::Unreadable(_))
        ));
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(opened("objects/abc", &flipped), Err(Defect::Corrupted));
    }

    /// `bytes`, an entry, with its signature replaced by `signature`, as anyone who may write
    /// to the store can do.
    fn with_signature(bytes: &[u8], signature: Option<Signature>) -> Vec<u8> {
        let mut sealed: Sealed = rmp_serde::from_slice(bytes).unwrap();
        sealed.signature = signature;
        rmp_serde::to_vec_named(&sealed).unwrap()
    }

    fn signature_of(bytes: &[u8]) -> Option<Signature> {
        rmp_serde::from_slice::<Sealed>(bytes).unwrap().signature
    }

    #[test]
    fn only_a_trusted_keys_signature_of_this_very_seal_is_accepted() {
        let key = SecretKey::from_seed([1; 32]);
        let other = SecretKey::from_seed([2; 32]);
        let trusted = [key.public_key()];
        let signed = seal("objects/abc", b"code", Some(&key));
        let entry = open("objects/abc", &signed).unwrap();
        assert_eq!(
            (entry.payload, entry.check_signature(&trusted)),
            (&b"code"[..], Ok(()))
        );

        // Resealed by a writer without the key: the seal holds, the entry is not used.
        let unsigned = seal("objects/abc", b"code", None);
        let entry = open("objects/abc", &unsigned).unwrap();
        assert_eq!(entry.check_signature(&trusted), Err(Untrusted::Unsigned));
        let by_other = seal("objects/abc", b"code", Some(&other));
        assert_eq!(
            open("objects/abc", &by_other)
                .unwrap()
                .check_signature(&trusted),
            Err(Untrusted::OtherKey(other.public_key()))
        );

        // A signature moved onto another entry, or kept over other contents, matches neither.
        let elsewhere = seal("objects/def", b"other code", None);
        let moved = with_signature(&elsewhere, signature_of(&signed));
        assert_eq!(
            open("objects/def", &moved)
                .unwrap()
                .check_signature(&trusted),
            Err(Untrusted::Mismatch(key.public_key()))
        );
        let kept = with_signature(&seal("objects/abc", b"evil", None), signature_of(&signed));
        assert_eq!(
            open("objects/abc", &kept)
                .unwrap()
                .check_signature(&trusted),
            Err(Untrusted::Mismatch(key.public_key()))
        );
    }

    #[test]
    fn unsigned_entries_keep_their_bytes_and_a_bad_signature_costs_only_trusting_builds() {
        // An entry as hkpack read and wrote it before signing existed.
        #[derive(Serialize, Deserialize)]
        struct Before<'a> {
            format: &'a str,
            answers: &'a str,
            sha256: &'a str,
            #[serde(with = "serde_bytes")]
            payload: &'a [u8],
        }
        let before = rmp_serde::to_vec_named(&Before {
            format: FORMAT,
            answers: "deps/1",
            sha256: &hk_format::manifest::hex(&Sha256::digest(b"k.hip\n")),
            payload: b"k.hip\n",
        })
        .unwrap();
        assert_eq!(seal("deps/1", b"k.hip\n", None), before);
        // That hkpack reads a signed entry too, passing over the signature.
        let signed = seal("deps/1", b"k.hip\n", Some(&SecretKey::from_seed([1; 32])));
        let read: Before = rmp_serde::from_slice(&signed).unwrap();
        assert_eq!(read.payload, b"k.hip\n");

        let damaged = with_signature(
            &before,
            Some(Signature {
                key: "ed25519:12".into(),
                signature: "00".into(),
            }),
        );
        let entry = open("deps/1", &damaged).unwrap();
        assert_eq!(entry.payload, b"k.hip\n");
        assert!(matches!(
            entry.check_signature(&[SecretKey::from_seed([1; 32]).public_key()]),
            Err(Untrusted::Malformed(_))
        ));
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
