//! GEMM: the f64 reference and the cases of the kernels in `kernels/gemm.hip`.
//!
//! Symbols `gemm_a16w16_{nt,nn}_{bf16,f16}[_bias][_out_f32](c, a, b, [bias,] m, n, k, lda, ldb,
//! ldc)`, row-major with leading dimensions:
//! - `nt`: `C[i][j] = Σ_k A[i][k] · B[j][k]` (B stored `[N][K]`, a linear layer's weight);
//! - `nn`: `C[i][j] = Σ_k A[i][k] · B[k][j]` (B stored `[K][N]`);
//!
//! plus `bias[j]` for `_bias`, C in f32 for `_out_f32`, else in the input type; and
//! `gemm_a16w16_splitk_nt_{bf16,f16}[_bias]`, which add the `nt` product (and bias) to an f32 C
//! with K split over the grid's z blocks (cases start C from random values and vary the split,
//! including more splits than K has steps).
//!
//! `gemm_a16w16_gated_{silu,gelu_tanh}_{bf16,f16}(c, a, w_gate, w_up, m, n, k, lda, ldb, ldc)`
//! computes `C = act(A·W_gateᵀ) ⊙ (A·W_upᵀ)` in the input type (both weights `[N][K]`); its
//! bound carries each product's through the activation (slope at most 1.2 for both).
//!
//! `batched_gemm_a16w16_{nt,nn}_{bf16,f16}(c, a, b, m, n, k, lda, ldb, ldc, batch, stride_a,
//! stride_b, stride_c)` computes `batch` products (C in the input type), matrix `i` of each
//! operand `stride_*` elements after matrix `i − 1`; cases include a shared B (stride 0).
//!
//! Error bound of `C[i][j]`, with `u` the output's rounding (2⁻⁸ bf16, 2⁻¹¹ f16, 2⁻²⁴ f32):
//! `u · |ref| + K · 2⁻²² · max over the case of sqrt(Σ_k A[i][k]² B[k][j]²) + tiny`, where
//! `tiny` is half the output type's subnormal spacing (2⁻²⁵ for f16; results below 2⁻¹⁴ round
//! to that absolute step, not to `u` relative). Products of 16-bit
//! values are exact in f32, so the second term is the f32 accumulation alone: a generous
//! statistical bound on K roundings of partial sums, which is still 10 to 1000 times smaller
//! than the error of dropping one k term (the device check in `bench/python/gemm_bench.py` shows a
//! kernel run with `k - 1` failing it).
//!
//! Inputs are exactly the contract's extents (`(m - 1) · lda + k` elements of A, and so on),
//! with NaN in the gaps between rows, so a kernel that read outside the matrix would poison
//! its result; C has `m · ldc` elements and the gaps must keep the poison.
//!
//! Launch: the contracts in `manifests/gemm.toml`; the split-K cases pick their own z, as any
//! z is correct.

use hk_format::abi::{ScalarType, ScalarValue};
use rand::Rng;

use crate::case::{Case, CaseArg, Expect, Planned, grid_label};
use crate::host::random_rounded;
use crate::kernels::activation::Activation;

/// How B is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[N][K]`: C = A·Bᵀ of the stored matrix.
    Nt,
    /// `[K][N]`: C = A·B.
    Nn,
}

/// One kernel of the family.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    pub layout: Layout,
    pub ty: ScalarType,
    pub bias: bool,
    pub out_f32: bool,
    /// `C += A·Bᵀ` into f32 with K split over `splits` blocks (`nt`, `out_f32` only).
    pub split_k: Option<u32>,
}

impl Variant {
    /// All 16 symbols.
    pub fn all() -> Vec<Variant> {
        let mut all = Vec::new();
        for layout in [Layout::Nt, Layout::Nn] {
            for ty in [ScalarType::Bf16, ScalarType::F16] {
                for bias in [false, true] {
                    for out_f32 in [false, true] {
                        all.push(Variant {
                            layout,
                            ty,
                            bias,
                            out_f32,
                            split_k: None,
                        });
                    }
                }
            }
        }
        all
    }

