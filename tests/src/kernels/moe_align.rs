//! Mixture-of-experts alignment: the host reference and the cases of `moe_align_block_size` in
//! `kernels/moe_align.hip`, which sorts a routing's (token, choice) pairs by local expert and
//! pads each expert's rows to a multiple of `block_m` for the grouped GEMMs.
//!
//! Every output is integer, so every case compares exactly: the sorted flat indices (ascending
//! within each expert), the sentinel padding, every block's expert and `-1` for every block
//! after the last used one, the padded count. The outputs start filled with [`UNWRITTEN`], a
//! value the kernel never writes (the runners' poison reads as -1 in `i32`, which the kernel does
//! write to `expert_ids`): rows of `sorted_token_ids` past the padded count must still hold it.
//! Each output is followed by a guard band of [`GUARD`] elements of the runners' poison, which
//! must survive (under `--exact-extents` those elements do not exist and read back as it).

use hk_format::abi::ScalarType;
use rand::Rng;
use rand::seq::{IndexedRandom, SliceRandom};

use crate::case::{Call, CallArg, Case, CaseArg, Expect, Fill};

/// The most experts the kernel aligns over (its contract refuses more).
pub const MAX_EXPERTS: usize = 1024;

/// What an output element holds before the launch: no row, expert or count the kernel writes.
pub const UNWRITTEN: f64 = 0x5A5A_5A5A as f64;

/// Elements after each output that the kernel must leave alone.
pub const GUARD: usize = 32;

/// The runners' poison (`crate::host::POISON_BYTE` in every byte) read as an `i32`.
const POISON_I32: f64 = -1.0;

/// What the kernel computes, by the definition: for each local expert in turn, the flat indices
/// of its pairs in order, then the sentinel `topk_ids.len()` up to a multiple of `block_m`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alignment {
    /// The used rows (`num_tokens_post_pad` of them).
    pub sorted_token_ids: Vec<i32>,
    /// The local expert of each used block.
    pub expert_ids: Vec<i32>,
}

impl Alignment {
    pub fn num_tokens_post_pad(&self) -> usize {
        self.sorted_token_ids.len()
    }
}

/// The rows `sorted_token_ids` may hold for a call: `tokens · k + experts · (block_m − 1)`.
pub fn max_sorted(pairs: usize, experts: usize, block_m: usize) -> usize {
    pairs + experts * (block_m - 1)
}

/// The alignment of `topk_ids` (global expert ids; pairs with an id outside `[0, experts)` or
/// whose `expert_map` entry lies outside `[0, local_experts)` are dropped).
pub fn align(
    topk_ids: &[i64],
    expert_map: &[i64],
    local_experts: usize,
    block_m: usize,
) -> Alignment {
    let local_of = |id: i64| -> Option<usize> {
        let local = *expert_map.get(usize::try_from(id).ok()?)?;
        usize::try_from(local).ok().filter(|&l| l < local_experts)
    };
    let sentinel = i32::try_from(topk_ids.len()).expect("pairs fit an i32");
    // Each expert's pairs in order of their flat index (one pass, for 8192 tokens of top-8).
    let mut pairs_of: Vec<Vec<i32>> = vec![Vec::new(); local_experts];
    for (i, &id) in topk_ids.iter().enumerate() {
        if let Some(expert) = local_of(id) {
            pairs_of[expert].push(i as i32);
        }
    }
    let mut sorted = Vec::new();
    let mut expert_ids = Vec::new();
    for (expert, pairs) in pairs_of.iter().enumerate() {
        let padded = pairs.len().div_ceil(block_m) * block_m;
        sorted.extend(pairs);
        sorted.resize(sorted.len() + padded - pairs.len(), sentinel);
        expert_ids.extend(std::iter::repeat_n(expert as i32, padded / block_m));
    }
    Alignment {
        sorted_token_ids: sorted,
        expert_ids,
    }
}

/// The call of `moe_align_block_size`: `sorted_token_ids`, `expert_ids`,
/// `num_tokens_post_pad`, `topk_ids`, `expert_map`, `tokens`, `k`, `experts`, `local_experts`,
/// `block_m`.
pub fn align_call(
    tokens: usize,
    k: usize,
    experts: usize,
    local_experts: usize,
    block_m: usize,
) -> Call {
    Call {
        kernel: "moe_align_block_size".into(),
        args: vec![
            CallArg::write("sorted_token_ids", ScalarType::I32),
            CallArg::write("expert_ids", ScalarType::I32),
            CallArg::write("num_tokens_post_pad", ScalarType::I32),
            CallArg::read("topk_ids", ScalarType::I32),
            CallArg::read("expert_map", ScalarType::I32),
            CallArg::u32(tokens),
            CallArg::u32(k),
            CallArg::u32(experts),
            CallArg::u32(local_experts),
            CallArg::u32(block_m),
        ],
    }
}

