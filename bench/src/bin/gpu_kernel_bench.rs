//! The kernel speed benchmark: the kernels of [`WORKLOADS`], launched through hkload on CUDA
//! device 0 and timed with CUDA events, printed as JSON lines for `scripts/kernel_bench.py`,
//! which times PyTorch on the same shapes in the same run and makes the table.
//!
//! ```text
//! gpu_kernel_bench <bundle folder> [--iters N] [--only KERNEL[,KERNEL...]] [--dump DIR]
//! gpu_kernel_bench --list [--iters N] [--only KERNEL[,KERNEL...]]
//! ```
//!
//! How a shape is timed:
//! * Its inputs rotate over `sets` copies that together hold at least [`ROTATION_BYTES`] (five
//!   times the 50 MB L2 of an H100), so no launch finds its data in the cache. The small shared
//!   parameters (norm weights, RoPE tables) stay in one copy, as they would in a model, and so
//!   do the outputs: PyTorch's caching allocator hands each iteration the block the last one
//!   freed, so both sides write to one buffer over and over.
//! * [`WARMUP`] untimed launches, then `--iters` timed ones (default [`DEFAULT_ITERS`], at least
//!   [`MIN_ITERS`]), each between two CUDA events; the median, 10th and 90th percentiles of the
//!   per-launch times are reported.
//! * The launches are queued in chunks of [`CHUNK`] behind a [`Gate`]: the stream waits on a
//!   word of host memory that the host sets once the whole chunk is queued. The GPU then never
//!   waits for the host, and an event pair measures the kernel (and the gap between two queued
//!   kernels), not the host's launch latency; nothing else runs on the GPU, so no cache is
//!   touched in between.
//! * Before timing, the first (smallest) shape of each kernel is launched once on fresh buffers
//!   with poisoned outputs and compared with the f64 reference of [`hk_tests::kernels`]
//!   (‖out − ref‖ / ‖ref‖ at most [`CHECK_LIMIT`]). `--dump DIR` writes that launch's inputs and
//!   outputs there as raw little-endian files, for the script to compare with PyTorch.
//!
//! Output, one JSON object a line on stdout: a `device` record, a `kernel` record per shape
//! (with `error` set when that shape failed; the others still run) and a `summary` record.
//! Progress goes to stderr. `--list` prints the `kernel` records without timing and needs no
//! GPU. Exits with 1 when a shape or a check failed, 2 when the benchmark could not start.

use std::cell::Cell;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use half::bf16;
use hk_bench::timing::Stats;
use hk_format::abi::{ScalarType, ScalarValue};
use hk_tests::host::{POISON_BYTE, decode};
use hk_tests::kernels::activation::{Activation, act_and_mul};
use hk_tests::kernels::norm::{NormKind, layernorm, residual_add, rmsnorm};
use hk_tests::kernels::rope::{self, RopeStyle, rope_tables};
use hk_tests::kernels::softmax::softmax;
use hk_tests::kernels::topk::topk;
use hkload::driver::cuda::{EVENT_SYMBOLS, sys};
use hkload::driver::{CudaDriver, DevicePtr, StreamHandle};
use hkload::{Arg, Bundle, Device, DeviceBuffer, Kernel, RawPointer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const USAGE: &str = "usage: gpu_kernel_bench <bundle folder> [--iters N] [--only KERNEL[,KERNEL...]] \
                     [--dump DIR]\n       gpu_kernel_bench --list [--iters N] [--only KERNEL[,...]]";

/// The element type of every benchmarked tensor except the RoPE tables (f32) and the top-k
/// indices (i32).
const ELEM: ScalarType = ScalarType::Bf16;

const RMS_EPS: f32 = 1e-6;
const LAYER_EPS: f32 = 1e-5;
/// RoPE's frequency base, as in most models.
const ROPE_BASE: f64 = 10_000.0;

/// Untimed launches before the timed ones (module load and clocks settle there).
const WARMUP: usize = 10;
const DEFAULT_ITERS: usize = 200;
/// The issue asks for medians of at least this many timed launches.
const MIN_ITERS: usize = 100;
/// Timed launches queued behind one gate; few enough that a chunk and its events stay
/// far below the depth of the driver's launch queue, so queueing never blocks the host.
const CHUNK: usize = 25;

/// What the rotating copies of a shape's tensors hold together, at least: five times the L2 of
/// an H100 or H200 (50 MB), so that each launch reads memory, not cache.
const ROTATION_BYTES: u64 = 256 << 20;

/// The largest relative error (‖out − ref‖ / ‖ref‖) the check accepts: bf16 outputs rounded
/// once land near 2e-3.
const CHECK_LIMIT: f64 = 1e-2;
/// Seed of the inputs, so that two runs time the same data.
const NOISE_SEED: u64 = 0x6b65_726e_656c;
/// Distinct noise values; not a power of two, so the copies of a tensor (a power of two in
/// size, or near) do not repeat one another.
const NOISE_VALUES: usize = (1 << 24) + 43;
/// Values between the places in the noise where two arguments' tensors start, so that `x` and
/// `residual` differ.
const NOISE_STRIDE: usize = 7_919_999;

/// The shapes of the benchmark, each kernel's smallest first (it is the one checked): the
/// seed's tables (RMSNorm and softmax from 128 to 65536 rows of 128; fused add-RMSNorm and
/// LayerNorm from 4096 rows; silu_and_mul over `x` of 256 columns and two wide ones; RoPE;
/// top-k) plus 4096 tokens of hidden sizes 4096 and 8192 for the norms and softmax.
const WORKLOADS: [Workload; 34] = [
    Workload::norm(NormKind::RmsNorm, 128, 128),
    Workload::norm(NormKind::RmsNorm, 4096, 128),
    Workload::norm(NormKind::RmsNorm, 16384, 128),
    Workload::norm(NormKind::RmsNorm, 65536, 128),
    Workload::norm(NormKind::RmsNorm, 4096, 4096),
    Workload::norm(NormKind::RmsNorm, 4096, 8192),
    Workload::norm(NormKind::FusedAddRmsNorm, 4096, 128),
    Workload::norm(NormKind::FusedAddRmsNorm, 16384, 128),
    Workload::norm(NormKind::FusedAddRmsNorm, 65536, 128),
    Workload::norm(NormKind::FusedAddRmsNorm, 4096, 4096),
    Workload::norm(NormKind::FusedAddRmsNorm, 4096, 8192),
    Workload::norm(NormKind::LayerNorm, 4096, 128),
    Workload::norm(NormKind::LayerNorm, 16384, 128),
    Workload::norm(NormKind::LayerNorm, 65536, 128),
    Workload::norm(NormKind::LayerNorm, 4096, 4096),
    Workload::norm(NormKind::LayerNorm, 4096, 8192),
    Workload::softmax(128, 128),
    Workload::softmax(4096, 128),
    Workload::softmax(16384, 128),
    Workload::softmax(65536, 128),
    Workload::softmax(4096, 4096),
    Workload::softmax(4096, 8192),
    Workload::silu_and_mul(4096, 256),
    Workload::silu_and_mul(16384, 256),
    Workload::silu_and_mul(65536, 256),
    Workload::silu_and_mul(131072, 256),
    Workload::silu_and_mul(4096, 8192),
    Workload::silu_and_mul(4096, 16384),
    Workload::rope(4, 32, 1024, 128),
    Workload::rope(8, 32, 2048, 128),
    Workload::rope(16, 32, 4096, 128),
    Workload::topk(1024, 256, 10),
    Workload::topk(4096, 256, 10),
    Workload::topk(4096, 1024, 32),
];

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
    bundle: Option<PathBuf>,
    list: bool,
    iters: usize,
    only: Option<Vec<String>>,
    dump: Option<PathBuf>,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        bundle: None,
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
            _ if options.bundle.is_none() && !arg.starts_with('-') => {
                options.bundle = Some(PathBuf::from(arg));
            }
            _ => return Err(format!("unexpected argument `{arg}`\n{USAGE}")),
        }
    }
    if !options.list && options.bundle.is_none() {
        return Err(USAGE.into());
    }
    Ok(options)
}

