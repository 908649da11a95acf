//! Load and launch benchmarks of hkload's CUDA path against raw CUDA driver calls on the same
//! code, on CUDA device 0.
//!
//! ```text
//! gpu_bench <bundle folder> [--kernel NAME]
//! ```
//!
//! * (a) Cold start: open the bundle, choose the code object, load its module and launch one
//!   kernel once (then synchronise), against raw `cuModuleLoadData` of the same image in memory
//!   plus the same launch (the target's baseline). hkload opens the bundle folder and, beside
//!   that, the same bundle embedded in the program ([`Bundle::from_bytes`] over every file,
//!   read into memory beforehand as `include_bytes!` would hold them), which takes its bytes
//!   from memory as the baseline does. Further raw rows: `cuModuleLoad` of the image written to
//!   a file of its own (what a program without hkload that ships its cubins as files does),
//!   `cuModuleLoadData` of the cubin mapped from the bundle's own module file (plain bundles:
//!   what taking the bytes from the page cache costs, which hkload pays too, so that what
//!   hkload takes beyond it is its own work), and loading the module's PTX (the driver's JIT).
//!   Every repetition unloads its module; the context is created before anything is timed. Run
//!   with `CUDA_CACHE_DISABLE=1` for JIT times without the driver's compute cache.
//! * (b) Launch overhead: CPU time per launch of hkload's `Kernel::call` (the contract computes
//!   the shape and checks every extent), of its checked launch with precomputed dimensions, of the CUDA driver
//!   layer alone (packed arguments, no checks), and of raw `cuLaunchKernel` with `kernelParams`
//!   and with the packed buffer in `extra`. One-block grid, batches of launches synchronised in
//!   between (so the queue never backs up into the timing), variants interleaved so that drift
//!   hits all of them alike.
//! * (c) Hash verification: (a)'s hkload row with `verify_hashes` off.
//!
//! Reports medians with 10th and 90th percentiles, ratios against the raw calls, and whether
//! the targets ((a) ≤ 1.25×, (b) `launch` ≤ 1.05× and `call` ≤ 1.10×) are met; a missed target is reported, not an error.
//! Exits with 1 when the kernel computes wrong results, 2 on any other failure.

use std::ffi::{CStr, CString, c_void};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::ptr;
use std::sync::Arc;
use std::time::Instant;

use hk_format::index::INDEX_FILE;
use hk_format::offload::{self, OffloadBundle};
use hk_format::target::EntryId;
use hk_tests::kernels::cases_of;
use hkload::driver::cuda::sys;
use hkload::driver::{CudaDriver, Driver, ImageKind, LaunchDims, StreamHandle};
use hkload::{Arg, Bundle, Device, OpenOptions};
use rand::SeedableRng;
use rand::rngs::StdRng;

use hk_bench::timing::Stats;
use hk_tests::device_case::{CaseBuffers, Sizing, run_case};

const USAGE: &str = "usage: gpu_bench <bundle folder> [--kernel NAME]";

/// Cold starts: untimed warm-up runs, then timed repetitions (fewer for the slow PTX JIT). One
/// repetition takes under a millisecond, and with 50 the medians moved by 10% between runs.
const COLD_WARMUP: usize = 3;
const COLD_REPS: usize = 400;
const PTX_WARMUP: usize = 1;
const PTX_REPS: usize = 10;

/// Launches: one sample is the mean CPU time of a batch; batches stay far below the depth of
/// the driver's launch queue, so launches never wait for the GPU.
const LAUNCH_BATCH: usize = 256;
const LAUNCH_WARMUP: usize = 20;
const LAUNCH_ROUNDS: usize = 400;

const COLD_TARGET: f64 = 1.25;
/// Issue 31's bound on a verified cold start against the raw load of the same image.
const VERIFIED_COLD_GOAL: f64 = 1.5;
const LAUNCH_TARGET: f64 = 1.05;
const CALL_TARGET: f64 = 1.10;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("gpu_bench: {error}");
            ExitCode::from(2)
        }
    }
}

struct Options {
    bundle: PathBuf,
    kernel: Option<String>,
}

fn parse_args() -> Result<Options, String> {
    let mut bundle = None;
    let mut kernel = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--kernel" => {
                kernel = Some(
                    args.next()
                        .ok_or(format!("--kernel needs a name\n{USAGE}"))?,
                )
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ if bundle.is_none() && !arg.starts_with('-') => bundle = Some(PathBuf::from(arg)),
            _ => return Err(format!("unexpected argument `{arg}`\n{USAGE}")),
        }
    }
    Ok(Options {
        bundle: bundle.ok_or(USAGE)?,
        kernel,
    })
}

