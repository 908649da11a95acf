//! The compressed form of an offload bundle (magic `CCOB`): a header, then one zstd stream of
//! the whole plain bundle. Reading it needs zstd and MD5, hence the `compressed` feature.

use std::borrow::Cow;
use std::io::Read;

use md5::{Digest, Md5};

use super::{
    CCOB_MAGIC, FormatError, HEADER_WINDOW, MAX_COMPRESSION_RATIO, MAX_UNCOMPRESSED_SIZE,
    METHOD_ZSTD, Reader, UNCOMPRESSED_ALLOWANCE, narrow, read_header, widen,
};

/// The zstd stream inside a CCOB file and the header that describes it, after checking the
/// header against the file: its total size, and the uncompressed size against the cap.
fn open_compressed(
    bytes: &[u8],
) -> Result<
    (
        CompressedHeader,
        zstd::stream::read::Decoder<'static, &[u8]>,
    ),
    FormatError,
> {
    let (header, header_len) = CompressedHeader::parse(bytes)?;
    let file_len = widen(bytes.len());
    if let Some(declared) = header.total_size.filter(|&declared| declared != file_len) {
        return Err(FormatError::CompressedSizeMismatch {
            declared,
            len: file_len,
        });
    }
    check_uncompressed_size(header.uncompressed_size)?;
    check_compression_ratio(header.uncompressed_size, file_len)?;
    let payload = bytes.get(header_len..).unwrap_or_default();
    let decoder = zstd::stream::read::Decoder::with_buffer(payload).map_err(zstd_error)?;
    Ok((header, decoder))
}

fn zstd_error(error: std::io::Error) -> FormatError {
    FormatError::ZstdDecompress {
        detail: error.to_string(),
    }
}

/// Decompresses a CCOB whole; see [`super::decompress`].
pub(super) fn decompress(bytes: &[u8]) -> Result<Vec<u8>, FormatError> {
    let (header, mut decoder) = open_compressed(bytes)?;
    let mut bundle = Vec::new();
    read_rest(&mut decoder, &mut bundle, &header)?;
    Ok(bundle)
}

/// Reads what is left of a CCOB's stream onto `bundle` and checks the whole against the
/// header: exactly the declared size, and the MD5 prefix (LLVM does not check it on load).
fn read_rest(
    decoder: impl Read,
    bundle: &mut Vec<u8>,
    header: &CompressedHeader,
) -> Result<(), FormatError> {
    let declared = header.uncompressed_size;
    // Reading one byte past the promised size is enough to tell a lying header from an honest
    // one, and never lets the output grow beyond the cap.
    let left = declared.saturating_sub(widen(bundle.len()));
    // The size is capped by `open_compressed`, absolutely and relative to the file, so reserving
    // it up front is safe and saves regrowing.
    bundle.reserve_exact(narrow(left)?);
    decoder
        .take(left.saturating_add(1))
        .read_to_end(bundle)
        .map_err(zstd_error)?;
    let actual = widen(bundle.len());
    if actual > declared {
        return Err(FormatError::UncompressedTooLong { declared });
    }
    if actual < declared {
        return Err(FormatError::UncompressedTooShort { declared, actual });
    }
    let actual = md5_prefix(bundle);
    if actual != header.hash {
        return Err(FormatError::HashMismatch {
            recorded: header.hash,
            actual,
        });
    }
    Ok(())
}

/// The code object `id` of a compressed bundle, decompressed only as far as its end; see
/// [`super::extract_entry`].
pub(super) fn extract_entry(bytes: &[u8], id: &str) -> Result<Cow<'static, [u8]>, FormatError> {
    let (header, mut decoder) = open_compressed(bytes)?;
    let declared = header.uncompressed_size;
    let mut bundle = Vec::new();
    // Reads until `bundle` holds `len` bytes (at most `declared`); a stream that ends sooner is
    // shorter than its header says.
    let mut fill = |bundle: &mut Vec<u8>, len: u64| -> Result<(), FormatError> {
        let want = len.min(declared);
        let have = widen(bundle.len());
        if have < want {
            (&mut decoder)
                .take(want - have)
                .read_to_end(bundle)
                .map_err(zstd_error)?;
        }
        let actual = widen(bundle.len());
        if actual < want {
            return Err(FormatError::UncompressedTooShort { declared, actual });
        }
        Ok(())
    };

    // The header comes first; ours fit in the first 4096 bytes, others may need more.
    let mut window = HEADER_WINDOW;
    let (offset, size, last) = loop {
        fill(&mut bundle, window)?;
        match read_header(&bundle, declared) {
            Ok((descriptors, _)) => {
                let (offset, size) = descriptors
                    .iter()
                    .find(|(entry, ..)| *entry == id)
                    .map(|&(_, offset, size)| (offset, size))
                    .ok_or_else(|| FormatError::NoSuchEntry { id: id.into() })?;
                let end = offset.saturating_add(size);
                let last = descriptors
                    .iter()
                    .all(|&(_, o, s)| o.saturating_add(s) <= end);
                break (offset, size, last);
            }
            Err(FormatError::HeaderTruncated { .. }) if widen(bundle.len()) < declared => {
                window = window.saturating_mul(2);
            }
            Err(error) => return Err(error),
        }
    };
    let end = offset
        .checked_add(size)
        .filter(|&end| end <= declared)
        .ok_or_else(|| FormatError::EntryOutOfBounds {
            id: id.into(),
            offset,
            size,
            len: declared,
        })?;
    if last {
        // Nothing would be left to skip: read the whole and check it as `decompress` does.
        read_rest(&mut decoder, &mut bundle, &header)?;
    } else {
        // `end` is at most the capped declared size, so reserving it is safe and saves regrowing.
        bundle.reserve_exact(narrow(end)?.saturating_sub(bundle.len()));
        fill(&mut bundle, end)?;
    }
    let range = narrow(offset)?..narrow(end)?;
    Ok(Cow::Owned(bundle.get(range).unwrap_or_default().to_vec()))
}