/// The workloads `--only` keeps (all without it); an unknown name is an error, not an empty run.
fn selected(only: Option<&[String]>) -> Result<Vec<Workload>, String> {
    let Some(names) = only else {
        return Ok(WORKLOADS.to_vec());
    };
    let known: Vec<&str> = WORKLOADS.iter().map(|w| w.kernel()).collect();
    if let Some(unknown) = names.iter().find(|name| !known.contains(&name.as_str())) {
        let mut kernels = known;
        kernels.dedup();
        return Err(format!(
            "--only names `{unknown}`, which is not benchmarked; the kernels are {}",
            kernels.join(", ")
        ));
    }
    Ok(WORKLOADS
        .into_iter()
        .filter(|w| names.iter().any(|name| name == w.kernel()))
        .collect())
}

/// Turns any displayable error into the message a record or `main` prints.
fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// Runs the benchmark; `Ok(false)` when a shape or a check failed.
fn run() -> Result<bool, String> {
    let options = parse_args()?;
    let workloads = selected(options.only.as_deref())?;
    if options.list {
        for workload in &workloads {
            println!("{}", workload.record(options.iters).end());
        }
        return Ok(true);
    }
    let bundle_dir = options.bundle.as_deref().ok_or(USAGE)?;

    let cuda = Arc::new(CudaDriver::new().map_err(text)?);
    let device = Device::new(cuda.clone(), 0).map_err(text)?;
    // The context is created here, outside every measurement.
    cuda.make_current(0).map_err(text)?;
    let bundle = Bundle::open(bundle_dir).map_err(text)?;
    let loaded = bundle.load(&device).map_err(text)?;
    if let Some(dir) = &options.dump {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the dump folder {}: {e}", dir.display()))?;
    }
    let timer = Timer::new(&cuda, &device)?;
    let (major, minor) = cuda.driver_version();
    println!(
        "{}",
        Json::object()
            .field("record", "device")
            .field("name", device.info().name.as_str())
            .field("target", device.target().to_string().as_str())
            .field("driver", format!("{major}.{minor}").as_str())
            .field("bundle", bundle_dir.display().to_string().as_str())
            .end()
    );
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
    for workload in &workloads {
        eprintln!("{} {} ...", workload.kernel(), workload.shape());
        let check = checked.insert(workload.kernel());
        let kernel = loaded.kernel(&workload.symbol()).map_err(text);
        let (record, ok) = match kernel {
            Ok(kernel) => bench.measure(&kernel, *workload, check),
            Err(error) => (
                workload
                    .record(options.iters)
                    .field("error", error.as_str()),
                false,
            ),
        };
        failed += usize::from(!ok);
        println!("{}", record.end());
    }
    println!(
        "{}",
        Json::object()
            .field("record", "summary")
            .field("shapes", &workloads.len())
            .field("failed", &failed)
            .end()
    );
    Ok(failed == 0)
}

// ---- The workloads ----------------------------------------------------------------------------

/// One kernel at one shape.
#[derive(Debug, Clone, Copy)]
enum Workload {
    /// RMSNorm or LayerNorm over `[rows, cols]`, fused with a residual add or not.
    Norm {
        kind: NormKind,
        rows: usize,
        cols: usize,
    },
    Softmax {
        rows: usize,
        cols: usize,
    },
    /// `x` is `[rows, width]`, the activated half then the gate; `out` is `[rows, width / 2]`.
    SiluAndMul {
        rows: usize,
        width: usize,
    },
    /// NeoX ("rotate half") RoPE of `[batch, heads, seq, dim]`, whole head vectors rotated.
    Rope {
        batch: usize,
        heads: usize,
        seq: usize,
        dim: usize,
    },
    TopK {
        rows: usize,
        n: usize,
        k: usize,
    },
}

