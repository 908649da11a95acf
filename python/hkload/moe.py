"""A mixture-of-experts layer as one torch op over a bundle's MoE kernels:
``torch.ops.<namespace>.moe``, defined by ``hkload.torch.register`` when the bundle has them for
the device.

>>> y = torch.ops.hk.moe(x, router_logits, w13, w2, topk=8, n_group=8, topk_group=4,
...                      correction_bias=bias, routed_scaling_factor=2.5)    # DeepSeek-V3
>>> y = torch.ops.hk.moe(x, router_logits, w13, w2, topk=2)                 # Mixtral
>>> y = y + shared_expert(x)                                   # where the model has one

x ``[tokens, hidden]`` (bf16 or f16, rows may be strided), router_logits ``[tokens, experts]``
(rows may be strided; bf16, f16 or f32), w13 ``[local_experts, 2 * inter, hidden]`` (each
expert's gate rows, then its up rows: torch.nn.Linear's layout), w2 ``[local_experts, hidden,
inter]``; returns y ``[tokens, hidden]`` in x's type:

    y[t] = sum over token t's chosen experts e that are local of
           weight(t, e) * W2[e] · (silu(W_gate[e] · x[t]) * (W_up[e] · x[t]))

The routing chooses and weighs as the README's "MoE routing" section states: with ``n_group = 0``
softmax over the experts and the top ``topk`` (weights renormalised to sum 1 unless
``renormalize`` is False); with ``n_group > 0`` DeepSeek-V3's grouped sigmoid routing
(``correction_bias`` chooses but does not weigh; weights renormalised and scaled by
``routed_scaling_factor``). ``expert_map`` (int32 ``[experts]``: global expert → local index, -1
where another rank holds it) is expert parallelism: only the local experts' shares are summed,
and the ranks' outputs add up to the whole layer's. Five launches, none waiting on the host (the
grouped GEMMs launch over the most rows the routing can produce and skip the rest on the
device), so a decode step captures in a CUDA graph.
"""

from __future__ import annotations

import torch

from .attention import span

SCHEMA = (
    "moe(Tensor x, Tensor router_logits, Tensor w13, Tensor w2, SymInt topk, "
    "bool renormalize=True, SymInt n_group=0, SymInt topk_group=0, "
    "Tensor? correction_bias=None, float routed_scaling_factor=1.0, "
    "Tensor? expert_map=None) -> Tensor"
)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
# The grouped GEMMs' two forms (manifests/moe_gemm.toml), by the block of sorted rows each
# wants (the alignment pads each expert's rows to it): kernel names' infix for that block_m.
FORMS = {128: "", 16: "_m16"}


def block_m(tokens: int, topk: int, local_experts: int) -> int:
    """The block of sorted rows for a call: 16 (the _m16 kernels) when the local experts
    average fewer than 64 rows, else 128. A block multiplies all its rows, real or padding: at
    a few rows an expert (decode, small batches) blocks of 128 are mostly padding and the GEMMs
    compute-bound on it, while blocks of 16 waste little and stream the weights, which is what
    decode is bound by; past ~64 rows an expert the 128-row blocks' reuse of each weight tile
    over more rows wins. Depends on the sizes alone, so a CUDA graph of a step keeps its form."""
    return 16 if tokens * topk < 64 * local_experts else 128


def _name(dtype: torch.dtype, what: str, allowed=("bf16", "f16")) -> str:
    name = DTYPE_NAMES.get(dtype)
    if name not in allowed:
        raise TypeError(f"moe: {what} must be {' or '.join(allowed)}, not {dtype}")
    return name


def _rows(x: torch.Tensor, what: str) -> torch.Tensor:
    """A 2-D tensor whose rows are contiguous (any row stride), a copy only where they are not."""
    if x.dim() != 2:
        raise ValueError(f"moe: {what} must be 2-D, not shape {tuple(x.shape)}")
    return x if x.stride(1) == 1 else x.contiguous()