/// Turns any displayable error into the message `main` prints.
fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// Runs the benchmarks; `Ok(false)` when the kernel computes wrong results.
fn run() -> Result<bool, String> {
    let options = parse_args()?;
    let cuda = Arc::new(CudaDriver::new().map_err(text)?);
    let device = Device::new(cuda.clone(), 0).map_err(text)?;
    // The context is created here, outside every measurement.
    cuda.make_current(0).map_err(text)?;
    let (major, minor) = cuda.driver_version();
    println!(
        "device 0: {} ({}), CUDA driver {major}.{minor}",
        device.info().name,
        device.target()
    );

    let bundle = Bundle::open(&options.bundle).map_err(text)?;
    let wanted = |kernel: &str| match &options.kernel {
        Some(name) => kernel == name,
        None => bundle.table().find_kernel(kernel).is_some(),
    };
    let case = cases_of(&mut StdRng::seed_from_u64(0x5eed), wanted)
        .into_iter()
        .next()
        .ok_or_else(|| match &options.kernel {
            Some(name) => format!("hk_tests has no test case for kernel `{name}`"),
            None => "no kernel of the bundle has a test case".into(),
        })?;
    let embedded = embed(&options.bundle)?;
    let images = Images::read(&options.bundle, &embedded, &bundle, &device, &case.kernel)?;
    println!(
        "bundle {}; kernel {} ({}); module {} ({} bytes hashed when verifying)",
        options.bundle.display(),
        case.kernel,
        case.label,
        images.module,
        images.hashed_bytes
    );
    println!(
        "chosen {} ({} bytes){}",
        images.chosen_id,
        images.chosen.len(),
        match &images.ptx {
            Some((id, ptx)) => format!("; PTX {id} ({} bytes)", ptx.len()),
            None => "; the module has no PTX for this device".into(),
        }
    );

    let loaded = bundle.load(&device).map_err(text)?;
    let kernel = loaded.kernel(&case.kernel).map_err(text)?;
    let judged = run_case(&device, &kernel, &case, Sizing::Case).map_err(text)?;
    if let Err(mismatch) = judged.verdict {
        println!("check: FAIL, the kernel computes wrong results: {mismatch}");
        return Ok(false);
    }
    match judged.worst {
        Some(worst) => println!("check: the case passes (worst error {worst:.3} of tolerance)"),
        None => println!("check: the case passes (exact outputs)"),
    }

    let buffers = CaseBuffers::upload(&device, &case).map_err(text)?;
    let args = buffers.args();
    let record = bundle.kernel_record(&case.kernel).map_err(text)?;
    // (offset, size) of each argument: offsets from the code object, sizes from the signature.
    let arg_slots: Vec<(u32, u32)> = kernel
        .abi()
        .arg_offsets
        .iter()
        .zip(&record.args)
        .map(|(&offset, param)| (offset, param.ty.size()))
        .collect();
    let packed = pack(&args, &arg_slots)?;
    let setup = Setup {
        dir: &options.bundle,
        device: &device,
        cuda: &cuda,
        kernel: &case.kernel,
        symbol: CString::new(case.kernel.as_str()).map_err(text)?,
        tiny: LaunchDims {
            grid: [1, 1, 1],
            ..kernel.launch_shape(&args).map_err(text)?
        },
        args: &args,
        embedded,
        arg_slots,
        packed,
    };
    drop((kernel, loaded));

    println!("measuring (a) cold start and (c) hash verification ...");
    let cold = cold_start(&setup, &images)?;
    println!("measuring (b) launch overhead ...");
    let launches = launch_overhead(&setup, &images)?;

    println!();
    print_cold_start(&cold, &images);
    println!();
    print_launch_overhead(&launches);
    Ok(true)
}

/// What every measurement shares.
struct Setup<'a> {
    dir: &'a Path,
    device: &'a Device,
    cuda: &'a CudaDriver,
    kernel: &'a str,
    symbol: CString,
    /// The case's launch shape shrunk to one block: the cheapest launch that is still real.
    tiny: LaunchDims,
    args: &'a [Arg<'a>],
    /// Every file of the bundle folder, in memory: the bundle as a program embeds it.
    embedded: Vec<(&'static str, &'static [u8])>,
    /// `(offset, size)` of each argument in the packed buffer.
    arg_slots: Vec<(u32, u32)>,
    /// `args` packed at the kernel's offsets, as hkload hands them to the driver.
    packed: Vec<u8>,
}

/// Every file of the bundle folder `dir`, read into memory for the rest of the program, under its
/// file name: what a program that embeds the bundle holds.
fn embed(dir: &Path) -> Result<Vec<(&'static str, &'static [u8])>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(text)?.path();
        if !path.is_file() {
            continue;
        }
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .ok_or_else(|| format!("{} has a file name that is not UTF-8", dir.display()))?;
        let bytes =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        files.push((&*name.to_owned().leak(), &*bytes.leak()));
    }
    Ok(files)
}

/// The code images of the kernel's module, taken from the bundle's files for the raw calls.
struct Images {
    module: String,
    /// The entry hkload chooses for the device.
    chosen_id: EntryId,
    /// Its bytes, NUL-terminated when it is PTX.
    chosen: Vec<u8>,
    /// The module's best PTX for the device (its entry and NUL-terminated text), unless that
    /// is what hkload chooses anyway.
    ptx: Option<(EntryId, Vec<u8>)>,
    /// What verification hashes on the way to the first launch: the chosen code image and the
    /// index.
    hashed_bytes: u64,
    /// The module file and where the chosen image starts in it, when that is a cubin in a plain
    /// file (a compressed file holds no image to map, and PTX needs a NUL after it).
    mapped: Option<(PathBuf, usize)>,
}

