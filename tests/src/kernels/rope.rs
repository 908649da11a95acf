//! Rotary position embedding (RoPE): the f64 reference and the cases of the `rope_*` kernels
//! in `kernels/rope.hip`.
//!
//! One symbol per pairing style, layout and dtype: `rope_{neox,gptj}_{bhsd,thd}_{bf16,f16,f32}`.
//! Each head vector of `dim` elements has its first `rot_dim` elements rotated pairwise by the
//! angles of its position (cos/sin tables of shape `[positions, rot_dim / 2]`, always f32);
//! the remaining `dim - rot_dim` elements are copied. The kernels write `out` and read `x`.

use hk_format::abi::ScalarType;
use rand::Rng;

use crate::case::{Call, CallArg, Case, Expect, Fill};
use crate::host::{epsilon, random_rounded, round_to};

/// The frequency base of the cases' tables, as in most models.
pub const BASE: f64 = 10_000.0;

/// Which elements of a head vector form a rotated pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// GPT-NeoX "rotate half": element `i` pairs with element `i + rot_dim / 2`.
    NeoX,
    /// GPT-J interleaved: element `2i` pairs with element `2i + 1`.
    GptJ,
}

/// How the input is laid out, and so where a head vector's position comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// `[batch, heads, seq, dim]`; the position of a vector is its sequence index.
    Bhsd,
    /// `[tokens, heads, dim]` with an `i32` position per token.
    Thd,
}

impl RopeStyle {
    pub fn name(self) -> &'static str {
        match self {
            Self::NeoX => "neox",
            Self::GptJ => "gptj",
        }
    }
}

impl RopeLayout {
    pub fn name(self) -> &'static str {
        match self {
            Self::Bhsd => "bhsd",
            Self::Thd => "thd",
        }
    }
}

/// Rotates one head vector `x`: pair `i` (as `style` pairs elements) is turned by the angle
/// whose cosine and sine are `cos[i]` and `sin[i]`, `(a, b) -> (a·cos − b·sin, b·cos + a·sin)`.
/// The number of pairs is `cos.len()` (clipped to what `sin` and `x` hold); elements after
/// the rotated `2 · pairs` are copied unchanged.
pub fn rope(style: RopeStyle, x: &[f64], cos: &[f64], sin: &[f64]) -> Vec<f64> {
    let pairs = cos.len().min(sin.len()).min(x.len() / 2);
    let mut out = x.to_vec();
    for (i, (&c, &s)) in cos.iter().zip(sin).take(pairs).enumerate() {
        let (ia, ib) = match style {
            RopeStyle::NeoX => (i, i + pairs),
            RopeStyle::GptJ => (2 * i, 2 * i + 1),
        };
        let (a, b) = (x[ia], x[ib]);
        out[ia] = a * c - b * s;
        out[ib] = b * c + a * s;
    }
    out
}

/// The usual RoPE tables for `positions` positions: `cos[p][i] = cos(p · base^(−2i/rot_dim))`
/// (and likewise `sin`), row-major `[positions, rot_dim / 2]`, rounded to f32 as the kernels
/// take them.
pub fn rope_tables(positions: usize, rot_dim: usize, base: f64) -> (Vec<f64>, Vec<f64>) {
    let pairs = rot_dim / 2;
    let angles = (0..positions).flat_map(|p| {
        (0..pairs).map(move |i| p as f64 * base.powf(-2.0 * i as f64 / rot_dim as f64))
    });
    angles
        .map(|a| {
            (
                round_to(ScalarType::F32, a.cos()),
                round_to(ScalarType::F32, a.sin()),
            )
        })
        .unzip()
}

/// One tensor shape: `batch · heads · seq` head vectors of `dim` elements, the first `rot_dim`
/// of each rotated (for the `thd` layout `batch` is unused and `seq` counts the tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub seq: usize,
    pub dim: usize,
    pub rot_dim: usize,
}

impl Shape {
    pub const fn new(batch: usize, heads: usize, seq: usize, dim: usize, rot_dim: usize) -> Self {
        Self {
            batch,
            heads,
            seq,
            dim,
            rot_dim,
        }
    }
}

/// Odd and even sizes, rotation of part of a vector or none of it, and vectors that take the
/// 16-byte path in every dtype (dim 64, 96, 128) or in none (dim 17, 4099).
const SHAPES: [Shape; 8] = [
    Shape::new(1, 1, 1, 2, 2),
    Shape::new(2, 3, 5, 17, 16),
    Shape::new(1, 2, 7, 64, 64),
    Shape::new(2, 4, 33, 128, 128),
    Shape::new(1, 3, 9, 96, 32),
    Shape::new(1, 1, 3, 4099, 4098),
    Shape::new(2, 8, 64, 128, 64),
    Shape::new(1, 2, 3, 5, 0),
];

