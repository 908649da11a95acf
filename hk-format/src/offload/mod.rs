//! The clang offload bundle: the container that holds one code object per GPU target, in its
//! plain form (magic `__CLANG_OFFLOAD_BUNDLE__`) and its compressed form (magic `CCOB`).
//!
//! This module is the one definition of both formats: hkpack writes bundles with
//! [`write_bundle`] and [`compress`], hkload reads them with [`decompress`] and
//! [`OffloadBundle::parse`]. Reader and writer sit side by side so that what one emits is exactly
//! what the other accepts.
//!
//! The reader is strict where LLVM's is lenient (LLVM stops silently at the first bad
//! descriptor): every descriptor must lie inside the file, non-empty code objects must be
//! page-aligned, in ascending order, not overlapping, separated only by zero padding, and the
//! file must end with the last one. It still reads what the stock `clang-offload-bundler`
//! writes, whose empty host entry shares its offset with the next code object.
//!
//! All integers in both formats are little-endian.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

#[cfg(feature = "compressed")]
mod compressed;
#[cfg(not(feature = "compressed"))]
#[path = "uncompressed_only.rs"]
mod compressed;
#[cfg(feature = "write")]
mod write;

#[cfg(feature = "write")]
pub use write::{compress, write_bundle};

/// How an uncompressed bundle starts; no NUL follows it.
pub const BUNDLE_MAGIC: &[u8; 24] = b"__CLANG_OFFLOAD_BUNDLE__";
/// How a compressed bundle starts.
pub const CCOB_MAGIC: &[u8; 4] = b"CCOB";
/// Where code objects start: what HIP's driver emits, page-aligned for mapped files.
pub const CODE_OBJECT_ALIGN: u64 = 4096;
/// comgr is handed only the first 4096 bytes of an uncompressed bundle: the whole header must fit.
pub const HEADER_WINDOW: u64 = 4096;
/// The largest uncompressed bundle (2 GiB) we write or accept in compressed form. The limit
/// stops a hostile header from making us allocate more; real bundles are a few megabytes.
pub const MAX_UNCOMPRESSED_SIZE: u64 = 2 << 30;

/// How many times its own length a compressed bundle may claim to hold once decompressed, past
/// [`UNCOMPRESSED_ALLOWANCE`]. The header's claim is the only size known before the payload is
/// read, and reading reserves it up front: bounded by [`MAX_UNCOMPRESSED_SIZE`] alone, one
/// edited byte of a 14 KB file's header had hkload reserve 2 GiB before any digest could be
/// checked, which a process under a memory limit does not survive. The index records no
/// uncompressed size of a module file, so the bound is relative to the file. Real bundles
/// compress 6 to 20 times (zstd level 19 on this repository's modules); only data such as long
/// runs of one byte, which no bundle is, compresses past a few hundred times.
pub const MAX_COMPRESSION_RATIO: u64 = 256;

/// What any compressed bundle may claim to hold, however small its file: a small bundle's
/// header and padding are a large share of it and compress to almost nothing.
pub const UNCOMPRESSED_ALLOWANCE: u64 = 1 << 20;

/// Magic and entry count.
const BUNDLE_PREFIX_LEN: u64 = 32;
/// Offset, size and ID length of one entry; the ID follows.
const DESCRIPTOR_FIXED_LEN: u64 = 24;

/// `llvm::compression::Format` values as stored in the CCOB `method` field.
const METHOD_ZLIB: u16 = 0;
const METHOD_ZSTD: u16 = 1;

// `widen` below relies on this.
const _: () = assert!(usize::BITS <= u64::BITS);

/// One entry of a parsed (uncompressed) bundle, borrowing the bundle's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The bundle entry ID, e.g. `hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`.
    pub id: &'a str,
    /// Where the code object starts, counted from the start of the bundle.
    pub offset: u64,
    /// The code object itself; empty for the host entry clang adds.
    pub bytes: &'a [u8],
}

impl Entry<'_> {
    /// One past the code object's last byte. It cannot overflow: the bytes exist in memory.
    fn end(&self) -> u64 {
        self.offset.saturating_add(widen(self.bytes.len()))
    }
}

/// A parsed uncompressed bundle.
#[derive(Debug, Clone)]
pub struct OffloadBundle<'a> {
    /// In the order of their descriptors in the header.
    entries: Vec<Entry<'a>>,
}

impl<'a> OffloadBundle<'a> {
    /// Parses and validates an uncompressed bundle; see the module docs for what is checked.
    /// A compressed bundle must go through [`decompress`] first.
    ///
    /// The header may be larger than [`HEADER_WINDOW`]: that limit matters only when the whole
    /// bundle is handed to the HIP runtime, so [`write_bundle`] enforces it and we do not.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, FormatError> {
        let file_len = widen(bytes.len());
        let (descriptors, header_len) = read_header(bytes, file_len)?;
        let mut entries = Vec::with_capacity(descriptors.len());
        for descriptor in descriptors {
            entries.push(Entry {
                id: descriptor.0,
                offset: descriptor.1,
                bytes: code_object(bytes, header_len, descriptor)?,
            });
        }

        check_layout(bytes, header_len, &entries)?;
        Ok(Self { entries })
    }

    /// The entries in header order.
    pub fn entries(&self) -> &[Entry<'a>] {
        &self.entries
    }

    /// The entry with exactly this ID, if any.
    pub fn entry(&self, id: &str) -> Option<&Entry<'a>> {
        self.entries.iter().find(|entry| entry.id == id)
    }
}

/// One entry's ID, offset and size as its descriptor gives them.
type Descriptor<'a> = (&'a str, u64, u64);

/// The bytes a descriptor points at, which must lie past the header, inside the file, and (if
/// any) start page-aligned.
fn code_object<'a>(
    bytes: &'a [u8],
    header_len: u64,
    (id, offset, size): Descriptor<'_>,
) -> Result<&'a [u8], FormatError> {
    if offset < header_len {
        return Err(FormatError::EntryInsideHeader {
            id: id.into(),
            offset,
            header_len,
        });
    }
    let code_object = slice(bytes, offset, size).ok_or_else(|| FormatError::EntryOutOfBounds {
        id: id.into(),
        offset,
        size,
        len: widen(bytes.len()),
    })?;
    // An empty entry occupies no bytes, so where it points does not matter; clang puts its host
    // entry at the offset of the next code object.
    if size != 0 && offset % CODE_OBJECT_ALIGN != 0 {
        return Err(FormatError::MisalignedEntry {
            id: id.into(),
            offset,
        });
    }
    Ok(code_object)
}

