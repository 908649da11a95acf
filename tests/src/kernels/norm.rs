//! RMSNorm and LayerNorm, plain and fused with a residual add: the f64 reference and the cases
//! of the kernels in `kernels/rmsnorm.hip` and `kernels/layernorm.hip`.
//!
//! Symbols (`T` in bf16, f16, f32), every tensor row-major `[rows, cols]`, normalized along
//! `cols`:
//! - `rmsnorm_T(out, x, weight, eps, rows, cols)`
//! - `fused_add_rmsnorm_T(out, residual, x, weight, eps, rows, cols)`: `residual` becomes
//!   `T(x + residual)` and `out` the RMSNorm of that stored sum.
//! - `layernorm_T(out, x, weight, bias, eps, rows, cols)`
//! - `fused_add_layernorm_T(out, residual, x, weight, bias, eps, rows, cols)`, likewise.
//!
//! Launch: the kernels' contract (`manifests/rmsnorm.toml`, `manifests/layernorm.toml`).

use hk_format::abi::{ScalarType, ScalarValue};
use rand::Rng;

use crate::case::{Call, CallArg, Case, Expect, Fill, grid_label};
use crate::host::{epsilon, random_rounded, round_to};

/// `x · weight / sqrt(mean(x²) + eps)` for one row.
pub fn rmsnorm(x: &[f64], weight: &[f64], eps: f64) -> Vec<f64> {
    let mean_sq = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let scale = 1.0 / (mean_sq + eps).sqrt();
    x.iter().zip(weight).map(|(v, w)| v * scale * w).collect()
}

/// `(x − mean) / sqrt(var + eps) · weight + bias` for one row, with the biased variance (the
/// mean of the squared deviations), as PyTorch's `layer_norm` takes it.
pub fn layernorm(x: &[f64], weight: &[f64], bias: &[f64], eps: f64) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let rstd = 1.0 / (var + eps).sqrt();
    x.iter()
        .zip(weight)
        .zip(bias)
        .map(|((v, w), b)| (v - mean) * rstd * w + b)
        .collect()
}

/// The residual a fused kernel stores: `x + residual` rounded to the element type.
pub fn residual_add(ty: ScalarType, x: &[f64], residual: &[f64]) -> Vec<f64> {
    x.iter()
        .zip(residual)
        .map(|(a, b)| round_to(ty, a + b))
        .collect()
}

/// Which norm kernel a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    RmsNorm,
    FusedAddRmsNorm,
    LayerNorm,
    FusedAddLayerNorm,
}

impl NormKind {
    pub const ALL: [NormKind; 4] = [
        Self::RmsNorm,
        Self::FusedAddRmsNorm,
        Self::LayerNorm,
        Self::FusedAddLayerNorm,
    ];

    /// The symbol name without the dtype suffix.
    pub fn name(self) -> &'static str {
        match self {
            Self::RmsNorm => "rmsnorm",
            Self::FusedAddRmsNorm => "fused_add_rmsnorm",
            Self::LayerNorm => "layernorm",
            Self::FusedAddLayerNorm => "fused_add_layernorm",
        }
    }

    fn fused(self) -> bool {
        matches!(self, Self::FusedAddRmsNorm | Self::FusedAddLayerNorm)
    }

    fn has_bias(self) -> bool {
        matches!(self, Self::LayerNorm | Self::FusedAddLayerNorm)
    }
}

/// One shape to test. `scale` is the magnitude of the inputs: the small one makes `eps` matter,
/// so a kernel that drops or misplaces it fails. `grid` overrides the contract's block count
/// to test the kernels' grid stride over rows.
#[derive(Debug, Clone, Copy)]
struct Shape {
    rows: usize,
    cols: usize,
    scale: f64,
    grid: Option<u32>,
}

/// A shape launched on `blocks` blocks, fewer than its rows need.
const fn strided(rows: usize, cols: usize, scale: f64, blocks: u32) -> Shape {
    Shape {
        rows,
        cols,
        scale,
        grid: Some(blocks),
    }
}

const fn shape(rows: usize, cols: usize, scale: f64) -> Shape {
    Shape {
        rows,
        cols,
        scale,
        grid: None,
    }
}

/// Odd sizes take the kernels' element-by-element path; multiples of 8 their 16-byte vector
/// path, from registers up to 4096 (f32) or 8192 (16-bit) columns and re-reading the row past
/// that. Teams grow from 8 lanes to a whole block with the row; the last three shapes launch
/// fewer teams than rows (and so leave some teams idle in a block's last round).
const SHAPES: [Shape; 11] = [
    shape(1, 1, 1.0),
    shape(3, 17, 1.0),
    shape(64, 128, 1.0),
    shape(5, 128, 0.01),
    shape(7, 1000, 1.0),
    shape(3, 4099, 1.0),
    shape(16, 8192, 1.0),
    shape(2, 16384, 0.01),
    strided(100, 64, 1.0, 2),
    strided(67, 512, 1.0, 8),
    strided(9, 3000, 1.0, 4),
];

