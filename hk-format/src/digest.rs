//! The digests a bundle records of its bytes: SHA-256 (what `sha256sum`, LLVM-side tools and
//! `hkpack verify` check) and BLAKE3 beside it for each code image and module file, which is
//! what hkload checks on its load path.
//!
//! Why two: verifying a 661 KiB cubin with SHA-256 took about 320 µs on the development machine
//! (SHA extensions), longer than the CUDA driver takes to load it on the H100 machine, and made
//! a verified cold start 5x the raw `cuModuleLoadData`; BLAKE3 hashed it in 66 µs. SHA-256
//! stays the digest people and other tools know, and the one the index's own envelope carries.

use serde::{Deserialize, Serialize};

/// Defines a 32-byte digest type: lower-case hex in the TOML files and in messages, the 32
/// bytes themselves in the index.
macro_rules! digest_type {
    ($(#[$doc:meta])* $name:ident, $algorithm:literal, $hash:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(pub [u8; 32]);

        impl $name {
            /// The digest of `bytes`.
            pub fn of(bytes: &[u8]) -> Self {
                Self($hash(bytes))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&hex(&self.0))
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({self})", stringify!($name))
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                parse_hex(text).map(Self).ok_or_else(|| {
                    format!(concat!("`{}` is not a ", $algorithm, " digest (64 lower-case hex digits)"), text)
                })
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                if serializer.is_human_readable() {
                    crate::text::serialize(self, serializer)
                } else {
                    serializer.serialize_bytes(&self.0)
                }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                if deserializer.is_human_readable() {
                    return crate::text::deserialize(deserializer);
                }
                let bytes = serde_bytes::ByteArray::<32>::deserialize(deserializer)?;
                Ok(Self(bytes.into_array()))
            }
        }
    };
}

digest_type!(
    /// A SHA-256 digest, as `sha256sum` prints it.
    Sha256Digest,
    "SHA-256",
    |bytes: &[u8]| {
        use sha2::Digest;
        sha2::Sha256::digest(bytes).into()
    }
);

digest_type!(
    /// A BLAKE3 digest (32 bytes, the default output length), as `b3sum` prints it.
    Blake3Digest,
    "BLAKE3",
    |bytes: &[u8]| *blake3::hash(bytes).as_bytes()
);

/// What the index records of some bytes: their SHA-256 and their BLAKE3.
///
/// ```
/// use hk_format::digest::Digests;
///
/// let recorded = Digests::of(b"code image");
/// assert_eq!(recorded.check(b"code image"), Ok(()));
/// let refused = recorded.check(b"code imagf").unwrap_err();
/// assert!(refused.starts_with("its BLAKE3 is "), "{refused}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digests {
    pub sha256: Sha256Digest,
    pub blake3: Blake3Digest,
}

impl Digests {
    /// Both digests of `bytes`: what hkpack records.
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            sha256: Sha256Digest::of(bytes),
            blake3: Blake3Digest::of(bytes),
        }
    }

    /// Checks `bytes` against the faster digest, the BLAKE3; on a mismatch, says so with both
    /// values. (`hkpack verify` checks the SHA-256 too.)
    pub fn check(&self, bytes: &[u8]) -> Result<(), String> {
        let found = Blake3Digest::of(bytes);
        if found == self.blake3 {
            return Ok(());
        }
        Err(format!(
            "its BLAKE3 is {}, the manifest says {}",
            hex(&found.0),
            hex(&self.blake3.0)
        ))
    }

    /// The size from which hashing `bytes` on a second thread while the driver loads them
    /// saves time: where the hash takes longer than starting and joining a thread, which took
    /// 23 µs on the development machine (scoped, median of 200). There BLAKE3 ran at 10 GB/s
    /// (256 KiB in about 26 µs).
    pub const CONCURRENT_FROM: usize = 256 * 1024;
}

/// Lower-case hex of `bytes`, the form the manifest records digests in.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(2 * bytes.len()), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The 32 bytes written as 64 lower-case hex digits in `text`.
fn parse_hex(text: &str) -> Option<[u8; 32]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let text = text.as_bytes();
    if text.len() != 64 {
        return None;
    }
    let mut digest = [0; 32];
    for (byte, pair) in digest.iter_mut().zip(text.chunks_exact(2)) {
        *byte = digit(pair[0])
            .zip(digit(pair[1]))
            .map(|(hi, lo)| hi << 4 | lo)?;
    }
    Some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_the_standard_ones() {
        // `printf abc | sha256sum` and `printf abc | b3sum`.
        assert_eq!(
            Sha256Digest::of(b"abc").to_string(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            Blake3Digest::of(b"abc").to_string(),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
        let text = Blake3Digest::of(b"abc").to_string();
        assert_eq!(text.parse::<Blake3Digest>(), Ok(Blake3Digest::of(b"abc")));
        assert!(
            "6437"
                .parse::<Blake3Digest>()
                .unwrap_err()
                .contains("BLAKE3")
        );
        assert!(text.to_uppercase().parse::<Blake3Digest>().is_err());
    }

    #[test]
    fn checks_with_blake3() {
        let recorded = Digests::of(b"code image");
        assert_eq!(recorded.check(b"code image"), Ok(()));
        let error = recorded.check(b"code imagf").unwrap_err();
        assert!(error.starts_with("its BLAKE3 is "), "{error}");
        assert!(error.contains(&recorded.blake3.to_string()), "{error}");

        // A wrong BLAKE3 is not excused by a right SHA-256.
        let wrong_blake3 = Digests {
            blake3: Blake3Digest::of(b"other"),
            ..recorded
        };
        assert!(wrong_blake3.check(b"code image").is_err());
    }
}