/// How a case's tokens choose their experts.
#[derive(Debug, Clone, Copy)]
pub enum Routing {
    /// k different experts a token, uniformly: most experts get no pair at small batches.
    Spread,
    /// Every token chooses expert `experts / 2` and k − 1 others.
    OneHot,
    /// Every pair on expert `experts - 1` (not a routing the routing kernels make: a token
    /// repeats an expert), the longest segment there can be.
    AllOnOne,
    /// Spread, with some ids outside `[0, experts)` (-3, `experts`, 99999): the caller's bug,
    /// which the kernel drops.
    OutOfRange,
}

/// Which experts are local, and their local indices.
#[derive(Debug, Clone, Copy)]
pub enum Placement {
    /// Every expert local: the identity map.
    AllLocal,
    /// Expert parallelism: this rank holds the `rank`-th of `ranks` equal slices.
    Slice { rank: usize, ranks: usize },
    /// A random half of the experts local, in a random local order, and every other map entry
    /// -1 or (a caller's bug the kernel drops) `local_experts` or larger.
    Scattered,
    /// No expert of the routing local: nothing is sorted.
    NoneUsed,
}

/// `(tokens, experts, k, block_m, routing, placement)`: token counts 1, 3, 64, 1000 and 8192 for
/// Mixtral's 8 experts top-2, Qwen3-MoE's 128 top-8 and DeepSeek-V3's 256 top-8; every block
/// size; all tokens on one expert; expert-parallel slices and scattered maps; out-of-range ids;
/// the most experts; one expert.
const SHAPES: [(usize, usize, usize, usize, Routing, Placement); 24] = [
    (1, 8, 2, 16, Routing::Spread, Placement::AllLocal),
    (3, 8, 2, 64, Routing::Spread, Placement::AllLocal),
    (64, 8, 2, 128, Routing::Spread, Placement::AllLocal),
    (1000, 8, 2, 256, Routing::Spread, Placement::AllLocal),
    (8192, 8, 2, 64, Routing::Spread, Placement::AllLocal),
    (1, 128, 8, 16, Routing::Spread, Placement::AllLocal),
    (3, 128, 8, 64, Routing::Spread, Placement::AllLocal),
    (64, 128, 8, 32, Routing::Spread, Placement::AllLocal),
    (1000, 128, 8, 64, Routing::Spread, Placement::AllLocal),
    (8192, 128, 8, 128, Routing::Spread, Placement::AllLocal),
    (1, 256, 8, 64, Routing::Spread, Placement::AllLocal),
    (3, 256, 8, 16, Routing::Spread, Placement::AllLocal),
    (64, 256, 8, 64, Routing::Spread, Placement::AllLocal),
    (1000, 256, 8, 128, Routing::Spread, Placement::AllLocal),
    (8192, 256, 8, 64, Routing::Spread, Placement::AllLocal),
    (64, 256, 8, 16, Routing::OneHot, Placement::AllLocal),
    (1000, 256, 2, 256, Routing::AllOnOne, Placement::AllLocal),
    (
        64,
        256,
        8,
        64,
        Routing::Spread,
        Placement::Slice { rank: 1, ranks: 4 },
    ),
    (
        1000,
        256,
        8,
        32,
        Routing::Spread,
        Placement::Slice { rank: 7, ranks: 8 },
    ),
    (1000, 128, 8, 16, Routing::Spread, Placement::Scattered),
    (3, 8, 2, 16, Routing::Spread, Placement::NoneUsed),
    (37, 96, 6, 32, Routing::OutOfRange, Placement::Scattered),
    (64, 1024, 8, 64, Routing::Spread, Placement::AllLocal),
    (5, 1, 1, 16, Routing::Spread, Placement::AllLocal),
];

/// Every shape with fresh random routings.
pub fn cases(rng: &mut impl Rng) -> Vec<Case> {
    SHAPES
        .iter()
        .map(|&(tokens, experts, k, block_m, routing, placement)| {
            let topk_ids = route(tokens, experts, k, routing, rng);
            let (expert_map, local_experts) = place(experts, placement, rng);
            align_case(
                tokens,
                k,
                experts,
                local_experts,
                block_m,
                &topk_ids,
                &expert_map,
            )
            .with_label(format!(
                "tokens={tokens} experts={experts} k={k} block_m={block_m} \
                     local_experts={local_experts} routing={routing:?} placement={placement:?}"
            ))
        })
        .collect()
}

