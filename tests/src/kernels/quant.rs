//! FP8 quantization: the f64/f32 reference and the cases of `kernels/quant_fp8.hip`.
//!
//! Symbols (`F` in fp8_e4m3fn, fp8_e4m3fnuz):
//! - `quant_fp8_per_tensor_F_bf16(out, x, scale, n: u64)`: `out = F(x / scale[0])`.
//! - `quant_fp8_per_token_F_bf16(out, scales, x, rows, cols)`: per row, `scale = amax / F_MAX`
//!   (1 for an all-zero row), `out = F(x / scale)`.
//! - `quant_fp8_block_F_bf16(out, scales, x, rows, cols)`: the same per 1 x 128 group of a
//!   row, scales `[rows, ceil(cols / 128)]`.
//! - `rmsnorm_quant_fp8_F_bf16(out, scales, x, weight, eps, rows, cols)`: per-token
//!   quantization of `bf16(x · rsqrt(mean(x²) + eps) · weight)`.
//!
//! The first three are the same f32 operations on the host (an IEEE division, hkload's FP8
//! conversion) and so are compared exactly; the fused one is compared within one FP8 step,
//! its RMS scale being the device's approximate `rsqrt`.

use hk_format::abi::{ScalarType, ScalarValue};
use hk_format::fp8::Fp8Format;
use rand::Rng;

use crate::case::{Case, CaseArg, Expect};
use crate::host::{fp8_value, random_rounded, round_to};
use crate::kernels::norm::rmsnorm;

/// The formats the quantization kernels are built for.
pub const FORMATS: [Fp8Format; 2] = [Fp8Format::E4m3fn, Fp8Format::E4m3fnuz];

/// Columns of a block-scale group.
pub const GROUP: usize = 128;

/// The scale of values whose largest magnitude is `amax`: `amax / max` in f32, 1 for zero.
pub fn scale_of(format: Fp8Format, amax: f64) -> f32 {
    if amax > 0.0 {
        amax as f32 / format.max()
    } else {
        1.0
    }
}

/// `x / scale` in f32, converted to the format: the value of each code.
pub fn quantize(format: Fp8Format, x: &[f64], scale: f32) -> Vec<f64> {
    x.iter()
        .map(|&v| fp8_value(format, format.encode(v as f32 / scale)))
        .collect()
}

fn amax(x: &[f64]) -> f64 {
    x.iter().fold(0.0, |m, v| m.max(v.abs()))
}

/// Quantized values and scales of `x` in groups of `group` columns of rows of `cols`.
pub fn quantize_groups(
    format: Fp8Format,
    x: &[f64],
    cols: usize,
    group: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut out = Vec::with_capacity(x.len());
    let mut scales = Vec::new();
    for row in x.chunks(cols.max(1)) {
        for part in row.chunks(group) {
            let scale = scale_of(format, amax(part));
            out.extend(quantize(format, part, scale));
            scales.push(f64::from(scale));
        }
    }
    (out, scales)
}

/// bf16 rows with a spread of magnitudes; an all-zero row first where there are several rows.
fn input(rng: &mut impl Rng, rows: usize, cols: usize) -> Vec<f64> {
    let mut x = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let spread = [3.0, 0.01, 400.0, 1.0][r % 4];
        if r == 0 && rows > 1 {
            x.extend(std::iter::repeat_n(0.0, cols));
        } else {
            x.extend(random_rounded(rng, ScalarType::Bf16, cols, 0.0, spread));
        }
    }
    x
}

fn rows_cols(rows: usize, cols: usize) -> [CaseArg; 2] {
    [
        CaseArg::Scalar(ScalarValue::U32(rows as u32)),
        CaseArg::Scalar(ScalarValue::U32(cols as u32)),
    ]
}

fn exact(name: &'static str, elem: ScalarType, want: Vec<f64>) -> CaseArg {
    CaseArg::Output {
        name,
        elem,
        len: want.len(),
        expect: Expect::Exact(want),
    }
}

