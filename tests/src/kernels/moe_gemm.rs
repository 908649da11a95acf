//! Grouped (MoE) GEMMs: a host form of the routing's sorted layout, the f64 references and the
//! cases of the kernels in `kernels/moe_gemm.hip`.
//!
//! - `moe_gemm_gated_silu_{bf16,f16}(h, x, w13, sorted_token_ids, expert_ids,
//!   num_tokens_post_pad, tokens, topk, experts, n, k, lda, ldc)`: `h[f] = silu(x[t]·W_gate[e]ᵀ)
//!   ⊙ (x[t]·W_up[e]ᵀ)` for every choice `f = t·topk + j` of a local expert `e`;
//! - `moe_gemm_down_{bf16,f16}(out, h, w2, topk_weights, sorted_token_ids, expert_ids,
//!   num_tokens_post_pad, tokens, topk, experts, n, k, lda, ldc)`: `out[f] = topk_weights[f] ·
//!   (h[f]·W_down[e]ᵀ)`;
//! - `moe_sum_{bf16,f16}(y, out, topk_ids, expert_map, tokens, topk, experts, n, ldo, ldy)`:
//!   `y[t] = Σ_j out[t·topk + j]` over the choices whose expert is local;
//! - `moe_gemm_{gated_silu,down}_m16_{bf16,f16}`: the two GEMMs' decode form ([`Form::M16`]),
//!   same arguments, over the layout of block_m = 16.
//!
//! The layout is made here as `moe_align_block_size` makes it ([`align`], block_m = the form's
//! [`Form::block_m`]): each local expert's choices in ascending flat index, padded to a multiple
//! of the block with the sentinel `tokens·topk`. Every shape runs in both forms. Routings cover token counts 1, 3, 64, 1000 and
//! 4096, 8 to 64 experts, top-2 to top-8, experts that receive no token, every token on one
//! expert, and expert parallelism (half the experts local: the other choices are dropped).
//!
//! Error bounds, per element, with `u` the output's rounding (2⁻⁸ bf16, 2⁻¹¹ f16) and `e` the
//! f32 accumulation's bound of [`super::gemm`] for that element's sum, `K · 2⁻²² ·
//! sqrt(Σ_k a_k² b_k²)`: stage 1 `u·|ref| + 1.2·e_gate·|up| + e_up·|silu(gate)|` (silu's slope is
//! at most 1.1), stage 2 `u·|ref| + |w|·e + 2⁻²⁴·|ref|` (the weight's f32 multiply), the combine
//! `u·|ref| + topk · 2⁻²⁴ · Σ_j |out_j|`; each plus half the output type's subnormal spacing.
//!
//! What must stay untouched: outputs start poisoned and rows of choices that no local expert
//! takes (expert parallelism) must keep the poison (a NaN reference), as must the gaps of
//! strided rows. Inputs the kernels must not read hold NaN: the gaps between strided rows, and
//! for stage 2 and the combine the rows of dropped choices, so that a wrongly gathered row
//! poisons a result.

use hk_format::abi::ScalarType;
use rand::Rng;
use rand::seq::index::sample;

use crate::case::{Call, CallArg, Case, Expect, Fill, Planned};
use crate::host::random_rounded;
use crate::kernels::activation::Activation;
use crate::kernels::moe_align;

/// The grouped GEMMs' two forms, each over the layout of its block of rows (`block_m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Blocks of 128 sorted rows (`moe_gemm_gated_silu_bf16`, ...).
    M128,
    /// Blocks of 16, for decode (`moe_gemm_gated_silu_m16_bf16`, ...).
    M16,
}

impl Form {
    pub const ALL: [Form; 2] = [Form::M128, Form::M16];

    /// The sorted layout's block of rows that the form's kernels want.
    pub fn block_m(self) -> usize {
        match self {
            Form::M128 => 128,
            Form::M16 => 16,
        }
    }

    /// What the form adds to a kernel's name, before its type.
    fn suffix(self) -> &'static str {
        match self {
            Form::M128 => "",
            Form::M16 => "_m16",
        }
    }
}

