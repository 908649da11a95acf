//! Flash attention forward: the f64 reference and the cases of the kernels in
//! `kernels/attention.hip`.
//!
//! Symbols: `attn_fwd_d{64,128,256}_{bf16,f16}` and `attn_fwd_d192_dv128_{bf16,f16}`, over
//! packed variable-length sequences: Q `[total_q, heads_q, d]`, K `[total_k, heads_kv, d]`,
//! V `[total_k, heads_kv, dv]`, O `[total_q, heads_q, dv]` (token rows `ld*` apart) and the
//! log-sum-exp `[heads_q, total_q]` (rows `ld_lse` apart), sequence `b` at rows
//! `cu_seqlens[b] .. cu_seqlens[b + 1]`; which keys a query sees is [`Mask`].
//!
//! Launch: the kernels' contract (`manifests/attention.toml`).

use hk_format::abi::{ScalarType, ScalarValue};
use rand::Rng;

use crate::case::{Case, CaseArg, Expect, Planned, grid_label};
use crate::host::{epsilon, random_rounded};

/// Which keys query `i` of a sequence of `sq` queries and `sk` keys sees: `j < sk` and, with the
/// diagonal `d = i + sk - sq` (causal attention aligned bottom-right), `d - left <= j` and
/// `j <= d + right` for the bounds that are set; `causal` sets `right` to 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mask {
    pub causal: bool,
    pub left: Option<usize>,
    pub right: Option<usize>,
}

impl Mask {
    pub const NONE: Mask = Mask {
        causal: false,
        left: None,
        right: None,
    };
    pub const CAUSAL: Mask = Mask {
        causal: true,
        ..Mask::NONE
    };

    pub fn visible(&self, i: usize, j: usize, sq: usize, sk: usize) -> bool {
        let d = i as i64 + sk as i64 - sq as i64;
        let j = j as i64;
        let right = if self.causal { Some(0) } else { self.right };
        j < sk as i64
            && self.left.is_none_or(|l| j >= d - l as i64)
            && right.is_none_or(|r| j <= d + r as i64)
    }

    fn window_arg(bound: Option<usize>) -> i32 {
        bound.map_or(-1, |b| b as i32)
    }
}

/// How scores become logits: `x · scale`, or `c · tanh(x · scale / c)` with a soft-cap `c`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scoring {
    pub scale: f64,
    pub softcap: Option<f64>,
}

impl Scoring {
    pub fn logit(&self, x: f64) -> f64 {
        match self.softcap {
            Some(c) => c * (x * self.scale / c).tanh(),
            None => x * self.scale,
        }
    }
}

/// Packed attention inputs: rows of `heads · dim` values per token, `ld` apart.
pub struct Packed<'a> {
    pub data: &'a [f64],
    pub heads: usize,
    pub dim: usize,
    pub ld: usize,
}

impl Packed<'_> {
    pub fn row(&self, token: usize, head: usize) -> &[f64] {
        let at = token * self.ld + head * self.dim;
        &self.data[at..at + self.dim]
    }
}

/// The reference of one sequence `(q0, sq, k0, sk)` (first rows and lengths) and query head
/// `h`: `(outputs [sq][dv], lse [sq])`, a query that sees no key giving zeros and −∞.
pub fn attend(
    q: &Packed,
    k: &Packed,
    v: &Packed,
    (q0, sq, k0, sk): (usize, usize, usize, usize),
    h: usize,
    mask: Mask,
    scoring: Scoring,
) -> (Vec<f64>, Vec<f64>) {
    let hk = h / (q.heads / k.heads);
    let mut out = vec![0.0; sq * v.dim];
    let mut lse = vec![f64::NEG_INFINITY; sq];
    for i in 0..sq {
        let qi = q.row(q0 + i, h);
        let logits: Vec<(usize, f64)> = (0..sk)
            .filter(|&j| mask.visible(i, j, sq, sk))
            .map(|j| {
                let dot = qi.iter().zip(k.row(k0 + j, hk)).map(|(a, b)| a * b).sum();
                (j, scoring.logit(dot))
            })
            .collect();
        let Some(max) = logits.iter().map(|&(_, x)| x).reduce(f64::max) else {
            continue;
        };
        let sum: f64 = logits.iter().map(|&(_, x)| (x - max).exp()).sum();
        lse[i] = max + sum.ln();
        let o = &mut out[i * v.dim..(i + 1) * v.dim];
        for &(j, x) in &logits {
            let p = (x - max).exp() / sum;
            for (o, vj) in o.iter_mut().zip(v.row(k0 + j, hk)) {
                *o += p * vj;
            }
        }
    }
    (out, lse)
}

