//! Causal depthwise 1-D convolution (Mamba's `causal_conv1d`): the f64 reference and the
//! cases of the kernels in `kernels/causal_conv1d.hip`.
//!
//! Symbols: `causal_conv1d_{bf16,f16,f32}` and `causal_conv1d_bias_silu_{bf16,f16,f32}`. Input
//! `x` is `[batch, dim, seqlen]`, the filter `weight` is `[dim, width]` (and `bias` is `[dim]`),
//! all in the one element type; `out` has the shape of `x`.

use hk_format::abi::{ScalarType, ScalarValue};
use rand::Rng;

use crate::case::{Case, CaseArg};
use crate::host::{epsilon, random_rounded};

/// The shape of one causal convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    pub batch: usize,
    pub dim: usize,
    pub seqlen: usize,
    pub width: usize,
}

/// `out[b, c, t] = Σ_k weight[c, k] · x[b, c, t − (width − 1) + k]`, with `x` taken as zero
/// before `t = 0`; then, when `bias` is given, `silu(out + bias[c])`. The output stops at the
/// first channel whose input, filter or bias the buffers do not hold.
pub fn causal_conv1d(
    x: &[f64],
    weight: &[f64],
    bias: Option<&[f64]>,
    shape: ConvShape,
) -> Vec<f64> {
    let ConvShape {
        batch,
        dim,
        seqlen,
        width,
    } = shape;
    let mut out = Vec::with_capacity(batch * dim * seqlen);
    if seqlen == 0 || width == 0 {
        return out;
    }
    for (row, signal) in x.chunks_exact(seqlen).take(batch * dim).enumerate() {
        let channel = row % dim;
        let Some(filter) = weight.get(channel * width..(channel + 1) * width) else {
            break;
        };
        let channel_bias = match bias {
            None => None,
            Some(bias) => match bias.get(channel) {
                Some(&b) => Some(b),
                None => break,
            },
        };
        for t in 0..seqlen {
            // Tap k reads x[t − (width − 1) + k]; taps before the start see zeros.
            let first_tap = (width - 1).saturating_sub(t);
            let acc: f64 = (first_tap..width)
                .map(|k| filter[k] * signal[t + k + 1 - width])
                .sum();
            out.push(channel_bias.map_or(acc, |b| silu(acc + b)));
        }
    }
    out
}

/// SiLU (swish): `x · sigmoid(x)`.
pub fn silu(x: f64) -> f64 {
    super::activation::Activation::Silu.apply(x)
}

const fn shape(batch: usize, dim: usize, seqlen: usize, width: usize) -> ConvShape {
    ConvShape {
        batch,
        dim,
        seqlen,
        width,
    }
}

/// The unrolled widths 2 to 4 and the general path (1, 7, 33), sequences shorter than one
/// thread's outputs, ragged ends, lengths that rule out 16-byte vectors (17, 33, 4099) and
/// ones that cross block tiles of 2048 or 1024 steps (1030, 2051, 4099).
const SHAPES: [ConvShape; 9] = [
    shape(1, 1, 1, 4),
    shape(2, 3, 17, 4),
    shape(1, 4, 1000, 3),
    shape(2, 8, 2048, 4),
    shape(1, 2, 4099, 2),
    shape(2, 4, 1030, 4),
    shape(3, 5, 33, 1),
    shape(1, 3, 100, 7),
    shape(1, 2, 2051, 33),
];

/// `(abs, rel)` tolerance: the kernels accumulate `width` products in f32 and round once to the
/// element type; the f32 SiLU uses the hardware's approximate exp and reciprocal (a few ulps).
/// The absolute term covers outputs that nearly cancel.
fn tolerance(ty: ScalarType) -> (f64, f64) {
    match ty {
        ScalarType::Bf16 => (1e-5, epsilon(ty) / 2.0),
        ScalarType::F16 => (1e-5, epsilon(ty)),
        _ => (1e-6, 1e-5),
    }
}

/// Both kernels in every dtype at every shape in [`SHAPES`], with fresh random inputs.
pub fn cases(rng: &mut impl Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for with_bias_silu in [false, true] {
        for ty in [ScalarType::Bf16, ScalarType::F16, ScalarType::F32] {
            for shape in SHAPES {
                cases.push(case(with_bias_silu, ty, shape, rng));
            }
        }
    }
    cases
}

