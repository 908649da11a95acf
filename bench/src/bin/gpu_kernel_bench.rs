//! The kernel speed benchmark: the kernels of [`workload::WORKLOADS`], launched through hkload
//! on CUDA device 0 and timed with CUDA events, printed as JSON lines for
//! `bench/python/kernel_bench.py`, which times PyTorch on the same shapes in the same run and
//! makes the table.
//!
//! ```text
//! gpu_kernel_bench <bundle folder> [--iters N] [--only KERNEL[,KERNEL...]] [--dump DIR]
//! gpu_kernel_bench <bundle folder> --list [--iters N] [--only KERNEL[,KERNEL...]]
//! ```
//!
//! What a shape runs: the call its kernel family's tests describe ([`Workload::call`], from
//! [`hk_tests::kernels`]) at the shape's sizes, every buffer exactly as long as the kernel's
//! contract computes for that call ([`Kernel::extents`]).
//!
//! How a shape is timed:
//! * Its inputs rotate over `sets` copies that together hold at least
//!   [`workload::ROTATION_BYTES`] (five times the 50 MB L2 of an H100), so no launch finds its
//!   data in the cache. The small shared parameters ([`workload::SHARED`]: norm weights, RoPE
//!   tables) stay in one copy, as they would in a model, and so do the outputs: PyTorch's
//!   caching allocator hands each iteration the block the last one freed, so both sides write
//!   to one buffer over and over.
//! * [`WARMUP`] untimed launches, then `--iters` timed ones (default [`DEFAULT_ITERS`], at least
//!   [`MIN_ITERS`]), each between two CUDA events, queued in chunks behind a gate so that the
//!   GPU never waits for the host ([`hk_bench::events`]); the median, 10th and 90th percentiles
//!   of the per-launch times are reported.
//! * Before timing, the first (smallest) shape of each kernel is checked with its family's test
//!   case at that size ([`Workload::case`]): fresh random inputs, outputs poisoned, compared
//!   with the f64 reference within the tolerances the parity suite uses. `--dump DIR` writes
//!   that case's inputs and outputs there as raw little-endian files, for the script to compare
//!   with PyTorch.
//!
//! Output, one JSON object a line on stdout ([`Record`]): a `device` record, a `kernel` record
//! per shape (with `error` set when that shape failed; the others still run) and a `summary`
//! record. Progress goes to stderr. `--list` prints the `kernel` records without timing: it
//! sizes the buffers on a simulated device of the bundle's first NVIDIA target (hkload's
//! recording driver) and needs no GPU. Exits with 1 when a shape or a check failed, 2 when the
//! benchmark could not start.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use half::bf16;
use hk_bench::events::{Timer, Timing};
use hk_bench::workload::{
    self, Check, DEFAULT_ITERS, Dumped, KernelRecord, MIN_ITERS, Record, Tensor, WARMUP, Workload,
};
use hk_format::abi::ScalarValue;
use hk_tests::case::{CallArg, CaseArg};
use hk_tests::device_case::{CaseBuffers, judge, launch_case};
use hk_tests::host::encode;
use hkload::driver::{CudaDriver, DevicePtr, StreamHandle};
use hkload::{Arg, Bundle, Device, DeviceBuffer, Kernel, RawPointer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const USAGE: &str = "usage: gpu_kernel_bench <bundle folder> [--iters N] [--only KERNEL[,KERNEL...]] \
                     [--dump DIR]\n       gpu_kernel_bench <bundle folder> --list [--iters N] \
                     [--only KERNEL[,...]]";

/// Seed of the inputs, so that two runs time the same data.
const NOISE_SEED: u64 = 0x6b65_726e_656c;
/// Distinct noise values; not a power of two, so the copies of a tensor (a power of two in
/// size, or near) do not repeat one another.
const NOISE_VALUES: usize = (1 << 24) + 43;
/// Values between the places in the noise where two arguments' tensors start, so that `x` and
/// `residual` differ.
const NOISE_STRIDE: usize = 7_919_999;
/// Seed of the checked test cases' inputs.
const CASE_SEED: u64 = 0x636865636b;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("gpu_kernel_bench: {error}");
            ExitCode::from(2)
        }
    }
}

struct Options {
    bundle: PathBuf,
    list: bool,
    iters: usize,
    only: Option<Vec<String>>,
    dump: Option<PathBuf>,
}

