//! 8-bit GEMMs: the f64 reference and the cases of `kernels/gemm_q8.hip`.
//!
//! `gemm_a8w8_nt[_bias]_bf16` (int8) and `gemm_fp8_{e4m3fn,e4m3fnuz}_nt_{per_tensor,per_token}
//! [_bias]_bf16` compute `C[i][j] = bf16(Σ_k A[i][k] B[j][k] · a_scale · b_scale (+ bias[j]))`
//! with B stored `[N][K]`; `gemm_fp8_blockscale_{e4m3fn,e4m3fnuz}_nt[_bias]_bf16` scale each
//! 128-deep group `g` of the sum by `a_scale[i][g] · b_scale[j / 128][g]` (DeepSeek-V3's 1 x 128
//! and 128 x 128 blocks) and add the groups, each with one more f32 rounding of the running
//! total and two of its scaling (`(G + 3) · 2⁻²⁴ · Σ_g |scaled group|`). The reference sums the same quantized values in f64 (exact for int8,
//! and for FP8 as long as K · 2^-24 relative is under the bound below), so the kernel may
//! differ by the f32 steps (the sum's accumulation, its conversion, two scalings, the bias:
//! `K · 2⁻²² · spread + 4 · 2⁻²⁴ · |scaled sum|`) and the bf16 rounding (2⁻⁸ relative).
//! Inputs are the contract's extents with poison (NaN for FP8, which the format encodes; the
//! largest int8 for int8) in the gaps between rows; C's gaps must stay NaN.
//!
//! `gemm_a16w8_blockscale_{e4m3fn,e4m3fnuz}_nt[_bias]_bf16` (weight-only) take A in bf16 and
//! scale each group by `b_scale[j / 128][g]` alone; the reference and bound are the block
//! scales' (bf16 products are exact in f32, as FP8 ones are). Their split-K forms,
//! `gemm_a16w8_blockscale_splitk_{e4m3fn,e4m3fnuz}_nt[_bias]_f32`, add the same to an f32 C:
//! cases start C from random values and choose the split (more splits than K has groups too,
//! and the contract's), each split adding one more f32 rounding of C.
//!
//! `batched_gemm_a8w8_nt_bf16` and `batched_gemm_fp8_{e4m3fn,e4m3fnuz}_nt_per_token_bf16`
//! compute `batch` per-token products, matrix `p` of each `stride_*` elements after matrix
//! `p - 1` (0 shares one) and scales dense per product (`a_scale [batch][M]`, `b_scale
//! [batch][N]`); each product's reference and bound are the unbatched one's.

use hk_format::abi::{ScalarType, ScalarValue};
use rand::Rng;

use crate::case::{Case, CaseArg, Expect, Planned, grid_label};
use crate::host::round_to;

/// The element types the kernels take: int8 and the two E4M3 formats.
pub const ELEMENTS: [ScalarType; 3] = [
    ScalarType::I8,
    ScalarType::Fp8E4m3fn,
    ScalarType::Fp8E4m3fnuz,
];

/// How the sums are scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scales {
    /// One scale for A, one for B.
    PerTensor,
    /// A scale per row of A (token), per row of B (output channel).
    PerToken,
    /// A scale per row of A and 128-deep group of k, `[M][G]`; per 128 x 128 block of B,
    /// `[ceil(N / 128)][G]`, with `G = ceil(K / 128)`.
    Block,
    /// Weight-only: A in bf16, no scale; B's per 128 x 128 block as in `Block`.
    WeightBlock,
}

impl Scales {
    /// Whether the sums are scaled group by group along k.
    fn grouped(self) -> bool {
        matches!(self, Scales::Block | Scales::WeightBlock)
    }

    /// A's element type when B's is `elem`.
    fn a_elem(self, elem: ScalarType) -> ScalarType {
        if self == Scales::WeightBlock {
            ScalarType::Bf16
        } else {
            elem
        }
    }
}

/// The depth of a block scale's group along k, and the width of B's blocks.
pub const SCALE_GROUP: usize = 128;

