//! A bundle as hkload uses it: opened and checked against its manifest, the code object for a
//! device chosen per module (and explained on request), modules loaded lazily once per device,
//! kernels looked up by name.
//!
//! hkload reads a bundle through its index (`bundle.msgpack`) alone, and refuses a folder
//! without one. The index's digest covers every record hkload acts on, and each record the
//! digests of the bytes it names; `bundle.toml` and the ABI files are the same records for
//! people and other tools, with no digest over them, so a bundle read from them could be
//! edited (a cubin's target renamed, a digest replaced) with nothing to tell.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use crate::contract::Contract;
use crate::device::Device;
use crate::driver::{FunctionHandle, LaunchDims, ModuleHandle, StreamHandle};
use crate::error::{Error, Result};
use crate::file::FileBytes;
use crate::index::lookup::{KernelAt, Module, Table};
use crate::index::{INDEX_FILE, Index};
use crate::launch::{Arg, ArgLayout, Launched};
use crate::manifest::{
    BundleManifest, Digests, KernelAbi, KernelRecord, MANIFEST_FILE, ManifestError, NotBuilt,
    Package, Sha256Digest,
};
use crate::offload;
use crate::package_set::{self, FoundPackage};
use crate::select::{Selection, choose, select};
use crate::signing::{PublicKey, SIGNATURE_FILE, SignatureError, SignatureFile};
use crate::target::{EntryId, TargetId};

/// How [`Bundle::open_with`] treats the files it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOptions {
    /// Check every byte hkload uses against its SHA-256 before using it: the index against
    /// its own digest, and each code image before it is loaded against the index's digest of
    /// that image. On by default; turning it off saves the hashing time at start-up and
    /// trusts the files. Trusted keys or a pinned digest turn it on whatever it says.
    pub verify_hashes: bool,
    /// The keys of which one must have signed the bundle (its `bundle.sig`, see
    /// [`crate::signing`]); empty, signatures are not looked at.
    pub trusted_keys: Vec<PublicKey>,
    /// The SHA-256 the index (`bundle.msgpack`) must have, as a lockfile pins a dependency:
    /// every other byte hkload uses hangs from the index's digests.
    pub expect_digest: Option<Sha256Digest>,
}

impl OpenOptions {
    /// Hashes verified, no signature required, no pin.
    pub const DEFAULT: Self = Self {
        verify_hashes: true,
        trusted_keys: Vec::new(),
        expect_digest: None,
    };

    /// Whether every byte used is checked against a digest.
    fn verifies(&self) -> bool {
        self.verify_hashes || !self.trusted_keys.is_empty() || self.expect_digest.is_some()
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

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
    /// Opens the bundle folder `dir` (the one `hkpack build` wrote) with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(dir, OpenOptions::default())
    }

    /// Opens the bundle folder `dir`: reads and checks its index's lookup table
    /// (`bundle.msgpack`), and refuses a folder without an index. Nothing else is
    /// read here: the manifest is decoded from the index when asked for, module files are
    /// mapped, checked and hashed when a module is first used (or at
    /// [`LoadedBundle::preload`]), so opening costs the same however many modules there are.
    pub fn open_with(dir: impl AsRef<Path>, options: OpenOptions) -> Result<Self> {
        Self::read(dir.as_ref().to_owned(), Source::Dir, options)
    }

    /// A bundle embedded in the program, e.g. with `include_bytes!`: its index and module
    /// files under their file names (the TOML files are never read).
    ///
    /// ```
    /// /// Opens the bundle whose index and module file the program carries, e.g. as
    /// /// `include_bytes!("…/dist/hk-kernels-0.1.0/bundle.msgpack")`.
    /// fn embedded(index: &'static [u8], rmsnorm: &'static [u8]) -> hkload::Result<hkload::Bundle> {
    ///     let files = [("bundle.msgpack", index), ("rmsnorm.hipfb", rmsnorm)];
    ///     hkload::Bundle::from_bytes(&files, hkload::OpenOptions::default())
    /// }
    /// ```
    pub fn from_bytes(
        files: &[(&'static str, &'static [u8])],
        options: OpenOptions,
    ) -> Result<Self> {
        Self::read(
            PathBuf::from("<embedded>"),
            Source::Embedded(files.to_vec()),
            options,
        )
    }