/// Reads the header at the start of `bytes` (which may be only a prefix of the bundle) of a
/// bundle of `file_len` bytes: the descriptors in header order, and where the header ends.
fn read_header(bytes: &[u8], file_len: u64) -> Result<(Vec<Descriptor<'_>>, u64), FormatError> {
    if !bytes.starts_with(BUNDLE_MAGIC) {
        return Err(if BUNDLE_MAGIC.starts_with(bytes) && !bytes.is_empty() {
            truncated(HeaderField::Magic, 0, widen(BUNDLE_MAGIC.len()), file_len)
        } else if is_compressed(bytes) {
            FormatError::CompressedBundle
        } else {
            FormatError::NotABundle {
                found: FileKind::sniff(bytes),
            }
        });
    }

    let mut header = Reader::at(bytes, BUNDLE_MAGIC.len());
    let count = header
        .u64()
        .ok_or_else(|| truncated(HeaderField::EntryCount, header.position(), 8, file_len))?;
    if count == 0 {
        return Err(FormatError::NoEntries);
    }
    // Each descriptor takes at least 24 bytes, which bounds the allocation below by the
    // file's size whatever the count field says.
    let max = file_len.saturating_sub(BUNDLE_PREFIX_LEN) / DESCRIPTOR_FIXED_LEN;
    if count > max {
        return Err(FormatError::TooManyEntries {
            count,
            max,
            len: file_len,
        });
    }

    let count = narrow(count)?;
    let mut descriptors = Vec::with_capacity(count);
    let mut seen = HashSet::new();
    for index in 0..count {
        let descriptor_offset = header.position();
        let (Some(offset), Some(size), Some(id_len)) = (header.u64(), header.u64(), header.u64())
        else {
            let field = HeaderField::Descriptor { index };
            return Err(truncated(
                field,
                descriptor_offset,
                DESCRIPTOR_FIXED_LEN,
                file_len,
            ));
        };
        let id_offset = header.position();
        let id = header
            .take(id_len)
            .ok_or_else(|| truncated(HeaderField::Id { index }, id_offset, id_len, file_len))?;
        let id = std::str::from_utf8(id).map_err(|_| FormatError::IdNotUtf8 {
            index,
            offset: id_offset,
        })?;
        if id.is_empty() {
            return Err(FormatError::EmptyId { index });
        }
        if !seen.insert(id) {
            return Err(FormatError::DuplicateId { id: id.into() });
        }
        descriptors.push((id, offset, size));
    }

    Ok((descriptors, header.position()))
}

/// Checks how the code objects tile the file after the header: ascending, not overlapping,
/// separated by zero padding, and the last one ending the file. HIP's runtime takes the last
/// entry's end as the bundle's size, so anything else would be misread there.
fn check_layout(bytes: &[u8], header_len: u64, entries: &[Entry<'_>]) -> Result<(), FormatError> {
    // Empty entries occupy no bytes, so they take no part in the order.
    let code_objects: Vec<&Entry<'_>> = entries
        .iter()
        .filter(|entry| !entry.bytes.is_empty())
        .collect();
    for (previous, entry) in code_objects.iter().zip(code_objects.iter().skip(1)) {
        if entry.offset >= previous.end() {
            continue;
        }
        return Err(if entry.end() > previous.offset {
            FormatError::OverlappingEntries {
                id: entry.id.into(),
                offset: entry.offset,
                other: previous.id.into(),
                other_end: previous.end(),
            }
        } else {
            FormatError::EntriesOutOfOrder {
                id: entry.id.into(),
                offset: entry.offset,
                previous: previous.id.into(),
                previous_offset: previous.offset,
            }
        });
    }

    // Everything before `covered` has been accounted for as header, padding or code object.
    let mut covered = header_len;
    for entry in &code_objects {
        check_padding(bytes, covered, entry.offset)?;
        covered = entry.end();
    }
    // A trailing empty entry may point past the last code object, with padding up to it.
    let end = entries.iter().map(Entry::end).fold(covered, u64::max);
    check_padding(bytes, covered, end)?;
    let len = widen(bytes.len());
    if len > end {
        return Err(FormatError::TrailingBytes { end, len });
    }
    Ok(())
}

/// Checks that `bytes[start..end]` is all zero. Callers pass ranges already known to be in
/// bounds; an empty or inverted range has nothing to check.
fn check_padding(bytes: &[u8], start: u64, end: u64) -> Result<(), FormatError> {
    let padding = slice(bytes, start, end.saturating_sub(start)).unwrap_or_default();
    match padding.iter().enumerate().find(|&(_, &byte)| byte != 0) {
        None => Ok(()),
        Some((position, &value)) => Err(FormatError::NonZeroPadding {
            offset: start.saturating_add(widen(position)),
            value,
        }),
    }
}

/// If `bytes` is a CCOB, decompresses it (versions 1, 2 and 3; zstd only), checking every
/// header field against the file and the result, the MD5 prefix included (LLVM does not check
/// it on load). Otherwise returns the bytes borrowed.
pub fn decompress(bytes: &[u8]) -> Result<Cow<'_, [u8]>, FormatError> {
    if !is_compressed(bytes) {
        return Ok(Cow::Borrowed(bytes));
    }
    compressed::decompress(bytes).map(Cow::Owned)
}

/// The code object `id` of a bundle, plain or compressed. From a plain bundle, the header is
/// read and checked and the entry borrowed; the other entries are not looked at. A compressed
/// one is decompressed only as far as the entry's end (bundles put native code first and PTX
/// last, so a device rarely pays for the PTX); its header fields are checked as [`decompress`] does, and when the entry is the last
/// one the whole is too (size and MD5 prefix), but the layout beyond the entry is not seen:
/// callers that must trust the entry check its hash.
pub fn extract_entry<'a>(bytes: &'a [u8], id: &str) -> Result<Cow<'a, [u8]>, FormatError> {
    if !is_compressed(bytes) {
        // The header and the entry alone: checking the rest of the layout, as `parse` does,
        // would touch the pages of every other entry, code this device never runs.
        let (descriptors, header_len) = read_header(bytes, widen(bytes.len()))?;
        let descriptor = descriptors
            .into_iter()
            .find(|(entry, ..)| *entry == id)
            .ok_or_else(|| FormatError::NoSuchEntry { id: id.into() })?;
        return code_object(bytes, header_len, descriptor).map(Cow::Borrowed);
    }
    compressed::extract_entry(bytes, id)
}

/// Whether `bytes` starts like a compressed bundle.
pub fn is_compressed(bytes: &[u8]) -> bool {
    bytes.starts_with(CCOB_MAGIC)
}

/// A forward-only cursor over untrusted bytes; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    fn at(bytes: &'a [u8], position: usize) -> Self {
        Self { bytes, position }
    }

    fn position(&self) -> u64 {
        widen(self.position)
    }

    fn take(&mut self, len: u64) -> Option<&'a [u8]> {
        let taken = slice(self.bytes, self.position(), len)?;
        self.position += taken.len();
        Some(taken)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(widen(N))?.try_into().ok()
    }

    #[cfg(feature = "compressed")]
    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    #[cfg(feature = "compressed")]
    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
}

fn truncated(field: HeaderField, offset: u64, needed: u64, len: u64) -> FormatError {
    FormatError::HeaderTruncated {
        field,
        offset,
        needed,
        len,
    }
}

/// `bytes[offset..offset + len]`, or `None` if any part of it lies outside `bytes`.
fn slice(bytes: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let end = offset.checked_add(len)?;
    bytes.get(usize::try_from(offset).ok()?..usize::try_from(end).ok()?)
}

/// Lossless: the assertion at the top of the module rules out a wider `usize`.
fn widen(n: usize) -> u64 {
    n as u64
}

/// Sizes that do not fit this platform's address space cannot be written or read.
fn narrow(n: u64) -> Result<usize, FormatError> {
    usize::try_from(n).map_err(|_| FormatError::BundleTooLarge)
}

/// Which part of a bundle header a truncated file cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderField {
    Magic,
    EntryCount,
    Descriptor { index: usize },
    Id { index: usize },
}