fn parse_args() -> Result<Options, String> {
    let mut bundle = None;
    let mut options = Options {
        bundle: PathBuf::new(),
        list: false,
        iters: DEFAULT_ITERS,
        only: None,
        dump: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--list" => options.list = true,
            "--iters" => {
                let value = value("--iters")?;
                options.iters = value
                    .parse()
                    .ok()
                    .filter(|&n| n >= MIN_ITERS)
                    .ok_or(format!(
                        "--iters takes a whole number of at least {MIN_ITERS}, not `{value}`"
                    ))?;
            }
            "--only" => {
                let names = value("--only")?.split(',').map(str::to_owned).collect();
                options.only = Some(names);
            }
            "--dump" => options.dump = Some(PathBuf::from(value("--dump")?)),
            "-h" | "--help" => return Err(USAGE.into()),
            _ if bundle.is_none() && !arg.starts_with('-') => bundle = Some(PathBuf::from(arg)),
            _ => return Err(format!("unexpected argument `{arg}`\n{USAGE}")),
        }
    }
    options.bundle = bundle.ok_or(USAGE)?;
    Ok(options)
}

/// Turns any displayable error into the message a record or `main` prints.
fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// Runs the benchmark; `Ok(false)` when a shape or a check failed.
fn run() -> Result<bool, String> {
    let options = parse_args()?;
    let workloads = workload::selected(options.only.as_deref())?;
    let bundle = Bundle::open(&options.bundle).map_err(text)?;
    if options.list {
        return list(&bundle, &workloads, options.iters);
    }

    let cuda = Arc::new(CudaDriver::new().map_err(text)?);
    let device = Device::new(cuda.clone(), 0).map_err(text)?;
    // The context is created here, outside every measurement.
    cuda.make_current(0).map_err(text)?;
    let loaded = bundle.load(&device).map_err(text)?;
    if let Some(dir) = &options.dump {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the dump folder {}: {e}", dir.display()))?;
    }
    let timer = Timer::new(&cuda, &device)?;
    let (major, minor) = cuda.driver_version();
    let record = Record::Device {
        name: device.info().name.clone(),
        target: device.target().to_string(),
        driver: format!("{major}.{minor}"),
        bundle: options.bundle.display().to_string(),
    };
    println!("{}", record.line());
    eprintln!("making the input noise ...");
    let noise = Noise::new(&mut StdRng::seed_from_u64(NOISE_SEED), NOISE_VALUES);

    let bench = Bench {
        device: &device,
        timer: &timer,
        noise: &noise,
        iters: options.iters,
        dump: options.dump.as_deref(),
    };
    let mut checked = HashSet::new();
    let mut failed = 0usize;
    for &workload in &workloads {
        eprintln!("{} {} ...", workload.kernel(), workload.shape());
        let check = checked.insert(workload.kernel());
        let (record, ok) = match workload::sized(&loaded, workload) {
            Ok((kernel, tensors)) => bench.measure(&kernel, workload, &tensors, check),
            Err(error) => (KernelRecord::failed(workload, options.iters, error), false),
        };
        failed += usize::from(!ok);
        println!("{}", Record::Kernel(record).line());
    }
    let summary = Record::Summary {
        shapes: workloads.len(),
        failed,
    };
    println!("{}", summary.line());
    Ok(failed == 0)
}

/// `--list`: the records of `workloads` without measurements, sized on a simulated device.
fn list(bundle: &Bundle, workloads: &[Workload], iters: usize) -> Result<bool, String> {
    let device = workload::simulated_device(bundle)?;
    let loaded = bundle.load(&device).map_err(text)?;
    let mut ok = true;
    for &workload in workloads {
        let record = match workload::sized(&loaded, workload) {
            Ok((_, tensors)) => KernelRecord::new(workload, &tensors, iters),
            Err(error) => {
                ok = false;
                KernelRecord::failed(workload, iters, error)
            }
        };
        println!("{}", Record::Kernel(record).line());
    }
    Ok(ok)
}

// ---- Inputs on the host and on the device -----------------------------------------------------

/// Random bf16 values in [-2, 2), made once; every tensor is cut from them, starting at its own
/// place and wrapping around.
struct Noise {
    bytes: Vec<u8>,
}

impl Noise {
    /// `values` of them, drawn from `rng`.
    fn new(rng: &mut impl Rng, values: usize) -> Self {
        let bytes = (0..values.max(1))
            .flat_map(|_| bf16::from_f64(rng.random_range(-2.0..2.0)).to_le_bytes())
            .collect();
        Self { bytes }
    }

