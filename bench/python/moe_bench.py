#!/usr/bin/env python3
"""Mixture-of-experts dispatch on an NVIDIA GPU: routing (topk_softmax, grouped_topk) and
alignment (moe_align_block_size), timed against the same steps in PyTorch, in one run.

A decode step's dispatch is a few tiny kernels, so what counts is GPU time per step with the
host out of the way: each side's calls are captured in a CUDA graph of REPEAT steps and the
graph is replayed, and a step's time is the replay's over REPEAT. Eager times (one Python call
after another, what a step costs without a graph) are printed beside them.

The peer is the plain PyTorch a model's reference code runs: softmax (or sigmoid with DeepSeek-V3's
groups), torch.topk, then a stable sort by expert, counts by scatter_add, a cumulative sum and
index arithmetic to pad each expert's rows to the block. Before timing, the alignment of both
sides is compared element by element (our format is the peer's: ascending flat index within each
expert's rows), and the routing by the scores of the experts it chose (bf16 logits tie, and
torch.topk breaks ties otherwise than our lower-index rule); gpu_parity checks every kernel in
full.

Then the grouped GEMMs (moe_gemm_gated_silu_bf16, moe_gemm_down_bf16) in TFLOP/s against our own
dense GEMMs of the same total shape (gemm_a16w16_gated_silu_bf16 and gemm_a16w16_nt_bf16 over
all the experts' rows at once, with one expert's weights), at 4096 and 256 tokens an expert; and
the whole layer (torch.ops.hk.moe) against a plain PyTorch loop over the experts and against the
sum of its parts' graph times.

usage: moe_bench.py BUNDLE   (hkload installed, or on PYTHONPATH)
"""

from __future__ import annotations

import statistics
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # before torch and hkload load: the usage needs neither
    sys.exit(0)

import hkload  # noqa: E402
import hkload.torch  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernel_calls as calls  # noqa: E402

REPEAT = 20
# The 128-row grouped GEMMs' block (hkload.moe.FORMS), which the grouped-against-dense comparison
# runs (hundreds of rows an expert); routing + alignment take the layer's own hkload.moe.block_m.
BLOCK_M = max(hkload.moe.FORMS)

# (name, experts, top-k, n_group, topk_group): grouped routing where n_group is set.
MODELS = [
    ("Mixtral", 8, 2, None, None),
    ("Qwen3-MoE", 128, 8, None, None),
    ("DeepSeek-V3", 256, 8, 8, 4),
]


def graph_us(step, rounds=5):
    """GPU time of one ``step`` in microseconds: REPEAT steps captured in a CUDA graph, the
    median replay over REPEAT."""
    step()  # warm up outside the capture (first-call allocations, module loads)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPEAT):
            step()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        graph.replay()
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000 / REPEAT)
    return statistics.median(times)


def eager_us(step, rounds=5, calls_per_round=200):
    """Wall time of one ``step`` called from Python, back to back, in microseconds."""
    step()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        s.record()
        for _ in range(calls_per_round):
            step()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000 / calls_per_round)
    return statistics.median(times)


def torch_route(logits, bias, k, n_group, topk_group):
    """The routing in PyTorch: (weights f32, ids int32), as the README's "MoE routing" states."""
    x = logits.float()
    if n_group is None:
        w, ids = torch.topk(torch.softmax(x, dim=-1), k, dim=-1)
        return w / w.sum(dim=-1, keepdim=True), ids.to(torch.int32)
    tokens = x.shape[0]
    scores = torch.sigmoid(x)
    choice = scores + bias
    groups = choice.view(tokens, n_group, -1)
    group_score = groups.topk(2, dim=-1).values.sum(dim=-1)
    kept = group_score.topk(topk_group, dim=-1).indices
    mask = torch.zeros_like(group_score).scatter_(1, kept, 1.0)
    mask = mask.unsqueeze(-1).expand_as(groups).reshape(tokens, -1)
    ids = choice.masked_fill(mask == 0, float("-inf")).topk(k, dim=-1).indices
    w = scores.gather(1, ids)
    return w / w.sum(dim=-1, keepdim=True) * 2.5, ids.to(torch.int32)


class Recording:
    """Kernels that remember each call (name and arguments) as they make it: a layer's parts,
    to time one by one."""

    def __init__(self, kernels):
        self.kernels, self.calls = kernels, []

    def call(self, name, *args):
        self.calls.append((name, args))
        self.kernels.call(name, *args)