impl fmt::Display for HeaderField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Magic => write!(f, "the magic"),
            Self::EntryCount => write!(f, "the entry count"),
            Self::Descriptor { index } => write!(f, "the descriptor of entry {index}"),
            Self::Id { index } => write!(f, "the ID of entry {index}"),
        }
    }
}

/// What a file handed to the bundle parser turned out to be, for the error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileKind {
    Empty,
    /// Most likely a bare code object.
    Elf,
    /// An NVIDIA fatbinary (magic `0xBA55ED50`).
    CudaFatbin,
    /// Something else; these are its first few bytes.
    Unknown {
        prefix: Vec<u8>,
    },
}

impl FileKind {
    fn sniff(bytes: &[u8]) -> Self {
        if bytes.is_empty() {
            Self::Empty
        } else if bytes.starts_with(b"\x7fELF") {
            Self::Elf
        } else if bytes.starts_with(&0xBA55_ED50_u32.to_le_bytes()) {
            Self::CudaFatbin
        } else {
            Self::Unknown {
                prefix: bytes.iter().take(8).copied().collect(),
            }
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "an empty file"),
            Self::Elf => write!(f, "an ELF file"),
            Self::CudaFatbin => write!(f, "a CUDA fatbinary"),
            Self::Unknown { prefix } => write!(f, "a file starting with bytes {}", Hex(prefix)),
        }
    }
}

/// Bytes as space-separated hex pairs.
struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, byte) in self.0.iter().enumerate() {
            if index > 0 {
                write!(f, " ")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

fn method_name(method: u16) -> String {
    match method {
        METHOD_ZLIB => format!("zlib (method {METHOD_ZLIB})"),
        _ => format!("unknown method {method}"),
    }
}

/// What is wrong with a bundle being read, or with entries that cannot be written as one.
///
/// Entry IDs are held as `Box<str>` and each variant carries at most 48 bytes, because this
/// type travels inside `hkload::Error` and clippy rightly objects to large `Err` types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error(
        "this is {found}, not an offload bundle (which starts with `__CLANG_OFFLOAD_BUNDLE__`)"
    )]
    NotABundle { found: FileKind },

    #[error("this is a compressed offload bundle (CCOB); decompress it before parsing")]
    CompressedBundle,

    #[error("the bundle has no entry `{id}`")]
    NoSuchEntry { id: Box<str> },

    #[error(
        "the offload bundle header is cut short: {field} needs {needed} bytes at offset {offset}, \
         but the file is only {len} bytes long"
    )]
    HeaderTruncated {
        field: HeaderField,
        offset: u64,
        needed: u64,
        len: u64,
    },

    #[error("the offload bundle has no entries; it must hold at least one code object")]
    NoEntries,

    #[error(
        "the offload bundle header claims {count} entries, but a {len}-byte file has room for \
         at most {max}; the file is corrupt"
    )]
    TooManyEntries { count: u64, max: u64, len: u64 },

    #[error("the ID of entry {index} (at offset {offset}) is not valid UTF-8")]
    IdNotUtf8 { index: usize, offset: u64 },

    #[error(
        "entry {index} has an empty ID; every entry needs one, such as \
         `hipv4-amdgcn-amd-amdhsa--gfx942`"
    )]
    EmptyId { index: usize },

    #[error("two entries have the ID `{id}`; each target may appear only once in a bundle")]
    DuplicateId { id: Box<str> },

    #[error("entry `{id}` starts at offset {offset}, inside the {header_len}-byte header")]
    EntryInsideHeader {
        id: Box<str>,
        offset: u64,
        header_len: u64,
    },

    #[error(
        "entry `{id}` claims {size} bytes at offset {offset}, past the end of the {len}-byte \
         file; the file is truncated or corrupt"
    )]
    EntryOutOfBounds {
        id: Box<str>,
        offset: u64,
        size: u64,
        len: u64,
    },

    #[error(
        "entry `{id}` starts at offset {offset}, which is not a multiple of {CODE_OBJECT_ALIGN}; \
         code objects must be page-aligned"
    )]
    MisalignedEntry { id: Box<str>, offset: u64 },

    #[error(
        "entry `{id}` starts at offset {offset}, before entry `{other}` ends at byte \
         {other_end}; code objects must not overlap"
    )]
    OverlappingEntries {
        id: Box<str>,
        offset: u64,
        other: Box<str>,
        other_end: u64,
    },

    #[error(
        "entry `{id}` at offset {offset} is listed after entry `{previous}` at offset \
         {previous_offset}; code objects must be stored in the order of the header"
    )]
    EntriesOutOfOrder {
        id: Box<str>,
        offset: u64,
        previous: Box<str>,
        previous_offset: u64,
    },

    #[error(
        "byte {offset} lies in the padding between code objects but holds {value:#04x} instead \
         of zero; the file is corrupt"
    )]
    NonZeroPadding { offset: u64, value: u8 },

    #[error(
        "the last code object ends at byte {end}, but the file is {len} bytes long; a bundle \
         must end with its last code object (concatenated bundles are not supported)"
    )]
    TrailingBytes { end: u64, len: u64 },

    #[error(
        "the header for {count} entries takes {header_len} bytes, more than the \
         {HEADER_WINDOW} bytes the HIP runtime reads; split the targets across several \
         bundles or shorten their IDs"
    )]
    HeaderTooLarge { count: usize, header_len: u64 },

    #[error("the bundle is too large for its offsets and sizes to be represented")]
    BundleTooLarge,

    #[error(
        "the compressed bundle header needs {needed} bytes, but the file is only {len} bytes long"
    )]
    CompressedHeaderTruncated { needed: u64, len: u64 },

    #[error(
        "compressed bundle format version {version} is not supported; only versions 1, 2 and 3 \
         are"
    )]
    UnsupportedVersion { version: u16 },

    #[error(
        "the compressed bundle uses {}, but only zstd (method {METHOD_ZSTD}) is supported; \
         rebuild it with zstd compression",
        method_name(*method)
    )]
    UnsupportedMethod { method: u16 },

    #[error(
        "the compressed bundle header says the file is {declared} bytes long, but it is {len} \
         bytes; it was truncated or had bytes appended"
    )]
    CompressedSizeMismatch { declared: u64, len: u64 },

    #[error(
        "an uncompressed bundle of {size} bytes exceeds the {MAX_UNCOMPRESSED_SIZE}-byte limit \
         for compressed bundles"
    )]
    UncompressedTooLarge { size: u64 },

    #[error(
        "the compressed bundle header promises {declared} uncompressed bytes, more than a \
         compressed file of {len} bytes may hold ({limit}: {MAX_COMPRESSION_RATIO} times its \
         length, plus {UNCOMPRESSED_ALLOWANCE} bytes); the header is damaged"
    )]
    UncompressedImplausible { declared: u64, len: u64, limit: u64 },

    #[error("the compressed bundle's payload is not valid zstd data: {detail}")]
    ZstdDecompress { detail: String },

    #[error(
        "the compressed bundle header promises {declared} uncompressed bytes, but the payload \
         holds only {actual}"
    )]
    UncompressedTooShort { declared: u64, actual: u64 },

    #[error(
        "the compressed bundle header promises {declared} uncompressed bytes, but the payload \
         holds more"
    )]
    UncompressedTooLong { declared: u64 },

    #[error(
        "the decompressed bundle's MD5 hash starts with {}, but the header records {}; the \
         file is corrupt",
        Hex(actual),
        Hex(recorded)
    )]
    HashMismatch { recorded: [u8; 8], actual: [u8; 8] },

    #[error("zstd could not compress the bundle: {detail}")]
    ZstdCompress { detail: String },

    #[error(
        "the module file is a compressed bundle (CCOB), and this build reads only uncompressed \
         ones: enable hkload's `compressed` feature, or rebuild the bundle without `hkpack \
         build --compress`"
    )]
    CompressedUnsupported,
}

