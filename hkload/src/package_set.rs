//! Per-target packages found on a search path: what lets a fleet install only the code its
//! GPUs run. The packages' files are [`hk_format::package_set`]'s, re-exported here; finding
//! them in folders is the runtime's.

use std::path::PathBuf;

pub use hk_format::package_set::*;

use crate::target::TargetId;

/// The environment variable holding the search path: folders, separated as in `PATH`.
pub const SEARCH_PATH_VAR: &str = "HKLOAD_PATH";

/// The search path in [`SEARCH_PATH_VAR`], empty when it is not set.
pub fn search_path_from_env() -> Vec<PathBuf> {
    std::env::var_os(SEARCH_PATH_VAR)
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default()
}

/// Where the bundle `bundle_name`'s index lies on `dirs`: the first folder holding the full
/// bundle or its index package, and whether it is the full bundle.
pub(crate) fn find_index(bundle_name: &str, dirs: &[PathBuf]) -> Option<(PathBuf, bool)> {
    dirs.iter().find_map(|dir| {
        let full = dir.join(bundle_name);
        if full.join(hk_format::index::INDEX_FILE).is_file() {
            return Some((full, true));
        }
        let index = dir.join(index_package_name(bundle_name));
        index
            .join(hk_format::index::INDEX_FILE)
            .is_file()
            .then_some((index, false))
    })
}

/// The first folder of `dirs` holding `target`'s package of the bundle `bundle_name`.
pub(crate) fn find_target_package(
    bundle_name: &str,
    target: &TargetId,
    dirs: &[PathBuf],
) -> Option<PathBuf> {
    let name = target_package_name(bundle_name, target);
    dirs.iter()
        .map(|dir| dir.join(&name))
        .find(|package| package.join(TARGET_FILE).is_file())
}

/// A target package found on the search path, its description read.
#[derive(Debug, Clone)]
pub(crate) struct FoundPackage {
    pub dir: PathBuf,
    pub target: TargetId,
}
