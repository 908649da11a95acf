//! The remote level of the build cache: a store shared by machines, read on a local miss and
//! written after a compile.
//!
//! Nothing that comes back is trusted: every value is a sealed [`entry`](super::entry),
//! checked against the name it was asked for and its digest; one that fails is reported once,
//! rebuilt and (unless read-only) overwritten. Given a [`Signer`], every entry written is
//! signed; given trusted keys, an entry none of them signed is a miss too, and the build says
//! once how many it refused and why (a store of unsigned entries would otherwise bury the
//! build's output in one warning per entry). Nothing here fails a build either: the first
//! operation that errs or outlasts the timeout makes the store *unavailable* for the rest of
//! the build, with one warning, and every job then compiles locally.
//!
//! OpenDAL is asynchronous; a small Tokio runtime owned by [`Remote`] runs its operations and
//! the build's worker threads wait on them, so no `async` reaches the rest of hkpack.
//!
//! ```
//! use hkpack::cache::remote::{Fetched, Remote, RemoteOptions};
//!
//! let shared = tempfile::tempdir()?;
//! let remote = Remote::open(&RemoteOptions {
//!     url: format!("file://{}", shared.path().display()),
//!     read_only: false,
//!     timeout: RemoteOptions::DEFAULT_TIMEOUT,
//!     s3_credentials: None,
//!     signer: None,
//!     trusted_keys: Vec::new(),
//! })?;
//! assert!(remote.put("objects/1234", b"outputs"));
//! assert!(matches!(remote.get("objects/1234"), Fetched::Payload(p) if p == b"outputs"));
//! // Bytes stored under another name are refused, with a warning.
//! std::fs::copy(shared.path().join("objects/1234"), shared.path().join("objects/5678"))?;
//! assert!(matches!(remote.get("objects/5678"), Fetched::Defective));
//! assert_eq!(remote.warnings().len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hk_format::signing::{PublicKey, SecretKey};
use opendal::{ErrorKind, Operator};

use super::entry::{self, Defect};
use super::storage::{self, S3Credentials, StorageError};

/// How to reach the remote cache.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// `file:///path`, `redis://host:port/db`, `webdav+http://host:port/path`,
    /// `s3://bucket/prefix?endpoint=URL&region=REGION`.
    pub url: String,
    /// Read only, never write (for builds whose results must not be shared).
    pub read_only: bool,
    /// The longest one read or write may take before the store counts as unavailable.
    pub timeout: Duration,
    /// S3 keys; `None` for the AWS defaults (see [`S3Credentials`]).
    pub s3_credentials: Option<S3Credentials>,
    /// Signs every entry written; `None` writes them unsigned.
    pub signer: Option<Signer>,
    /// When not empty, only entries signed by one of these keys are used; any other is a
    /// miss. Empty: every entry whose seal holds is used, signed or not.
    pub trusted_keys: Vec<PublicKey>,
}

/// The secret key that signs remote entries (one of `hkpack keygen`'s, as bundles use);
/// shared, not copied, by the options that hold it, and shown as its public key alone.
#[derive(Clone)]
pub struct Signer(Arc<SecretKey>);

impl Signer {
    pub fn new(key: SecretKey) -> Self {
        Self(Arc::new(key))
    }

    pub fn public_key(&self) -> PublicKey {
        self.0.public_key()
    }
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({})", self.public_key())
    }
}

impl RemoteOptions {
    /// The default bound on one operation: long enough for a few MiB over a slow link, short
    /// enough that a dead server costs one wait.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
}

/// What the remote level did in one build.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RemoteReport {
    /// The store's URL, without any password.
    pub url: String,
    pub read_only: bool,
    /// Jobs whose outputs were written to the store.
    pub written_back: usize,
    /// Bytes read from and written to the store.
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Whether the store stopped answering during the build.
    pub unavailable: bool,
    /// Entries whose seal held but that no trusted key signed (always 0 without trusted keys).
    pub untrusted: usize,
}

/// An open remote store.
pub struct Remote {
    operator: Operator,
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    url: String,
    read_only: bool,
    timeout: Duration,
    signer: Option<Signer>,
    trusted_keys: Vec<PublicKey>,
    unavailable: AtomicBool,
    written_back: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    /// Said once each, for the build's summary.
    warnings: Mutex<Vec<String>>,
    /// The entries refused for their signature, counted by why: said in one warning.
    untrusted: Mutex<BTreeMap<String, usize>>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// What a read found.
pub enum Fetched {
    /// The entry's payload, checked.
    Payload(Vec<u8>),
    /// No such entry, or the store is unavailable.
    Missing,
    /// An entry that failed its checks or no trusted key signed (reported): rebuild and
    /// overwrite it.
    Defective,
}

impl Remote {
    /// Sets up the store `options.url` names. Contacts nothing yet: a server that is down is
    /// found out, and reported once, by the first read.
    pub fn open(options: &RemoteOptions) -> Result<Self, StorageError> {
        let (operator, url) = storage::open(&options.url, options.s3_credentials.as_ref())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hkpack-remote")
            .enable_all()
            .build()
            .map_err(|e| StorageError::Service {
                url: url.clone(),
                detail: format!("cannot start its I/O threads: {e}"),
            })?;
        Ok(Self {
            operator,
            runtime: Some(runtime),
            url,
            read_only: options.read_only,
            timeout: options.timeout,
            signer: options.signer.clone(),
            trusted_keys: options.trusted_keys.clone(),
            unavailable: AtomicBool::new(false),
            written_back: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            warnings: Mutex::new(Vec::new()),
            untrusted: Mutex::new(BTreeMap::new()),
        })
    }

