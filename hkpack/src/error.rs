//! The crate's error type: every way a build or a command can fail, as sentences a user can
//! act on.

use crate::cache::CacheError;
use crate::cache::storage::StorageError;
use crate::manifest::ManifestError;
use crate::package::PackageError;
use crate::toolchain::ToolchainError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Toolchain(#[from] ToolchainError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    RemoteCache(#[from] StorageError),
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error(transparent)]
    Bundle(#[from] hkload::Error),
    #[error(transparent)]
    Targets(#[from] hk_format::target::CompositionError),
    #[error("{} of the build's jobs failed:\n{}", .0.len(), list(.0))]
    Jobs(Vec<JobError>),
    #[error("key file {}: {detail}", path.display())]
    Key {
        path: std::path::PathBuf,
        detail: String,
    },
    #[error("cannot extract from {}: {detail}", bundle.display())]
    Extract {
        bundle: std::path::PathBuf,
        detail: String,
    },
}

/// One failed job: its name (`rmsnorm for gfx942`) and what went wrong, compiler
/// diagnostics included.
#[derive(Debug, Clone)]
pub struct JobError {
    pub job: String,
    pub detail: String,
}

fn list(failures: &[JobError]) -> String {
    failures
        .iter()
        .map(|f| {
            let indented: Vec<String> = f.detail.lines().map(|l| format!("    {l}")).collect();
            format!("  {}:\n{}", f.job, indented.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
