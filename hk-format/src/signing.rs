//! Bundle signatures: an ed25519 signature of the index, `bundle.msgpack`, kept beside it in
//! `bundle.sig`. The index carries the SHA-256 of every module file, code image and ABI file,
//! so signing it signs the bundle; hkload, given the keys it trusts, refuses an unsigned
//! bundle, a signature by another key, and any change to the index, before anything reaches
//! the driver, and then verifies every code image against the signed digests.
//!
//! `bundle.sig` is TOML, for people and for other tools:
//!
//! ```toml
//! key = "ed25519:3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"
//! signature = "…128 hex digits…"
//! ```

use std::fmt;
use std::str::FromStr;

#[cfg(feature = "signed")]
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
#[cfg(feature = "write")]
use ed25519_dalek::{Signer, SigningKey};
use serde::{Deserialize, Serialize};

/// The signature file's name inside a bundle folder.
pub const SIGNATURE_FILE: &str = "bundle.sig";

/// A public key that verifies bundle signatures: `ed25519:` and 64 hex digits in text. Kept as
/// its 32 bytes (checked to be a key when read), which keeps errors that name one small.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey([u8; 32]);

/// A key that signs bundles: 64 hex digits in its file (keep it secret).
#[cfg(feature = "write")]
pub struct SecretKey(SigningKey);

/// What `bundle.sig` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureFile {
    /// The key that made the signature.
    #[serde(with = "crate::text")]
    pub key: PublicKey,
    /// The signature of the index's bytes, in hex.
    pub signature: String,
}

/// Why a bundle's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error(
        "the bundle is not signed ({SIGNATURE_FILE} is missing), but keys are trusted: sign it with `hkpack sign`"
    )]
    Unsigned,
    #[error("{SIGNATURE_FILE} cannot be read: {0}")]
    Malformed(String),
    #[error(
        "{SIGNATURE_FILE} is signed by {found}, which is not among the trusted keys ({trusted})"
    )]
    UntrustedKey { found: PublicKey, trusted: String },
    #[error(
        "the signature in {SIGNATURE_FILE} by {key} does not match bundle.msgpack: the index or the signature was changed after signing"
    )]
    Mismatch { key: PublicKey },
    #[error(
        "`{0}` is not a key: write `ed25519:` and 64 hex digits (a public key), or 64 hex digits (a secret key)"
    )]
    BadKey(String),
    #[error(
        "keys are trusted, but this build of hkload cannot check signatures: enable its `signed` \
         feature"
    )]
    Unsupported,
}

#[cfg(feature = "write")]
impl SecretKey {
    /// The key made from 32 random bytes (the caller's responsibility: the OS's generator).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self(SigningKey::from_bytes(&seed))
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.0.verifying_key().to_bytes())
    }

    /// The signature file of the index `index`.
    pub fn sign(&self, index: &[u8]) -> SignatureFile {
        SignatureFile {
            key: self.public_key(),
            signature: hex(&self.0.sign(index).to_bytes()),
        }
    }

    /// The key as its file holds it.
    pub fn to_text(&self) -> String {
        hex(&self.0.to_bytes())
    }
}

#[cfg(feature = "write")]
impl FromStr for SecretKey {
    type Err = SignatureError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bytes = unhex::<32>(text.trim()).ok_or_else(|| SignatureError::BadKey("…".into()))?;
        Ok(Self::from_seed(bytes))
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ed25519:{}", hex(&self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl FromStr for PublicKey {
    type Err = SignatureError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || SignatureError::BadKey(text.to_owned());
        let hex_part = text.trim().strip_prefix("ed25519:").ok_or_else(bad)?;
        let bytes = unhex::<32>(hex_part).ok_or_else(bad)?;
        // Whether the bytes are a point of the curve: only a build that checks signatures can
        // tell, and only it uses the key.
        #[cfg(feature = "signed")]
        VerifyingKey::from_bytes(&bytes).map_err(|_| bad())?;
        Ok(Self(bytes))
    }
}

impl SignatureFile {
    #[cfg(feature = "signed")]
    pub fn from_toml(text: &str) -> Result<Self, SignatureError> {
        toml::from_str(text).map_err(|e| SignatureError::Malformed(e.message().to_owned()))
    }

    #[cfg(feature = "write")]
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a signature file holds two strings")
    }

    /// Checks that a trusted key signed `index`.
    #[cfg(feature = "signed")]
    pub fn check(&self, index: &[u8], trusted: &[PublicKey]) -> Result<(), SignatureError> {
        if !trusted.contains(&self.key) {
            let trusted: Vec<String> = trusted.iter().map(ToString::to_string).collect();
            return Err(SignatureError::UntrustedKey {
                found: self.key,
                trusted: trusted.join(", "),
            });
        }
        let signature = unhex::<64>(&self.signature)
            .map(|bytes| Signature::from_bytes(&bytes))
            .ok_or_else(|| SignatureError::Malformed("`signature` is not 128 hex digits".into()))?;
        VerifyingKey::from_bytes(&self.key.0)
            .and_then(|key| key.verify(index, &signature))
            .map_err(|_| SignatureError::Mismatch { key: self.key })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lower-case hex only, as written: the same key or signature has one spelling, so that no
/// change to a signature file goes unnoticed.
fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    if text.len() != 2 * N || !text.bytes().all(lower_hex) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(all(test, feature = "write"))]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_its_bytes_and_its_key() {
        let key = SecretKey::from_seed([7; 32]);
        let other = SecretKey::from_seed([8; 32]);
        let index = b"the index".to_vec();
        let file = SignatureFile::from_toml(&key.sign(&index).to_toml()).unwrap();
        assert_eq!(file.key, key.public_key());
        file.check(&index, &[other.public_key(), key.public_key()])
            .unwrap();
        assert!(matches!(
            file.check(&index, &[other.public_key()]),
            Err(SignatureError::UntrustedKey { .. })
        ));
        let mut changed = index.clone();
        changed[0] ^= 1;
        assert_eq!(
            file.check(&changed, &[key.public_key()]),
            Err(SignatureError::Mismatch {
                key: key.public_key()
            })
        );
        let text = key.public_key().to_string();
        assert_eq!(text.parse::<PublicKey>().unwrap(), key.public_key());
        assert!("ed25519:12".parse::<PublicKey>().is_err());
        assert_eq!(
            key.to_text().parse::<SecretKey>().unwrap().public_key(),
            key.public_key()
        );
    }
}
