//! `bundle.msgpack`, the bundle's index: the manifest and every module's ABI file in one
//! MessagePack file, which hkload reads at start-up instead of the TOML files.
//!
//! Why a second form of the same records: parsing `bundle.toml` and one ABI file took about
//! 0.5 ms on the H100 machine, more than the CUDA driver takes to load a whole module, and was
//! most of hkload's cold-start overhead; decoding this index takes a few tens of microseconds.
//! The TOML files stay the bundle's readable record, the one people and other tools read.
//! hkpack writes both from the same records (tests check that they agree), and hkload still
//! reads a bundle without an index from its TOML files.
//!
//! The file is three MessagePack values in a row:
//!
//! 1. the format version as a string (`"1.1"`), read alone first so that a newer major format
//!    is refused with a clear message;
//! 2. the SHA-256 of the rest of the file, as a 32-byte binary: the index is the root every
//!    other hash hangs from, so corruption in it is caught when hashes are verified;
//! 3. the records: an array of the [`BundleManifest`] (structs written as arrays) and, per
//!    module in manifest order, an array with each kernel's [`KernelRecord`] (its signature and
//!    per-target ABI) as a MessagePack binary, in the module's kernel order, left where it lies
//!    in the file until the kernel is first used.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use sha2::{Digest, Sha256};

use crate::file::FileBytes;
use crate::manifest::{
    BundleManifest, FORMAT_VERSION, FormatVersion, KernelRecord, ManifestError, ModuleAbi,
};

/// The index's file name inside a bundle folder.
pub const INDEX_FILE: &str = "bundle.msgpack";

/// A decoded index: the manifest, and each kernel's record still encoded, left where it lies
/// in the index's bytes.
#[derive(Debug)]
pub struct Index {
    pub manifest: BundleManifest,
    bytes: FileBytes,
    /// Where each kernel's record lies in `bytes`: modules in manifest order, and each
    /// module's kernels in its order.
    kernels: Vec<Range<usize>>,
}

impl Index {
    /// The index file for `manifest` and its modules' ABIs (in module order).
    pub fn encode(manifest: &BundleManifest, abis: &[ModuleAbi]) -> Vec<u8> {
        let kernels: Vec<Vec<ByteBuf>> = abis
            .iter()
            .map(|abi| {
                abi.kernels
                    .iter()
                    .map(|kernel| ByteBuf::from(compact(kernel)))
                    .collect()
            })
            .collect();
        let records = compact(&(manifest, kernels));
        let digest: [u8; 32] = Sha256::digest(&records).into();
        let mut bytes = compact(&manifest.format_version);
        bytes.extend(compact(&ByteBuf::from(digest)));
        bytes.extend(records);
        bytes
    }

    /// Reads an index, checking its hash when `verify` is set, then the manifest as
    /// [`BundleManifest::from_toml`] does. The index keeps `bytes`: kernels' records are
    /// decoded from them on first use.
    pub fn decode(bytes: impl Into<FileBytes>, verify: bool) -> Result<Self, ManifestError> {
        let bytes = bytes.into();
        let (manifest, kernels) = read(&bytes, verify)?;
        Ok(Self {
            manifest,
            bytes,
            kernels,
        })
    }

    /// The record of kernel `kernel` of module `module` (both in manifest order), which must be
    /// the kernel the manifest lists there.
    pub fn kernel_record(
        &self,
        module: usize,
        kernel: usize,
    ) -> Result<KernelRecord, ManifestError> {
        let modules = &self.manifest.modules;
        let symbol = modules.get(module).and_then(|m| m.kernels.get(kernel));
        // The records lie module after module.
        let position = modules
            .iter()
            .take(module)
            .map(|m| m.kernels.len())
            .sum::<usize>()
            + kernel;
        let (Some(symbol), Some(range)) = (symbol, self.kernels.get(position)) else {
            return Err(ManifestError::Invalid(format!(
                "the index has no kernel {kernel} in module {module}"
            )));
        };
        let record: KernelRecord =
            rmp_serde::from_slice(&self.bytes[range.clone()]).map_err(syntax)?;
        if record.symbol != *symbol {
            return Err(ManifestError::Invalid(format!(
                "the index holds kernel `{}` where its manifest lists `{symbol}`",
                record.symbol
            )));
        }
        Ok(record)
    }

    /// The ABI of module `module`: every kernel's record.
    pub fn module_abi(&self, module: usize) -> Result<ModuleAbi, ManifestError> {
        let count = self
            .manifest
            .modules
            .get(module)
            .map_or(0, |m| m.kernels.len());
        let kernels = (0..count)
            .map(|kernel| self.kernel_record(module, kernel))
            .collect::<Result<_, _>>()?;
        Ok(ModuleAbi { kernels })
    }
}

/// The manifest and where each kernel's record lies in `bytes`, the whole index file.
fn read(bytes: &[u8], verify: bool) -> Result<(BundleManifest, Vec<Range<usize>>), ManifestError> {
    let mut records = bytes;
    let mut header = rmp_serde::Deserializer::new(&mut records);
    let version = FormatVersion::deserialize(&mut header).map_err(syntax)?;
    if version.major != FORMAT_VERSION.major {
        return Err(ManifestError::UnsupportedFormat(version));
    }
    let digest = ByteBuf::deserialize(&mut header).map_err(syntax)?;
    if verify && Sha256::digest(records).as_slice() != digest.as_slice() {
        return Err(ManifestError::Invalid(
            "the index's SHA-256 does not match its contents: the file is damaged".into(),
        ));
    }
    // Decoded in place: text is parsed where it lies, and kernels' records are borrowed.
    let (manifest, kernels): (BundleManifest, Vec<Vec<&[u8]>>) =
        rmp_serde::from_slice(records).map_err(syntax)?;
    if manifest.format_version != version {
        return Err(ManifestError::Invalid(format!(
            "the index says format {version} but its manifest says {}",
            manifest.format_version
        )));
    }
    let held = || kernels.iter().map(Vec::len);
    let listed = || manifest.modules.iter().map(|m| m.kernels.len());
    if !held().eq(listed()) {
        return Err(ManifestError::Invalid(format!(
            "the index holds {:?} kernel records per module, its manifest lists {:?} kernels",
            held().collect::<Vec<_>>(),
            listed().collect::<Vec<_>>()
        )));
    }
    manifest.validate()?;
    let start = bytes.as_ptr().addr();
    let ranges = kernels
        .iter()
        .flatten()
        .map(|record| {
            let offset = record.as_ptr().addr() - start;
            offset..offset + record.len()
        })
        .collect();
    Ok((manifest, ranges))
}

/// MessagePack with structs as arrays: the smallest and fastest form to decode.
fn compact<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec(value).expect("bundle records always encode: every map key is a string")
}

fn syntax(error: rmp_serde::decode::Error) -> ManifestError {
    ManifestError::Syntax(format!("index: {error}"))
}