    /// The entry at `path`, opened and checked, and signed by a trusted key if any are.
    pub fn get(&self, path: &str) -> Fetched {
        if self.unavailable.load(Ordering::Relaxed) {
            return Fetched::Missing;
        }
        let bytes = match self.run(self.operator.read(path)) {
            Ok(buffer) => buffer.to_vec(),
            Err(Failure::Store(e)) if e.kind() == ErrorKind::NotFound => return Fetched::Missing,
            Err(failure) => {
                self.give_up(&failure);
                return Fetched::Missing;
            }
        };
        self.bytes_read
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let opened = match entry::open(path, &bytes) {
            Ok(opened) => opened,
            Err(defect) => {
                self.report_defect(path, &defect);
                return Fetched::Defective;
            }
        };
        if self.trusted_keys.is_empty() {
            return Fetched::Payload(opened.payload.to_vec());
        }
        match opened.check_signature(&self.trusted_keys) {
            Ok(()) => Fetched::Payload(opened.payload.to_vec()),
            Err(why) => {
                *self
                    .untrusted
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(why.to_string())
                    .or_default() += 1;
                Fetched::Defective
            }
        }
    }

    /// Stores `payload` sealed as `path`, and signed if there is a signer, unless read-only or
    /// unavailable. Returns whether it was written.
    pub fn put(&self, path: &str, payload: &[u8]) -> bool {
        if self.read_only || self.unavailable.load(Ordering::Relaxed) {
            return false;
        }
        let sealed = entry::seal(path, payload, self.signer.as_ref().map(|s| &*s.0));
        let length = sealed.len() as u64;
        match self.run(self.operator.write(path, sealed)) {
            Ok(_) => {
                self.bytes_written.fetch_add(length, Ordering::Relaxed);
                true
            }
            Err(failure) => {
                self.give_up(&failure);
                false
            }
        }
    }

    /// Counts a job whose outputs went to the store.
    pub fn count_written_back(&self) {
        self.written_back.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether results may be written (not read-only, not unavailable).
    pub fn writable(&self) -> bool {
        !self.read_only && !self.unavailable.load(Ordering::Relaxed)
    }

    pub fn report(&self) -> RemoteReport {
        RemoteReport {
            url: self.url.clone(),
            read_only: self.read_only,
            written_back: self.written_back.load(Ordering::Relaxed) as usize,
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            unavailable: self.unavailable.load(Ordering::Relaxed),
            untrusted: self.untrusted_counts().values().sum(),
        }
    }

    /// What went wrong with the store in this build, once each, and the entries refused for
    /// their signature in one sentence.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = self
            .warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        warnings.extend(self.untrusted_warning());
        warnings
    }

    fn untrusted_counts(&self) -> BTreeMap<String, usize> {
        self.untrusted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `remote cache …: refused 3 entries no trusted key signed (2 unsigned, 1 signed by …);
    /// …`, or nothing if none was refused.
    fn untrusted_warning(&self) -> Option<String> {
        let counts = self.untrusted_counts();
        let total: usize = counts.values().sum();
        if total == 0 {
            return None;
        }
        let why: Vec<String> = counts
            .iter()
            .map(|(why, count)| format!("{count} {why}"))
            .collect();
        let trusted: Vec<String> = self.trusted_keys.iter().map(ToString::to_string).collect();
        let (entries, jobs) = if total == 1 {
            ("entry", "its job was")
        } else {
            ("entries", "their jobs were")
        };
        let then = match &self.signer {
            _ if !self.writable() => {
                "compiled here; the store is left as it is (this build does not write it)".into()
            }
            Some(signer) => format!(
                "compiled here and written back signed by {}",
                signer.public_key()
            ),
            None => "compiled here and written back unsigned (no --cache-sign-key)".into(),
        };
        Some(format!(
            "remote cache {}: refused {total} {entries} that no trusted key signed ({}; trusted: {}); {jobs} {then}; an entry is used once a build given --cache-sign-key with a trusted key writes it",
            self.url,
            why.join("; "),
            trusted.join(", "),
        ))
    }

    fn run<T>(&self, operation: impl Future<Output = opendal::Result<T>>) -> Result<T, Failure> {
        let runtime = self
            .runtime
            .as_ref()
            .expect("the runtime lives until the remote is dropped");
        runtime.block_on(async {
            match tokio::time::timeout(self.timeout, operation).await {
                Ok(result) => result.map_err(Failure::Store),
                Err(_) => Err(Failure::TimedOut(self.timeout)),
            }
        })
    }

    /// Marks the store unavailable; the first thread to do so warns.
    fn give_up(&self, failure: &Failure) {
        if !self.unavailable.swap(true, Ordering::Relaxed) {
            self.warn(format!(
                "remote cache {} is unavailable ({failure}); this build goes on without it, compiling what the local cache lacks",
                self.url
            ));
        }
    }

    pub(super) fn report_defect(&self, path: &str, defect: &Defect) {
        let then = if self.read_only {
            "rebuilding it locally (read-only: the entry is left as it is)"
        } else {
            "rebuilding it locally and overwriting the entry"
        };
        self.warn(format!(
            "remote cache {}: ignored entry `{path}`: {defect}; {then}",
            self.url
        ));
    }

    fn warn(&self, warning: String) {
        self.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(warning);
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        // A request still stuck on a dead server must not hold the build's exit.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Why an operation on the store did not complete.
enum Failure {
    Store(opendal::Error),
    TimedOut(Duration),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(e) => write!(f, "{e}"),
            Self::TimedOut(limit) => write!(f, "no answer within {} s", limit.as_secs_f64()),
        }
    }
}
