//! The folders a build keeps aside while it works, and the clean-up of those a killed build
//! left behind: beside `dist/<bundle>` while it replaces it (`.staging-*`, the new bundle
//! being written; `.retired-*`, the old one on its way out), and in the cache's `tmp/` (a
//! job's outputs before they are stored, a file being written).
//!
//! Each folder has a lock file beside it, `<folder>.lock`, which its build holds locked
//! (`flock`) for as long as the folder is its own. The operating system drops the lock when
//! the process dies, however it dies, so the next build can tell a leftover (its lock free)
//! from the folder of a build still running (its lock held) and removes only leftovers. The
//! lock file is created and locked before its folder, and then checked to still be the file
//! at its path: a clean-up that removed it in between makes the build start over with a new
//! name, so a folder that has no lock file is never a running build's.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// The kinds of folder a build keeps beside the bundle (the cache names its own).
pub const STAGING: &str = ".staging-";
pub const RETIRED: &str = ".retired-";

const LOCK_SUFFIX: &str = ".lock";

/// A folder of this build's, removed with its lock file when dropped (after a rename has taken
/// it away, only the lock file is left to remove).
#[derive(Debug)]
pub struct Aside {
    dir: PathBuf,
    lock_path: PathBuf,
    /// Held locked until the folder and lock file are removed.
    _lock: File,
}

impl Aside {
    /// Creates an empty folder `<parent>/<kind><random>` with its lock held.
    pub fn create(parent: &Path, kind: &str) -> io::Result<Self> {
        loop {
            let (lock, lock_path) = tempfile::Builder::new()
                .prefix(kind)
                .suffix(LOCK_SUFFIX)
                .tempfile_in(parent)?
                .keep()
                .map_err(|e| e.error)?;
            lock.lock()?;
            if !is_same_file(&lock, &lock_path)? {
                // A clean-up took the lock file while it was still unlocked.
                continue;
            }
            let dir = folder_of(&lock_path)
                .ok_or_else(|| io::Error::other("a lock file's name lost its suffix"))?;
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    return Ok(Self {
                        dir,
                        lock_path,
                        _lock: lock,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let _ = std::fs::remove_file(&lock_path);
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&lock_path);
                    return Err(e);
                }
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Aside {
    fn drop(&mut self) {
        // The folder first, while the lock still says it is ours.
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// Removes from `parent` the folders (and lock files) whose names start with one of `kinds`
/// and whose builds are no longer running. A folder whose build still runs is left alone.
/// Best effort: what cannot be removed now is tried again by the next build.
pub fn clean_leftovers(parent: &Path, kinds: &[&str]) {
    let Ok(listing) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in listing.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !kinds.iter().any(|kind| name.starts_with(kind)) {
            continue;
        }
        let path = entry.path();
        if name.ends_with(LOCK_SUFFIX) {
            // A lock file whose folder is gone: the build died while removing both, or before
            // making the folder.
            let gone = folder_of(&path).is_none_or(|dir| !dir.exists());
            if gone && is_free(&path) {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        let lock_path = lock_of(&path);
        let free = match File::open(&lock_path) {
            // Checked with the lock held, so that no build can take the folder meanwhile.
            Ok(lock) => lock.try_lock().is_ok(),
            // Made before lock files were (or its lock already removed): no build runs there.
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        };
        if free {
            let _ = std::fs::remove_dir_all(&path);
            let _ = std::fs::remove_file(&lock_path);
        }
    }
}

/// Whether no process holds the lock file at `path`.
fn is_free(path: &Path) -> bool {
    File::open(path).is_ok_and(|lock| lock.try_lock().is_ok())
}

fn is_same_file(file: &File, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let (held, named) = (file.metadata()?, std::fs::metadata(path));
    Ok(named.is_ok_and(|named| named.dev() == held.dev() && named.ino() == held.ino()))
}

/// `<folder>.lock` for a folder, and back.
fn lock_of(dir: &Path) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(LOCK_SUFFIX);
    PathBuf::from(name)
}

fn folder_of(lock_path: &Path) -> Option<PathBuf> {
    let name = lock_path.file_name()?.to_str()?.strip_suffix(LOCK_SUFFIX)?;
    Some(lock_path.with_file_name(name))
}
