//! A bundle bound to one device: every module's code object chosen at once, each module
//! mapped, checked against its digests and loaded on first use, and the kernels taken from
//! it, which check and launch calls. This is the part that reaches a driver, kept apart from
//! opening and explaining, which never do.

use std::borrow::Cow;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use super::{Bundle, Source, embedded};
use crate::contract::Contract;
use crate::device::Device;
use crate::driver::{FunctionHandle, LaunchDims, ModuleHandle, StreamHandle};
use crate::error::{Error, Result};
use crate::file::FileBytes;
use crate::index::lookup::Module;
use crate::launch::{Arg, ArgLayout, Launched};
use crate::manifest::{Digests, KernelAbi, KernelRecord, NotBuilt};
use crate::offload;
use crate::select::{choose, select};
use crate::target::EntryId;

impl Bundle {
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
                        None => self.not_built_for(index, target),
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
        // Of the rest of a plain file only the header is read and checked; the other entries
        // and the zero padding between them are not read at all (that would touch their
        // pages), so damage there goes unseen here, reaching no driver: a signed bundle's
        // file is hashed whole above, and `hkpack verify` checks every byte and the padding.
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
/// Small images are hashed first: see [`Digests::CONCURRENT_FROM`].
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
    if check.before_load || image.len() < Digests::CONCURRENT_FROM {
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

    /// The elements each parameter must hold for a call with `args` (by parameter, 0 for
    /// values), as the kernel's contract computes them: what [`Kernel::call`] checks every
    /// buffer against, to size outputs before allocating them. The arguments' types and the
    /// contract's requirements are checked; the buffers' lengths are not read (zero will do).
    pub fn extents(&self, args: &[Arg<'_>]) -> Result<Vec<u64>, Error> {
        let inner = &*self.inner;
        inner
            .layout
            .extents(&inner.name, &inner.module.device, args)
            .map_err(Error::Launch)
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