    /// The 4 split-K symbols, split `splits` ways.
    pub fn split_k(splits: u32) -> Vec<Variant> {
        let mut all = Vec::new();
        for ty in [ScalarType::Bf16, ScalarType::F16] {
            for bias in [false, true] {
                all.push(Variant {
                    layout: Layout::Nt,
                    ty,
                    bias,
                    out_f32: true,
                    split_k: Some(splits),
                });
            }
        }
        all
    }

    pub fn symbol(&self) -> String {
        if self.split_k.is_some() {
            let bias = if self.bias { "_bias" } else { "" };
            return format!("gemm_a16w16_splitk_nt_{}{bias}", self.ty.name());
        }
        let layout = match self.layout {
            Layout::Nt => "nt",
            Layout::Nn => "nn",
        };
        format!(
            "gemm_a16w16_{layout}_{}{}{}",
            self.ty.name(),
            if self.bias { "_bias" } else { "" },
            if self.out_f32 { "_out_f32" } else { "" }
        )
    }

    fn out_type(&self) -> ScalarType {
        if self.out_f32 {
            ScalarType::F32
        } else {
            self.ty
        }
    }
}

/// A problem: sizes and leading dimensions.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
}

impl Shape {
    /// Dense rows for `layout`, or rows padded by `(pa, pb, pc)` elements.
    pub fn new(
        layout: Layout,
        (m, n, k): (usize, usize, usize),
        (pa, pb, pc): (usize, usize, usize),
    ) -> Self {
        let b_row = match layout {
            Layout::Nt => k,
            Layout::Nn => n,
        };
        Shape {
            m,
            n,
            k,
            lda: k + pa,
            ldb: b_row + pb,
            ldc: n + pc,
        }
    }
}

/// `rows` rows of `cols` values from `rng`, rounded to `ty`, `ld` apart, NaN in the gaps:
/// `(m - 1) · ld + cols` elements, the contract's extent.
fn strided_input(
    rng: &mut impl Rng,
    ty: ScalarType,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Vec<f64> {
    let mut data = vec![f64::NAN; (rows - 1) * ld + cols];
    for r in 0..rows {
        data[r * ld..r * ld + cols].copy_from_slice(&random_rounded(rng, ty, cols, 0.0, 1.0));
    }
    data
}

/// `C = A·B (+ bias)` in f64, and the largest `sqrt(Σ_k A[i][k]² B[k][j]² (+ bias[j]²))`, for
/// `a` with rows `lda` apart and `b_kn` dense `[K][N]`. The bias counts as a term: the kernels
/// start their accumulators from it, so every addition of the sum rounds with it in (a
/// tensor-core addition may be off by a whole f32 unit of the running sum, which at k = 1 with
/// a larger bias exceeded a bound without it).
pub fn reference(shape: &Shape, a: &[f64], b_kn: &[f64], bias: Option<&[f64]>) -> (Vec<f64>, f64) {
    let Shape { m, n, k, lda, .. } = *shape;
    let mut c = vec![0.0; m * n];
    let mut spread = 0.0f64;
    let mut squares = vec![0.0; n];
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        squares.iter_mut().for_each(|s| *s = 0.0);
        for kk in 0..k {
            let x = a[i * lda + kk];
            let b_row = &b_kn[kk * n..(kk + 1) * n];
            for ((acc, sq), &y) in row.iter_mut().zip(squares.iter_mut()).zip(b_row) {
                *acc += x * y;
                *sq += (x * y) * (x * y);
            }
        }
        if let Some(bias) = bias {
            for ((acc, sq), &b) in row.iter_mut().zip(squares.iter_mut()).zip(bias) {
                *acc += b;
                *sq += b * b;
            }
        }
        spread = squares.iter().fold(spread, |s, &q| s.max(q.sqrt()));
    }
    (c, spread)
}