def forward(kernels, x, router_logits, w13, w2, topk, renormalize=True, n_group=0, topk_group=0,
            correction_bias=None, routed_scaling_factor=1.0, expert_map=None):
    """The op's CUDA implementation: routing, alignment, the two grouped GEMMs and the combine."""
    x, router_logits = _rows(x, "x"), _rows(router_logits, "router_logits")
    ty = _name(x.dtype, "x")
    if w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise TypeError(f"moe: w13 and w2 must be {x.dtype} as x is, not {w13.dtype} and {w2.dtype}")
    tokens, hidden = x.shape
    if tokens == 0:  # the kernels need a token; no tokens is no work
        return x.new_zeros(0, hidden)
    experts = router_logits.shape[1]
    local, two_inter, _ = w13.shape
    inter = two_inter // 2
    device = x.device
    if expert_map is None:
        if local != experts:
            raise ValueError(
                f"moe: w13 holds {local} experts and the router {experts}: pass expert_map "
                "(global expert -> local index, -1 elsewhere) for expert parallelism"
            )
        expert_map = torch.arange(experts, device=device, dtype=torch.int32)
    weights = torch.empty(tokens, topk, device=device, dtype=torch.float32)
    ids = torch.empty(tokens, topk, device=device, dtype=torch.int32)
    logits_ty = _name(router_logits.dtype, "router_logits", ("bf16", "f16", "f32"))
    ld = router_logits.stride(0)
    if n_group:
        if correction_bias is None:
            correction_bias = torch.zeros(experts, device=device, dtype=torch.float32)
        kernels.call(
            f"grouped_topk_{logits_ty}", weights, ids, span(router_logits),
            correction_bias.float().contiguous(), tokens, experts, ld, n_group, topk_group, topk,
            routed_scaling_factor,
        )
    else:
        kernels.call(
            f"topk_softmax_{logits_ty}", weights, ids, span(router_logits), tokens, experts, ld,
            topk, int(renormalize),
        )
    rows = block_m(tokens, topk, local)
    form = FORMS[rows]
    max_sorted = tokens * topk + experts * (rows - 1)
    sorted_ids = torch.empty(max_sorted, device=device, dtype=torch.int32)
    block_experts = torch.empty(-(-max_sorted // rows), device=device, dtype=torch.int32)
    padded = torch.empty(1, device=device, dtype=torch.int32)
    kernels.call(
        "moe_align_block_size", sorted_ids, block_experts, padded, ids, expert_map, tokens, topk,
        experts, local, rows,
    )
    h = torch.empty(tokens * topk, inter, device=device, dtype=x.dtype)
    kernels.call(
        f"moe_gemm_gated_silu{form}_{ty}", h, span(x), w13.contiguous(), sorted_ids,
        block_experts, padded, tokens, topk, local, inter, hidden, x.stride(0), h.stride(0),
    )
    out = torch.empty(tokens * topk, hidden, device=device, dtype=x.dtype)
    kernels.call(
        f"moe_gemm_down{form}_{ty}", out, h, w2.contiguous(), weights, sorted_ids,
        block_experts, padded, tokens, topk, local, hidden, inter, h.stride(0), out.stride(0),
    )
    y = torch.empty(tokens, hidden, device=device, dtype=x.dtype)
    kernels.call(
        f"moe_sum_{ty}", y, out, ids, expert_map, tokens, topk, experts, hidden, out.stride(0),
        y.stride(0),
    )
    return y


def define(library: torch.library.Library, namespace: str, kernels) -> bool:
    """Defines ``moe`` in ``library`` over ``kernels``; False (nothing defined) when the bundle
    has no MoE kernels for this device."""
    names = set(dir(kernels))
    if not {"moe_align_block_size", "moe_gemm_down_bf16", "moe_gemm_down_m16_bf16"} <= names:
        return False
    library.define(SCHEMA)
    library.impl("moe", lambda *args, **kw: forward(kernels, *args, **kw), "CUDA")

    def fake(x, *rest, **kw):
        return x.new_empty(x.shape)

    torch.library.register_fake(f"{namespace}::moe", fake, lib=library)
    return True