/// The routing's sorted layout for the GEMMs, as `moe_align_block_size` writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortedLayout {
    /// `[choices + local_experts · (block_m − 1)]`: flat choice indices grouped by local
    /// expert, each group padded to a multiple of `block_m` with the sentinel `choices`; the
    /// rest is sentinel too.
    pub sorted_token_ids: Vec<i32>,
    /// The local expert of each block of `block_m` sorted rows, -1 past the padded count.
    pub expert_ids: Vec<i32>,
    /// The padded count.
    pub num_tokens_post_pad: i32,
}

/// The sorted layout of `topk_ids` (the routing's experts, flat: choice `f` goes to expert
/// `topk_ids[f]`), whose expert `g` is local expert `expert_map[g]` (or dropped when -1), for
/// `local_experts` local experts and blocks of `block_m` rows: the alignment's reference
/// ([`moe_align::align`]) over the whole extents the GEMMs' contracts give, the rows past the
/// padded count sentinel and the blocks past it -1.
pub fn align(
    topk_ids: &[usize],
    expert_map: &[i32],
    local_experts: usize,
    block_m: usize,
) -> SortedLayout {
    let ids: Vec<i64> = topk_ids.iter().map(|&g| g as i64).collect();
    let map: Vec<i64> = expert_map.iter().map(|&l| l.into()).collect();
    let aligned = moe_align::align(&ids, &map, local_experts, block_m);
    let padded = aligned.num_tokens_post_pad();
    let max_sorted = moe_align::max_sorted(topk_ids.len(), local_experts, block_m);
    let mut sorted_token_ids = aligned.sorted_token_ids;
    sorted_token_ids.resize(max_sorted, topk_ids.len() as i32);
    let mut expert_ids = aligned.expert_ids;
    expert_ids.resize(max_sorted.div_ceil(block_m), -1);
    SortedLayout {
        sorted_token_ids,
        expert_ids,
        num_tokens_post_pad: padded as i32,
    }
}

/// Which experts the tokens choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// `topk` distinct experts a token, uniformly.
    Uniform,
    /// Expert 0 in every token's choices (the other `topk − 1` uniform among the rest).
    OneExpert,
    /// Only the first `topk + 2` experts are ever chosen: the others receive no token.
    Few,
}

/// A problem: `tokens` tokens routed to `topk` of `experts` experts, of which the local ones
/// are all (`local_every = 1`) or every second one (2: expert parallelism), `n` x `k` per
/// product, rows of the GEMMs' inputs `pad_a` and outputs `pad_c` elements past their width.
#[derive(Debug, Clone, Copy)]
pub struct MoeShape {
    pub tokens: usize,
    pub experts: usize,
    pub topk: usize,
    pub n: usize,
    pub k: usize,
    pub pad_a: usize,
    pub pad_c: usize,
    pub local_every: usize,
    pub routing: Routing,
}

/// The routing of a shape: the flat expert ids, the expert map and the local experts.
pub struct Routed {
    pub topk_ids: Vec<usize>,
    pub expert_map: Vec<i32>,
    pub local_experts: usize,
}

impl Routed {
    /// The local expert of choice `f`, if any.
    pub fn local(&self, f: usize) -> Option<usize> {
        usize::try_from(self.expert_map[self.topk_ids[f]]).ok()
    }
}

/// Draws a routing for `shape`.
pub fn route(shape: &MoeShape, rng: &mut impl Rng) -> Routed {
    let MoeShape {
        tokens,
        experts,
        topk,
        local_every,
        routing,
        ..
    } = *shape;
    let mut topk_ids = Vec::with_capacity(tokens * topk);
    for _ in 0..tokens {
        match routing {
            Routing::Uniform => topk_ids.extend(sample(rng, experts, topk)),
            Routing::Few => topk_ids.extend(sample(rng, (topk + 2).min(experts), topk)),
            Routing::OneExpert => {
                topk_ids.push(0);
                topk_ids.extend(
                    sample(rng, experts - 1, topk - 1)
                        .into_iter()
                        .map(|e| e + 1),
                );
            }
        }
    }
    let mut expert_map = vec![-1; experts];
    let mut local_experts = 0;
    for (g, slot) in expert_map.iter_mut().enumerate() {
        if g % local_every == local_every - 1 {
            *slot = local_experts as i32;
            local_experts += 1;
        }
    }
    Routed {
        topk_ids,
        expert_map,
        local_experts,
    }
}