/// The pairs' global expert ids, token by token.
pub fn route(
    tokens: usize,
    experts: usize,
    k: usize,
    routing: Routing,
    rng: &mut impl Rng,
) -> Vec<i64> {
    let all: Vec<i64> = (0..experts as i64).collect();
    let mut ids = Vec::with_capacity(tokens * k);
    for _ in 0..tokens {
        let mut chosen: Vec<i64> = match routing {
            Routing::AllOnOne => vec![experts as i64 - 1; k],
            Routing::OneHot => {
                let hot = (experts / 2) as i64;
                let others: Vec<i64> = all.iter().copied().filter(|&e| e != hot).collect();
                let mut chosen: Vec<i64> = others.choose_multiple(rng, k - 1).copied().collect();
                chosen.insert(rng.random_range(0..k), hot);
                chosen
            }
            Routing::Spread | Routing::OutOfRange => all.choose_multiple(rng, k).copied().collect(),
        };
        if let Routing::OutOfRange = routing {
            for id in &mut chosen {
                if rng.random_range(0..4) == 0 {
                    *id = [-3, experts as i64, 99999][rng.random_range(0..3)];
                }
            }
        }
        ids.extend(chosen);
    }
    ids
}

/// The expert map and the number of local experts.
pub fn place(experts: usize, placement: Placement, rng: &mut impl Rng) -> (Vec<i64>, usize) {
    match placement {
        Placement::AllLocal => ((0..experts as i64).collect(), experts),
        Placement::Slice { rank, ranks } => {
            let size = experts / ranks;
            let map = (0..experts)
                .map(|e| match e / size == rank {
                    true => (e % size) as i64,
                    false => -1,
                })
                .collect();
            (map, size)
        }
        Placement::Scattered => {
            let local = experts / 2;
            let mut order: Vec<usize> = (0..experts).collect();
            order.shuffle(rng);
            let mut map = vec![-1i64; experts];
            for (index, &e) in order[..local].iter().enumerate() {
                map[e] = index as i64;
            }
            for &e in &order[local..] {
                if rng.random_range(0..3) == 0 {
                    map[e] = local as i64 + rng.random_range(0..3);
                }
            }
            (map, local)
        }
        // The routing's experts all lie on other ranks; this one holds one expert no pair names.
        Placement::NoneUsed => (vec![-1; experts], 1),
    }
}

/// The case of one call, judged against [`align`].
pub fn align_case(
    tokens: usize,
    k: usize,
    experts: usize,
    local_experts: usize,
    block_m: usize,
    topk_ids: &[i64],
    expert_map: &[i64],
) -> Case {
    let want = align(topk_ids, expert_map, local_experts, block_m);
    let rows = max_sorted(tokens * k, experts, block_m);
    let blocks = rows.div_ceil(block_m);
    // Unwritten rows keep UNWRITTEN; blocks past the used ones are -1; then the guard band.
    let sorted = padded_to(
        want.sorted_token_ids.iter().map(|&x| f64::from(x)),
        rows,
        UNWRITTEN,
    );
    let expert_ids = padded_to(want.expert_ids.iter().map(|&x| f64::from(x)), blocks, -1.0);
    let post_pad = vec![want.num_tokens_post_pad() as f64];
    let as_f64 = |v: &[i64]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let mut case = align_call(tokens, k, experts, local_experts, block_m).case(
        String::new(),
        [None; 3],
        [
            (
                "sorted_token_ids",
                Fill::Output(Expect::Exact(guarded(sorted))),
            ),
            (
                "expert_ids",
                Fill::Output(Expect::Exact(guarded(expert_ids))),
            ),
            (
                "num_tokens_post_pad",
                Fill::Output(Expect::Exact(guarded(post_pad))),
            ),
            ("topk_ids", Fill::Input(as_f64(topk_ids))),
            ("expert_map", Fill::Input(as_f64(expert_map))),
        ],
    );
    // Each output starts as UNWRITTEN up to its extent and as the poison in its guard band.
    for arg in &mut case.args {
        if let CaseArg::Output {
            name, elem, expect, ..
        } = arg
        {
            let len = expect.output_len();
            let mut data = vec![UNWRITTEN; len - GUARD];
            data.resize(len, POISON_I32);
            *arg = CaseArg::InOut {
                name,
                elem: *elem,
                data,
                expect: expect.clone(),
            };
        }
    }
    case
}

fn padded_to(values: impl Iterator<Item = f64>, len: usize, fill: f64) -> Vec<f64> {
    let mut out: Vec<f64> = values.collect();
    assert!(
        out.len() <= len,
        "{} values past an extent of {len}",
        out.len()
    );
    out.resize(len, fill);
    out
}

