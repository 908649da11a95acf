//! Launch contracts end to end: written in a manifest, checked by hkpack at build time with
//! errors at their line and column, and enforced by hkload at every call on a simulated device
//! (every requirement of the repository's kernels on both sides of its boundary, the shapes
//! the contracts compute, empty grids).

mod common;

use std::sync::Arc;

use common::*;
use hk_format::abi::{ParamType, ScalarType, ScalarValue};
use hkload::driver::{DevicePtr, LaunchDims, Recorded, RecordingDriver, StreamHandle};
use hkload::{Arg, Bundle, Device, DeviceBuffer, Error, LaunchError, RawPointer};

fn simulated(id: &str) -> (Arc<RecordingDriver>, Device) {
    let driver = Arc::new(RecordingDriver::new([id.parse().unwrap()]));
    let device = Device::new(driver.clone(), 0).unwrap();
    (driver, device)
}

/// Arguments for `symbol`: every integer scalar from `values` by name (0 when not named),
/// floating-point scalars 1, every buffer `len` elements long.
struct Call {
    buffers: Vec<DeviceBuffer>,
    scalars: Vec<ScalarValue>,
    params: Vec<hk_format::abi::Param>,
}

impl Call {
    fn new(
        bundle: &Bundle,
        device: &Device,
        symbol: &str,
        values: &[(&str, u64)],
        len: usize,
    ) -> Self {
        let params = bundle.kernel_record(symbol).unwrap().args.clone();
        let mut buffers = Vec::new();
        let mut scalars = Vec::new();
        for param in &params {
            match param.ty {
                ParamType::Pointer { pointee, .. } => {
                    buffers.push(device.alloc(pointee, len).unwrap())
                }
                ParamType::Scalar(t) => {
                    let v = values
                        .iter()
                        .find(|(n, _)| *n == param.name)
                        .map_or(0, |(_, v)| *v);
                    scalars.push(match t {
                        ScalarType::U32 => ScalarValue::U32(v as u32),
                        ScalarType::U64 => ScalarValue::U64(v),
                        ScalarType::I32 => ScalarValue::I32(v as i32),
                        ScalarType::F32 => ScalarValue::F32(1.0),
                        other => panic!("no test value for {other}"),
                    });
                }
            }
        }
        Self {
            buffers,
            scalars,
            params,
        }
    }

    fn args(&self) -> Vec<Arg<'_>> {
        let (mut b, mut s) = (self.buffers.iter(), self.scalars.iter());
        self.params
            .iter()
            .map(|p| match p.ty {
                ParamType::Pointer { mutable: true, .. } => Arg::BufferMut(b.next().unwrap()),
                ParamType::Pointer { .. } => Arg::Buffer(b.next().unwrap()),
                ParamType::Scalar(_) => Arg::Scalar(*s.next().unwrap()),
            })
            .collect()
    }
}

fn call(
    bundle: &Bundle,
    device: &Device,
    symbol: &str,
    values: &[(&str, u64)],
    len: usize,
) -> Result<(), Error> {
    let loaded = bundle.load(device).unwrap();
    let kernel = loaded.kernel(symbol).unwrap();
    let call = Call::new(bundle, device, symbol, values, len);
    kernel.call(StreamHandle::DEFAULT, &call.args())
}

fn shape(
    bundle: &Bundle,
    device: &Device,
    symbol: &str,
    values: &[(&str, u64)],
    len: usize,
) -> LaunchDims {
    let loaded = bundle.load(device).unwrap();
    let kernel = loaded.kernel(symbol).unwrap();
    let call = Call::new(bundle, device, symbol, values, len);
    kernel.launch_shape(&call.args()).unwrap()
}

/// The requirement error's text, or a panic naming what came instead.
fn unmet(result: Result<(), Error>) -> String {
    match result {
        Err(error @ Error::Launch(LaunchError::Requirement { .. })) => error.to_string(),
        other => panic!("expected an unmet requirement, got {other:?}"),
    }
}

/// Every `requires` clause of the repository's kernels, at the last value it accepts and the
/// first it refuses. `held` passes the clause: the call launches, or (where the buffers a
/// passing call needs would not fit in memory) fails only later, at an extent.
#[test]
fn every_requirement_is_enforced_on_both_sides_of_its_boundary() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (driver, device) = simulated("sm_90");
    let launched = |result: Result<(), Error>| {
        let before = driver.log().len();
        result.unwrap();
        assert!(driver.log().len() >= before);
    };
    // top-k: 1 <= k, k <= n, k <= 128.
    let topk = |k, n| {
        call(
            &bundle,
            &device,
            "topk_f32",
            &[("rows", 2), ("n", n), ("k", k)],
            4096,
        )
    };
    launched(topk(1, 5));
    assert!(unmet(topk(0, 5)).contains("k must be at least 1"));
    launched(topk(5, 5));
    let text = unmet(topk(6, 5));
    assert!(
        text.contains("`k <= n` is false with k = 6, n = 5"),
        "{text}"
    );
    launched(topk(128, 2000));
    let text = unmet(topk(200, 1000));
    for part in ["topk_f32", "at most 128", "`k <= 128`", "k = 200"] {
        assert!(text.contains(part), "`{part}` not in: {text}");
    }
    // causal conv1d: width >= 1.
    let conv = |width| {
        call(
            &bundle,
            &device,
            "causal_conv1d_f32",
            &[("batch", 1), ("dim", 2), ("seqlen", 9), ("width", width)],
            64,
        )
    };
    launched(conv(1));
    assert!(unmet(conv(0)).contains("`width >= 1`"));
    // RoPE: rot_dim even and at most dim; at most 2^32 - 1 vectors.
    let rope = |rot_dim, dim| {
        call(
            &bundle,
            &device,
            "rope_neox_bhsd_f32",
            &[
                ("batch", 1),
                ("heads", 2),
                ("seq", 3),
                ("dim", dim),
                ("rot_dim", rot_dim),
            ],
            4096,
        )
    };
    launched(rope(8, 8));
    assert!(unmet(rope(10, 8)).contains("rot_dim must be even and at most dim"));
    launched(rope(6, 8));
    assert!(unmet(rope(7, 8)).contains("rot_dim = 7"));
    let thd = |tokens| {
        call(
            &bundle,
            &device,
            "rope_gptj_thd_f32",
            &[
                ("table_rows", 1),
                ("tokens", tokens),
                ("heads", 65536),
                ("dim", 1),
                ("rot_dim", 0),
            ],
            16,
        )
    };
    // 65535 * 65536 = 2^32 - 65536 vectors: allowed, so the call gets as far as the extents.
    assert!(matches!(
        thd(65535),
        Err(Error::Launch(LaunchError::Extent { .. }))
    ));
    assert!(unmet(thd(65537)).contains("vectors = 4295032832"));
}

