#!/usr/bin/env python3
"""Flash attention forward (attn_fwd_*) on an NVIDIA GPU: parity against
torch.nn.functional.scaled_dot_product_attention's math backend in f32 on large shapes, and
speed against its flash (FlashAttention-2) and cuDNN backends, in one run.

The kernels are called through hkload's Python package with their arguments alone (the contract
in manifests/attention.toml computes the launch and checks every buffer). Checks: batches of
packed sequences (THD) of equal length, GQA 32/8, causal and not, every head dimension; O inside
a poisoned buffer with a guard band between token rows (ldo past the row) and after the last;
the bound is the one tests/src/kernels/attention.rs states: |got - ref| <= eps + sk 2^-22 +
2 d^2 2^-24 scale (|V| <= 1, |Q|, |K| <= 1), eps one ulp of the element type. The f64 reference
of tests/src/kernels/attention.rs (gpu_parity) covers the options and odd shapes; this script
the long sequences it cannot afford.

Speed: TFLOP/s at batch x sequence = 16k tokens, sequence 1k-16k, heads 32 (GQA 32/8), head
dims 64 and 128, causal and not (causal counts half the products, as FlashAttention does); the
forward pass alone, then forward + backward through hkload.torch's differentiable op.

The forward's call is the one hkload.attention's op makes (hkload.attention.call_forward), with
O and the LSE this script allocates.

usage: attention_bench.py BUNDLE [--check-only | --bench-only] [--forward-only]
       (hkload on PYTHONPATH; --forward-only leaves out forward + backward)
"""

from __future__ import annotations

import math
import statistics
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # before torch and hkload load: the usage needs neither
    sys.exit(0)

import hkload  # noqa: E402
import hkload.attention  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def symbol(d, dv, dt):
    return f"attn_fwd_{hkload.attention.suffix(d, dv, dt)}"


class Attention:
    def __init__(self, bundle):
        self.kernels = hkload.Bundle(bundle).load(torch.device("cuda", 0))

    def forward(self, q, k, v, batch, seq, causal, o=None, lse=None, window=(-1, -1)):
        """q [B*S, Hq, d], k, v [B*S, Hkv, d|dv] (token rows may be strided); sequences of equal
        length. Returns (o, lse)."""
        tokens, hq, d = q.shape
        dv = v.shape[2]
        cu = torch.arange(0, (batch + 1) * seq, seq, device="cuda", dtype=torch.int32)
        if o is None:
            o = torch.empty(tokens, hq, dv, device="cuda", dtype=q.dtype)
        if lse is None:
            lse = torch.empty(hq, tokens, device="cuda", dtype=torch.float32)
        hkload.attention.call_forward(
            self.kernels, o, lse, q, k, v, cu, cu, seq, 1.0 / math.sqrt(d), 0.0, causal, window[0], window[1]
        )
        return o, lse


def sdpa(q, k, v, batch, seq, causal, backend):
    """The peer on the same packed tensors, viewed as [B, H, S, D]."""
    def bhsd(x):
        return x.view(batch, seq, x.shape[1], x.shape[2]).transpose(1, 2)
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(bhsd(q), bhsd(k), bhsd(v), is_causal=causal,
                                             enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[1], v.shape[2])


def inputs(batch, seq, hq, hkv, d, dv, dt, pad=0):
    tokens = batch * seq
    def rows(heads, dim):
        buf = (torch.rand(tokens, heads * dim + pad, device="cuda") * 2 - 1).to(dt)
        return buf[:, : heads * dim].view(tokens, heads, dim)
    return rows(hq, d), rows(hkv, d), rows(hkv, dv)


def check(att):
    print("parity against SDPA math (f32): worst |error| / bound")
    ok = True
    shapes = [  # batch, seq, hq, hkv, d, dv
        (2, 4097, 32, 8, 128, 128), (1, 8192, 32, 8, 64, 64), (4, 1000, 8, 1, 256, 256),
        (2, 3000, 16, 2, 192, 128), (8, 1024, 32, 32, 128, 128),
    ]
    for batch, seq, hq, hkv, d, dv in shapes:
        for dt in (torch.bfloat16, torch.float16):
            for causal in (False, True):
                q, k, v = inputs(batch, seq, hq, hkv, d, dv, dt, pad=8)
                tokens = batch * seq
                # O inside a poisoned buffer: rows ldo = hq*dv + 8 apart, 64 elements past the end.
                ldo = hq * dv + 8
                obuf = torch.full((tokens * ldo + 64,), float("nan"), device="cuda", dtype=dt)
                o = obuf[: tokens * ldo].view(tokens, ldo)[:, : hq * dv].view(tokens, hq, dv)
                o, lse = att.forward(q, k, v, batch, seq, causal, o=o)
                want = sdpa(q.float(), k.float(), v.float(), batch, seq, causal, SDPBackend.MATH)
                bound = EPS[dt] + seq * 2.0**-22 + 2 * d * d * 2.0**-24 / math.sqrt(d)
                err = (o.float() - want).abs().max().item()
                guard = obuf.view(-1)[tokens * ldo :].isnan().all().item() and obuf[: tokens * ldo].view(
                    tokens, ldo)[:, hq * dv :].isnan().all().item()
                # LSE of one sequence and head against the f32 scores.
                qh = q[:seq, 0].float()
                kh = k[:seq, 0].float()
                s = qh @ kh.T / math.sqrt(d)
                if causal:
                    s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
                lse_err = (lse[0, :seq] - torch.logsumexp(s, dim=1)).abs().max().item()
                lse_bound = d * d * 2.0**-24 / math.sqrt(d) + seq * 2.0**-23 + 1e-5
                good = err <= bound and lse_err <= lse_bound and guard and not o.isnan().any().item()
                ok &= good
                print(f"  {'ok  ' if good else 'FAIL'} {symbol(d, dv, dt):26} b={batch} s={seq} "
                      f"h={hq}/{hkv} causal={int(causal)}  o {err / bound:.3f}  lse "
                      f"{lse_err / lse_bound:.3f}  guards {'kept' if guard else 'WRITTEN'}")
    return ok