/// `rows` rows of `cols` values rounded to `ty`, `ld` apart, NaN in the gaps (the contract's
/// extent, `(rows − 1)·ld + cols`); rows for which `keep` is false are NaN too.
fn rows_input(
    rng: &mut impl Rng,
    ty: ScalarType,
    (rows, cols, ld): (usize, usize, usize),
    keep: impl Fn(usize) -> bool,
) -> Vec<f64> {
    let mut data = vec![f64::NAN; (rows - 1) * ld + cols];
    for r in (0..rows).filter(|&r| keep(r)) {
        data[r * ld..r * ld + cols].copy_from_slice(&random_rounded(rng, ty, cols, 0.0, 1.0));
    }
    data
}

/// `Σ_k a[k]·b[k]` and `sqrt(Σ_k (a[k]·b[k])²)` in f64.
fn dot(a: &[f64], b: &[f64]) -> (f64, f64) {
    let (mut sum, mut squares) = (0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        sum += x * y;
        squares += (x * y) * (x * y);
    }
    (sum, squares.sqrt())
}

fn unit(ty: ScalarType) -> f64 {
    match ty {
        ScalarType::Bf16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    }
}

/// Half the subnormal spacing of `ty` (as [`super::gemm`]'s).
fn tiny(ty: ScalarType) -> f64 {
    match ty {
        ScalarType::F16 => 2f64.powi(-25),
        _ => 2f64.powi(-134),
    }
}