/// One argument of a launch, as the kernel's signature orders them.
enum ArgSpec {
    Tensor(TensorSpec),
    Scalar(ScalarValue),
}

struct TensorSpec {
    /// The argument's name in the manifest, which the script uses too.
    name: &'static str,
    elem: ScalarType,
    len: usize,
    role: Role,
}

/// How the kernel uses a tensor, and so how the benchmark fills and rotates it.
enum Role {
    /// Read; a copy per set, filled with noise.
    Input,
    /// Read and updated in place; a copy per set, filled with noise.
    InOut,
    /// Written; one copy for all sets, left as it is (poisoned for the check).
    Output,
    /// Read; one copy for all sets, filled with noise (norm weights and biases).
    Weight,
    /// Read; one copy for all sets holding these values (RoPE tables).
    Table(Vec<f64>),
}

impl Role {
    fn rotated(&self) -> bool {
        matches!(self, Self::Input | Self::InOut)
    }

    fn read(&self) -> bool {
        !matches!(self, Self::Output)
    }

    fn written(&self) -> bool {
        matches!(self, Self::InOut | Self::Output)
    }
}

impl TensorSpec {
    fn bytes(&self) -> u64 {
        self.len as u64 * u64::from(self.elem.size())
    }
}

fn tensor(name: &'static str, elem: ScalarType, len: usize, role: Role) -> ArgSpec {
    ArgSpec::Tensor(TensorSpec {
        name,
        elem,
        len,
        role,
    })
}

fn u32_arg(value: usize) -> ArgSpec {
    ArgSpec::Scalar(ScalarValue::U32(value as u32))
}

impl Workload {
    const fn norm(kind: NormKind, rows: usize, cols: usize) -> Self {
        Self::Norm { kind, rows, cols }
    }

    const fn softmax(rows: usize, cols: usize) -> Self {
        Self::Softmax { rows, cols }
    }

    const fn silu_and_mul(rows: usize, width: usize) -> Self {
        Self::SiluAndMul { rows, width }
    }

    const fn rope(batch: usize, heads: usize, seq: usize, dim: usize) -> Self {
        Self::Rope {
            batch,
            heads,
            seq,
            dim,
        }
    }

    const fn topk(rows: usize, n: usize, k: usize) -> Self {
        Self::TopK { rows, n, k }
    }