/// One launch of `variant` on fresh random inputs.
pub fn case(variant: Variant, shape: Shape, rng: &mut impl Rng) -> Case {
    let Shape {
        m,
        n,
        k,
        lda,
        ldb,
        ldc,
    } = shape;
    let ty = variant.ty;
    let a = strided_input(rng, ty, m, k, lda);
    let (b, b_kn) = match variant.layout {
        Layout::Nt => {
            let b = strided_input(rng, ty, n, k, ldb);
            let mut b_kn = vec![0.0; k * n];
            for j in 0..n {
                for kk in 0..k {
                    b_kn[kk * n + j] = b[j * ldb + kk];
                }
            }
            (b, b_kn)
        }
        Layout::Nn => {
            let b = strided_input(rng, ty, k, n, ldb);
            let mut b_kn = vec![0.0; k * n];
            for kk in 0..k {
                b_kn[kk * n..(kk + 1) * n].copy_from_slice(&b[kk * ldb..kk * ldb + n]);
            }
            (b, b_kn)
        }
    };
    let bias = variant.bias.then(|| random_rounded(rng, ty, n, 0.0, 1.0));
    let (mut want, spread) = reference(&shape, &a, &b_kn, bias.as_deref());
    let out = variant.out_type();
    let unit = match out {
        ScalarType::Bf16 => 2f64.powi(-8),
        ScalarType::F16 => 2f64.powi(-11),
        // Split K rounds once more per split that adds to an element.
        _ if variant.split_k.is_some() => 2f64.powi(-20),
        _ => 2f64.powi(-24),
    };
    let abs = k as f64 * 2f64.powi(-22) * spread + tiny(out);
    // Split K adds to C, which starts from random values (NaN between rows).
    let start = variant.split_k.map(|_| {
        let mut start = vec![f64::NAN; m * ldc];
        for r in 0..m {
            let row = random_rounded(rng, ScalarType::F32, n, 0.0, 4.0);
            for (j, &x) in row.iter().enumerate() {
                start[r * ldc + j] = x;
                want[r * n + j] += x;
            }
        }
        start
    });
    let expect = Expect::StridedClose {
        want,
        row_len: n,
        stride: ldc,
        abs,
        rel: unit,
    };
    let c = match start {
        None => CaseArg::Output {
            name: "c",
            elem: out,
            len: m * ldc,
            expect,
        },
        Some(data) => CaseArg::InOut {
            name: "c",
            elem: out,
            data,
            expect,
        },
    };
    let mut args = vec![c, CaseArg::input("a", ty, a), CaseArg::input("b", ty, b)];
    if let Some(bias) = bias {
        args.push(CaseArg::input("bias", ty, bias));
    }
    args.extend([m, n, k, lda, ldb, ldc].map(|x| CaseArg::Scalar(ScalarValue::U32(x as u32))));
    Case {
        kernel: variant.symbol(),
        label: format!(
            "m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc}{}",
            grid_label([None, None, variant.split_k])
        ),
        args,
        grid: [None, None, variant.split_k],
    }
}

/// Half the subnormal spacing of `ty`: the rounding error of results too small for `u · |ref|`.
fn tiny(ty: ScalarType) -> f64 {
    match ty {
        ScalarType::F16 => 2f64.powi(-25),
        ScalarType::Bf16 => 2f64.powi(-134),
        _ => 2f64.powi(-150),
    }
}

/// `(m, n, k)`, or paddings `(lda, ldb, ldc past the row width)`.
type Size = (usize, usize, usize);

/// A batch of `batch` products of one shape, A matrices `stride_a` apart (NaN in between),
/// B `stride_b` apart (0: one B for all), C `m · ldc` apart, so that C's rows are evenly
/// strided through the whole batch.
/// The batched kernel of `layout` and `ty`.
pub fn batched_symbol(layout: Layout, ty: ScalarType) -> String {
    let variant = Variant {
        layout,
        ty,
        bias: false,
        out_f32: false,
        split_k: None,
    };
    format!("batched_{}", variant.symbol())
}