#[cfg(all(test, feature = "write"))]
mod tests {
    use super::compressed::{
        CompressedHeader, check_compression_ratio, check_uncompressed_size, md5_prefix,
    };
    use super::write::Layout;
    use super::*;
    use md5::{Digest, Md5};

    const GFX90A: &str = "hipv4-amdgcn-amd-amdhsa--gfx90a";
    const GFX942: &str = "hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-";
    const GFX950: &str = "hipv4-amdgcn-amd-amdhsa--gfx950";
    const SM_90: &str = "cuda-nvptx64-nvidia-cuda-sm_90";
    const COMPUTE_90: &str = "cuda-nvptx64-nvidia-cuda-compute_90";
    const HOST: &str = "host-x86_64-unknown-linux-gnu-";

    /// Distinct, non-zero, recognisable contents for a fake code object.
    fn code_object(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
            .collect()
    }

    /// Three entries, one of them longer than a page.
    fn sample_entries() -> Vec<(&'static str, Vec<u8>)> {
        vec![
            (GFX90A, code_object(1, 100)),
            (GFX942, code_object(2, 5000)),
            (SM_90, code_object(3, 7)),
        ]
    }

    fn write(entries: &[(&str, Vec<u8>)]) -> Result<Vec<u8>, FormatError> {
        let borrowed: Vec<(&str, &[u8])> =
            entries.iter().map(|(id, b)| (*id, b.as_slice())).collect();
        write_bundle(&borrowed)
    }

    fn sample() -> Vec<u8> {
        write(&sample_entries()).unwrap()
    }

    #[test]
    fn one_entry_comes_out_of_either_form_and_a_truncated_stream_is_an_error() {
        let plain = write(&[
            (GFX90A, code_object(1, 300)),
            (GFX942, code_object(2, 5000)),
            (SM_90, code_object(3, 17)),
        ])
        .unwrap();
        let compressed = compress(&plain, 3).unwrap();
        let parsed = OffloadBundle::parse(&plain).unwrap();
        for entry in parsed.entries() {
            let borrowed = extract_entry(&plain, entry.id).unwrap();
            assert!(matches!(borrowed, Cow::Borrowed(_)));
            assert_eq!(&*borrowed, entry.bytes);
            assert_eq!(&*extract_entry(&compressed, entry.id).unwrap(), entry.bytes);
        }
        for bytes in [&plain, &compressed] {
            assert_eq!(
                extract_entry(bytes, COMPUTE_90).unwrap_err(),
                FormatError::NoSuchEntry {
                    id: COMPUTE_90.into()
                }
            );
        }
        // A stream cut short inside the wanted entry fails; every other cut fails on the
        // header's total size before any decompression.
        for len in 0..compressed.len() {
            assert!(
                extract_entry(&compressed[..len], SM_90).is_err(),
                "cut at {len}"
            );
        }
    }

    fn u64_at(bytes: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    }

    /// A bundle with arbitrary descriptors (offset, size, ID), for layouts `write_bundle`
    /// refuses to produce. The file is `file_len` bytes: zeros, with every entry's range that
    /// lies inside the file filled with 0xc3.
    fn raw_bundle(descriptors: &[(u64, u64, &[u8])], file_len: usize) -> Vec<u8> {
        let mut out = BUNDLE_MAGIC.to_vec();
        out.extend_from_slice(&(descriptors.len() as u64).to_le_bytes());
        for &(offset, size, id) in descriptors {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(&(id.len() as u64).to_le_bytes());
            out.extend_from_slice(id);
        }
        out.resize(file_len.max(out.len()), 0);
        for &(offset, size, _) in descriptors {
            let start = (offset as usize).min(file_len);
            let end = (offset.saturating_add(size) as usize).min(file_len);
            if start < end {
                out[start..end].fill(0xc3);
            }
        }
        out.truncate(file_len);
        out
    }