/// The MoE routing kernels' clauses (manifests/moe_routing.toml), each at the last value it
/// accepts and the first it refuses.
#[test]
fn every_moe_routing_requirement_is_enforced_on_both_sides_of_its_boundary() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (driver, device) = simulated("sm_90");
    // A call with the launches it made.
    let counted = |run: &dyn Fn() -> Result<(), Error>| {
        let launches = || {
            driver
                .log()
                .iter()
                .filter(|r| matches!(r, Recorded::Launch { .. }))
                .count()
        };
        let before = launches();
        let result = run();
        (result, launches() - before)
    };
    let launched = |(result, launches): (Result<(), Error>, usize)| {
        result.unwrap();
        assert_eq!(launches, 1, "one launch");
    };
    let refused = |(result, launches): (Result<(), Error>, usize), parts: &[&str]| {
        assert_eq!(launches, 0, "a refused call launches nothing");
        let text = unmet(result);
        for part in parts {
            assert!(text.contains(part), "`{part}` not in: {text}");
        }
    };
    // topk_softmax: tokens >= 1, 1 <= experts <= 256, ld >= experts, 1 <= k <= min(experts,
    // 16), renormalize 0 or 1.
    let softmax = |tokens, experts, ld, k, renormalize| {
        counted(&|| {
            call(
                &bundle,
                &device,
                "topk_softmax_bf16",
                &[
                    ("tokens", tokens),
                    ("experts", experts),
                    ("ld", ld),
                    ("k", k),
                    ("renormalize", renormalize),
                ],
                4096,
            )
        })
    };
    launched(softmax(1, 8, 8, 2, 0));
    refused(softmax(0, 8, 8, 2, 0), &["tokens must be at least 1"]);
    launched(softmax(2, 256, 256, 8, 1));
    refused(
        softmax(2, 257, 257, 8, 1),
        &["topk_softmax_bf16", "at most 256 experts", "experts = 257"],
    );
    launched(softmax(3, 1, 1, 1, 0));
    refused(softmax(3, 0, 1, 1, 0), &["experts must be at least 1"]);
    launched(softmax(3, 64, 64, 2, 0));
    refused(
        softmax(3, 64, 63, 2, 0),
        &["`ld >= experts` is false with ld = 63, experts = 64"],
    );
    refused(softmax(3, 64, 64, 0, 0), &["k must be at least 1"]);
    launched(softmax(3, 5, 5, 5, 0));
    refused(
        softmax(3, 5, 5, 6, 0),
        &["k (top-k) cannot exceed the number of experts", "k = 6"],
    );
    launched(softmax(3, 256, 256, 16, 0));
    refused(softmax(3, 256, 256, 17, 0), &["at most 16 experts a token"]);
    refused(softmax(3, 8, 8, 2, 2), &["renormalize must be 0 or 1"]);
    // grouped_topk: 1 <= n_group <= 32 dividing experts into groups of at least 2, 1 <=
    // topk_group <= n_group, k <= topk_group * (experts / n_group); the clauses above too.
    let grouped = |experts, n_group, topk_group, k| {
        counted(&|| {
            call(
                &bundle,
                &device,
                "grouped_topk_f32",
                &[
                    ("tokens", 3),
                    ("experts", experts),
                    ("ld", experts),
                    ("n_group", n_group),
                    ("topk_group", topk_group),
                    ("k", k),
                ],
                4096,
            )
        })
    };
    launched(grouped(256, 8, 4, 8));
    refused(grouped(256, 0, 1, 8), &["n_group must be 1 to 32"]);
    launched(grouped(64, 32, 4, 8));
    refused(
        grouped(66, 33, 4, 8),
        &["n_group must be 1 to 32", "n_group = 33"],
    );
    refused(
        grouped(252, 8, 4, 8),
        &["n_group must divide experts", "experts = 252, n_group = 8"],
    );
    refused(
        grouped(32, 32, 4, 2),
        &["groups must hold at least 2 experts"],
    );
    launched(grouped(256, 8, 8, 8));
    refused(grouped(256, 8, 9, 8), &["topk_group must be 1 to n_group"]);
    refused(grouped(256, 8, 0, 8), &["topk_group must be 1 to n_group"]);
    launched(grouped(16, 8, 1, 2));
    refused(
        grouped(16, 8, 1, 3),
        &["k cannot exceed the experts of the kept groups", "k = 3"],
    );
    refused(grouped(16, 8, 1, 0), &["k must be at least 1"]);
    refused(grouped(512, 8, 4, 8), &["at most 256 experts"]);
}

/// The MoE alignment kernel's clauses (manifests/moe_align.toml), each at the last value it
/// accepts and the first it refuses, and its launch: one block of 1024 threads for every size.
#[test]
fn every_moe_align_requirement_is_enforced_on_both_sides_of_its_boundary() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (driver, device) = simulated("sm_90");
    let launches = || {
        driver
            .log()
            .iter()
            .filter(|r| matches!(r, Recorded::Launch { .. }))
            .count()
    };
    // (tokens, k, experts, local_experts, block_m), buffers of 2^16 elements (enough for every
    // accepted call here).
    let align = |tokens, k, experts, local_experts, block_m| {
        let before = launches();
        let result = call(
            &bundle,
            &device,
            "moe_align_block_size",
            &[
                ("tokens", tokens),
                ("k", k),
                ("experts", experts),
                ("local_experts", local_experts),
                ("block_m", block_m),
            ],
            1 << 16,
        );
        (result, launches() - before)
    };
    let launched = |(result, launches): (Result<(), Error>, usize)| {
        result.unwrap();
        assert_eq!(launches, 1, "one launch");
    };
    let refused = |(result, launches): (Result<(), Error>, usize), parts: &[&str]| {
        assert_eq!(launches, 0, "a refused call launches nothing");
        let text = unmet(result);
        for part in parts {
            assert!(text.contains(part), "`{part}` not in: {text}");
        }
    };
    launched(align(1, 8, 256, 256, 64));
    refused(
        align(0, 8, 256, 256, 64),
        &["moe_align_block_size", "tokens must be at least 1"],
    );
    launched(align(3, 1, 8, 8, 16));
    refused(align(3, 0, 8, 8, 16), &["k must be at least 1"]);
    launched(align(3, 1, 1, 1, 16));
    refused(align(3, 1, 0, 1, 16), &["experts must be at least 1"]);
    launched(align(3, 8, 1024, 1024, 16));
    refused(
        align(3, 8, 1025, 1024, 16),
        &["at most 1024 experts", "experts = 1025"],
    );
    refused(
        align(3, 8, 64, 0, 16),
        &["local_experts must be at least 1"],
    );
    launched(align(3, 8, 64, 64, 16));
    refused(
        align(3, 8, 64, 65, 16),
        &[
            "local_experts cannot exceed experts",
            "local_experts = 65, experts = 64",
        ],
    );
    launched(align(3, 8, 64, 16, 256));
    for block_m in [8, 15, 17, 48, 255, 257, 512] {
        refused(
            align(3, 8, 64, 16, block_m),
            &[
                "block_m must be a power of two from 16 to 256",
                &format!("block_m = {block_m}"),
            ],
        );
    }
    for block_m in [16, 32, 64, 128] {
        launched(align(3, 8, 64, 16, block_m));
    }
    // Every row and the sentinel fit an i32: tokens * k + experts * (block_m - 1) < 2^31. Such
    // calls need buffers that do not fit in memory, so they are described, and only the shape
    // is asked for (after the requirements).
    let loaded = bundle.load(&device).unwrap();
    let kernel = loaded.kernel("moe_align_block_size").unwrap();
    let rows = |tokens: u64| {
        let values = [
            ("tokens", tokens),
            ("k", 1),
            ("experts", 1),
            ("local_experts", 1),
            ("block_m", 16),
        ];
        kernel.launch_shape(&described_args(&bundle, "moe_align_block_size", &values))
    };
    rows((1 << 31) - 16).unwrap();
    let text = rows((1 << 31) - 15).map(|_| ());
    assert!(unmet(text).contains("rows must fit an int32"));
    // One block of 1024 threads on both vendors, whatever the size.
    let (_, amd) = simulated("gfx942:sramecc+:xnack-");
    for device in [&device, &amd] {
        for tokens in [1, 64, 8192] {
            let values = [
                ("tokens", tokens),
                ("k", 8),
                ("experts", 256),
                ("local_experts", 256),
                ("block_m", 64),
            ];
            let dims = shape(&bundle, device, "moe_align_block_size", &values, 1 << 17);
            assert_eq!((dims.grid, dims.block), ([1, 1, 1], [1024, 1, 1]));
        }
    }
    // The extents: sorted_token_ids holds tokens * k + experts * (block_m - 1) rows, expert_ids
    // one entry a block of them; one element fewer is refused.
    let extents = kernel
        .extents(&described_args(
            &bundle,
            "moe_align_block_size",
            &[
                ("tokens", 3),
                ("k", 8),
                ("experts", 256),
                ("local_experts", 64),
                ("block_m", 64),
            ],
        ))
        .unwrap();
    assert_eq!(
        extents[..5],
        [24 + 256 * 63, (24 + 256 * 63_u64).div_ceil(64), 1, 24, 256]
    );
}

