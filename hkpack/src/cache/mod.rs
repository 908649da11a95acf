//! The build cache: compiled job outputs stored by a key made of everything that changes them.
//!
//! A job's *identity* is the compiler's identity, the target, the code-object version and the
//! full compiler command (flags, defines, include folders, source path). Which headers a source
//! includes is only known after compiling it, so the cache works in two steps, as ccache's
//! direct mode does:
//!
//! 1. `deps/<identity>` lists the files the last compile of this identity read;
//! 2. the *key* hashes the identity with the contents of each of those files, and
//!    `objects/<key>/` holds the outputs.
//!
//! A no-op rebuild therefore hashes a few small files per job and runs no compiler; editing a
//! header changes the key of exactly the jobs that include it. Everything is written into a
//! private temporary folder first and renamed into place, so a killed build leaves no partial
//! entry and two builds sharing a cache never see each other's half-written files.
//!
//! No hit is trusted. Each entry carries the digest of its files ([`contents`]), and a hit's
//! outputs must pass the checks the build makes of a compiled job's; an entry that fails
//! either is a miss with one warning, taken out and replaced by the job's fresh result.
//!
//! A [`Remote`] store, when given, is the second level: a local miss reads the same two
//! steps through from it (`deps/<identity>`, then `objects/<key>`, each a checked
//! [`entry`]), checks the outputs as a local hit's before storing them here, and a compiled
//! job's outputs are written back to it. Entries written with a [`Signer`] carry its
//! signature; a build given trusted keys reads only entries one of them signed.

mod contents;
mod entry;
pub mod remote;
pub mod storage;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::job::{outputs, parse_depfile};
use crate::staging::{Aside, clean_leftovers};

use remote::Fetched;
pub use remote::{Remote, RemoteOptions, RemoteReport, Signer};

/// Bumped whenever the layout or the key's ingredients change, so old entries are not reused
/// (3: local entries carry their digest; entries of 2 have none to check).
const CACHE_VERSION: &str = "hkpack-cache-3";

/// A cache folder, shared safely between threads and processes, and the remote store
/// behind it, if any.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    remote: Option<Remote>,
    /// File contents hashed in this build, by path: a header is hashed once, not per job.
    file_hashes: Mutex<HashMap<PathBuf, Option<String>>>,
    /// The local entries this build found bad, one sentence each, for the build's summary.
    warnings: Mutex<Vec<String>>,
}

/// Where a job's outputs were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Local,
    Remote,
}

#[derive(Debug, thiserror::Error)]
#[error("build cache {}: {detail}", path.display())]
pub struct CacheError {
    pub path: PathBuf,
    pub detail: String,
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> CacheError + '_ {
    move |e| CacheError {
        path: path.to_owned(),
        detail: e.to_string(),
    }
}

/// What a job's identity hashes to; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity(String);

impl Identity {
    /// The identity of a job described by `parts` (compiler version, target, full command...).
    pub fn new<S: AsRef<str>>(parts: impl IntoIterator<Item = S>) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(CACHE_VERSION);
        for part in parts {
            // Length-prefixed so that ["ab", "c"] and ["a", "bc"] differ.
            let part = part.as_ref();
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        Self(hk_format::manifest::hex(&hasher.finalize()))
    }
}

impl Cache {
    /// The local cache in `dir` alone.
    pub fn open(dir: &Path) -> Result<Self, CacheError> {
        Self::with_remote(dir, None)
    }

