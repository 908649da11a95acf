//! Where a bundle comes from: hkpack's version and the git revision of the sources, with a flag
//! for uncommitted changes. Recorded in the bundle's manifest (and so under its digest and any
//! signature), without timestamps, so that the same sources build the same bytes.

use std::path::Path;
use std::process::Command;

use hk_format::manifest::Provenance;

/// The provenance of a build from the manifests folder `manifests`; without git, or outside a
/// repository, the revision is unknown and the sources count as clean.
pub fn of(manifests: &Path) -> Provenance {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(manifests)
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let source_revision = git(&["rev-parse", "--verify", "HEAD"]).filter(|rev| !rev.is_empty());
    let source_dirty = source_revision.is_some()
        && git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Provenance {
        hkpack: env!("CARGO_PKG_VERSION").to_owned(),
        source_revision,
        source_dirty,
    }
}