/// The MoE grouped GEMMs' and the combine's clauses (manifests/moe_gemm.toml), each at the last
/// value it accepts and the first it refuses, and their launches: the GEMMs' grid covers every
/// block of sorted rows the layout may have, whatever the routing (a fixed shape, for CUDA
/// graphs), with the stages and the row map in dynamic shared memory on NVIDIA.
#[test]
fn every_moe_gemm_requirement_is_enforced_and_its_launch_is_fixed() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (_, nvidia) = simulated("sm_90");
    let (_, amd) = simulated("gfx942:sramecc+:xnack-");
    let with = |base: &[(&'static str, u64)], changes: &[(&'static str, u64)]| {
        let mut values = base.to_vec();
        for &(name, value) in changes {
            values.iter_mut().find(|(n, _)| *n == name).unwrap().1 = value;
        }
        values
    };
    // Held: the call launches, or (buffers too short for the sizes) fails only at an extent.
    let held = |symbol: &str, values: Vec<(&str, u64)>| match call(
        &bundle,
        &nvidia,
        symbol,
        &values,
        1 << 12,
    ) {
        Ok(()) | Err(Error::Launch(LaunchError::Extent { .. })) => {}
        Err(other) => panic!("{symbol} {values:?}: {other}"),
    };
    let refused = |symbol: &str, values: Vec<(&str, u64)>, needle: &str| {
        let text = unmet(call(&bundle, &nvidia, symbol, &values, 1 << 12));
        assert!(text.contains(needle), "{symbol} {values:?}: {text}");
    };
    let gemm = [
        ("tokens", 3),
        ("topk", 2),
        ("experts", 4),
        ("n", 5),
        ("k", 4),
        ("lda", 4),
        ("ldc", 5),
    ];
    // (symbol, block_m): at most 65535 blocks of block_m sorted rows, padded_max = tokens * topk
    // + experts * (block_m - 1): 8388480 = 8387972 + 4 * 127 for 128, 1048560 = 1048500 + 4 * 15
    // for 16.
    for (symbol, block_m) in [
        ("moe_gemm_gated_silu_bf16", 128),
        ("moe_gemm_down_f16", 128),
        ("moe_gemm_gated_silu_m16_f16", 16),
        ("moe_gemm_down_m16_bf16", 16),
    ] {
        held(symbol, gemm.to_vec());
        for (name, message) in [
            ("tokens", "tokens must be at least 1"),
            ("topk", "topk must be at least 1"),
            ("experts", "experts must be at least 1"),
            ("n", "n must be at least 1"),
            ("k", "k must be at least 1"),
        ] {
            held(symbol, with(&gemm, &[(name, 1)]));
            refused(symbol, with(&gemm, &[(name, 0)]), message);
        }
        refused(
            symbol,
            with(&gemm, &[("lda", 3)]),
            "`lda >= k` is false with lda = 3, k = 4",
        );
        refused(
            symbol,
            with(&gemm, &[("ldc", 4)]),
            "`ldc >= n` is false with ldc = 4, n = 5",
        );
        let most = 65535 * block_m;
        let tokens = most - 4 * (block_m - 1);
        held(symbol, with(&gemm, &[("tokens", tokens), ("topk", 1)]));
        refused(
            symbol,
            with(&gemm, &[("tokens", tokens + 1), ("topk", 1)]),
            &format!("must be at most {most}: block_m = {block_m},"),
        );
    }
    let sum = [
        ("tokens", 3),
        ("topk", 2),
        ("experts", 4),
        ("n", 5),
        ("ldo", 5),
        ("ldy", 5),
    ];
    for symbol in ["moe_sum_bf16", "moe_sum_f16"] {
        held(symbol, sum.to_vec());
        refused(
            symbol,
            with(&sum, &[("tokens", 0)]),
            "tokens must be at least 1",
        );
        refused(
            symbol,
            with(&sum, &[("experts", 0)]),
            "experts must be at least 1",
        );
        held(symbol, with(&sum, &[("topk", 64)]));
        refused(
            symbol,
            with(&sum, &[("topk", 65)]),
            "the combine sums at most 64 choices a token",
        );
        let wide = |n| with(&sum, &[("n", n), ("ldo", n), ("ldy", n)]);
        held(symbol, wide(134_215_680));
        refused(symbol, wide(134_215_681), "n must be at most 134215680");
        refused(symbol, with(&sum, &[("ldo", 4)]), "`ldo >= n`");
        refused(symbol, with(&sum, &[("ldy", 4)]), "`ldy >= n`");
    }

    // Launches: 3 tokens top-2 over 4 experts may fill 6 + 4 * 127 = 514 sorted rows, 5
    // blocks of 128, however they are routed; DeepSeek-V3's decode step (1 token, top-8 of 256)
    // 8 + 256 * 127 rows, 255 blocks.
    let launch = |device, symbol, tokens, topk, experts, n| {
        let values = [
            ("tokens", tokens),
            ("topk", topk),
            ("experts", experts),
            ("n", n),
            ("k", 64),
            ("lda", 64),
            ("ldc", n),
            ("ldo", n),
            ("ldy", n),
        ];
        let dims = shape(&bundle, device, symbol, &values, 1 << 23);
        (dims.grid, dims.block[0], dims.shared_bytes)
    };
    let gated = "moe_gemm_gated_silu_bf16";
    assert_eq!(launch(&nvidia, gated, 3, 2, 4, 70), ([2, 5, 1], 128, 50176));
    assert_eq!(launch(&amd, gated, 3, 2, 4, 70), ([2, 5, 1], 256, 0));
    assert_eq!(
        launch(&nvidia, gated, 1, 8, 256, 256),
        ([4, 255, 1], 128, 50176)
    );
    let down = "moe_gemm_down_f16";
    assert_eq!(launch(&nvidia, down, 3, 2, 4, 130), ([2, 5, 1], 128, 66560));
    assert_eq!(launch(&amd, down, 3, 2, 4, 130), ([2, 5, 1], 256, 0));
    // The decode forms: blocks of 16 sorted rows, 6 + 4 * 15 = 66 rows in 5 blocks; 16 x 64 of h
    // and 16 x 128 of out; DeepSeek-V3's decode step 8 + 256 * 15 rows, 241 blocks.
    let gated = "moe_gemm_gated_silu_m16_bf16";
    assert_eq!(launch(&nvidia, gated, 3, 2, 4, 70), ([2, 5, 1], 128, 73856));
    assert_eq!(launch(&amd, gated, 3, 2, 4, 70), ([2, 5, 1], 256, 0));
    assert_eq!(
        launch(&nvidia, gated, 1, 8, 256, 256),
        ([4, 241, 1], 128, 73856)
    );
    let down = "moe_gemm_down_m16_f16";
    assert_eq!(launch(&nvidia, down, 3, 2, 4, 130), ([2, 5, 1], 128, 73856));
    assert_eq!(launch(&amd, down, 3, 2, 4, 130), ([2, 5, 1], 256, 0));
    assert_eq!(launch(&amd, down, 64, 2, 8, 4096), ([32, 16, 1], 256, 0));
    // The combine: a token's row in blocks of 2048 columns along y.
    assert_eq!(
        launch(&amd, "moe_sum_bf16", 3, 2, 4, 2049),
        ([3, 2, 1], 256, 0)
    );
    assert_eq!(
        launch(&nvidia, "moe_sum_f16", 1, 8, 256, 7168),
        ([1, 4, 1], 256, 0)
    );
}