/// The layout's three buffers as inputs.
fn layout_fills(layout: &SortedLayout) -> [(&'static str, Fill); 3] {
    let values = |v: &[i32]| v.iter().map(|&x| f64::from(x)).collect();
    [
        (
            "sorted_token_ids",
            Fill::Input(values(&layout.sorted_token_ids)),
        ),
        ("expert_ids", Fill::Input(values(&layout.expert_ids))),
        (
            "num_tokens_post_pad",
            Fill::Input(vec![f64::from(layout.num_tokens_post_pad)]),
        ),
    ]
}

/// A strided output whose row `r` must hold `rows[r]` within `bounds[r]`, or keep the poison
/// where `rows[r]` is `None`.
fn strided_output(rows: Vec<Option<(Vec<f64>, Vec<f64>)>>, n: usize, ldc: usize) -> Fill {
    let mut want = Vec::with_capacity(rows.len() * n);
    let mut bound = Vec::with_capacity(rows.len() * n);
    for row in rows {
        match row {
            Some((w, b)) => {
                want.extend(w);
                bound.extend(b);
            }
            None => {
                want.extend(std::iter::repeat_n(f64::NAN, n));
                bound.extend(std::iter::repeat_n(0.0, n));
            }
        }
    }
    Fill::Output(Expect::StridedBounded {
        want,
        bound,
        row_len: n,
        stride: ldc,
    })
}

/// The sizes a GEMM call passes, in its signature's order.
fn gemm_sizes(shape: &MoeShape, local_experts: usize) -> [CallArg; 7] {
    let MoeShape {
        tokens,
        topk,
        n,
        k,
        pad_a,
        pad_c,
        ..
    } = *shape;
    [tokens, topk, local_experts, n, k, k + pad_a, n + pad_c].map(CallArg::u32)
}

/// Stage 1's kernel in `ty`.
fn gated_symbol(form: Form, ty: ScalarType) -> String {
    format!("moe_gemm_gated_silu{}_{}", form.suffix(), ty.name())
}

/// Stage 2's kernel in `ty`.
fn down_symbol(form: Form, ty: ScalarType) -> String {
    format!("moe_gemm_down{}_{}", form.suffix(), ty.name())
}

/// The combine's kernel in `ty`.
fn sum_symbol(ty: ScalarType) -> String {
    format!("moe_sum_{}", ty.name())
}

/// The call of stage 1 in `ty`.
pub fn gated_call(form: Form, ty: ScalarType, shape: &MoeShape, local_experts: usize) -> Call {
    let mut args = vec![
        CallArg::write("h", ty),
        CallArg::read("x", ty),
        CallArg::read("w13", ty),
    ];
    args.extend(sorted_args());
    args.extend(gemm_sizes(shape, local_experts));
    Call {
        kernel: gated_symbol(form, ty),
        args,
    }
}

/// The call of stage 2 in `ty`.
pub fn down_call(form: Form, ty: ScalarType, shape: &MoeShape, local_experts: usize) -> Call {
    let mut args = vec![
        CallArg::write("out", ty),
        CallArg::read("h", ty),
        CallArg::read("w2", ty),
        CallArg::read("topk_weights", ScalarType::F32),
    ];
    args.extend(sorted_args());
    args.extend(gemm_sizes(shape, local_experts));
    Call {
        kernel: down_symbol(form, ty),
        args,
    }
}

/// The call of the combine in `ty`: `y`, `out`, `topk_ids`, `expert_map`, `tokens`, `topk`,
/// `experts`, `n`, `ldo`, `ldy`.
pub fn sum_call(ty: ScalarType, shape: &MoeShape) -> Call {
    let MoeShape {
        tokens,
        experts,
        topk,
        n,
        pad_a,
        pad_c,
        ..
    } = *shape;
    let mut args = vec![
        CallArg::write("y", ty),
        CallArg::read("out", ty),
        CallArg::read("topk_ids", ScalarType::I32),
        CallArg::read("expert_map", ScalarType::I32),
    ];
    args.extend([tokens, topk, experts, n, n + pad_a, n + pad_c].map(CallArg::u32));
    Call {
        kernel: sum_symbol(ty),
        args,
    }
}

fn sorted_args() -> [CallArg; 3] {
    [
        CallArg::read("sorted_token_ids", ScalarType::I32),
        CallArg::read("expert_ids", ScalarType::I32),
        CallArg::read("num_tokens_post_pad", ScalarType::I32),
    ]
}

fn label(shape: &MoeShape, routed: &Routed) -> String {
    let MoeShape {
        tokens,
        experts,
        topk,
        n,
        k,
        pad_a,
        pad_c,
        routing,
        ..
    } = *shape;
    format!(
        "tokens={tokens} experts={experts} local={} topk={topk} n={n} k={k} pad_a={pad_a} pad_c={pad_c} routing={routing:?}",
        routed.local_experts
    )
}

/// Stage 1 on fresh random inputs.
pub fn gated_case(form: Form, ty: ScalarType, shape: &MoeShape, rng: &mut impl Rng) -> Case {
    let MoeShape {
        tokens,
        topk,
        n,
        k,
        pad_a,
        pad_c,
        ..
    } = *shape;
    let routed = route(shape, rng);
    let local = routed.local_experts;
    let layout = align(&routed.topk_ids, &routed.expert_map, local, form.block_m());
    let lda = k + pad_a;
    let x = rows_input(rng, ty, (tokens, k, lda), |_| true);
    let w13 = random_rounded(rng, ty, local * 2 * n * k, 0.0, 1.0);
    let silu = Activation::Silu;
    let rows = (0..tokens * topk)
        .map(|f| {
            let e = routed.local(f)?;
            let a = &x[f / topk * lda..f / topk * lda + k];
            let weight = |row: usize| &w13[(e * 2 * n + row) * k..(e * 2 * n + row + 1) * k];
            let mut want = Vec::with_capacity(n);
            let mut bound = Vec::with_capacity(n);
            for j in 0..n {
                let (gate, spread_gate) = dot(a, weight(j));
                let (up, spread_up) = dot(a, weight(n + j));
                let e_gate = k as f64 * 2f64.powi(-22) * spread_gate;
                let e_up = k as f64 * 2f64.powi(-22) * spread_up;
                let value = silu.apply(gate) * up;
                want.push(value);
                bound.push(
                    unit(ty) * value.abs()
                        + 1.2 * e_gate * up.abs()
                        + e_up * silu.apply(gate).abs()
                        + tiny(ty),
                );
            }
            Some((want, bound))
        })
        .collect();
    let [sorted, experts, post_pad] = layout_fills(&layout);
    gated_call(form, ty, shape, local).case(
        label(shape, &routed),
        [None; 3],
        [
            ("h", strided_output(rows, n, n + pad_c)),
            ("x", Fill::Input(x)),
            ("w13", Fill::Input(w13)),
            sorted,
            experts,
            post_pad,
        ],
    )
}

/// Stage 2 on fresh random inputs (h's rows of dropped choices NaN).
pub fn down_case(form: Form, ty: ScalarType, shape: &MoeShape, rng: &mut impl Rng) -> Case {
    let MoeShape {
        tokens,
        topk,
        n,
        k,
        pad_a,
        pad_c,
        ..
    } = *shape;
    let routed = route(shape, rng);
    let local = routed.local_experts;
    let layout = align(&routed.topk_ids, &routed.expert_map, local, form.block_m());
    let choices = tokens * topk;
    let lda = k + pad_a;
    let h = rows_input(rng, ty, (choices, k, lda), |f| routed.local(f).is_some());
    let w2 = random_rounded(rng, ty, local * n * k, 0.0, 1.0);
    // Routing weights in (0, 1], as f32.
    let weights: Vec<f64> = (0..choices)
        .map(|_| f64::from(rng.random_range(0.01f32..1.0)))
        .collect();
    let rows = (0..choices)
        .map(|f| {
            let e = routed.local(f)?;
            let a = &h[f * lda..f * lda + k];
            let mut want = Vec::with_capacity(n);
            let mut bound = Vec::with_capacity(n);
            for j in 0..n {
                let (sum, spread) = dot(a, &w2[(e * n + j) * k..(e * n + j + 1) * k]);
                let value = weights[f] * sum;
                want.push(value);
                bound.push(
                    (unit(ty) + 2f64.powi(-24)) * value.abs()
                        + weights[f] * k as f64 * 2f64.powi(-22) * spread
                        + tiny(ty),
                );
            }
            Some((want, bound))
        })
        .collect();
    let [sorted, experts, post_pad] = layout_fills(&layout);
    down_call(form, ty, shape, local).case(
        label(shape, &routed),
        [None; 3],
        [
            ("out", strided_output(rows, n, n + pad_c)),
            ("h", Fill::Input(h)),
            ("w2", Fill::Input(w2)),
            ("topk_weights", Fill::Input(weights)),
            sorted,
            experts,
            post_pad,
        ],
    )
}

/// The combine on fresh random inputs (rows of dropped choices NaN); `n` columns, `out` rows
/// `n + pad_a` apart, `y` rows `n + pad_c` apart.
pub fn sum_case(ty: ScalarType, shape: &MoeShape, rng: &mut impl Rng) -> Case {
    let MoeShape {
        tokens,
        topk,
        n,
        pad_a,
        pad_c,
        ..
    } = *shape;
    let routed = route(shape, rng);
    let ldo = n + pad_a;
    let out = rows_input(rng, ty, (tokens * topk, n, ldo), |f| {
        routed.local(f).is_some()
    });
    let rows = (0..tokens)
        .map(|t| {
            let mut want = vec![0.0; n];
            let mut magnitude = vec![0.0; n];
            for f in (t * topk..(t + 1) * topk).filter(|&f| routed.local(f).is_some()) {
                for j in 0..n {
                    want[j] += out[f * ldo + j];
                    magnitude[j] += out[f * ldo + j].abs();
                }
            }
            let bound = want
                .iter()
                .zip(&magnitude)
                .map(|(w, m)| unit(ty) * w.abs() + topk as f64 * 2f64.powi(-24) * m + tiny(ty))
                .collect();
            Some((want, bound))
        })
        .collect();
    let ids = routed.topk_ids.iter().map(|&g| g as f64).collect();
    let map = routed.expert_map.iter().map(|&e| f64::from(e)).collect();
    sum_call(ty, shape).case(
        label(shape, &routed),
        [None; 3],
        [
            ("y", strided_output(rows, n, n + pad_c)),
            ("out", Fill::Input(out)),
            ("topk_ids", Fill::Input(ids)),
            ("expert_map", Fill::Input(map)),
        ],
    )
}

/// A shape as a row of numbers: `(tokens, experts, topk, n, k, pad_a, pad_c, local_every,
/// routing)`.
type ShapeRow = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    Routing,
);