/// Every quantization kernel's cases, on fresh random inputs.
pub fn cases(rng: &mut impl Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for format in FORMATS {
        let ty = ScalarType::from(format);
        for n in [1usize, 7, 2048 + 9, 40_000] {
            let x = random_rounded(rng, ScalarType::Bf16, n, 0.0, 50.0);
            // A scale that saturates the largest tenth of the values.
            let scale = scale_of(format, amax(&x) * 0.9);
            cases.push(Case {
                kernel: format!("quant_fp8_per_tensor_{format}_bf16"),
                label: format!("n={n}"),
                args: vec![
                    exact("out", ty, quantize(format, &x, scale)),
                    CaseArg::input("x", ScalarType::Bf16, x),
                    CaseArg::input("scale", ScalarType::F32, vec![f64::from(scale)]),
                    CaseArg::Scalar(ScalarValue::U64(n as u64)),
                ],
                grid: [None; 3],
            });
        }
        // Per token: one group the row's width; per block: groups of GROUP columns.
        let grouped = [
            (
                "per_token",
                None,
                &[(1, 1), (3, 100), (5, 4099), (2, 10_007)][..],
            ),
            (
                "block",
                Some(GROUP),
                &[(1, 1), (3, 130), (4, 256), (2, 1000), (33, 128)],
            ),
        ];
        for (scheme, group, shapes) in grouped {
            for &(rows, cols) in shapes {
                let x = input(rng, rows, cols);
                let (out, scales) = quantize_groups(format, &x, cols, group.unwrap_or(cols));
                cases.push(Case {
                    kernel: format!("quant_fp8_{scheme}_{format}_bf16"),
                    label: format!("rows={rows} cols={cols}"),
                    args: [
                        vec![
                            exact("out", ty, out),
                            exact("scales", ScalarType::F32, scales),
                            CaseArg::input("x", ScalarType::Bf16, x),
                        ],
                        rows_cols(rows, cols).to_vec(),
                    ]
                    .concat(),
                    grid: [None; 3],
                });
            }
        }
        for (rows, cols) in [(1, 8), (3, 100), (4, 4096), (2, 10_007)] {
            cases.push(rmsnorm_quant_case(rng, format, rows, cols));
        }
    }
    cases
}

/// The fused kernel against the f64 RMSNorm rounded to bf16, quantized per token. Its RMS
/// scale comes from the device's `rsqrt` (2^-22 relative), which may move a normed value by a
/// bf16 step and so the row's amax and scale by 2^-7 relative and a quantized value by one
/// FP8 step (2^-3 relative for E4M3, or the smallest subnormal near zero), which is the bound.
fn rmsnorm_quant_case(rng: &mut impl Rng, format: Fp8Format, rows: usize, cols: usize) -> Case {
    let eps = 1e-6;
    let x = random_rounded(rng, ScalarType::Bf16, rows * cols, 0.0, 2.0);
    let weight = random_rounded(rng, ScalarType::Bf16, cols, 1.0, 0.5);
    let normed: Vec<f64> = x
        .chunks(cols)
        .flat_map(|row| rmsnorm(row, &weight, eps))
        .map(|v| round_to(ScalarType::Bf16, v))
        .collect();
    let (out, scales) = quantize_groups(format, &normed, cols, cols);
    let step = 2f64.powi(-(format.mantissa_bits() as i32));
    let smallest = f64::from(format.decode(1));
    let ty = ScalarType::from(format);
    Case {
        kernel: format!("rmsnorm_quant_fp8_{format}_bf16"),
        label: format!("rows={rows} cols={cols}"),
        args: [
            vec![
                CaseArg::close("out", ty, out, (smallest, step)),
                CaseArg::close("scales", ScalarType::F32, scales, (0.0, 2f64.powi(-7))),
                CaseArg::input("x", ScalarType::Bf16, x),
                CaseArg::input("weight", ScalarType::Bf16, weight),
                CaseArg::Scalar(ScalarValue::F32(eps as f32)),
            ],
            rows_cols(rows, cols).to_vec(),
        ]
        .concat(),
        grid: [None; 3],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn want(case: &Case) -> Vec<Option<Vec<f64>>> {
        case.args
            .iter()
            .map(|arg| match arg {
                CaseArg::Output {
                    expect: Expect::Exact(w),
                    ..
                } => Some(w.clone()),
                CaseArg::Output {
                    expect: Expect::Close { want, .. },
                    ..
                } => Some(want.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn scales_map_the_largest_value_to_the_formats_largest() {
        for format in FORMATS {
            let x = [0.5, -3.0, 1.25];
            let (out, scales) = quantize_groups(format, &x, 3, GROUP);
            assert_eq!(out[1], -f64::from(format.max()), "{format}");
            assert!((out[0] * scales[0] - 0.5).abs() <= 0.5 / 8.0, "{format}");
            let (zeros, scales) = quantize_groups(format, &[0.0; 4], 2, GROUP);
            assert_eq!((zeros, scales), (vec![0.0; 4], vec![1.0, 1.0]));
        }
        // A partial last group has its own scale.
        let (_, scales) = quantize_groups(Fp8Format::E4m3fn, &[1.0; 130], 130, GROUP);
        assert_eq!(scales.len(), 2);
    }

    #[test]
    fn cases_accept_their_reference_and_refuse_the_other_format() {
        let cases = cases(&mut StdRng::seed_from_u64(5));
        for case in &cases {
            assert_eq!(
                case.check(&want(case)),
                Ok(()),
                "{} {}",
                case.kernel,
                case.label
            );
        }
        // The same bytes read in the other family's format are off by a factor of two.
        let ocp = cases
            .iter()
            .find(|c| {
                c.kernel == "quant_fp8_per_token_fp8_e4m3fn_bf16" && c.label == "rows=3 cols=100"
            })
            .unwrap();
        let mut outputs = want(ocp);
        let out = outputs[0].as_mut().unwrap();
        for v in out.iter_mut() {
            *v = fp8_value(Fp8Format::E4m3fnuz, Fp8Format::E4m3fn.encode(*v as f32));
        }
        assert!(ocp.check(&outputs).is_err());
    }
}