/// `(abs, rel)` tolerance of one output. The kernels work in f32 and round once to the element
/// type: one ulp of the type covers that rounding even where the f32 value sits next to a
/// rounding midpoint, and the abs term covers f16 subnormals and f32 noise in outputs near 0
/// (LayerNorm's `normed · weight + bias` can cancel).
pub fn tolerance(ty: ScalarType) -> (f64, f64) {
    match ty {
        ScalarType::Bf16 => (1e-5, epsilon(ty)),
        ScalarType::F16 => (1e-5, epsilon(ty)),
        _ => (1e-5, 1e-5),
    }
}

/// The `eps` the cases pass, as models do: 1e-5 for LayerNorm (PyTorch's default), 1e-6 for
/// RMSNorm.
pub fn eps(kind: NormKind) -> f32 {
    if kind.has_bias() { 1e-5 } else { 1e-6 }
}

/// The call of `kind` in `ty` over `rows × cols`: `out`, `residual` (the fused kinds), `x`,
/// `weight`, `bias` (LayerNorm), `eps`, `rows`, `cols`.
pub fn call(kind: NormKind, ty: ScalarType, rows: usize, cols: usize) -> Call {
    let mut args = vec![CallArg::write("out", ty)];
    if kind.fused() {
        args.push(CallArg::read_write("residual", ty));
    }
    args.extend([CallArg::read("x", ty), CallArg::read("weight", ty)]);
    if kind.has_bias() {
        args.push(CallArg::read("bias", ty));
    }
    args.extend([
        CallArg::Scalar(ScalarValue::F32(eps(kind))),
        CallArg::u32(rows),
        CallArg::u32(cols),
    ]);
    Call {
        kernel: format!("{}_{}", kind.name(), ty.name()),
        args,
    }
}

/// The case of `kind` in `ty` over `rows × cols` with inputs of magnitude 1, on the contract's
/// grid: for a benchmark's check of its own sizes.
pub fn case_at(
    kind: NormKind,
    ty: ScalarType,
    rows: usize,
    cols: usize,
    rng: &mut impl Rng,
) -> Case {
    case(kind, ty, shape(rows, cols, 1.0), rng)
}

/// Every norm symbol at every shape in [`SHAPES`], with fresh random inputs.
pub fn cases(rng: &mut impl Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for kind in NormKind::ALL {
        for ty in [ScalarType::Bf16, ScalarType::F16, ScalarType::F32] {
            for shape in SHAPES {
                cases.push(case(kind, ty, shape, rng));
            }
        }
    }
    cases
}