class Dispatch:
    """One model's routing and alignment at one token count, ours and the peer's, on buffers
    made once (a graph replays the same addresses)."""

    def __init__(self, g, model, tokens):
        _, experts, k, n_group, topk_group = model
        self.g, self.experts, self.k = g, experts, k
        self.n_group, self.topk_group = n_group, topk_group
        self.tokens = tokens
        dev = "cuda"
        self.logits = torch.randn(tokens, experts, device=dev, dtype=torch.float32).to(torch.bfloat16)
        self.bias = torch.randn(experts, device=dev) * 0.1
        self.weights = torch.empty(tokens, k, device=dev)
        self.ids = torch.empty(tokens, k, device=dev, dtype=torch.int32)
        self.expert_map = torch.arange(experts, device=dev, dtype=torch.int32)
        self.block_m = hkload.moe.block_m(tokens, k, experts)
        max_sorted = tokens * k + experts * (self.block_m - 1)
        self.sorted_ids = torch.empty(max_sorted, device=dev, dtype=torch.int32)
        self.block_experts = torch.empty(-(-max_sorted // self.block_m), device=dev, dtype=torch.int32)
        self.padded = torch.empty(1, device=dev, dtype=torch.int32)
        self._routing_args()

    def _routing_args(self):
        t, e, k = self.tokens, self.experts, self.k
        if self.n_group is None:
            self.route_symbol = calls.topk_softmax_symbol("bf16")
            self.route_args = calls.arguments(
                self.g, self.route_symbol, topk_weights=self.weights, topk_ids=self.ids,
                logits=self.logits, tokens=t, experts=e, ld=e, k=k, renormalize=1)
        else:
            self.route_symbol = calls.grouped_topk_symbol("bf16")
            self.route_args = calls.arguments(
                self.g, self.route_symbol, topk_weights=self.weights, topk_ids=self.ids,
                logits=self.logits, bias=self.bias, tokens=t, experts=e, ld=e,
                n_group=self.n_group, topk_group=self.topk_group, k=k,
                routed_scaling_factor=2.5)
        self.align_symbol = calls.moe_align_symbol()
        self.align_args = calls.arguments(
            self.g, self.align_symbol, sorted_token_ids=self.sorted_ids,
            expert_ids=self.block_experts, num_tokens_post_pad=self.padded, topk_ids=self.ids,
            expert_map=self.expert_map, tokens=t, k=k, experts=e, local_experts=e, block_m=self.block_m)

    # ---- ours ----
    def route(self):
        self.g.call(self.route_symbol, *self.route_args)

    def align(self):
        self.g.call(self.align_symbol, *self.align_args)

    def both(self):
        self.route()
        self.align()

    # ---- the peer: plain PyTorch ----
    def torch_route(self):
        return torch_route(self.logits, self.bias, self.k, self.n_group, self.topk_group)

    def torch_align(self, ids):
        flat = ids.flatten()
        n = flat.numel()
        order = torch.sort(flat.long(), stable=True).indices.to(torch.int32)
        counts = torch.zeros(self.experts, device="cuda", dtype=torch.int64)
        counts.scatter_add_(0, flat.long(), torch.ones_like(flat, dtype=torch.int64))
        padded = (counts + self.block_m - 1) // self.block_m * self.block_m
        starts = torch.cumsum(padded, 0) - padded
        firsts = torch.cumsum(counts, 0) - counts
        expert = flat.long()[order.long()]
        rank = torch.arange(n, device="cuda") - firsts[expert]
        sorted_ids = torch.full_like(self.sorted_ids, n)
        sorted_ids.scatter_(0, starts[expert] + rank, order)
        blocks = torch.arange(self.block_experts.numel(), device="cuda") * self.block_m
        block_experts = torch.searchsorted(torch.cumsum(padded, 0), blocks, right=True)
        total = padded.sum()
        block_experts = torch.where(blocks < total, block_experts, -1).to(torch.int32)
        return sorted_ids, block_experts, total

    def torch_both(self):
        _, ids = self.torch_route()
        return self.torch_align(ids)

    def compare(self):
        """Our routing and alignment against the peer's; returns a message or None. Logits in bf16
        tie often (128 experts share 256 values of a binade), and torch.topk breaks ties its own
        way: the routing is compared by the values it chose and their weights, and the peer's
        alignment is made from our ids."""
        self.both()
        w, ids = self.torch_route()
        choice = self.logits.float()
        if self.n_group is not None:
            choice = torch.sigmoid(choice) + self.bias
        ours = choice.gather(1, self.ids.long()).sort(dim=-1, descending=True).values
        theirs = choice.gather(1, ids.long()).sort(dim=-1, descending=True).values
        if not torch.equal(ours, theirs):
            return "the chosen experts' scores differ from torch.topk's"
        ours_w = self.weights.sort(dim=-1).values
        theirs_w = w.sort(dim=-1).values
        if not torch.allclose(ours_w, theirs_w, rtol=1e-4, atol=1e-6):
            return f"weights differ by up to {(ours_w - theirs_w).abs().max().item():.3g}"
        sorted_ids, block_experts, total = self.torch_align(self.ids)
        if int(self.padded.item()) != int(total.item()):
            return f"padded count {int(self.padded.item())}, torch {int(total.item())}"
        used = int(total.item())
        if not torch.equal(self.sorted_ids[:used], sorted_ids[:used]):
            return "sorted_token_ids differ"
        if not torch.equal(self.block_experts, block_experts):
            return "expert_ids differ"
        return None


def grouped_gemms(g):
    """Stage 1 and 2 over E experts of `per` tokens each (top-1, tokens dealt round robin) against
    the dense GEMMs of all E * per rows."""
    print("grouped GEMMs (bf16, hidden 7168, inter 2048, top-1, tokens dealt to experts round robin): "
          "TF/s, ratio = dense time / grouped time")
    print(f"{'experts':>7} {'per':>5} {'stage 1':>8} {'dense':>8} {'ratio':>6} {'stage 2':>8} {'dense':>8} {'ratio':>6}")
    hidden, inter = 7168, 2048
    for experts, per in ((8, 4096), (32, 256), (8, 256)):
        tokens = experts * per
        dev = "cuda"
        x = torch.randn(tokens, hidden, device=dev).to(torch.bfloat16)
        w13 = (torch.randn(experts, 2 * inter, hidden, device=dev) * 0.02).to(torch.bfloat16)
        w2 = (torch.randn(experts, hidden, inter, device=dev) * 0.02).to(torch.bfloat16)
        ids = (torch.arange(tokens, device=dev, dtype=torch.int32) % experts).view(tokens, 1)
        weights = torch.ones(tokens, 1, device=dev)
        expert_map = torch.arange(experts, device=dev, dtype=torch.int32)
        max_sorted = tokens + experts * (BLOCK_M - 1)
        sorted_ids = torch.empty(max_sorted, device=dev, dtype=torch.int32)
        block_experts = torch.empty(-(-max_sorted // BLOCK_M), device=dev, dtype=torch.int32)
        padded = torch.empty(1, device=dev, dtype=torch.int32)
        calls.call(g, calls.moe_align_symbol(), sorted_token_ids=sorted_ids, expert_ids=block_experts,
                   num_tokens_post_pad=padded, topk_ids=ids, expert_map=expert_map, tokens=tokens, k=1,
                   experts=experts, local_experts=experts, block_m=BLOCK_M)
        h = torch.empty(tokens, inter, device=dev, dtype=torch.bfloat16)
        out = torch.empty(tokens, hidden, device=dev, dtype=torch.bfloat16)
        shared = dict(sorted_token_ids=sorted_ids, expert_ids=block_experts, num_tokens_post_pad=padded,
                      tokens=tokens, topk=1, experts=experts)
        s1 = calls.arguments(g, "moe_gemm_gated_silu_bf16", h=h, x=x, w13=w13, n=inter, k=hidden,
                             lda=hidden, ldc=inter, **shared)
        s2 = calls.arguments(g, "moe_gemm_down_bf16", out=out, h=h, w2=w2, topk_weights=weights, n=hidden,
                             k=inter, lda=inter, ldc=hidden, **shared)
        d1 = calls.arguments(g, calls.gated_gemm_symbol("silu", "bf16"), c=h, a=x, w_gate=w13[0, :inter],
                             w_up=w13[0, inter:], **calls.dense(tokens, inter, hidden))
        d2 = calls.arguments(g, calls.gemm_symbol("nt", "bf16"), c=out, a=h, b=w2[0], **calls.dense(tokens, hidden, inter))
        t1 = graph_us(lambda: g.call("moe_gemm_gated_silu_bf16", *s1))
        t1d = graph_us(lambda: g.call(calls.gated_gemm_symbol("silu", "bf16"), *d1))
        t2 = graph_us(lambda: g.call("moe_gemm_down_bf16", *s2))
        t2d = graph_us(lambda: g.call(calls.gemm_symbol("nt", "bf16"), *d2))
        f1, f2 = 4.0 * tokens * inter * hidden, 2.0 * tokens * hidden * inter
        print(f"{experts:>7} {per:>5} {f1 / t1 / 1e6:>8.1f} {f1 / t1d / 1e6:>8.1f} {t1d / t1:>6.2f} "
              f"{f2 / t2 / 1e6:>8.1f} {f2 / t2d / 1e6:>8.1f} {t2d / t2:>6.2f}", flush=True)
        del x, w13, w2, h, out


def whole_layer(g):
    """torch.ops.hk.moe against a PyTorch loop over the experts and the sum of its parts."""
    ops = hkload.torch.register(g, namespace="hk_moe_bench")
    print("the layer (bf16; Mixtral 8 x top-2 hidden 4096 inter 14336, Qwen3-MoE 128 x top-8 hidden 2048 "
          "inter 768, DeepSeek-V3 256 x top-8 grouped hidden 7168 inter 2048): GPU µs a call (CUDA graph), "
          "torch = a loop over the experts (eager: its host work is part of it), ratio = torch / ours")
    print(f"{'model':<12} {'tokens':>6} {'ours':>9} {'parts':>9} {'torch':>9} {'ratio':>6}  "
          "parts: routing + alignment + stage 1 + stage 2 + combine")
    shapes = {"Mixtral": (4096, 14336), "Qwen3-MoE": (2048, 768), "DeepSeek-V3": (7168, 2048)}
    for name, experts, k, n_group, topk_group in MODELS:
        hidden, inter = shapes[name]
        dev = "cuda"
        w13 = (torch.randn(experts, 2 * inter, hidden, device=dev) * 0.02).to(torch.bfloat16)
        w2 = (torch.randn(experts, hidden, inter, device=dev) * 0.02).to(torch.bfloat16)
        bias = torch.randn(experts, device=dev) * 0.1
        for tokens in (1, 64, 1024, 8192):
            x = torch.randn(tokens, hidden, device=dev).to(torch.bfloat16)
            logits = torch.randn(tokens, experts, device=dev).to(torch.bfloat16)
            options = dict(n_group=n_group or 0, topk_group=topk_group or 0,
                           correction_bias=bias if n_group else None,
                           routed_scaling_factor=2.5 if n_group else 1.0)

            def ours():
                ops.moe(x, logits, w13, w2, k, **options)

            def theirs():
                w, ids = torch_route(logits, bias, k, n_group, topk_group)
                y = torch.zeros(tokens, hidden, device=dev, dtype=torch.float32)
                for e in range(experts):
                    t, j = (ids == e).nonzero(as_tuple=True)
                    if t.numel():
                        xs = x[t]
                        hs = F.silu(xs @ w13[e, :inter].T) * (xs @ w13[e, inter:].T)
                        y.index_add_(0, t, (hs @ w2[e].T).float() * w[t, j, None])
                return y.to(torch.bfloat16)

            recording = Recording(g)
            hkload.moe.forward(recording, x, logits, w13, w2, k, **options)
            parts = [graph_us(lambda: g.call(n, *a)) for n, a in recording.calls]
            t_ours = graph_us(ours)
            t_theirs = eager_us(theirs, rounds=3, calls_per_round=5)
            print(f"{name:<12} {tokens:>6} {t_ours:>9.1f} {sum(parts):>9.1f} {t_theirs:>9.1f} {t_theirs / t_ours:>6.2f}  "
                  + " + ".join(f"{t:.1f}" for t in parts), flush=True)
        del w13, w2


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    bundle = sys.argv[1]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "hkload", bundle)
    g = hkload.Bundle(bundle).load(torch.device("cuda", 0))
    torch.manual_seed(44)
    ok = True
    print(f"routing + alignment (block_m as the layer picks it), GPU µs a step from CUDA graphs of {REPEAT} steps; "
          "eager = Python calls back to back; ratio = torch / ours (both steps)")
    print(f"{'model':<12} {'tokens':>6} {'route':>7} {'align':>7} {'both':>7} {'eager':>7} "
          f"{'torch':>7} {'t eager':>8} {'ratio':>6}  check")
    for model in MODELS:
        for tokens in (1, 4, 16, 64, 256, 1024, 8192):
            d = Dispatch(g, model, tokens)
            problem = d.compare()
            ok &= problem is None
            route, align, both = graph_us(d.route), graph_us(d.align), graph_us(d.both)
            eager = eager_us(d.both)
            theirs = graph_us(d.torch_both)
            theirs_eager = eager_us(d.torch_both, calls_per_round=50)
            print(f"{model[0]:<12} {tokens:>6} {route:>7.2f} {align:>7.2f} {both:>7.2f} {eager:>7.2f} "
                  f"{theirs:>7.2f} {theirs_eager:>8.2f} {theirs / both:>6.2f}  {problem or 'same as torch'}",
                  flush=True)
    grouped_gemms(g)
    whole_layer(g)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
