//! 8-bit GEMMs: the f64 reference and the cases of `kernels/gemm_q8.hip`.
//!
//! `gemm_a8w8_nt[_bias]_bf16` (int8) and `gemm_fp8_{e4m3fn,e4m3fnuz}_nt_{per_tensor,per_token}
//! [_bias]_bf16` compute `C[i][j] = bf16(Σ_k A[i][k] B[j][k] · a_scale · b_scale (+ bias[j]))`
//! with B stored `[N][K]`. The reference sums the same quantized values in f64 (exact for int8,
//! and for FP8 as long as K · 2^-24 relative is under the bound below), so the kernel may
//! differ by the f32 steps (the sum's accumulation, its conversion, two scalings, the bias:
//! `K · 2⁻²² · spread + 4 · 2⁻²⁴ · |scaled sum|`) and the bf16 rounding (2⁻⁸ relative).
//! Inputs are the contract's extents with poison (NaN for FP8, which the format encodes; the
//! largest int8 for int8) in the gaps between rows; C's gaps must stay NaN.

use hkload::abi::{ScalarType, ScalarValue};
use rand::Rng;

use crate::case::{Case, CaseArg, Expect};
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
}

/// The kernel's symbol.
pub fn symbol(elem: ScalarType, scales: Scales, bias: bool) -> String {
    let bias = if bias { "_bias" } else { "" };
    match (elem, scales) {
        (ScalarType::I8, _) => format!("gemm_a8w8_nt{bias}_bf16"),
        (_, Scales::PerTensor) => format!("gemm_{}_nt_per_tensor{bias}_bf16", elem.name()),
        (_, Scales::PerToken) => format!("gemm_{}_nt_per_token{bias}_bf16", elem.name()),
    }
}

/// `rows` rows of `cols` random values of `elem`, `ld` apart, poison in the gaps.
fn strided(rng: &mut impl Rng, elem: ScalarType, rows: usize, cols: usize, ld: usize) -> Vec<f64> {
    let poison = if elem == ScalarType::I8 {
        127.0
    } else {
        f64::NAN
    };
    let mut data = vec![poison; (rows - 1) * ld + cols];
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

/// One launch on fresh random inputs: `(m, n, k)` with rows padded by `pad` elements.
pub fn case(
    elem: ScalarType,
    scales: Scales,
    bias: bool,
    (m, n, k): (usize, usize, usize),
    pad: (usize, usize, usize),
    rng: &mut impl Rng,
) -> Case {
    let (lda, ldb, ldc) = (k + pad.0, k + pad.1, n + pad.2);
    let a = strided(rng, elem, m, k, lda);
    let b = strided(rng, elem, n, k, ldb);
    let scale = |rng: &mut dyn rand::RngCore, len: usize| -> Vec<f64> {
        (0..len)
            .map(|_| f64::from(rng.random_range(0.001f32..0.02)))
            .collect()
    };
    let (a_len, b_len) = match scales {
        Scales::PerTensor => (1, 1),
        Scales::PerToken => (m, n),
    };
    let a_scale = scale(rng, a_len);
    let b_scale = scale(rng, b_len);
    let bias_values: Option<Vec<f64>> = bias.then(|| {
        (0..n)
            .map(|_| round_to(ScalarType::Bf16, rng.random_range(-1.0..1.0)))
            .collect()
    });
    let mut want = vec![0.0; m * n];
    let (mut spread, mut largest) = (0.0f64, 0.0f64);
    for i in 0..m {
        for j in 0..n {
            let (mut sum, mut squares) = (0.0, 0.0);
            for kk in 0..k {
                let p = a[i * lda + kk] * b[j * ldb + kk];
                sum += p;
                squares += p * p;
            }
            let s =
                a_scale[if a_len == 1 { 0 } else { i }] * b_scale[if b_len == 1 { 0 } else { j }];
            spread = spread.max(squares.sqrt() * s);
            largest = largest.max((sum * s).abs());
            want[i * n + j] = sum * s + bias_values.as_ref().map_or(0.0, |v| v[j]);
        }
    }
    // Exact i32 sums for int8; f32 accumulation for FP8.
    let accumulation = if elem == ScalarType::I8 {
        0.0
    } else {
        k as f64 * 2f64.powi(-22) * spread
    };
    let abs = accumulation + 4.0 * 2f64.powi(-24) * largest + 2f64.powi(-134);
    let mut args = vec![
        CaseArg::Output {
            name: "c",
            elem: ScalarType::Bf16,
            len: m * ldc,
            expect: Expect::StridedClose {
                want,
                row_len: n,
                stride: ldc,
                abs,
                rel: 2f64.powi(-8),
            },
        },
        CaseArg::input("a", elem, a),
        CaseArg::input("b", elem, b),
        CaseArg::input("a_scale", ScalarType::F32, a_scale),
        CaseArg::input("b_scale", ScalarType::F32, b_scale),
    ];
    if let Some(values) = bias_values {
        args.push(CaseArg::input("bias", ScalarType::Bf16, values));
    }
    args.extend([m, n, k, lda, ldb, ldc].map(|x| CaseArg::Scalar(ScalarValue::U32(x as u32))));
    Case {
        kernel: symbol(elem, scales, bias),
        label: format!("m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc}"),
        args,
        grid: [None; 3],
    }
}

/// `(m, n, k)` and the padding of A's, B's and C's rows.
type Shape = ((usize, usize, usize), (usize, usize, usize));

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

/// Every symbol on every shape.
pub fn cases(rng: &mut impl Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for elem in ELEMENTS {
        let schemes: &[Scales] = if elem == ScalarType::I8 {
            &[Scales::PerToken]
        } else {
            &[Scales::PerTensor, Scales::PerToken]
        };
        for &scales in schemes {
            for (i, &(size, pad)) in SHAPES.iter().enumerate() {
                cases.push(case(elem, scales, i % 2 == 1, size, pad, rng));
            }
            cases.push(case(elem, scales, true, (64, 64, 64), (0, 0, 0), rng));
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn cases_cover_every_symbol_and_accept_their_reference() {
        let cases = cases(&mut StdRng::seed_from_u64(3));
        for elem in ELEMENTS {
            for scales in [Scales::PerTensor, Scales::PerToken] {
                for bias in [false, true] {
                    let symbol = symbol(elem, scales, bias);
                    assert!(cases.iter().any(|c| c.kernel == symbol), "{symbol}");
                }
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
