//! The kernel speed benchmark's table: which kernels `gpu_kernel_bench` times at which sizes,
//! and the JSON lines it prints for `bench/python/kernel_bench.py`.
//!
//! A workload names sizes only. Its call (the kernel's arguments in order: buffers by name,
//! type and use; the values passed) is the one the parity tests make their cases from
//! ([`hk_tests::kernels`]), and so is the case that checks its results; how long each buffer is
//! comes from the kernel's contract ([`hkload::Kernel::extents`]), as [`Sizes`].

use std::sync::Arc;

use hk_format::abi::ScalarType;
use hk_format::target::{TargetId, Vendor};
use hk_tests::case::{Call, CallArg, Case};
use hk_tests::kernels::activation::{self, Activation};
use hk_tests::kernels::norm::{self, NormKind};
use hk_tests::kernels::rope::{self, RopeLayout, RopeStyle};
use hk_tests::kernels::{softmax, topk};
use hkload::driver::{DevicePtr, RecordingDriver};
use hkload::{Arg, Bundle, Device, Kernel, LoadedBundle, RawPointer};
use serde::Serialize;
use serde_json::{Value, json};

/// The element type of every benchmarked tensor except the RoPE tables (f32) and the top-k
/// indices (i32).
pub const ELEM: ScalarType = ScalarType::Bf16;

/// Untimed launches before the timed ones (module load and clocks settle there).
pub const WARMUP: usize = 10;
pub const DEFAULT_ITERS: usize = 200;
/// The issue asks for medians of at least this many timed launches.
pub const MIN_ITERS: usize = 100;

/// What the rotating copies of a shape's tensors hold together, at least: five times the L2 of
/// an H100 or H200 (50 MB), so that each launch reads memory, not cache.
pub const ROTATION_BYTES: u64 = 256 << 20;

/// Buffers that keep one copy for every set, as a model's parameters do: the norms' weights and
/// biases and RoPE's tables. Every other buffer a kernel reads rotates over the sets.
pub const SHARED: [&str; 4] = ["weight", "bias", "cos", "sin"];