/// The FP8 format as the block-scaled kernels' names spell it (`e4m3fn`, without `fp8_`).
fn format_name(elem: ScalarType) -> &'static str {
    elem.name().trim_start_matches("fp8_")
}

/// The kernel's symbol.
pub fn symbol(elem: ScalarType, scales: Scales, bias: bool) -> String {
    let bias = if bias { "_bias" } else { "" };
    let format = format_name(elem);
    match (elem, scales) {
        (ScalarType::I8, _) => format!("gemm_a8w8_nt{bias}_bf16"),
        (_, Scales::PerTensor) => format!("gemm_{}_nt_per_tensor{bias}_bf16", elem.name()),
        (_, Scales::PerToken) => format!("gemm_{}_nt_per_token{bias}_bf16", elem.name()),
        (_, Scales::Block) => format!("gemm_fp8_blockscale_{format}_nt{bias}_bf16"),
        (_, Scales::WeightBlock) => format!("gemm_a16w8_blockscale_{format}_nt{bias}_bf16"),
    }
}

/// The weight-only split-K kernel's symbol.
pub fn splitk_symbol(elem: ScalarType, bias: bool) -> String {
    let bias = if bias { "_bias" } else { "" };
    format!(
        "gemm_a16w8_blockscale_splitk_{}_nt{bias}_f32",
        format_name(elem)
    )
}

/// How C receives the product: stored in bf16, or added to an f32 C by a weight-only split K
/// over the grid's z (`None`: the contract's split).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Epilogue {
    Store,
    SplitK(Option<u32>),
}

/// The batched kernel's symbol (per-token scales, no bias).
pub fn batched_symbol(elem: ScalarType) -> String {
    match elem {
        ScalarType::I8 => "batched_gemm_a8w8_nt_bf16".to_string(),
        _ => format!("batched_gemm_{}_nt_per_token_bf16", elem.name()),
    }
}

/// What fills the gaps between rows and matrices: a value no correct kernel reads (NaN where
/// the format has one, the largest int8 for int8, which would shift a sum).
fn poison(elem: ScalarType) -> f64 {
    if elem == ScalarType::I8 {
        127.0
    } else {
        f64::NAN
    }
}

/// `rows` rows of `cols` random values of `elem`, `ld` apart, poison in the gaps.
fn strided(rng: &mut impl Rng, elem: ScalarType, rows: usize, cols: usize, ld: usize) -> Vec<f64> {
    let mut data = vec![poison(elem); (rows - 1) * ld + cols];
    for r in 0..rows {
        for x in &mut data[r * ld..r * ld + cols] {
            *x = if elem == ScalarType::I8 {
                f64::from(rng.random_range(-128i32..=127))
            } else {
                // Values across the format's range, signs mixed, exactly representable.
                round_to(
                    elem,
                    rng.random_range(-1.0..1.0) * 2f64.powi(rng.random_range(-6..8)),
                )
            };
        }
    }
    data
}

/// `len` random positive scales, f32 values.
fn random_scales(rng: &mut impl Rng, len: usize) -> Vec<f64> {
    (0..len)
        .map(|_| f64::from(rng.random_range(0.001f32..0.02)))
        .collect()
}

/// The lengths of a product's `a_scale` and `b_scale`.
fn scale_lens(scales: Scales, (m, n, k): (usize, usize, usize)) -> (usize, usize) {
    let groups = k.div_ceil(SCALE_GROUP);
    match scales {
        Scales::PerTensor => (1, 1),
        Scales::PerToken => (m, n),
        Scales::Block => (m * groups, n.div_ceil(SCALE_GROUP) * groups),
        Scales::WeightBlock => (0, n.div_ceil(SCALE_GROUP) * groups),
    }
}

/// One product's f64 reference, C's rows of `n` packed, and what bounds the kernel's f32
/// error: the largest spread (root of the sum of squares) of a sum's scaled products and the
/// largest sum of a result's scaled groups' magnitudes.
struct Reference {
    want: Vec<f64>,
    spread: f64,
    largest: f64,
}

