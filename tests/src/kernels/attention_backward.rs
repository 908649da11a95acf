//! Flash attention backward: the f64 reference and the cases of the kernels in
//! `kernels/attention_backward.hip` (`attn_bwd_delta_*`, `attn_bwd_dq_*`, `attn_bwd_dkdv_*`),
//! each kernel a case of its own, fed what the kernels before it would give it: the forward
//! pass's O and log-sum-exp (the f64 reference rounded to the element type and to f32) and
//! delta (rounded to f32).
//!
//! With `s(x)` the logit of a score ([`Scoring`]), `P = exp(s(Q Kᵀ) − LSE)` over the visible keys
//! ([`Mask`]), `dP = dO Vᵀ`, `delta_i = Σ_c dO_ic O_ic` and `dS = P ∘ (dP − delta) ∘ s'`:
//! `dQ = dS K`, `dK = dSᵀ Q`, `dV = Pᵀ dO`, dK and dV summed over the query heads of a group.
//!
//! Launch: the kernels' contracts (`manifests/attention_backward.toml`).

use hk_format::abi::{ScalarType, ScalarValue};
use rand::Rng;

use super::attention::{DIMS, Mask, Packed, Scoring, Shape, parallel_map, same, shape};
use crate::case::{Case, CaseArg, Expect, Planned};
use crate::host::{epsilon, random_rounded, round_to};

use ScalarType::{Bf16, F16};

/// Every kernel at mixed lengths with tails, GQA 4 and 8, MQA and MHA, causal with fewer
/// queries than keys (and more: rows that see no key), windows, soft-cap, empty sequences and
/// unaligned rows. Shorter than the forward pass's: the reference walks every pair of a
/// sequence three times.
fn shapes() -> Vec<Shape> {
    let mixed = same(&[1, 7, 100, 300]);
    let chunked = [(1, 200), (7, 90), (70, 200), (100, 40), (0, 20), (20, 0)];
    let mut shapes = Vec::new();
    for ty in [Bf16, F16] {
        for (i, dims) in DIMS.into_iter().enumerate() {
            let mut s = shape(ty, dims, &mixed, (8, 2));
            match i {
                0 => s.mask = Mask::CAUSAL,
                1 => s.softcap = Some(20.0),
                2 => {
                    s.mask = Mask {
                        left: Some(50),
                        right: Some(20),
                        ..Mask::NONE
                    }
                }
                _ => {
                    s.mask = Mask {
                        left: Some(40),
                        ..Mask::CAUSAL
                    }
                }
            }
            s.spread = 3.0;
            shapes.push(s);
            shapes.push(Shape {
                mask: Mask::CAUSAL,
                ..shape(ty, dims, &chunked, (2, 2))
            });
        }
    }
    shapes.push(Shape {
        mask: Mask::CAUSAL,
        ..shape(Bf16, (64, 64), &mixed, (16, 2))
    });
    shapes.push(Shape {
        softcap: Some(30.0),
        spread: 6.0,
        ..shape(F16, (128, 128), &mixed, (4, 1))
    });
    shapes.push(Shape {
        mask: Mask {
            left: Some(0),
            right: Some(0),
            ..Mask::NONE
        },
        ..shape(Bf16, (128, 128), &chunked, (2, 1))
    });
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
        pad: 5,
        softcap: Some(10.0),
        ..shape(Bf16, (256, 256), &chunked, (2, 1))
    });
    shapes
}

/// The three kernels' cases of every shape, with fresh random inputs.
pub fn plan(rng: &mut impl Rng) -> Vec<Planned> {
    shapes()
        .into_iter()
        .map(|s| Planned::new(symbols(&s), rng, move |rng| problem_cases(&s, rng)))
        .collect()
}

/// The kernels of one problem, in the order [`problem_cases`] makes their cases: delta, dQ,
/// dK and dV.
fn symbols(s: &Shape) -> [String; 3] {
    [
        format!("attn_bwd_delta_{}", s.ty.name()),
        format!("attn_bwd_dq_{}", s.suffix()),
        format!("attn_bwd_dkdv_{}", s.suffix()),
    ]
}

/// A gradient and its error bound, element by element.
struct Graded {
    want: Vec<f64>,
    bound: Vec<f64>,
}

impl Graded {
    fn zeros(len: usize) -> Self {
        Self {
            want: vec![0.0; len],
            bound: vec![0.0; len],
        }
    }
}

/// The reference of one (sequence, query head): dQ of its queries, and its shares of dK and dV
/// of its keys, each with the sums its error bound is made of.
struct HeadGrads {
    dq: Graded,
    dk: Graded,
    dv: Graded,
}