    /// The local cache in `dir`, with `remote` as its second level.
    pub fn with_remote(dir: &Path, remote: Option<Remote>) -> Result<Self, CacheError> {
        for sub in ["deps", "objects", "derived", "tmp"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io_error(dir))?;
        }
        clean_leftovers(&dir.join("tmp"), &[SCRATCH, WRITING]);
        Ok(Self {
            dir: dir.to_owned(),
            remote,
            file_hashes: Mutex::new(HashMap::new()),
            warnings: Mutex::new(Vec::new()),
        })
    }

    /// What `check` makes of the outputs of `identity` for the files as they are now, if a
    /// previous build stored them here or in the remote store, and which level had them.
    /// `base` is where the compiler ran (dependency paths are relative to it). `check` is
    /// what the build requires of any job's output folder (the right target, the declared
    /// kernels...): a hit it refuses is a miss, with a warning naming the entry and why.
    pub fn lookup<T>(
        &self,
        identity: &Identity,
        base: &Path,
        check: impl Fn(&Path) -> Result<T, String>,
    ) -> Option<(T, Level)> {
        if let Some(checked) = self.lookup_local(identity, base, &check) {
            return Some((checked, Level::Local));
        }
        let remote = self.remote.as_ref()?;
        self.fetch(remote, identity, base, &check)
            .map(|checked| (checked, Level::Remote))
    }

    /// A local hit whose files match their digest and pass `check`; a bad one is discarded.
    fn lookup_local<T>(
        &self,
        identity: &Identity,
        base: &Path,
        check: impl Fn(&Path) -> Result<T, String>,
    ) -> Option<T> {
        let dir = self.local_entry(identity, base)?;
        let checked = contents::check(&dir)
            .map_err(|mismatch| mismatch.to_string())
            .and_then(|()| check(&dir).map_err(|why| entry::Defect::FailsCheck(why).to_string()));
        match checked {
            Ok(checked) => Some(checked),
            Err(why) => {
                self.discard(&dir, &why);
                None
            }
        }
    }

    fn local_entry(&self, identity: &Identity, base: &Path) -> Option<PathBuf> {
        let deps = std::fs::read_to_string(self.dir.join("deps").join(&identity.0)).ok()?;
        let key = self.key(identity, base, deps.lines().map(PathBuf::from))?;
        let dir = self.dir.join("objects").join(key);
        dir.is_dir().then_some(dir)
    }

    /// Warns about a bad local entry and takes it out of `objects/`, so that the job's fresh
    /// outputs can take its place (storing them keeps a folder already there). It is renamed
    /// into a scratch folder first, so no build sees it half removed. If that fails, the bad
    /// entry stays, and the next build finds it, and says so, again.
    fn discard(&self, dir: &Path, why: &str) {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        self.warn(format!(
            "build cache {}: ignored entry `objects/{name}`: {why}; building the job again and replacing the entry",
            self.dir.display()
        ));
        if let Ok(aside) = self.scratch() {
            let _ = std::fs::rename(dir, aside.path().join("entry"));
        }
    }

    fn warn(&self, warning: String) {
        self.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(warning);
    }

    /// The local entries this build found bad and replaced, one sentence each.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the outputs of `identity` through from the remote store and, once they pass
    /// `check`, into the local cache: outputs that fail it never reach the local cache.
    fn fetch<T>(
        &self,
        remote: &Remote,
        identity: &Identity,
        base: &Path,
        check: impl Fn(&Path) -> Result<T, String>,
    ) -> Option<T> {
        let deps_path = remote_path(DEPS, &identity.0);
        let Fetched::Payload(deps) = remote.get(&deps_path) else {
            return None;
        };
        let Ok(deps) = String::from_utf8(deps) else {
            remote.report_defect(
                &deps_path,
                &entry::Defect::NotOutputs("a file list that is not UTF-8".into()),
            );
            return None;
        };
        // A file the store's list names but this checkout lacks: a miss, compiled here.
        let key = self.key(identity, base, deps.lines().map(PathBuf::from))?;
        let objects_path = remote_path(OBJECTS, &key);
        let Fetched::Payload(payload) = remote.get(&objects_path) else {
            return None;
        };
        let scratch = self.scratch().ok()?;
        match entry::unpack_outputs(&payload, scratch.path()) {
            Ok(()) => {}
            Err(entry::UnpackError::Defect(defect)) => {
                remote.report_defect(&objects_path, &defect);
                return None;
            }
            Err(entry::UnpackError::Io(_)) => return None,
        }
        let depfile = scratch.path().join(outputs::DEPS);
        if !depfile.is_file() {
            let defect = entry::Defect::NotOutputs(format!("no {}", outputs::DEPS));
            remote.report_defect(&objects_path, &defect);
            return None;
        }
        let checked = match check(scratch.path()) {
            Ok(checked) => checked,
            Err(why) => {
                remote.report_defect(&objects_path, &entry::Defect::FailsCheck(why));
                return None;
            }
        };
        self.store_locally(identity, base, scratch, &depfile)
            .ok()
            .map(|_| checked)
    }

    /// A fresh, private folder for a job's outputs, removed on drop unless stored.
    pub fn scratch(&self) -> Result<Aside, CacheError> {
        let tmp = self.dir.join("tmp");
        Aside::create(&tmp, SCRATCH).map_err(io_error(&tmp))
    }

    /// Moves a finished job's outputs into the cache, writes them back to the remote store
    /// (unless it is read-only or unavailable) and returns their local folder. The
    /// compiler's dependency file in `outputs` says which files went into them.
    pub fn store(
        &self,
        identity: &Identity,
        base: &Path,
        outputs: Aside,
        depfile: &Path,
    ) -> Result<PathBuf, CacheError> {
        let (dir, key) = self.store_locally(identity, base, outputs, depfile)?;
        if let Some(remote) = self.remote.as_ref().filter(|r| r.writable()) {
            self.write_back(remote, identity, &key, &dir);
        }
        Ok(dir)
    }

    /// The objects first, then the list that leads to them, so that a reader who finds the
    /// list finds the objects too.
    fn write_back(&self, remote: &Remote, identity: &Identity, key: &str, dir: &Path) {
        let Ok(payload) = entry::pack_outputs(dir) else {
            return;
        };
        let Ok(deps) = std::fs::read(self.dir.join("deps").join(&identity.0)) else {
            return;
        };
        if remote.put(&remote_path(OBJECTS, key), &payload)
            && remote.put(&remote_path(DEPS, &identity.0), &deps)
        {
            remote.count_written_back();
        }
    }

    /// What the remote store did in this build, and what went wrong with it, if there is one.
    pub fn remote_report(&self) -> Option<(RemoteReport, Vec<String>)> {
        self.remote.as_ref().map(|r| (r.report(), r.warnings()))
    }

    fn store_locally(
        &self,
        identity: &Identity,
        base: &Path,
        outputs: Aside,
        depfile: &Path,
    ) -> Result<(PathBuf, String), CacheError> {
        let text = std::fs::read_to_string(depfile).map_err(io_error(depfile))?;
        let deps = parse_depfile(&text);
        let key = self
            .key(identity, base, deps.iter().cloned())
            .ok_or_else(|| CacheError {
                path: base.to_owned(),
                detail: "a file the compiler read has disappeared".into(),
            })?;
        contents::write(outputs.path()).map_err(io_error(outputs.path()))?;
        let dest = self.dir.join("objects").join(&key);
        match std::fs::rename(outputs.path(), &dest) {
            Ok(()) => {}
            // Another build stored the same outputs first: identical by construction. Ours go
            // when `outputs` is dropped.
            Err(_) if dest.is_dir() => {}
            Err(e) => return Err(io_error(&dest)(e)),
        }
        self.write_atomically(
            &self.dir.join("deps").join(&identity.0),
            deps.iter()
                .map(|p| format!("{}\n", p.display()))
                .collect::<String>()
                .as_bytes(),
        )?;
        Ok((dest, key))
    }

    /// `make(input)`'s result, computed once per distinct `(what, input)` and then read back:
    /// for slow, deterministic steps after compiling, such as compressing a module bundle.
    /// Stored behind its SHA-256, checked on every read: a result that no longer matches is
    /// made again and replaced, with a warning.
    pub fn derived<E: From<CacheError>>(
        &self,
        what: &str,
        input: &[u8],
        make: impl FnOnce(&[u8]) -> Result<Vec<u8>, E>,
    ) -> Result<Vec<u8>, E> {
        let mut hasher = Sha256::new();
        hasher.update(CACHE_VERSION);
        hasher.update((what.len() as u64).to_le_bytes());
        hasher.update(what);
        hasher.update(input);
        let name = hk_format::manifest::hex(&hasher.finalize());
        let path = self.dir.join("derived").join(&name);
        if let Ok(stored) = std::fs::read(&path) {
            match unseal_derived(&stored) {
                Some(bytes) => return Ok(bytes.to_vec()),
                None => self.warn(format!(
                    "build cache {}: ignored entry `derived/{name}`: it does not match the SHA-256 it was stored with (corrupted); computing it again and replacing the entry",
                    self.dir.display()
                )),
            }
        }
        let bytes = make(input)?;
        self.write_atomically(&path, &[Sha256::digest(&bytes).as_slice(), &bytes].concat())?;
        Ok(bytes)
    }

    fn key(
        &self,
        identity: &Identity,
        base: &Path,
        deps: impl Iterator<Item = PathBuf>,
    ) -> Option<String> {
        let mut hasher = Sha256::new();
        hasher.update(&identity.0);
        for dep in deps {
            let hash = self.file_hash(&base.join(&dep))?;
            hasher.update(dep.to_string_lossy().as_bytes());
            hasher.update([0]);
            hasher.update(hash);
        }
        Some(hk_format::manifest::hex(&hasher.finalize()))
    }

    fn file_hash(&self, path: &Path) -> Option<String> {
        let mut memo = self.file_hashes.lock().unwrap_or_else(|e| e.into_inner());
        memo.entry(path.to_owned())
            .or_insert_with(|| {
                std::fs::read(path)
                    .ok()
                    .map(|bytes| hk_format::manifest::hex(&Sha256::digest(bytes)))
            })
            .clone()
    }

    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), CacheError> {
        let tmp = self.dir.join("tmp");
        let aside = Aside::create(&tmp, WRITING).map_err(io_error(&tmp))?;
        let written = aside.path().join("file");
        std::fs::write(&written, bytes).map_err(io_error(path))?;
        std::fs::rename(&written, path).map_err(io_error(path))
    }
}

