//! `bundle.msgpack`, the bundle's index: the manifest and every module's ABI file in one
//! MessagePack file, which hkload reads at start-up instead of the TOML files.
//!
//! Why a second form of the same records: parsing `bundle.toml` and one ABI file took about
//! 0.5 ms on the H100 machine, more than the CUDA driver takes to load a whole module, and was
//! most of hkload's cold-start overhead; decoding this index takes a few tens of microseconds,
//! and its lookup table (see [`lookup`]) spares even that at open. The TOML files stay the
//! bundle's readable record, the one people and other tools read.
//! hkpack writes both from the same records (tests check that they agree).
//!
//! The file is five MessagePack values in a row:
//!
//! 1. the format version as a string (`"1.7"`), read alone first so that a format this crate
//!    does not read (another major, or an older minor) is refused with a clear message before
//!    anything else is read: before 1.0 there is one reader, of the current format, and an
//!    older bundle is rebuilt;
//! 2. the SHA-256 of the version string and everything after the digests, as a 32-byte binary:
//!    the index is the root every other hash hangs from, and this digest is what names one
//!    build ([`Index::digest`], which computes it rather than trusting the recorded value: see
//!    there);
//! 3. the BLAKE3 of every other byte of the file (the SHA-256 value included), as a 32-byte
//!    binary: what a verified open checks, since SHA-256 of the repository's 87 KB index took
//!    42 µs of a 52 µs open on the development machine, and BLAKE3 9 µs; `hkpack verify`
//!    checks both digests. A version changed to another the crate reads is damage the BLAKE3
//!    finds;
//! 4. the records: an array of the [`BundleManifest`] (structs written as arrays) and, per
//!    module in manifest order, an array with each kernel's [`KernelRecord`] (its signature and
//!    per-target ABI) as a MessagePack binary, in the module's kernel order, left where it lies
//!    in the file until the kernel is first used;
//! 5. the [`lookup`] table, as a binary: what opening a bundle and launching a kernel need,
//!    read where it lies, so that the manifest is decoded only when asked for.

pub mod lookup;

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use serde::Deserialize;
#[cfg(feature = "write")]
use serde::Serialize;
use serde_bytes::ByteBuf;
#[cfg(feature = "write")]
use serde_bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::file::FileBytes;
use crate::manifest::{
    Blake3Digest, BundleManifest, FormatVersion, KernelRecord, ManifestError, ModuleAbi,
    Sha256Digest,
};
use lookup::Table;

/// The index's file name inside a bundle folder.
pub const INDEX_FILE: &str = "bundle.msgpack";

/// Where an index's parts lie, and what it says of itself, as read before any is trusted.
struct Envelope {
    /// The version string's text, parsed, and one this crate reads.
    version: FormatVersion,
    /// End of the version string.
    version_end: usize,
    sha256: Sha256Digest,
    /// The BLAKE3 and where its value starts.
    blake3: (Blake3Digest, usize),
    /// Where the records start.
    records: usize,
}

/// An opened index: its lookup table checked, the manifest and the kernels' records left
/// encoded where they lie until asked for.
pub struct Index {
    bytes: Arc<FileBytes>,
    /// The format the index says it is in.
    version: FormatVersion,
    /// Its version string, digests, and where its records start in `bytes`.
    envelope: Envelope,
    /// The SHA-256 of its contents, computed on first use ([`Index::digest`]).
    sha256: OnceLock<Sha256Digest>,
    table: Table,
    manifest: OnceLock<Result<BundleManifest, ManifestError>>,
    /// Each kernel's record, by table row, decoded on first use.
    kernels: Vec<OnceLock<Result<KernelRecord, ManifestError>>>,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, version) = self.table.package();
        write!(f, "Index({name} {version}, {} bytes)", self.bytes.len())
    }
}