struct Inputs<'a> {
    q: Packed<'a>,
    k: Packed<'a>,
    v: Packed<'a>,
    d_o: Packed<'a>,
    /// The kernels' LSE and delta inputs, `[heads_q][total_q]`.
    lse: &'a [f64],
    delta: &'a [f64],
    total_q: usize,
}

/// Per-term relative error of a probability as the kernels compute it (see the README's
/// attention section): its rounding to the element type, exp2 and the f32 LSE, and the logit's
/// f32 dot product (d² 2^-24 |q| |k| scale at worst).
fn probability_error(ty: ScalarType, lse: f64, logit: f64) -> f64 {
    epsilon(ty) / 2.0 + 2f64.powi(-22) * (1.0 + lse.abs()) + logit
}

fn head_grads(
    x: &Inputs,
    (q0, sq, k0, sk): (usize, usize, usize, usize),
    h: usize,
    s: &Shape,
    scoring: Scoring,
) -> HeadGrads {
    let (d, dv) = (s.d, s.dv);
    let hk = h / (s.heads_q / s.heads_kv);
    let u = epsilon(s.ty) / 2.0;
    let logit_err = (d * d) as f64 * 2f64.powi(-24) * s.spread * scoring.scale;
    let dp_err = (dv * dv) as f64 * 2f64.powi(-24);
    let mut g = HeadGrads {
        dq: Graded::zeros(sq * d),
        dk: Graded::zeros(sk * d),
        dv: Graded::zeros(sk * dv),
    };
    for i in 0..sq {
        let at = h * x.total_q + q0 + i;
        let (lse, delta) = (x.lse[at], x.delta[at]);
        let qi = x.q.row(q0 + i, h);
        let doi = x.d_o.row(q0 + i, h);
        let visible: Vec<usize> = (0..sk).filter(|&j| s.mask.visible(i, j, sq, sk)).collect();
        let n = visible.len() as f64;
        for &j in &visible {
            let kj = x.k.row(k0 + j, hk);
            let vj = x.v.row(k0 + j, hk);
            let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
            let logit = scoring.logit(dot);
            let p = (logit - lse).exp();
            let dp: f64 = doi.iter().zip(vj).map(|(a, b)| a * b).sum();
            // s'(x) / scale: 1 - tanh² under a soft-cap.
            let slope = scoring.softcap.map_or(1.0, |c| 1.0 - (logit / c).powi(2));
            let ds = p * (dp - delta) * slope;
            let e_p = probability_error(s.ty, lse, logit_err);
            // The soft-cap's slope is recovered from the probability: 2 |u| δu at most.
            let e_slope = scoring
                .softcap
                .map_or(0.0, |c| 2.0 * (e_p + 2f64.powi(-22)) / c);
            let ds_err =
                p * ((dp - delta).abs() * (e_p + u + e_slope + n * 2f64.powi(-24)) + dp_err);
            for c in 0..d {
                g.dq.want[i * d + c] += scoring.scale * ds * kj[c];
                g.dq.bound[i * d + c] += scoring.scale * (ds_err + u * ds.abs()) * kj[c].abs();
                g.dk.want[j * d + c] += scoring.scale * ds * qi[c];
                g.dk.bound[j * d + c] += scoring.scale * (ds_err + u * ds.abs()) * qi[c].abs();
            }
            for (c, &g_o) in doi.iter().enumerate() {
                g.dv.want[j * dv + c] += p * g_o;
                g.dv.bound[j * dv + c] += p * (e_p + n * 2f64.powi(-24)) * g_o.abs();
            }
        }
    }
    g
}

