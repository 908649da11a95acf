#!/usr/bin/env python3
"""The 8-bit GEMMs on an NVIDIA GPU: correctness against a float64 reference and speed against
torch's own 8-bit matmuls, in one run.

  gemm_fp8_e4m3fn_nt_{per_tensor,per_token}_bf16 against torch._scaled_mm (float8_e4m3fn, the
    same scales: per tensor, or per row of A and per column of B; bf16 out)
  gemm_fp8_blockscale_e4m3fn_nt_bf16 (DeepSeek-V3's 1 x 128 and 128 x 128 block scales) against
    torch._scaled_mm per token on the same inputs quantized per row (torch has no block-scaled
    _scaled_mm here: the nearest peer, doing a little less work than ours)
  gemm_a8w8_nt_bf16 against torch._int_mm (int8 in, int32 out: the peer does no scaling, so it
    does a little less work than ours)
  gemm_a16w8_blockscale_e4m3fn_nt_bf16 (bf16 activations, FP8 weights with 128 x 128 block
    scales, widened in the kernel) against torch.matmul on the weights dequantized to bf16
    beforehand (cuBLAS bf16: the peer reads twice the weight bytes but converts nothing); at
    M = 16 its split-K form gemm_a16w8_blockscale_splitk_e4m3fn_nt_f32, timed with the zeroing
    of its f32 C

Called through hkload's Python package with their arguments alone, as a user does. Inputs are
fresh random values quantized to each format with per-row (or per-tensor, or for weights of
the weight-only kernel per-block) scales; C starts as NaN. The check, for C[i][j] with K terms
of exact products summed in f32 (i32 for int8, exact), scaled and rounded once to bf16 (for
the weight-only kernel, b is the dequantized weight and s_i = t_j = 1):
    |got - ref| <= 2^-8 |ref| + K 2^-22 sqrt(sum_k (a_ik b_jk)^2) s_i t_j + 2^-133
ref in float64 from the same quantized values and scales. Every C is checked at M = 16 and
2048 (the f64 product at M = 8192 is slow; those are timed only); so is torch._scaled_mm's C,
shown beside ours and not judged (it is the peer, not under test).

Every kernel is called with its arguments by name through kernel_calls.py, which puts them in
the order of the bundle's signature and names the symbols.

usage: gemm_q8_bench.py BUNDLE   (hkload installed, or on PYTHONPATH)
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # before torch and hkload load: the usage needs neither
    sys.exit(0)

import hkload  # noqa: E402
import torch  # noqa: E402

import kernel_calls as calls  # noqa: E402

SHAPES = calls.LLAMA3_LINEAR
MS = [16, 64, 128, 256, 2048, 8192]
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def quantize(x: torch.Tensor, dtype, top: float):
    """x quantized per row to dtype, and the f32 scales (x ≈ q · scale)."""
    scale = (x.abs().amax(dim=1).float() / top).clamp(min=1e-12)
    q = (x / scale[:, None]).clamp(-top, top)
    q = q.round().to(dtype) if dtype == torch.int8 else q.to(dtype)
    return q, scale


def quantize_blocks(w: torch.Tensor):
    """w [N][K] quantized to E4M3 with one f32 scale per 128 x 128 block (the last ones
    partial): the codes, the scales [ceil(N/128)][ceil(K/128)], and each element's scale."""
    n, k = w.shape
    pad = torch.zeros(-(-n // 128) * 128, -(-k // 128) * 128, device=w.device)
    pad[:n, :k] = w.abs()
    amax = pad.reshape(pad.shape[0] // 128, 128, pad.shape[1] // 128, 128).amax(dim=(1, 3))
    scale = (amax.float() / FP8_MAX).clamp(min=1e-12)
    each = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    return (w / each).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale, each


def quantize_groups(x: torch.Tensor):
    """x [M][K] quantized to E4M3 with one f32 scale per 1 x 128 group of each row (the last
    partial): the codes, the scales [M][ceil(K/128)], and each element's scale."""
    m, k = x.shape
    pad = torch.zeros(m, -(-k // 128) * 128, device=x.device)
    pad[:, :k] = x.abs()
    scale = (pad.reshape(m, -1, 128).amax(dim=2).float() / FP8_MAX).clamp(min=1e-12)
    each = scale.repeat_interleave(128, 1)[:, :k]
    return (x / each).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale, each


def timed(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def check(got, a, b, sa, sb):
    """The worst |error| / bound over C (see the module docs); a, b the quantized values as
    f64, sa [M] and sb [N] their scales."""
    ref = (a @ b.T) * sa[:, None] * sb[None, :]
    spread = ((a * a) @ (b * b).T).sqrt() * sa[:, None] * sb[None, :]
    bound = 2.0**-8 * ref.abs() + a.shape[1] * 2.0**-22 * spread + 2.0**-133
    err = (got.double() - ref).abs()
    if torch.isnan(got).any():
        return float("inf")
    return (err / bound).max().item()


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    kernels = hkload.Bundle(sys.argv[1]).load(torch.device("cuda", 0))
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name(0)} torch {torch.__version__} hkload {sys.argv[1]}")
    print("TF/s count 2 M N K; ratio = peer time / ours; worst = largest error / bound (<= 1 passes);")
    print("peer = torch._scaled_mm's C against the same reference and bound (shown, not judged)")
    header = f"{'kernel':<10} {'M':>5} {'N':>6} {'K':>6} {'ours ms':>9} {'TF/s':>7} {'peer ms':>9} {'TF/s':>7} {'ratio':>6} {'worst':>6} {'peer':>6}"
    print(header)
    failed = 0
    for kind in ("fp8 tensor", "fp8 token", "fp8 block", "int8", "a16w8"):
        for m in MS:
            for n, k in SHAPES:
                x = torch.randn(m, k, device="cuda")
                w = torch.randn(n, k, device="cuda")
                split = False  # the split-K form adds to an f32 C
                if kind == "a16w8":
                    a = x.to(torch.bfloat16)
                    b, b_scale, weight_scale = quantize_blocks(w)
                    # The dequantized weight is exact in f64; the sums' scales are then 1.
                    sa, sb = torch.ones(m, device="cuda"), torch.ones(n, device="cuda")
                    split = m <= 16
                    name = calls.a16w8_gemm_symbol(split)
                    scales = {"b_scale": b_scale}
                elif kind == "fp8 block":
                    a, a_groups, a_each = quantize_groups(x)
                    b, b_blocks, b_each = quantize_blocks(w)
                    # Dequantized values are exact in f64; the sums' scales are then 1.
                    sa, sb = torch.ones(m, device="cuda"), torch.ones(n, device="cuda")
                    name = calls.fp8_gemm_symbol("block")
                    scales = {"a_scale": a_groups, "b_scale": b_blocks}
                elif kind == "int8":
                    a, sa = quantize(x, torch.int8, 127.0)
                    b, sb = quantize(w, torch.int8, 127.0)
                    name = calls.a8w8_gemm_symbol()
                elif kind == "fp8 token":
                    a, sa = quantize(x, FP8, FP8_MAX)
                    b, sb = quantize(w, FP8, FP8_MAX)
                    name = calls.fp8_gemm_symbol("per_token")
                else:
                    ta, tb = x.abs().max() / FP8_MAX, w.abs().max() / FP8_MAX
                    a, b = (x / ta).to(FP8), (w / tb).to(FP8)
                    sa, sb = ta.reshape(1).float(), tb.reshape(1).float()
                    name = calls.fp8_gemm_symbol("per_tensor")
                if kind not in ("a16w8", "fp8 block"):
                    scales = {"a_scale": sa, "b_scale": sb}
                c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32 if split else torch.bfloat16)
                # The arguments in the kernel's order, made once: the timed calls only launch.
                args = calls.arguments(kernels, name, c=c, a=a, b=b, **scales, **calls.dense(m, n, k))

                def ours():
                    if split:
                        c.zero_()
                    kernels.call(name, *args)

                if kind == "a16w8":
                    dequantized = (b.float() * weight_scale).to(torch.bfloat16)
                    peer = lambda: torch.matmul(a, dequantized.t())
                elif kind == "fp8 block":
                    pa, psa = quantize(x, FP8, FP8_MAX)
                    pb, psb = quantize(w, FP8, FP8_MAX)
                    peer = lambda: torch._scaled_mm(pa, pb.t(), scale_a=psa[:, None], scale_b=psb[None, :], out_dtype=torch.bfloat16)
                elif kind == "int8":
                    # torch._int_mm wants m > 16 on CUDA.
                    peer = (lambda: torch._int_mm(a, b.t())) if m > 16 else None
                elif kind == "fp8 token":
                    peer = lambda: torch._scaled_mm(a, b.t(), scale_a=sa[:, None], scale_b=sb[None, :], out_dtype=torch.bfloat16)
                else:
                    peer = lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
                ms = timed(ours)
                worst = peer_worst = "-"
                if m <= 2048:
                    ours()
                    torch.cuda.synchronize()
                    def full(scale, count):
                        return scale.double().expand(count) if scale.numel() == 1 else scale.double()

                    values = (a.float().double(), b.float().double())
                    if kind == "a16w8":
                        values = (values[0], values[1] * weight_scale.double())
                    elif kind == "fp8 block":
                        values = (values[0] * a_each.double(), values[1] * b_each.double())
                    ratio = check(c, *values, full(sa, m), full(sb, n))
                    failed += ratio > 1.0
                    worst = f"{ratio:.3f}"
                    if kind in ("fp8 tensor", "fp8 token"):  # _scaled_mm's own C, the same bound
                        peer_worst = f"{check(peer(), *values, full(sa, m), full(sb, n)):.3f}"
                tf = 2 * m * n * k / ms / 1e9
                peer_cols = f"{'-':>9} {'-':>7} {'-':>6}"
                if peer is not None:
                    try:
                        pms = timed(peer)
                        peer_cols = f"{pms:9.4f} {2 * m * n * k / pms / 1e9:7.1f} {pms / ms:6.2f}"
                    except RuntimeError as refused:  # a layout or shape the peer does not take
                        peer_cols = f"  (peer refused: {str(refused).splitlines()[0][:60]})"
                print(f"{kind:<10} {m:>5} {n:>6} {k:>6} {ms:9.4f} {tf:7.1f} {peer_cols} {worst:>6} {peer_worst:>6}", flush=True)
    print(f"checks: {'all passed' if not failed else f'{failed} FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