    /// Opens the bundle `name` (`hk-kernels-0.1.0`) from the first folder of `dirs` that holds
    /// it whole (`<name>/`) or its index package (`<name>-index/`); with an index package, each
    /// target's package (`<name>-gfx942/`) is taken from the first folder that holds it, and
    /// the code objects are chosen from those present, as from one bundle. A target package
    /// split from another build is refused, naming both. See [`crate::package_set`].
    ///
    /// ```no_run
    /// // HKLOAD_PATH=/opt/hk-kernels:/usr/share/hk-kernels
    /// let dirs = hkload::package_set::search_path_from_env();
    /// let bundle = hkload::Bundle::open_search_path("hk-kernels-0.1.0", &dirs, Default::default())?;
    /// print!("{}", bundle.explain(&"gfx942:sramecc+:xnack-".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_search_path(
        name: &str,
        dirs: &[impl AsRef<Path>],
        options: OpenOptions,
    ) -> Result<Self> {
        let dirs: Vec<PathBuf> = dirs.iter().map(|d| d.as_ref().to_owned()).collect();
        let Some((origin, whole)) = package_set::find_index(name, &dirs) else {
            return Err(Error::NotOnSearchPath {
                name: name.to_owned(),
                dirs,
            });
        };
        if whole {
            return Self::open_with(origin, options);
        }
        let bundle = Self::read(origin, Source::Packages(Vec::new()), options)?;
        let (package, version) = bundle.table().package();
        let package = Package {
            name: package.to_owned(),
            version: version.to_owned(),
        };
        let digest = bundle.index_digest();
        let mut found = Vec::new();
        for target in bundle.table().build_targets() {
            if let Some(dir) = package_set::find_target_package(name, &target, &dirs) {
                found.push(package_set::check_target_package(
                    &dir,
                    &target,
                    &package,
                    &digest,
                    &bundle.inner.origin,
                )?);
            }
        }
        let Inner {
            origin,
            index,
            options,
            ..
        } = Arc::into_inner(bundle.inner).expect("the bundle was not shared yet");
        Ok(Self::assemble(
            origin,
            Source::Packages(found),
            index,
            options,
        ))
    }

    fn read(origin: PathBuf, source: Source, options: OpenOptions) -> Result<Self> {
        let index_path = origin.join(INDEX_FILE);
        let bytes = source.read(&index_path, INDEX_FILE).map_err(|e| {
            let detail = if e.kind() != std::io::ErrorKind::NotFound {
                e.to_string()
            } else if source
                .read(&origin.join(MANIFEST_FILE), MANIFEST_FILE)
                .is_ok()
            {
                format!(
                    "the bundle's index is missing. hkload reads a bundle through its index \
                     alone, whose digest covers every record; the {MANIFEST_FILE} beside it is a \
                     readable copy that nothing verifies. Rebuild the bundle with `hkpack build`"
                )
            } else {
                format!(
                    "no such file; is {} a bundle folder made by `hkpack build`?",
                    origin.display()
                )
            };
            Error::Io {
                path: index_path.clone(),
                detail,
            }
        })?;
        if let Some(expected) = options.expect_digest {
            let found = Sha256Digest::of(&bytes);
            if found != expected {
                return Err(Error::Pinned {
                    path: index_path,
                    expected: expected.to_string(),
                    found: found.to_string(),
                });
            }
        }
        if !options.trusted_keys.is_empty() {
            let signature_path = origin.join(SIGNATURE_FILE);
            let signature = match source.read(&signature_path, SIGNATURE_FILE) {
                Ok(text) => String::from_utf8(text.to_vec())
                    .map_err(|_| SignatureError::Malformed("it is not UTF-8 text".into()))
                    .and_then(|text| SignatureFile::from_toml(&text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(SignatureError::Unsigned),
                Err(e) => Err(SignatureError::Malformed(e.to_string())),
            };
            signature
                .and_then(|file| file.check(&bytes, &options.trusted_keys))
                .map_err(|source| Error::Signature {
                    path: signature_path,
                    source,
                })?;
        }
        let index = Index::open(bytes, options.verifies()).map_err(index_error(&origin))?;
        Ok(Self::assemble(origin, source, index, options))
    }

    fn assemble(origin: PathBuf, source: Source, index: Index, options: OpenOptions) -> Self {
        let files = index.table().modules().len() * source.file_sets();
        let modules = std::iter::repeat_with(|| ModuleFile {
            bytes: OnceLock::new(),
        })
        .take(files)
        .collect();
        Self {
            inner: Arc::new(Inner {
                origin,
                source,
                index,
                modules,
                options,
            }),
        }
    }

    /// The digest the index records of itself: what identifies this build of the bundle, and
    /// what its split packages record.
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

    /// For each module, which entry would run on `device` and why every other was passed over,
    /// and for a module with none, whether it is not built for the device by design (and why).
    /// No driver is involved: this works on any machine.
    ///
    /// The reasons come from the manifest, decoded here; an index whose manifest does not
    /// decode gives an explanation without them (and fails at [`Bundle::load`]).
    ///
    /// No device reports an architecture-specific target: one named so (`sm_90a`) is explained
    /// as the device its code runs on (`sm_90`), and the explanation says so.
    pub fn explain(&self, device: &TargetId) -> Explanation {
        let named = *device;
        let device = &named.portable();
        let modules = self
            .table()
            .modules()
            .enumerate()
            .map(|(index, module)| {
                let selection = select(device, &self.present_entries(&module));
                let missing_package = self.missing_package(&module, device);
                // Not built by design only when the whole bundle has nothing for the device
                // either, not when the package holding its code is missing.
                let not_built = match (selection.chosen(), &missing_package) {
                    (None, None) => self.not_built_for(index, device).ok().flatten(),
                    _ => None,
                };
                let package = match (&self.inner.source, selection.chosen()) {
                    (Source::Packages(_), Some((entry, _))) => {
                        self.package_of(entry).map(Path::to_owned)
                    }
                    _ => None,
                };
                ModuleChoice {
                    module: module.name().to_owned(),
                    missing_package,
                    selection,
                    not_built,
                    package,
                }
            })
            .collect();
        Explanation {
            device: *device,
            named_as: (named != *device).then_some(named),
            modules,
        }
    }

    /// Chooses the code object of every module for `device`, failing if any module has none
    /// that can run there, unless its manifest skips the device's target on purpose: such a
    /// module is absent, and looking up one of its kernels says why. Modules are loaded on
    /// first use of one of their kernels (or all at once with [`LoadedBundle::preload`]).
    pub fn load(&self, device: &Device) -> Result<LoadedBundle> {
        let target = device.target();
        let table = self.table();
        let mut modules = Vec::with_capacity(table.modules().len());
        for (index, module) in table.modules().enumerate() {
            let ids = self.present_entries(&module);
            // The choice alone is cheap; the explanation is worked out only for an error.
            let choice = match choose(target, &ids) {
                Some((chosen, _)) => Choice::Entry(ids[chosen]),
                None => {
                    let missing = self.missing_package(&module, target);
                    // Not built by design only when the whole bundle has nothing for the device
                    // either, not when the package holding its code is missing.
                    let not_built = match missing {
                        None => self.not_built_for(index, target)?,
                        Some(_) => None,
                    };
                    if let Some(not_built) = not_built {
                        Choice::NotBuilt(not_built)
                    } else {
                        let mut explanation = select(target, &ids).to_string();
                        if let Some(missing) = missing {
                            explanation.push('\n');
                            explanation.push_str(&missing.to_string());
                        }
                        return Err(Error::NoCodeObject {
                            module: module.name().to_owned(),
                            device: *target,
                            available: ids.iter().map(EntryId::to_string).collect(),
                            explanation,
                        });
                    }
                }
            };
            modules.push(ModuleSlot {
                index,
                choice,
                loaded: OnceLock::new(),
            });
        }
        Ok(LoadedBundle {
            inner: Arc::new(LoadedInner {
                bundle: self.clone(),
                device: device.clone(),
                modules,
            }),
        })
    }

    /// The target module `index` skips on purpose that would have served `device`, if any.
    /// It is asked only for a module with no code for the device; the lookup table answers it
    /// from format 1.6 on, the manifest before.
    fn not_built_for(&self, index: usize, device: &TargetId) -> Result<Option<NotBuilt>> {
        if let Some(not_built) = self.table().not_built(index) {
            return Ok(NotBuilt::serving(device, &not_built).cloned());
        }
        let record = self
            .manifest()?
            .modules
            .get(index)
            .ok_or_else(|| Error::Mismatch {
                what: format!("module {index} of the index's lookup table"),
                detail: "the index's manifest does not list it".into(),
            })?;
        Ok(NotBuilt::serving(device, &record.not_built).cloned())
    }

    /// The bytes of the code image `entry` of module `index`, after the checks the options ask
    /// for: borrowed from the mapped file if it is a plain bundle, decompressed (only as far as
    /// the entry) if it is compressed.
    ///
    /// The image's digest is left to the caller as an [`ImageCheck`] when verification is on:
    /// it may hash while the driver loads.
    fn code_image(
        &self,
        index: usize,
        entry: &EntryId,
    ) -> Result<(Cow<'_, [u8]>, Option<ImageCheck>)> {
        let inner = &*self.inner;
        let module = self
            .table()
            .module(index)
            .expect("modules are only loaded from the table's own list");
        // Which copy of the module file holds the entry: the bundle's, or its target package's.
        let (set, folder) = match &inner.source {
            Source::Dir | Source::Embedded(_) => (0, inner.origin.as_path()),
            Source::Packages(found) => found
                .iter()
                .enumerate()
                .find(|(_, p)| p.target == entry.target())
                .map(|(set, p)| (set, p.dir.as_path()))
                .expect("entries are only chosen from the packages found"),
        };
        let path = folder.join(module.file());
        let whole = !matches!(inner.source, Source::Packages(_));
        let slot = set * self.table().modules().len() + index;
        let bytes = inner.modules[slot]
            .bytes
            .get_or_init(|| {
                let bytes = open_module_file(&path, &module, &inner.source, whole)?;
                // A signed bundle is checked whole, every byte of its module files too (they
                // are small when compressed); otherwise only what reaches the driver, below.
                // A target package's module file is not in the index: its images are, and
                // are checked below, as every image is.
                if whole && !inner.options.trusted_keys.is_empty() {
                    let record =
                        self.manifest()?
                            .modules
                            .get(index)
                            .ok_or_else(|| Error::Mismatch {
                                what: format!("module file {}", path.display()),
                                detail: "the index's manifest does not list it".into(),
                            })?;
                    check_digests(
                        &bytes,
                        &record.digests(),
                        &format!("module file {}", path.display()),
                    )?;
                }
                Ok(bytes)
            })
            .as_ref()
            .map_err(Clone::clone)?;
        let id = entry.to_string();
        let image = offload::extract_entry(bytes, &id).map_err(|source| Error::Format {
            module: module.name().to_owned(),
            path: path.clone(),
            source,
        })?;
        let expected = module
            .entries()
            .find(|e| &e.id == entry)
            .expect("entries are only chosen from the manifest's own list");
        bytes.prefetch(&image);
        let what = || format!("entry `{id}` of {}", path.display());
        if image.len() as u64 != expected.size {
            return Err(Error::Mismatch {
                what: what(),
                detail: format!(
                    "it is {} bytes, the manifest says {}",
                    image.len(),
                    expected.size
                ),
            });
        }
        // The image alone is hashed, not the file: it is every byte that reaches the driver,
        // and a plain bundle is often several times larger than the one image a device needs.
        // The rest of the file is checked by its format (header, zero padding).
        let check = inner.options.verifies().then(|| ImageCheck {
            expected: expected.digests(),
            what: what(),
            // Signed or pinned, the bytes may be an adversary's: none reaches the driver's
            // parser before its digest is checked. Verifying alone guards against damage.
            before_load: !inner.options.trusted_keys.is_empty()
                || inner.options.expect_digest.is_some(),
        });
        Ok((image, check))
    }
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

/// A target package a bundle opened from packages lacks: the one holding the code object a
/// whole bundle would give the device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MissingPackage {
    pub target: TargetId,
    /// The package's folder name: `hk-kernels-0.1.0-gfx950`.
    pub name: String,
}

impl std::fmt::Display for MissingPackage {
    /// What to install: `no package for gfx950: install hk-kernels-0.1.0-gfx950`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no package for {}: install {}", self.target, self.name)
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

/// The bytes of `module`'s file at `path` (mapped from a folder), checked against what the
/// manifest says of its size and compression.
///
/// Mapped rather than read: the driver then takes the chosen image straight from the page
/// cache. Reading the image alone into fresh memory instead (seek, then one read) was faster
/// on the development machine, a virtual machine where page faults are dear (47 against 79 µs
/// for 661 KB, each then copied once as the driver does), but slower on the H100 machine:
/// `cuModuleLoadData` plus a first launch of a 661 KB cubin read that way took 248 and 353 µs
/// against 228 and 344 µs mapped, in two runs of `gpu_bench` (medians of 400).
///
/// `whole` is false for a target package's copy, which holds some of the module's entries:
/// the index records no size of it.
fn open_module_file(
    path: &Path,
    module: &Module<'_>,
    source: &Source,
    whole: bool,
) -> Result<FileBytes> {
    let io = |e: std::io::Error| Error::Io {
        path: path.to_owned(),
        detail: e.to_string(),
    };
    let bytes = match source {
        Source::Dir | Source::Packages(_) => FileBytes::map(path).map_err(io)?,
        Source::Embedded(files) => embedded(files, module.file()).map_err(io)?.into(),
    };
    let len = bytes.len() as u64;
    let what = || format!("module file {}", path.display());
    if whole && len != module.size() {
        return Err(Error::Mismatch {
            what: what(),
            detail: format!("it is {len} bytes, the manifest says {}", module.size()),
        });
    }
    if offload::is_compressed(&bytes) != module.compressed() {
        return Err(Error::Mismatch {
            what: what(),
            detail: format!(
                "the manifest says it is {}compressed, the file says otherwise",
                if module.compressed() { "" } else { "not " }
            ),
        });
    }
    Ok(bytes)
}

/// The digests a code image must have, checked before the driver loads it or while it does:
/// its BLAKE3 where the index records one (format 1.5), else its SHA-256.
struct ImageCheck {
    expected: Digests,
    what: String,
    /// Whether the image must be hashed before the driver sees it (signed or pinned bundles).
    before_load: bool,
}

impl ImageCheck {
    fn run(&self, image: &[u8]) -> Result<()> {
        check_digests(image, &self.expected, &self.what)
    }
}

/// Loads `image` on `device` after `check`, if any, and runs `then` on the loaded module (the
/// first kernel's lookup): hashed first for a signed or pinned bundle or a small image;
/// otherwise hashed on another thread while the driver loads the module and `then` runs, the
/// module unloaded again if the digest is wrong. Either way nothing is launched from a module
/// whose image did not pass: the caller gets its handle only after the check.
///
/// Why concurrently: hashing the 661 KB cubin of `gpu_bench` with BLAKE3 took 108 µs on the
/// H100 machine, about half of what the driver takes to load it; the two need nothing from
/// each other. Why `then` inside: the CUDA driver loads lazily by default, so
/// `cuModuleLoadData` of that cubin returned in 39 µs and most of the load (some 150 µs) came
/// at the first `cuModuleGetFunction`; hashing only beside the former hid a third of the hash.
/// Small images are hashed first: see [`Digests::concurrent_from`].
fn load_checked<T>(
    device: &Device,
    kind: crate::driver::ImageKind,
    image: &[u8],
    check: Option<&ImageCheck>,
    then: impl FnOnce(ModuleHandle) -> T,
) -> Result<(ModuleHandle, T)> {
    let load = || {
        let handle = device.driver().load_module(device.ordinal(), kind, image)?;
        Ok::<_, Error>((handle, then(handle)))
    };
    let Some(check) = check else {
        return load();
    };
    if check.before_load || image.len() < check.expected.concurrent_from() {
        check.run(image)?;
        return load();
    }
    let (hashed, loaded) = std::thread::scope(|scope| {
        let hashing = scope.spawn(|| check.run(image));
        let loaded = load();
        (hashing.join(), loaded)
    });
    let hashed = hashed.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    match (hashed, loaded) {
        (Ok(()), loaded) => loaded,
        (Err(error), Ok((handle, _))) => {
            // The module was never handed out; a failed unload leaves nothing to recover.
            let _ = device.driver().unload_module(handle);
            Err(error)
        }
        (Err(error), Err(_)) => Err(error),
    }
}

fn check_digests(bytes: &[u8], expected: &Digests, what: &str) -> Result<()> {
    expected.check(bytes).map_err(|detail| Error::Mismatch {
        what: what.to_owned(),
        detail,
    })
}

/// Why each module's entry was or was not chosen for a device.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub device: TargetId,
    /// The architecture-specific target the caller named the device by (`sm_90a`), when it
    /// did: `device` is then the architecture that target's code runs on (`sm_90`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub named_as: Option<TargetId>,
    pub modules: Vec<ModuleChoice>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModuleChoice {
    pub module: String,
    pub selection: Selection,
    /// When no entry runs on the device: the target the module skips on purpose that would
    /// have served it, and the manifest's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_built: Option<NotBuilt>,
    /// For a bundle opened from packages: the package the chosen code object comes from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<PathBuf>,
    /// For a bundle opened from packages: the missing package that holds what a whole bundle
    /// would choose (`hk-kernels-0.1.0-gfx950`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_package: Option<MissingPackage>,
}

impl Explanation {
    /// Whether [`Bundle::load`] would succeed: every module has a code object that runs on the
    /// device, or is not built for it by design.
    pub fn is_servable(&self) -> bool {
        self.modules
            .iter()
            .all(|m| m.selection.chosen().is_some() || m.not_built.is_some())
    }
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}", self.device)?;
        if let Some(named) = &self.named_as {
            write!(
                f,
                " (named as {named}, which is a target of code, not of a device: its code runs \
                 on {} devices alone)",
                self.device
            )?;
        }
        writeln!(f)?;
        for module in &self.modules {
            match &module.not_built {
                Some(not_built) => writeln!(
                    f,
                    "module {} is not built for {}: {}",
                    module.module, not_built.target, not_built.reason
                )?,
                None => writeln!(f, "module {}:", module.module)?,
            }
            for line in module.selection.to_string().lines() {
                writeln!(f, "  {line}")?;
            }
            if let Some(package) = &module.package {
                writeln!(f, "  from package {}", package.display())?;
            }
            match (&module.missing_package, module.selection.chosen()) {
                (Some(missing), None) => writeln!(f, "  {missing}")?,
                (Some(missing), Some(_)) => writeln!(
                    f,
                    "  {}, which is not installed, holds a better code object for {}",
                    missing.name, self.device
                )?,
                (None, _) => {}
            }
        }
        Ok(())
    }
}