/// The remote store's two kinds of entry, as in the local folder, under the layout's version.
const DEPS: &str = "deps";
const OBJECTS: &str = "objects";

fn remote_path(kind: &str, name: &str) -> String {
    format!("{CACHE_VERSION}/{kind}/{name}")
}

/// The bytes of a derived entry (its SHA-256, then the bytes) if they match their digest.
fn unseal_derived(stored: &[u8]) -> Option<&[u8]> {
    let (digest, bytes) = stored.split_at_checked(32)?;
    (Sha256::digest(bytes).as_slice() == digest).then_some(bytes)
}

/// The cache's folders for a job's outputs before they are stored, and for a file being
/// written: in `tmp/`, each locked by its build, so that the next build removes what a killed
/// one left (see [`crate::staging`]).
const SCRATCH: &str = "job-";
const WRITING: &str = "write-";

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(cache: &Cache, identity: &Identity, base: &Path, deps: &str) -> PathBuf {
        let outputs = cache.scratch().unwrap();
        std::fs::write(outputs.path().join("code.co"), b"object").unwrap();
        let depfile = outputs.path().join("deps.d");
        std::fs::write(&depfile, format!("code: {deps}\n")).unwrap();
        cache.store(identity, base, outputs, &depfile).unwrap()
    }

    /// A lookup whose check accepts any output folder, and returns it.
    fn found(cache: &Cache, identity: &Identity, base: &Path) -> Option<(PathBuf, Level)> {
        cache.lookup(identity, base, |dir| Ok(dir.to_owned()))
    }

    #[test]
    fn a_header_change_misses_and_an_unchanged_tree_hits() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("src");
        std::fs::create_dir(&base).unwrap();
        std::fs::write(base.join("k.hip"), "kernel").unwrap();
        std::fs::write(base.join("h.h"), "header v1").unwrap();
        let identity = Identity::new(["clang 22", "gfx942", "-O3"]);

        let cache = Cache::open(&root.path().join("cache")).unwrap();
        assert_eq!(found(&cache, &identity, &base), None);
        let dir = stored(&cache, &identity, &base, "k.hip h.h");
        assert_eq!(std::fs::read(dir.join("code.co")).unwrap(), b"object");

        // A new process (fresh memo) finds it; another identity does not.
        let cache = Cache::open(&root.path().join("cache")).unwrap();
        assert_eq!(found(&cache, &identity, &base), Some((dir, Level::Local)));
        assert_eq!(
            found(&cache, &Identity::new(["clang 22", "gfx90a"]), &base),
            None
        );

        std::fs::write(base.join("h.h"), "header v2").unwrap();
        let cache = Cache::open(&root.path().join("cache")).unwrap();
        assert_eq!(found(&cache, &identity, &base), None);
        assert!(
            std::fs::read_dir(root.path().join("cache/tmp"))
                .unwrap()
                .next()
                .is_none(),
            "no scratch folder is left behind"
        );
    }

    #[test]
    fn a_hit_that_fails_its_check_is_a_miss_with_one_warning_and_is_replaced() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("src");
        std::fs::create_dir(&base).unwrap();
        std::fs::write(base.join("k.hip"), "kernel").unwrap();
        let identity = Identity::new(["clang 22", "gfx942"]);
        let cache = Cache::open(&root.path().join("cache")).unwrap();
        let dir = stored(&cache, &identity, &base, "k.hip");

        let refused = cache.lookup(&identity, &base, |_| {
            Err::<(), _>("the code object is for gfx90a, not gfx942".to_owned())
        });
        assert_eq!(refused, None);
        let warnings = cache.warnings();
        let name = dir.file_name().unwrap().to_string_lossy();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains(&format!("ignored entry `objects/{name}`"))
                && warnings[0].contains("the code object is for gfx90a")
                && warnings[0].contains("replacing the entry"),
            "{}",
            warnings[0]
        );
        assert!(!dir.exists(), "the bad entry is taken out");

        assert_eq!(stored(&cache, &identity, &base, "k.hip"), dir);
        assert_eq!(found(&cache, &identity, &base), Some((dir, Level::Local)));
        assert_eq!(cache.warnings().len(), 1);
    }

    #[test]
    fn a_derived_result_that_no_longer_matches_its_digest_is_made_again() {
        let root = tempfile::tempdir().unwrap();
        let cache = Cache::open(&root.path().join("cache")).unwrap();
        let made = std::cell::Cell::new(0);
        let derive = || {
            cache.derived("double", b"ab", |input| {
                made.set(made.get() + 1);
                Ok::<_, CacheError>(input.repeat(2))
            })
        };
        assert_eq!(derive().unwrap(), b"abab");
        assert_eq!((derive().unwrap(), made.get()), (b"abab".to_vec(), 1));

        let entries: Vec<_> = std::fs::read_dir(root.path().join("cache/derived"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        let mut bytes = std::fs::read(&entries[0]).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&entries[0], bytes).unwrap();

        assert_eq!((derive().unwrap(), made.get()), (b"abab".to_vec(), 2));
        let warnings = cache.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("corrupted"), "{}", warnings[0]);
        assert_eq!((derive().unwrap(), made.get()), (b"abab".to_vec(), 2));
    }

    #[test]
    fn opening_removes_what_killed_builds_left_and_keeps_what_running_ones_hold() {
        let root = tempfile::tempdir().unwrap();
        let tmp = root.path().join("cache/tmp");
        std::fs::create_dir_all(tmp.join("job-killed/outputs")).unwrap();
        std::fs::write(tmp.join("job-killed.lock"), "").unwrap();
        std::fs::create_dir(tmp.join("write-killed")).unwrap();
        std::fs::write(tmp.join("write-killed.lock"), "").unwrap();
        let running = Cache::open(&root.path().join("cache"))
            .unwrap()
            .scratch()
            .unwrap();

        Cache::open(&root.path().join("cache")).unwrap();
        let mut left: Vec<_> = std::fs::read_dir(&tmp)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        left.sort();
        let mut lock = running.path().as_os_str().to_owned();
        lock.push(".lock");
        assert_eq!(left, [running.path().to_owned(), PathBuf::from(lock)]);
        drop(running);
        assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
    }

    /// Two jobs written to a shared folder by a build holding `key`; then one of them written
    /// again, unsigned, by a build holding none. A build that trusts `key` reads the signed one,
    /// refuses the other with one warning for the build, and without trusted keys reads both.
    #[test]
    fn a_trusting_cache_reads_only_what_a_trusted_key_signed() {
        use hk_format::signing::SecretKey;

        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("src");
        std::fs::create_dir(&base).unwrap();
        std::fs::write(base.join("k.hip"), "kernel").unwrap();
        let key = Signer::new(SecretKey::from_seed([3; 32]));
        let machine = |name: &str, signer: Option<&Signer>, trusted: &[_]| {
            let remote = Remote::open(&RemoteOptions {
                url: format!("file://{}", root.path().join("shared").display()),
                read_only: false,
                timeout: RemoteOptions::DEFAULT_TIMEOUT,
                s3_credentials: None,
                signer: signer.cloned(),
                trusted_keys: trusted.to_vec(),
            })
            .unwrap();
            Cache::with_remote(&root.path().join(name), Some(remote)).unwrap()
        };
        let [signed, resealed] =
            [["clang 22", "gfx942"], ["clang 22", "gfx90a"]].map(Identity::new);
        let writer = machine("writer", Some(&key), &[]);
        stored(&writer, &signed, &base, "k.hip");
        stored(&writer, &resealed, &base, "k.hip");
        stored(&machine("keyless", None, &[]), &resealed, &base, "k.hip");

        let trusting = machine("trusting", None, &[key.public_key()]);
        assert!(matches!(
            found(&trusting, &signed, &base),
            Some((_, Level::Remote))
        ));
        assert_eq!(found(&trusting, &resealed, &base), None);
        let (report, warnings) = trusting.remote_report().unwrap();
        assert_eq!(report.untrusted, 1);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("refused 1 entry that no trusted key signed (1 unsigned"));

        let open = machine("open", None, &[]);
        for identity in [&signed, &resealed] {
            assert!(matches!(
                found(&open, identity, &base),
                Some((_, Level::Remote))
            ));
        }
        assert_eq!(open.remote_report().unwrap().1, Vec::<String>::new());
    }

    #[test]
    fn identities_do_not_collide_by_concatenation() {
        assert_ne!(Identity::new(["ab", "c"]), Identity::new(["a", "bc"]));
    }
}