pub fn batched_case(
    layout: Layout,
    ty: ScalarType,
    shape: Shape,
    batch: usize,
    (gap_a, stride_b_zero): (usize, bool),
    rng: &mut impl Rng,
) -> Case {
    let Shape {
        m,
        n,
        k,
        lda,
        ldb,
        ldc,
    } = shape;
    let (b_rows, b_cols) = match layout {
        Layout::Nt => (n, k),
        Layout::Nn => (k, n),
    };
    let extent_a = (m - 1) * lda + k;
    let extent_b = (b_rows - 1) * ldb + b_cols;
    let stride_a = extent_a + gap_a;
    let stride_b = if stride_b_zero { 0 } else { extent_b + 3 };
    let stride_c = m * ldc;
    let mut a = vec![f64::NAN; (batch - 1) * stride_a + extent_a];
    let mut b = vec![f64::NAN; (batch - 1) * stride_b + extent_b];
    let mut want = Vec::with_capacity(batch * m * n);
    let mut spread = 0.0f64;
    for i in 0..batch {
        let ai = strided_input(rng, ty, m, k, lda);
        a[i * stride_a..i * stride_a + extent_a].copy_from_slice(&ai);
        if i == 0 || stride_b != 0 {
            let bi = strided_input(rng, ty, b_rows, b_cols, ldb);
            b[i * stride_b..i * stride_b + extent_b].copy_from_slice(&bi);
        }
        let bi = &b[i * stride_b..i * stride_b + extent_b];
        let mut b_kn = vec![0.0; k * n];
        for kk in 0..k {
            for j in 0..n {
                b_kn[kk * n + j] = match layout {
                    Layout::Nt => bi[j * ldb + kk],
                    Layout::Nn => bi[kk * ldb + j],
                };
            }
        }
        let (c, s) = reference(&shape, &ai, &b_kn, None);
        want.extend(c);
        spread = spread.max(s);
    }
    let unit = match ty {
        ScalarType::Bf16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    };
    let mut args = vec![
        CaseArg::Output {
            name: "c",
            elem: ty,
            len: batch * stride_c,
            expect: Expect::StridedClose {
                want,
                row_len: n,
                stride: ldc,
                abs: k as f64 * 2f64.powi(-22) * spread + tiny(ty),
                rel: unit,
            },
        },
        CaseArg::input("a", ty, a),
        CaseArg::input("b", ty, b),
    ];
    args.extend(
        [m, n, k, lda, ldb, ldc, batch].map(|x| CaseArg::Scalar(ScalarValue::U32(x as u32))),
    );
    args.extend(
        [stride_a, stride_b, stride_c].map(|x| CaseArg::Scalar(ScalarValue::U64(x as u64))),
    );
    Case {
        kernel: batched_symbol(layout, ty),
        label: format!(
            "m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc} batch={batch} strides={stride_a},{stride_b},{stride_c}"
        ),
        args,
        grid: [None; 3],
    }
}

/// `C = act(A·W_gateᵀ) ⊙ (A·W_upᵀ)` for `act` silu or gelu-tanh, on fresh random inputs.
/// The gated kernel of `act` and `ty`.
pub fn gated_symbol(act: Activation, ty: ScalarType) -> String {
    format!("gemm_a16w16_gated_{}_{}", act.name(), ty.name())
}

pub fn gated_case(act: Activation, ty: ScalarType, shape: Shape, rng: &mut impl Rng) -> Case {
    let Shape {
        m,
        n,
        k,
        lda,
        ldb,
        ldc,
    } = shape;
    let a = strided_input(rng, ty, m, k, lda);
    let weights: Vec<Vec<f64>> = (0..2).map(|_| strided_input(rng, ty, n, k, ldb)).collect();
    let products: Vec<(Vec<f64>, f64)> = weights
        .iter()
        .map(|w| {
            let mut b_kn = vec![0.0; k * n];
            for j in 0..n {
                for kk in 0..k {
                    b_kn[kk * n + j] = w[j * ldb + kk];
                }
            }
            reference(&shape, &a, &b_kn, None)
        })
        .collect();
    let (gate, up) = (&products[0].0, &products[1].0);
    let want: Vec<f64> = gate
        .iter()
        .zip(up)
        .map(|(&g, &u)| act.apply(g) * u)
        .collect();
    // Each product within e of its exact value moves act(g)·u by at most 1.2·e·|u| + |act(g)|·e.
    let e = k as f64 * 2f64.powi(-22) * products[0].1.max(products[1].1);
    let up_max = up.iter().fold(0.0f64, |x, &u| x.max(u.abs()));
    let act_max = gate.iter().fold(0.0f64, |x, &g| x.max(act.apply(g).abs()));
    let unit = match ty {
        ScalarType::Bf16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    };
    let [w_gate, w_up]: [Vec<f64>; 2] = weights.try_into().unwrap();
    let mut args = vec![
        CaseArg::Output {
            name: "c",
            elem: ty,
            len: m * ldc,
            expect: Expect::StridedClose {
                want,
                row_len: n,
                stride: ldc,
                abs: e * (1.2 * up_max + act_max) + tiny(ty),
                rel: unit,
            },
        },
        CaseArg::input("a", ty, a),
        CaseArg::input("w_gate", ty, w_gate),
        CaseArg::input("w_up", ty, w_up),
    ];
    args.extend([m, n, k, lda, ldb, ldc].map(|x| CaseArg::Scalar(ScalarValue::U32(x as u32))));
    Case {
        kernel: gated_symbol(act, ty),
        label: format!("m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc}"),
        args,
        grid: [None; 3],
    }
}