impl Images {
    /// `files` are the folder's files as [`embed`] read them, so that nothing is read twice.
    fn read(
        dir: &Path,
        files: &[(&str, &[u8])],
        bundle: &Bundle,
        device: &Device,
        kernel: &str,
    ) -> Result<Self, String> {
        let file_bytes = |name: &str| {
            files
                .iter()
                .find(|(file, _)| *file == name)
                .map(|(_, bytes)| *bytes)
                .ok_or_else(|| format!("{} has no file {name}", dir.display()))
        };
        let table = bundle.table();
        let module = table
            .find_kernel(kernel)
            .and_then(|at| table.module(at.module))
            .ok_or_else(|| format!("the bundle has no kernel `{kernel}`"))?;
        let path = dir.join(module.file());
        let file = file_bytes(module.file())?;
        let unpacked = offload::decompress(file).map_err(text)?;
        let parsed = OffloadBundle::parse(&unpacked).map_err(text)?;
        let entry = |id: &EntryId| {
            parsed
                .entry(&id.to_string())
                .ok_or_else(|| format!("module `{}` has no entry {id}", module.name()))
        };
        let ids = module.entry_ids();
        let chosen_id = hkload::select::select(device.target(), &ids)
            .chosen()
            .map(|(id, _)| *id)
            .ok_or_else(|| format!("module `{}` has no code for the device", module.name()))?;
        let ptx_ids: Vec<EntryId> = ids
            .into_iter()
            .filter(|id| id.image_kind() == ImageKind::Ptx)
            .collect();
        let ptx_id = hkload::select::select(device.target(), &ptx_ids)
            .chosen()
            .map(|(id, _)| *id)
            .filter(|id| *id != chosen_id);
        let index_size = file_bytes(INDEX_FILE)?.len() as u64;
        let chosen = entry(&chosen_id)?;
        let chosen_record = module.entries().find(|entry| entry.id == chosen_id);
        let mapped = if offload::is_compressed(file) || chosen_id.image_kind() == ImageKind::Ptx {
            None
        } else {
            Some((path, usize::try_from(chosen.offset).map_err(text)?))
        };
        Ok(Self {
            module: module.name().to_owned(),
            chosen: image_bytes(&chosen_id, chosen),
            ptx: ptx_id
                .map(|id| entry(&id).map(|found| (id, image_bytes(&id, found))))
                .transpose()?,
            chosen_id,
            hashed_bytes: chosen_record.map_or(0, |entry| entry.size) + index_size,
            mapped,
        })
    }

    fn chosen_kind(&self) -> &'static str {
        match self.chosen_id.image_kind() {
            ImageKind::Ptx => "PTX (JIT)",
            _ => "cubin",
        }
    }
}

/// The bytes of code image `id` as the driver takes them: NUL-terminated when it is PTX.
fn image_bytes(id: &EntryId, entry: &offload::Entry<'_>) -> Vec<u8> {
    let mut bytes = entry.bytes.to_vec();
    if id.image_kind() == ImageKind::Ptx {
        bytes.push(0);
    }
    bytes
}