/// A bundle bound to one device: the code object of every module chosen, modules loaded on
/// first use. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct LoadedBundle {
    inner: Arc<LoadedInner>,
}

struct LoadedInner {
    bundle: Bundle,
    device: Device,
    modules: Vec<ModuleSlot>,
}

struct ModuleSlot {
    index: usize,
    choice: Choice,
    loaded: OnceLock<Result<Arc<LoadedModule>, Error>>,
}

/// What a module offers the device.
enum Choice {
    /// The code image the device runs.
    Entry(EntryId),
    /// Nothing, by design: the module's manifest skips the target that would serve it.
    NotBuilt(NotBuilt),
}

/// A module loaded on a device; unloaded when the last kernel taken from it is dropped.
struct LoadedModule {
    device: Device,
    handle: ModuleHandle,
}

impl Drop for LoadedModule {
    fn drop(&mut self) {
        // A failed unload leaves nothing to recover; the driver reports a broken context on
        // its next call.
        let _ = self.device.driver().unload_module(self.handle);
    }
}

impl LoadedBundle {
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The entry chosen for `module`, if the bundle has that module and it is built for the
    /// device.
    pub fn chosen_entry(&self, module: &str) -> Option<&EntryId> {
        let index = self
            .inner
            .bundle
            .table()
            .modules()
            .position(|m| m.name() == module)?;
        // Slots are in module order.
        match &self.inner.modules[index].choice {
            Choice::Entry(entry) => Some(entry),
            Choice::NotBuilt(_) => None,
        }
    }