/// One product's operands: A `[m][k]` and B `[n][k]` rows `lda` and `ldb` apart, its scales
/// and bias.
struct Operands<'a> {
    a: &'a [f64],
    b: &'a [f64],
    lda: usize,
    ldb: usize,
    a_scale: &'a [f64],
    b_scale: &'a [f64],
    bias: Option<&'a [f64]>,
}

fn reference(scales: Scales, (m, n, k): (usize, usize, usize), x: &Operands) -> Reference {
    let groups = k.div_ceil(SCALE_GROUP);
    // The scale of product k of element (i, j).
    let scale_of = |i: usize, j: usize, kk: usize| match scales {
        Scales::PerTensor => x.a_scale[0] * x.b_scale[0],
        Scales::PerToken => x.a_scale[i] * x.b_scale[j],
        Scales::Block => {
            let g = kk / SCALE_GROUP;
            x.a_scale[i * groups + g] * x.b_scale[j / SCALE_GROUP * groups + g]
        }
        Scales::WeightBlock => x.b_scale[j / SCALE_GROUP * groups + kk / SCALE_GROUP],
    };
    let mut want = vec![0.0; m * n];
    let (mut spread, mut largest) = (0.0f64, 0.0f64);
    let depth = if scales.grouped() { SCALE_GROUP } else { k };
    for i in 0..m {
        for j in 0..n {
            // Group by group (one group for the schemes without blocks): the scaled sum, the
            // spread of its scaled products, and the sum of the groups' magnitudes.
            let (mut scaled, mut squares, mut magnitude) = (0.0, 0.0, 0.0);
            for start in (0..k).step_by(depth) {
                let s = scale_of(i, j, start);
                let mut sum = 0.0;
                for kk in start..k.min(start + depth) {
                    let p = x.a[i * x.lda + kk] * x.b[j * x.ldb + kk];
                    sum += p;
                    squares += (p * s) * (p * s);
                }
                scaled += sum * s;
                magnitude += (sum * s).abs();
            }
            spread = spread.max(squares.sqrt());
            largest = largest.max(magnitude);
            want[i * n + j] = scaled + x.bias.map_or(0.0, |v| v[j]);
        }
    }
    Reference {
        want,
        spread,
        largest,
    }
}

/// The absolute part of the bound on |kernel - reference| (the relative part is bf16's 2⁻⁸).
fn abs_tolerance(elem: ScalarType, scales: Scales, k: usize, r: &Reference) -> f64 {
    // Exact i32 sums for int8; f32 accumulation for FP8.
    let accumulation = if elem == ScalarType::I8 {
        0.0
    } else {
        k as f64 * 2f64.powi(-22) * r.spread
    };
    let roundings = if scales.grouped() {
        k.div_ceil(SCALE_GROUP) + 3
    } else {
        4
    };
    accumulation + roundings as f64 * 2f64.powi(-24) * r.largest + 2f64.powi(-134)
}

/// C, bf16 rows of `n` values `ldc` apart through `rows` rows, against `want` (packed rows).
fn output(want: Vec<f64>, abs: f64, rows: usize, n: usize, ldc: usize) -> CaseArg {
    CaseArg::Output {
        name: "c",
        elem: ScalarType::Bf16,
        len: rows * ldc,
        expect: Expect::StridedClose {
            want,
            row_len: n,
            stride: ldc,
            abs,
            rel: 2f64.powi(-8),
        },
    }
}

