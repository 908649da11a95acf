//! Activations, elementwise and gated: the f64 reference and the cases of the kernels in
//! `kernels/activation.hip` and `kernels/gated_activation.hip`.
//!
//! Symbols (`T` in bf16, f16, f32):
//! - `{silu,gelu,gelu_tanh,relu,tanh}_T(out, x, n: u64)`: `out[i] = act(x[i])`.
//! - `{silu,gelu}_and_mul_T(out, x, rows, cols)`: `x` is `[rows, 2 · cols]`, the activated half
//!   first and the gate second (as vLLM's `silu_and_mul`), `out[r, i] = act(x[r, i]) ·
//!   x[r, cols + i]`.
//!
//! Launch: the kernels' contracts (`manifests/activation.toml`, `manifests/gated_activation.toml`).

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI, PI};

use hk_format::abi::{ScalarType, ScalarValue};
use rand::Rng;

use crate::case::{Call, CallArg, Case, CaseArg, Expect, Fill, grid_label};
use crate::host::{epsilon, random_rounded};

/// The error function, to about 1e-15 relative (a reference for the kernels' f32 polynomial,
/// which Rust's std does not provide).
pub fn erf(x: f64) -> f64 {
    if x.abs() >= 3.0 {
        return (1.0 - erfc_tail(x.abs())).copysign(x);
    }
    // erf(x) = 2/sqrt(pi) · e^(-x²) · Σ x (2x²)^n / (1·3·…·(2n+1)): every term is positive,
    // so nothing cancels.
    let mut term = x;
    let mut sum = x;
    for n in 1..200 {
        term *= 2.0 * x * x / (2 * n + 1) as f64;
        sum += term;
        if term.abs() < 1e-17 * sum.abs() {
            break;
        }
    }
    FRAC_2_SQRT_PI * (-x * x).exp() * sum
}

/// The complementary error function `1 − erf(x)`, accurate also where it is tiny (x ≫ 1).
pub fn erfc(x: f64) -> f64 {
    if x >= 3.0 {
        erfc_tail(x)
    } else if x <= -3.0 {
        2.0 - erfc_tail(-x)
    } else {
        1.0 - erf(x)
    }
}

/// erfc(x) for x ≥ 3 by its continued fraction `e^(-x²) / sqrt(pi) / (x + (1/2) / (x + 1 / (x
/// + (3/2) / (x + …))))`, evaluated from a depth where it has long converged.
fn erfc_tail(x: f64) -> f64 {
    let mut f = x;
    for k in (1..=120).rev() {
        f = x + (k as f64 / 2.0) / f;
    }
    (-x * x).exp() / (PI.sqrt() * f)
}

/// An elementwise activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x · sigmoid(x)`.
    Silu,
    /// `x · Φ(x) = x/2 · erfc(−x/√2)`, the exact (erf) form.
    Gelu,
    /// `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`, the tanh approximation.
    GeluTanh,
    /// `max(x, 0)`.
    Relu,
    Tanh,
}

impl Activation {
    pub const ALL: [Activation; 5] = [
        Self::Silu,
        Self::Gelu,
        Self::GeluTanh,
        Self::Relu,
        Self::Tanh,
    ];
    /// The activations with a gated (`*_and_mul`) kernel.
    pub const GATED: [Activation; 2] = [Self::Silu, Self::Gelu];

    /// The symbol name without the dtype suffix (the gated kernels add `_and_mul`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Silu => "silu",
            Self::Gelu => "gelu",
            Self::GeluTanh => "gelu_tanh",
            Self::Relu => "relu",
            Self::Tanh => "tanh",
        }
    }

    /// The activation of `x`.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Self::Silu => x / (1.0 + (-x).exp()),
            Self::Gelu => 0.5 * x * erfc(-x * FRAC_1_SQRT_2),
            Self::GeluTanh => {
                // (1 + tanh(u)) / 2 = sigmoid(2u) exactly; this form keeps its digits for
                // x ≪ 0, where 1 + tanh(u) cancels to nothing.
                let u = (2.0 / PI).sqrt() * (x + 0.044715 * x * x * x);
                x / (1.0 + (-2.0 * u).exp())
            }
            Self::Relu => x.max(0.0),
            Self::Tanh => x.tanh(),
        }
    }
}

/// One row of a gated activation: `row` holds `[x, gate]`, `2 · cols` values; the result is
/// `act(x[i]) · gate[i]`, `cols` values.
pub fn act_and_mul(act: Activation, row: &[f64]) -> Vec<f64> {
    let (x, gate) = row.split_at(row.len() / 2);
    x.iter()
        .zip(gate)
        .map(|(&a, &g)| act.apply(a) * g)
        .collect()
}

