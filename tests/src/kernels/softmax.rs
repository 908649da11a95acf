//! Softmax over the last dimension: the f64 reference and the cases of the kernels in
//! `kernels/softmax.hip`.
//!
//! Symbols: `softmax_{bf16,f16,f32}(out, x, rows, cols)`, both tensors row-major
//! `[rows, cols]`, `out[r, i] = exp(x[r, i]) / Σ_j exp(x[r, j])`.
//!
//! Launch: the kernels' contract (`manifests/softmax.toml`).

use hk_format::abi::ScalarType;
use rand::Rng;

use crate::case::{Call, CallArg, Case, Expect, Fill, grid_label};
use crate::host::{epsilon, round_to};

/// The softmax of one row, computed after subtracting the row's maximum so that no exp
/// overflows.
pub fn softmax(x: &[f64]) -> Vec<f64> {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = x.iter().map(|v| (v - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

/// `(abs, rel)` tolerance of one output. The kernels sum up to `cols / 256` exps per thread in
/// f32 before the block reduction; with exp's own error that stays below 1e-5 relative for
/// the sizes here (rows of 100 000). One ulp covers the final rounding of bf16 and f16; the abs
/// term covers f16 subnormals (probabilities below 6e-5) and exps that flush to 0.
pub fn tolerance(ty: ScalarType) -> (f64, f64) {
    match ty {
        ScalarType::Bf16 => (1e-9, epsilon(ty)),
        ScalarType::F16 => (1e-7, epsilon(ty)),
        _ => (1e-9, 2e-5),
    }
}

/// One shape: inputs uniform in `[-range, range)`; `masked` sets every third element to −inf
/// (an attention mask), which must come out as exactly 0. `grid` overrides the contract's block
/// count, as for the norms.
#[derive(Debug, Clone, Copy)]
struct Shape {
    rows: usize,
    cols: usize,
    range: f64,
    masked: bool,
    grid: Option<u32>,
}

const fn shape(rows: usize, cols: usize, range: f64) -> Shape {
    Shape {
        rows,
        cols,
        range,
        masked: false,
        grid: None,
    }
}

/// Odd sizes take the element-by-element path; multiples of 8 the vector path, from registers
/// up to 4096 (f32) or 8192 (16-bit) columns and re-reading the row past that. Teams grow from
/// 8 lanes to a whole block with the row; the last three shapes launch fewer teams than rows.
const SHAPES: [Shape; 12] = [
    shape(1, 1, 1.0),
    shape(3, 17, 4.0),
    shape(64, 128, 8.0),
    shape(7, 1000, 8.0),
    shape(3, 4099, 8.0),
    shape(16, 8192, 8.0),
    shape(2, 65536, 8.0),
    shape(1, 100_000, 20.0),
    Shape {
        masked: true,
        ..shape(5, 2048, 8.0)
    },
    Shape {
        grid: Some(2),
        ..shape(100, 64, 8.0)
    },
    Shape {
        grid: Some(2),
        ..shape(40, 520, 8.0)
    },
    Shape {
        grid: Some(4),
        ..shape(9, 3000, 8.0)
    },
];

/// The call of `softmax` in `ty` over `rows × cols`: `out`, `x`, `rows`, `cols`.
pub fn call(ty: ScalarType, rows: usize, cols: usize) -> Call {
    Call {
        kernel: format!("softmax_{}", ty.name()),
        args: vec![
            CallArg::write("out", ty),
            CallArg::read("x", ty),
            CallArg::u32(rows),
            CallArg::u32(cols),
        ],
    }
}

/// The case of `softmax` in `ty` over `rows × cols` with inputs in ±8, none masked, on the
/// contract's grid: for a benchmark's check of its own sizes.
pub fn case_at(ty: ScalarType, rows: usize, cols: usize, rng: &mut impl Rng) -> Case {
    case(ty, shape(rows, cols, 8.0), rng)
}

/// Every softmax symbol at every shape in [`SHAPES`], with fresh random inputs.
pub fn cases(rng: &mut impl Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for ty in [ScalarType::Bf16, ScalarType::F16, ScalarType::F32] {
        for shape in SHAPES {
            cases.push(case(ty, shape, rng));
        }
    }
    cases
}

fn case(ty: ScalarType, shape: Shape, rng: &mut impl Rng) -> Case {
    let Shape {
        rows,
        cols,
        range,
        masked,
        grid,
    } = shape;
    let x: Vec<f64> = (0..rows * cols)
        .map(|i| match masked && i % 3 == 1 {
            true => f64::NEG_INFINITY,
            false => round_to(ty, range * rng.random_range(-1.0..1.0)),
        })
        .collect();
    let want: Vec<f64> = x.chunks(cols).flat_map(softmax).collect();
    let (abs, rel) = tolerance(ty);
    let label = format!(
        "rows={rows} cols={cols} range={range} masked={masked}{}",
        grid_label([grid, None, None])
    );
    call(ty, rows, cols).case(
        label,
        [grid, None, None],
        [
            ("out", Fill::Output(Expect::Close { want, abs, rel })),
            ("x", Fill::Input(x)),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::CaseArg;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn softmax_of_hand_computed_rows() {
        let got = softmax(&[0.0, 3f64.ln()]);
        assert!(
            (got[0] - 0.25).abs() < 1e-15 && (got[1] - 0.75).abs() < 1e-15,
            "{got:?}"
        );
        assert_eq!(softmax(&[5.0]), [1.0]);
        // Large inputs do not overflow: only differences matter.
        assert_eq!(softmax(&[1000.0, 1000.0]), [0.5, 0.5]);
        // A masked element gets exactly 0.
        assert_eq!(softmax(&[f64::NEG_INFINITY, 2.0]), [0.0, 1.0]);
    }

    #[test]
    fn rows_sum_to_one() {
        let mut rng = StdRng::seed_from_u64(5);
        let x: Vec<f64> = (0..1000).map(|_| rng.random_range(-30.0..30.0)).collect();
        let sum: f64 = softmax(&x).iter().sum();
        assert!((sum - 1.0).abs() < 1e-12, "{sum}");
    }

    #[test]
    fn cases_accept_their_reference_and_refuse_a_few_ulp() {
        let cases = cases(&mut StdRng::seed_from_u64(6));
        assert_eq!(cases.len(), 3 * SHAPES.len());
        for case in &cases {
            let Some(CaseArg::Output {
                expect: crate::case::Expect::Close { want, rel, .. },
                ..
            }) = case.args.first()
            else {
                panic!("{}: out comes first", case.kernel);
            };
            assert!(
                case.check(&[Some(want.clone()), None, None, None]).is_ok(),
                "{}",
                case.label
            );
            let off = want.iter().map(|w| w * (1.0 + 3.0 * rel)).collect();
            assert!(
                case.check(&[Some(off), None, None, None]).is_err(),
                "{}",
                case.label
            );
        }
    }
}