    /// Loads every module now rather than on first use (all but those not built for the
    /// device).
    pub fn preload(&self) -> Result<()> {
        for slot in &self.inner.modules {
            if let Choice::Entry(entry) = &slot.choice {
                self.module(slot, entry, None)?;
            }
        }
        Ok(())
    }

    /// The kernel `symbol`, loading its module on first use.
    pub fn kernel(&self, symbol: &str) -> Result<Kernel> {
        let (module_index, record) = self.inner.bundle.kernel_location(symbol)?;
        // Slots are in module order.
        let slot = &self.inner.modules[module_index];
        let entry = match &slot.choice {
            Choice::Entry(entry) => entry,
            Choice::NotBuilt(not_built) => {
                return Err(Error::NotBuilt {
                    kernel: symbol.to_owned(),
                    module: self.inner.bundle.table().module(module_index).map_or_else(
                        || format!("#{module_index}"),
                        |module| module.name().to_owned(),
                    ),
                    target: not_built.target,
                    reason: not_built.reason.clone(),
                });
            }
        };
        let abi = kernel_abi(record, entry)?;
        let layout = ArgLayout::new(
            &record.args,
            abi,
            record.contract.as_ref(),
            &self.inner.device,
        )
        .map_err(|detail| Error::Mismatch {
            what: format!("kernel `{symbol}`"),
            detail,
        })?;
        let (module, function) = self.module(slot, entry, Some(symbol))?;
        let function = match function {
            Some(function) => function?,
            None => self.inner.device.driver().function(module.handle, symbol)?,
        };
        Ok(Kernel {
            inner: Arc::new(KernelInner {
                name: symbol.to_owned(),
                abi: abi.clone(),
                layout,
                function,
                module,
            }),
        })
    }