/// A split K's C: f32 rows of `n` values `ldc` apart that start from random values (NaN between
/// rows) and must end as those plus `r.want`. Each of at most `groups` splits rounds C once
/// more (to f32), on top of `abs`, the product's own bound.
fn added_output(
    mut r: Reference,
    abs: f64,
    groups: usize,
    (m, n, ldc): (usize, usize, usize),
    rng: &mut impl Rng,
) -> CaseArg {
    let mut start = vec![f64::NAN; m * ldc];
    let mut largest = 0.0f64;
    for i in 0..m {
        for j in 0..n {
            let x = round_to(ScalarType::F32, rng.random_range(-4.0..4.0));
            start[i * ldc + j] = x;
            largest = largest.max(x.abs() + r.want[i * n + j].abs());
            r.want[i * n + j] += x;
        }
    }
    CaseArg::InOut {
        name: "c",
        elem: ScalarType::F32,
        data: start,
        expect: Expect::StridedClose {
            want: r.want,
            row_len: n,
            stride: ldc,
            abs: abs + (groups + 1) as f64 * 2f64.powi(-24) * (largest + r.largest),
            rel: 2f64.powi(-24),
        },
    }
}

/// One launch on fresh random inputs: `(m, n, k)` with rows padded by `pad` elements.
pub fn case(
    elem: ScalarType,
    scales: Scales,
    bias: bool,
    size: (usize, usize, usize),
    pad: (usize, usize, usize),
    rng: &mut impl Rng,
) -> Case {
    launch(elem, scales, bias, Epilogue::Store, size, pad, rng)
}

/// One launch of a weight-only split-K kernel, `case`'s product added to C.
pub fn splitk_case(
    elem: ScalarType,
    bias: bool,
    splits: Option<u32>,
    size: (usize, usize, usize),
    pad: (usize, usize, usize),
    rng: &mut impl Rng,
) -> Case {
    let epilogue = Epilogue::SplitK(splits);
    launch(elem, Scales::WeightBlock, bias, epilogue, size, pad, rng)
}

fn launch(
    elem: ScalarType,
    scales: Scales,
    bias: bool,
    epilogue: Epilogue,
    (m, n, k): (usize, usize, usize),
    pad: (usize, usize, usize),
    rng: &mut impl Rng,
) -> Case {
    let (lda, ldb, ldc) = (k + pad.0, k + pad.1, n + pad.2);
    let a_elem = scales.a_elem(elem);
    let a = strided(rng, a_elem, m, k, lda);
    let b = strided(rng, elem, n, k, ldb);
    let (a_len, b_len) = scale_lens(scales, (m, n, k));
    let a_scale = random_scales(rng, a_len);
    let b_scale = random_scales(rng, b_len);
    let bias_values: Option<Vec<f64>> = bias.then(|| {
        (0..n)
            .map(|_| round_to(ScalarType::Bf16, rng.random_range(-1.0..1.0)))
            .collect()
    });
    let operands = Operands {
        a: &a,
        b: &b,
        lda,
        ldb,
        a_scale: &a_scale,
        b_scale: &b_scale,
        bias: bias_values.as_deref(),
    };
    let r = reference(scales, (m, n, k), &operands);
    let abs = abs_tolerance(elem, scales, k, &r);
    let (c, kernel, split) = match epilogue {
        Epilogue::Store => (
            output(r.want, abs, m, n, ldc),
            symbol(elem, scales, bias),
            None,
        ),
        Epilogue::SplitK(splits) => {
            let c = added_output(r, abs, k.div_ceil(SCALE_GROUP), (m, n, ldc), rng);
            (c, splitk_symbol(elem, bias), splits)
        }
    };
    let mut args = vec![
        c,
        CaseArg::input("a", a_elem, a),
        CaseArg::input("b", elem, b),
    ];
    if scales != Scales::WeightBlock {
        args.push(CaseArg::input("a_scale", ScalarType::F32, a_scale));
    }
    args.push(CaseArg::input("b_scale", ScalarType::F32, b_scale));
    if let Some(values) = bias_values {
        args.push(CaseArg::input("bias", ScalarType::Bf16, values));
    }
    args.extend([m, n, k, lda, ldb, ldc].map(|x| CaseArg::Scalar(ScalarValue::U32(x as u32))));
    Case {
        kernel,
        label: format!(
            "m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc}{}",
            grid_label([None, None, split])
        ),
        args,
        grid: [None, None, split],
    }
}

