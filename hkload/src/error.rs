//! The crate's error type: one enum whose variants carry what a user needs to act.

use std::path::PathBuf;

use crate::driver::DriverError;
use crate::manifest::ManifestError;
use crate::offload::FormatError;
use crate::target::TargetId;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("cannot read {}: {detail}", path.display())]
    Io { path: PathBuf, detail: String },

    #[error("bundle signature {}: {source}", path.display())]
    Signature {
        path: PathBuf,
        #[source]
        source: crate::signing::SignatureError,
    },

    #[error(
        "{} has SHA-256 {found}, but the bundle is pinned to {expected}: it is another build of the bundle, or was changed",
        path.display()
    )]
    Pinned {
        path: PathBuf,
        /// Both digests in hex (as digests they would make every error twice as large).
        expected: String,
        found: String,
    },

    #[error(
        "no bundle {name} on the search path ({}): no folder holds {name}/ or {name}-index/; install the bundle or its index package, or add its folder to {}",
        dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
        crate::package_set::SEARCH_PATH_VAR
    )]
    NotOnSearchPath { name: String, dirs: Vec<PathBuf> },

    #[error(
        "package {} is {package_is}, but the index at {} is {index_is}: every package of a set must be split from the same build; install the matching package",
        package.display(),
        index.display()
    )]
    ForeignPackage {
        package: PathBuf,
        package_is: String,
        index: PathBuf,
        index_is: String,
    },

    #[error("bundle manifest {}: {source}", path.display())]
    Manifest {
        path: PathBuf,
        #[source]
        source: ManifestError,
    },

    #[error("module `{module}` ({}): {source}", path.display())]
    Format {
        module: String,
        path: PathBuf,
        #[source]
        source: FormatError,
    },

    #[error(
        "{what} does not match the bundle manifest: {detail}; the bundle was modified or damaged after it was built, rebuild it with `hkpack build`"
    )]
    Mismatch { what: String, detail: String },

    #[error(
        "no code object in module `{module}` can run on {device} (the bundle has {}):\n{explanation}",
        available.join(", ")
    )]
    NoCodeObject {
        module: String,
        device: TargetId,
        available: Vec<String>,
        explanation: String,
    },

    #[error("kernel `{kernel}` (module `{module}`) is not built for {target}, by design: {reason}")]
    NotBuilt {
        kernel: String,
        module: String,
        /// The build target that would have served the device.
        target: TargetId,
        /// The module manifest's reason.
        reason: String,
    },

    #[error("the bundle has no kernel `{name}`{}", suggest(known))]
    UnknownKernel { name: String, known: Vec<String> },

    #[error(transparent)]
    Launch(#[from] LaunchError),

    #[error(transparent)]
    Driver(#[from] DriverError),

    #[error("device {ordinal} does not exist: the {api} driver sees {count} device(s)")]
    NoSuchDevice {
        api: &'static str,
        ordinal: usize,
        count: usize,
    },
}

fn suggest(known: &[String]) -> String {
    match known.len() {
        0 => String::new(),
        n if n <= 12 => format!("; it has {}", known.join(", ")),
        n => format!("; it has {n} kernels, e.g. {}", known[..8].join(", ")),
    }
}

/// A launch refused before any driver call, naming the kernel and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error("kernel `{kernel}` takes {expected} arguments ({signature}), got {found}")]
    ArgCount {
        kernel: String,
        expected: usize,
        found: usize,
        signature: String,
    },

    #[error("kernel `{kernel}` argument {index} (`{param}`) expects {expected}, got {found}")]
    ArgType {
        kernel: String,
        index: usize,
        param: String,
        expected: String,
        /// What was given, and for an FP8 buffer of the other encoding family why that is
        /// worse than it looks.
        found: String,
    },

    #[error(
        "kernel `{kernel}` argument {index} (`{param}`) is a buffer on device {found}, but the kernel runs on device {expected}"
    )]
    ArgDevice {
        kernel: String,
        index: usize,
        param: String,
        expected: usize,
        found: usize,
    },

    #[error(
        "kernel `{kernel}` argument {index} (`{param}`) is memory of another {expected} driver instance than the kernel's"
    )]
    ArgDriver {
        kernel: String,
        index: usize,
        param: String,
        expected: &'static str,
    },

    #[error("kernel `{kernel}`: {detail}")]
    Dims { kernel: String, detail: String },

    #[error("kernel `{kernel}`: {message} (`{condition}` is false with {values})")]
    Requirement {
        kernel: String,
        message: String,
        condition: String,
        values: String,
    },

    #[error(
        "kernel `{kernel}` argument {index} (`{param}`) holds {given} elements, but the kernel may touch {needed} (`{extent}`)"
    )]
    Extent {
        kernel: String,
        index: usize,
        param: String,
        needed: u64,
        given: usize,
        extent: String,
    },

    #[error("kernel `{kernel}`: {detail}")]
    Contract { kernel: String, detail: String },

    #[error(
        "kernel `{kernel}` has no launch contract (its manifest declares none): launch it with explicit dimensions through `Kernel::launch`"
    )]
    NoContract { kernel: String },
}