/// Sizes: tails in every dimension (1, 7, 127, 129, 257), the model sizes 4096 and 14336 where
/// the f64 reference stays cheap, and K = 4104 (not a multiple of the 32-deep steps).
const SHAPES: [Size; 18] = [
    (1, 1, 1),
    (7, 7, 7),
    (1, 4096, 4096),
    (7, 127, 14336),
    (64, 64, 64),
    (127, 127, 127),
    (64, 4096, 127),
    (7, 4096, 4096),
    (127, 1, 14336),
    (1, 14336, 64),
    (4096, 7, 64),
    (4096, 64, 127),
    (127, 127, 4096),
    (64, 14336, 7),
    (4096, 1, 4096),
    (1, 7, 14336),
    (200, 300, 1000),
    (129, 257, 4104),
];

/// Every case: each shape with both layouts (type, bias and output type cycling), then every
/// symbol on views: rows padded to aligned leading dimensions, and rows that are not 16-byte
/// aligned (odd leading dimensions, read element by element).
pub fn plan(rng: &mut impl Rng) -> Vec<Planned> {
    let mut cases = Vec::new();
    for (i, &size) in SHAPES.iter().enumerate() {
        for (j, layout) in [Layout::Nt, Layout::Nn].into_iter().enumerate() {
            let variant = Variant {
                layout,
                ty: if (i + j) % 2 == 0 {
                    ScalarType::Bf16
                } else {
                    ScalarType::F16
                },
                bias: i % 2 == 0,
                out_f32: i % 3 == 0,
                split_k: None,
            };
            let shape = Shape::new(layout, size, (0, 0, 0));
            cases.push(planned(variant, shape, rng));
        }
    }
    for variant in Variant::all() {
        let layout = variant.layout;
        let shapes = [((77, 200, 136), (8, 16, 5)), ((33, 70, 61), (3, 1, 2))];
        for (size, pad) in shapes {
            cases.push(planned(variant, Shape::new(layout, size, pad), rng));
        }
    }
    // Split K: decode sizes, z from 1 to more splits than K has 128-deep steps (the extra
    // blocks add nothing), views and unaligned rows; past 16 rows (sm_90a's wgmma program),
    // two row blocks and a partial column block.
    let split_shapes: [(Size, Size, u32); 7] = [
        ((1, 4096, 4096), (0, 0, 0), 9),
        ((130, 520, 4096), (0, 0, 0), 5),
        ((16, 1000, 14336), (0, 0, 0), 7),
        ((7, 127, 4096), (8, 8, 3), 1),
        ((64, 300, 1000), (0, 0, 0), 40),
        ((33, 70, 61), (3, 1, 2), 2),
        ((1, 7, 14336), (0, 0, 0), 112),
    ];
    for (i, &(size, pad, splits)) in split_shapes.iter().enumerate() {
        let variants = Variant::split_k(splits);
        for variant in [variants[i % 4], variants[(i + 1) % 4]] {
            cases.push(planned(variant, Shape::new(Layout::Nt, size, pad), rng));
        }
    }
    // Batches: every symbol, ragged sizes, views, a B shared by the whole batch.
    for (i, layout) in [Layout::Nt, Layout::Nn].into_iter().enumerate() {
        for (j, ty) in [ScalarType::Bf16, ScalarType::F16].into_iter().enumerate() {
            let shared_b = (i + j) % 2 == 0;
            let batches = [
                ((33, 70, 61), (3, 1, 2), 3, (5, shared_b)),
                ((129, 64, 256), (0, 0, 0), 4, (0, !shared_b)),
                ((1, 300, 1000), (8, 8, 8), 2, (8, false)),
            ];
            for (size, pad, batch, strides) in batches {
                let shape = Shape::new(layout, size, pad);
                cases.push(Planned::one(batched_symbol(layout, ty), rng, move |rng| {
                    batched_case(layout, ty, shape, batch, strides, rng)
                }));
            }
        }
    }
    // Gated: both activations and types, tails, views, unaligned rows, a Llama-sized K.
    for act in [Activation::Silu, Activation::GeluTanh] {
        for ty in [ScalarType::Bf16, ScalarType::F16] {
            for (size, pad) in [
                ((1, 1, 1), (0, 0, 0)),
                ((33, 70, 61), (3, 1, 2)),
                ((130, 129, 256), (8, 8, 3)),
                ((7, 300, 4096), (0, 0, 0)),
            ] {
                let shape = Shape::new(Layout::Nt, size, pad);
                cases.push(Planned::one(gated_symbol(act, ty), rng, move |rng| {
                    gated_case(act, ty, shape, rng)
                }));
            }
        }
    }
    cases
}