    /// Module `slot`, whose chosen entry is `entry`, loaded on first use; and if this call
    /// loaded it, kernel `symbol` looked up while its image was verified (see
    /// [`load_checked`]), else `None`.
    fn module(
        &self,
        slot: &ModuleSlot,
        entry: &EntryId,
        symbol: Option<&str>,
    ) -> Result<(Arc<LoadedModule>, Option<Result<FunctionHandle>>)> {
        let mut function = None;
        let module = slot
            .loaded
            .get_or_init(|| {
                let device = &self.inner.device;
                let (image, check) = self.inner.bundle.code_image(slot.index, entry)?;
                let lookup =
                    |handle| symbol.map(|symbol| Ok(device.driver().function(handle, symbol)?));
                let (handle, looked_up) =
                    load_checked(device, entry.image_kind(), &image, check.as_ref(), lookup)?;
                function = looked_up;
                Ok(Arc::new(LoadedModule {
                    device: device.clone(),
                    handle,
                }))
            })
            .clone()?;
        Ok((module, function))
    }
}

fn kernel_abi<'a>(record: &'a KernelRecord, entry: &EntryId) -> Result<&'a KernelAbi> {
    record
        .abi_for(&entry.target())
        .ok_or_else(|| Error::Mismatch {
            what: format!("kernel `{}`", record.symbol),
            detail: format!("the manifest records no ABI for target {}", entry.target()),
        })
}