/// A batch of `batch` per-token products of one shape: A's matrices `gap` elements of poison
/// apart, B's too or (`shared_b`) one B for all (stride 0, its scales still per product), C's
/// `m · ldc` apart, so that C's rows are evenly strided through the whole batch.
pub fn batched_case(
    elem: ScalarType,
    (m, n, k): (usize, usize, usize),
    pad: (usize, usize, usize),
    batch: usize,
    (gap, shared_b): (usize, bool),
    rng: &mut impl Rng,
) -> Case {
    let (lda, ldb, ldc) = (k + pad.0, k + pad.1, n + pad.2);
    let (extent_a, extent_b) = ((m - 1) * lda + k, (n - 1) * ldb + k);
    let stride_a = extent_a + gap;
    let stride_b = if shared_b { 0 } else { extent_b + gap };
    let stride_c = m * ldc;
    let mut a = vec![poison(elem); (batch - 1) * stride_a + extent_a];
    let mut b = vec![poison(elem); (batch - 1) * stride_b + extent_b];
    let a_scale = random_scales(rng, batch * m);
    let b_scale = random_scales(rng, batch * n);
    let mut want = Vec::with_capacity(batch * m * n);
    let mut abs = 0.0f64;
    for p in 0..batch {
        let (at, bt) = (p * stride_a, p * stride_b);
        a[at..at + extent_a].copy_from_slice(&strided(rng, elem, m, k, lda));
        if p == 0 || !shared_b {
            b[bt..bt + extent_b].copy_from_slice(&strided(rng, elem, n, k, ldb));
        }
        let operands = Operands {
            a: &a[at..at + extent_a],
            b: &b[bt..bt + extent_b],
            lda,
            ldb,
            a_scale: &a_scale[p * m..(p + 1) * m],
            b_scale: &b_scale[p * n..(p + 1) * n],
            bias: None,
        };
        let r = reference(Scales::PerToken, (m, n, k), &operands);
        abs = abs.max(abs_tolerance(elem, Scales::PerToken, k, &r));
        want.extend(r.want);
    }
    let mut args = vec![
        output(want, abs, batch * m, n, ldc),
        CaseArg::input("a", elem, a),
        CaseArg::input("b", elem, b),
        CaseArg::input("a_scale", ScalarType::F32, a_scale),
        CaseArg::input("b_scale", ScalarType::F32, b_scale),
    ];
    args.extend(
        [m, n, k, lda, ldb, ldc, batch].map(|x| CaseArg::Scalar(ScalarValue::U32(x as u32))),
    );
    args.extend(
        [stride_a, stride_b, stride_c].map(|x| CaseArg::Scalar(ScalarValue::U64(x as u64))),
    );
    Case {
        kernel: batched_symbol(elem),
        label: format!(
            "m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc} batch={batch} strides={stride_a},{stride_b},{stride_c}"
        ),
        args,
        grid: [None; 3],
    }
}

/// `(m, n, k)`, or the padding of A's, B's and C's rows.
type Size = (usize, usize, usize);

/// `(m, n, k)` and the padding of A's, B's and C's rows.
type Shape = (Size, Size);

/// Tails in every dimension, M = 1, K not a multiple of the 64-deep step, a Llama-sized K, views
/// with aligned and unaligned (element by element) rows.
const SHAPES: [Shape; 8] = [
    ((1, 1, 1), (0, 0, 0)),
    ((7, 7, 7), (0, 0, 0)),
    ((1, 4096, 4096), (0, 0, 0)),
    ((127, 129, 100), (0, 0, 0)),
    ((200, 300, 1000), (0, 0, 0)),
    ((129, 257, 4112), (16, 32, 5)),
    ((33, 70, 61), (3, 1, 2)),
    ((7, 127, 14336), (0, 0, 0)),
];