/// One call: sequences of `(queries, keys)`, heads, head dims, options and layout (the
/// forward and backward cases' alike).
#[derive(Debug, Clone)]
pub(super) struct Shape {
    pub ty: ScalarType,
    pub d: usize,
    pub dv: usize,
    pub seqs: Vec<(usize, usize)>,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub mask: Mask,
    pub softcap: Option<f64>,
    /// Q's values are drawn from ±spread (K's and V's from ±1): larger logits, peakier rows.
    pub spread: f64,
    /// Elements added to every row stride (odd: rows not 16-byte aligned, the element path).
    pub pad: usize,
    /// Blocks along x instead of the contract's (they stride over a sequence's query blocks).
    pub grid_x: Option<u32>,
}

impl Shape {
    /// The sequences' first rows, `cu_seqlens_q` and `cu_seqlens_k` (batch + 1 each).
    pub fn offsets(&self) -> (Vec<usize>, Vec<usize>) {
        let mut cu_q = vec![0usize];
        let mut cu_k = vec![0usize];
        for &(sq, sk) in &self.seqs {
            cu_q.push(cu_q.last().unwrap() + sq);
            cu_k.push(cu_k.last().unwrap() + sk);
        }
        (cu_q, cu_k)
    }

    /// The kernels' name for its head shape and type: `d128_bf16`, `d192_dv128_f16`.
    pub fn suffix(&self) -> String {
        let (d, dv, ty) = (self.d, self.dv, self.ty.name());
        match d == dv {
            true => format!("d{d}_{ty}"),
            false => format!("d{d}_dv{dv}_{ty}"),
        }
    }
}

pub(super) fn shape(
    ty: ScalarType,
    (d, dv): (usize, usize),
    seqs: &[(usize, usize)],
    heads: (usize, usize),
) -> Shape {
    Shape {
        ty,
        d,
        dv,
        seqs: seqs.to_vec(),
        heads_q: heads.0,
        heads_kv: heads.1,
        mask: Mask::NONE,
        softcap: None,
        spread: 1.0,
        pad: 8,
        grid_x: None,
    }
}

pub(super) fn same(lengths: &[usize]) -> Vec<(usize, usize)> {
    lengths.iter().map(|&n| (n, n)).collect()
}

pub(super) const DIMS: [(usize, usize); 4] = [(64, 64), (128, 128), (256, 256), (192, 128)];
use ScalarType::{Bf16, F16};

