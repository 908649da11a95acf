//! A bundle split into packages, one per target, and found on a search path: what lets a fleet
//! install only the code its GPUs run.
//!
//! `hkpack split` (or `hkpack build --split`) writes, next to the full bundle
//! `hk-kernels-0.1.0/`:
//!
//! * the index package `hk-kernels-0.1.0-index/`: the bundle's index, `bundle.toml`, the ABI
//!   files and the signature, if any; no module file;
//! * a target package per build target, `hk-kernels-0.1.0-gfx942/`: per module one module file
//!   of the same name as the full bundle's, a standard clang offload bundle holding that
//!   target's code images only (an NVIDIA target's cubin and PTX), each byte for byte the full
//!   bundle's, and [`TARGET_FILE`], which names the package, its target and the digest of the
//!   index it was split from.
//!
//! hkload's `Bundle::open_search_path` looks in each folder of a search path, in order, for
//! the full bundle or the index package, then for each target's package; every code object
//! is chosen from the union of the packages found, as if they were one bundle.
//!
//! Trust needs nothing new: the index holds the SHA-256 of every code image, and with
//! verification on, hkload hashes each image against it before the driver sees it, so a
//! signed or pinned index vouches for the images of every package split from it. A target
//! package's own file is not trusted for anything but a clear error: a package split from
//! another build names another index digest and is refused, naming both.

use serde::{Deserialize, Serialize};

use crate::manifest::{Package, Sha256Digest};
use crate::target::TargetId;

/// A target package's description, inside its folder.
pub const TARGET_FILE: &str = "target.toml";

/// The suffix of the index package's folder: `hk-kernels-0.1.0-index`.
pub const INDEX_SUFFIX: &str = "index";

/// What [`TARGET_FILE`] says: whose package this is, for which target, split from which index.
///
/// ```toml
/// target = "gfx942"
/// index_digest = "…"
///
/// [package]
/// name = "hk-kernels"
/// version = "0.1.0"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetPackage {
    pub target: TargetId,
    /// The digest the index records of itself (see [`crate::index::Index::digest`]): one
    /// build's index, whatever its folder is called.
    pub index_digest: Sha256Digest,
    pub package: Package,
}

#[cfg(feature = "toml")]
impl TargetPackage {
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.message().trim_end().to_owned())
    }

    /// The file's text; deterministic for the same package.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a target package always serialises: every key is a string")
    }
}

/// `hk-kernels-0.1.0-gfx942`: the folder of `target`'s package of the bundle `bundle_name`.
pub fn target_package_name(bundle_name: &str, target: &TargetId) -> String {
    format!("{bundle_name}-{target}")
}

/// `hk-kernels-0.1.0-index`: the folder of the bundle `bundle_name`'s index package.
pub fn index_package_name(bundle_name: &str) -> String {
    format!("{bundle_name}-{INDEX_SUFFIX}")
}