impl Index {
    /// The index file for `manifest` and its modules' ABIs (in module order).
    #[cfg(feature = "write")]
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
        let version = compact(&manifest.format_version);
        // A digest's size does not depend on its value: the records' place is known now.
        let digest_size = compact(Bytes::new(&[0; 32])).len();
        let start = version.len() + 2 * digest_size;
        let mut rest = compact(&(manifest, kernels));
        let (_, records) = decode_records(&rest, start)
            .expect("records just encoded from a valid manifest decode again");
        rest.extend(compact(Bytes::new(&Table::encode(manifest, &records))));
        let sha256: [u8; 32] = Sha256::new()
            .chain_update(&version)
            .chain_update(&rest)
            .finalize()
            .into();
        let sha256 = compact(Bytes::new(&sha256));
        let blake3 = blake3::Hasher::new()
            .update(&version)
            .update(&sha256)
            .update(&rest)
            .finalize();
        let blake3 = compact(Bytes::new(blake3.as_bytes()));
        [version, sha256, blake3, rest].concat()
    }

    /// Reads the envelope: the version string and the digests, trusting none of them yet. A
    /// version this crate does not read is refused here, before any digest is checked: an older
    /// index's digests lie elsewhere, and saying to rebuild it helps more than calling it
    /// damaged (a forged version string gains nothing but that advice).
    fn envelope(bytes: &[u8]) -> Result<Envelope, ManifestError> {
        let mut rest = bytes;
        let mut header = rmp_serde::Deserializer::new(&mut rest);
        let version_text = String::deserialize(&mut header).map_err(syntax)?;
        let version_end = bytes.len() - header.get_ref().len();
        let digest = |header: &mut rmp_serde::Deserializer<_>| {
            let value = ByteBuf::deserialize(header).map_err(syntax)?;
            <[u8; 32]>::try_from(value.as_slice())
                .map_err(|_| lookup::damaged("its digest is not 32 bytes"))
        };
        let version = version_text
            .parse::<FormatVersion>()
            .map_err(|e| ManifestError::Syntax(format!("index: {e}")))?;
        if !version.is_read() {
            return Err(ManifestError::UnsupportedFormat(version));
        }
        let sha256 = Sha256Digest(digest(&mut header)?);
        let at = bytes.len() - header.get_ref().len();
        let blake3 = (Blake3Digest(digest(&mut header)?), at);
        Ok(Envelope {
            version,
            version_end,
            sha256,
            blake3,
            records: bytes.len() - rest.len(),
        })
    }

    /// Checks the SHA-256 the index records of itself. [`Index::open`] checks the BLAKE3
    /// instead where there is one (which covers the SHA-256's value too); `hkpack verify`
    /// checks both.
    pub fn check_sha256(&self) -> Result<(), ManifestError> {
        self.envelope.check_sha256(&self.bytes)
    }

    /// The BLAKE3 the index records of itself, checked at [`Index::open`] when verifying.
    pub fn blake3(&self) -> Blake3Digest {
        self.envelope.blake3.0
    }

    /// Opens an index, checking its hash when `verify` is set, and its lookup table. Nothing
    /// else is decoded: the manifest when first asked for ([`Index::manifest`]), a kernel's
    /// record when that kernel is first used.
    pub fn open(bytes: impl Into<FileBytes>, verify: bool) -> Result<Self, ManifestError> {
        let bytes = Arc::new(bytes.into());
        let envelope = Self::envelope(&bytes)?;
        if verify {
            envelope.check_blake3(&bytes)?;
        }
        let records = envelope.records;
        let version = envelope.version;
        let whole = Table::locate(&bytes)?;
        let records_end = whole.start;
        let table = Table::read(bytes.clone(), whole, records..records_end)?;
        let kernels = std::iter::repeat_with(OnceLock::new)
            .take(table.kernel_symbols().len())
            .collect();
        Ok(Self {
            bytes,
            version,
            envelope,
            sha256: OnceLock::new(),
            table,
            manifest: OnceLock::new(),
            kernels,
        })
    }

    /// The SHA-256 of the index's contents, as the index records it of itself when intact:
    /// what names one build's index whatever its file is called, and what the packages split
    /// from it record (see [`crate::package_set`]).
    ///
    /// Computed from the bytes on first call, not read from the file: a verified open checks
    /// the BLAKE3 alone, which covers the recorded SHA-256's value but
    /// not whether it is right, so a recorded value could name another build. Hashing here
    /// (42 µs for the repository's 87 KB index) costs only the callers that need the name,
    /// not every open; [`Index::check_sha256`] says whether the recorded value agrees.
    pub fn digest(&self) -> Sha256Digest {
        *self
            .sha256
            .get_or_init(|| self.envelope.sha256_of(&self.bytes))
    }

    /// The lookup table: modules, their code images, kernels and where their records lie.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The manifest, decoded on first call, checked as [`BundleManifest::from_toml`] checks
    /// it, and checked to be the one the lookup table was made from.
    pub fn manifest(&self) -> Result<&BundleManifest, ManifestError> {
        self.manifest
            .get_or_init(|| {
                let (manifest, kernels) =
                    decode_manifest(&self.bytes, self.envelope.records, self.version)?;
                if Table::encode(&manifest, &kernels) != self.table.bytes() {
                    return Err(lookup::damaged(
                        "its lookup table does not agree with its records",
                    ));
                }
                Ok(manifest)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The record of the kernel in row `row` of the lookup table, decoded and checked on first
    /// use.
    pub fn kernel_record(&self, row: usize) -> Result<&KernelRecord, ManifestError> {
        let no_row = || ManifestError::Invalid(format!("the index has no kernel in row {row}"));
        let slot = self.kernels.get(row).ok_or_else(no_row)?;
        slot.get_or_init(|| {
            // Looked up only to decode: a record already decoded needs nothing from the table.
            let (symbol, range) = self.table.kernel(row).ok_or_else(no_row)?;
            // The table's check put the range inside the records; `get` keeps a slip here an
            // error rather than a panic.
            let bytes = self
                .bytes
                .get(range)
                .ok_or_else(|| lookup::damaged("a kernel's record lies outside the file"))?;
            let record: KernelRecord = rmp_serde::from_slice(bytes).map_err(syntax)?;
            if record.symbol != symbol {
                return Err(ManifestError::Invalid(format!(
                    "the index holds kernel `{}` where its lookup table lists `{symbol}`",
                    record.symbol
                )));
            }
            Ok(record)
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// The ABI of module `module` (in manifest order): every kernel's record.
    pub fn module_abi(&self, module: usize) -> Result<ModuleAbi, ManifestError> {
        let rows = self
            .table
            .module(module)
            .ok_or_else(|| ManifestError::Invalid(format!("the index has no module {module}")))?
            .kernel_rows();
        let kernels = rows
            .map(|row| self.kernel_record(row).cloned())
            .collect::<Result<_, _>>()?;
        Ok(ModuleAbi { kernels })
    }
}

/// The manifest in the records at `records` in `bytes` (an index of format `version`), checked,
/// and where each kernel's record lies in `bytes`.
fn decode_manifest(
    bytes: &[u8],
    records: usize,
    version: FormatVersion,
) -> Result<(BundleManifest, Vec<Range<usize>>), ManifestError> {
    let (manifest, kernels) = decode_records(&bytes[records..], records)?;
    if manifest.format_version != version {
        return Err(ManifestError::Invalid(format!(
            "the index says format {version} but its manifest says {}",
            manifest.format_version
        )));
    }
    manifest.validate()?;
    Ok((manifest, kernels))
}

/// The manifest in `records`, and where each kernel's record lies, counted from `start`, the
/// records' place in the file. Checks that there is one record per kernel the manifest lists.
fn decode_records(
    records: &[u8],
    start: usize,
) -> Result<(BundleManifest, Vec<Range<usize>>), ManifestError> {
    // Decoded in place: text is parsed where it lies, and kernels' records are borrowed.
    let (manifest, kernels): (BundleManifest, Vec<Vec<&[u8]>>) =
        rmp_serde::from_slice(records).map_err(syntax)?;
    let held = || kernels.iter().map(Vec::len);
    let listed = || manifest.modules.iter().map(|m| m.kernels.len());
    if !held().eq(listed()) {
        return Err(ManifestError::Invalid(format!(
            "the index holds {:?} kernel records per module, its manifest lists {:?} kernels",
            held().collect::<Vec<_>>(),
            listed().collect::<Vec<_>>()
        )));
    }
    let base = records.as_ptr().addr();
    let ranges = kernels
        .iter()
        .flatten()
        .map(|record| {
            let offset = start + (record.as_ptr().addr() - base);
            offset..offset + record.len()
        })
        .collect();
    Ok((manifest, ranges))
}

/// MessagePack with structs as arrays: the smallest and fastest form to decode.
#[cfg(feature = "write")]
fn compact<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec(value).expect("bundle records always encode: every map key is a string")
}

impl Envelope {
    /// The SHA-256 of `bytes` as the index's own covers them: the version string and
    /// everything after the digests.
    fn sha256_of(&self, bytes: &[u8]) -> Sha256Digest {
        let mut hasher = Sha256::new();
        hasher.update(&bytes[..self.version_end]);
        hasher.update(&bytes[self.records..]);
        Sha256Digest(hasher.finalize().into())
    }

    fn check_sha256(&self, bytes: &[u8]) -> Result<(), ManifestError> {
        if self.sha256_of(bytes) != self.sha256 {
            return Err(damaged_index("SHA-256"));
        }
        Ok(())
    }

    /// Checks the BLAKE3, which covers every byte of the file but its own value (the
    /// SHA-256's value included).
    fn check_blake3(&self, bytes: &[u8]) -> Result<(), ManifestError> {
        let (expected, at) = self.blake3;
        let found = blake3::Hasher::new()
            .update(&bytes[..at])
            .update(&bytes[self.records..])
            .finalize();
        if *found.as_bytes() != expected.0 {
            return Err(damaged_index("BLAKE3"));
        }
        Ok(())
    }
}

/// An index whose `digest` (SHA-256 or BLAKE3) of itself is wrong.
fn damaged_index(digest: &str) -> ManifestError {
    ManifestError::Invalid(format!(
        "the index's {digest} does not match its contents: the file is damaged; rebuild the \
         bundle with `hkpack build`"
    ))
}

fn syntax(error: rmp_serde::decode::Error) -> ManifestError {
    ManifestError::Syntax(format!("index: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Contract, Expr};
    use crate::manifest::KernelRecord;
    use crate::small_stack::on_small_stack;

    /// Records for [`lookup::tests::manifest`]'s kernels, the first with `contract`.
    fn abis(manifest: &BundleManifest, contract: Contract) -> Vec<ModuleAbi> {
        let mut contract = Some(contract);
        let record = |symbol: &str, contract| KernelRecord {
            symbol: symbol.to_owned(),
            args: Vec::new(),
            targets: Vec::new(),
            contract,
        };
        manifest
            .modules
            .iter()
            .map(|module| ModuleAbi {
                kernels: module
                    .kernels
                    .iter()
                    .map(|symbol| record(symbol, contract.take()))
                    .collect(),
            })
            .collect()
    }

    fn contract_with_shared(shared: Expr) -> Contract {
        let one = || Expr::Int(1);
        Contract {
            lets: Vec::new(),
            requires: Vec::new(),
            block: [one(), one(), one()],
            grid: [one(), one(), one()],
            shared,
            extents: Vec::new(),
        }
    }

    /// An index whose first kernel's contract nests `depth` levels deep (`-(-(...(1)))`), made
    /// by the crate's own encoder. Encoding walks the tree recursively, so this runs on a
    /// thread with room for it; no code path of hkpack writes such a tree.
    fn index_with_contract_depth(depth: usize) -> Vec<u8> {
        std::thread::Builder::new()
            .stack_size(1 << 30)
            .spawn(move || {
                let mut shared = Expr::Int(1);
                for _ in 1..depth {
                    shared = Expr::Neg(Box::new(shared));
                }
                let manifest = lookup::tests::manifest();
                let abis = abis(&manifest, contract_with_shared(shared));
                Index::encode(&manifest, &abis)
            })
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn a_contract_nested_too_deep_is_refused_as_damage() {
        let bytes = index_with_contract_depth(200_000);
        let message = on_small_stack(move || {
            let index = Index::open(bytes, true).unwrap();
            index.kernel_record(0).unwrap_err().to_string()
        });
        assert!(message.contains("deeper than"), "{message}");
        assert!(message.contains("damaged"), "{message}");
    }

    #[test]
    fn a_contract_as_deep_as_allowed_reads_and_binds() {
        let bytes = index_with_contract_depth(crate::contract::MAX_DEPTH);
        on_small_stack(move || {
            let index = Index::open(bytes, true).unwrap();
            let record = index.kernel_record(0).unwrap();
            let contract = record.contract.as_ref().unwrap();
            assert!(contract.shared.to_string().ends_with("-1"));
            contract.bind(&record.args).unwrap();
        });
    }
}