/// `(abs, rel)` tolerance of one output. The kernels work in f32 (exp, rcp and the erf/tanh
/// polynomials good to a few 1e-7) and round once: one ulp of the type covers that rounding
/// next to a midpoint; the abs term covers outputs near 0, where f32 arguments of exp (such as
/// GELU-tanh's cubic at x = −8) carry more relative error than the output is worth.
pub fn tolerance(ty: ScalarType) -> (f64, f64) {
    match ty {
        ScalarType::Bf16 => (1e-6, epsilon(ty)),
        ScalarType::F16 => (1e-6, epsilon(ty)),
        _ => (1e-6, 1e-5),
    }
}

/// One elementwise size: `n` elements in `[-range, range)`; `grid` overrides the contract's
/// block count to test the grid stride.
#[derive(Debug, Clone, Copy)]
struct Elementwise {
    n: usize,
    range: f64,
    grid: Option<u32>,
}

const fn elementwise(n: usize, range: f64) -> Elementwise {
    Elementwise {
        n,
        range,
        grid: None,
    }
}

/// Sizes that are not multiples of 8 end element by element after the 16-byte vectors.
const ELEMENTWISE: [Elementwise; 7] = [
    elementwise(1, 4.0),
    elementwise(17, 4.0),
    elementwise(1000, 8.0),
    elementwise(4099, 8.0),
    elementwise(65536, 30.0),
    elementwise(262_147, 8.0),
    Elementwise {
        n: 100_003,
        range: 8.0,
        grid: Some(3),
    },
];

/// One gated size (`rows × cols` outputs); `grid` as in [`Elementwise`].
#[derive(Debug, Clone, Copy)]
struct Gated {
    rows: usize,
    cols: usize,
    grid: Option<u32>,
}

const fn gated(rows: usize, cols: usize) -> Gated {
    Gated {
        rows,
        cols,
        grid: None,
    }
}

/// Odd `cols` take the element-by-element path (a 16-byte pack would straddle rows).
const GATED: [Gated; 7] = [
    gated(1, 1),
    gated(3, 17),
    gated(64, 128),
    gated(7, 1000),
    gated(3, 4099),
    gated(16, 8192),
    Gated {
        rows: 37,
        cols: 1024,
        grid: Some(2),
    },
];

/// Every activation symbol, elementwise and gated, at every size, with fresh random inputs.
pub fn cases(rng: &mut impl Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for ty in [ScalarType::Bf16, ScalarType::F16, ScalarType::F32] {
        for act in Activation::ALL {
            for size in ELEMENTWISE {
                cases.push(elementwise_case(act, ty, size, rng));
            }
        }
        for act in Activation::GATED {
            for size in GATED {
                cases.push(gated_case(act, ty, size, rng));
            }
        }
    }
    cases
}

/// ReLU is exact in every type; the others are within [`tolerance`].
fn expect(act: Activation, ty: ScalarType, want: Vec<f64>) -> Expect {
    if act == Activation::Relu {
        return Expect::Exact(want);
    }
    let (abs, rel) = tolerance(ty);
    Expect::Close { want, abs, rel }
}

fn elementwise_case(
    act: Activation,
    ty: ScalarType,
    size: Elementwise,
    rng: &mut impl Rng,
) -> Case {
    let Elementwise { n, range, grid } = size;
    let x = random_rounded(rng, ty, n, 0.0, range);
    let want = x.iter().map(|&v| act.apply(v)).collect();

    Case {
        kernel: format!("{}_{}", act.name(), ty.name()),
        label: format!("n={n} range={range}{}", grid_label([grid, None, None])),
        args: vec![
            CaseArg::Output {
                name: "out",
                elem: ty,
                len: n,
                expect: expect(act, ty, want),
            },
            CaseArg::input("x", ty, x),
            CaseArg::Scalar(ScalarValue::U64(n as u64)),
        ],
        grid: [grid, None, None],
    }
}

/// The call of `{act}_and_mul` in `ty` with `rows × cols` outputs (`x` is `[rows, 2 · cols]`):
/// `out`, `x`, `rows`, `cols`.
pub fn gated_call(act: Activation, ty: ScalarType, rows: usize, cols: usize) -> Call {
    Call {
        kernel: format!("{}_and_mul_{}", act.name(), ty.name()),
        args: vec![
            CallArg::write("out", ty),
            CallArg::read("x", ty),
            CallArg::u32(rows),
            CallArg::u32(cols),
        ],
    }
}

/// The case of `{act}_and_mul` in `ty` with `rows × cols` outputs, on the contract's grid: for a
/// benchmark's check of its own sizes.
pub fn gated_case_at(
    act: Activation,
    ty: ScalarType,
    rows: usize,
    cols: usize,
    rng: &mut impl Rng,
) -> Case {
    gated_case(act, ty, gated(rows, cols), rng)
}