fn guarded(mut want: Vec<f64>) -> Vec<f64> {
    want.resize(want.len() + GUARD, POISON_I32);
    want
}

trait Labelled {
    fn with_label(self, label: String) -> Self;
}

impl Labelled for Case {
    fn with_label(mut self, label: String) -> Self {
        self.label = label;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn pairs_sort_by_local_expert_ascending_and_pad_with_the_sentinel() {
        // 3 tokens of top-2 over 4 experts; expert 2 is on another rank, expert 3 is local 0.
        let topk_ids = [1, 3, 3, 2, 1, 0];
        let map = [2, 1, -1, 0];
        let got = align(&topk_ids, &map, 3, 4);
        let s = 6;
        assert_eq!(got.sorted_token_ids, [1, 2, s, s, 0, 4, s, s, 5, s, s, s]);
        assert_eq!(got.expert_ids, [0, 1, 2]);
        assert_eq!(got.num_tokens_post_pad(), 12);
    }

    #[test]
    fn dropped_pairs_and_empty_experts_take_no_rows() {
        // Ids out of range, a map entry past local_experts, and local expert 1 without pairs.
        let topk_ids = [-1, 5, 0, 2, 99];
        let map = [0, 1, 7, -1, 0];
        let got = align(&topk_ids, &map, 2, 16);
        let mut want = vec![5; 16];
        want[0] = 2;
        assert_eq!(got.sorted_token_ids, want);
        assert_eq!(got.expert_ids, [0]);
        assert!(align(&[3, 3], &[-1; 4], 1, 16).sorted_token_ids.is_empty());
    }

    #[test]
    fn cases_are_within_the_kernels_limits_and_cover_the_issue() {
        let cases = cases(&mut StdRng::seed_from_u64(44));
        assert_eq!(cases.len(), SHAPES.len());
        for (tokens, experts, k, block_m, ..) in SHAPES {
            assert!(tokens >= 1 && k >= 1 && (1..=MAX_EXPERTS).contains(&experts));
            assert!(block_m.is_power_of_two() && (16..=256).contains(&block_m));
        }
        for tokens in [1, 3, 64, 1000, 8192] {
            for (experts, k) in [(8, 2), (128, 8), (256, 8)] {
                assert!(
                    SHAPES
                        .iter()
                        .any(|s| (s.0, s.1, s.2) == (tokens, experts, k)),
                    "{tokens} tokens of {experts} experts top-{k}"
                );
            }
        }
        // Every output ends in its guard band of poison and starts as UNWRITTEN.
        for case in &cases {
            for arg in &case.args {
                if let CaseArg::InOut { data, .. } = arg {
                    assert_eq!(data[0], UNWRITTEN);
                    assert!(data[data.len() - GUARD..].iter().all(|&x| x == -1.0));
                }
            }
        }
    }

    #[test]
    fn a_kernel_writing_too_little_or_too_much_fails() {
        // Expert 0 gets pairs 0, 2 and 4.
        let topk_ids = [0, 1, 0, 2, 0, 1];
        let map: Vec<i64> = (0..8).collect();
        let case = align_case(3, 2, 8, 8, 16, &topk_ids, &map);
        let want = align(&topk_ids, &map, 8, 16);
        // The outputs a right kernel leaves: computed from the case's own expectations.
        let right: Vec<Option<Vec<f64>>> = case
            .args
            .iter()
            .map(|arg| match arg {
                CaseArg::InOut {
                    expect: Expect::Exact(want),
                    ..
                } => Some(want.clone()),
                _ => None,
            })
            .collect();
        assert!(case.check(&right).is_ok());
        let used = want.num_tokens_post_pad();
        let mut unwritten_tail = right.clone();
        // A block past the used ones left as it was.
        unwritten_tail[1].as_mut().unwrap()[used / 16] = UNWRITTEN;
        assert!(case.check(&unwritten_tail).is_err());
        // A row past the used ones written.
        let mut stray = right.clone();
        stray[0].as_mut().unwrap()[used] = 6.0;
        assert!(case.check(&stray).is_err());
        // The guard band written.
        let mut past = right.clone();
        let n = past[2].as_ref().unwrap().len();
        past[2].as_mut().unwrap()[n - 1] = 0.0;
        assert!(case.check(&past).is_err());
        // Two rows of one expert swapped (the order within an expert is part of the format).
        let mut swapped = right;
        assert_eq!(&swapped[0].as_ref().unwrap()[..4], [0.0, 2.0, 4.0, 6.0]);
        swapped[0].as_mut().unwrap().swap(0, 1);
        assert!(case.check(&swapped).is_err());
    }
}