/// The shapes: decode (1 and 3
/// tokens), 64, 1000 and 4096 tokens; Mixtral's 8 experts top-2, 64 experts top-8 (Qwen3's 128
/// scaled down), experts with no token, all tokens on one expert, half the experts local;
/// tails in n and k (not multiples of the blocks or the 32-deep steps), strided rows, rows that
/// are not 16-byte aligned (odd leading dimensions: the element-wise copies).
const SHAPES: [ShapeRow; 11] = [
    (1, 8, 2, 64, 128, 0, 0, 1, Routing::Uniform),
    (3, 8, 2, 70, 61, 3, 2, 1, Routing::Uniform),
    (64, 8, 8, 136, 200, 8, 0, 1, Routing::Uniform),
    (64, 64, 8, 96, 64, 0, 0, 1, Routing::Few),
    (1000, 8, 2, 129, 96, 0, 5, 1, Routing::Uniform),
    (1000, 64, 8, 72, 100, 0, 0, 1, Routing::Uniform),
    (300, 8, 2, 65, 136, 0, 0, 1, Routing::OneExpert),
    (200, 16, 4, 100, 72, 1, 0, 2, Routing::Uniform),
    (1, 64, 8, 200, 256, 0, 0, 2, Routing::Uniform),
    (4096, 8, 2, 128, 256, 0, 0, 1, Routing::Uniform),
    // The combine: two blocks of 2048 columns, 16-byte rows, a last thread of 4 columns.
    (5, 8, 2, 2100, 64, 4, 4, 1, Routing::Uniform),
];