    /// The kernel's name without the element type, as the script knows it.
    fn kernel(self) -> &'static str {
        match self {
            Self::Norm { kind, .. } => kind.name(),
            Self::Softmax { .. } => "softmax",
            Self::SiluAndMul { .. } => "silu_and_mul",
            Self::Rope { .. } => "rope_neox_bhsd",
            Self::TopK { .. } => "topk",
        }
    }

    fn symbol(self) -> String {
        format!("{}_{}", self.kernel(), ELEM.name())
    }

    /// The shape as the tables write it: `4096x128`, `4x32x1024x128`, `4096x1024 k=32`.
    fn shape(self) -> String {
        match self {
            Self::Norm { rows, cols, .. } | Self::Softmax { rows, cols } => {
                format!("{rows}x{cols}")
            }
            Self::SiluAndMul { rows, width } => format!("{rows}x{width}"),
            Self::Rope {
                batch,
                heads,
                seq,
                dim,
            } => format!("{batch}x{heads}x{seq}x{dim}"),
            Self::TopK { rows, n, k } => format!("{rows}x{n} k={k}"),
        }
    }

    /// The parameters the script needs to build the same operation in PyTorch.
    fn params(self) -> Json {
        let params = Json::object();
        match self {
            Self::Norm { kind, rows, cols } => {
                let eps = match kind {
                    NormKind::LayerNorm | NormKind::FusedAddLayerNorm => LAYER_EPS,
                    NormKind::RmsNorm | NormKind::FusedAddRmsNorm => RMS_EPS,
                };
                params
                    .field("rows", &rows)
                    .field("cols", &cols)
                    .field("eps", &f64::from(eps))
            }
            Self::Softmax { rows, cols } => params.field("rows", &rows).field("cols", &cols),
            Self::SiluAndMul { rows, width } => params.field("rows", &rows).field("width", &width),
            Self::Rope {
                batch,
                heads,
                seq,
                dim,
            } => params
                .field("batch", &batch)
                .field("heads", &heads)
                .field("seq", &seq)
                .field("dim", &dim)
                .field("base", &ROPE_BASE),
            Self::TopK { rows, n, k } => params.field("rows", &rows).field("n", &n).field("k", &k),
        }
    }

    /// The launch arguments in the kernel's order.
    fn args(self) -> Vec<ArgSpec> {
        use Role::{InOut, Input, Output, Table, Weight};
        match self {
            Self::Norm { kind, rows, cols } => {
                let (fused, bias) = match kind {
                    NormKind::RmsNorm => (false, false),
                    NormKind::FusedAddRmsNorm => (true, false),
                    NormKind::LayerNorm => (false, true),
                    NormKind::FusedAddLayerNorm => (true, true),
                };
                let eps = if bias { LAYER_EPS } else { RMS_EPS };
                let mut args = vec![tensor("out", ELEM, rows * cols, Output)];
                if fused {
                    args.push(tensor("residual", ELEM, rows * cols, InOut));
                }
                args.push(tensor("x", ELEM, rows * cols, Input));
                args.push(tensor("weight", ELEM, cols, Weight));
                if bias {
                    args.push(tensor("bias", ELEM, cols, Weight));
                }
                args.extend([
                    ArgSpec::Scalar(ScalarValue::F32(eps)),
                    u32_arg(rows),
                    u32_arg(cols),
                ]);
                args
            }
            Self::Softmax { rows, cols } => vec![
                tensor("out", ELEM, rows * cols, Output),
                tensor("x", ELEM, rows * cols, Input),
                u32_arg(rows),
                u32_arg(cols),
            ],
            Self::SiluAndMul { rows, width } => vec![
                tensor("out", ELEM, rows * (width / 2), Output),
                tensor("x", ELEM, rows * width, Input),
                u32_arg(rows),
                u32_arg(width / 2),
            ],
            Self::Rope {
                batch,
                heads,
                seq,
                dim,
            } => {
                let (cos, sin) = rope_tables(seq, dim, ROPE_BASE);
                let f32 = ScalarType::F32;
                vec![
                    tensor("out", ELEM, batch * heads * seq * dim, Output),
                    tensor("x", ELEM, batch * heads * seq * dim, Input),
                    tensor("cos", f32, cos.len(), Table(cos)),
                    tensor("sin", f32, sin.len(), Table(sin)),
                    u32_arg(batch),
                    u32_arg(heads),
                    u32_arg(seq),
                    u32_arg(dim),
                    u32_arg(dim),
                ]
            }
            Self::TopK { rows, n, k } => vec![
                tensor("values", ELEM, rows * k, Output),
                tensor("indices", ScalarType::I32, rows * k, Output),
                tensor("x", ELEM, rows * n, Input),
                u32_arg(rows),
                u32_arg(n),
                u32_arg(k),
            ],
        }
    }

    /// The outputs the kernel must produce from `inputs`, by argument name, from the f64
    /// references of `hk_tests::kernels`.
    fn reference(self, inputs: &Named) -> Result<Named, String> {
        match self {
            Self::Norm { kind, cols, .. } => {
                let x = inputs.get("x")?;
                let weight = inputs.get("weight")?;
                let mut want = Named::default();
                let normed = match kind {
                    NormKind::FusedAddRmsNorm | NormKind::FusedAddLayerNorm => {
                        let sum = residual_add(ELEM, x, inputs.get("residual")?);
                        want.push("residual", sum.clone());
                        sum
                    }
                    NormKind::RmsNorm | NormKind::LayerNorm => x.to_vec(),
                };
                let out = match kind {
                    NormKind::RmsNorm | NormKind::FusedAddRmsNorm => {
                        let eps = f64::from(RMS_EPS);
                        normed
                            .chunks(cols)
                            .flat_map(|row| rmsnorm(row, weight, eps))
                            .collect()
                    }
                    NormKind::LayerNorm | NormKind::FusedAddLayerNorm => {
                        let bias = inputs.get("bias")?;
                        let eps = f64::from(LAYER_EPS);
                        normed
                            .chunks(cols)
                            .flat_map(|row| layernorm(row, weight, bias, eps))
                            .collect()
                    }
                };
                want.push("out", out);
                Ok(want)
            }
            Self::Softmax { cols, .. } => {
                let out = inputs.get("x")?.chunks(cols).flat_map(softmax).collect();
                Ok(Named::one("out", out))
            }
            Self::SiluAndMul { width, .. } => {
                let rows = inputs.get("x")?.chunks(width);
                let out = rows.flat_map(|row| act_and_mul(Activation::Silu, row));
                Ok(Named::one("out", out.collect()))
            }
            Self::Rope { seq, dim, .. } => {
                let (cos, sin) = (inputs.get("cos")?, inputs.get("sin")?);
                let pairs = dim / 2;
                let out = inputs
                    .get("x")?
                    .chunks(dim)
                    .enumerate()
                    .flat_map(|(v, head)| {
                        let angles = (v % seq) * pairs..(v % seq + 1) * pairs;
                        let (c, s) = (cos.get(angles.clone()), sin.get(angles));
                        rope::rope(RopeStyle::NeoX, head, c.unwrap_or(&[]), s.unwrap_or(&[]))
                    });
                Ok(Named::one("out", out.collect()))
            }
            Self::TopK { n, k, .. } => {
                let rows = inputs.get("x")?.chunks(n);
                let values = rows.flat_map(|row| topk(row, k).into_iter().map(|(v, _)| v));
                Ok(Named::one("values", values.collect()))
            }
        }
    }

    /// What else is wrong with the outputs besides their distance from the reference: top-k's
    /// values must equal the reference's exactly, and each index must point at its value.
    fn exact_problem(
        self,
        inputs: &Named,
        got: &Named,
        want: &Named,
    ) -> Result<Option<String>, String> {
        let Self::TopK { n, k, .. } = self else {
            return Ok(None);
        };
        let (values, indices) = (got.get("values")?, got.get("indices")?);
        let wrong_values = values
            .iter()
            .zip(want.get("values")?)
            .filter(|(g, w)| g != w)
            .count();
        let x = inputs.get("x")?;
        let wrong_indices = indices
            .iter()
            .zip(values)
            .enumerate()
            .filter(|&(i, (&index, &value))| {
                let row = i / k;
                let column = index as usize;
                index < 0.0 || column >= n || x.get(row * n + column) != Some(&value)
            })
            .count();
        Ok((wrong_values + wrong_indices > 0).then(|| {
            format!(
                "{wrong_values} top-k values differ from the reference and {wrong_indices} \
                 indices do not point at their value"
            )
        }))
    }

    /// The JSON record of the shape, without measurements: what `--list` prints and what every
    /// measured record starts with.
    fn record(self, iters: usize) -> Json {
        let specs = self.args();
        let tensors = || {
            specs.iter().filter_map(|spec| match spec {
                ArgSpec::Tensor(tensor) => Some(tensor),
                ArgSpec::Scalar(_) => None,
            })
        };
        let moved: u64 = tensors()
            .map(|t| t.bytes() * (u64::from(t.role.read()) + u64::from(t.role.written())))
            .sum();
        let set_bytes = tensors()
            .filter(|t| t.role.rotated())
            .map(TensorSpec::bytes)
            .sum();
        Json::object()
            .field("record", "kernel")
            .field("kernel", self.kernel())
            .field("symbol", self.symbol().as_str())
            .field("shape", self.shape().as_str())
            .field("params", &self.params())
            .field("bytes", &moved)
            .field("sets", &sets(set_bytes, iters))
            .field("warmup", &WARMUP)
            .field("iters", &iters)
    }
}