/// The cases: every kernel at mixed lengths 1 to 4097 (the longest with few heads, as the f64
/// reference is quadratic), GQA ratios 1, 4 and 8 and MQA, causal with fewer queries than keys
/// (and more, where the first queries see nothing), sliding windows, soft-cap, empty sequences,
/// unaligned rows, and fewer blocks than query blocks.
fn shapes() -> Vec<Shape> {
    let mixed = same(&[1, 7, 128, 1000, 300]);
    let long = same(&[1, 7, 128, 1000, 4097]);
    let chunked = [
        (1, 1000),
        (7, 300),
        (100, 1000),
        (64, 64),
        (200, 130),
        (0, 50),
        (30, 0),
    ];
    let mut shapes = Vec::new();
    for ty in [Bf16, F16] {
        for (i, dims) in DIMS.into_iter().enumerate() {
            // Each kernel with GQA 4, and each with a different option.
            let mut s = shape(ty, dims, &mixed, (8, 2));
            match i {
                0 => s.mask = Mask::CAUSAL,
                1 => s.softcap = Some(20.0),
                2 => {
                    s.mask = Mask {
                        left: Some(100),
                        right: Some(30),
                        ..Mask::NONE
                    }
                }
                _ => {
                    s.mask = Mask {
                        left: Some(64),
                        ..Mask::CAUSAL
                    }
                }
            }
            s.spread = 4.0;
            shapes.push(s);
            // Each kernel, causal, with chunked prefill's fewer queries than keys.
            shapes.push(Shape {
                mask: Mask::CAUSAL,
                ..shape(ty, dims, &chunked, (4, 4))
            });
        }
    }
    // Length 4097 in a mixed batch: MHA causal, and MQA without a mask.
    shapes.push(Shape {
        mask: Mask::CAUSAL,
        ..shape(Bf16, (128, 128), &long, (2, 2))
    });
    shapes.push(shape(F16, (64, 64), &long, (4, 1)));
    // GQA 8, and MQA with a soft-cap and peaky rows.
    shapes.push(Shape {
        mask: Mask::CAUSAL,
        ..shape(Bf16, (64, 64), &mixed, (16, 2))
    });
    shapes.push(Shape {
        softcap: Some(30.0),
        spread: 8.0,
        ..shape(F16, (128, 128), &mixed, (4, 1))
    });
    // Windows that leave rows with no key at all: one-sided, and the diagonal alone.
    shapes.push(Shape {
        mask: Mask {
            left: Some(0),
            right: Some(0),
            ..Mask::NONE
        },
        ..shape(Bf16, (64, 64), &chunked, (2, 1))
    });
    shapes.push(Shape {
        mask: Mask {
            left: Some(0),
            right: None,
            ..Mask::NONE
        },
        ..shape(F16, (256, 256), &chunked, (2, 2))
    });
    // Rows that are not 16-byte aligned (the element-by-element copies), and one block along x
    // for a sequence of 16 query blocks.
    shapes.push(Shape {
        pad: 3,
        mask: Mask::CAUSAL,
        ..shape(Bf16, (128, 128), &mixed, (4, 2))
    });
    shapes.push(Shape {
        pad: 1,
        ..shape(F16, (192, 128), &chunked, (2, 1))
    });
    shapes.push(Shape {
        grid_x: Some(1),
        ..shape(Bf16, (64, 64), &same(&[1000, 17]), (2, 2))
    });
    shapes
}

/// Every forward kernel's cases, with fresh random inputs.
pub fn plan(rng: &mut impl Rng) -> Vec<Planned> {
    shapes()
        .into_iter()
        .map(|s| Planned::one(symbol(&s), rng, move |rng| case(s, rng)))
        .collect()
}

/// The forward kernel of shape `s`.
fn symbol(s: &Shape) -> String {
    format!("attn_fwd_{}", s.suffix())
}