#[test]
fn contracts_compute_each_kernels_launch_shape() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (_, nvidia) = simulated("sm_90");
    let (_, amd) = simulated("gfx942:sramecc+:xnack-");
    // The row kernels: a team of lanes per row, each lane at most 64 bytes of it, blocks of
    // one team or 64 threads. (element type's kernel, rows, cols) -> (blocks, threads).
    for (symbol, rows, cols, want) in [
        ("rmsnorm_bf16", 64, 256, (8, 64)), // 512 bytes: 8 lanes, 8 rows a block
        ("rmsnorm_f32", 64, 1024, (64, 64)), // 4 KiB: 64 lanes, a block a row
        ("rmsnorm_bf16", 64, 4096, (64, 128)), // 8 KiB: 128 lanes
        ("softmax_bf16", 64, 100_000, (64, 256)), // longer rows: a whole block
        ("layernorm_f16", 3, 7, (1, 64)),
    ] {
        let dims = shape(
            &bundle,
            &nvidia,
            symbol,
            &[("rows", rows), ("cols", cols)],
            1 << 23,
        );
        assert_eq!(
            (dims.grid[0], dims.block[0]),
            want,
            "{symbol} {rows}x{cols}"
        );
    }
    // top-k: short rows one a wave (8 a block of 256 on NVIDIA, 4 on AMD), long ones a block.
    let topk = |device, n| {
        shape(
            &bundle,
            device,
            "topk_bf16",
            &[("rows", 64), ("n", n), ("k", 4)],
            64 * 1025,
        )
        .grid
    };
    assert_eq!(topk(&nvidia, 1024), [8, 1, 1]);
    assert_eq!(topk(&amd, 1024), [16, 1, 1]);
    assert_eq!(topk(&nvidia, 1025), [64, 1, 1]);
    // MoE routing: one wave a token, 256 threads a block (8 tokens on NVIDIA, 4 on AMD).
    for (symbol, values) in [
        (
            "topk_softmax_f16",
            vec![("experts", 128), ("ld", 128), ("k", 8)],
        ),
        (
            "grouped_topk_bf16",
            vec![
                ("experts", 256),
                ("ld", 256),
                ("n_group", 8),
                ("topk_group", 4),
                ("k", 8),
            ],
        ),
    ] {
        for (device, tokens, blocks) in [
            (&nvidia, 1, 1),
            (&nvidia, 64, 8),
            (&nvidia, 1000, 125),
            (&amd, 1, 1),
            (&amd, 64, 16),
            (&amd, 1001, 251),
        ] {
            let values: Vec<_> = values.iter().copied().chain([("tokens", tokens)]).collect();
            let dims = shape(&bundle, device, symbol, &values, 1 << 18);
            assert_eq!(
                (dims.grid, dims.block),
                ([blocks, 1, 1], [256, 1, 1]),
                "{symbol} with {tokens} tokens"
            );
        }
    }
}

#[test]
fn an_empty_grid_launches_nothing() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (driver, device) = simulated("gfx950:sramecc+:xnack-");
    call(
        &bundle,
        &device,
        "rmsnorm_bf16",
        &[("rows", 0), ("cols", 4096)],
        4096,
    )
    .unwrap();
    call(&bundle, &device, "silu_f32", &[("n", 0)], 0).unwrap();
    assert!(
        !driver
            .log()
            .iter()
            .any(|r| matches!(r, Recorded::Launch { .. })),
        "nothing to do, nothing launched"
    );
}

/// `Kernel::extents` gives what `call` checks each buffer against, before any buffer of that
/// size exists: zero-length buffers will do, and one element less than an extent is refused.
#[test]
fn extents_are_known_before_the_buffers_exist() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (_, device) = simulated("gfx942:sramecc+:xnack-");
    let loaded = bundle.load(&device).unwrap();
    let kernel = loaded.kernel("fused_add_rmsnorm_f16").unwrap();
    let (rows, cols) = (3u32, 4099u32);
    let empty = Call::new(
        &bundle,
        &device,
        "fused_add_rmsnorm_f16",
        &[("rows", 3), ("cols", 4099)],
        0,
    );
    let extents = kernel.extents(&empty.args()).unwrap();
    let (all, row) = (u64::from(rows * cols), u64::from(cols));
    assert_eq!(extents, [all, all, all, row, 0, 0, 0]);
    // Buffers of exactly those lengths are called; one element short of any is not.
    let sized: Vec<DeviceBuffer> = extents[..4]
        .iter()
        .map(|&n| device.alloc(ScalarType::F16, n as usize).unwrap())
        .collect();
    let short = device.alloc(ScalarType::F16, all as usize - 1).unwrap();
    let mut args = empty.args();
    for (arg, buffer) in args.iter_mut().zip(&sized) {
        *arg = if matches!(arg, Arg::BufferMut(_)) {
            Arg::BufferMut(buffer)
        } else {
            Arg::Buffer(buffer)
        };
    }
    kernel.call(StreamHandle::DEFAULT, &args).unwrap();
    args[2] = Arg::Buffer(&short);
    let refused = kernel.call(StreamHandle::DEFAULT, &args).unwrap_err();
    assert!(
        matches!(refused, Error::Launch(LaunchError::Extent { index: 2, .. })),
        "{refused}"
    );
    // The contract's requirements still hold, and a value where a buffer belongs is refused.
    let mut wrong = empty.args();
    wrong[0] = Arg::Scalar(ScalarValue::U32(1));
    assert!(kernel.extents(&wrong).is_err());
}

/// A kernel remembers its last evaluation, so that repeated calls evaluate nothing; that must
/// never admit a call the contract refuses, nor skip the checks of a caller's own shape.
#[test]
fn a_remembered_evaluation_admits_only_what_the_contract_admits() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (driver, device) = simulated("sm_90");
    let loaded = bundle.load(&device).unwrap();
    let kernel = loaded.kernel("topk_f32").unwrap();
    let with = |rows, n, k, len| {
        Call::new(
            &bundle,
            &device,
            "topk_f32",
            &[("rows", rows), ("n", n), ("k", k)],
            len,
        )
    };
    let last_launch = || match driver.log().pop() {
        Some(Recorded::Launch { dims, args, .. }) => (dims, args),
        other => panic!("expected a launch, got {other:?}"),
    };

    let fits = with(3, 100, 8, 300);
    kernel.call(StreamHandle::DEFAULT, &fits.args()).unwrap();
    let first = last_launch();
    kernel.call(StreamHandle::DEFAULT, &fits.args()).unwrap();
    assert_eq!(
        last_launch(),
        first,
        "a repeated call launches the same shape and bytes"
    );

    // The same values with a buffer one element short: `x` holds rows * n = 300.
    let short = with(3, 100, 8, 299);
    let refused = kernel
        .call(StreamHandle::DEFAULT, &short.args())
        .unwrap_err();
    assert!(
        matches!(
            &refused,
            Error::Launch(LaunchError::Extent {
                needed: 300,
                given: 299,
                ..
            })
        ),
        "{refused}"
    );
    assert!(
        unmet(kernel.call(StreamHandle::DEFAULT, &with(3, 200, 129, 4096).args()))
            .contains("at most 128 values a row")
    );

    // A caller's shape is checked on every launch, remembered values or not.
    let too_big = LaunchDims {
        grid: [1, 1, 1],
        block: [2048, 1, 1],
        shared_bytes: 0,
    };
    // SAFETY: refused before the driver is called, as the assertion checks.
    let refused =
        unsafe { kernel.launch(&too_big, StreamHandle::DEFAULT, &fits.args()) }.unwrap_err();
    assert!(
        matches!(refused, Error::Launch(LaunchError::Dims { .. })),
        "{refused}"
    );
    // SAFETY: the contract's own shape, from the first call.
    unsafe { kernel.launch(&first.0, StreamHandle::DEFAULT, &fits.args()) }.unwrap();
    assert_eq!(last_launch(), first);

    // After a launch with explicit dimensions, `call` still computes its own shape; and an
    // empty grid after a full one launches nothing.
    kernel.call(StreamHandle::DEFAULT, &fits.args()).unwrap();
    assert_eq!(last_launch(), first);
    let launches = driver.log().len();
    kernel
        .call(StreamHandle::DEFAULT, &with(0, 100, 8, 300).args())
        .unwrap();
    assert_eq!(driver.log().len(), launches, "no rows, nothing launched");
}