/// The shapes of the benchmark, each kernel's smallest first (it is the one checked): the
/// seed's tables (RMSNorm and softmax from 128 to 65536 rows of 128; fused add-RMSNorm and
/// LayerNorm from 4096 rows; silu_and_mul over `x` of 256 columns and two wide ones; RoPE;
/// top-k) plus 4096 tokens of hidden sizes 4096 and 8192 for the norms and softmax.
pub const WORKLOADS: [Workload; 34] = [
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

/// One kernel at one shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
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

impl Workload {
    pub const fn norm(kind: NormKind, rows: usize, cols: usize) -> Self {
        Self::Norm { kind, rows, cols }
    }

    pub const fn softmax(rows: usize, cols: usize) -> Self {
        Self::Softmax { rows, cols }
    }

    pub const fn silu_and_mul(rows: usize, width: usize) -> Self {
        Self::SiluAndMul { rows, width }
    }

    pub const fn rope(batch: usize, heads: usize, seq: usize, dim: usize) -> Self {
        Self::Rope {
            batch,
            heads,
            seq,
            dim,
        }
    }

    pub const fn topk(rows: usize, n: usize, k: usize) -> Self {
        Self::TopK { rows, n, k }
    }

    /// The kernel's name without the element type, as the script knows it.
    pub fn kernel(self) -> &'static str {
        match self {
            Self::Norm { kind, .. } => kind.name(),
            Self::Softmax { .. } => "softmax",
            Self::SiluAndMul { .. } => "silu_and_mul",
            Self::Rope { .. } => "rope_neox_bhsd",
            Self::TopK { .. } => "topk",
        }
    }

    /// The kernel's symbol in the bundle: its call's.
    pub fn symbol(self) -> String {
        self.call().kernel
    }

    /// The shape as the tables write it: `4096x128`, `4x32x1024x128`, `4096x1024 k=32`.
    pub fn shape(self) -> String {
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

    /// Elements of the main input, to order a kernel's shapes by.
    pub fn elements(self) -> usize {
        match self {
            Self::Norm { rows, cols, .. } | Self::Softmax { rows, cols } => rows * cols,
            Self::SiluAndMul { rows, width } => rows * width,
            Self::Rope {
                batch,
                heads,
                seq,
                dim,
            } => batch * heads * seq * dim,
            Self::TopK { rows, n, .. } => rows * n,
        }
    }

    /// The parameters the script needs to build the same operation in PyTorch: the shape, and
    /// the values the call passes that PyTorch's function takes too.
    pub fn params(self) -> Value {
        match self {
            Self::Norm { kind, rows, cols } => {
                json!({"rows": rows, "cols": cols, "eps": f64::from(norm::eps(kind))})
            }
            Self::Softmax { rows, cols } => json!({"rows": rows, "cols": cols}),
            Self::SiluAndMul { rows, width } => json!({"rows": rows, "width": width}),
            Self::Rope {
                batch,
                heads,
                seq,
                dim,
            } => {
                json!({"batch": batch, "heads": heads, "seq": seq, "dim": dim, "base": rope::BASE})
            }
            Self::TopK { rows, n, k } => json!({"rows": rows, "n": n, "k": k}),
        }
    }

    /// The call, as the kernel family's tests describe it.
    pub fn call(self) -> Call {
        match self {
            Self::Norm { kind, rows, cols } => norm::call(kind, ELEM, rows, cols),
            Self::Softmax { rows, cols } => softmax::call(ELEM, rows, cols),
            Self::SiluAndMul { rows, width } => {
                activation::gated_call(Activation::Silu, ELEM, rows, width / 2)
            }
            Self::Rope { .. } => {
                rope::call(RopeStyle::NeoX, RopeLayout::Bhsd, ELEM, self.rope_shape())
            }
            Self::TopK { rows, n, k } => topk::call(ELEM, rows, n, k),
        }
    }

    /// The family's test case of the call, with fresh inputs from `rng` and the f64 reference:
    /// what checks the results of the kernel the benchmark times.
    pub fn case(self, rng: &mut impl rand::Rng) -> Case {
        match self {
            Self::Norm { kind, rows, cols } => norm::case_at(kind, ELEM, rows, cols, rng),
            Self::Softmax { rows, cols } => softmax::case_at(ELEM, rows, cols, rng),
            Self::SiluAndMul { rows, width } => {
                activation::gated_case_at(Activation::Silu, ELEM, rows, width / 2, rng)
            }
            Self::Rope { .. } => rope::case(
                RopeStyle::NeoX,
                RopeLayout::Bhsd,
                ELEM,
                self.rope_shape(),
                rng,
            ),
            Self::TopK { rows, n, k } => topk::case_at(ELEM, rows, n, k, rng),
        }
    }

    /// The values of a buffer filled with a table rather than noise: RoPE's cos and sin.
    pub fn table(self, name: &str) -> Option<Vec<f64>> {
        let Self::Rope { seq, dim, .. } = self else {
            return None;
        };
        let (cos, sin) = rope::rope_tables(seq, dim, rope::BASE);
        match name {
            "cos" => Some(cos),
            "sin" => Some(sin),
            _ => None,
        }
    }

    fn rope_shape(self) -> rope::Shape {
        match self {
            Self::Rope {
                batch,
                heads,
                seq,
                dim,
            } => rope::Shape::new(batch, heads, seq, dim, dim),
            _ => unreachable!("only a RoPE workload has a RoPE shape"),
        }
    }
}

/// The workloads `--only` keeps (all without it); an unknown name is an error, not an empty run.
pub fn selected(only: Option<&[String]>) -> Result<Vec<Workload>, String> {
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

/// One buffer of a workload's call with its length from the contract.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// The argument's name in the manifest, which the script uses too.
    pub name: &'static str,
    pub elem: ScalarType,
    pub len: usize,
    pub reads: bool,
    pub writes: bool,
    /// Whether a copy is made for each set (see [`SHARED`]); written-only buffers never are:
    /// PyTorch's caching allocator hands each iteration the block the last one freed, so both
    /// sides write to one buffer over and over.
    pub rotated: bool,
}

impl Tensor {
    pub fn bytes(&self) -> u64 {
        self.len as u64 * u64::from(self.elem.size())
    }
}

/// The buffers of a call, each as long as the kernel's contract says (`extents`, by argument,
/// 0 for values), in the call's order; `None` for the values.
pub fn tensors(call: &Call, extents: &[u64]) -> Result<Vec<Option<Tensor>>, String> {
    if extents.len() != call.args.len() {
        return Err(format!(
            "the contract of {} gives {} extents for {} arguments",
            call.kernel,
            extents.len(),
            call.args.len()
        ));
    }
    call.args
        .iter()
        .zip(extents)
        .map(|(arg, &extent)| match *arg {
            CallArg::Scalar(_) => Ok(None),
            CallArg::Buffer { name, elem, access } => Ok(Some(Tensor {
                name,
                elem,
                len: usize::try_from(extent)
                    .map_err(|_| format!("`{name}` needs {extent} elements"))?,
                reads: access.reads(),
                writes: access.writes(),
                rotated: access.reads() && !SHARED.contains(&name),
            })),
        })
        .collect()
}

/// The workload's kernel in `loaded`, and the buffers of its call as long as the kernel's
/// contract says.
pub fn sized(
    loaded: &LoadedBundle,
    workload: Workload,
) -> Result<(Kernel, Vec<Option<Tensor>>), String> {
    let call = workload.call();
    let kernel = loaded.kernel(&call.kernel).map_err(|e| e.to_string())?;
    let extents = extents(&kernel, &call, loaded.device())?;
    Ok((kernel, tensors(&call, &extents)?))
}

/// The elements each argument of `call` needs, by the kernel's contract (0 for values). The
/// contract reads no buffer's length, so empty ones stand in for them.
pub fn extents(kernel: &Kernel, call: &Call, device: &Device) -> Result<Vec<u64>, String> {
    let args: Vec<Arg<'_>> = call
        .args
        .iter()
        .map(|arg| match *arg {
            CallArg::Scalar(value) => Arg::Scalar(value),
            // SAFETY: zero elements at the null address: there is nothing to address, and
            // `extents` launches nothing.
            CallArg::Buffer { elem, access, .. } => Arg::Raw(unsafe {
                RawPointer::new(DevicePtr(0), device.ordinal(), elem, 0, access.writes())
            }),
        })
        .collect();
    kernel.extents(&args).map_err(|e| e.to_string())
}

/// A simulated device (hkload's recording driver) of the bundle's first NVIDIA target, or its
/// first target: enough to size calls with no GPU.
pub fn simulated_device(bundle: &Bundle) -> Result<Device, String> {
    let targets = &bundle.manifest().map_err(|e| e.to_string())?.targets;
    let target: TargetId = targets
        .iter()
        .find(|t| t.vendor() == Vendor::Nvidia)
        .or(targets.first())
        .copied()
        .ok_or("the bundle has no targets")?;
    Device::new(Arc::new(RecordingDriver::new([target])), 0).map_err(|e| e.to_string())
}

/// Copies of a shape's rotated tensors (`set_bytes` each set): enough to hold
/// [`ROTATION_BYTES`], at least 2, and no more than the launches that use them.
pub fn sets(set_bytes: u64, iters: usize) -> usize {
    let needed = ROTATION_BYTES.div_ceil(set_bytes.max(1));
    usize::try_from(needed)
        .unwrap_or(usize::MAX)
        .clamp(2, (WARMUP + iters).max(2))
}

/// The bytes of one set of a shape's rotated tensors.
pub fn set_bytes(tensors: &[Option<Tensor>]) -> u64 {
    tensors
        .iter()
        .flatten()
        .filter(|t| t.rotated)
        .map(Tensor::bytes)
        .sum()
}

/// One line of the program's output.
#[derive(Debug, Serialize)]
#[serde(tag = "record", rename_all = "lowercase")]
pub enum Record {
    /// The device and the bundle, first.
    Device {
        name: String,
        target: String,
        driver: String,
        bundle: String,
    },
    /// One shape: what `--list` prints, and with `check`, times or `error` what a run does.
    Kernel(KernelRecord),
    /// Last: how many shapes ran and failed.
    Summary { shapes: usize, failed: usize },
}

impl Record {
    /// The record as one line of JSON (NaN and infinities, which JSON lacks, as `null`).
    pub fn line(&self) -> String {
        serde_json::to_string(self).expect("a record is plain data")
    }
}

/// A shape's record.
#[derive(Debug, Serialize)]
pub struct KernelRecord {
    pub kernel: &'static str,
    pub symbol: String,
    pub shape: String,
    pub params: Value,
    /// Bytes one launch moves: each tensor it reads once, each it writes once.
    pub bytes: u64,
    /// Copies of the rotated tensors (see [`sets`]).
    pub sets: usize,
    pub warmup: usize,
    pub iters: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<Check>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p10_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p90_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl KernelRecord {
    /// The record of `workload` with buffers `tensors` (see [`tensors`]), without measurements.
    pub fn new(workload: Workload, tensors: &[Option<Tensor>], iters: usize) -> Self {
        let bytes = tensors
            .iter()
            .flatten()
            .map(|t| t.bytes() * (u64::from(t.reads) + u64::from(t.writes)))
            .sum();
        Self {
            kernel: workload.kernel(),
            symbol: workload.symbol(),
            shape: workload.shape(),
            params: workload.params(),
            bytes,
            sets: sets(set_bytes(tensors), iters),
            warmup: WARMUP,
            iters,
            check: None,
            median_us: None,
            p10_us: None,
            p90_us: None,
            error: None,
        }
    }

    /// The record of a shape that could not even be sized (its kernel is missing, say).
    pub fn failed(workload: Workload, iters: usize, error: String) -> Self {
        Self {
            bytes: 0,
            sets: 0,
            error: Some(error),
            ..Self::new(workload, &[], iters)
        }
    }
}

/// What the check of a kernel's first shape found: its test case's verdict.
#[derive(Debug, Serialize)]
pub struct Check {
    /// The test case's label (its inputs' sizes and ranges).
    pub case: String,
    pub passed: bool,
    /// The largest error of an output compared with a tolerance, as a fraction of it (`null`
    /// when every output is compared exactly, or for NaN).
    pub worst: Option<f64>,
    /// What was wrong, when something was.
    pub problem: Option<String>,
    /// The files `--dump` wrote.
    pub dump: Vec<Dumped>,
}

/// One tensor of the check written to the `--dump` folder, raw little-endian.
#[derive(Debug, Serialize)]
pub struct Dumped {
    pub tensor: &'static str,
    pub dtype: &'static str,
    /// `in` (before the launch) or `out` (after).
    pub stage: &'static str,
    pub path: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use hk_format::abi::ParamType;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use std::collections::HashSet;
    use std::path::Path;

    #[test]
    fn every_workload_matches_its_kernel_signature() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
        let package = hkpack::manifest::Package::load(&dir).expect("the manifests load");
        let kernels: Vec<_> = package.modules.iter().flat_map(|m| &m.kernels).collect();
        for workload in WORKLOADS {
            let call = workload.call();
            let decl = kernels
                .iter()
                .find(|k| k.symbol == call.kernel)
                .unwrap_or_else(|| panic!("no kernel {} in the manifests", call.kernel));
            assert_eq!(call.args.len(), decl.args.len(), "{}", call.kernel);
            for (arg, param) in call.args.iter().zip(&decl.args) {
                let want = match *arg {
                    CallArg::Buffer { name, elem, access } => {
                        assert_eq!(name, param.name, "{}", call.kernel);
                        ParamType::Pointer {
                            pointee: elem,
                            mutable: access.writes(),
                        }
                    }
                    CallArg::Scalar(value) => ParamType::Scalar(value.ty()),
                };
                assert_eq!(param.ty, want, "{} {}", call.kernel, param.name);
            }
        }
    }

    /// The check runs a test case with its f64 reference on the host: the first shape of each
    /// kernel is its smallest, and small enough for that.
    #[test]
    fn each_kernel_is_checked_on_its_smallest_shape() {
        let mut first = HashSet::new();
        for (i, w) in WORKLOADS.iter().enumerate() {
            if first.insert(w.kernel()) {
                let later = WORKLOADS[i..].iter().filter(|v| v.kernel() == w.kernel());
                assert!(
                    later.clone().all(|v| v.elements() >= w.elements()),
                    "{}",
                    w.shape()
                );
                assert!(
                    w.elements() <= 1 << 24,
                    "{} {} is slow to check",
                    w.kernel(),
                    w.shape()
                );
            }
        }
    }

    /// The case that checks a shape makes the same call as the one timed.
    #[test]
    fn the_checked_case_makes_the_timed_call() {
        let mut rng = StdRng::seed_from_u64(1);
        let small = [
            Workload::norm(NormKind::RmsNorm, 3, 8),
            Workload::norm(NormKind::FusedAddRmsNorm, 3, 8),
            Workload::norm(NormKind::LayerNorm, 3, 8),
            Workload::softmax(3, 8),
            Workload::silu_and_mul(3, 16),
            Workload::rope(1, 2, 3, 8),
            Workload::topk(3, 16, 4),
        ];
        let mut kernels: Vec<&str> = WORKLOADS.iter().map(|w| w.kernel()).collect();
        kernels.dedup();
        assert_eq!(
            small.iter().map(|w| w.kernel()).collect::<Vec<_>>(),
            kernels,
            "a small shape of every benchmarked kernel"
        );
        for workload in small {
            assert_eq!(workload.case(&mut rng).call(), workload.call());
        }
        assert_eq!(Workload::rope(1, 2, 3, 8).table("cos").unwrap().len(), 12);
        assert_eq!(Workload::softmax(1, 2).table("cos"), None);
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
        let workload = Workload::norm(NormKind::FusedAddRmsNorm, 4, 8);
        let sized = tensors(&workload.call(), &[32, 32, 32, 8, 0, 0, 0]).unwrap();
        let record = KernelRecord::new(workload, &sized, 100);
        // x and residual read, residual and out written: 4 tensors of 4·8 bf16; weight read once.
        assert_eq!(record.bytes, 4 * 4 * 8 * 2 + 8 * 2);
        assert_eq!(set_bytes(&sized), 2 * 4 * 8 * 2, "x and residual rotate");
        let workload = Workload::topk(2, 16, 4);
        let sized = tensors(&workload.call(), &[8, 8, 32, 0, 0, 0]).unwrap();
        assert_eq!(
            KernelRecord::new(workload, &sized, 100).bytes,
            2 * 16 * 2 + 2 * 4 * (2 + 4)
        );
        assert!(tensors(&workload.call(), &[8, 8]).is_err());
    }

    #[test]
    fn records_are_json_lines_with_null_for_what_is_not_a_number() {
        let workload = Workload::topk(2, 16, 4);
        let mut record = KernelRecord::new(workload, &[], 100);
        record.median_us = Some(f64::NAN);
        record.check = Some(Check {
            case: "rows=2".into(),
            passed: false,
            worst: Some(f64::INFINITY),
            problem: Some("a \"quoted\"\nproblem".into()),
            dump: vec![],
        });
        let line = Record::Kernel(record).line();
        assert!(!line.contains('\n'), "{line}");
        let value: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["record"], "kernel");
        assert_eq!(value["symbol"], "topk_bf16");
        assert_eq!(value["params"], json!({"rows": 2, "n": 16, "k": 4}));
        assert_eq!(value["median_us"], Value::Null);
        assert_eq!(value["check"]["worst"], Value::Null);
        assert_eq!(value["check"]["problem"], "a \"quoted\"\nproblem");
        assert!(value.get("error").is_none(), "{line}");
        let summary = Record::Summary {
            shapes: 3,
            failed: 1,
        };
        assert_eq!(
            summary.line(),
            r#"{"record":"summary","shapes":3,"failed":1}"#
        );
    }

    #[test]
    fn only_keeps_the_named_kernels_and_refuses_unknown_ones() {
        let only = ["topk".to_owned(), "softmax".to_owned()];
        let kept = selected(Some(&only)).unwrap();
        assert!(
            kept.iter()
                .all(|w| matches!(w.kernel(), "topk" | "softmax"))
        );
        assert_eq!(kept.len(), 9);
        let error = selected(Some(&["gemm".to_owned()])).unwrap_err();
        assert!(error.contains("`gemm`"), "{error}");
        assert_eq!(selected(None).unwrap().len(), WORKLOADS.len());
    }
}