/// Copies of a shape's rotated tensors (`set_bytes` each set): enough to hold
/// [`ROTATION_BYTES`], at least 2, and no more than the launches that use them.
fn sets(set_bytes: u64, iters: usize) -> usize {
    let needed = ROTATION_BYTES.div_ceil(set_bytes.max(1));
    usize::try_from(needed)
        .unwrap_or(usize::MAX)
        .clamp(2, (WARMUP + iters).max(2))
}

/// Host values by argument name.
#[derive(Debug, Default)]
struct Named(Vec<(&'static str, Vec<f64>)>);

impl Named {
    fn one(name: &'static str, values: Vec<f64>) -> Self {
        Self(vec![(name, values)])
    }

    fn push(&mut self, name: &'static str, values: Vec<f64>) {
        self.0.push((name, values));
    }

    fn get(&self, name: &str) -> Result<&[f64], String> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, values)| values.as_slice())
            .ok_or_else(|| format!("the check has no tensor `{name}`"))
    }
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

/// The host bytes of tensor number `index` over `sets` copies: noise for inputs and weights,
/// the values of a table, and for outputs poison (when `poison`) or nothing (left
/// uninitialised).
fn host_bytes(
    spec: &TensorSpec,
    index: usize,
    sets: usize,
    noise: &Noise,
    poison: bool,
) -> Option<Vec<u8>> {
    let copies = if spec.role.rotated() { sets } else { 1 };
    let len = spec.bytes() as usize * copies;
    match &spec.role {
        Role::Input | Role::InOut | Role::Weight => Some(noise.take(index * NOISE_STRIDE, len)),
        Role::Table(values) => Some(hk_tests::host::encode(spec.elem, values)),
        Role::Output => poison.then(|| vec![POISON_BYTE; len]),
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
    /// Allocates every tensor and uploads the bytes of those `host` has.
    fn place(
        device: &Device,
        specs: &[ArgSpec],
        sets: usize,
        host: &[Option<Vec<u8>>],
    ) -> Result<Self, String> {
        let mut args = Vec::with_capacity(specs.len());
        for (spec, bytes) in specs.iter().zip(host) {
            let tensor = match spec {
                ArgSpec::Tensor(tensor) => tensor,
                ArgSpec::Scalar(value) => {
                    args.push(Placed::Scalar(*value));
                    continue;
                }
            };
            let copies = if tensor.role.rotated() { sets } else { 1 };
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
            if let Some(bytes) = bytes {
                buffer.write(bytes).map_err(text)?;
            }
            args.push(Placed::Tensor {
                buffer,
                stride: if copies > 1 { tensor.bytes() } else { 0 },
                mutable: tensor.role.written(),
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

    /// The buffer of argument `index`, if it is a tensor.
    fn buffer(&self, index: usize) -> Option<&DeviceBuffer> {
        match self.args.get(index) {
            Some(Placed::Tensor { buffer, .. }) => Some(buffer),
            _ => None,
        }
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

/// What the check of one shape found.
struct Checked {
    rel_err: f64,
    problem: Option<String>,
    /// The files `--dump` wrote, as a JSON array.
    dumped: Vec<Json>,
}

/// Per-launch device times of one shape.
struct Timing {
    median_us: f64,
    p10_us: f64,
    p90_us: f64,
}

impl Bench<'_> {
    /// Checks (when `check`) and times one shape; the record and whether all went well. A
    /// failure is written into the record, never returned: the next shape still runs.
    fn measure(&self, kernel: &Kernel, workload: Workload, check: bool) -> (Json, bool) {
        let mut record = workload.record(self.iters);
        let mut ok = true;
        if check {
            let json = match self.check(kernel, workload) {
                Ok(checked) => {
                    let passed = checked.rel_err <= CHECK_LIMIT && checked.problem.is_none();
                    ok &= passed;
                    Json::object()
                        .field("rel_err", &checked.rel_err)
                        .field("limit", &CHECK_LIMIT)
                        .field("passed", &passed)
                        .field("problem", &checked.problem.as_deref())
                        .field("dump", checked.dumped.as_slice())
                }
                Err(error) => {
                    ok = false;
                    Json::object()
                        .field("passed", &false)
                        .field("problem", error.as_str())
                }
            };
            record = record.field("check", &json);
        }
        match self.time(kernel, workload) {
            Ok(timing) => {
                record = record
                    .field("median_us", &timing.median_us)
                    .field("p10_us", &timing.p10_us)
                    .field("p90_us", &timing.p90_us);
            }
            Err(error) => {
                ok = false;
                record = record.field("error", error.as_str());
            }
        }
        (record, ok)
    }

    /// One launch on fresh buffers with poisoned outputs, compared with the reference.
    fn check(&self, kernel: &Kernel, workload: Workload) -> Result<Checked, String> {
        let specs = workload.args();
        let host: Vec<Option<Vec<u8>>> = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| match spec {
                ArgSpec::Tensor(tensor) => host_bytes(tensor, i, 1, self.noise, true),
                ArgSpec::Scalar(_) => None,
            })
            .collect();
        let tensors = DeviceTensors::place(self.device, &specs, 1, &host)?;
        kernel
            .call(StreamHandle::DEFAULT, &tensors.args(0))
            .map_err(text)?;
        self.device.synchronize().map_err(text)?;

        let mut inputs = Named::default();
        let mut got = Named::default();
        let mut dumped = Vec::new();
        for (index, (spec, bytes)) in specs.iter().zip(&host).enumerate() {
            let (ArgSpec::Tensor(tensor), Some(buffer)) = (spec, tensors.buffer(index)) else {
                continue;
            };
            if tensor.role.read() {
                let bytes = bytes.as_deref().unwrap_or(&[]);
                inputs.push(tensor.name, decode(tensor.elem, bytes));
                dumped.extend(self.dump(workload, tensor, "in", bytes)?);
            }
            if tensor.role.written() {
                let bytes = buffer.to_bytes().map_err(text)?;
                got.push(tensor.name, decode(tensor.elem, &bytes));
                dumped.extend(self.dump(workload, tensor, "out", &bytes)?);
            }
        }
        let want = workload.reference(&inputs)?;
        let mut error_sq = 0.0;
        let mut norm_sq = 0.0;
        for (name, want) in &want.0 {
            let got = got.get(name)?;
            if got.len() != want.len() {
                return Err(format!(
                    "`{name}` holds {} values, the reference {}",
                    got.len(),
                    want.len()
                ));
            }
            for (g, w) in got.iter().zip(want) {
                error_sq += (g - w) * (g - w);
                norm_sq += w * w;
            }
        }
        // NaN (an unwritten, poisoned output) stays NaN and fails `<=`.
        let rel_err = (error_sq / norm_sq).sqrt();
        Ok(Checked {
            rel_err: if rel_err.is_nan() {
                f64::INFINITY
            } else {
                rel_err
            },
            problem: workload.exact_problem(&inputs, &got, &want)?,
            dumped,
        })
    }

    /// Writes one tensor of the check to the `--dump` folder; its JSON entry, if it did.
    fn dump(
        &self,
        workload: Workload,
        tensor: &TensorSpec,
        stage: &str,
        bytes: &[u8],
    ) -> Result<Option<Json>, String> {
        let Some(dir) = self.dump else {
            return Ok(None);
        };
        let path = dir.join(format!("{}.{}.{stage}.bin", workload.kernel(), tensor.name));
        std::fs::write(&path, bytes)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(Some(
            Json::object()
                .field("tensor", tensor.name)
                .field("dtype", tensor.elem.name())
                .field("stage", stage)
                .field("path", path.display().to_string().as_str()),
        ))
    }

    /// Warm-up and timed launches over rotating copies of the shape's tensors.
    fn time(&self, kernel: &Kernel, workload: Workload) -> Result<Timing, String> {
        let specs = workload.args();
        let set_bytes = specs
            .iter()
            .filter_map(|spec| match spec {
                ArgSpec::Tensor(t) if t.role.rotated() => Some(t.bytes()),
                _ => None,
            })
            .sum();
        let sets = sets(set_bytes, self.iters);
        let tensors = {
            let host: Vec<Option<Vec<u8>>> = specs
                .iter()
                .enumerate()
                .map(|(i, spec)| match spec {
                    ArgSpec::Tensor(tensor) => host_bytes(tensor, i, sets, self.noise, false),
                    ArgSpec::Scalar(_) => None,
                })
                .collect();
            DeviceTensors::place(self.device, &specs, sets, &host)?
        };
        let args: Vec<Vec<Arg<'_>>> = (0..sets).map(|set| tensors.args(set)).collect();
        let launch = |i: usize| {
            let args = args.get(i % sets).map_or(&[][..], Vec::as_slice);
            kernel.call(StreamHandle::DEFAULT, args).map_err(text)
        };
        let timing = self.timer.time(launch, self.iters);
        // Every launch is done before `tensors` is freed, also after an error.
        let _ = self.device.synchronize();
        timing
    }
}

// ---- CUDA events and the gate ---------------------------------------------------------------

/// A CUDA event of the current context; destroyed on drop.
struct Event(sys::CUevent);

impl Event {
    fn new() -> Result<Self, String> {
        let mut event = ptr::null_mut();
        // SAFETY: `event` is a valid place for the handle; flags 0 is CU_EVENT_DEFAULT (timed).
        cu("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut event, 0)
        })?;
        Ok(Self(event))
    }

    fn record(&self) -> Result<(), String> {
        // SAFETY: the event is live; the null stream is the default stream, where the
        // launches go.
        cu("cuEventRecord", unsafe {
            sys::cuEventRecord(self.0, ptr::null_mut())
        })
    }

    fn synchronize(&self) -> Result<(), String> {
        // SAFETY: the event is live and recorded.
        cu("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.0)
        })
    }

    /// Seconds from `self` to `end`, both completed.
    fn seconds_to(&self, end: &Event) -> Result<f64, String> {
        let mut milliseconds = 0f32;
        // SAFETY: both events are live, recorded and complete.
        cu("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut milliseconds, self.0, end.0)
        })?;
        Ok(f64::from(milliseconds) / 1e3)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once; nothing waits on it any more.
        let _ = unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

fn cu(call: &str, result: sys::CUresult) -> Result<(), String> {
    match result {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        error => Err(format!("{call} failed: {error:?}")),
    }
}

/// Holds the default stream back while the host queues work: the stream waits until a word
/// of pinned host memory reaches the turn of the current hold, and the host writes it when the
/// hold ends. Unlike a head start of busy work, it needs no guess of how long queueing takes
/// and touches no memory the kernels use.
struct Gate {
    /// The word, in host memory mapped for the device.
    word: *mut u32,
    /// The same word as the device addresses it.
    device_word: sys::CUdeviceptr,
    /// The turn of the last hold.
    turn: Cell<u32>,
}

impl Gate {
    /// The driver calls a gate makes, checked up front: cudarc's loader panics on a missing one.
    const SYMBOLS: &[&str] = &[
        "cuMemHostAlloc",
        "cuMemHostGetDevicePointer_v2",
        "cuMemFreeHost",
        "cuStreamWaitValue32_v2",
    ];

    fn new(cuda: &CudaDriver) -> Result<Self, String> {
        cuda.require(Self::SYMBOLS).map_err(text)?;
        let mut host = ptr::null_mut();
        // SAFETY: `host` is a valid place for the pointer; 4 bytes hold the word.
        cu("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut host, 4, sys::CU_MEMHOSTALLOC_DEVICEMAP)
        })?;
        let word = host.cast::<u32>();
        let mut gate = Self {
            word,
            device_word: 0,
            turn: Cell::new(0),
        };
        // SAFETY: `word` is pinned host memory of this process, aligned and live until drop.
        unsafe { word.write_volatile(0) };
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP; flags must be 0.
        cu("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut gate.device_word, host, 0)
        })?;
        Ok(gate)
    }

    /// Queues a wait on the default stream that lasts until the returned hold is dropped.
    fn hold(&self) -> Result<Hold<'_>, String> {
        let turn = self.turn.get().wrapping_add(1);
        self.turn.set(turn);
        // SAFETY: the word is live device-mapped memory; the null stream is the default
        // stream, where the launches go. Turns only grow (a wrap takes 4 billion chunks).
        cu("cuStreamWaitValue32", unsafe {
            sys::cuStreamWaitValue32_v2(
                ptr::null_mut(),
                self.device_word,
                turn,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        })?;
        Ok(Hold { gate: self, turn })
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once; every hold has ended (they
        // borrow the gate) and the timer synchronised after the last one.
        let _ = unsafe { sys::cuMemFreeHost(self.word.cast()) };
    }
}

/// A wait of the default stream on a [`Gate`]; the GPU goes on when it is dropped, also when
/// queueing failed half-way.
struct Hold<'a> {
    gate: &'a Gate,
    turn: u32,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        // Everything queued before this point is in the stream ahead of the wait's end.
        fence(Ordering::SeqCst);
        // SAFETY: the word is live pinned memory that only this thread writes.
        unsafe { self.gate.word.write_volatile(self.turn) };
    }
}

/// Times launches with an event between each two, in chunks queued behind a [`Gate`].
struct Timer<'a> {
    device: &'a Device,
    gate: Gate,
    /// `CHUNK + 1` events around the launches of a chunk.
    events: Vec<Event>,
}