/// `(abs, rel)` tolerance for one output element: the kernel computes in f32 and rounds once
/// to the element type, so the error is half an ulp of the output plus f32 noise that can
/// show where the two products nearly cancel (inputs are below 2 in magnitude).
fn tolerance(ty: ScalarType) -> (f64, f64) {
    match ty {
        ScalarType::Bf16 => (1e-5, epsilon(ty) / 2.0),
        ScalarType::F16 => (1e-5, epsilon(ty)),
        _ => (2e-6, 2e-6),
    }
}

/// Rows of the cos/sin tables a case of `layout` takes for `seq` positions: one a position for
/// `bhsd`; for `thd`, where each token's position is drawn, a few more than the tokens.
fn table_rows(layout: RopeLayout, seq: usize) -> usize {
    match layout {
        RopeLayout::Bhsd => seq,
        RopeLayout::Thd => seq + 7,
    }
}

/// The call of `rope_{style}_{layout}` in `ty` over `shape`: `out`, `x`, `cos`, `sin` (f32),
/// then `batch`, `heads`, `seq` (`bhsd`) or `positions` (`i32`), `table_rows`, `tokens`, `heads`
/// (`thd`), then `dim`, `rot_dim`.
pub fn call(style: RopeStyle, layout: RopeLayout, ty: ScalarType, shape: Shape) -> Call {
    let Shape {
        batch,
        heads,
        seq,
        dim,
        rot_dim,
    } = shape;
    let mut args = vec![
        CallArg::write("out", ty),
        CallArg::read("x", ty),
        CallArg::read("cos", ScalarType::F32),
        CallArg::read("sin", ScalarType::F32),
    ];
    match layout {
        RopeLayout::Bhsd => {
            args.extend([CallArg::u32(batch), CallArg::u32(heads), CallArg::u32(seq)]);
        }
        RopeLayout::Thd => args.extend([
            CallArg::read("positions", ScalarType::I32),
            CallArg::u32(table_rows(layout, seq)),
            CallArg::u32(seq),
            CallArg::u32(heads),
        ]),
    }
    args.extend([CallArg::u32(dim), CallArg::u32(rot_dim)]);
    Call {
        kernel: format!("rope_{}_{}_{}", style.name(), layout.name(), ty.name()),
        args,
    }
}

/// Every `rope_*` symbol at every shape in [`SHAPES`], with fresh random inputs.
pub fn cases(rng: &mut impl Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for style in [RopeStyle::NeoX, RopeStyle::GptJ] {
        for layout in [RopeLayout::Bhsd, RopeLayout::Thd] {
            for ty in [ScalarType::Bf16, ScalarType::F16, ScalarType::F32] {
                for shape in SHAPES {
                    cases.push(case(style, layout, ty, shape, rng));
                }
            }
        }
    }
    cases
}