    /// A CCOB header of any version, built field by field from the table in the reference.
    fn ccob(version: u16, method: u16, total: u64, uncompressed: u64, hash: [u8; 8]) -> Vec<u8> {
        let mut out = CCOB_MAGIC.to_vec();
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&method.to_le_bytes());
        match version {
            1 => out.extend_from_slice(&(uncompressed as u32).to_le_bytes()),
            2 => {
                out.extend_from_slice(&(total as u32).to_le_bytes());
                out.extend_from_slice(&(uncompressed as u32).to_le_bytes());
            }
            _ => {
                out.extend_from_slice(&total.to_le_bytes());
                out.extend_from_slice(&uncompressed.to_le_bytes());
            }
        }
        out.extend_from_slice(&hash);
        out
    }

    /// A complete, valid compressed file of the given version around `bundle`.
    fn ccob_file(version: u16, bundle: &[u8]) -> Vec<u8> {
        let payload = zstd::bulk::compress(bundle, 3).unwrap();
        // Header lengths and hash straight from the reference, not from the code under test.
        let header_len = match version {
            1 => 20,
            2 => 24,
            _ => 32,
        };
        let total = header_len + payload.len() as u64;
        let hash = Md5::digest(bundle)[..8].try_into().unwrap();
        let mut out = ccob(version, 1, total, bundle.len() as u64, hash);
        out.extend_from_slice(&payload);
        out
    }

    fn parse_err(bytes: &[u8]) -> FormatError {
        OffloadBundle::parse(bytes).unwrap_err()
    }

    fn decompress_err(bytes: &[u8]) -> FormatError {
        decompress(bytes).unwrap_err()
    }

    /// What hkload does with a file: decompress if needed, then parse.
    fn load(bytes: &[u8]) -> Result<usize, FormatError> {
        let bundle = decompress(bytes)?;
        Ok(OffloadBundle::parse(&bundle)?.entries().len())
    }

    // Writing and reading back.

    #[test]
    fn round_trip() {
        let entries = sample_entries();
        let bytes = sample();
        let bundle = OffloadBundle::parse(&bytes).unwrap();
        let read: Vec<(&str, &[u8])> = bundle.entries().iter().map(|e| (e.id, e.bytes)).collect();
        let written: Vec<(&str, &[u8])> =
            entries.iter().map(|(id, b)| (*id, b.as_slice())).collect();
        assert_eq!(read, written);
        assert_eq!(bundle.entry(GFX942).unwrap().bytes, entries[1].1.as_slice());
        assert!(bundle.entry(GFX950).is_none());
        assert!(bundle.entry("hipv4-amdgcn-amd-amdhsa--gfx942").is_none());
    }

    #[test]
    fn layout_matches_what_hip_emits() {
        let entries = sample_entries();
        let bytes = sample();
        assert_eq!(&bytes[..24], BUNDLE_MAGIC);
        assert_eq!(u64_at(&bytes, 24), entries.len() as u64);

        // Walk the header by hand rather than through the parser under test.
        let mut at = 32;
        let mut placed = Vec::new();
        for (id, code) in &entries {
            let (offset, size, id_len) = (
                u64_at(&bytes, at),
                u64_at(&bytes, at + 8),
                u64_at(&bytes, at + 16),
            );
            assert_eq!(size, code.len() as u64);
            // Not NUL-terminated: the length is the ID's own, and the next field follows it.
            assert_eq!(id_len, id.len() as u64);
            assert_eq!(&bytes[at + 24..at + 24 + id.len()], id.as_bytes());
            at += 24 + id.len();
            placed.push((offset, size));
        }
        let header_len = at as u64;
        assert!(header_len <= HEADER_WINDOW);
        assert_eq!(
            placed[0].0, CODE_OBJECT_ALIGN,
            "the first object starts on the first page after the header"
        );
        for window in placed.windows(2) {
            assert!(
                window[0].0 + window[0].1 <= window[1].0,
                "ascending and disjoint: {placed:?}"
            );
        }
        // Each object starts at the first page boundary after what precedes it.
        let mut previous_end = header_len;
        for &(offset, size) in &placed {
            assert_eq!(offset % CODE_OBJECT_ALIGN, 0);
            assert_eq!(offset, previous_end.next_multiple_of(CODE_OBJECT_ALIGN));
            previous_end = offset + size;
        }
        let (last_offset, last_size) = placed[placed.len() - 1];
        assert_eq!(
            bytes.len() as u64,
            last_offset + last_size,
            "nothing after the last object"
        );
        assert_eq!(placed, [(4096, 100), (8192, 5000), (16384, 7)]);
        // Everything outside the header and the objects is zero.
        let mut covered = header_len as usize;
        for &(offset, size) in &placed {
            assert!(bytes[covered..offset as usize].iter().all(|&b| b == 0));
            covered = (offset + size) as usize;
        }
    }

    #[test]
    fn empty_entries_add_no_padding() {
        let code = code_object(9, 10);
        let first = write(&[(HOST, vec![]), (GFX90A, code.clone())]).unwrap();
        let bundle = OffloadBundle::parse(&first).unwrap();
        let header_len = 32 + 24 + HOST.len() as u64 + 24 + GFX90A.len() as u64;
        assert_eq!(bundle.entries()[0].offset, header_len);
        assert_eq!(bundle.entries()[1].offset, 4096);
        assert_eq!(first.len(), 4096 + code.len());

        let last = write(&[(GFX90A, code.clone()), (HOST, vec![])]).unwrap();
        let bundle = OffloadBundle::parse(&last).unwrap();
        assert_eq!(bundle.entries()[1].offset, 4096 + code.len() as u64);
        assert_eq!(bundle.entries()[1].bytes, b"");
        assert_eq!(last.len(), 4096 + code.len());

        let only = write(&[(HOST, vec![])]).unwrap();
        assert_eq!(only.len() as u64, 32 + 24 + HOST.len() as u64);
        assert_eq!(
            OffloadBundle::parse(&only).unwrap().entries()[0].offset,
            only.len() as u64
        );
    }

    /// The layout in section 1.6 of the reference: clang's empty host entry shares offset 4096
    /// with the first code object.
    #[test]
    fn reads_the_stock_bundler_layout() {
        let bytes = raw_bundle(
            &[
                (4096, 0, HOST.as_bytes()),
                (4096, 5384, GFX90A.as_bytes()),
                (12288, 5384, GFX942.as_bytes()),
                (20480, 5384, GFX950.as_bytes()),
            ],
            25864,
        );
        let bundle = OffloadBundle::parse(&bytes).unwrap();
        let ids: Vec<&str> = bundle.entries().iter().map(|e| e.id).collect();
        assert_eq!(ids, [HOST, GFX90A, GFX942, GFX950]);
        assert_eq!(bundle.entry(HOST).unwrap().bytes, b"");
        assert_eq!(bundle.entry(GFX950).unwrap().bytes.len(), 5384);
    }

    // The compressed form.

    #[test]
    fn compress_writes_ccob_version_2() {
        let bundle = sample();
        let file = compress(&bundle, 3).unwrap();
        assert_eq!(&file[0..4], b"CCOB");
        assert_eq!(&file[4..6], &[2, 0], "version 2");
        assert_eq!(&file[6..8], &[1, 0], "method 1 = zstd");
        assert_eq!(
            u32::from_le_bytes(file[8..12].try_into().unwrap()) as usize,
            file.len()
        );
        assert_eq!(
            u32::from_le_bytes(file[12..16].try_into().unwrap()) as usize,
            bundle.len()
        );
        assert_eq!(file[16..24], Md5::digest(&bundle)[..8]);
        assert_eq!(
            &file[24..28],
            &[0x28, 0xb5, 0x2f, 0xfd],
            "a zstd frame follows the header"
        );
        assert!(is_compressed(&file));
        assert_eq!(decompress(&file).unwrap(), bundle.as_slice());
    }

    #[test]
    fn decompresses_every_version() {
        let bundle = sample();
        for version in 1..=3 {
            let file = ccob_file(version, &bundle);
            let decompressed =
                decompress(&file).unwrap_or_else(|e| panic!("version {version}: {e}"));
            assert!(matches!(decompressed, Cow::Owned(_)));
            assert_eq!(decompressed, bundle.as_slice(), "version {version}");
        }
    }

    #[test]
    fn plain_bytes_pass_through_borrowed() {
        let bundle = sample();
        assert!(!is_compressed(&bundle));
        match decompress(&bundle).unwrap() {
            Cow::Borrowed(bytes) => assert!(std::ptr::eq(bytes, bundle.as_slice())),
            Cow::Owned(_) => panic!("an uncompressed bundle must not be copied"),
        }
        assert!(matches!(decompress(b"").unwrap(), Cow::Borrowed(b"")));
    }

    #[test]
    fn compress_only_accepts_valid_bundles() {
        assert_eq!(
            compress(b"\x7fELF\x02\x01\x01", 3).unwrap_err(),
            FormatError::NotABundle {
                found: FileKind::Elf
            }
        );
        let mut trailing = sample();
        trailing.push(0);
        assert!(matches!(
            compress(&trailing, 3),
            Err(FormatError::TrailingBytes { .. })
        ));
    }

    // Every error, one by one.

    #[test]
    fn says_what_a_foreign_file_is() {
        let cases: [(&[u8], FileKind, &str); 4] = [
            (b"", FileKind::Empty, "an empty file"),
            (b"\x7fELF\x02\x01\x01\x40\0\0", FileKind::Elf, "an ELF file"),
            (
                &[0x50, 0xed, 0x55, 0xba, 1, 0],
                FileKind::CudaFatbin,
                "a CUDA fatbinary",
            ),
            (
                b"!<arch>\ndebian",
                FileKind::Unknown {
                    prefix: b"!<arch>\n".to_vec(),
                },
                "a file starting with bytes 21 3c 61 72 63 68 3e 0a",
            ),
        ];
        for (bytes, kind, description) in cases {
            let error = parse_err(bytes);
            assert_eq!(error, FormatError::NotABundle { found: kind });
            assert_eq!(
                error.to_string(),
                format!(
                    "this is {description}, not an offload bundle (which starts with `__CLANG_OFFLOAD_BUNDLE__`)"
                )
            );
        }
        assert_eq!(parse_err(b"CCOB\x02\x00"), FormatError::CompressedBundle);
    }

    #[test]
    fn truncated_headers_say_which_field() {
        let bytes = sample();
        let len = |n: usize| n as u64;
        assert_eq!(
            parse_err(&bytes[..10]),
            FormatError::HeaderTruncated {
                field: HeaderField::Magic,
                offset: 0,
                needed: 24,
                len: 10
            }
        );
        assert_eq!(
            parse_err(&bytes[..30]),
            FormatError::HeaderTruncated {
                field: HeaderField::EntryCount,
                offset: 24,
                needed: 8,
                len: 30
            }
        );
        // Cuts late enough that the entry count still fits the shortened file.
        let second_descriptor = 32 + 24 + GFX90A.len();
        assert_eq!(
            parse_err(&bytes[..second_descriptor + 23]),
            FormatError::HeaderTruncated {
                field: HeaderField::Descriptor { index: 1 },
                offset: len(second_descriptor),
                needed: 24,
                len: len(second_descriptor + 23),
            }
        );
        let third_id = second_descriptor + 24 + GFX942.len() + 24;
        let error = parse_err(&bytes[..third_id + 5]);
        assert_eq!(
            error,
            FormatError::HeaderTruncated {
                field: HeaderField::Id { index: 2 },
                offset: len(third_id),
                needed: len(SM_90.len()),
                len: len(third_id + 5),
            }
        );
        assert_eq!(
            error.to_string(),
            "the offload bundle header is cut short: the ID of entry 2 needs 30 bytes at offset 182, \
             but the file is only 187 bytes long"
        );
    }

    #[test]
    fn entry_count_must_fit_the_file() {
        assert_eq!(parse_err(&raw_bundle(&[], 32)), FormatError::NoEntries);
        let mut bytes = raw_bundle(&[], 32 + 100);
        bytes[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            parse_err(&bytes),
            FormatError::TooManyEntries {
                count: u64::MAX,
                max: 4,
                len: 132
            }
        );
        bytes[24..32].copy_from_slice(&5_u64.to_le_bytes());
        assert!(matches!(
            parse_err(&bytes),
            FormatError::TooManyEntries {
                count: 5,
                max: 4,
                ..
            }
        ));
    }

    #[test]
    fn entry_ids_must_be_utf8_non_empty_and_unique() {
        let mut bytes = raw_bundle(&[(4096, 4, b"hipv4-?")], 4100);
        let question_mark = 32 + 24 + 6;
        bytes[question_mark] = 0xff;
        assert_eq!(
            parse_err(&bytes),
            FormatError::IdNotUtf8 {
                index: 0,
                offset: 56
            }
        );

        let bytes = raw_bundle(&[(4096, 4, GFX90A.as_bytes()), (8192, 0, b"")], 8192);
        assert_eq!(parse_err(&bytes), FormatError::EmptyId { index: 1 });

        let bytes = raw_bundle(
            &[(4096, 4, GFX90A.as_bytes()), (8192, 4, GFX90A.as_bytes())],
            8196,
        );
        assert_eq!(
            parse_err(&bytes),
            FormatError::DuplicateId { id: GFX90A.into() }
        );
    }

    #[test]
    fn entries_must_lie_between_header_and_end_of_file() {
        let header_len = 32 + 24 + GFX90A.len() as u64;
        let bytes = raw_bundle(&[(0, 0, GFX90A.as_bytes())], 4096);
        assert_eq!(
            parse_err(&bytes),
            FormatError::EntryInsideHeader {
                id: GFX90A.into(),
                offset: 0,
                header_len
            }
        );

        let bytes = raw_bundle(&[(4096, 100, GFX90A.as_bytes())], 4100);
        let error = parse_err(&bytes);
        assert_eq!(
            error,
            FormatError::EntryOutOfBounds {
                id: GFX90A.into(),
                offset: 4096,
                size: 100,
                len: 4100
            }
        );
        assert_eq!(
            error.to_string(),
            "entry `hipv4-amdgcn-amd-amdhsa--gfx90a` claims 100 bytes at offset 4096, past the end \
             of the 4100-byte file; the file is truncated or corrupt"
        );

        // Sizes chosen so that offset + size overflows a u64.
        let bytes = raw_bundle(&[(4096, u64::MAX - 100, GFX90A.as_bytes())], 4200);
        assert!(
            matches!(parse_err(&bytes), FormatError::EntryOutOfBounds { size, .. } if size == u64::MAX - 100)
        );
        // An empty entry must not point past the end either.
        let bytes = raw_bundle(
            &[(4096, 4, GFX90A.as_bytes()), (8192, 0, HOST.as_bytes())],
            4100,
        );
        assert!(matches!(
            parse_err(&bytes),
            FormatError::EntryOutOfBounds {
                offset: 8192,
                size: 0,
                ..
            }
        ));
    }

    #[test]
    fn code_objects_must_be_page_aligned() {
        let bytes = raw_bundle(&[(4097, 4, GFX90A.as_bytes())], 4101);
        assert_eq!(
            parse_err(&bytes),
            FormatError::MisalignedEntry {
                id: GFX90A.into(),
                offset: 4097
            }
        );
        // An empty entry may sit anywhere after the header.
        let bytes = raw_bundle(
            &[(4000, 0, HOST.as_bytes()), (4096, 4, GFX90A.as_bytes())],
            4100,
        );
        assert!(OffloadBundle::parse(&bytes).is_ok());
    }

    #[test]
    fn code_objects_must_not_overlap_or_go_backwards() {
        let bytes = raw_bundle(
            &[
                (4096, 4097, GFX90A.as_bytes()),
                (8192, 4, GFX942.as_bytes()),
            ],
            8196,
        );
        assert_eq!(
            parse_err(&bytes),
            FormatError::OverlappingEntries {
                id: GFX942.into(),
                offset: 8192,
                other: GFX90A.into(),
                other_end: 8193,
            }
        );
        let bytes = raw_bundle(
            &[(8192, 4, GFX90A.as_bytes()), (4096, 4, GFX942.as_bytes())],
            8196,
        );
        assert_eq!(
            parse_err(&bytes),
            FormatError::EntriesOutOfOrder {
                id: GFX942.into(),
                offset: 4096,
                previous: GFX90A.into(),
                previous_offset: 8192,
            }
        );
        // Two entries at the same offset overlap.
        let bytes = raw_bundle(
            &[(4096, 4, GFX90A.as_bytes()), (4096, 4, GFX942.as_bytes())],
            4100,
        );
        assert!(matches!(
            parse_err(&bytes),
            FormatError::OverlappingEntries { .. }
        ));
    }

    #[test]
    fn padding_must_be_zero_and_nothing_may_follow() {
        let mut bytes = sample();
        bytes[5000] = 0x42;
        assert_eq!(
            parse_err(&bytes),
            FormatError::NonZeroPadding {
                offset: 5000,
                value: 0x42
            }
        );

        let mut bytes = sample();
        let header_end = 32 + 3 * 24 + GFX90A.len() + GFX942.len() + SM_90.len();
        bytes[header_end] = 1;
        assert_eq!(
            parse_err(&bytes),
            FormatError::NonZeroPadding {
                offset: header_end as u64,
                value: 1
            }
        );

        // Padding before an empty last entry that points past the last code object.
        let mut bytes = raw_bundle(
            &[(4096, 4, GFX90A.as_bytes()), (8192, 0, HOST.as_bytes())],
            8192,
        );
        assert!(OffloadBundle::parse(&bytes).is_ok());
        bytes[8191] = 7;
        assert_eq!(
            parse_err(&bytes),
            FormatError::NonZeroPadding {
                offset: 8191,
                value: 7
            }
        );

        let mut bytes = sample();
        let len = bytes.len() as u64;
        bytes.extend_from_slice(&[0; 3]);
        assert_eq!(
            parse_err(&bytes),
            FormatError::TrailingBytes {
                end: len,
                len: len + 3
            }
        );
    }

    #[test]
    fn writer_refuses_bad_entry_lists() {
        assert_eq!(write_bundle(&[]).unwrap_err(), FormatError::NoEntries);
        assert_eq!(
            write_bundle(&[(GFX90A, b"a"), ("", b"b")]).unwrap_err(),
            FormatError::EmptyId { index: 1 }
        );
        assert_eq!(
            write_bundle(&[(GFX90A, b"a"), (GFX942, b"b"), (GFX90A, b"c")]).unwrap_err(),
            FormatError::DuplicateId { id: GFX90A.into() }
        );

        // 60 IDs of 59 bytes fill 32 + 60 * 83 = 5012 bytes of header.
        let ids: Vec<String> = (0..60)
            .map(|i| format!("{GFX942}-variant-{i:03}"))
            .collect();
        let entries: Vec<(&str, &[u8])> = ids.iter().map(|id| (id.as_str(), &b"x"[..])).collect();
        assert_eq!(
            write_bundle(&entries).unwrap_err(),
            FormatError::HeaderTooLarge {
                count: 60,
                header_len: 5012
            }
        );
        // The same number of entries with shorter IDs fits.
        let ids: Vec<String> = (0..60).map(|i| format!("hipv4-x-{i:02}")).collect();
        let entries: Vec<(&str, &[u8])> = ids.iter().map(|id| (id.as_str(), &b"x"[..])).collect();
        assert!(write_bundle(&entries).is_ok());
    }

    #[test]
    fn sizes_that_overflow_are_refused() {
        assert_eq!(
            Layout::plan(&[(GFX90A, u64::MAX)]).unwrap_err(),
            FormatError::BundleTooLarge
        );
        assert_eq!(
            Layout::plan(&[(GFX90A, 1), (GFX942, u64::MAX - 4096)]).unwrap_err(),
            FormatError::BundleTooLarge
        );
        let layout = Layout::plan(&[(GFX90A, 1), (GFX942, 0), (SM_90, 4096)]).unwrap();
        assert_eq!(layout.offsets, [4096, 4097, 8192]);
        assert_eq!(layout.file_len, 12288);

        let too_long = CompressedHeader {
            total_size: Some(1 << 32),
            uncompressed_size: 10,
            hash: [0; 8],
        };
        assert_eq!(
            too_long.write_v2(&mut Vec::new()).unwrap_err(),
            FormatError::BundleTooLarge
        );
        assert_eq!(
            check_uncompressed_size(MAX_UNCOMPRESSED_SIZE + 1).unwrap_err(),
            FormatError::UncompressedTooLarge {
                size: MAX_UNCOMPRESSED_SIZE + 1
            }
        );
        assert!(check_uncompressed_size(MAX_UNCOMPRESSED_SIZE).is_ok());

        let limit = 1000 * MAX_COMPRESSION_RATIO + UNCOMPRESSED_ALLOWANCE;
        assert!(check_compression_ratio(limit, 1000).is_ok());
        assert_eq!(
            check_compression_ratio(limit + 1, 1000).unwrap_err(),
            FormatError::UncompressedImplausible {
                declared: limit + 1,
                len: 1000,
                limit
            }
        );
        assert!(check_compression_ratio(u64::MAX, u64::MAX).is_ok());
    }

    #[test]
    fn compressed_header_fields_are_checked() {
        let bundle = sample();
        let good = ccob_file(2, &bundle);
        assert_eq!(
            decompress_err(b"CCOB\x02"),
            FormatError::CompressedHeaderTruncated { needed: 8, len: 5 }
        );
        assert_eq!(
            decompress_err(&good[..20]),
            FormatError::CompressedHeaderTruncated {
                needed: 24,
                len: 20
            }
        );
        assert_eq!(
            decompress_err(&ccob_file(3, &bundle)[..31]),
            FormatError::CompressedHeaderTruncated {
                needed: 32,
                len: 31
            }
        );

        for version in [0, 4, 0xffff] {
            let mut file = good.clone();
            file[4..6].copy_from_slice(&u16::to_le_bytes(version));
            assert_eq!(
                decompress_err(&file),
                FormatError::UnsupportedVersion { version }
            );
        }

        let mut zlib = good.clone();
        zlib[6] = 0;
        let error = decompress_err(&zlib);
        assert_eq!(error, FormatError::UnsupportedMethod { method: 0 });
        assert_eq!(
            error.to_string(),
            "the compressed bundle uses zlib (method 0), but only zstd (method 1) is supported; \
             rebuild it with zstd compression"
        );
        let mut unknown = good.clone();
        unknown[6] = 7;
        assert!(
            decompress_err(&unknown)
                .to_string()
                .contains("unknown method 7")
        );

        let len = good.len() as u64;
        let mut appended = good.clone();
        appended.push(0);
        assert_eq!(
            decompress_err(&appended),
            FormatError::CompressedSizeMismatch {
                declared: len,
                len: len + 1
            }
        );
        assert_eq!(
            decompress_err(&good[..good.len() - 1]),
            FormatError::CompressedSizeMismatch {
                declared: len,
                len: len - 1
            }
        );
    }

    #[test]
    fn compressed_payload_is_checked_against_the_header() {
        let bundle = sample();
        let payload = zstd::bulk::compress(&bundle, 3).unwrap();
        let hash = md5_prefix(&bundle);
        let size = bundle.len() as u64;
        let file = |uncompressed: u64, hash: [u8; 8], payload: &[u8]| {
            let mut out = ccob(
                3,
                METHOD_ZSTD,
                32 + payload.len() as u64,
                uncompressed,
                hash,
            );
            out.extend_from_slice(payload);
            out
        };

        // A few bytes that claim to expand to 3 GiB are refused before any decompression.
        assert_eq!(
            decompress_err(&file(3 << 30, hash, &payload)),
            FormatError::UncompressedTooLarge { size: 3 << 30 }
        );
        assert!(matches!(
            decompress_err(&file(size, hash, b"not zstd")),
            FormatError::ZstdDecompress { .. }
        ));
        // A payload cut short inside the zstd frame.
        assert!(matches!(
            decompress_err(&file(size, hash, &payload[..payload.len() - 2])),
            FormatError::ZstdDecompress { .. }
        ));
        // Junk after the frame.
        let mut junk = payload.clone();
        junk.extend_from_slice(b"junk");
        assert!(matches!(
            decompress_err(&file(size, hash, &junk)),
            FormatError::ZstdDecompress { .. }
        ));

        assert_eq!(
            decompress_err(&file(size + 1, hash, &payload)),
            FormatError::UncompressedTooShort {
                declared: size + 1,
                actual: size
            }
        );
        assert_eq!(
            decompress_err(&file(size - 1, hash, &payload)),
            FormatError::UncompressedTooLong { declared: size - 1 }
        );

        let mut wrong = hash;
        wrong[0] ^= 1;
        let error = decompress_err(&file(size, wrong, &payload));
        assert_eq!(
            error,
            FormatError::HashMismatch {
                recorded: wrong,
                actual: hash
            }
        );
        assert!(error.to_string().contains(&Hex(&hash).to_string()));
    }

    // Hostile input.

    /// Two small entries: the smallest realistic bundle, so that every byte can be mutated.
    fn small_bundle() -> Vec<u8> {
        write(&[(GFX90A, code_object(4, 40)), (GFX942, code_object(5, 24))]).unwrap()
    }

    #[test]
    fn no_single_byte_change_to_a_plain_bundle_panics() {
        let bundle = small_bundle();
        let parsed = OffloadBundle::parse(&bundle).unwrap();
        let header_len = 32 + 2 * 24 + GFX90A.len() + GFX942.len();
        let inside_entry = |at: usize| {
            parsed
                .entries()
                .iter()
                .any(|e| (e.offset..e.end()).contains(&(at as u64)))
        };
        let mut mutated = bundle.clone();
        for at in 0..bundle.len() {
            let original = bundle[at];
            if at < header_len {
                for value in (0..=u8::MAX).filter(|&v| v != original) {
                    mutated[at] = value;
                    let _ = OffloadBundle::parse(&mutated);
                }
            } else {
                // Past the header the outcome is known exactly for any new value: code objects
                // are opaque, padding must stay zero.
                mutated[at] = original ^ 0x5a;
                let result = OffloadBundle::parse(&mutated);
                if inside_entry(at) {
                    assert!(result.is_ok(), "byte {at}: {result:?}");
                } else {
                    assert_eq!(
                        result.unwrap_err(),
                        FormatError::NonZeroPadding {
                            offset: at as u64,
                            value: 0x5a
                        }
                    );
                }
            }
            mutated[at] = original;
        }
    }

    #[test]
    fn no_single_byte_change_to_a_compressed_bundle_panics() {
        let file = compress(&small_bundle(), 3).unwrap();
        let mut mutated = file.clone();
        for at in 0..file.len() {
            for value in (0..=u8::MAX).filter(|&v| v != file[at]) {
                mutated[at] = value;
                let _ = load(&mutated);
            }
            mutated[at] = file[at];
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bundle = small_bundle();
        let file = compress(&bundle, 3).unwrap();
        for form in [&bundle, &file] {
            assert_eq!(load(form), Ok(2));
            for len in 0..form.len() {
                assert!(
                    load(&form[..len]).is_err(),
                    "a {len}-byte prefix was accepted"
                );
            }
        }
    }

    // Interoperability with LLVM's own tool.

    mod stock_bundler {
        use std::path::{Path, PathBuf};
        use std::process::Command;

        use super::*;

        const BUNDLER: &str = "/usr/lib/llvm-22/bin/clang-offload-bundler";

        fn bundler() -> Option<&'static Path> {
            let path = Path::new(BUNDLER);
            if path.exists() {
                Some(path)
            } else {
                eprintln!("skipping: {BUNDLER} is not installed");
                None
            }
        }

        fn run(bundler: &Path, args: &[String], envs: &[(&str, &str)]) -> String {
            let output = Command::new(bundler)
                .args(args)
                .env("OFFLOAD_BUNDLER_IGNORE_ENV_VAR", "0")
                .envs(envs.iter().copied())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                output.status.success(),
                "{bundler:?} {args:?} failed: {stderr}"
            );
            String::from_utf8(output.stdout).unwrap()
        }

        fn path_arg(flag: &str, path: &Path) -> String {
            format!("--{flag}={}", path.display())
        }

        #[test]
        fn lists_and_unbundles_what_we_write() {
            let Some(bundler) = bundler() else { return };
            let dir = tempfile::tempdir().unwrap();
            let entries = [
                (GFX90A, code_object(1, 300)),
                (GFX942, code_object(2, 5000)),
                (SM_90, code_object(3, 17)),
                // The bundler lists `cuda-` IDs but refuses to unbundle them ("unknown
                // offloading kind 'cuda'"), so only the AMD entries are extracted below.
                (COMPUTE_90, code_object(4, 9)),
            ];
            let plain = write(&entries).unwrap();
            let forms: [(&str, Vec<u8>); 2] = [
                ("plain", plain.clone()),
                ("compressed", compress(&plain, 3).unwrap()),
            ];
            for (name, bytes) in forms {
                let input: PathBuf = dir.path().join(name);
                std::fs::write(&input, &bytes).unwrap();
                let listed = run(
                    bundler,
                    &[
                        "--list".into(),
                        "--type=o".into(),
                        path_arg("input", &input),
                    ],
                    &[],
                );
                let mut listed: Vec<&str> = listed.lines().collect();
                let mut written: Vec<&str> = entries.iter().map(|(id, _)| *id).collect();
                listed.sort_unstable();
                written.sort_unstable();
                assert_eq!(listed, written, "{name}");

                for (id, code) in &entries[..2] {
                    let output = dir.path().join(format!("{name}.out"));
                    run(
                        bundler,
                        &[
                            "--unbundle".into(),
                            "--type=o".into(),
                            format!("--targets={id}"),
                            path_arg("input", &input),
                            path_arg("output", &output),
                        ],
                        &[],
                    );
                    assert_eq!(&std::fs::read(&output).unwrap(), code, "{name} {id}");
                }
            }
        }

        #[test]
        fn reads_what_the_bundler_writes() {
            let Some(bundler) = bundler() else { return };
            let dir = tempfile::tempdir().unwrap();
            let codes = [
                (GFX90A, code_object(1, 300)),
                (GFX942, code_object(2, 5000)),
            ];
            let mut args = vec![
                "--type=o".to_owned(),
                format!("--targets=host-x86_64-unknown-linux-gnu,{GFX90A},{GFX942}"),
                // An empty host input, as the clang driver passes, keeps the bundler on its
                // binary path for non-ELF inputs.
                "--input=/dev/null".to_owned(),
                "--bundle-align=4096".to_owned(),
            ];
            for (index, (_, code)) in codes.iter().enumerate() {
                let input = dir.path().join(format!("{index}.co"));
                std::fs::write(&input, code).unwrap();
                args.push(path_arg("input", &input));
            }
            let output = dir.path().join("out");
            args.push(path_arg("output", &output));

            let variants: [(&str, &[(&str, &str)]); 3] = [
                ("plain", &[]),
                (
                    "compressed v2",
                    &[
                        ("OFFLOAD_BUNDLER_COMPRESS", "1"),
                        ("COMPRESSED_BUNDLE_FORMAT_VERSION", "2"),
                    ],
                ),
                (
                    "compressed v3",
                    &[
                        ("OFFLOAD_BUNDLER_COMPRESS", "1"),
                        ("COMPRESSED_BUNDLE_FORMAT_VERSION", "3"),
                    ],
                ),
            ];
            for (name, envs) in variants {
                run(bundler, &args, envs);
                let file = std::fs::read(&output).unwrap();
                assert_eq!(is_compressed(&file), name != "plain", "{name}");
                let bytes = decompress(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
                let bundle = OffloadBundle::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
                let ids: Vec<&str> = bundle.entries().iter().map(|e| e.id).collect();
                assert_eq!(ids, [HOST, GFX90A, GFX942], "{name}");
                let host = bundle.entry(HOST).unwrap();
                assert_eq!(host.bytes, b"");
                assert_eq!(
                    host.offset,
                    bundle.entry(GFX90A).unwrap().offset,
                    "{name}: the host entry shares an offset"
                );
                for (id, code) in &codes {
                    assert_eq!(
                        bundle.entry(id).unwrap().bytes,
                        code.as_slice(),
                        "{name} {id}"
                    );
                }
            }
        }
    }
}
