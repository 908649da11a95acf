//! A bundle as hkload uses it: opened and checked against its manifest, the code object for a
//! device chosen per module (and explained on request), modules loaded lazily once per device,
//! kernels looked up by name.
//!
//! hkload reads a bundle through its index (`bundle.msgpack`) alone, and refuses a folder
//! without one. The index's digest covers every record hkload acts on, and each record the
//! digests of the bytes it names; `bundle.toml` and the ABI files are the same records for
//! people and other tools, with no digest over them, so a bundle read from them could be
//! edited (a cubin's target renamed, a digest replaced) with nothing to tell.
//!
//! Opening (with its search path, pin and signature checks), explaining the choice, and a
//! bundle bound to a device with its kernels have a file each: `open`, `explain`, `loaded`.
//! The [`Bundle`] itself, where its files come from, and the lookups they all share are here.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};
use crate::file::FileBytes;
use crate::index::lookup::{KernelAt, Module, Table};
use crate::index::{INDEX_FILE, Index};
use crate::manifest::{BundleManifest, KernelRecord, ManifestError, NotBuilt, Sha256Digest};
use crate::package_set::{self, FoundPackage};
use crate::select::choose;
use crate::target::{EntryId, TargetId};

mod explain;
mod loaded;
mod open;

pub use explain::{Explanation, MissingPackage, ModuleChoice};
pub use loaded::{Kernel, LoadedBundle};
pub use open::OpenOptions;

/// An opened bundle. Cheap to clone; share it between threads freely.
#[derive(Clone)]
pub struct Bundle {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where the bundle came from, for messages: its folder, or `<embedded>`.
    origin: PathBuf,
    source: Source,
    /// The index: its lookup table read in place, the manifest and every kernel's record
    /// decoded on first use.
    index: Index,
    modules: Vec<ModuleFile>,
    options: OpenOptions,
}

/// Where the bundle's files are read from, when they are needed.
enum Source {
    /// The bundle folder, every module file whole.
    Dir,
    /// An index package (the origin) and the target packages found beside it on a search path
    /// ([`crate::package_set`]): each code image is read from its target's package.
    Packages(Vec<FoundPackage>),
    /// The files by name. The names are `'static`, as `include_bytes!`'s bytes are, so that
    /// opening copies none. Copying the repo bundle's 18 names into strings made an embedded
    /// open with cold caches take 9.7 µs on the development machine, against 8.2 to 9.2 µs
    /// without (medians of 800, in two and three runs).
    Embedded(Vec<(&'static str, &'static [u8])>),
}

/// A module file, mapped on first use: per module, and for a split bundle per package too.
struct ModuleFile {
    bytes: OnceLock<Result<FileBytes, Error>>,
}

impl std::fmt::Debug for Bundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, version) = self.table().package();
        write!(
            f,
            "Bundle({name} {version} at {})",
            self.inner.origin.display()
        )
    }
}

impl Bundle {
    /// The SHA-256 of the index's contents (computed on first call, so a forged recorded value
    /// is never reported; see [`Index::digest`]): what identifies this build of the bundle,
    /// and what its split packages record.
    pub fn index_digest(&self) -> Sha256Digest {
        self.inner.index.digest()
    }

    /// For a bundle opened from packages, the package folder holding code image `entry`, or
    /// `None` when no package of its target was found; for a bundle folder, the folder itself
    /// (every entry is there); for an embedded bundle, `<embedded>`.
    pub fn package_of(&self, entry: &EntryId) -> Option<&Path> {
        match &self.inner.source {
            Source::Dir | Source::Embedded(_) => Some(&self.inner.origin),
            Source::Packages(found) => found
                .iter()
                .find(|p| p.target == entry.target())
                .map(|p| p.dir.as_path()),
        }
    }

    /// The entries of `module` whose code is at hand: all of them, but for a bundle opened from
    /// packages, those whose target's package was found.
    fn present_entries(&self, module: &Module<'_>) -> Vec<EntryId> {
        let mut ids = module.entry_ids();
        if let Source::Packages(found) = &self.inner.source {
            ids.retain(|id| found.iter().any(|p| p.target == id.target()));
        }
        ids
    }

    /// For a bundle opened from packages, the package that would serve `device` better than
    /// those present (the one holding what a whole bundle would choose), if it is missing.
    fn missing_package(&self, module: &Module<'_>, device: &TargetId) -> Option<MissingPackage> {
        if !matches!(self.inner.source, Source::Packages(_)) {
            return None;
        }
        let ids = module.entry_ids();
        let (best, _) = choose(device, &ids)?;
        let best = ids[best];
        if self.package_of(&best).is_some() {
            return None;
        }
        let (name, version) = self.table().package();
        Some(MissingPackage {
            target: best.target(),
            name: package_set::target_package_name(&format!("{name}-{version}"), &best.target()),
        })
    }