/// A kernel ready to launch on one device. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Kernel {
    inner: Arc<KernelInner>,
}

struct KernelInner {
    name: String,
    abi: KernelAbi,
    layout: ArgLayout,
    function: FunctionHandle,
    module: Arc<LoadedModule>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({})", self.inner.name)
    }
}

impl Kernel {
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The kernel's ABI on the chosen target: argument offsets, registers, shared memory…
    pub fn abi(&self) -> &KernelAbi {
        &self.inner.abi
    }

    /// The kernel's launch contract, if its bundle has one (format 1.3 and later).
    pub fn contract(&self) -> Option<&Contract> {
        self.inner.layout.contract()
    }

    /// Calls the kernel on `stream` with its arguments alone: checks them against the
    /// signature, evaluates the contract (its preconditions, the launch shape, and every
    /// buffer's extent against the memory passed) and launches. Nothing reaches the driver if
    /// a check fails; a contract whose grid is empty (nothing to do) launches nothing.
    ///
    /// The launch is asynchronous: read results after [`Device::synchronize`]. Buffers stay
    /// valid meanwhile, as a [`crate::DeviceBuffer`] waits for queued work before it frees
    /// its memory.
    ///
    /// ```no_run
    /// # use hkload::{abi::ScalarType, driver::StreamHandle, Arg};
    /// # let bundle = hkload::Bundle::open("dist/hk-kernels-0.1.0")?;
    /// # let device = hkload::auto::first_device()?;
    /// # let kernels = bundle.load(&device)?;
    /// let (rows, cols) = (4u32, 4096u32);
    /// let x = device.alloc(ScalarType::Bf16, (rows * cols) as usize)?;
    /// let weight = device.alloc(ScalarType::Bf16, cols as usize)?;
    /// let mut out = device.alloc(ScalarType::Bf16, (rows * cols) as usize)?;
    /// let rmsnorm = kernels.kernel("rmsnorm_bf16")?;
    /// rmsnorm.call(StreamHandle::DEFAULT, &[(&mut out).into(), (&x).into(), (&weight).into(),
    ///                                      1e-6f32.into(), rows.into(), cols.into()])?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// [`Device::synchronize`]: crate::Device::synchronize
    pub fn call(&self, stream: StreamHandle, args: &[Arg<'_>]) -> Result<(), Error> {
        self.checked_launch(None, stream, args)
    }

    /// The launch shape [`Kernel::call`] would use for `args`, after the same checks, without
    /// launching anything: for logs, and for experts who launch with a shape of their own.
    pub fn launch_shape(&self, args: &[Arg<'_>]) -> Result<LaunchDims, Error> {
        let inner = &*self.inner;
        match inner
            .layout
            .check_and_pack(&inner.name, &inner.module.device, None, args, |_, _| ())
            .map_err(Error::Launch)?
        {
            Launched::Done(dims, ()) | Launched::Empty(dims) => Ok(dims),
        }
    }

    /// Launches the kernel with explicit dimensions, for experts: the arguments are checked
    /// against the signature, and, where the kernel has a contract, against its preconditions
    /// and extents; `dims` against the code object's and the device's limits. Nothing reaches
    /// the driver if a check fails.
    ///
    /// # Safety
    ///
    /// A kernel is correct only for the launch shapes its author meant (its contract computes
    /// one): the caller promises that `dims` is one of them. For a kernel without a contract
    /// (a bundle older than format 1.3), the caller also promises that every buffer holds what
    /// the kernel touches.
    pub unsafe fn launch(
        &self,
        dims: &LaunchDims,
        stream: StreamHandle,
        args: &[Arg<'_>],
    ) -> Result<(), Error> {
        self.checked_launch(Some(dims), stream, args)
    }

    fn checked_launch(
        &self,
        dims: Option<&LaunchDims>,
        stream: StreamHandle,
        args: &[Arg<'_>],
    ) -> Result<(), Error> {
        let inner = &*self.inner;
        let device = &inner.module.device;
        let launched = inner
            .layout
            .check_and_pack(&inner.name, device, dims, args, |dims, packed| {
                device.driver().launch(inner.function, dims, stream, packed)
            })
            .map_err(Error::Launch)?;
        match launched {
            Launched::Done(_, result) => result.map_err(Error::Driver),
            Launched::Empty(_) => Ok(()),
        }
    }
}