fn case(s: Shape, rng: &mut impl Rng) -> Case {
    let Shape {
        ty,
        d,
        dv,
        heads_q,
        heads_kv,
        mask,
        softcap,
        spread,
        pad,
        ..
    } = s;
    let (cu_q, cu_k) = s.offsets();
    // A batch whose every sequence is empty still passes one row of each.
    let total_q = (*cu_q.last().unwrap()).max(1);
    let total_k = (*cu_k.last().unwrap()).max(1);
    let (ldq, ldk, ldv, ldo) = (
        heads_q * d + pad,
        heads_kv * d + pad,
        heads_kv * dv + pad,
        heads_q * dv + pad,
    );
    let ld_lse = total_q + pad;
    let q = random_rounded(rng, ty, total_q * ldq, 0.0, spread);
    let k = random_rounded(rng, ty, total_k * ldk, 0.0, 1.0);
    let v = random_rounded(rng, ty, total_k * ldv, 0.0, 1.0);
    let scoring = Scoring {
        scale: 1.0 / (d as f64).sqrt(),
        softcap,
    };

    let (q_p, k_p, v_p) = (
        Packed {
            data: &q,
            heads: heads_q,
            dim: d,
            ld: ldq,
        },
        Packed {
            data: &k,
            heads: heads_kv,
            dim: d,
            ld: ldk,
        },
        Packed {
            data: &v,
            heads: heads_kv,
            dim: dv,
            ld: ldv,
        },
    );
    let mut o_want = vec![0.0; total_q * heads_q * dv];
    let mut lse_want = vec![f64::NEG_INFINITY; heads_q * total_q];
    let jobs: Vec<(usize, usize)> = (0..s.seqs.len())
        .flat_map(|b| (0..heads_q).map(move |h| (b, h)))
        .collect();
    let results = parallel_map(&jobs, |&(b, h)| {
        let span = (
            cu_q[b],
            cu_q[b + 1] - cu_q[b],
            cu_k[b],
            cu_k[b + 1] - cu_k[b],
        );
        attend(&q_p, &k_p, &v_p, span, h, mask, scoring)
    });
    for (&(b, h), (out, lse)) in jobs.iter().zip(results) {
        for (i, row) in out.chunks(dv.max(1)).enumerate() {
            let at = (cu_q[b] + i) * heads_q * dv + h * dv;
            o_want[at..at + dv].copy_from_slice(row);
        }
        lse_want[h * total_q + cu_q[b]..h * total_q + cu_q[b + 1]].copy_from_slice(&lse);
    }

    // Error bound (see the README's attention section): the probabilities rounded to the element
    // type and O's own rounding, an ulp of |V| ≤ 1 in all; the f32 sums over up to sk keys;
    // the logits' f32 dot products, d² 2^-24 |q| |k| scale at worst, which move O and the LSE
    // by as much.
    let sk_max = s.seqs.iter().map(|&(_, sk)| sk).max().unwrap_or(0) as f64;
    let logit = (d * d) as f64 * 2f64.powi(-24) * spread * scoring.scale;
    let o_abs = epsilon(ty) + sk_max * 2f64.powi(-22) + 2.0 * logit + 1e-6;
    let lse_abs = logit + sk_max * 2f64.powi(-23) + 1e-6;
    let cu = |c: &[usize]| c.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let seqs: Vec<String> = s
        .seqs
        .iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}/{b}")
            }
        })
        .collect();
    Case {
        kernel: symbol(&s),
        label: format!(
            "seqs=[{}] heads={heads_q}/{heads_kv} {mask:?} softcap={softcap:?} spread={spread} pad={pad}{}",
            seqs.join(","),
            grid_label([s.grid_x, None, None])
        ),
        args: vec![
            CaseArg::Output {
                name: "o",
                elem: ty,
                len: total_q * ldo,
                expect: Expect::StridedClose {
                    want: o_want,
                    row_len: heads_q * dv,
                    stride: ldo,
                    abs: o_abs,
                    rel: 0.0,
                },
            },
            CaseArg::Output {
                name: "lse",
                elem: ScalarType::F32,
                len: heads_q * ld_lse,
                expect: Expect::StridedClose {
                    want: lse_want,
                    row_len: total_q,
                    stride: ld_lse,
                    abs: lse_abs,
                    rel: 2f64.powi(-23),
                },
            },
            CaseArg::input("q", ty, q),
            CaseArg::input("k", ty, k),
            CaseArg::input("v", ty, v),
            CaseArg::input("cu_seqlens_q", ScalarType::I32, cu(&cu_q)),
            CaseArg::input("cu_seqlens_k", ScalarType::I32, cu(&cu_k)),
            u32_arg(s.seqs.len()),
            u32_arg(total_q),
            u32_arg(total_k),
            u32_arg(s.seqs.iter().map(|&(sq, _)| sq).max().unwrap_or(0).max(1)),
            u32_arg(heads_q),
            u32_arg(heads_kv),
            u32_arg(ldq),
            u32_arg(ldk),
            u32_arg(ldv),
            u32_arg(ldo),
            u32_arg(ld_lse),
            CaseArg::Scalar(ScalarValue::F32(scoring.scale as f32)),
            CaseArg::Scalar(ScalarValue::F32(softcap.unwrap_or(0.0) as f32)),
            u32_arg(usize::from(mask.causal)),
            CaseArg::Scalar(ScalarValue::I32(Mask::window_arg(mask.left))),
            CaseArg::Scalar(ScalarValue::I32(Mask::window_arg(mask.right))),
        ],
        grid: [s.grid_x, None, None],
    }
}

fn u32_arg(x: usize) -> CaseArg {
    CaseArg::Scalar(ScalarValue::U32(
        u32::try_from(x).expect("test sizes fit u32"),
    ))
}

