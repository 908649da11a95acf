//! Row-wise top-k: the f64 reference and the cases of the `topk_*` kernels in
//! `kernels/topk.hip`.
//!
//! Symbols: `topk_{bf16,f16,f32}`. For each of `rows` rows of `n` values the kernel writes the
//! `k` largest values in descending order and their `i32` column indices. NaN ranks above
//! +inf, as in `torch.topk`; equal values may come in any order.

use std::cmp::Ordering;

use hk_format::abi::ScalarType;
use rand::Rng;

use crate::case::{Call, CallArg, Case, Expect, Fill};
use crate::host::round_to;

/// The largest `k` the `topk_*` kernels accept (their contract refuses a larger one).
pub const MAX_K: usize = 128;

/// The order `topk` sorts by: larger first, NaN before everything, and -0 after +0 (the
/// kernels order by the bit pattern, under which the two zeros differ).
fn descending(a: f64, b: f64) -> Ordering {
    b.is_nan().cmp(&a.is_nan()).then_with(|| b.total_cmp(&a))
}

/// The `k` largest values of `row` (all of them if `k` exceeds its length) with their indices,
/// largest first; NaN ranks above +inf, and equal values come in index order.
pub fn topk(row: &[f64], k: usize) -> Vec<(f64, usize)> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&i, &j| descending(row[i], row[j]).then(i.cmp(&j)));
    order.into_iter().take(k).map(|i| (row[i], i)).collect()
}

/// How a case's inputs are drawn.
#[derive(Debug, Clone, Copy)]
enum Values {
    /// Uniform in (-4, 4), rounded to the element type: few ties.
    Spread,
    /// Whole numbers from -8 to 8: ties everywhere, also at the k-th value.
    Ties,
    /// Attention-style masking: nearly all values -inf, the odd +inf, the rest spread, so
    /// that a large enough `k` reaches into the -inf values.
    Masked,
}

/// `(rows, n, k, values)`: rows for one wave (n up to 1024) and for one block, ragged and
/// 16-byte-aligned lengths, k from 1 to [`MAX_K`] and k = n, ties at the k-th value, and k
/// beyond the finite values (n = 333 and 1500 hold about 13 and 60 of them).
const SHAPES: [(usize, usize, usize, Values); 14] = [
    (1, 1, 1, Values::Spread),
    (3, 17, 5, Values::Spread),
    (4, 64, 64, Values::Spread),
    (2, 100, 64, Values::Ties),
    (9, 333, 33, Values::Masked),
    (4, 1000, 32, Values::Spread),
    (64, 1024, 32, Values::Spread),
    (5, 1025, 7, Values::Ties),
    (7, 2048, 1, Values::Spread),
    (2, 3000, 128, Values::Spread),
    (3, 1500, 100, Values::Masked),
    (2, 4099, 64, Values::Masked),
    (3, 65536, 50, Values::Spread),
    (1, 70001, 128, Values::Ties),
];

/// Every `topk_*` symbol at every shape in [`SHAPES`], with fresh random inputs; launched as
/// on an NVIDIA GPU (the launch is correct on AMD too).
pub fn cases(rng: &mut impl Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for ty in [ScalarType::Bf16, ScalarType::F16, ScalarType::F32] {
        for (rows, n, k, values) in SHAPES {
            cases.push(case(ty, rows, n, k, values, rng));
        }
    }
    cases
}

/// The call of `topk` in `ty` over `rows` rows of `n` values: `values`, `indices` (`i32`), `x`,
/// `rows`, `n`, `k`.
pub fn call(ty: ScalarType, rows: usize, n: usize, k: usize) -> Call {
    Call {
        kernel: format!("topk_{}", ty.name()),
        args: vec![
            CallArg::write("values", ty),
            CallArg::write("indices", ScalarType::I32),
            CallArg::read("x", ty),
            CallArg::u32(rows),
            CallArg::u32(n),
            CallArg::u32(k),
        ],
    }
}