/// A module manifest for the `scale` test kernel with `contract` as its kernel's contract
/// (line 8 on) and `args` as its signature (line 7).
fn scale_manifest(args: &str, contract: &str) -> String {
    format!(
        "[module]\nname = \"scale\"\nsource = \"../kernels/scale.hip\"\n\n[[kernel]]\nsymbol = \"scale\"\nargs = [{args}]\n[kernel.contract]\n{contract}"
    )
}

const ARGS: &str = r#""out: *mut f32 [n]", "x: *const f32 [n]", "a: f32", "n: u32""#;

#[test]
fn contract_errors_are_build_errors_at_their_position() {
    let grid = |g: &str| scale_manifest(ARGS, &format!("block = \"256\"\ngrid = \"{g}\"\n"));
    let cases: Vec<(String, Vec<&str>)> = vec![
        (
            grid("ceil_div(m, 256)"),
            vec![
                "scale.toml:10:18",
                "unknown name `m`",
                "can read n, wave_size",
            ],
        ),
        (
            grid("n > 256"),
            vec![
                "scale.toml:10:9",
                "grid x",
                "`n > 256` is a condition where an integer is needed",
            ],
        ),
        (
            grid("ceil_div(n, 256"),
            vec!["scale.toml:10:24", "expected `)`"],
        ),
        (
            grid("n $ 2"),
            vec!["scale.toml:10:11", "unexpected character `$`"],
        ),
        (
            grid("9223372036854775807 + 1"),
            vec![
                "scale.toml:10:9",
                "9223372036854775807 + 1 does not fit in 64 bits",
            ],
        ),
        (
            grid("n / (2 - 2)"),
            vec!["scale.toml:10:9", "divides by zero"],
        ),
        (grid("a * 2"), vec!["scale.toml:10:9", "`a` is a f32 value"]),
        (
            scale_manifest(
                ARGS,
                "block = \"256\"\ngrid = \"n\"\nrequires = [{ check = \"n\", message = \"m\" }]\n",
            ),
            vec![
                "scale.toml:11:24",
                "requirement 1",
                "`n` is an integer where a condition is needed",
            ],
        ),
        (
            scale_manifest(
                r#""out: *mut f32", "x: *const f32 [n]", "a: f32", "n: u32""#,
                "block = \"1\"\ngrid = \"n\"\n",
            ),
            vec!["pointer `out` has no extent"],
        ),
        (
            scale_manifest(
                r#""out: *mut f32 [n]", "x: *const f32 [n]", "a: f32", "n: u32 [4]""#,
                "block = \"1\"\ngrid = \"n\"\n",
            ),
            vec![
                "scale.toml:7:",
                "`n` is a value; only pointers have an extent",
            ],
        ),
        (
            scale_manifest(
                r#""out: *mut f32 [n + q]", "x: *const f32 [n]", "a: f32", "n: u32""#,
                "block = \"1\"\ngrid = \"n\"\n",
            ),
            vec!["scale.toml:7:29", "the extent of `out`", "unknown name `q`"],
        ),
        (scale_manifest(ARGS, "grid = \"n\"\n"), vec!["no `block`"]),
        (
            scale_manifest(ARGS, "let = [\"n = 4\"]\nblock = \"1\"\ngrid = \"n\"\n"),
            vec!["scale.toml:9:", "`n` would hide an argument"],
        ),
    ];
    for (manifest, expected) in cases {
        let package = TempPackage::new(&["gfx942"], &[("scale", SCALE_SOURCE, &manifest)]);
        let error = hkpack::build(&package.options()).unwrap_err().to_string();
        for part in expected {
            assert!(
                error.contains(part),
                "`{part}` not in:\n{error}\n(manifest:\n{manifest})"
            );
        }
    }
}

/// A contract that refuses every call (a launch no device allows, a requirement that is never
/// true, arithmetic that always fails) is a build error at the expression that refused the
/// call the build's search got furthest with, not a bundle whose kernel no one can launch.
#[test]
fn contracts_that_refuse_every_call_are_build_errors_at_their_line() {
    let contract = |block: &str, grid: &str, more: &str| {
        scale_manifest(
            ARGS,
            &format!("block = \"{block}\"\ngrid = \"{grid}\"\n{more}"),
        )
    };
    let cases: Vec<(String, Vec<&str>)> = vec![
        (
            contract("256", "4294967296", ""),
            vec!["scale.toml:10:9", "grid x", "4294967296"],
        ),
        (
            contract("256", "0 - 1", ""),
            vec!["scale.toml:10:9", "grid x", "-1"],
        ),
        (
            contract("2048", "n", ""),
            vec!["scale.toml:9:10", "block x", "2048 threads"],
        ),
        (contract("0", "n", ""), vec!["scale.toml:9:10", "block x"]),
        (
            contract("256", "n", "shared = \"1073741824\"\n"),
            vec!["scale.toml:11:11", "shared memory", "1073741824 bytes"],
        ),
        (
            contract(
                "256",
                "n",
                "requires = [{ check = \"n < 0\", message = \"never\" }]\n",
            ),
            vec!["scale.toml:11:24", "requirement 1", "it is false"],
        ),
        (
            contract("256", "n / (n - n)", ""),
            vec!["scale.toml:10:9", "grid x", "cannot be computed"],
        ),
        (
            scale_manifest(
                r#""out: *mut f32 [0 - 1]", "x: *const f32 [n]", "a: f32", "n: u32""#,
                "block = \"1\"\ngrid = \"n\"\n",
            ),
            vec!["scale.toml:7:", "the extent of `out`", "-1"],
        ),
    ];
    for (manifest, expected) in cases {
        let package = TempPackage::new(&["gfx942"], &[("scale", SCALE_SOURCE, &manifest)]);
        let error = hkpack::build(&package.options()).unwrap_err().to_string();
        for part in expected.iter().chain(&["refuses every call"]) {
            assert!(
                error.contains(part),
                "`{part}` not in:\n{error}\n(manifest:\n{manifest})"
            );
        }
    }
}

/// Arguments are computed with in 64-bit signed integers: a `u64` above `i64::MAX` is refused,
/// as is a size that overflows on the way, each naming what.
#[test]
fn values_outside_the_contracts_range_are_refused() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (driver, device) = simulated("sm_80");
    let error = call(&bundle, &device, "silu_f32", &[("n", u64::MAX)], 16).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("`n: u64` is 18446744073709551615, above the 64-bit signed range"),
        "{error}"
    );
    let error = call(&bundle, &device, "silu_f32", &[("n", 1 << 62)], 16).unwrap_err();
    assert!(
        matches!(error, Error::Launch(LaunchError::Extent { needed, .. }) if needed == 1 << 62),
        "{error}"
    );
    let most = u64::from(u32::MAX);
    let error = call(
        &bundle,
        &device,
        "topk_f32",
        &[("rows", most), ("n", most), ("k", 1)],
        16,
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains(
            "the extent of `x` cannot be computed: 4294967295 * 4294967295 does not fit in 64 bits"
        ),
        "{error}"
    );
    assert!(
        !driver
            .log()
            .iter()
            .any(|r| matches!(r, Recorded::Launch { .. }))
    );
}