fn problem_cases(s: &Shape, rng: &mut impl Rng) -> Vec<Case> {
    let (ty, d, dv, pad) = (s.ty, s.d, s.dv, s.pad);
    let (heads_q, heads_kv) = (s.heads_q, s.heads_kv);
    let (cu_q, cu_k) = s.offsets();
    let total_q = (*cu_q.last().unwrap()).max(1);
    let total_k = (*cu_k.last().unwrap()).max(1);
    let (ldq, ldk, ldv, lddo) = (
        heads_q * d + pad,
        heads_kv * d + pad,
        heads_kv * dv + pad,
        heads_q * dv + pad,
    );
    let ld_lse = total_q + pad;
    let q = random_rounded(rng, ty, total_q * ldq, 0.0, s.spread);
    let k = random_rounded(rng, ty, total_k * ldk, 0.0, 1.0);
    let v = random_rounded(rng, ty, total_k * ldv, 0.0, 1.0);
    let d_o = random_rounded(rng, ty, total_q * lddo, 0.0, 1.0);
    let scoring = Scoring {
        scale: 1.0 / (d as f64).sqrt(),
        softcap: s.softcap,
    };
    let packed = |data, heads, dim, ld| Packed {
        data,
        heads,
        dim,
        ld,
    };
    let (qp, kp, vp, dop) = (
        packed(&q, heads_q, d, ldq),
        packed(&k, heads_kv, d, ldk),
        packed(&v, heads_kv, dv, ldv),
        packed(&d_o, heads_q, dv, lddo),
    );
    let seqs: Vec<(usize, usize)> = (0..s.seqs.len())
        .flat_map(|b| (0..heads_q).map(move |h| (b, h)))
        .collect();
    let span = |b: usize| {
        (
            cu_q[b],
            cu_q[b + 1] - cu_q[b],
            cu_k[b],
            cu_k[b + 1] - cu_k[b],
        )
    };

    // The forward pass, as its kernels would have left it: O rounded to the element type (rows
    // ldo = lddo apart, so that delta's case reads both with one stride), LSE to f32.
    let forward = parallel_map(&seqs, |&(b, h)| {
        super::attention::attend(&qp, &kp, &vp, span(b), h, s.mask, scoring)
    });
    let ldo = lddo;
    let mut o = vec![0.0; total_q * ldo];
    let mut lse = vec![f64::NEG_INFINITY; heads_q * total_q];
    for (&(b, h), (out, l)) in seqs.iter().zip(&forward) {
        for (i, row) in out.chunks(dv).enumerate() {
            for (c, &x) in row.iter().enumerate() {
                o[(cu_q[b] + i) * ldo + h * dv + c] = round_to(ty, x);
            }
        }
        for (i, &x) in l.iter().enumerate() {
            lse[h * total_q + cu_q[b] + i] = x as f32 as f64;
        }
    }
    // delta from the rounded O, and as the next kernels read it, in f32.
    let mut delta = vec![0.0; heads_q * total_q];
    let mut delta_bound = vec![0.0; heads_q * total_q];
    for t in 0..total_q {
        for h in 0..heads_q {
            let (orow, grow) = (&o[t * ldo + h * dv..][..dv], dop.row(t, h));
            delta[h * total_q + t] = orow.iter().zip(grow).map(|(a, b)| a * b).sum();
            let magnitude: f64 = orow.iter().zip(grow).map(|(a, b)| (a * b).abs()).sum();
            delta_bound[h * total_q + t] = dv as f64 * 2f64.powi(-23) * magnitude + 1e-30;
        }
    }
    let delta_f32: Vec<f64> = delta.iter().map(|&x| x as f32 as f64).collect();
    // The stat arrays with their padded rows, as the kernels are given them.
    let padded = |values: &[f64]| -> Vec<f64> {
        values
            .chunks(total_q)
            .flat_map(|r| {
                r.iter()
                    .copied()
                    .chain(std::iter::repeat_n(0.0, ld_lse - total_q))
            })
            .collect()
    };

    let inputs = Inputs {
        q: qp,
        k: kp,
        v: vp,
        d_o: dop,
        lse: &lse,
        delta: &delta_f32,
        total_q,
    };
    let grads = parallel_map(&seqs, |&(b, h)| head_grads(&inputs, span(b), h, s, scoring));
    let mut dq = Graded::zeros(total_q * heads_q * d);
    let mut dk = Graded::zeros(total_k * heads_kv * d);
    let mut dvg = Graded::zeros(total_k * heads_kv * dv);
    let group = heads_q / heads_kv;
    for (&(b, h), g) in seqs.iter().zip(&grads) {
        let (q0, sq, k0, sk) = span(b);
        let hk = h / group;
        for i in 0..sq {
            for c in 0..d {
                let at = (q0 + i) * heads_q * d + h * d + c;
                dq.want[at] = g.dq.want[i * d + c];
                dq.bound[at] = g.dq.bound[i * d + c];
            }
        }
        for j in 0..sk {
            for c in 0..d {
                let at = (k0 + j) * heads_kv * d + hk * d + c;
                dk.want[at] += g.dk.want[j * d + c];
                dk.bound[at] += g.dk.bound[j * d + c];
            }
            for c in 0..dv {
                let at = (k0 + j) * heads_kv * dv + hk * dv + c;
                dvg.want[at] += g.dv.want[j * dv + c];
                dvg.bound[at] += g.dv.bound[j * dv + c];
            }
        }
    }
    // The output's own rounding, and a floor for subnormal f16 results.
    let finish = |g: &mut Graded| {
        for (w, b) in g.want.iter().zip(g.bound.iter_mut()) {
            *b += epsilon(ty) / 2.0 * w.abs() + 1e-7;
        }
    };
    finish(&mut dq);
    finish(&mut dk);
    finish(&mut dvg);

    let cu = |c: &[usize]| c.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let label = format!(
        "seqs={:?} heads={heads_q}/{heads_kv} {:?} softcap={:?} spread={} pad={pad}",
        s.seqs, s.mask, s.softcap, s.spread
    );
    let (ldd_q, ldd_k, ldd_v) = (heads_q * d + pad, heads_kv * d + pad, heads_kv * dv + pad);
    let bounded = |name, g: Graded, row_len, stride, rows| CaseArg::Output {
        name,
        elem: ty,
        len: rows * stride,
        expect: Expect::StridedBounded {
            want: g.want,
            bound: g.bound,
            row_len,
            stride,
        },
    };
    let scalar_u32 = |x: usize| {
        CaseArg::Scalar(ScalarValue::U32(
            u32::try_from(x).expect("test sizes fit u32"),
        ))
    };
    let common = |max_seqlen: usize| {
        vec![
            CaseArg::input("lse", ScalarType::F32, padded(&lse)),
            CaseArg::input("delta", ScalarType::F32, padded(&delta_f32)),
            CaseArg::input("cu_seqlens_q", ScalarType::I32, cu(&cu_q)),
            CaseArg::input("cu_seqlens_k", ScalarType::I32, cu(&cu_k)),
            scalar_u32(s.seqs.len()),
            scalar_u32(total_q),
            scalar_u32(total_k),
            scalar_u32(max_seqlen.max(1)),
            scalar_u32(heads_q),
            scalar_u32(heads_kv),
            scalar_u32(ldq),
            scalar_u32(ldk),
            scalar_u32(ldv),
            scalar_u32(lddo),
            scalar_u32(ld_lse),
            CaseArg::Scalar(ScalarValue::F32(scoring.scale as f32)),
            CaseArg::Scalar(ScalarValue::F32(s.softcap.unwrap_or(0.0) as f32)),
            scalar_u32(usize::from(s.mask.causal)),
            CaseArg::Scalar(ScalarValue::I32(s.mask.left.map_or(-1, |x| x as i32))),
            CaseArg::Scalar(ScalarValue::I32(s.mask.right.map_or(-1, |x| x as i32))),
        ]
    };
    let max_q = s.seqs.iter().map(|&(a, _)| a).max().unwrap_or(0);
    let max_k = s.seqs.iter().map(|&(_, b)| b).max().unwrap_or(0);

    let [delta_symbol, dq_symbol, dkdv_symbol] = symbols(s);
    let delta_case = Case {
        kernel: delta_symbol,
        label: label.clone(),
        args: vec![
            CaseArg::Output {
                name: "delta",
                elem: ScalarType::F32,
                len: heads_q * ld_lse,
                expect: Expect::StridedBounded {
                    want: delta,
                    bound: delta_bound,
                    row_len: total_q,
                    stride: ld_lse,
                },
            },
            CaseArg::input("o", ty, o),
            CaseArg::input("d_o", ty, d_o.clone()),
            scalar_u32(total_q),
            scalar_u32(heads_q),
            scalar_u32(dv),
            scalar_u32(ldo),
            scalar_u32(lddo),
            scalar_u32(ld_lse),
        ],
        grid: [None, None, None],
    };
    let mut dq_args = vec![
        bounded("dq", dq, heads_q * d, ldd_q, total_q),
        CaseArg::input("q", ty, q.clone()),
        CaseArg::input("k", ty, k.clone()),
        CaseArg::input("v", ty, v.clone()),
        CaseArg::input("d_o", ty, d_o.clone()),
        scalar_u32(ldd_q),
    ];
    dq_args.extend(common(max_q));
    let mut dkdv_args = vec![
        bounded("dk", dk, heads_kv * d, ldd_k, total_k),
        bounded("dv", dvg, heads_kv * dv, ldd_v, total_k),
        CaseArg::input("q", ty, q),
        CaseArg::input("k", ty, k),
        CaseArg::input("v", ty, v),
        CaseArg::input("d_o", ty, d_o),
        scalar_u32(ldd_k),
        scalar_u32(ldd_v),
    ];
    dkdv_args.extend(common(max_k));
    vec![
        delta_case,
        Case {
            kernel: dq_symbol,
            label: label.clone(),
            args: dq_args,
            grid: [None, None, None],
        },
        Case {
            kernel: dkdv_symbol,
            label,
            args: dkdv_args,
            grid: [None, None, None],
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// The reference's gradients against central differences of the forward reference's loss
    /// sum(O ∘ dO), on a tiny problem with a soft-cap and a causal window.
    #[test]
    fn gradients_match_finite_differences() {
        let mut rng = StdRng::seed_from_u64(11);
        let (sq, sk, d, dv) = (3, 5, 4, 3);
        let q: Vec<f64> = (0..sq * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let k: Vec<f64> = (0..sk * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let v: Vec<f64> = (0..sk * dv).map(|_| rng.random_range(-1.0..1.0)).collect();
        let d_o: Vec<f64> = (0..sq * dv).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mask = Mask {
            left: Some(2),
            ..Mask::CAUSAL
        };
        let scoring = Scoring {
            scale: 0.7,
            softcap: Some(1.5),
        };
        let s = Shape {
            mask,
            softcap: scoring.softcap,
            ..shape(Bf16, (d, dv), &[(sq, sk)], (1, 1))
        };
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            let p = |data, dim| Packed {
                data,
                heads: 1,
                dim,
                ld: dim,
            };
            let (o, _) = super::super::attention::attend(
                &p(q, d),
                &p(k, d),
                &p(v, dv),
                (0, sq, 0, sk),
                0,
                mask,
                scoring,
            );
            o.iter().zip(&d_o).map(|(a, b)| a * b).sum()
        };
        let p = |data, dim| Packed {
            data,
            heads: 1,
            dim,
            ld: dim,
        };
        let (o, lse) = super::super::attention::attend(
            &p(&q, d),
            &p(&k, d),
            &p(&v, dv),
            (0, sq, 0, sk),
            0,
            mask,
            scoring,
        );
        let delta: Vec<f64> = (0..sq)
            .map(|i| (0..dv).map(|c| o[i * dv + c] * d_o[i * dv + c]).sum())
            .collect();
        let x = Inputs {
            q: p(&q, d),
            k: p(&k, d),
            v: p(&v, dv),
            d_o: p(&d_o, dv),
            lse: &lse,
            delta: &delta,
            total_q: sq,
        };
        let g = head_grads(&x, (0, sq, 0, sk), 0, &s, scoring);
        let h = 1e-6;
        let numeric = |which: usize, at: usize| {
            let mut bufs = [q.clone(), k.clone(), v.clone()];
            bufs[which][at] += h;
            let up = loss(&bufs[0], &bufs[1], &bufs[2]);
            bufs[which][at] -= 2.0 * h;
            let down = loss(&bufs[0], &bufs[1], &bufs[2]);
            (up - down) / (2.0 * h)
        };
        for (which, want) in [(0, &g.dq.want), (1, &g.dk.want), (2, &g.dv.want)] {
            for (at, &w) in want.iter().enumerate() {
                let n = numeric(which, at);
                assert!(
                    (n - w).abs() < 1e-6,
                    "tensor {which} element {at}: {w} against {n}"
                );
            }
        }
    }

    #[test]
    fn cases_accept_their_reference_and_refuse_an_error() {
        let mut rng = StdRng::seed_from_u64(12);
        let small: Vec<Shape> = shapes()
            .into_iter()
            .filter(|s| s.d == 64 || s.pad == 1)
            .collect();
        assert!(!small.is_empty());
        for s in small {
            for case in problem_cases(&s, &mut rng) {
                let wants: Vec<Option<Vec<f64>>> = case
                    .args
                    .iter()
                    .map(|arg| match arg {
                        CaseArg::Output {
                            expect:
                                Expect::StridedBounded {
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
                assert!(case.check(&wants).is_ok(), "{} {}", case.kernel, case.label);
                // The largest output off by ten times its bound fails.
                let mut off = wants.clone();
                let (
                    Some(out),
                    CaseArg::Output {
                        expect:
                            Expect::StridedBounded {
                                want,
                                bound,
                                row_len,
                                stride,
                            },
                        ..
                    },
                ) = (off[0].as_mut(), &case.args[0])
                else {
                    panic!("the first argument is a bounded output");
                };
                let (at, _) = want
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                    .unwrap();
                out[at / row_len * stride + at % row_len] += 10.0 * bound[at];
                assert!(case.check(&off).is_err(), "{} {}", case.kernel, case.label);
            }
        }
    }
}