    /// `len` bytes of noise starting `start` values in.
    fn take(&self, start: usize, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut from = start * 2 % self.bytes.len();
        while out.len() < len {
            let piece = self.bytes.get(from..).unwrap_or(&[]);
            let piece = piece.get(..len - out.len()).unwrap_or(piece);
            out.extend_from_slice(piece);
            from = 0;
        }
        out
    }
}

/// A shape's launch arguments on the device: `sets` copies of each rotated tensor.
struct DeviceTensors {
    args: Vec<Placed>,
}

/// One launch argument on the device.
enum Placed {
    Tensor {
        buffer: DeviceBuffer,
        /// Bytes from one copy to the next; 0 for a tensor shared by every set.
        stride: u64,
        mutable: bool,
    },
    Scalar(ScalarValue),
}

impl DeviceTensors {
    /// Allocates `sets` copies of every rotated tensor of `workload`'s call (one of the
    /// others) and fills those the kernel reads: with the values of a table
    /// ([`Workload::table`]) or with noise, each tensor from its own place in it. What the
    /// kernel only writes is left as it is.
    fn place(
        device: &Device,
        workload: Workload,
        tensors: &[Option<Tensor>],
        sets: usize,
        noise: &Noise,
    ) -> Result<Self, String> {
        let call = workload.call();
        let mut args = Vec::with_capacity(tensors.len());
        for (index, (arg, tensor)) in call.args.iter().zip(tensors).enumerate() {
            // `tensors` has a buffer where the call has one.
            let Some(tensor) = tensor else {
                if let CallArg::Scalar(value) = *arg {
                    args.push(Placed::Scalar(value));
                }
                continue;
            };
            let copies = if tensor.rotated { sets } else { 1 };
            let len = tensor.len.checked_mul(copies).ok_or_else(|| {
                format!(
                    "{copies} copies of `{}` overflow the address space",
                    tensor.name
                )
            })?;
            let buffer = device.alloc(tensor.elem, len).map_err(|e| {
                format!(
                    "allocating {copies} copies of `{}` ({} MB): {e}",
                    tensor.name,
                    tensor.bytes() * copies as u64 / 1_000_000
                )
            })?;
            if tensor.reads {
                let bytes = match workload.table(tensor.name) {
                    Some(values) => encode(tensor.elem, &values),
                    None if tensor.elem == workload::ELEM => {
                        noise.take(index * NOISE_STRIDE, tensor.bytes() as usize * copies)
                    }
                    None => {
                        return Err(format!("no noise of {} for `{}`", tensor.elem, tensor.name));
                    }
                };
                buffer.write(&bytes).map_err(text)?;
            }
            args.push(Placed::Tensor {
                buffer,
                stride: if copies > 1 { tensor.bytes() } else { 0 },
                mutable: tensor.writes,
            });
        }
        Ok(Self { args })
    }

    /// The launch arguments of copy `set`.
    fn args(&self, set: usize) -> Vec<Arg<'_>> {
        self.args
            .iter()
            .map(|arg| match arg {
                Placed::Tensor {
                    buffer,
                    stride,
                    mutable,
                } => {
                    let len = match *stride {
                        0 => buffer.len(),
                        copy_bytes => copy_bytes as usize / buffer.elem().size() as usize,
                    };
                    // SAFETY: copy `set` of the tensor is `len` elements of `buffer`, which
                    // outlives every launch made with it (`time` synchronises before dropping).
                    Arg::Raw(unsafe {
                        RawPointer::new(
                            DevicePtr(buffer.ptr().0 + set as u64 * stride),
                            buffer.device(),
                            buffer.elem(),
                            len,
                            *mutable,
                        )
                    })
                }
                Placed::Scalar(value) => Arg::Scalar(*value),
            })
            .collect()
    }
}

// ---- Checking and timing one shape -------------------------------------------------------------

/// What every shape's measurement shares.
struct Bench<'a> {
    device: &'a Device,
    timer: &'a Timer<'a>,
    noise: &'a Noise,
    iters: usize,
    dump: Option<&'a Path>,
}

