//! Mixture-of-experts routing: the f64 references and the cases of the `topk_softmax_*` and
//! `grouped_topk_*` kernels in `kernels/moe_routing.hip`.
//!
//! Both write, per token, `k` expert ids (`i32`) and their `f32` weights, best first, ties to the
//! lower expert index (and, for groups, the lower group index). Ids are checked exactly, weights
//! within [`WEIGHT_ABS`] + [`WEIGHT_REL`] · |want| of the f64 reference.
//!
//! The kernels choose in f32 and the references in f64, so random inputs are drawn again where
//! two different values that decide the choice lie closer than [`DECIDING_GAP`] (either order
//! would be right within rounding); values that are exactly equal (equal logits, and equal bias
//! for the grouped routing) are ties on both sides alike and are kept, so the tie rule is checked
//! exactly.

use hk_format::abi::{ScalarType, ScalarValue};
use rand::Rng;

use crate::case::{Call, CallArg, Case, Expect, Fill};
use crate::host::round_to;

/// The most experts the kernels route over, and the most they choose a token (their contract
/// refuses more).
pub const MAX_EXPERTS: usize = 256;
pub const MAX_K: usize = 16;
/// The most groups `grouped_topk_*` accepts.
pub const MAX_GROUPS: usize = 32;

/// The weights' bound: f32 exp/sigmoid (the targets' approximate exp2 and reciprocal), a sum of
/// up to 256 terms and one division, with room.
pub const WEIGHT_ABS: f64 = 1e-6;
pub const WEIGHT_REL: f64 = 2e-5;

/// Two different values that decide a choice must be at least this far apart (see the module
/// doc): f32 rounding of a sigmoid plus a bias is about 1e-7.
pub const DECIDING_GAP: f64 = 1e-5;

/// The experts of `row` ranked by `value`: larger first, equal values by lower index.
fn ranked(values: &[f64], candidates: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut order: Vec<usize> = candidates.collect();
    order.sort_by(|&i, &j| values[j].total_cmp(&values[i]).then(i.cmp(&j)));
    order
}

/// Whether the values at adjacent places of `order` (those that decide the first `decided + 1`
/// places) are equal or at least [`DECIDING_GAP`] apart.
fn decisive(values: &[f64], order: &[usize], decided: usize) -> bool {
    order
        .windows(2)
        .take(decided)
        .all(|w| values[w[0]] == values[w[1]] || values[w[0]] - values[w[1]] >= DECIDING_GAP)
}

/// `topk_softmax` of one row of logits: the `k` experts of largest probability, best first, and
/// their probabilities (over all experts, or over the `k` chosen with `renormalize`).
pub fn topk_softmax(logits: &[f64], k: usize, renormalize: bool) -> Vec<(usize, f64)> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits.iter().map(|&x| (x - max).exp()).collect();
    let chosen: Vec<usize> = ranked(logits, 0..logits.len())
        .into_iter()
        .take(k)
        .collect();
    let sum: f64 = if renormalize {
        chosen.iter().map(|&e| exps[e]).sum()
    } else {
        exps.iter().sum()
    };
    chosen.into_iter().map(|e| (e, exps[e] / sum)).collect()
}

/// The arguments of the grouped routing besides its inputs.
#[derive(Debug, Clone, Copy)]
pub struct Grouping {
    pub n_group: usize,
    pub topk_group: usize,
    pub k: usize,
    /// `routed_scaling_factor`.
    pub scaling: f64,
}

/// DeepSeek-V3's grouped routing of one row of logits with the correction `bias`: the chosen
/// experts, best first, with their weights, and whether every choice it made is decisive (see
/// [`decisive`]).
pub fn grouped_topk(logits: &[f64], bias: &[f64], g: Grouping) -> (Vec<(usize, f64)>, bool) {
    let score: Vec<f64> = logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
    let choice: Vec<f64> = score.iter().zip(bias).map(|(s, b)| s + b).collect();
    let size = logits.len() / g.n_group;
    let mut decided = true;
    let group_value: Vec<f64> = (0..g.n_group)
        .map(|group| {
            let order = ranked(&choice, group * size..(group + 1) * size);
            decided &= decisive(&choice, &order, 2);
            choice[order[0]] + choice[order[1]]
        })
        .collect();
    let groups = ranked(&group_value, 0..g.n_group);
    decided &= decisive(&group_value, &groups, g.topk_group);
    let kept = &groups[..g.topk_group];
    let order = ranked(
        &choice,
        (0..logits.len()).filter(|e| kept.contains(&(e / size))),
    );
    decided &= decisive(&choice, &order, g.k);
    let chosen = &order[..g.k];
    let sum: f64 = chosen.iter().map(|&e| score[e]).sum();
    let routed = chosen
        .iter()
        .map(|&e| (e, score[e] / sum * g.scaling))
        .collect();
    (routed, decided)
}