/// The GEMMs' requirements, each at the last value it accepts and the first it refuses (where
/// the accepted value needs buffers too large to allocate, the call gets past the requirement
/// to the extents, which is what accepting it means).
#[test]
fn every_gemm_requirement_is_enforced_on_both_sides_of_its_boundary() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (_, device) = simulated("sm_90");
    let base = [
        ("m", 3),
        ("n", 5),
        ("k", 4),
        ("lda", 4),
        ("ldb", 5),
        ("ldc", 5),
    ];
    let with = |changes: &[(&'static str, u64)]| {
        let mut values: Vec<(&str, u64)> = base.to_vec();
        for &(name, value) in changes {
            match values.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value,
                None => values.push((name, value)),
            }
        }
        values
    };
    let held = |symbol: &str, changes: &[(&'static str, u64)]| match call(
        &bundle,
        &device,
        symbol,
        &with(changes),
        1 << 12,
    ) {
        Ok(()) | Err(Error::Launch(LaunchError::Extent { .. })) => {}
        Err(other) => panic!("{symbol} {changes:?}: {other}"),
    };
    let refused = |symbol: &str, changes: &[(&'static str, u64)], needle: &str| {
        let text = unmet(call(&bundle, &device, symbol, &with(changes), 1 << 12));
        assert!(text.contains(needle), "{symbol} {changes:?}: {text}");
    };
    for symbol in [
        "gemm_a16w16_nt_bf16",
        "gemm_a16w16_nn_f16_bias_out_f32",
        "gemm_a16w16_gated_silu_bf16",
    ] {
        let ldb_floor = if symbol.contains("_nn_") { 5 } else { 4 };
        held(symbol, &[("m", 1), ("n", 1), ("k", 1), ("ldb", 5)]);
        for name in ["m", "n", "k"] {
            refused(symbol, &[(name, 0)], "m, n and k must be at least 1");
        }
        held(symbol, &[("lda", 4)]);
        refused(
            symbol,
            &[("lda", 3)],
            "`lda >= k` is false with lda = 3, k = 4",
        );
        held(symbol, &[("ldb", ldb_floor)]);
        refused(symbol, &[("ldb", ldb_floor - 1)], "ldb must be at least");
        held(symbol, &[("ldc", 5)]);
        refused(symbol, &[("ldc", 4)], "`ldc >= n`");
        held(symbol, &[("m", 8_388_480)]);
        refused(symbol, &[("m", 8_388_481)], "m must be at most 8388480");
    }
    // The block-scaled FP8 GEMM: its scales' extents follow k's groups of 128, and its
    // requirements are the 8-bit GEMMs'.
    let block = "gemm_fp8_blockscale_e4m3fn_nt_bf16";
    held(block, &[("m", 1), ("n", 1), ("k", 1)]);
    refused(block, &[("k", 0)], "m, n and k must be at least 1");
    refused(
        block,
        &[("ldb", 3)],
        "ldb must be at least k: B's rows are [N][K]",
    );
    let split = "gemm_a16w16_splitk_nt_bf16";
    held(split, &[("m", 1_048_560)]);
    refused(split, &[("m", 1_048_561)], "m must be at most 1048560");
    // Every batched GEMM, 16- and 8-bit, requires the same of its batch.
    for batched in [
        "batched_gemm_a16w16_nt_bf16",
        "batched_gemm_a8w8_nt_bf16",
        "batched_gemm_fp8_e4m3fn_nt_per_token_bf16",
    ] {
        let strides = [
            ("batch", 2),
            ("stride_a", 12),
            ("stride_b", 20),
            ("stride_c", 15),
        ];
        held(batched, &strides);
        for (batch, ok) in [(1, true), (0, false), (65_535, true), (65_536, false)] {
            let changes = [
                strides,
                [("batch", batch), strides[1], strides[2], strides[3]],
            ]
            .concat();
            if ok {
                held(batched, &changes[4..]);
            } else {
                refused(batched, &changes[4..], "batch must be 1 to 65535");
            }
        }
        // The outputs of two products must not overlap: (m - 1) * ldc + n = 15 elements apart.
        refused(
            batched,
            &[strides[0], strides[1], strides[2], ("stride_c", 14)],
            "must not overlap",
        );
        held(batched, &[("batch", 1), ("stride_c", 0)]);
    }
}

/// Shared memory is checked against what the device allows a block with opting in (227 KiB
/// on sm_90, 99 KiB on sm_86), not CUDA's 48 KiB default, which the driver lifts per kernel.
#[test]
fn shared_memory_is_checked_against_the_devices_opt_in_maximum() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    for (target, kib, allowed) in [
        ("sm_90", 200, true),
        ("sm_90", 228, false),
        ("sm_86", 96, true),
        ("sm_86", 100, false),
    ] {
        let (driver, device) = simulated(target);
        let loaded = bundle.load(&device).unwrap();
        let kernel = loaded.kernel("softmax_f32").unwrap();
        let call = Call::new(
            &bundle,
            &device,
            "softmax_f32",
            &[("rows", 2), ("cols", 8)],
            16,
        );
        let args = call.args();
        let mut dims = kernel.launch_shape(&args).unwrap();
        dims.shared_bytes = kib * 1024;
        // SAFETY: the recording driver runs nothing.
        let result = unsafe { kernel.launch(&dims, StreamHandle::DEFAULT, &args) };
        assert_eq!(result.is_ok(), allowed, "{target} {kib} KiB: {result:?}");
        assert_eq!(
            driver
                .log()
                .iter()
                .filter(|r| matches!(r, Recorded::Launch { .. }))
                .count(),
            usize::from(allowed)
        );
    }
}