/// The first 8 bytes of the MD5 digest: what LLVM stores as `MD5Result::low()`.
pub(super) fn md5_prefix(bytes: &[u8]) -> [u8; 8] {
    let digest = Md5::digest(bytes);
    let mut prefix = [0; 8];
    prefix.copy_from_slice(&digest[..8]);
    prefix
}

/// The CCOB header layouts, told apart by the version field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CompressedVersion {
    /// Legacy, read only: 32-bit uncompressed size, no total size.
    V1,
    /// 32-bit total and uncompressed sizes; what we write.
    V2,
    /// 64-bit total and uncompressed sizes; LLVM's default since 2025.
    V3,
}

impl CompressedVersion {
    fn from_number(number: u16) -> Option<Self> {
        match number {
            1 => Some(Self::V1),
            2 => Some(Self::V2),
            3 => Some(Self::V3),
            _ => None,
        }
    }

    #[cfg(feature = "write")]
    pub(super) fn number(self) -> u16 {
        match self {
            Self::V1 => 1,
            Self::V2 => 2,
            Self::V3 => 3,
        }
    }

    /// The whole header's length, magic included.
    pub(super) fn header_len(self) -> u64 {
        match self {
            Self::V1 => 20,
            Self::V2 => 24,
            Self::V3 => 32,
        }
    }
}

/// The fields of a CCOB header that vary between files, whatever the header's version.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct CompressedHeader {
    /// The whole file's length, header included; version 1 does not record it.
    pub(super) total_size: Option<u64>,
    pub(super) uncompressed_size: u64,
    pub(super) hash: [u8; 8],
}

impl CompressedHeader {
    /// Magic, version and method: the part every version shares.
    const COMMON_LEN: u64 = 8;

    /// Reads the header of a file that starts with [`CCOB_MAGIC`]; returns it with its length.
    fn parse(bytes: &[u8]) -> Result<(Self, usize), FormatError> {
        let file_len = widen(bytes.len());
        let needs = |needed| FormatError::CompressedHeaderTruncated {
            needed,
            len: file_len,
        };
        let mut reader = Reader::at(bytes, CCOB_MAGIC.len());
        let (Some(number), Some(method)) = (reader.u16(), reader.u16()) else {
            return Err(needs(Self::COMMON_LEN));
        };
        let version = CompressedVersion::from_number(number)
            .ok_or(FormatError::UnsupportedVersion { version: number })?;
        if method != METHOD_ZSTD {
            return Err(FormatError::UnsupportedMethod { method });
        }
        let header = Self::read_fields(&mut reader, version).ok_or(needs(version.header_len()))?;
        Ok((header, reader.position))
    }

    /// Reads what follows the method field; `None` if the file ends first.
    fn read_fields(reader: &mut Reader<'_>, version: CompressedVersion) -> Option<Self> {
        let (total_size, uncompressed_size) = match version {
            CompressedVersion::V1 => (None, u64::from(reader.u32()?)),
            CompressedVersion::V2 => (Some(u64::from(reader.u32()?)), u64::from(reader.u32()?)),
            CompressedVersion::V3 => (Some(reader.u64()?), reader.u64()?),
        };
        Some(Self {
            total_size,
            uncompressed_size,
            hash: reader.array()?,
        })
    }
}

pub(super) fn check_uncompressed_size(size: u64) -> Result<(), FormatError> {
    if size > MAX_UNCOMPRESSED_SIZE {
        return Err(FormatError::UncompressedTooLarge { size });
    }
    Ok(())
}

/// Refuses a compressed file of `len` bytes that claims to hold more than
/// [`MAX_COMPRESSION_RATIO`] allows, before anything of the claimed size is reserved.
pub(super) fn check_compression_ratio(declared: u64, len: u64) -> Result<(), FormatError> {
    let limit = len
        .saturating_mul(MAX_COMPRESSION_RATIO)
        .saturating_add(UNCOMPRESSED_ALLOWANCE);
    if declared > limit {
        return Err(FormatError::UncompressedImplausible {
            declared,
            len,
            limit,
        });
    }
    Ok(())
}