impl Bench<'_> {
    /// Checks (when `check`) and times one shape; the record and whether all went well. A
    /// failure is written into the record, never returned: the next shape still runs.
    fn measure(
        &self,
        kernel: &Kernel,
        workload: Workload,
        tensors: &[Option<Tensor>],
        check: bool,
    ) -> (KernelRecord, bool) {
        let mut record = KernelRecord::new(workload, tensors, self.iters);
        let mut ok = true;
        if check {
            let checked = self.check(kernel, workload).unwrap_or_else(|error| Check {
                case: String::new(),
                passed: false,
                worst: None,
                problem: Some(error),
                dump: Vec::new(),
            });
            ok &= checked.passed;
            record.check = Some(checked);
        }
        match self.time(kernel, workload, tensors, record.sets) {
            Ok(timing) => {
                record.median_us = Some(timing.median_us);
                record.p10_us = Some(timing.p10_us);
                record.p90_us = Some(timing.p90_us);
            }
            Err(error) => {
                ok = false;
                record.error = Some(error);
            }
        }
        (record, ok)
    }

    /// The family's test case at the shape: one launch on fresh buffers with poisoned outputs,
    /// judged against the f64 reference.
    fn check(&self, kernel: &Kernel, workload: Workload) -> Result<Check, String> {
        eprintln!("  checking against the f64 reference ...");
        let case = workload.case(&mut StdRng::seed_from_u64(CASE_SEED));
        if case.call() != workload.call() {
            return Err(format!("the test case calls {:?}", case.call()));
        }
        let buffers = CaseBuffers::upload(self.device, &case).map_err(text)?;
        launch_case(kernel, &case, &buffers.args()).map_err(text)?;
        self.device.synchronize().map_err(text)?;
        let outputs = buffers.outputs().map_err(text)?;
        let judged = judge(&case, &outputs);
        let mut dump = Vec::new();
        for (arg, got) in case.args.iter().zip(&outputs) {
            let (name, elem, before) = match arg {
                CaseArg::Input { name, elem, data } => (name, elem, Some(data)),
                CaseArg::InOut {
                    name, elem, data, ..
                } => (name, elem, Some(data)),
                CaseArg::Output { name, elem, .. } => (name, elem, None),
                CaseArg::Scalar(_) => continue,
            };
            for (stage, values) in [("in", before), ("out", got.as_ref())] {
                if let Some(values) = values {
                    dump.extend(self.dump(
                        workload,
                        name,
                        elem.name(),
                        stage,
                        &encode(*elem, values),
                    )?);
                }
            }
        }
        Ok(Check {
            case: case.label,
            passed: judged.verdict.is_ok(),
            worst: judged.worst,
            problem: judged.verdict.err().map(|mismatch| mismatch.to_string()),
            dump,
        })
    }

    /// Writes one tensor of the check to the `--dump` folder; its entry, if it did.
    fn dump(
        &self,
        workload: Workload,
        tensor: &'static str,
        dtype: &'static str,
        stage: &'static str,
        bytes: &[u8],
    ) -> Result<Option<Dumped>, String> {
        let Some(dir) = self.dump else {
            return Ok(None);
        };
        let path = dir.join(format!("{}.{tensor}.{stage}.bin", workload.kernel()));
        std::fs::write(&path, bytes)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(Some(Dumped {
            tensor,
            dtype,
            stage,
            path: path.display().to_string(),
        }))
    }

    /// Warm-up and timed launches over `sets` rotating copies of the shape's tensors.
    fn time(
        &self,
        kernel: &Kernel,
        workload: Workload,
        tensors: &[Option<Tensor>],
        sets: usize,
    ) -> Result<Timing, String> {
        let placed = DeviceTensors::place(self.device, workload, tensors, sets, self.noise)?;
        let args: Vec<Vec<Arg<'_>>> = (0..sets).map(|set| placed.args(set)).collect();
        let launch = |i: usize| {
            let args = args.get(i % sets).map_or(&[][..], Vec::as_slice);
            kernel.call(StreamHandle::DEFAULT, args).map_err(text)
        };
        let timing = self.timer.time(launch, WARMUP, self.iters);
        // Every launch is done before `placed` is freed, also after an error.
        let _ = self.device.synchronize();
        timing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hk_tests::host::decode;

    #[test]
    fn noise_wraps_around() {
        let noise = Noise::new(&mut StdRng::seed_from_u64(1), 3);
        let all = noise.take(0, 6);
        assert_eq!(noise.take(2, 8), [&all[4..], &all[..], &all[..0]].concat());
        assert_eq!(noise.take(4, 2), all[2..4]);
        let values = decode(workload::ELEM, &all);
        assert!(values.iter().all(|v| (-2.0..2.0).contains(v)), "{values:?}");
    }
}