impl<'a> Timer<'a> {
    fn new(cuda: &CudaDriver, device: &'a Device) -> Result<Self, String> {
        // cudarc's loader panics on a missing entry point; `require` reports it instead.
        cuda.require(EVENT_SYMBOLS).map_err(text)?;
        Ok(Self {
            device,
            gate: Gate::new(cuda)?,
            events: (0..=CHUNK)
                .map(|_| Event::new())
                .collect::<Result<_, _>>()?,
        })
    }

    /// Runs `launch(i)` for [`WARMUP`] untimed launches and `iters` timed ones (`i` counting on
    /// through both), and returns the statistics of the timed ones.
    fn time(
        &self,
        mut launch: impl FnMut(usize) -> Result<(), String>,
        iters: usize,
    ) -> Result<Timing, String> {
        (0..WARMUP).try_for_each(&mut launch)?;
        self.device.synchronize().map_err(text)?;

        let (first, rest) = self.events.split_first().ok_or("the timer has no events")?;
        let mut samples = Vec::with_capacity(iters);
        let mut done = 0;
        while done < iters {
            let chunk = rest.get(..CHUNK.min(iters - done)).unwrap_or(rest);
            {
                let _hold = self.gate.hold()?;
                first.record()?;
                for (j, event) in chunk.iter().enumerate() {
                    launch(WARMUP + done + j)?;
                    event.record()?;
                }
            }
            chunk.last().unwrap_or(first).synchronize()?;
            let mut start = first;
            for end in chunk {
                samples.push(start.seconds_to(end)?);
                start = end;
            }
            done += chunk.len();
        }
        let stats = Stats::of(&samples);
        Ok(Timing {
            median_us: stats.median * 1e6,
            p10_us: stats.p10 * 1e6,
            p90_us: stats.p90 * 1e6,
        })
    }
}

