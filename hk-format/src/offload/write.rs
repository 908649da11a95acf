//! Writing offload bundles, plain and compressed: what hkpack needs and a runtime does not.

use std::collections::HashSet;

use super::compressed::{
    CompressedHeader, CompressedVersion, check_compression_ratio, check_uncompressed_size,
    md5_prefix,
};
use super::{
    BUNDLE_MAGIC, BUNDLE_PREFIX_LEN, CCOB_MAGIC, CODE_OBJECT_ALIGN, DESCRIPTOR_FIXED_LEN,
    FormatError, HEADER_WINDOW, METHOD_ZSTD, OffloadBundle, narrow, widen,
};

/// Writes an uncompressed bundle: entries in the given order, each non-empty one at the next
/// multiple of [`CODE_OBJECT_ALIGN`], zero padding, nothing after the last, no host entry.
/// An empty entry takes the current position, so it never adds padding.
pub fn write_bundle(entries: &[(&str, &[u8])]) -> Result<Vec<u8>, FormatError> {
    let sizes: Vec<(&str, u64)> = entries
        .iter()
        .map(|&(id, bytes)| (id, widen(bytes.len())))
        .collect();
    let layout = Layout::plan(&sizes)?;

    let mut out = Vec::with_capacity(narrow(layout.file_len)?);
    out.extend_from_slice(BUNDLE_MAGIC);
    out.extend_from_slice(&widen(entries.len()).to_le_bytes());
    for (&(id, bytes), &offset) in entries.iter().zip(&layout.offsets) {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&widen(bytes.len()).to_le_bytes());
        out.extend_from_slice(&widen(id.len()).to_le_bytes());
        out.extend_from_slice(id.as_bytes());
    }
    for (&(_, bytes), &offset) in entries.iter().zip(&layout.offsets) {
        out.resize(narrow(offset)?, 0);
        out.extend_from_slice(bytes);
    }
    Ok(out)
}

/// Where [`write_bundle`] puts things, worked out from sizes alone.
#[derive(Debug)]
pub(super) struct Layout {
    pub(super) offsets: Vec<u64>,
    pub(super) file_len: u64,
}

impl Layout {
    pub(super) fn plan(entries: &[(&str, u64)]) -> Result<Self, FormatError> {
        if entries.is_empty() {
            return Err(FormatError::NoEntries);
        }
        let mut seen = HashSet::new();
        let mut header_len = BUNDLE_PREFIX_LEN;
        for (index, &(id, _)) in entries.iter().enumerate() {
            if id.is_empty() {
                return Err(FormatError::EmptyId { index });
            }
            if !seen.insert(id) {
                return Err(FormatError::DuplicateId { id: id.into() });
            }
            header_len = DESCRIPTOR_FIXED_LEN
                .checked_add(widen(id.len()))
                .and_then(|descriptor_len| header_len.checked_add(descriptor_len))
                .ok_or(FormatError::BundleTooLarge)?;
        }
        if header_len > HEADER_WINDOW {
            return Err(FormatError::HeaderTooLarge {
                count: entries.len(),
                header_len,
            });
        }

        let mut offsets = Vec::with_capacity(entries.len());
        let mut end = header_len;
        for &(_, size) in entries {
            let offset = if size == 0 {
                Some(end)
            } else {
                end.checked_next_multiple_of(CODE_OBJECT_ALIGN)
            };
            let offset = offset.ok_or(FormatError::BundleTooLarge)?;
            end = offset
                .checked_add(size)
                .ok_or(FormatError::BundleTooLarge)?;
            offsets.push(offset);
        }
        Ok(Self {
            offsets,
            file_len: end,
        })
    }
}

/// Compresses a whole uncompressed bundle into CCOB version 2 (24-byte header, method 1 = zstd,
/// total size, uncompressed size, hash = first 8 bytes of MD5(uncompressed)). The input is
/// parsed first, so a CCOB never wraps anything but a valid bundle.
///
/// Version 2 rather than LLVM's newer default 3: it is what HIP runtimes since ROCm 6.2 read,
/// and its 32-bit sizes hold any bundle below [`MAX_UNCOMPRESSED_SIZE`].
pub fn compress(bundle: &[u8], level: i32) -> Result<Vec<u8>, FormatError> {
    OffloadBundle::parse(bundle)?;
    let uncompressed_size = widen(bundle.len());
    check_uncompressed_size(uncompressed_size)?;
    let payload =
        zstd::bulk::compress(bundle, level).map_err(|error| FormatError::ZstdCompress {
            detail: error.to_string(),
        })?;
    let header = CompressedHeader {
        total_size: CompressedVersion::V2
            .header_len()
            .checked_add(widen(payload.len())),
        uncompressed_size,
        hash: md5_prefix(bundle),
    };
    let mut out = Vec::new();
    header.write_v2(&mut out)?;
    out.extend_from_slice(&payload);
    // What we write must read back.
    check_compression_ratio(uncompressed_size, widen(out.len()))?;
    Ok(out)
}

impl CompressedHeader {
    /// Appends the header in version 2 form, whose sizes are 32-bit.
    pub(super) fn write_v2(&self, out: &mut Vec<u8>) -> Result<(), FormatError> {
        let narrow_u32 = |size: Option<u64>| {
            size.and_then(|size| u32::try_from(size).ok())
                .ok_or(FormatError::BundleTooLarge)
        };
        let total_size = narrow_u32(self.total_size)?;
        let uncompressed_size = narrow_u32(Some(self.uncompressed_size))?;
        out.extend_from_slice(CCOB_MAGIC);
        out.extend_from_slice(&CompressedVersion::V2.number().to_le_bytes());
        out.extend_from_slice(&METHOD_ZSTD.to_le_bytes());
        out.extend_from_slice(&total_size.to_le_bytes());
        out.extend_from_slice(&uncompressed_size.to_le_bytes());
        out.extend_from_slice(&self.hash);
        Ok(())
    }
}