/// How a case's logits are drawn.
#[derive(Debug, Clone, Copy)]
enum Values {
    /// Uniform in (-4, 4), rounded to the element type (bf16 rows of 256 hold some equal pairs).
    Spread,
    /// Whole numbers from -3 to 3: equal logits everywhere, also at the k-th place.
    Ties,
    /// Every logit of a row the same: the first k experts, by the tie rule.
    AllEqual,
}

fn draw(values: Values, rng: &mut impl Rng) -> f64 {
    match values {
        Values::Spread => rng.random_range(-4.0..4.0),
        Values::Ties => f64::from(rng.random_range(-3i8..=3)),
        Values::AllEqual => 0.75,
    }
}

/// The logits buffer: `tokens` rows of `experts`, `ld` apart; the gaps hold NaN, which would
/// spoil any weight of a kernel that read them.
fn logits_buffer(rows: &[Vec<f64>], experts: usize, ld: usize) -> Vec<f64> {
    let mut data = vec![f64::NAN; (rows.len() - 1) * ld + experts];
    for (t, row) in rows.iter().enumerate() {
        data[t * ld..t * ld + experts].copy_from_slice(row);
    }
    data
}

/// The outputs' checks: ids exactly, weights within the bound.
fn outputs(routed: &[(usize, f64)]) -> [(&'static str, Fill); 2] {
    let ids = routed.iter().map(|&(e, _)| e as f64).collect();
    let want = routed.iter().map(|&(_, w)| w).collect();
    [
        (
            "topk_weights",
            Fill::Output(Expect::Close {
                want,
                abs: WEIGHT_ABS,
                rel: WEIGHT_REL,
            }),
        ),
        ("topk_ids", Fill::Output(Expect::Exact(ids))),
    ]
}

/// `(tokens, experts, k, ld - experts, values, renormalize)`: Mixtral's 8 experts top-2,
/// Qwen3-MoE's 128 top-8, 256 experts, token counts 1, 3, 64 and 1000, strided rows, one
/// expert, k = experts, and the most experts and k the kernels take.
const SOFTMAX_SHAPES: [(usize, usize, usize, usize, Values, bool); 12] = [
    (1, 8, 2, 0, Values::Spread, true),
    (3, 8, 2, 5, Values::Ties, false),
    (64, 8, 8, 0, Values::Spread, false),
    (1000, 8, 2, 0, Values::Ties, true),
    (1, 128, 8, 0, Values::Spread, false),
    (64, 128, 8, 0, Values::Spread, true),
    (1000, 128, 8, 3, Values::Ties, true),
    (3, 256, 8, 0, Values::Ties, false),
    (64, 256, 2, 0, Values::AllEqual, true),
    (1000, 256, 8, 0, Values::Spread, false),
    (5, 256, 16, 7, Values::Spread, true),
    (7, 1, 1, 0, Values::Spread, false),
];

/// `(tokens, experts, n_group, topk_group, k, values, scaling)`: DeepSeek-V3 (256 experts, 8
/// groups, 4 kept, top-8, factor 2.5) at 1, 3, 64 and 1000 tokens, with ties and all-equal
/// rows; the group limits (32 groups of 2, one group, every group kept, k = all the kept
/// experts) and small expert counts.
const GROUPED_SHAPES: [(usize, usize, usize, usize, usize, Values, f64); 11] = [
    (1, 256, 8, 4, 8, Values::Spread, 2.5),
    (3, 256, 8, 4, 8, Values::Ties, 2.5),
    (64, 256, 8, 4, 8, Values::Spread, 2.5),
    (1000, 256, 8, 4, 8, Values::Spread, 2.5),
    (64, 256, 8, 4, 8, Values::AllEqual, 2.5),
    (3, 128, 4, 2, 8, Values::Ties, 1.0),
    (7, 8, 4, 2, 2, Values::Spread, 1.0),
    (5, 64, 32, 3, 6, Values::Spread, 1.5),
    (2, 96, 1, 1, 16, Values::Ties, 1.0),
    (4, 256, 8, 8, 16, Values::Spread, 2.5),
    (3, 6, 3, 1, 2, Values::Ties, 1.0),
];

/// Every routing symbol at every shape, with fresh random inputs; launched as on an NVIDIA GPU
/// (the launch is correct on AMD too).
pub fn cases(rng: &mut impl Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for ty in [ScalarType::Bf16, ScalarType::F16, ScalarType::F32] {
        for (tokens, experts, k, pad, values, renormalize) in SOFTMAX_SHAPES {
            cases.push(softmax_case(
                ty,
                tokens,
                experts,
                experts + pad,
                k,
                values,
                renormalize,
                rng,
            ));
        }
        for (tokens, experts, n_group, topk_group, k, values, scaling) in GROUPED_SHAPES {
            let g = Grouping {
                n_group,
                topk_group,
                k,
                scaling,
            };
            cases.push(grouped_case(ty, tokens, experts, g, values, rng));
        }
    }
    cases
}

/// The call of `topk_softmax` in `ty`: `topk_weights`, `topk_ids`, `logits`, `tokens`,
/// `experts`, `ld`, `k`, `renormalize`.
pub fn softmax_call(
    ty: ScalarType,
    tokens: usize,
    experts: usize,
    ld: usize,
    k: usize,
    renormalize: bool,
) -> Call {
    Call {
        kernel: format!("topk_softmax_{}", ty.name()),
        args: vec![
            CallArg::write("topk_weights", ScalarType::F32),
            CallArg::write("topk_ids", ScalarType::I32),
            CallArg::read("logits", ty),
            CallArg::u32(tokens),
            CallArg::u32(experts),
            CallArg::u32(ld),
            CallArg::u32(k),
            CallArg::u32(usize::from(renormalize)),
        ],
    }
}

/// The call of `grouped_topk` in `ty`: `topk_weights`, `topk_ids`, `logits`, `bias`, `tokens`,
/// `experts`, `ld`, `n_group`, `topk_group`, `k`, `routed_scaling_factor`.
pub fn grouped_call(ty: ScalarType, tokens: usize, experts: usize, ld: usize, g: Grouping) -> Call {
    Call {
        kernel: format!("grouped_topk_{}", ty.name()),
        args: vec![
            CallArg::write("topk_weights", ScalarType::F32),
            CallArg::write("topk_ids", ScalarType::I32),
            CallArg::read("logits", ty),
            CallArg::read("bias", ScalarType::F32),
            CallArg::u32(tokens),
            CallArg::u32(experts),
            CallArg::u32(ld),
            CallArg::u32(g.n_group),
            CallArg::u32(g.topk_group),
            CallArg::u32(g.k),
            CallArg::Scalar(ScalarValue::F32(g.scaling as f32)),
        ],
    }
}

#[allow(clippy::too_many_arguments)]
fn softmax_case(
    ty: ScalarType,
    tokens: usize,
    experts: usize,
    ld: usize,
    k: usize,
    values: Values,
    renormalize: bool,
    rng: &mut impl Rng,
) -> Case {
    // The choice is by logit, which the kernel reads exactly: no draw is ever indecisive.
    let rows: Vec<Vec<f64>> = (0..tokens)
        .map(|_| {
            (0..experts)
                .map(|_| round_to(ty, draw(values, rng)))
                .collect()
        })
        .collect();
    let routed: Vec<(usize, f64)> = rows
        .iter()
        .flat_map(|row| topk_softmax(row, k, renormalize))
        .collect();
    let [weights, ids] = outputs(&routed);
    softmax_call(ty, tokens, experts, ld, k, renormalize).case(
        format!(
            "tokens={tokens} experts={experts} ld={ld} k={k} values={values:?} renormalize={renormalize}"
        ),
        [None; 3],
        [
            weights,
            ids,
            ("logits", Fill::Input(logits_buffer(&rows, experts, ld))),
        ],
    )
}

fn grouped_case(
    ty: ScalarType,
    tokens: usize,
    experts: usize,
    g: Grouping,
    values: Values,
    rng: &mut impl Rng,
) -> Case {
    // Ties need equal biases as well: a bias from two values, or none for all-equal rows (where
    // every choice ties). Spread rows get a bias of DeepSeek-V3's size (about ±0.1), f32.
    let bias: Vec<f64> = (0..experts)
        .map(|_| match values {
            Values::Spread => f64::from(rng.random_range(-0.1f32..0.1)),
            Values::Ties => [0.0, 0.125][rng.random_range(0..2)],
            Values::AllEqual => 0.0,
        })
        .collect();
    let mut rows = Vec::with_capacity(tokens);
    let mut routed = Vec::with_capacity(tokens * g.k);
    while rows.len() < tokens {
        let row: Vec<f64> = (0..experts)
            .map(|_| round_to(ty, draw(values, rng)))
            .collect();
        let (chosen, decided) = grouped_topk(&row, &bias, g);
        if decided {
            rows.push(row);
            routed.extend(chosen);
        }
    }
    let [weights, ids] = outputs(&routed);
    grouped_call(ty, tokens, experts, experts, g).case(
        format!(
            "tokens={tokens} experts={experts} n_group={} topk_group={} k={} values={values:?} scaling={}",
            g.n_group, g.topk_group, g.k, g.scaling
        ),
        [None; 3],
        [
            weights,
            ids,
            ("logits", Fill::Input(logits_buffer(&rows, experts, experts))),
            ("bias", Fill::Input(bias)),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn softmax_takes_the_largest_logits_and_breaks_ties_by_index() {
        let logits = [1.0, 3.0, 3.0, -2.0, 1.0];
        let routed = topk_softmax(&logits, 3, false);
        let ids: Vec<usize> = routed.iter().map(|&(e, _)| e).collect();
        assert_eq!(ids, [1, 2, 0]);
        let total: f64 = logits.iter().map(|&x| (x - 3.0f64).exp()).sum();
        assert!((routed[0].1 - 1.0 / total).abs() < 1e-15);
        let renormalized: f64 = topk_softmax(&logits, 3, true).iter().map(|&(_, w)| w).sum();
        assert!((renormalized - 1.0).abs() < 1e-15);
    }

    #[test]
    fn grouped_routing_chooses_by_biased_scores_and_weighs_by_plain_ones() {
        // 8 experts in 4 groups of 2; group 3 holds the largest logits, but the bias lifts
        // groups 0 and 1 above it.
        let logits = [0.0, 0.0, 0.5, 0.4, -1.0, -1.0, 2.0, 1.0];
        let bias = [0.5, 0.5, 0.2, 0.2, 0.0, 0.0, 0.0, 0.0];
        let g = Grouping {
            n_group: 4,
            topk_group: 2,
            k: 3,
            scaling: 2.0,
        };
        let (routed, decided) = grouped_topk(&logits, &bias, g);
        assert!(decided);
        let ids: Vec<usize> = routed.iter().map(|&(e, _)| e).collect();
        // Choices: 1.0, 1.0 (group 0: 2.0), 0.82, 0.80 (group 1: 1.62), group 3: 0.88 + 0.73.
        assert_eq!(ids, [0, 1, 2]);
        let s = |x: f64| 1.0 / (1.0 + (-x).exp());
        let sum = 2.0 * s(0.0) + s(0.5);
        assert!((routed[2].1 - s(0.5) / sum * 2.0).abs() < 1e-15);
    }

    #[test]
    fn equal_groups_go_to_the_lower_index() {
        let g = Grouping {
            n_group: 4,
            topk_group: 2,
            k: 4,
            scaling: 1.0,
        };
        let (routed, decided) = grouped_topk(&[0.5; 16], &[0.0; 16], g);
        assert!(decided);
        let ids: Vec<usize> = routed.iter().map(|&(e, _)| e).collect();
        assert_eq!(ids, [0, 1, 2, 3]);
        assert!(routed.iter().all(|&(_, w)| (w - 0.25).abs() < 1e-15));
    }

    #[test]
    fn near_ties_are_indecisive_and_exact_ones_are_not() {
        let values = [1.0, 1.0, 1.0 - DECIDING_GAP / 2.0, 0.0];
        assert!(decisive(&values, &[0, 1, 2, 3], 1));
        assert!(!decisive(&values, &[0, 1, 2, 3], 2));
    }

    #[test]
    fn cases_are_within_the_kernels_limits() {
        let cases = cases(&mut StdRng::seed_from_u64(44));
        assert_eq!(
            cases.len(),
            3 * (SOFTMAX_SHAPES.len() + GROUPED_SHAPES.len())
        );
        for (tokens, experts, k, ..) in SOFTMAX_SHAPES {
            assert!(tokens >= 1 && experts <= MAX_EXPERTS && k <= MAX_K && k <= experts);
        }
        for (_, experts, n_group, topk_group, k, ..) in GROUPED_SHAPES {
            assert!(n_group <= MAX_GROUPS && experts % n_group == 0 && experts / n_group >= 2);
            assert!(topk_group <= n_group && k <= topk_group * (experts / n_group) && k <= MAX_K);
        }
    }
}
