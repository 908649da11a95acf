//! A bundle as hkload uses it: opened and checked against its manifest, the code object for a
//! device chosen per module (and explained on request), modules loaded lazily once per device,
//! kernels looked up by name.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::device::Device;
use crate::driver::{FunctionHandle, LaunchDims, ModuleHandle, StreamHandle};
use crate::error::{Error, LaunchError, Result};
use crate::launch::{Arg, ArgLayout, shared_memory_limit};
use crate::manifest::{
    BundleManifest, KernelAbi, KernelRecord, MANIFEST_FILE, ModuleAbi, ModuleRecord,
};
use crate::offload;
use crate::select::{Selection, select};
use crate::target::{EntryId, TargetId};

/// How [`Bundle::open_with`] treats the files it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Check each module file's SHA-256 against the manifest before its first use (which
    /// covers every code image in it). On by default; turning it off saves the hashing time at
    /// start-up and trusts the files.
    pub verify_hashes: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            verify_hashes: true,
        }
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
    manifest: BundleManifest,
    modules: Vec<ModuleFile>,
    /// Which module holds each kernel.
    kernels: HashMap<String, usize>,
    options: OpenOptions,
}

/// Where files other than the module files are read from, when they are needed.
enum Source {
    Dir,
    Embedded(Vec<(String, &'static [u8])>),
}

/// The bytes of one module file, whether they passed the checks the options ask for (done
/// once, on first use), and its ABI file, read on first use.
struct ModuleFile {
    path: PathBuf,
    bytes: FileBytes,
    checked: OnceLock<Result<(), Error>>,
    abi: OnceLock<Result<ModuleAbi, Error>>,
}

enum FileBytes {
    Mapped(memmap2::Mmap),
    Static(&'static [u8]),
}

impl FileBytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Mapped(map) => map,
            Self::Static(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for Bundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let package = &self.inner.manifest.package;
        write!(
            f,
            "Bundle({} {} at {})",
            package.name,
            package.version,
            self.inner.origin.display()
        )
    }
}

impl Bundle {
    /// Opens the bundle folder `dir` (the one holding `bundle.toml`) with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(dir, OpenOptions::default())
    }

    /// Opens the bundle folder `dir`: reads and validates the manifest and maps every module
    /// file, checking its size. Hashes are checked when a module is first used.
    pub fn open_with(dir: impl AsRef<Path>, options: OpenOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let manifest_path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&manifest_path).map_err(|e| Error::Io {
            path: manifest_path.clone(),
            detail: if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "{e}; is {} a bundle folder made by `hkpack build`?",
                    dir.display()
                )
            } else {
                e.to_string()
            },
        })?;
        let manifest = parse_manifest(&text, &manifest_path)?;
        let mut files = Vec::with_capacity(manifest.modules.len());
        for module in &manifest.modules {
            let path = dir.join(&module.file);
            let io = |e: std::io::Error| Error::Io {
                path: path.clone(),
                detail: e.to_string(),
            };
            let file = std::fs::File::open(&path).map_err(io)?;
            // SAFETY: the map is read-only and private to this process. Bundles are written
            // aside and moved into place whole, so a file is never rewritten while mapped by
            // a well-behaved producer; hashes catch the rest when verification is on.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
            files.push(ModuleFile::new(path, FileBytes::Mapped(map), module)?);
        }
        Ok(Self::assemble(
            dir.to_owned(),
            Source::Dir,
            manifest,
            files,
            options,
        ))
    }

    /// A bundle embedded in the program, e.g. with `include_bytes!`: the manifest text and the
    /// bytes of every other file of the bundle folder (module and ABI files) under its name.
    pub fn from_bytes(
        manifest: &str,
        files: &[(&str, &'static [u8])],
        options: OpenOptions,
    ) -> Result<Self> {
        let origin = PathBuf::from("<embedded>");
        let manifest = parse_manifest(manifest, &origin.join(MANIFEST_FILE))?;
        let mut modules = Vec::with_capacity(manifest.modules.len());
        for module in &manifest.modules {
            let path = origin.join(&module.file);
            let bytes = files
                .iter()
                .find(|(name, _)| *name == module.file)
                .map(|(_, bytes)| *bytes)
                .ok_or_else(|| Error::Io {
                    path: path.clone(),
                    detail: format!("module `{}` was not among the embedded files", module.name),
                })?;
            modules.push(ModuleFile::new(path, FileBytes::Static(bytes), module)?);
        }
        let files = files.iter().map(|(n, b)| ((*n).to_owned(), *b)).collect();
        Ok(Self::assemble(
            origin,
            Source::Embedded(files),
            manifest,
            modules,
            options,
        ))
    }

    fn assemble(
        origin: PathBuf,
        source: Source,
        manifest: BundleManifest,
        modules: Vec<ModuleFile>,
        options: OpenOptions,
    ) -> Self {
        let kernels = manifest
            .modules
            .iter()
            .enumerate()
            .flat_map(|(i, m)| m.kernels.iter().map(move |k| (k.clone(), i)))
            .collect();
        Self {
            inner: Arc::new(Inner {
                origin,
                source,
                manifest,
                modules,
                kernels,
                options,
            }),
        }
    }

    pub fn manifest(&self) -> &BundleManifest {
        &self.inner.manifest
    }

    /// Kernel `symbol`'s signature and per-target ABI, reading its module's ABI file on first
    /// use.
    pub fn kernel_record(&self, symbol: &str) -> Result<&KernelRecord> {
        self.kernel_location(symbol).map(|(_, record)| record)
    }

    /// The index of the module holding kernel `symbol`, and the kernel's record.
    fn kernel_location(&self, symbol: &str) -> Result<(usize, &KernelRecord)> {
        let inner = &*self.inner;
        let index = *inner
            .kernels
            .get(symbol)
            .ok_or_else(|| Error::UnknownKernel {
                name: symbol.to_owned(),
                known: inner.manifest.kernel_symbols().map(str::to_owned).collect(),
            })?;
        let abi = self.module_abi(index)?;
        let record = abi
            .kernel(symbol)
            .expect("an ABI file is accepted only if it lists exactly its module's kernels");
        Ok((index, record))
    }

    /// Every kernel's record, modules in manifest order (reads every ABI file).
    pub fn kernel_records(&self) -> Result<Vec<&KernelRecord>> {
        let mut records = Vec::new();
        for index in 0..self.inner.modules.len() {
            records.extend(&self.module_abi(index)?.kernels);
        }
        Ok(records)
    }

    /// The ABI file of module `index`, read and checked on first use.
    fn module_abi(&self, index: usize) -> Result<&ModuleAbi> {
        let inner = &*self.inner;
        let record = &inner.manifest.modules[index];
        inner.modules[index]
            .abi
            .get_or_init(|| {
                let path = inner.origin.join(&record.abi_file);
                let bytes = inner.source.read(&path, &record.abi_file)?;
                if inner.options.verify_hashes {
                    check_sha256(&bytes, &record.abi_sha256, &format!("{}", path.display()))?;
                }
                let text = std::str::from_utf8(&bytes).map_err(|e| Error::Io {
                    path: path.clone(),
                    detail: format!("not UTF-8 text: {e}"),
                })?;
                ModuleAbi::from_toml(text, record).map_err(|source| Error::Manifest {
                    path: path.clone(),
                    source,
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// For each module, which entry would run on `device` and why every other was passed over.
    /// No driver is involved: this works on any machine.
    pub fn explain(&self, device: &TargetId) -> Explanation {
        let modules = self
            .inner
            .manifest
            .modules
            .iter()
            .map(|module| ModuleChoice {
                module: module.name.clone(),
                selection: select_entry(module, device),
            })
            .collect();
        Explanation {
            device: *device,
            modules,
        }
    }

    /// Chooses the code object of every module for `device`, failing if any module has none
    /// that can run there. Modules are loaded on first use of one of their kernels (or all at
    /// once with [`LoadedBundle::preload`]).
    pub fn load(&self, device: &Device) -> Result<LoadedBundle> {
        let target = device.target();
        let mut modules = Vec::with_capacity(self.inner.manifest.modules.len());
        for (index, record) in self.inner.manifest.modules.iter().enumerate() {
            let selection = select_entry(record, target);
            let Some((entry, _)) = selection.chosen() else {
                return Err(Error::NoCodeObject {
                    module: record.name.clone(),
                    device: *target,
                    available: record.entries.iter().map(|e| e.id.to_string()).collect(),
                    explanation: selection.to_string(),
                });
            };
            modules.push(ModuleSlot {
                index,
                entry: *entry,
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

    /// The bytes of the code image `entry` of module `index`, after the checks the options ask
    /// for: borrowed from the mapped file if it is a plain bundle, decompressed (only as far as
    /// the entry) if it is compressed.
    fn code_image(&self, index: usize, entry: &EntryId) -> Result<Cow<'_, [u8]>> {
        let inner = &*self.inner;
        let record = &inner.manifest.modules[index];
        let file = &inner.modules[index];
        file.checked
            .get_or_init(|| file.check(record, inner.options))
            .clone()?;
        let id = entry.to_string();
        let image =
            offload::extract_entry(file.bytes.as_slice(), &id).map_err(|source| Error::Format {
                module: record.name.clone(),
                path: file.path.clone(),
                source,
            })?;
        let expected = record
            .entries
            .iter()
            .find(|e| &e.id == entry)
            .expect("entries are only chosen from the manifest's own list");
        if image.len() as u64 != expected.size {
            return Err(Error::Mismatch {
                what: format!("entry `{id}` of {}", file.path.display()),
                detail: format!(
                    "it is {} bytes, the manifest says {}",
                    image.len(),
                    expected.size
                ),
            });
        }
        // No second hash here: the file's SHA-256, checked once, covers every byte of every
        // entry. The per-entry digests in the manifest are for other tools.
        Ok(image)
    }
}

impl Source {
    /// The bytes of the bundle file `name` (at `path` when the bundle is a folder).
    fn read(&self, path: &Path, name: &str) -> Result<Cow<'static, [u8]>> {
        match self {
            Self::Dir => std::fs::read(path).map(Cow::Owned).map_err(|e| Error::Io {
                path: path.to_owned(),
                detail: e.to_string(),
            }),
            Self::Embedded(files) => files
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, bytes)| Cow::Borrowed(*bytes))
                .ok_or_else(|| Error::Io {
                    path: path.to_owned(),
                    detail: format!("`{name}` was not among the embedded files"),
                }),
        }
    }
}

fn parse_manifest(text: &str, path: &Path) -> Result<BundleManifest> {
    BundleManifest::from_toml(text).map_err(|source| Error::Manifest {
        path: path.to_owned(),
        source,
    })
}

fn select_entry(module: &ModuleRecord, device: &TargetId) -> Selection {
    let ids: Vec<EntryId> = module.entries.iter().map(|e| e.id).collect();
    select(device, &ids)
}

impl ModuleFile {
    fn new(path: PathBuf, bytes: FileBytes, record: &ModuleRecord) -> Result<Self> {
        let len = bytes.as_slice().len() as u64;
        if len != record.size {
            return Err(Error::Mismatch {
                what: format!("module file {}", path.display()),
                detail: format!("it is {len} bytes, the manifest says {}", record.size),
            });
        }
        Ok(Self {
            path,
            bytes,
            checked: OnceLock::new(),
            abi: OnceLock::new(),
        })
    }

    /// The checks made once per file: its hash (if the options ask for it) and that it is
    /// compressed exactly when the manifest says so.
    fn check(&self, record: &ModuleRecord, options: OpenOptions) -> Result<()> {
        let bytes = self.bytes.as_slice();
        let what = format!("module file {}", self.path.display());
        if options.verify_hashes {
            check_sha256(bytes, &record.sha256, &what)?;
        }
        if offload::is_compressed(bytes) != record.compressed {
            return Err(Error::Mismatch {
                what,
                detail: format!(
                    "the manifest says it is {}compressed, the file says otherwise",
                    if record.compressed { "" } else { "not " }
                ),
            });
        }
        Ok(())
    }
}

fn check_sha256(bytes: &[u8], expected: &str, what: &str) -> Result<()> {
    let found = hex(&Sha256::digest(bytes));
    if found == expected {
        return Ok(());
    }
    Err(Error::Mismatch {
        what: what.to_owned(),
        detail: format!("its SHA-256 is {found}, the manifest says {expected}"),
    })
}

/// Lower-case hex of `bytes`, the form the manifest records digests in.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Why each module's entry was or was not chosen for a device.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub device: TargetId,
    pub modules: Vec<ModuleChoice>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModuleChoice {
    pub module: String,
    pub selection: Selection,
}

impl Explanation {
    /// Whether every module has a code object that runs on the device.
    pub fn is_servable(&self) -> bool {
        self.modules.iter().all(|m| m.selection.chosen().is_some())
    }
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "device {}", self.device)?;
        for module in &self.modules {
            writeln!(f, "module {}:", module.module)?;
            for line in module.selection.to_string().lines() {
                writeln!(f, "  {line}")?;
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
    entry: EntryId,
    loaded: OnceLock<Result<Arc<LoadedModule>, Error>>,
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

    /// The entry chosen for `module`, if the bundle has that module.
    pub fn chosen_entry(&self, module: &str) -> Option<&EntryId> {
        let manifest = self.inner.bundle.manifest();
        self.inner
            .modules
            .iter()
            .find(|slot| manifest.modules[slot.index].name == module)
            .map(|slot| &slot.entry)
    }

    /// Loads every module now rather than on first use.
    pub fn preload(&self) -> Result<()> {
        for slot in &self.inner.modules {
            self.module(slot)?;
        }
        Ok(())
    }

    /// The kernel `symbol`, loading its module on first use.
    pub fn kernel(&self, symbol: &str) -> Result<Kernel> {
        let (module_index, record) = self.inner.bundle.kernel_location(symbol)?;
        // Slots are in module order.
        let slot = &self.inner.modules[module_index];
        let abi = kernel_abi(record, &slot.entry)?;
        let layout = ArgLayout::new(
            &record.args,
            abi,
            shared_memory_limit(self.inner.device.target()),
        )
        .map_err(|detail| Error::Mismatch {
            what: format!("kernel `{symbol}`"),
            detail,
        })?;
        let module = self.module(slot)?;
        let function = self.inner.device.driver().function(module.handle, symbol)?;
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

    fn module(&self, slot: &ModuleSlot) -> Result<Arc<LoadedModule>> {
        slot.loaded
            .get_or_init(|| {
                let device = &self.inner.device;
                let image = self.inner.bundle.code_image(slot.index, &slot.entry)?;
                let handle = device.driver().load_module(
                    device.ordinal(),
                    slot.entry.image_kind(),
                    &image,
                )?;
                Ok(Arc::new(LoadedModule {
                    device: device.clone(),
                    handle,
                }))
            })
            .clone()
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

    /// Launches the kernel on `stream` after checking `args` against its signature and
    /// `dims` against its limits; nothing reaches the driver if a check fails.
    ///
    /// # Safety
    ///
    /// hkload checks that the arguments fit the kernel's ABI: their number, each one's kind
    /// (buffer or value), element type, writability, size and device. It cannot know what the
    /// kernel does with them: the caller promises that the sizes passed describe memory the
    /// buffers really have, and that every buffer outlives the kernel's execution (which is
    /// asynchronous: synchronise before dropping them).
    pub unsafe fn launch(
        &self,
        dims: &LaunchDims,
        stream: StreamHandle,
        args: &[Arg<'_>],
    ) -> Result<(), Error> {
        let inner = &*self.inner;
        let device = &inner.module.device;
        inner
            .layout
            .check_and_pack(&inner.name, device.ordinal(), dims, args, |packed| {
                device.driver().launch(inner.function, dims, stream, packed)
            })
            .map_err(|e: LaunchError| Error::Launch(e))?
            .map_err(Error::Driver)
    }
}
