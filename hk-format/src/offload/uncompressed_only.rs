//! A build without the `compressed` feature: a compressed module file is a clear error.

use super::FormatError;

pub(super) fn decompress(_bytes: &[u8]) -> Result<Vec<u8>, FormatError> {
    Err(FormatError::CompressedUnsupported)
}

pub(super) fn extract_entry(
    _bytes: &[u8],
    _id: &str,
) -> Result<std::borrow::Cow<'static, [u8]>, FormatError> {
    Err(FormatError::CompressedUnsupported)
}
