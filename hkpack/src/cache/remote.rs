//! The remote level of the build cache: a store shared by machines, read on a local miss and
//! written after a compile.
//!
//! Nothing that comes back is trusted: every value is a sealed [`entry`](super::entry),
//! checked against the name it was asked for and its digest; one that fails is reported once,
//! rebuilt and (unless read-only) overwritten. Nothing here fails a build either: the first
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
//! })?;
//! assert!(remote.put("objects/1234", b"outputs"));
//! assert!(matches!(remote.get("objects/1234"), Fetched::Payload(p) if p == b"outputs"));
//! // Bytes stored under another name are refused, with a warning.
//! std::fs::copy(shared.path().join("objects/1234"), shared.path().join("objects/5678"))?;
//! assert!(matches!(remote.get("objects/5678"), Fetched::Defective));
//! assert_eq!(remote.warnings().len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

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
}

/// An open remote store.
pub struct Remote {
    operator: Operator,
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    url: String,
    read_only: bool,
    timeout: Duration,
    unavailable: AtomicBool,
    written_back: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    /// Said once each, for the build's summary.
    warnings: Mutex<Vec<String>>,
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
    /// An entry that failed its checks (already warned about): rebuild and overwrite it.
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
            unavailable: AtomicBool::new(false),
            written_back: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            warnings: Mutex::new(Vec::new()),
        })
    }

    /// The entry at `path`, opened and checked.
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
        match entry::open(path, &bytes) {
            Ok(payload) => Fetched::Payload(payload.to_vec()),
            Err(defect) => {
                self.report_defect(path, &defect);
                Fetched::Defective
            }
        }
    }

    /// Stores `payload` sealed as `path`, unless read-only or unavailable. Returns whether it
    /// was written.
    pub fn put(&self, path: &str, payload: &[u8]) -> bool {
        if self.read_only || self.unavailable.load(Ordering::Relaxed) {
            return false;
        }
        let sealed = entry::seal(path, payload);
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
        }
    }

    /// What went wrong with the store in this build, once each.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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