fn gated_case(act: Activation, ty: ScalarType, size: Gated, rng: &mut impl Rng) -> Case {
    let Gated { rows, cols, grid } = size;
    let x = random_rounded(rng, ty, rows * 2 * cols, 0.0, 6.0);
    let want: Vec<f64> = x
        .chunks(2 * cols)
        .flat_map(|row| act_and_mul(act, row))
        .collect();
    gated_call(act, ty, rows, cols).case(
        format!("rows={rows} cols={cols}{}", grid_label([grid, None, None])),
        [grid, None, None],
        [
            ("out", Fill::Output(expect(act, ty, want))),
            ("x", Fill::Input(x)),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn assert_rel(got: f64, want: f64, rel: f64) {
        assert!(
            (got - want).abs() <= rel * want.abs(),
            "got {got:e}, want {want:e}"
        );
    }

    #[test]
    fn erf_and_erfc_match_tabulated_values() {
        // Values from tables of the error function (Abramowitz & Stegun 7.1, extended).
        assert_eq!(erf(0.0), 0.0);
        assert_rel(erf(0.5), 0.520_499_877_813_046_5, 1e-15);
        assert_rel(erf(1.0), 0.842_700_792_949_714_9, 1e-15);
        assert_rel(erf(-2.0), -0.995_322_265_018_952_7, 1e-15);
        assert_rel(erf(3.5), 0.999_999_256_901_627_6, 1e-15);
        assert_rel(erfc(0.1), 0.887_537_083_981_715_2, 1e-14);
        assert_rel(erfc(-1.0), 1.842_700_792_949_715, 1e-15);
        assert_rel(erfc(3.0), 2.209_049_699_858_544e-5, 1e-13);
        assert_rel(erfc(5.0), 1.537_459_794_428_035e-12, 1e-13);
        assert_rel(erfc(10.0), 2.088_487_583_762_545e-45, 1e-13);
    }

    #[test]
    fn activations_at_hand_computed_points() {
        assert_rel(Activation::Silu.apply(1.0), 0.731_058_578_630_004_9, 1e-15);
        assert_rel(Activation::Silu.apply(-2.0), -0.238_405_844_044_234, 1e-14);
        // GELU(1) = Φ(1); GELU(−3) = −3 Φ(−3).
        assert_rel(Activation::Gelu.apply(1.0), 0.841_344_746_068_542_9, 1e-15);
        assert_rel(
            Activation::Gelu.apply(-3.0),
            -3.0 * 1.349_898_031_630_094_6e-3,
            1e-13,
        );
        assert_rel(
            Activation::GeluTanh.apply(1.0),
            0.841_191_990_608_276_8,
            1e-14,
        );
        assert_eq!(Activation::Relu.apply(-0.5), 0.0);
        assert_eq!(Activation::Relu.apply(2.5), 2.5);
        assert_rel(Activation::Tanh.apply(0.5), 0.462_117_157_260_009_8, 1e-15);
    }

    #[test]
    fn gelu_tanh_keeps_its_digits_far_below_zero() {
        // 1 + tanh(u) is exactly 0 in f64 at x = −8; the sigmoid form is not.
        let x = -8.0;
        let u = (2.0 / PI).sqrt() * (x + 0.044715 * x * x * x);
        assert_eq!(0.5 * x * (1.0 + f64::tanh(u)), 0.0);
        let got = Activation::GeluTanh.apply(x);
        assert!(got < 0.0 && got > -1e-19, "{got:e}");
    }

    #[test]
    fn gating_activates_the_first_half() {
        let row = [1.0, -2.0, 3.0, 0.5];
        let want = [
            Activation::Silu.apply(1.0) * 3.0,
            Activation::Silu.apply(-2.0) * 0.5,
        ];
        assert_eq!(act_and_mul(Activation::Silu, &row), want);
    }

    #[test]
    fn cases_cover_every_symbol_and_accept_their_reference() {
        let cases = cases(&mut StdRng::seed_from_u64(3));
        let mut kernels: Vec<&str> = cases.iter().map(|c| c.kernel.as_str()).collect();
        kernels.sort_unstable();
        kernels.dedup();
        assert_eq!(kernels.len(), 3 * (5 + 2));
        for case in &cases {
            let outputs: Vec<Option<Vec<f64>>> = case
                .args
                .iter()
                .map(|a| match a {
                    CaseArg::Output {
                        expect: Expect::Close { want, .. } | Expect::Exact(want),
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
        }
    }

    #[test]
    fn a_case_refuses_an_output_off_by_a_few_ulp() {
        let mut rng = StdRng::seed_from_u64(4);
        for ty in [ScalarType::Bf16, ScalarType::F16, ScalarType::F32] {
            let case = elementwise_case(Activation::Gelu, ty, ELEMENTWISE[2], &mut rng);
            let Some(CaseArg::Output {
                expect: Expect::Close { want, rel, .. },
                ..
            }) = case.args.first()
            else {
                panic!("out comes first");
            };
            let off = want.iter().map(|w| w * (1.0 + 3.0 * rel)).collect();
            assert!(case.check(&[Some(off), None, None]).is_err(), "{ty}");
        }
    }
}