/// The case of `topk` in `ty` over `rows` rows of `n` values spread over ±4: for a benchmark's
/// check of its own sizes.
pub fn case_at(ty: ScalarType, rows: usize, n: usize, k: usize, rng: &mut impl Rng) -> Case {
    case(ty, rows, n, k, Values::Spread, rng)
}

fn draw(values: Values, rng: &mut impl Rng) -> f64 {
    match values {
        Values::Spread => rng.random_range(-4.0..4.0),
        Values::Ties => f64::from(rng.random_range(-8i8..=8)),
        Values::Masked => match rng.random_range(0..100) {
            0 => f64::INFINITY,
            1..97 => f64::NEG_INFINITY,
            _ => rng.random_range(-4.0..4.0),
        },
    }
}

fn case(
    ty: ScalarType,
    rows: usize,
    n: usize,
    k: usize,
    values: Values,
    rng: &mut impl Rng,
) -> Case {
    let input: Vec<f64> = (0..rows * n)
        .map(|_| round_to(ty, draw(values, rng)))
        .collect();
    let want: Vec<f64> = input
        .chunks(n)
        .flat_map(|row| topk(row, k))
        .map(|(v, _)| v)
        .collect();
    let indices = Expect::TopKIndices {
        input: input.clone(),
        row_len: n,
        k,
        values_arg: 0,
    };
    call(ty, rows, n, k).case(
        format!("rows={rows} n={n} k={k} values={values:?}"),
        [None; 3],
        [
            ("values", Fill::Output(Expect::Exact(want))),
            ("indices", Fill::Output(indices)),
            ("x", Fill::Input(input)),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::CaseArg;
    use hk_format::abi::ScalarValue;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn picks_the_largest_in_descending_order() {
        let row = [3.0, -1.0, 7.0, 0.5, 7.5];
        assert_eq!(topk(&row, 3), [(7.5, 4), (7.0, 2), (3.0, 0)]);
        assert_eq!(topk(&row, 9).len(), 5, "k past the row takes the whole row");
        assert!(topk(&row, 0).is_empty());
    }

    #[test]
    fn nan_ranks_first_and_ties_keep_index_order() {
        let row = [
            1.0,
            f64::NAN,
            f64::INFINITY,
            1.0,
            f64::NEG_INFINITY,
            -0.0,
            0.0,
        ];
        let got = topk(&row, 7);
        assert!(got[0].0.is_nan() && got[0].1 == 1);
        let rest: Vec<_> = got[1..].iter().map(|&(_, i)| i).collect();
        assert_eq!(rest, [2, 0, 3, 6, 5, 4]);
    }

    #[test]
    fn cases_hold_reference_values_that_their_checker_accepts() {
        let cases = cases(&mut StdRng::seed_from_u64(4));
        assert_eq!(cases.len(), 3 * SHAPES.len());
        for case in &cases {
            let (
                CaseArg::Output {
                    expect: Expect::Exact(values),
                    ..
                },
                CaseArg::Input { data, .. },
            ) = (&case.args[0], &case.args[2])
            else {
                panic!("{}: values, indices, x come first", case.kernel);
            };
            let (n, k) = match (&case.args[4], &case.args[5]) {
                (CaseArg::Scalar(ScalarValue::U32(n)), CaseArg::Scalar(ScalarValue::U32(k))) => {
                    (*n as usize, *k as usize)
                }
                _ => panic!("{}: n and k are u32", case.kernel),
            };
            assert!(k <= MAX_K && k <= n, "{}", case.label);
            // The reference's own indices satisfy the index check; a repeated index does not.
            let indices: Vec<f64> = data
                .chunks(n)
                .flat_map(|row| topk(row, k))
                .map(|(_, i)| i as f64)
                .collect();
            let outputs = [
                Some(values.clone()),
                Some(indices.clone()),
                None,
                None,
                None,
                None,
            ];
            assert!(case.check(&outputs).is_ok(), "{}", case.label);
            if k > 1 {
                let mut repeated = indices;
                repeated[1] = repeated[0];
                let outputs = [Some(values.clone()), Some(repeated), None, None, None, None];
                assert!(case.check(&outputs).is_err(), "{}", case.label);
            }
        }
    }
}