/// The attention kernels' contracts: every requirement on both sides of its boundary, for the
/// head dimensions whose row-stride floors differ, and the launch shape on both vendors.
#[test]
fn every_attention_requirement_is_enforced_on_both_sides_of_its_boundary() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (_, device) = simulated("sm_90");
    const UNBOUNDED: u64 = u64::MAX; // -1 as the i32 window bounds
    for (symbol, d, dv) in [
        ("attn_fwd_d64_bf16", 64, 64),
        ("attn_fwd_d192_dv128_f16", 192, 128),
    ] {
        let base = [
            ("batch", 2),
            ("total_q", 10),
            ("total_k", 12),
            ("max_seqlen_q", 6),
            ("heads_q", 4),
            ("heads_kv", 2),
            ("ldq", 4 * d),
            ("ldk", 2 * d),
            ("ldv", 2 * dv),
            ("ldo", 4 * dv),
            ("ld_lse", 10),
            ("causal", 0),
            ("window_left", UNBOUNDED),
            ("window_right", UNBOUNDED),
        ];
        let with = |changes: &[(&'static str, u64)]| {
            let mut values: Vec<(&str, u64)> = base.to_vec();
            for &(name, value) in changes {
                values.iter_mut().find(|(n, _)| *n == name).unwrap().1 = value;
            }
            values
        };
        let held = |changes: &[(&'static str, u64)]| match call(
            &bundle,
            &device,
            symbol,
            &with(changes),
            1 << 14,
        ) {
            Ok(()) | Err(Error::Launch(LaunchError::Extent { .. })) => {}
            Err(other) => panic!("{symbol} {changes:?}: {other}"),
        };
        let refused = |changes: &[(&'static str, u64)], needle: &str| {
            let text = unmet(call(&bundle, &device, symbol, &with(changes), 1 << 14));
            assert!(text.contains(needle), "{symbol} {changes:?}: {text}");
        };
        held(&[]);
        held(&[("batch", 1)]);
        refused(&[("batch", 0)], "batch must be 1 to 65535");
        held(&[("batch", 65_535)]);
        refused(&[("batch", 65_536)], "batch must be 1 to 65535");
        refused(&[("heads_q", 0)], "heads_q must be 1 to 65535");
        refused(&[("heads_q", 65_536)], "heads_q must be 1 to 65535");
        // MQA and MHA hold; a group that does not divide the query heads does not.
        held(&[("heads_kv", 1)]);
        held(&[("heads_kv", 4), ("ldk", 4 * d), ("ldv", 4 * dv)]);
        refused(
            &[("heads_kv", 3), ("ldk", 3 * d), ("ldv", 3 * dv)],
            "heads_q must be a multiple of heads_kv",
        );
        refused(&[("heads_kv", 0)], "heads_q must be a multiple of heads_kv");
        refused(&[("total_q", 0)], "total_q and total_k must be at least 1");
        refused(&[("total_k", 0)], "total_q and total_k must be at least 1");
        held(&[("max_seqlen_q", 1)]);
        refused(&[("max_seqlen_q", 0)], "max_seqlen_q must be 1 to total_q");
        held(&[("max_seqlen_q", 10)]);
        refused(
            &[("max_seqlen_q", 11)],
            "`max_seqlen_q >= 1 && max_seqlen_q <= total_q` is false",
        );
        refused(&[("ld_lse", 9)], "ld_lse must be at least total_q");
        held(&[("causal", 1)]);
        refused(&[("causal", 2)], "causal must be 0 or 1");
        held(&[("window_left", 0), ("window_right", 0)]);
        refused(
            &[("window_left", u64::MAX - 1)],
            "window_left and window_right",
        );
        refused(
            &[("window_right", u64::MAX - 1)],
            "window_left and window_right",
        );
        for (ld, floor, text) in [
            ("ldq", 4 * d, format!("ldq must be at least heads_q * {d}")),
            ("ldk", 2 * d, format!("ldk must be at least heads_kv * {d}")),
            (
                "ldv",
                2 * dv,
                format!("ldv must be at least heads_kv * {dv}"),
            ),
            (
                "ldo",
                4 * dv,
                format!("ldo must be at least heads_q * {dv}"),
            ),
        ] {
            held(&[(ld, floor)]);
            refused(&[(ld, floor - 1)], &text);
        }
    }

    // The launch: 4 waves a block; 128 queries a block (64 for d_qk = 256), a block per query
    // block of the longest sequence, per query head and per sequence; Q and two K/V stages in
    // dynamic shared memory on NVIDIA, static LDS on AMD. On compute capability 9.0 the sm_90a
    // code runs, and at d = 64 and 128 that is the wgmma program: three warpgroups, Q and
    // three stages of K and V; on AMD at d = 64 and 128 the 8-wave ping-pong, 256 queries a
    // block (kernels/attention.hip checks the sizes at compile time).
    let (_, amd) = simulated("gfx942:sramecc+:xnack-");
    let (_, ampere) = simulated("sm_80");
    let values = [
        ("batch", 3),
        ("total_q", 1000),
        ("total_k", 1000),
        ("max_seqlen_q", 300),
        ("heads_q", 8),
        ("heads_kv", 2),
        ("ldq", 8 * 256),
        ("ldk", 2 * 256),
        ("ldv", 2 * 256),
        ("ldo", 8 * 256),
        ("ld_lse", 1000),
        ("window_left", UNBOUNDED),
        ("window_right", UNBOUNDED),
    ];
    for (symbol, device, want) in [
        ("attn_fwd_d128_bf16", &device, ([3, 8, 3], 384, 181312)),
        ("attn_fwd_d128_bf16", &ampere, ([3, 8, 3], 128, 65536)),
        ("attn_fwd_d128_bf16", &amd, ([2, 8, 3], 512, 0)),
        ("attn_fwd_d256_f16", &amd, ([5, 8, 3], 256, 0)),
        ("attn_fwd_d256_f16", &device, ([5, 8, 3], 128, 98304)),
        ("attn_fwd_d64_f16", &device, ([3, 8, 3], 384, 115776)),
        ("attn_fwd_d64_f16", &ampere, ([3, 8, 3], 128, 32768)),
    ] {
        let dims = shape(&bundle, device, symbol, &values, 1 << 22);
        assert_eq!(
            (dims.grid, dims.block[0], dims.shared_bytes),
            want,
            "{symbol}"
        );
    }
}

/// The attention backward kernels' contracts: the clauses they add to the forward pass's (their
/// gradients' row strides, max_seqlen against the side it counts, delta's row kernel), each on
/// both sides of its boundary, and their launches (column parts along y, 2 waves at d = 256 on
/// AMD).
#[test]
fn every_attention_backward_requirement_is_enforced_on_both_sides_of_its_boundary() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (_, device) = simulated("sm_90");
    let (_, amd) = simulated("gfx942:sramecc+:xnack-");
    const UNBOUNDED: u64 = u64::MAX; // -1 as the i32 window bounds
    let (d, dv) = (192u64, 128u64);
    let base = [
        ("batch", 2),
        ("total_q", 10),
        ("total_k", 12),
        ("max_seqlen", 6),
        ("heads_q", 4),
        ("heads_kv", 2),
        ("ldq", 4 * d),
        ("ldk", 2 * d),
        ("ldv", 2 * dv),
        ("lddo", 4 * dv),
        ("lddq", 4 * d),
        ("lddk", 2 * d),
        ("lddv", 2 * dv),
        ("ld_lse", 10),
        ("causal", 0),
        ("window_left", UNBOUNDED),
        ("window_right", UNBOUNDED),
    ];
    let with = |changes: &[(&'static str, u64)]| {
        let mut values: Vec<(&str, u64)> = base.to_vec();
        for &(name, value) in changes {
            values.iter_mut().find(|(n, _)| *n == name).unwrap().1 = value;
        }
        values
    };
    let outcome = |symbol: &str, changes: &[(&'static str, u64)]| {
        call(&bundle, &device, symbol, &with(changes), 1 << 14)
    };
    let held = |symbol: &str, changes: &[(&'static str, u64)]| match outcome(symbol, changes) {
        Ok(()) | Err(Error::Launch(LaunchError::Extent { .. })) => {}
        Err(other) => panic!("{symbol} {changes:?}: {other}"),
    };
    let refused = |symbol: &str, changes: &[(&'static str, u64)], needle: &str| {
        let text = unmet(outcome(symbol, changes));
        assert!(text.contains(needle), "{symbol} {changes:?}: {text}");
    };
    let (dq, dkdv) = (
        "attn_bwd_dq_d192_dv128_bf16",
        "attn_bwd_dkdv_d192_dv128_f16",
    );
    for symbol in [dq, dkdv] {
        held(symbol, &[]);
        refused(
            symbol,
            &[("heads_kv", 3)],
            "heads_q must be a multiple of heads_kv",
        );
        let widest = [
            ("heads_q", 16_383),
            ("heads_kv", 1),
            ("ldq", 16_383 * d),
            ("lddq", 16_383 * d),
            ("lddo", 16_383 * dv),
        ];
        held(symbol, &widest);
        refused(
            symbol,
            &[("heads_q", 16_384), ("heads_kv", 1)],
            "heads_q must be 1 to 16383",
        );
        refused(symbol, &[("batch", 0)], "batch must be 1 to 65535");
        refused(symbol, &[("ld_lse", 9)], "ld_lse must be at least total_q");
        refused(symbol, &[("causal", 2)], "causal must be 0 or 1");
        refused(
            symbol,
            &[("window_right", u64::MAX - 1)],
            "window_left and window_right",
        );
        held(symbol, &[("lddo", 4 * dv)]);
        refused(
            symbol,
            &[("lddo", 4 * dv - 1)],
            "lddo must be at least heads_q * 128",
        );
        refused(
            symbol,
            &[("ldk", 2 * d - 1)],
            "ldk must be at least heads_kv * 192",
        );
    }
    held(dq, &[("lddq", 4 * d)]);
    refused(
        dq,
        &[("lddq", 4 * d - 1)],
        "lddq must be at least heads_q * 192",
    );
    held(dq, &[("max_seqlen", 10)]);
    refused(dq, &[("max_seqlen", 11)], "max_seqlen must be 1 to total_q");
    held(dkdv, &[("max_seqlen", 12)]);
    refused(
        dkdv,
        &[("max_seqlen", 13)],
        "max_seqlen must be 1 to total_k",
    );
    refused(
        dkdv,
        &[("max_seqlen", 0)],
        "max_seqlen must be 1 to total_k",
    );
    held(dkdv, &[("lddk", 2 * d), ("lddv", 2 * dv)]);
    refused(
        dkdv,
        &[("lddk", 2 * d - 1)],
        "lddk must be at least heads_kv * 192",
    );
    refused(
        dkdv,
        &[("lddv", 2 * dv - 1)],
        "lddv must be at least heads_kv * 128",
    );

    // delta's row kernel.
    let delta = |changes: &[(&'static str, u64)]| {
        let mut values = vec![
            ("total_q", 10),
            ("heads_q", 4),
            ("d_v", 128),
            ("ldo", 512),
            ("lddo", 512),
            ("ld_delta", 10),
        ];
        for &(name, value) in changes {
            values.iter_mut().find(|(n, _)| *n == name).unwrap().1 = value;
        }
        call(&bundle, &device, "attn_bwd_delta_bf16", &values, 1 << 14)
    };
    delta(&[]).unwrap();
    assert!(unmet(delta(&[("d_v", 0)])).contains("total_q, heads_q and d_v must be at least 1"));
    assert!(unmet(delta(&[("ldo", 511)])).contains("ldo and lddo must be at least heads_q * d_v"));
    assert!(unmet(delta(&[("lddo", 511)])).contains("ldo and lddo must be at least heads_q * d_v"));
    assert!(unmet(delta(&[("ld_delta", 9)])).contains("ld_delta must be at least total_q"));

    // Launches: 64 own rows (4 waves) a block, heads times column parts along y; row strides
    // wide enough for d = 256. On compute capability 9.0 the sm_90a code runs, and dQ at
    // d = 128 and dK/dV at d = 64 are wgmma programs there: three warpgroups, 128 own rows a
    // block, their tiles beside three stages of the rows they walk (kernels/attention_backward.hip
    // checks the sizes at compile time).
    let (_, ampere) = simulated("sm_80");
    let values = with(&[
        ("total_q", 1000),
        ("total_k", 1000),
        ("max_seqlen", 300),
        ("ld_lse", 1000),
        ("ldq", 4 * 256),
        ("ldk", 2 * 256),
        ("ldv", 2 * 256),
        ("lddo", 4 * 256),
        ("lddq", 4 * 256),
        ("lddk", 2 * 256),
        ("lddv", 2 * 256),
    ]);
    for (symbol, device, want) in [
        (
            "attn_bwd_dq_d192_dv128_bf16",
            &device,
            ([5, 8, 2], 128, 81920),
        ),
        // dK/dV's stages carry their queries' LSE and delta too (256 bytes a stage).
        (
            "attn_bwd_dkdv_d192_dv128_f16",
            &device,
            ([5, 4, 2], 128, 82432),
        ),
        ("attn_bwd_dq_d128_bf16", &device, ([3, 4, 2], 384, 164928)),
        ("attn_bwd_dq_d128_bf16", &ampere, ([5, 4, 2], 128, 65536)),
        ("attn_bwd_dkdv_d64_bf16", &device, ([3, 2, 2], 384, 84544)),
        ("attn_bwd_dkdv_d64_bf16", &ampere, ([5, 2, 2], 128, 33280)),
        ("attn_bwd_dkdv_d64_bf16", &amd, ([5, 2, 2], 256, 0)),
        ("attn_bwd_dkdv_d128_f16", &device, ([5, 2, 2], 128, 66048)),
        ("attn_bwd_dkdv_d256_bf16", &device, ([5, 8, 2], 128, 131584)),
        ("attn_bwd_dq_d256_f16", &amd, ([10, 8, 2], 128, 0)),
    ] {
        let dims = shape(&bundle, device, symbol, &values, 1 << 22);
        assert_eq!(
            (dims.grid, dims.block[0], dims.shared_bytes),
            want,
            "{symbol}"
        );
    }
}

/// Kernels whose grids grow with their rows (the norms, softmax, per-token and block
/// quantization, top-k, MoE routing and the MoE combine) take every row count a u32 holds, on both vendors: their
/// blocks stride over the rows, so the grid stops growing at 2^20 blocks instead of passing a
/// device's limit (2^31 rows of RMSNorm were refused on AMD, u32::MAX rows of top-k
/// everywhere). The buffers such calls need do not fit in memory, so they are described, not
/// allocated: only the launch shape is asked for, and nothing is launched.
#[test]
fn row_kernels_launch_for_every_row_count() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    const CAP: u32 = 1 << 20;
    for target in ["sm_90", "gfx942:sramecc+:xnack-"] {
        let (_, device) = simulated(target);
        let loaded = bundle.load(&device).unwrap();
        for rows in [1u64 << 31, u64::from(u32::MAX)] {
            for (symbol, values) in [
                ("rmsnorm_bf16", vec![("cols", 64)]),
                ("fused_add_rmsnorm_f32", vec![("cols", 4096)]),
                ("layernorm_f16", vec![("cols", 128)]),
                ("softmax_bf16", vec![("cols", 32)]),
                ("quant_fp8_per_token_fp8_e4m3fn_bf16", vec![("cols", 512)]),
                ("quant_fp8_block_fp8_e4m3fnuz_bf16", vec![("cols", 7168)]),
                ("topk_f32", vec![("n", 64), ("k", 8)]),
                ("topk_bf16", vec![("n", 4096), ("k", 8)]),
                (
                    "topk_softmax_f32",
                    vec![("experts", 256), ("ld", 256), ("k", 8)],
                ),
                (
                    "grouped_topk_bf16",
                    vec![
                        ("experts", 256),
                        ("ld", 256),
                        ("n_group", 8),
                        ("topk_group", 4),
                        ("k", 8),
                    ],
                ),
                (
                    "moe_sum_bf16",
                    vec![
                        ("topk", 8),
                        ("experts", 256),
                        ("n", 256),
                        ("ldo", 256),
                        ("ldy", 256),
                    ],
                ),
            ] {
                let values: Vec<_> = values
                    .into_iter()
                    .chain([("rows", rows), ("tokens", rows)])
                    .collect();
                let args = described_args(&bundle, symbol, &values);
                let dims = loaded.kernel(symbol).unwrap().launch_shape(&args);
                let dims = dims.unwrap_or_else(|e| panic!("{symbol}, {rows} rows, {target}: {e}"));
                assert!(
                    dims.grid[0] <= CAP && dims.grid[1] == 1 && dims.grid[2] == 1,
                    "{symbol} with {rows} rows on {target}: grid {:?}",
                    dims.grid
                );
            }
        }
    }
}

/// Arguments for `symbol` whose buffers are described as 2^48 elements at a fake address
/// (for launch_shape alone, which reads no memory), and whose integer scalars come from
/// `values` by name (0 when not named).
fn described_args(bundle: &Bundle, symbol: &str, values: &[(&str, u64)]) -> Vec<Arg<'static>> {
    let params = bundle.kernel_record(symbol).unwrap().args.clone();
    params
        .iter()
        .map(|param| match param.ty {
            ParamType::Pointer { pointee, mutable } => {
                // SAFETY: nothing is launched with these arguments, so no kernel reads or
                // writes the memory they describe.
                Arg::Raw(unsafe {
                    RawPointer::new(DevicePtr(1 << 40), 0, pointee, 1 << 48, mutable)
                })
            }
            ParamType::Scalar(ty) => {
                let v = values
                    .iter()
                    .find(|(n, _)| *n == param.name)
                    .map_or(0, |(_, v)| *v);
                Arg::Scalar(match ty {
                    ScalarType::U32 => ScalarValue::U32(v as u32),
                    ScalarType::U64 => ScalarValue::U64(v),
                    ScalarType::I32 => ScalarValue::I32(v as i32),
                    ScalarType::F32 => ScalarValue::F32(1.0),
                    other => panic!("no test value for {other}"),
                })
            }
        })
        .collect()
}