/// The case of `rope_{style}_{layout}` in `ty` over `shape`, with fresh random inputs in ±2 and
/// the usual tables (of [`BASE`]).
pub fn case(
    style: RopeStyle,
    layout: RopeLayout,
    ty: ScalarType,
    shape: Shape,
    rng: &mut impl Rng,
) -> Case {
    let Shape {
        batch,
        heads,
        seq,
        dim,
        rot_dim,
    } = shape;
    let pairs = rot_dim / 2;
    // Per head vector, the position it is rotated by; for `thd` drawn at random (repeats and
    // jumps included) from a table a little longer than the token count.
    let table_rows = table_rows(layout, seq);
    let (vectors, token_positions) = match layout {
        RopeLayout::Bhsd => (batch * heads * seq, Vec::new()),
        RopeLayout::Thd => (
            heads * seq,
            (0..seq).map(|_| rng.random_range(0..table_rows)).collect(),
        ),
    };
    let position_of = |v: usize| match layout {
        RopeLayout::Bhsd => v % seq,
        RopeLayout::Thd => token_positions[v / heads],
    };
    let x = random_rounded(rng, ty, vectors * dim, 0.0, 2.0);
    let (cos, sin) = rope_tables(table_rows, rot_dim, BASE);
    let want: Vec<f64> = x
        .chunks(dim)
        .enumerate()
        .flat_map(|(v, head)| {
            let row = position_of(v) * pairs..(position_of(v) + 1) * pairs;
            rope(style, head, &cos[row.clone()], &sin[row])
        })
        .collect();
    let (abs, rel) = tolerance(ty);
    let mut fills = vec![
        ("out", Fill::Output(Expect::Close { want, abs, rel })),
        ("x", Fill::Input(x)),
        ("cos", Fill::Input(cos)),
        ("sin", Fill::Input(sin)),
    ];
    let label = match layout {
        RopeLayout::Bhsd => {
            format!("batch={batch} heads={heads} seq={seq} dim={dim} rot_dim={rot_dim}")
        }
        RopeLayout::Thd => {
            let positions = token_positions.iter().map(|&p| p as f64).collect();
            fills.push(("positions", Fill::Input(positions)));
            format!("tokens={seq} heads={heads} dim={dim} rot_dim={rot_dim}")
        }
    };
    call(style, layout, ty, shape).case(label, [None; 3], fills)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::CaseArg;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn neox_pairs_halves_and_gptj_pairs_neighbours() {
        let x = [1.0, 2.0, 3.0, 4.0];
        // A quarter turn on the first pair, none on the second.
        let (cos, sin) = ([0.0, 1.0], [1.0, 0.0]);
        assert_eq!(rope(RopeStyle::NeoX, &x, &cos, &sin), [-3.0, 2.0, 1.0, 4.0]);
        assert_eq!(rope(RopeStyle::GptJ, &x, &cos, &sin), [-2.0, 1.0, 3.0, 4.0]);
    }

    #[test]
    fn rotation_by_an_angle_and_tail_copy() {
        // 60 degrees on (a, b) = (2, 1); the fifth element is past rot_dim and copied.
        let (c, s) = (0.5, 3f64.sqrt() / 2.0);
        let got = rope(
            RopeStyle::NeoX,
            &[2.0, 0.0, 1.0, 0.0, 7.0],
            &[c, 1.0],
            &[s, 0.0],
        );
        let want = [2.0 * c - s, 0.0, c + 2.0 * s, 0.0, 7.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-15, "{got:?}");
        }
        assert_eq!(
            rope(RopeStyle::GptJ, &[1.0, 2.0, 3.0], &[], &[]),
            [1.0, 2.0, 3.0]
        );
    }

    #[test]
    fn tables_hold_unit_vectors_of_growing_angle() {
        let (cos, sin) = rope_tables(3, 4, 10_000.0);
        assert_eq!(cos.len(), 6);
        assert_eq!(
            (cos[0], sin[0], cos[1], sin[1]),
            (1.0, 0.0, 1.0, 0.0),
            "position 0"
        );
        assert_eq!(
            sin[2],
            round_to(ScalarType::F32, 1f64.sin()),
            "position 1, pair 0"
        );
        assert_eq!(
            sin[3],
            round_to(ScalarType::F32, 0.01f64.sin()),
            "position 1, pair 1"
        );
        for (c, s) in cos.iter().zip(&sin) {
            assert!((c * c + s * s - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn cases_cover_every_symbol_with_consistent_shapes() {
        let cases = cases(&mut StdRng::seed_from_u64(1));
        let mut kernels: Vec<_> = cases.iter().map(|c| c.kernel.as_str()).collect();
        kernels.dedup();
        assert_eq!(kernels.len(), 12);
        for case in &cases {
            let (Some(CaseArg::Output { len, .. }), Some(CaseArg::Input { data, .. })) =
                (case.args.first(), case.args.get(1))
            else {
                panic!("{}: out and x come first", case.kernel);
            };
            assert_eq!(*len, data.len(), "{} {}", case.kernel, case.label);
            // Both layouts take out, x, cos, sin, then bhsd batch, heads, seq and thd
            // positions, table_rows, tokens, heads, then dim, rot_dim.
            let want = if case.kernel.contains("_thd_") { 10 } else { 9 };
            assert_eq!(case.args.len(), want, "{}", case.kernel);
        }
    }

    #[test]
    fn a_case_accepts_its_reference_and_refuses_an_f32_error() {
        let case = case(
            RopeStyle::GptJ,
            RopeLayout::Thd,
            ScalarType::F32,
            SHAPES[1],
            &mut StdRng::seed_from_u64(2),
        );
        let want = match &case.args[0] {
            CaseArg::Output {
                expect: crate::case::Expect::Close { want, .. },
                ..
            } => want.clone(),
            _ => unreachable!(),
        };
        let mut outputs = vec![None; case.args.len()];
        outputs[0] = Some(want.clone());
        assert!(case.check(&outputs).is_ok());
        outputs[0] = Some(want.iter().map(|w| w + 1e-3).collect());
        assert!(
            case.check(&outputs).is_err(),
            "an f32 output off by 1e-3 must fail"
        );
    }
}