/// Packs `args` at the offsets and sizes of `slots`, as hkload does before calling the driver.
fn pack(args: &[Arg<'_>], slots: &[(u32, u32)]) -> Result<Vec<u8>, String> {
    if args.len() != slots.len() {
        return Err(format!(
            "the case has {} arguments, the kernel {}",
            args.len(),
            slots.len()
        ));
    }
    let size = slots
        .iter()
        .map(|&(offset, size)| offset as usize + size as usize)
        .max()
        .unwrap_or(0);
    let mut packed = vec![0u8; size];
    for (arg, slot) in args.iter().zip(slots) {
        let value = match arg {
            Arg::Buffer(buffer) | Arg::BufferMut(buffer) => buffer.ptr().0.to_le_bytes(),
            Arg::Raw(raw) => raw.ptr().0.to_le_bytes(),
            Arg::Scalar(value) => value.to_le_bytes(),
        };
        let (start, len) = (slot.0 as usize, slot.1 as usize);
        let (Some(target), Some(source)) = (packed.get_mut(start..start + len), value.get(..len))
        else {
            return Err(format!("argument slot {slot:?} does not fit 8 bytes"));
        };
        target.copy_from_slice(source);
    }
    Ok(packed)
}

/// A module loaded with raw driver calls (`cuModuleLoadData` or `cuModuleLoad`) and the kernel
/// taken from it; unloaded on drop.
struct RawModule {
    module: sys::CUmodule,
    function: sys::CUfunction,
    /// The mapped file the image was loaded from, if it was: unmapped after the module is
    /// unloaded, outside the timing, as hkload's are.
    mapped: Option<memmap2::Mmap>,
}

impl RawModule {
    /// Loads `image` (in memory, NUL-terminated if PTX) in the current context, with
    /// `cuModuleLoadData`.
    fn load(image: &[u8], symbol: &CStr) -> Result<Self, String> {
        let mut module = ptr::null_mut();
        // SAFETY: the image is a cubin or NUL-terminated PTX read from the bundle; the driver
        // rejects anything else with an error.
        cu("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut module, image.as_ptr().cast())
        })?;
        Self::with_function(module, symbol)
    }

    /// Maps the file at `path` and loads the image that starts at `offset` in it, with
    /// `cuModuleLoadData`, as hkload does with a plain bundle (without its checks).
    fn load_mapped(path: &Path, offset: usize, symbol: &CStr) -> Result<Self, String> {
        let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // SAFETY: read-only and private; nothing rewrites the bundle while the benchmark runs.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| format!("cannot map {}: {e}", path.display()))?;
        let image = map
            .get(offset..)
            .ok_or_else(|| format!("{} is shorter than {offset} bytes", path.display()))?;
        let mut loaded = Self::load(image, symbol)?;
        loaded.mapped = Some(map);
        Ok(loaded)
    }

    /// Loads the image in the file at `path` in the current context, with `cuModuleLoad`.
    fn load_file(path: &CStr, symbol: &CStr) -> Result<Self, String> {
        let mut module = ptr::null_mut();
        // SAFETY: `path` is NUL-terminated and names a file the driver reads and checks.
        cu("cuModuleLoad", unsafe {
            sys::cuModuleLoad(&mut module, path.as_ptr())
        })?;
        Self::with_function(module, symbol)
    }

    /// Takes ownership of the loaded `module` and gets the kernel `symbol` from it.
    fn with_function(module: sys::CUmodule, symbol: &CStr) -> Result<Self, String> {
        // Owned from here on, so an error below still unloads it.
        let mut loaded = Self {
            module,
            function: ptr::null_mut(),
            mapped: None,
        };
        // SAFETY: the module is live; `symbol` is NUL-terminated.
        cu("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut loaded.function, loaded.module, symbol.as_ptr())
        })?;
        Ok(loaded)
    }
}

/// A code image written to a file of its own, for `cuModuleLoad`; removed on drop.
struct ImageFile {
    path: PathBuf,
    /// `path` as the driver takes it.
    c_path: CString,
}

impl ImageFile {
    fn write(image: &[u8]) -> Result<Self, String> {
        let path = std::env::temp_dir().join(format!("gpu_bench-{}.image", std::process::id()));
        std::fs::write(&path, image)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(text)?;
        Ok(Self { path, c_path })
    }
}

impl Drop for ImageFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for RawModule {
    fn drop(&mut self) {
        // SAFETY: loaded by the driver, unloaded once; nothing launched from it is still queued
        // (every use synchronises).
        let _ = unsafe { sys::cuModuleUnload(self.module) };
    }
}

/// The arguments of a raw launch: `kernelParams` or `extra`, as `cuLaunchKernel` takes them.
#[derive(Clone, Copy)]
enum RawArgs {
    Params(*mut *mut c_void),
    Extra(*mut *mut c_void),
}

fn raw_launch(function: sys::CUfunction, dims: &LaunchDims, args: RawArgs) -> Result<(), String> {
    let (params, extra) = match args {
        RawArgs::Params(params) => (params, ptr::null_mut()),
        RawArgs::Extra(extra) => (ptr::null_mut(), extra),
    };
    let [gx, gy, gz] = dims.grid;
    let [bx, by, bz] = dims.block;
    // SAFETY: the function is live; the arguments point at the packed values of the same
    // buffers the checked launch uses, laid out as the kernel's code object says.
    cu("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            function,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            dims.shared_bytes,
            ptr::null_mut(),
            params,
            extra,
        )
    })
}