/// `len` values uniform in `[-scale, scale)` (plus `offset`), rounded to `ty`.
fn case(kind: NormKind, ty: ScalarType, shape: Shape, rng: &mut impl Rng) -> Case {
    let Shape {
        rows,
        cols,
        scale,
        grid,
    } = shape;
    // Rows with a mean well away from 0 check that LayerNorm centres before squaring.
    let offset = if kind.has_bias() { 3.0 * scale } else { 0.0 };
    let x = random_rounded(rng, ty, rows * cols, offset, scale);
    let weight = random_rounded(rng, ty, cols, 1.0, 0.5);
    let bias = random_rounded(rng, ty, cols, 0.0, 0.5);
    let residual = kind
        .fused()
        .then(|| random_rounded(rng, ty, rows * cols, 0.0, scale));
    // The kernels normalize the residual sum as stored, rounded to the element type.
    let normed_input = match &residual {
        Some(res) => residual_add(ty, &x, res),
        None => x.clone(),
    };
    let eps = f64::from(eps(kind));
    let want: Vec<f64> = normed_input
        .chunks(cols)
        .flat_map(|row| match kind.has_bias() {
            true => layernorm(row, &weight, &bias, eps),
            false => rmsnorm(row, &weight, eps),
        })
        .collect();
    let (abs, rel) = tolerance(ty);
    let close = |want| Expect::Close { want, abs, rel };
    let mut fills = vec![
        ("out", Fill::Output(close(want))),
        ("x", Fill::Input(x)),
        ("weight", Fill::Input(weight)),
    ];
    if let Some(data) = residual {
        fills.push(("residual", Fill::InOut(data, close(normed_input))));
    }
    if kind.has_bias() {
        fills.push(("bias", Fill::Input(bias)));
    }
    let label = format!(
        "rows={rows} cols={cols} scale={scale}{}",
        grid_label([grid, None, None])
    );
    call(kind, ty, rows, cols).case(label, [grid, None, None], fills)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::CaseArg;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn rmsnorm_divides_by_the_root_mean_square() {
        // mean(9, 16) = 12.5; with eps 0.5 the root is sqrt(13) exactly.
        let s = 13f64.sqrt();
        assert_close(&rmsnorm(&[3.0, 4.0], &[1.0, 2.0], 0.5), &[3.0 / s, 8.0 / s]);
        assert_close(&rmsnorm(&[0.0], &[1.0], 0.25), &[0.0]);
    }

    #[test]
    fn layernorm_centres_scales_and_shifts() {
        // [1, 2, 3]: mean 2, biased var 2/3.
        let r = (1.5f64).sqrt();
        assert_close(
            &layernorm(&[1.0, 2.0, 3.0], &[1.0; 3], &[0.0; 3], 0.0),
            &[-r, 0.0, r],
        );
        assert_close(
            &layernorm(&[5.0, 7.0], &[2.0, 1.0], &[0.5, -1.0], 0.0),
            &[-1.5, 0.0],
        );
        // A constant row has no variance: eps alone scales (here 1 / sqrt(0.25) = 2).
        assert_close(
            &layernorm(&[4.0, 4.0], &[1.0, 1.0], &[1.0, 1.0], 0.25),
            &[1.0, 1.0],
        );
    }

    #[test]
    fn residual_add_rounds_to_the_element_type() {
        let sum = residual_add(ScalarType::Bf16, &[1.0, 256.0], &[2f64.powi(-9), 1.0]);
        assert_eq!(sum, [1.0, 256.0], "both sums fall below half a bf16 ulp");
        assert_eq!(
            residual_add(ScalarType::F32, &[1.0], &[2f64.powi(-9)]),
            [1.0 + 2f64.powi(-9)]
        );
    }

    #[test]
    fn cases_cover_every_symbol_with_consistent_arguments() {
        let cases = cases(&mut StdRng::seed_from_u64(1));
        assert_eq!(cases.len(), 4 * 3 * SHAPES.len());
        for case in &cases {
            let want_args = match case.kernel.split('_').next_back() {
                Some("bf16" | "f16" | "f32") => {
                    let fused = usize::from(case.kernel.starts_with("fused_add"));
                    let bias = usize::from(case.kernel.contains("layernorm"));
                    6 + fused + bias
                }
                _ => panic!("{}: no dtype suffix", case.kernel),
            };
            assert_eq!(case.args.len(), want_args, "{}", case.kernel);
        }
        let elements: usize = cases
            .iter()
            .flat_map(|c| &c.args)
            .map(|a| match a {
                CaseArg::Input { data, .. } | CaseArg::InOut { data, .. } => data.len(),
                CaseArg::Output { len, .. } => *len,
                CaseArg::Scalar(_) => 0,
            })
            .sum();
        assert!(
            elements < 10_000_000,
            "{elements} elements is too many for a quick GPU run"
        );
    }

    /// The case's own reference passes its checker, and an output off by what a missing `eps`
    /// or a rounding error of the type's size would give fails it.
    #[test]
    fn cases_accept_their_reference_and_refuse_small_errors() {
        let mut rng = StdRng::seed_from_u64(2);
        for kind in NormKind::ALL {
            for ty in [ScalarType::Bf16, ScalarType::F32] {
                let case = case(kind, ty, SHAPES[3], &mut rng);
                let mut outputs: Vec<Option<Vec<f64>>> = case
                    .args
                    .iter()
                    .map(|a| match a {
                        CaseArg::Output {
                            expect: Expect::Close { want, .. },
                            ..
                        }
                        | CaseArg::InOut {
                            expect: Expect::Close { want, .. },
                            ..
                        } => Some(want.clone()),
                        _ => None,
                    })
                    .collect();
                assert!(
                    case.check(&outputs).is_ok(),
                    "{} {}",
                    case.kernel,
                    case.label
                );
                let rel = tolerance(ty).1;
                if let Some(out) = outputs[0].as_mut() {
                    out.iter_mut().for_each(|v| *v *= 1.0 + 3.0 * rel);
                }
                assert!(
                    case.check(&outputs).is_err(),
                    "{} must refuse 3 ulp",
                    case.kernel
                );
            }
        }
    }

    #[test]
    fn eps_matters_in_the_small_input_shapes() {
        // With inputs of magnitude 0.01, mean(x^2) is about 3e-5, so eps = 1e-5 moves the
        // output by far more than the f32 tolerance.
        let x = [0.01, -0.005, 0.0075];
        let with = layernorm(&x, &[1.0; 3], &[0.0; 3], 1e-5);
        let without = layernorm(&x, &[1.0; 3], &[0.0; 3], 0.0);
        assert!((with[0] - without[0]).abs() > 100.0 * tolerance(ScalarType::F32).1);
    }
}