def timed(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def bench(att):
    print(f"\nforward TFLOP/s on {torch.cuda.get_device_name()}, bf16, 16k tokens, heads 32/8")
    print(f"{'d':>4} {'seq':>6} {'causal':>6} | {'hk':>7} {'flash':>7} {'cudnn':>7} | "
          f"{'hk/flash':>8} {'hk/cudnn':>8}")
    for d in (64, 128):
        for causal in (False, True):
            for seq in (1024, 2048, 4096, 8192, 16384):
                batch = 16384 // seq
                q, k, v = inputs(batch, seq, 32, 8, d, d, torch.bfloat16)
                flops = 4 * batch * seq * seq * 32 * d / (2 if causal else 1)
                o = torch.empty_like(q)
                lse = torch.empty(32, batch * seq, device="cuda")
                ours = flops / timed(lambda: att.forward(q, k, v, batch, seq, causal, o, lse)) / 1e12
                peers = []
                for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
                    try:
                        t = timed(lambda: sdpa(q, k, v, batch, seq, causal, backend))
                        peers.append(flops / t / 1e12)
                    except RuntimeError:
                        peers.append(float("nan"))
                print(f"{d:>4} {seq:>6} {int(causal):>6} | {ours:7.1f} {peers[0]:7.1f} {peers[1]:7.1f} | "
                      f"{ours / peers[0]:8.2f} {ours / peers[1]:8.2f}", flush=True)


def bench_training(bundle):
    """Forward + backward through the differentiable op (hkload.torch's `attention`: the
    forward kernel, then attn_bwd_delta, attn_bwd_dq and attn_bwd_dkdv) against SDPA's backends,
    in TFLOP/s of the forward's products times 3.5 (the backward's five products, as
    FlashAttention counts them; ours recomputes two more, which the count leaves out)."""
    import hkload.torch

    ops = hkload.torch.register(hkload.Bundle(bundle).load(torch.device("cuda", 0)), namespace="hk_bench")
    print("\nforward + backward TFLOP/s, bf16, 16k tokens, heads 32/8")
    print(f"{'d':>4} {'seq':>6} {'causal':>6} | {'hk':>7} {'flash':>7} {'cudnn':>7} | "
          f"{'hk/flash':>8} {'hk/cudnn':>8}")
    for d in (64, 128):
        for causal in (False, True):
            for seq in (1024, 4096, 16384):
                batch = 16384 // seq
                q, k, v = (x.detach().requires_grad_(True) for x in inputs(batch, seq, 32, 8, d, d, torch.bfloat16))
                flops = 3.5 * 4 * batch * seq * seq * 32 * d / (2 if causal else 1)
                cu = torch.arange(0, (batch + 1) * seq, seq, device="cuda", dtype=torch.int32)
                grad = torch.randn(batch * seq, 32, d, device="cuda", dtype=torch.bfloat16)

                def ours():
                    o, _ = ops.attention(q, k, v, cu, cu, seq, seq, 1 / math.sqrt(d), causal=causal)
                    o.backward(grad)

                t = timed(ours, reps=10)
                peers = []
                for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
                    def peer():
                        sdpa(q, k, v, batch, seq, causal, backend).backward(grad)
                    try:
                        peers.append(flops / timed(peer, reps=10) / 1e12)
                    except RuntimeError:
                        peers.append(float("nan"))
                ours_tf = flops / t / 1e12
                print(f"{d:>4} {seq:>6} {int(causal):>6} | {ours_tf:7.1f} {peers[0]:7.1f} {peers[1]:7.1f} | "
                      f"{ours_tf / peers[0]:8.2f} {ours_tf / peers[1]:8.2f}", flush=True)


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    att = Attention(args[0])
    ok = True
    if "--bench-only" not in args:
        ok = check(att)
    if "--check-only" not in args:
        bench(att)
        if "--forward-only" not in args:
            bench_training(args[0])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