/// `case` of `variant` at `shape`, planned.
fn planned(variant: Variant, shape: Shape, rng: &mut impl Rng) -> Planned {
    Planned::one(variant.symbol(), rng, move |rng| case(variant, shape, rng))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn reference_multiplies_both_layouts() {
        // A = [[1, 2], [3, 4]] (lda 3, NaN gap), B = [[5, 6], [7, 8]] as [K][N].
        let shape = Shape {
            m: 2,
            n: 2,
            k: 2,
            lda: 3,
            ldb: 2,
            ldc: 2,
        };
        let a = [1.0, 2.0, f64::NAN, 3.0, 4.0];
        let (c, spread) = reference(&shape, &a, &[5.0, 6.0, 7.0, 8.0], Some(&[0.5, -0.5]));
        assert_eq!(c, [19.5, 21.5, 43.5, 49.5]);
        // Row 1, column 1: products 18 and 32, and the bias -0.5 as a term.
        assert_eq!(spread, (18.0f64 * 18.0 + 32.0 * 32.0 + 0.25).sqrt());
    }

    #[test]
    fn cases_cover_every_symbol_and_accept_their_reference() {
        let cases: Vec<Case> = plan(&mut StdRng::seed_from_u64(7))
            .into_iter()
            .flat_map(Planned::make)
            .collect();
        assert!(cases.len() >= 30);
        for variant in Variant::all().into_iter().chain(Variant::split_k(1)) {
            assert!(
                cases
                    .iter()
                    .filter(|c| c.kernel == variant.symbol())
                    .count()
                    >= 2
            );
        }
        for name in ["nt_bf16", "nt_f16", "nn_bf16", "nn_f16"] {
            let symbol = format!("batched_gemm_a16w16_{name}");
            assert_eq!(cases.iter().filter(|c| c.kernel == symbol).count(), 3);
        }
        for name in ["silu_bf16", "silu_f16", "gelu_tanh_bf16", "gelu_tanh_f16"] {
            let symbol = format!("gemm_a16w16_gated_{name}");
            assert_eq!(cases.iter().filter(|c| c.kernel == symbol).count(), 4);
        }
        // The reference itself passes (gaps left as the poison), and an unwritten element
        // fails.
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
            got[r * stride..r * stride + row_len].copy_from_slice(row);
        }
        let mut outputs = vec![None; case.args.len()];
        outputs[0] = Some(got.clone());
        assert!(case.check(&outputs).is_ok());
        got[*stride + 1] = f64::NAN;
        outputs[0] = Some(got);
        assert!(case.check(&outputs).is_err());
    }
}