// ---- JSON lines --------------------------------------------------------------------------------

/// A JSON object built field by field: the program's output, one object a line.
struct Json {
    /// The text so far, without the closing brace.
    open: String,
}

impl Json {
    fn object() -> Self {
        Self { open: "{".into() }
    }

    fn field(mut self, key: &str, value: &(impl ToJson + ?Sized)) -> Self {
        if self.open.len() > 1 {
            self.open.push(',');
        }
        key.write_json(&mut self.open);
        self.open.push(':');
        value.write_json(&mut self.open);
        self
    }

    fn end(mut self) -> String {
        self.open.push('}');
        self.open
    }
}

trait ToJson {
    fn write_json(&self, out: &mut String);
}

impl ToJson for str {
    fn write_json(&self, out: &mut String) {
        out.push('"');
        for c in self.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

impl ToJson for f64 {
    fn write_json(&self, out: &mut String) {
        // JSON has no NaN or infinity; the script reads null as "not measured".
        if self.is_finite() {
            out.push_str(&format!("{self:e}"));
        } else {
            out.push_str("null");
        }
    }
}

impl ToJson for u64 {
    fn write_json(&self, out: &mut String) {
        out.push_str(&self.to_string());
    }
}

impl ToJson for usize {
    fn write_json(&self, out: &mut String) {
        out.push_str(&self.to_string());
    }
}

impl ToJson for bool {
    fn write_json(&self, out: &mut String) {
        out.push_str(if *self { "true" } else { "false" });
    }
}

impl<T: ToJson + ?Sized> ToJson for Option<&T> {
    fn write_json(&self, out: &mut String) {
        match self {
            Some(value) => value.write_json(out),
            None => out.push_str("null"),
        }
    }
}

impl ToJson for Json {
    fn write_json(&self, out: &mut String) {
        out.push_str(&self.open);
        out.push('}');
    }
}

impl<T: ToJson> ToJson for [T] {
    fn write_json(&self, out: &mut String) {
        out.push('[');
        for (i, value) in self.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            value.write_json(out);
        }
        out.push(']');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hk_format::abi::ParamType;

    #[test]
    fn every_workload_matches_its_kernel_signature() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
        let package = hkpack::manifest::Package::load(&dir).expect("the manifests load");
        let kernels: Vec<_> = package.modules.iter().flat_map(|m| &m.kernels).collect();
        for workload in WORKLOADS {
            let symbol = workload.symbol();
            let decl = kernels
                .iter()
                .find(|k| k.symbol == symbol)
                .unwrap_or_else(|| panic!("no kernel {symbol} in the manifests"));
            let args = workload.args();
            assert_eq!(args.len(), decl.args.len(), "{symbol}");
            for (arg, param) in args.iter().zip(&decl.args) {
                match arg {
                    ArgSpec::Tensor(tensor) => {
                        assert_eq!(tensor.name, param.name, "{symbol}");
                        let want = ParamType::Pointer {
                            pointee: tensor.elem,
                            mutable: tensor.role.written(),
                        };
                        assert_eq!(param.ty, want, "{symbol} {}", param.name);
                    }
                    ArgSpec::Scalar(value) => {
                        assert_eq!(
                            param.ty,
                            ParamType::Scalar(value.ty()),
                            "{symbol} {}",
                            param.name
                        )
                    }
                }
            }
        }
    }

    #[test]
    fn each_kernel_is_checked_on_its_smallest_shape() {
        let bytes = |w: Workload| -> u64 {
            w.args()
                .iter()
                .filter_map(|a| match a {
                    ArgSpec::Tensor(t) => Some(t.bytes()),
                    ArgSpec::Scalar(_) => None,
                })
                .sum()
        };
        let mut first = HashSet::new();
        for (i, w) in WORKLOADS.iter().enumerate() {
            if first.insert(w.kernel()) {
                let later = WORKLOADS[i..].iter().filter(|v| v.kernel() == w.kernel());
                assert!(
                    later.clone().all(|v| bytes(*v) >= bytes(*w)),
                    "{}",
                    w.shape()
                );
                assert!(
                    bytes(*w) < 100 << 20,
                    "{} {} is slow to check",
                    w.kernel(),
                    w.shape()
                );
            }
        }
    }

    #[test]
    fn rotation_outgrows_the_cache_but_not_the_launches() {
        assert_eq!(
            sets(64 << 10, 200),
            WARMUP + 200,
            "no more copies than launches"
        );
        assert_eq!(sets(100 << 20, 200), 3);
        assert_eq!(sets(1 << 30, 200), 2, "at least two copies");
        assert_eq!(sets(0, 100), WARMUP + 100);
    }

    #[test]
    fn records_count_the_bytes_each_tensor_moves() {
        let record = Workload::norm(NormKind::FusedAddRmsNorm, 4, 8)
            .record(100)
            .end();
        // x and residual read, residual and out written: 4 tensors of 4·8 bf16; weight read once.
        let bytes = 4 * 4 * 8 * 2 + 8 * 2;
        assert!(record.contains(&format!("\"bytes\":{bytes},")), "{record}");
        let record = Workload::topk(2, 16, 4).record(100).end();
        let bytes = 2 * 16 * 2 + 2 * 4 * (2 + 4);
        assert!(record.contains(&format!("\"bytes\":{bytes},")), "{record}");
        assert!(
            record.contains("\"params\":{\"rows\":2,\"n\":16,\"k\":4}"),
            "{record}"
        );
    }

    #[test]
    fn json_escapes_strings_and_writes_null_for_what_is_not_a_number() {
        let nested = Json::object().field("k", &3usize);
        let list = [Json::object().field("b", &true)];
        let text = Json::object()
            .field("s", "a\"b\\c\nd\u{1}")
            .field("x", &1.5f64)
            .field("nan", &f64::NAN)
            .field("none", &None::<&str>)
            .field("o", &nested)
            .field("l", list.as_slice())
            .end();
        assert_eq!(
            text,
            r#"{"s":"a\"b\\c\nd\u0001","x":1.5e0,"nan":null,"none":null,"o":{"k":3},"l":[{"b":true}]}"#
        );
    }

    #[test]
    fn noise_wraps_around() {
        let noise = Noise::new(&mut StdRng::seed_from_u64(1), 3);
        let all = noise.take(0, 6);
        assert_eq!(noise.take(2, 8), [&all[4..], &all[..], &all[..0]].concat());
        assert_eq!(noise.take(4, 2), all[2..4]);
        let values = decode(ELEM, &all);
        assert!(values.iter().all(|v| (-2.0..2.0).contains(v)), "{values:?}");
    }

    #[test]
    fn the_reference_passes_and_wrong_topk_outputs_do_not() {
        let workload = Workload::topk(2, 4, 2);
        let inputs = Named::one("x", vec![1.0, 4.0, -2.0, 3.0, 0.5, 0.25, 7.0, 0.5]);
        let want = workload.reference(&inputs).unwrap();
        assert_eq!(want.get("values").unwrap(), [4.0, 3.0, 7.0, 0.5]);
        let mut got = Named::default();
        got.push("values", vec![4.0, 3.0, 7.0, 0.5]);
        got.push("indices", vec![1.0, 3.0, 2.0, 3.0]);
        assert_eq!(workload.exact_problem(&inputs, &got, &want).unwrap(), None);

        let mut got = Named::default();
        got.push("values", vec![4.0, 3.0, 7.0, 0.5]);
        got.push("indices", vec![1.0, 3.0, 2.0, 4.0]);
        let problem = workload.exact_problem(&inputs, &got, &want).unwrap();
        assert!(problem.unwrap().contains("0 top-k values differ"));

        let mut got = Named::default();
        got.push("values", vec![4.0, 1.0, 7.0, 0.5]);
        got.push("indices", vec![1.0, 0.0, 2.0, 1.0]);
        let problem = workload
            .exact_problem(&inputs, &got, &want)
            .unwrap()
            .unwrap();
        assert!(problem.starts_with("1 top-k values differ"), "{problem}");
        assert!(problem.contains("and 1 indices"), "{problem}");
    }

    #[test]
    fn a_missing_tensor_is_an_error_not_a_panic() {
        let error = Workload::softmax(1, 4)
            .reference(&Named::default())
            .unwrap_err();
        assert_eq!(error, "the check has no tensor `x`");
    }
}