    /// The bundle's manifest: decoded from the index on first call (opening reads only the
    /// index's lookup table), and checked then against that table.
    pub fn manifest(&self) -> Result<&BundleManifest> {
        let inner = &*self.inner;
        inner.index.manifest().map_err(index_error(&inner.origin))
    }

    /// What opening, choosing and loading read: each module's file and code images, each
    /// kernel's name.
    pub fn table(&self) -> &Table {
        self.inner.index.table()
    }

    /// Kernel `symbol`'s signature and per-target ABI, reading its module's ABI on first use.
    pub fn kernel_record(&self, symbol: &str) -> Result<&KernelRecord> {
        self.kernel_location(symbol).map(|(_, record)| record)
    }

    /// The index of the module holding kernel `symbol`, and the kernel's record.
    fn kernel_location(&self, symbol: &str) -> Result<(usize, &KernelRecord)> {
        let table = self.table();
        let at = table
            .find_kernel(symbol)
            .ok_or_else(|| Error::UnknownKernel {
                name: symbol.to_owned(),
                known: table.kernel_symbols().map(str::to_owned).collect(),
            })?;
        Ok((at.module, self.record_at(at)?))
    }

    /// Every kernel's record, modules in manifest order (decodes or reads every one).
    pub fn kernel_records(&self) -> Result<Vec<&KernelRecord>> {
        self.table()
            .kernels()
            .map(|at| self.record_at(at))
            .collect()
    }

    /// The record of the kernel at `at`, decoded from the index and checked on first use.
    fn record_at(&self, at: KernelAt) -> Result<&KernelRecord> {
        let inner = &*self.inner;
        inner
            .index
            .kernel_record(at.row)
            .map_err(index_error(&inner.origin))
    }

    /// The target module `index` skips on purpose that would have served `device`, if any.
    /// It is asked only for a module with no code for the device, and the lookup table
    /// answers it.
    fn not_built_for(&self, index: usize, device: &TargetId) -> Option<NotBuilt> {
        serving(device, &self.table().not_built(index)).cloned()
    }
}

/// Of the targets a module is not built for, the one that would have served `device` (the one
/// whose code the device would choose, were it built), if any.
fn serving<'a>(device: &TargetId, not_built: &'a [NotBuilt]) -> Option<&'a NotBuilt> {
    let candidates: Vec<(EntryId, &NotBuilt)> = not_built
        .iter()
        .flat_map(|skipped| {
            skipped
                .target
                .entry_ids()
                .into_iter()
                .map(move |id| (id, skipped))
        })
        .collect();
    let ids: Vec<EntryId> = candidates.iter().map(|(id, _)| *id).collect();
    choose(device, &ids).map(|(chosen, _)| candidates[chosen].1)
}

impl Source {
    /// The bytes of the bundle file `name` (at `path` when the bundle is a folder); an
    /// embedded file that is not there reads as `NotFound`, as a missing file does.
    ///
    /// These are the small files (the index, TOML files), read whole: opening a bundle measured
    /// cheaper reading its 25 KB index than mapping it, whose header, lookup table and kernel
    /// records then fault in page by page (hot: 6.9 against 8.6 µs on the development machine,
    /// 3.2 against 4.7 µs on the H100 machine).
    fn read(&self, path: &Path, name: &str) -> std::io::Result<FileBytes> {
        match self {
            Self::Dir | Self::Packages(_) => std::fs::read(path).map(FileBytes::from),
            Self::Embedded(files) => embedded(files, name).map(FileBytes::from),
        }
    }
}

impl Source {
    /// How many copies of each module file there can be: one, or one per target package.
    fn file_sets(&self) -> usize {
        match self {
            Self::Dir | Self::Embedded(_) => 1,
            Self::Packages(found) => found.len(),
        }
    }
}

fn embedded(files: &[(&str, &'static [u8])], name: &str) -> std::io::Result<&'static [u8]> {
    files
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("`{name}` was not among the embedded files"),
            )
        })
}

/// What a damaged index in the bundle folder `origin` is reported as.
fn index_error(origin: &Path) -> impl FnOnce(ManifestError) -> Error + '_ {
    move |source| Error::Manifest {
        path: origin.join(INDEX_FILE),
        source,
    }
}