/// Batches: `(m, n, k)`, rows' padding, the batch and `(gap, shared_b)` as `batched_case`
/// takes them. Unaligned rows with a weight shared through stride 0, M = 1 over aligned
/// matrices, a shared weight on the fast copies over several blocks, a batch of one.
const BATCHES: [(Size, Size, usize, (usize, bool)); 4] = [
    ((33, 70, 61), (3, 1, 2), 3, (5, true)),
    ((1, 300, 1008), (0, 0, 0), 3, (16, false)),
    ((130, 150, 128), (0, 0, 0), 3, (0, true)),
    ((129, 64, 256), (16, 16, 8), 1, (0, false)),
];

/// Weight-only split K: `(m, n, k)`, rows' padding and the split (`None`: the contract's).
/// Decode shapes at the contract's split, more groups than splits, one group split two ways
/// (the second split empty) with unaligned rows, more splits than groups, and several blocks of
/// rows in one split.
const SPLITS: [(Size, Size, Option<u32>); 6] = [
    ((1, 4096, 4096), (0, 0, 0), None),
    ((16, 200, 4096), (0, 0, 0), None),
    ((7, 127, 1000), (0, 0, 0), Some(3)),
    ((33, 70, 61), (3, 1, 2), Some(2)),
    ((20, 200, 1000), (0, 0, 0), Some(16)),
    ((129, 64, 300), (16, 8, 3), Some(1)),
];