/// `f` over `items` on every core: the f64 reference of a long sequence takes seconds alone.
pub fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    let done = std::sync::Mutex::new(&mut slots);
    std::thread::scope(|scope| {
        for _ in 0..threads.min(items.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    done.lock().expect("no worker panics while holding it")[i] = Some(r);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|r| r.expect("every item ran"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn packed(data: &[f64], dim: usize) -> Packed<'_> {
        Packed {
            data,
            heads: 1,
            dim,
            ld: dim,
        }
    }

    #[test]
    fn masks_align_bottom_right() {
        // 2 queries, 4 keys: query 0 sits at diagonal 2, query 1 at 3.
        let causal = Mask::CAUSAL;
        assert!(causal.visible(0, 2, 2, 4) && !causal.visible(0, 3, 2, 4));
        assert!(causal.visible(1, 3, 2, 4));
        // More queries than keys: the first ones see nothing.
        assert!(!causal.visible(0, 0, 4, 2) && !causal.visible(1, 0, 4, 2));
        assert!(causal.visible(2, 0, 4, 2));
        let window = Mask {
            left: Some(1),
            right: Some(0),
            ..Mask::NONE
        };
        assert!(
            !window.visible(5, 3, 8, 8) && window.visible(5, 4, 8, 8) && window.visible(5, 5, 8, 8)
        );
        assert!(!window.visible(5, 6, 8, 8));
        assert!(!Mask::NONE.visible(0, 4, 1, 4));
    }

    #[test]
    fn attention_of_hand_computed_rows() {
        // One query against two keys with logits 0 and ln 3: weights 1/4 and 3/4.
        let q = [1.0];
        let k = [0.0, 3f64.ln()];
        let v = [2.0, 6.0];
        let scoring = Scoring {
            scale: 1.0,
            softcap: None,
        };
        let (out, lse) = attend(
            &packed(&q, 1),
            &packed(&k, 1),
            &packed(&v, 1),
            (0, 1, 0, 2),
            0,
            Mask::NONE,
            scoring,
        );
        assert!((out[0] - 5.0).abs() < 1e-12, "{out:?}");
        assert!((lse[0] - 4f64.ln()).abs() < 1e-12, "{lse:?}");
        // Causal with one query aligned to the last key sees both; a window of 0 only the last.
        let (out, _) = attend(
            &packed(&q, 1),
            &packed(&k, 1),
            &packed(&v, 1),
            (0, 1, 0, 2),
            0,
            Mask {
                left: Some(0),
                ..Mask::CAUSAL
            },
            scoring,
        );
        assert_eq!(out, [6.0]);
        // No key: zeros and -inf.
        let (out, lse) = attend(
            &packed(&q, 1),
            &packed(&k, 1),
            &packed(&v, 1),
            (0, 1, 0, 0),
            0,
            Mask::NONE,
            scoring,
        );
        assert_eq!((out[0], lse[0]), (0.0, f64::NEG_INFINITY));
        // The soft-cap bounds the logits: c tanh(x / c).
        let capped = Scoring {
            scale: 1.0,
            softcap: Some(2.0),
        };
        assert!((capped.logit(100.0) - 2.0).abs() < 1e-12);
    }

    #[test]
    fn cases_accept_their_reference_and_refuse_an_error() {
        let cases: Vec<Case> = shapes()
            .into_iter()
            .filter(|s| s.seqs.iter().all(|&(sq, sk)| sq * sk <= 300 * 1000))
            .map(|s| case(s, &mut StdRng::seed_from_u64(7)))
            .collect();
        assert!(!cases.is_empty());
        for case in &cases {
            let wants: Vec<Option<Vec<f64>>> = case
                .args
                .iter()
                .map(|arg| match arg {
                    CaseArg::Output {
                        expect:
                            Expect::StridedClose {
                                want,
                                row_len,
                                stride,
                                ..
                            },
                        ..
                    } => Some(
                        want.chunks(*row_len)
                            .flat_map(|r| {
                                r.iter()
                                    .copied()
                                    .chain(std::iter::repeat_n(f64::NAN, stride - row_len))
                            })
                            .collect(),
                    ),
                    _ => None,
                })
                .collect();
            assert!(case.check(&wants).is_ok(), "{}", case.label);
            // An output off by 3 ulp of |V| fails.
            let mut off = wants.clone();
            let o = off[0].as_mut().unwrap();
            let at = o.iter().position(|x| x.is_finite()).unwrap();
            o[at] += 3.0 * epsilon(ScalarType::Bf16);
            assert!(case.check(&off).is_err(), "{}", case.label);
        }
    }
}