fn synchronize() -> Result<(), String> {
    // SAFETY: no pointers; the device's context is current on this thread.
    cu("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

fn cu(call: &str, result: sys::CUresult) -> Result<(), String> {
    match result {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        error => Err(format!("{call} failed: {error:?}")),
    }
}

/// The seconds one run of a variant took, split into the phases it reports.
type Phases = Vec<f64>;

/// One measured variant: a name, how often to run it, and the function that runs it once.
struct Variant<'a> {
    name: String,
    warmup: usize,
    reps: usize,
    run: Box<dyn FnMut() -> Result<Phases, String> + 'a>,
    samples: Vec<Phases>,
}

impl<'a> Variant<'a> {
    fn new(
        name: impl Into<String>,
        warmup: usize,
        reps: usize,
        run: impl FnMut() -> Result<Phases, String> + 'a,
    ) -> Self {
        Self {
            name: name.into(),
            warmup,
            reps,
            run: Box::new(run),
            samples: Vec::with_capacity(reps),
        }
    }

    /// Statistics of whole runs.
    fn stats(&self) -> Stats {
        let totals: Vec<f64> = self
            .samples
            .iter()
            .map(|phases| phases.iter().sum())
            .collect();
        Stats::of(&totals)
    }

    /// The median of each phase.
    fn phase_medians(&self) -> Vec<f64> {
        let phases = self.samples.first().map_or(0, Vec::len);
        (0..phases)
            .map(|i| {
                let times: Vec<f64> = self
                    .samples
                    .iter()
                    .filter_map(|s| s.get(i).copied())
                    .collect();
                Stats::of(&times).median
            })
            .collect()
    }
}

/// Warms every variant up, then takes their samples round by round, each round starting one
/// variant further on, so that slow drift (clocks, caches, the allocator) is shared out evenly.
fn measure(variants: &mut [Variant<'_>]) -> Result<(), String> {
    for variant in variants.iter_mut() {
        for _ in 0..variant.warmup {
            (variant.run)().map_err(|e| format!("{} (warm-up): {e}", variant.name))?;
        }
    }
    let rounds = variants.iter().map(|v| v.reps).max().unwrap_or(0);
    let count = variants.len();
    for round in 0..rounds {
        for k in 0..count {
            let variant = &mut variants[(round + k) % count];
            if variant.samples.len() < variant.reps {
                let sample = (variant.run)().map_err(|e| format!("{}: {e}", variant.name))?;
                variant.samples.push(sample);
            }
        }
    }
    Ok(())
}

struct ColdStart {
    /// Every variant's name and statistics, in the order they are measured and printed: the
    /// [`Row`]s, then the mapped row and the PTX row where there are such.
    rows: Vec<(String, Stats)>,
    /// Raw `cuModuleLoadData` of the image mapped from the bundle's module file.
    raw_mapped: Option<Stats>,
    reps: (usize, usize),
    /// Label, phase names and phase medians of each row that reports its phases.
    phases: Vec<(&'static str, &'static [&'static str], Vec<f64>)>,
}

impl ColdStart {
    fn stats(&self, row: Row) -> Stats {
        self.rows[row as usize].1
    }
}

/// The cold-start rows every run has, in the order they are measured and printed, which is
/// also their place in [`ColdStart::rows`].
#[derive(Clone, Copy)]
enum Row {
    VerifyOn,
    VerifyOff,
    /// hkload (verify off) with the bundle embedded.
    Embedded,
    Raw,
    RawFile,
}

impl Row {
    const ALL: [Row; 5] = [
        Row::VerifyOn,
        Row::VerifyOff,
        Row::Embedded,
        Row::Raw,
        Row::RawFile,
    ];

    /// The label of the row's phase medians and the names of its phases, for the rows whose
    /// phases are printed.
    fn phases(self) -> Option<(&'static str, &'static [&'static str])> {
        match self {
            Row::VerifyOn => Some(("hkload, verify on:", &HKLOAD_PHASES)),
            Row::VerifyOff => Some(("hkload, verify off:", &HKLOAD_PHASES)),
            Row::Embedded => Some(("hkload embedded:", &HKLOAD_PHASES)),
            Row::Raw => Some(("raw:", &RAW_PHASES)),
            Row::RawFile => None,
        }
    }
}

const HKLOAD_PHASES: [&str; 4] = [
    "open (index)",
    "choose code objects",
    "load module (map, extract, verify, load)",
    "first launch + synchronise",
];
const RAW_PHASES: [&str; 2] = ["load module", "first launch + synchronise"];

fn cold_start(setup: &Setup<'_>, images: &Images) -> Result<ColdStart, String> {
    let mut param_pointers = kernel_params(setup);
    let params = RawArgs::Params(param_pointers.as_mut_ptr());
    let file = &ImageFile::write(&images.chosen)?;
    let cold = (COLD_WARMUP, COLD_REPS);
    let kind = images.chosen_kind();
    let mut variants: Vec<Variant<'_>> = Row::ALL
        .map(|row| match row {
            Row::VerifyOn => hkload_variant(setup, "hkload, verify on", Source::Folder, true),
            Row::VerifyOff => hkload_variant(setup, "hkload, verify off", Source::Folder, false),
            Row::Embedded => hkload_variant(
                setup,
                "hkload embedded, verify off",
                Source::Embedded,
                false,
            ),
            Row::Raw => raw_variant(
                setup,
                params,
                format!("raw cuModuleLoadData, {kind}"),
                cold,
                move || RawModule::load(&images.chosen, &setup.symbol),
            ),
            Row::RawFile => raw_variant(
                setup,
                params,
                format!("raw cuModuleLoad, {kind} file"),
                cold,
                move || RawModule::load_file(&file.c_path, &setup.symbol),
            ),
        })
        .into();
    // The mapped row, where there is one, follows the fixed rows.
    variants.extend(images.mapped.as_ref().map(|(path, offset)| {
        raw_variant(
            setup,
            params,
            format!("raw cuModuleLoadData, {kind} mapped"),
            cold,
            || RawModule::load_mapped(path, *offset, &setup.symbol),
        )
    }));
    variants.extend(images.ptx.as_ref().map(|(_, ptx)| {
        let name = "raw cuModuleLoadData, PTX (JIT)".to_owned();
        raw_variant(setup, params, name, (PTX_WARMUP, PTX_REPS), || {
            RawModule::load(ptx, &setup.symbol)
        })
    }));
    measure(&mut variants)?;
    Ok(ColdStart {
        rows: variants
            .iter()
            .map(|variant| (variant.name.clone(), variant.stats()))
            .collect(),
        raw_mapped: images
            .mapped
            .is_some()
            .then(|| variants[Row::ALL.len()].stats()),
        reps: (COLD_REPS, PTX_REPS),
        phases: Row::ALL
            .into_iter()
            .filter_map(|row| {
                let (label, names) = row.phases()?;
                Some((label, names, variants[row as usize].phase_medians()))
            })
            .collect(),
    })
}

/// A cold-start variant through hkload, as [`hkload_cold_start`] times it.
fn hkload_variant<'a>(
    setup: &'a Setup<'_>,
    name: &str,
    source: Source,
    verify_hashes: bool,
) -> Variant<'a> {
    Variant::new(name, COLD_WARMUP, COLD_REPS, move || {
        hkload_cold_start(setup, source, verify_hashes)
    })
}

/// A cold-start variant that loads the module with `load` (raw driver calls) and launches the
/// kernel once, as [`raw_cold_start`] times it.
fn raw_variant<'a>(
    setup: &'a Setup<'_>,
    params: RawArgs,
    name: String,
    (warmup, reps): (usize, usize),
    load: impl Fn() -> Result<RawModule, String> + 'a,
) -> Variant<'a> {
    Variant::new(name, warmup, reps, move || {
        raw_cold_start(setup, &load, params)
    })
}

/// Where a cold start through hkload finds the bundle.
#[derive(Clone, Copy)]
enum Source {
    /// The bundle folder, [`Setup::dir`].
    Folder,
    /// The folder's files in memory, [`Setup::embedded`].
    Embedded,
}

/// Seconds to open the bundle and run the kernel once through hkload, in [`HKLOAD_PHASES`].
fn hkload_cold_start(
    setup: &Setup<'_>,
    source: Source,
    verify_hashes: bool,
) -> Result<Phases, String> {
    let options = OpenOptions {
        verify_hashes,
        ..OpenOptions::DEFAULT
    };
    let mut lap = Lap::start();
    let bundle = match source {
        Source::Folder => Bundle::open_with(setup.dir, options),
        Source::Embedded => Bundle::from_bytes(&setup.embedded, options),
    }
    .map_err(text)?;
    lap.split();
    let loaded = bundle.load(setup.device).map_err(text)?;
    lap.split();
    let kernel = loaded.kernel(setup.kernel).map_err(text)?;
    lap.split();
    // The case is the first of its kernel: a one-block grid, as the raw variants launch.
    kernel
        .call(StreamHandle::DEFAULT, setup.args)
        .map_err(text)?;
    setup.device.synchronize().map_err(text)?;
    lap.split();
    // Unloads the module, outside the timing as for the raw variants.
    drop((kernel, loaded, bundle));
    Ok(lap.phases)
}

/// Seconds to load a module with `load` (raw driver calls) and run the kernel once, in
/// [`RAW_PHASES`].
fn raw_cold_start(
    setup: &Setup<'_>,
    load: impl FnOnce() -> Result<RawModule, String>,
    params: RawArgs,
) -> Result<Phases, String> {
    let mut lap = Lap::start();
    let module = load()?;
    lap.split();
    raw_launch(module.function, &setup.tiny, params)?;
    synchronize()?;
    lap.split();
    drop(module);
    Ok(lap.phases)
}

/// A stopwatch that records the time since the last split.
struct Lap {
    last: Instant,
    phases: Phases,
}

impl Lap {
    fn start() -> Self {
        Self {
            last: Instant::now(),
            phases: Vec::with_capacity(4),
        }
    }

    fn split(&mut self) {
        let now = Instant::now();
        self.phases.push((now - self.last).as_secs_f64());
        self.last = now;
    }
}

/// `kernelParams` for the packed arguments: a pointer to each argument's bytes.
fn kernel_params(setup: &Setup<'_>) -> Vec<*mut c_void> {
    setup
        .arg_slots
        .iter()
        .map(|&(offset, _)| {
            setup
                .packed
                .as_ptr()
                .wrapping_add(offset as usize)
                .cast_mut()
                .cast()
        })
        .collect()
}

struct LaunchOverhead {
    call: Stats,
    hkload: Stats,
    driver: Stats,
    raw_params: Stats,
    raw_extra: Stats,
    /// Device time per launch of the raw batch, from CUDA events.
    device_per_launch: f64,
}

fn launch_overhead(setup: &Setup<'_>, images: &Images) -> Result<LaunchOverhead, String> {
    // The same kernel three ways: through hkload, through the driver layer, and raw.
    let bundle = Bundle::open(setup.dir).map_err(text)?;
    let loaded = bundle.load(setup.device).map_err(text)?;
    let kernel = loaded.kernel(setup.kernel).map_err(text)?;
    let module = setup
        .cuda
        .load_module(0, images.chosen_id.image_kind(), &images.chosen)
        .map_err(text)?;
    let function = setup.cuda.function(module, setup.kernel).map_err(text)?;
    let raw = RawModule::load(&images.chosen, &setup.symbol)?;

    let mut param_pointers = kernel_params(setup);
    let params = RawArgs::Params(param_pointers.as_mut_ptr());
    let mut size = setup.packed.len();
    let mut extra = [
        sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
        setup.packed.as_ptr().cast_mut().cast(),
        sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
        (&raw mut size).cast(),
        sys::CU_LAUNCH_PARAM_END_AS_INT as usize as *mut c_void,
    ];
    let extra = RawArgs::Extra(extra.as_mut_ptr());

    /// The mean time per launch of one batch of `launch`, after the queue has drained.
    fn batch(mut launch: impl FnMut() -> Result<(), String>) -> Result<Phases, String> {
        synchronize()?;
        let start = Instant::now();
        for _ in 0..LAUNCH_BATCH {
            launch()?;
        }
        Ok(vec![start.elapsed().as_secs_f64() / LAUNCH_BATCH as f64])
    }
    let dims = &setup.tiny;
    let mut variants = vec![
        Variant::new(
            "hkload Kernel::call (contract)",
            LAUNCH_WARMUP,
            LAUNCH_ROUNDS,
            || batch(|| kernel.call(StreamHandle::DEFAULT, setup.args).map_err(text)),
        ),
        Variant::new(
            "hkload Kernel::launch (checked)",
            LAUNCH_WARMUP,
            LAUNCH_ROUNDS,
            || {
                batch(|| {
                    // SAFETY: the buffers outlive every launch; all are synchronised below.
                    unsafe { kernel.launch(dims, StreamHandle::DEFAULT, setup.args) }.map_err(text)
                })
            },
        ),
        Variant::new(
            "CudaDriver::launch (packed)",
            LAUNCH_WARMUP,
            LAUNCH_ROUNDS,
            || {
                batch(|| {
                    setup
                        .cuda
                        .launch(function, dims, StreamHandle::DEFAULT, &setup.packed)
                        .map_err(text)
                })
            },
        ),
        Variant::new(
            "raw cuLaunchKernel, kernelParams",
            LAUNCH_WARMUP,
            LAUNCH_ROUNDS,
            || batch(|| raw_launch(raw.function, dims, params)),
        ),
        Variant::new(
            "raw cuLaunchKernel, extra buffer",
            LAUNCH_WARMUP,
            LAUNCH_ROUNDS,
            || batch(|| raw_launch(raw.function, dims, extra)),
        ),
    ];
    measure(&mut variants)?;
    let (launched, device_time) = setup
        .cuda
        .time_on_device(0, StreamHandle::DEFAULT, || {
            (0..LAUNCH_BATCH).try_for_each(|_| raw_launch(raw.function, dims, params))
        })
        .map_err(text)?;
    launched?;
    synchronize()?;
    let stats: Vec<Stats> = variants.iter().map(Variant::stats).collect();
    drop(variants);
    setup.cuda.unload_module(module).map_err(text)?;
    Ok(LaunchOverhead {
        call: stats[0],
        hkload: stats[1],
        driver: stats[2],
        raw_params: stats[3],
        raw_extra: stats[4],
        device_per_launch: device_time.as_secs_f64() / LAUNCH_BATCH as f64,
    })
}

fn print_cold_start(cold: &ColdStart, images: &Images) {
    let median = |row| cold.stats(row).median;
    println!(
        "(a) cold start: open + select + load module + first launch + synchronise; median of {} \
         ({} for PTX), module unloaded between repetitions, context created beforehand",
        cold.reps.0, cold.reps.1
    );
    let jit_cache = match std::env::var("CUDA_CACHE_DISABLE").as_deref() {
        Ok("1") => "PTX JIT cache disabled (CUDA_CACHE_DISABLE=1): every PTX load compiles",
        _ => "PTX JIT cache enabled: PTX loads after the first may be served from it",
    };
    println!("    {jit_cache}");
    let header = format!(
        "    {:<38} {:>10} {:>10} {:>10} {:>9}",
        "variant", "median", "p10", "p90", "vs raw"
    );
    println!("{header}");
    let row = |name: &str, stats: Stats| {
        println!(
            "    {name:<38} {:>10} {:>10} {:>10} {:>8.2}x",
            seconds(stats.median),
            seconds(stats.p10),
            seconds(stats.p90),
            stats.median / median(Row::Raw)
        )
    };
    for (name, stats) in &cold.rows {
        row(name, *stats);
    }
    let split = |names: &[&str], medians: &[f64]| {
        let parts: Vec<String> = names
            .iter()
            .zip(medians)
            .map(|(name, &median)| format!("{name} {}", seconds(median)))
            .collect();
        parts.join(", ")
    };
    println!("    where the time goes (phase medians):");
    for (label, names, medians) in &cold.phases {
        println!("      {label:<19} {}", split(names, medians));
    }
    for (name, stats) in [
        ("verify off", cold.stats(Row::VerifyOff)),
        ("verify on", cold.stats(Row::VerifyOn)),
    ] {
        let ratio = stats.median / median(Row::Raw);
        println!(
            "    target (a): hkload ({name}) <= {COLD_TARGET:.2}x raw {}: {ratio:.2}x, {}",
            images.chosen_kind(),
            verdict(ratio <= COLD_TARGET)
        );
    }
    // Issue 31's goal for the default (verified) open: open + select + verified load + first
    // launch within 1.5x of the raw load of the same bytes.
    let verified = median(Row::VerifyOn) / median(Row::Raw);
    println!(
        "    VERIFIED COLD START: hkload (verify on) / raw cuModuleLoadData {}: {verified:.2}x \
         (issue 31 goal <= {VERIFIED_COLD_GOAL:.2}x: {})",
        images.chosen_kind(),
        verdict(verified <= VERIFIED_COLD_GOAL)
    );
    println!(
        "    beside it: hkload with the bundle embedded (verify off) / raw {}: {:.2}x (no \
         target; the bundle's bytes are in memory, as the raw row's image is)",
        images.chosen_kind(),
        median(Row::Embedded) / median(Row::Raw)
    );
    println!(
        "    beside it: hkload (verify off) / raw cuModuleLoad of the file: {:.2}x (no target; \
         the file is read from the page cache, as hkload's are)",
        median(Row::VerifyOff) / median(Row::RawFile)
    );
    if let Some(mapped) = cold.raw_mapped {
        println!(
            "    beside it: hkload (verify off) / raw cuModuleLoadData of the image mapped from \
             the bundle file: {:.2}x, {} more (no target; hkload's own work: the index, the \
             choice, the kernel's record and checks)",
            median(Row::VerifyOff) / mapped.median,
            seconds(median(Row::VerifyOff) - mapped.median)
        );
    }
    println!(
        "(c) hash verification: {} per open + first kernel ({:.2}x verify off), hashing {} \
         bytes (the code image and the index) with BLAKE3",
        seconds(median(Row::VerifyOn) - median(Row::VerifyOff)),
        median(Row::VerifyOn) / median(Row::VerifyOff),
        images.hashed_bytes,
    );
}

fn print_launch_overhead(launch: &LaunchOverhead) {
    println!(
        "(b) launch overhead: CPU time per launch, one-block grid, median of {LAUNCH_ROUNDS} \
         batches of {LAUNCH_BATCH} ({} launches per variant)",
        LAUNCH_ROUNDS * LAUNCH_BATCH
    );
    println!(
        "    {:<38} {:>10} {:>10} {:>10} {:>9}",
        "variant", "median", "p10", "p90", "vs raw"
    );
    let base = launch.raw_params.median;
    let rows = [
        ("hkload Kernel::call (contract)", launch.call),
        ("hkload Kernel::launch (checked)", launch.hkload),
        ("CudaDriver::launch (packed)", launch.driver),
        ("raw cuLaunchKernel, kernelParams", launch.raw_params),
        ("raw cuLaunchKernel, extra buffer", launch.raw_extra),
    ];
    for (name, stats) in rows {
        println!(
            "    {name:<38} {:>10} {:>10} {:>10} {:>8.3}x",
            seconds(stats.median),
            seconds(stats.p10),
            seconds(stats.p90),
            stats.median / base
        );
    }
    println!(
        "    where the time goes: the contract (requirements, shape, extents) {}, hkload's \
         checks and packing {}, the driver layer (lookup, context check) {}, extra buffer \
         instead of kernelParams {}",
        seconds(launch.call.median - launch.hkload.median),
        seconds(launch.hkload.median - launch.driver.median),
        seconds(launch.driver.median - launch.raw_extra.median),
        seconds(launch.raw_extra.median - launch.raw_params.median)
    );
    println!(
        "    device time per launch (CUDA events, raw batch): {}",
        seconds(launch.device_per_launch)
    );
    let ratio = launch.hkload.median / base;
    println!(
        "    target (b): Kernel::launch <= {LAUNCH_TARGET:.2}x raw cuLaunchKernel (kernelParams): \
         {ratio:.3}x, {}",
        verdict(ratio <= LAUNCH_TARGET)
    );
    let ratio = launch.call.median / base;
    println!(
        "    target (b'): Kernel::call <= {CALL_TARGET:.2}x raw cuLaunchKernel (kernelParams): \
         {ratio:.3}x, {}",
        verdict(ratio <= CALL_TARGET)
    );
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// A time for people: `812 ns`, `3.41 µs`, `1.205 ms`; signed, since differences can be.
fn seconds(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude < 1e-6 {
        format!("{:.0} ns", value * 1e9)
    } else if magnitude < 1e-3 {
        format!("{:.2} µs", value * 1e6)
    } else if magnitude < 1.0 {
        format!("{:.3} ms", value * 1e3)
    } else {
        format!("{value:.3} s")
    }
}
