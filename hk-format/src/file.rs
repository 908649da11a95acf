//! The bytes of one bundle file, however hkload holds them: mapped from the bundle folder,
//! embedded in the program, or read into memory.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

/// A bundle file's bytes. Records decoded from it later (a kernel's record in the index, a
/// code image in a module file) are slices of these bytes, not copies.
pub struct FileBytes(Held);

enum Held {
    Mapped(memmap2::Mmap),
    Static(&'static [u8]),
    Owned(Vec<u8>),
}

impl FileBytes {
    /// Maps the file at `path`. Its pages are read when first touched, so the parts of a file
    /// that are never used (other devices' code, other kernels' records) cost nothing.
    pub fn map(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        // Mapping needs the length anyway; asking here too says what is wrong with a folder or
        // a device where a file belongs, which mmap reports only as "no such device".
        let metadata = file.metadata()?;
        if !metadata.is_file() {
            return Err(std::io::Error::other("it is not a regular file"));
        }
        let len = usize::try_from(metadata.len()).map_err(std::io::Error::other)?;
        // SAFETY: the map is read-only and private to this process. Bundles are written aside
        // and moved into place whole, so a file is never rewritten while mapped by a
        // well-behaved producer; hashes catch the rest when verifying.
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(&file) }?;
        Ok(Self(Held::Mapped(map)))
    }

    /// Asks the operating system to read in the pages of `part` now, in one call, rather than
    /// one page fault at a time as the driver first touches them: for the code image about to
    /// be loaded. Only a hint: where it is refused (Linux before 5.14), the pages fault in as
    /// before.
    pub fn prefetch(&self, part: &[u8]) {
        if let Held::Mapped(map) = &self.0 {
            let offset = part.as_ptr().addr().wrapping_sub(map.as_ptr().addr());
            if offset
                .checked_add(part.len())
                .is_some_and(|end| end <= map.len())
            {
                let _ = map.advise_range(memmap2::Advice::PopulateRead, offset, part.len());
            }
        }
    }
}

impl From<&'static [u8]> for FileBytes {
    fn from(bytes: &'static [u8]) -> Self {
        Self(Held::Static(bytes))
    }
}

impl From<Vec<u8>> for FileBytes {
    fn from(bytes: Vec<u8>) -> Self {
        Self(Held::Owned(bytes))
    }
}

impl Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Held::Mapped(map) => map,
            Held::Static(bytes) => bytes,
            Held::Owned(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for FileBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileBytes({} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_files_whatever_their_size_and_refuses_folders() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bundle.msgpack");
        std::fs::write(&path, b"records").unwrap();
        assert_eq!(&*FileBytes::map(&path).unwrap(), b"records");
        std::fs::write(&path, b"").unwrap();
        assert!(FileBytes::map(&path).unwrap().is_empty());
        let error = FileBytes::map(dir.path()).unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
    }
}