/// Every symbol on every shape.
pub fn plan(rng: &mut impl Rng) -> Vec<Planned> {
    let mut cases = Vec::new();
    for elem in ELEMENTS {
        let schemes: &[Scales] = if elem == ScalarType::I8 {
            &[Scales::PerToken]
        } else {
            &[
                Scales::PerTensor,
                Scales::PerToken,
                Scales::Block,
                Scales::WeightBlock,
            ]
        };
        for &scales in schemes {
            let shapes = SHAPES.iter().enumerate().map(|(i, &s)| (i % 2 == 1, s));
            for (bias, (size, pad)) in shapes.chain([(true, ((64, 64, 64), (0, 0, 0)))]) {
                let kernel = symbol(elem, scales, bias);
                cases.push(Planned::one(kernel, rng, move |rng| {
                    case(elem, scales, bias, size, pad, rng)
                }));
            }
        }
        for (size, pad, batch, strides) in BATCHES {
            cases.push(Planned::one(batched_symbol(elem), rng, move |rng| {
                batched_case(elem, size, pad, batch, strides, rng)
            }));
        }
        if elem != ScalarType::I8 {
            for (i, &(size, pad, splits)) in SPLITS.iter().enumerate() {
                let bias = i % 2 == 1;
                cases.push(Planned::one(splitk_symbol(elem, bias), rng, move |rng| {
                    splitk_case(elem, bias, splits, size, pad, rng)
                }));
            }
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// What `case` expects of C (its first argument), packed rows of n.
    fn expected_c(case: &Case) -> &[f64] {
        let CaseArg::Output {
            expect: Expect::StridedClose { want, .. },
            ..
        } = &case.args[0]
        else {
            panic!("c is a strided output")
        };
        want
    }

    /// The data of `case`'s input argument `name`.
    fn input_data(case: &Case, name: &str) -> Vec<f64> {
        case.args
            .iter()
            .find_map(|a| match a {
                CaseArg::Input { name: n, data, .. } if *n == name => Some(data.clone()),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn cases_cover_every_symbol_and_accept_their_reference() {
        let cases: Vec<Case> = plan(&mut StdRng::seed_from_u64(3))
            .into_iter()
            .flat_map(Planned::make)
            .collect();
        for elem in ELEMENTS {
            for scales in [
                Scales::PerTensor,
                Scales::PerToken,
                Scales::Block,
                Scales::WeightBlock,
            ] {
                for bias in [false, true] {
                    let symbol = symbol(elem, scales, bias);
                    let int8_only_per_token = elem == ScalarType::I8 && scales != Scales::PerToken;
                    assert!(
                        int8_only_per_token || cases.iter().any(|c| c.kernel == symbol),
                        "{symbol}"
                    );
                }
            }
        }
        for elem in ELEMENTS {
            assert!(cases.iter().any(|c| c.kernel == batched_symbol(elem)));
        }
        for elem in [ScalarType::Fp8E4m3fn, ScalarType::Fp8E4m3fnuz] {
            for bias in [false, true] {
                let symbol = splitk_symbol(elem, bias);
                assert!(cases.iter().any(|c| c.kernel == symbol), "{symbol}");
            }
        }
        let case = cases.iter().find(|c| c.label.starts_with("m=33")).unwrap();
        let CaseArg::Output {
            expect:
                Expect::StridedClose {
                    want,
                    row_len,
                    stride,
                    ..
                },
            ..
        } = &case.args[0]
        else {
            panic!("c is a strided output")
        };
        let mut got = vec![f64::NAN; want.len() / row_len * stride];
        for (r, row) in want.chunks(*row_len).enumerate() {
            got[r * stride..r * stride + row_len].copy_from_slice(
                &row.iter()
                    .map(|&x| round_to(ScalarType::Bf16, x))
                    .collect::<Vec<_>>(),
            );
        }
        let mut outputs = vec![None; case.args.len()];
        outputs[0] = Some(got.clone());
        assert!(case.check(&outputs).is_ok());
        // Dropping one k term is caught.
        got[0] += 0.5;
        outputs[0] = Some(got);
        assert!(case.check(&outputs).is_err());
    }

    #[test]
    fn split_k_cases_add_the_product_to_c() {
        // The same seed draws the same operands; the split-K case then draws C's start.
        let size = (3, 130, 300);
        let rng = || StdRng::seed_from_u64(9);
        let fp8 = ScalarType::Fp8E4m3fn;
        let stored = case(fp8, Scales::WeightBlock, true, size, (0, 0, 1), &mut rng());
        let added = splitk_case(fp8, true, Some(2), size, (0, 0, 1), &mut rng());
        assert_eq!(
            added.kernel,
            "gemm_a16w8_blockscale_splitk_e4m3fn_nt_bias_f32"
        );
        assert_eq!(added.grid, [None, None, Some(2)]);
        let CaseArg::InOut {
            elem: ScalarType::F32,
            data: start,
            expect: Expect::StridedClose { want, stride, .. },
            ..
        } = &added.args[0]
        else {
            panic!("a split K's c is an f32 input and output")
        };
        let (n, ldc) = (130, *stride);
        for (i, row) in expected_c(&stored).chunks(n).enumerate() {
            for (j, &product) in row.iter().enumerate() {
                assert_eq!(want[i * n + j], start[i * ldc + j] + product);
            }
            assert!(
                start[i * ldc + n].is_nan(),
                "the gap between rows is poisoned"
            );
        }
        // The start itself is not an answer.
        let mut outputs = vec![None; added.args.len()];
        outputs[0] = Some(start.clone());
        assert!(added.check(&outputs).is_err());
    }

    #[test]
    fn block_scales_weigh_each_group_of_k() {
        // k = 200: one whole group and a partial one; n = 130: two blocks of B's rows.
        let (m, n, k) = (2, 130, 200);
        let case = case(
            ScalarType::Fp8E4m3fn,
            Scales::Block,
            false,
            (m, n, k),
            (0, 0, 0),
            &mut StdRng::seed_from_u64(5),
        );
        let data = |name| input_data(&case, name);
        let (a, b, a_scale, b_scale) = (data("a"), data("b"), data("a_scale"), data("b_scale"));
        assert_eq!((a_scale.len(), b_scale.len()), (m * 2, 2 * 2));
        let want = expected_c(&case);
        let (i, j) = (1, 129);
        let group =
            |g: std::ops::Range<usize>| g.map(|kk| a[i * k + kk] * b[j * k + kk]).sum::<f64>();
        let expected = group(0..128) * a_scale[i * 2] * b_scale[2]
            + group(128..200) * a_scale[i * 2 + 1] * b_scale[3];
        assert!((want[i * n + j] - expected).abs() <= 1e-12 * expected.abs().max(1.0));
    }

    #[test]
    fn weight_only_scales_weigh_each_group_of_b_alone() {
        let (m, n, k) = (2, 130, 200);
        let case = case(
            ScalarType::Fp8E4m3fnuz,
            Scales::WeightBlock,
            true,
            (m, n, k),
            (0, 0, 0),
            &mut StdRng::seed_from_u64(9),
        );
        assert_eq!(case.kernel, "gemm_a16w8_blockscale_e4m3fnuz_nt_bias_bf16");
        let names: Vec<&str> = case
            .args
            .iter()
            .filter_map(|arg| match arg {
                CaseArg::Input { name, .. } | CaseArg::Output { name, .. } => Some(*name),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["c", "a", "b", "b_scale", "bias"]);
        let data = |name| input_data(&case, name);
        let (a, b, b_scale, bias) = (data("a"), data("b"), data("b_scale"), data("bias"));
        assert_eq!(b_scale.len(), 2 * 2);
        // A is bf16: values that FNUZ E4M3 cannot hold (finer than 3 mantissa bits) occur.
        assert!(a.iter().any(|&x| round_to(ScalarType::Fp8E4m3fnuz, x) != x));
        let want = expected_c(&case);
        let (i, j) = (1, 129);
        let group =
            |g: std::ops::Range<usize>| g.map(|kk| a[i * k + kk] * b[j * k + kk]).sum::<f64>();
        let expected = group(0..128) * b_scale[2] + group(128..200) * b_scale[3] + bias[j];
        assert!((want[i * n + j] - expected).abs() <= 1e-12 * expected.abs().max(1.0));
    }

    #[test]
    fn batches_offset_each_product_and_its_scales() {
        // Product 1 of three, B shared through stride 0 but scaled per product.
        let (m, n, k) = (2, 3, 5);
        let case = batched_case(
            ScalarType::Fp8E4m3fn,
            (m, n, k),
            (0, 0, 0),
            3,
            (4, true),
            &mut StdRng::seed_from_u64(7),
        );
        assert_eq!(case.kernel, "batched_gemm_fp8_e4m3fn_nt_per_token_bf16");
        let data = |name| input_data(&case, name);
        let (a, b, a_scale, b_scale) = (data("a"), data("b"), data("a_scale"), data("b_scale"));
        let stride_a = (m - 1) * k + k + 4;
        assert_eq!((a.len(), b.len()), (2 * stride_a + m * k, n * k));
        assert_eq!((a_scale.len(), b_scale.len()), (3 * m, 3 * n));
        assert!(a[m * k..stride_a].iter().all(|x| x.is_nan()));
        let strides: Vec<_> = case.args[case.args.len() - 3..]
            .iter()
            .map(|a| match a {
                CaseArg::Scalar(ScalarValue::U64(x)) => *x,
                _ => panic!("the strides are u64"),
            })
            .collect();
        assert_eq!(strides, [stride_a as u64, 0, (m * n) as u64]);
        let want = expected_c(&case);
        let (p, i, j) = (1, 1, 2);
        let sum: f64 = (0..k)
            .map(|kk| a[p * stride_a + i * k + kk] * b[j * k + kk])
            .sum();
        let expected = sum * a_scale[p * m + i] * b_scale[p * n + j];
        assert!((want[(p * m + i) * n + j] - expected).abs() <= 1e-12 * expected.abs().max(1.0));
    }

    #[test]
    fn int8_sums_are_exact_in_the_reference() {
        let case = case(
            ScalarType::I8,
            Scales::PerToken,
            false,
            (2, 3, 5),
            (0, 0, 0),
            &mut StdRng::seed_from_u64(1),
        );
        let CaseArg::Output {
            expect: Expect::StridedClose { abs, .. },
            ..
        } = &case.args[0]
        else {
            panic!("c is a strided output")
        };
        assert!(*abs < 1e-5);
    }
}