/// The shapes as [`MoeShape`]s.
pub fn shapes() -> Vec<MoeShape> {
    SHAPES
        .iter()
        .map(
            |&(tokens, experts, topk, n, k, pad_a, pad_c, local_every, routing)| MoeShape {
                tokens,
                experts,
                topk,
                n,
                k,
                pad_a,
                pad_c,
                local_every,
                routing,
            },
        )
        .collect()
}

/// Every symbol at every shape (bf16 and f16 alternating; the GEMMs in both forms), with fresh
/// random inputs.
pub fn plan(rng: &mut impl Rng) -> Vec<Planned> {
    let mut plans = Vec::new();
    for (i, &shape) in shapes().iter().enumerate() {
        let [ty, other] = if i % 2 == 0 {
            [ScalarType::Bf16, ScalarType::F16]
        } else {
            [ScalarType::F16, ScalarType::Bf16]
        };
        for form in Form::ALL {
            plans.push(Planned::one(gated_symbol(form, ty), rng, move |rng| {
                gated_case(form, ty, &shape, rng)
            }));
            plans.push(Planned::one(down_symbol(form, other), rng, move |rng| {
                down_case(form, other, &shape, rng)
            }));
        }
        plans.push(Planned::one(sum_symbol(ty), rng, move |rng| {
            sum_case(ty, &shape, rng)
        }));
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::CaseArg;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn align_groups_pads_and_drops_as_the_format_says() {
        // 3 tokens, top-2 over 4 experts; experts 1 and 3 local (as 0 and 1), block of 4.
        let topk_ids = [1, 3, 1, 0, 2, 3];
        let map = [-1, 0, -1, 1];
        let layout = align(&topk_ids, &map, 2, 4);
        let s = 6;
        // max_sorted = 6 + 2 * 3 = 12: expert 0 takes choices 0, 2; expert 1 takes 1, 5.
        assert_eq!(
            layout.sorted_token_ids,
            [0, 2, s, s, 1, 5, s, s, s, s, s, s]
        );
        assert_eq!(layout.expert_ids, [0, 1, -1]);
        assert_eq!(layout.num_tokens_post_pad, 8);
        // An expert with no choice takes no block.
        let layout = align(&[2, 2, 2], &[0, 1, 2], 3, 2);
        assert_eq!(layout.sorted_token_ids, [0, 1, 2, 3, 3, 3]);
        assert_eq!(layout.expert_ids, [2, 2, -1]);
        assert_eq!(layout.num_tokens_post_pad, 4);
    }

    #[test]
    fn routings_choose_distinct_experts_as_described() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut shape = shapes()[6];
        assert_eq!(shape.routing, Routing::OneExpert);
        let routed = route(&shape, &mut rng);
        for token in routed.topk_ids.chunks(shape.topk) {
            assert_eq!(token[0], 0);
            assert!(token[1..].iter().all(|&e| e != 0 && e < shape.experts));
        }
        shape.routing = Routing::Few;
        shape.topk = 2;
        assert!(route(&shape, &mut rng).topk_ids.iter().all(|&e| e < 4));
        let ep = route(&shapes()[7], &mut rng);
        assert_eq!(ep.local_experts, 8);
        assert_eq!(ep.expert_map[..4], [-1, 0, -1, 1]);
    }

    #[test]
    fn cases_cover_every_symbol_and_accept_their_reference() {
        let cases: Vec<Case> = plan(&mut StdRng::seed_from_u64(7))
            .into_iter()
            .flat_map(Planned::make)
            .collect();
        // Every shape once a family, its type alternating from shape to shape.
        for family in [
            "moe_gemm_gated_silu",
            "moe_gemm_down",
            "moe_gemm_gated_silu_m16",
            "moe_gemm_down_m16",
            "moe_sum",
        ] {
            let count = |ty| {
                let symbol = format!("{family}_{ty}");
                cases.iter().filter(|c| c.kernel == symbol).count()
            };
            let (bf16, f16) = (count("bf16"), count("f16"));
            assert_eq!(bf16 + f16, shapes().len(), "{family}");
            assert!(bf16.min(f16) >= shapes().len() / 2, "{family}");
        }
        // Expert parallelism leaves rows alone; the reference passes with them poisoned, and
        // fails when one is written or a wanted element is not.
        let case = cases
            .iter()
            .find(|c| {
                c.kernel.starts_with("moe_gemm_down") && c.label.contains("experts=16 local=8")
            })
            .unwrap();
        let CaseArg::Output {
            expect:
                Expect::StridedBounded {
                    want,
                    row_len,
                    stride,
                    ..
                },
            ..
        } = &case.args[0]
        else {
            panic!("out is a strided output")
        };
        let mut got = vec![f64::NAN; want.len() / row_len * stride];
        for (r, row) in want.chunks(*row_len).enumerate() {
            got[r * stride..r * stride + row_len].copy_from_slice(row);
        }
        let left = want.chunks(*row_len).position(|r| r[0].is_nan()).unwrap();
        let written = want.chunks(*row_len).position(|r| !r[0].is_nan()).unwrap();
        let mut outputs = vec![None; case.args.len()];
        outputs[0] = Some(got.clone());
        assert!(case.check(&outputs).is_ok());
        let mut bad = got.clone();
        bad[left * stride] = 0.0;
        outputs[0] = Some(bad);
        assert!(case.check(&outputs).is_err());
        got[written * stride] = f64::NAN;
        outputs[0] = Some(got);
        assert!(case.check(&outputs).is_err());
    }
}