fn case(with_bias_silu: bool, ty: ScalarType, shape: ConvShape, rng: &mut impl Rng) -> Case {
    let ConvShape {
        batch,
        dim,
        seqlen,
        width,
    } = shape;
    let mut draw = |len: usize, spread: f64| random_rounded(rng, ty, len, 0.0, spread);
    let x = draw(batch * dim * seqlen, 2.0);
    // Filter taps of the size trained models have, so that sums stay of order one.
    let weight = draw(dim * width, 1.0 / (width as f64).sqrt());
    let bias = with_bias_silu.then(|| draw(dim, 0.5));
    let want = causal_conv1d(&x, &weight, bias.as_deref(), shape);
    let (abs, rel) = tolerance(ty);
    let mut args = vec![
        CaseArg::close("out", ty, want, (abs, rel)),
        CaseArg::input("x", ty, x),
        CaseArg::input("weight", ty, weight),
    ];
    if let Some(bias) = bias {
        args.push(CaseArg::input("bias", ty, bias));
    }
    args.extend([batch, dim, seqlen, width].map(|n| CaseArg::Scalar(ScalarValue::U32(n as u32))));
    let family = if with_bias_silu {
        "causal_conv1d_bias_silu"
    } else {
        "causal_conv1d"
    };
    Case {
        kernel: format!("{family}_{}", ty.name()),
        label: format!("batch={batch} dim={dim} seqlen={seqlen} width={width}"),
        args,
        grid: [None; 3],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn convolution_is_causal_with_zero_history() {
        // One channel, width 3, taps (w0, w1, w2) = (1, 10, 100): out[t] = x[t-2] + 10 x[t-1] + 100 x[t].
        let shape = ConvShape {
            batch: 1,
            dim: 1,
            seqlen: 4,
            width: 3,
        };
        let got = causal_conv1d(&[1.0, 2.0, 3.0, 4.0], &[1.0, 10.0, 100.0], None, shape);
        assert_eq!(got, [100.0, 210.0, 321.0, 432.0]);
    }

    #[test]
    fn channels_use_their_own_filter_across_the_batch() {
        // Two sequences of two channels; channel 0 sums the last two steps, channel 1 doubles.
        let shape = ConvShape {
            batch: 2,
            dim: 2,
            seqlen: 2,
            width: 2,
        };
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let got = causal_conv1d(&x, &[1.0, 1.0, 0.0, 2.0], None, shape);
        assert_eq!(got, [1.0, 3.0, 6.0, 8.0, 5.0, 11.0, 14.0, 16.0]);
    }

    #[test]
    fn bias_and_silu_follow_the_sum() {
        let shape = ConvShape {
            batch: 1,
            dim: 1,
            seqlen: 2,
            width: 1,
        };
        let got = causal_conv1d(&[1.0, -2.0], &[1.0], Some(&[1.0]), shape);
        let want = [2.0 / (1.0 + (-2f64).exp()), -1.0 / (1.0 + 1f64.exp())];
        assert_eq!(got, want);
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_578_630_004_9).abs() < 1e-15);
    }

    #[test]
    fn degenerate_shapes_and_short_buffers_give_short_output() {
        let shape = ConvShape {
            batch: 1,
            dim: 1,
            seqlen: 3,
            width: 0,
        };
        assert!(causal_conv1d(&[1.0, 2.0, 3.0], &[], None, shape).is_empty());
        // Two channels declared, one filter given: only channel 0 is computed.
        let shape = ConvShape {
            batch: 1,
            dim: 2,
            seqlen: 1,
            width: 1,
        };
        assert_eq!(causal_conv1d(&[3.0, 4.0], &[2.0], None, shape), [6.0]);
        assert_eq!(
            causal_conv1d(&[3.0, 4.0], &[2.0, 1.0], Some(&[0.0]), shape).len(),
            1
        );
    }

    #[test]
    fn cases_cover_every_symbol_and_every_time_step() {
        let cases = cases(&mut StdRng::seed_from_u64(3));
        let mut kernels: Vec<_> = cases.iter().map(|c| c.kernel.as_str()).collect();
        kernels.dedup();
        assert_eq!(kernels.len(), 6);
        for case in &cases {
            let Some(CaseArg::Output { len, .. }) = case.args.first() else {
                panic!("{}: out comes first", case.kernel);
            };
            let Some(CaseArg::Input { data, .. }) = case.args.get(1) else {
                panic!("{}: x comes second", case.kernel);
            };
            assert_eq!(data.len(), *len, "{}: one output per input", case.label);
        }
    }
}
