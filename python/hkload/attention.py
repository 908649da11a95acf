"""Flash attention as one differentiable torch op over a bundle's ``attn_fwd_*`` and
``attn_bwd_*`` kernels: ``torch.ops.<namespace>.attention``, defined by
``hkload.torch.register`` when the bundle has them for the device.

>>> o, lse = torch.ops.hk.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
...                                 max_seqlen_k, 1 / math.sqrt(d), causal=True)
>>> o.float().square().sum().backward()       # q.grad, k.grad, v.grad from attn_bwd_*

q ``[total_q, heads_q, d_qk]``, k ``[total_k, heads_kv, d_qk]``, v ``[total_k, heads_kv, d_v]``
(bf16 or f16; token rows may be strided, as views of a fused projection are), packed sequences
delimited by ``cu_seqlens_*`` (int32, ``batch + 1``); returns O ``[total_q, heads_q, d_v]`` and
the log-sum-exp ``[heads_q, total_q]`` in f32. ``softcap``, ``causal`` (aligned bottom-right)
and ``window_left``/``window_right`` (-1 unbounded) as ``manifests/attention.toml`` states them.
The backward pass runs ``attn_bwd_delta``, ``attn_bwd_dq`` and ``attn_bwd_dkdv``; a gradient
of the LSE output is folded into delta (``d lse / d s = P``).
"""

from __future__ import annotations

import torch

SCHEMA = (
    "attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "SymInt max_seqlen_q, SymInt max_seqlen_k, float scale, float softcap=0.0, "
    "bool causal=False, SymInt window_left=-1, SymInt window_right=-1) -> (Tensor, Tensor)"
)
BACKWARD_SCHEMA = (
    "attention_backward(Tensor grad_o, Tensor grad_lse, Tensor q, Tensor k, Tensor v, Tensor o, "
    "Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, "
    "SymInt max_seqlen_k, float scale, float softcap, bool causal, SymInt window_left, "
    "SymInt window_right) -> (Tensor, Tensor, Tensor)"
)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16"}


def suffix(d: int, dv: int, dtype: torch.dtype) -> str:
    """The kernels' name for a head shape and element type: ``d128_bf16``, ``d192_dv128_f16``."""
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        raise TypeError(f"attention takes bfloat16 or float16 tensors, not {dtype}")
    return f"d{d}_{name}" if d == dv else f"d{d}_dv{dv}_{name}"


def rows(x: torch.Tensor) -> torch.Tensor:
    """``x [tokens, heads, dim]`` with each token's heads packed in one row (any row stride), as
    the kernels read it: a copy only where the heads are not."""
    if x.dim() != 3:
        raise ValueError(f"attention takes [tokens, heads, dim] tensors, not shape {tuple(x.shape)}")
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()


def span(x: torch.Tensor) -> torch.Tensor:
    """The contiguous 1-D span from a row tensor's first element to its last (each row packed,
    rows any stride apart), which hkload takes for a pointer (the kernel walks the rows with the
    row stride it is given)."""
    n = (x.shape[0] - 1) * x.stride(0) + x[0].numel()
    return torch.as_strided(x, (n,), (1,), x.storage_offset())


def call_forward(kernels, o, lse, q, k, v, cu_q, cu_k, max_q, scale, softcap=0.0, causal=False, left=-1, right=-1):
    """One ``attn_fwd_*`` launch: O into ``o [total_q, heads_q, d_v]`` and the log-sum-exp into
    ``lse [heads_q, total_q]`` (any row strides, as for q, k and v, whose heads each token row
    must hold side by side), for the packed sequences ``cu_q``/``cu_k`` delimit. The call the
    op's forward makes, for callers that bring their own outputs (a benchmark writing O into a
    poisoned buffer)."""
    (tq, hq, d), (tk, hkv, dv) = q.shape, v.shape
    kernels.call(
        f"attn_fwd_{suffix(d, dv, q.dtype)}", span(o), lse, span(q), span(k), span(v),
        cu_q, cu_k, cu_q.numel() - 1, tq, tk, max(max_q, 1), hq, hkv,
        q.stride(0), k.stride(0), v.stride(0), o.stride(0), lse.stride(0),
        scale, softcap, int(causal), left, right,
    )


def define(library: torch.library.Library, namespace: str, kernels) -> bool:
    """Defines ``attention`` and its backward in ``library`` over ``kernels``; False (nothing
    defined) when the bundle has no attention kernels for this device."""
    names = set(dir(kernels))
    if not any(name.startswith("attn_fwd_") for name in names):
        return False

    def forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, softcap=0.0, causal=False, left=-1, right=-1):
        q, k, v = rows(q), rows(k), rows(v)
        (tq, hq, _), (tk, _, dv) = q.shape, v.shape
        o = q.new_zeros(tq, hq, dv)
        lse = q.new_full((hq, tq), float("-inf"), dtype=torch.float32)
        if tq and tk:
            call_forward(kernels, o, lse, q, k, v, cu_q, cu_k, max_q, scale, softcap, causal, left, right)
        return o, lse

    def backward(grad_o, grad_lse, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, scale, softcap, causal, left, right):
        q, k, v, o, grad_o = rows(q), rows(k), rows(v), rows(o), rows(grad_o)
        (tq, hq, d), (tk, hkv, dv) = q.shape, v.shape
        dq, dk, dvv = q.new_zeros(tq, hq, d), k.new_zeros(tk, hkv, d), v.new_zeros(tk, hkv, dv)
        if not (tq and tk):
            return dq, dk, dvv
        name = suffix(d, dv, q.dtype)
        delta = torch.empty(hq, tq, device=q.device, dtype=torch.float32)
        kernels.call(
            f"attn_bwd_delta_{name.rsplit('_', 1)[1]}", delta, span(o), span(grad_o), tq, hq, dv,
            o.stride(0), grad_o.stride(0), delta.stride(0),
        )
        # d lse / d score = P: a gradient of the LSE joins dP's row term.
        delta = (delta - grad_lse.float()).contiguous()
        lse = lse.contiguous()
        def tail(max_seqlen):  # the arguments dQ's and dK/dV's kernels share
            return (
                lse, delta, cu_q, cu_k, cu_q.numel() - 1, tq, tk, max(max_seqlen, 1), hq, hkv,
                q.stride(0), k.stride(0), v.stride(0), grad_o.stride(0), lse.stride(0),
                scale, softcap, int(causal), left, right,
            )

        kernels.call(f"attn_bwd_dq_{name}", span(dq), span(q), span(k), span(v), span(grad_o), dq.stride(0), *tail(max_q))
        kernels.call(
            f"attn_bwd_dkdv_{name}", span(dk), span(dvv), span(q), span(k), span(v), span(grad_o),
            dk.stride(0), dvv.stride(0), *tail(max_k),
        )
        return dq, dk, dvv

    library.define(SCHEMA)
    library.define(BACKWARD_SCHEMA)
    library.impl("attention", forward, "CUDA")
    library.impl("attention_backward", backward, "CUDA")

    def forward_fake(q, k, v, cu_q, cu_k, max_q, max_k, scale, softcap=0.0, causal=False, left=-1, right=-1):
        return q.new_empty(q.shape[0], q.shape[1], v.shape[2]), q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)

    def backward_fake(grad_o, grad_lse, q, k, v, *rest):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    torch.library.register_fake(f"{namespace}::attention", forward_fake, lib=library)
    torch.library.register_fake(f"{namespace}::attention_backward", backward_fake, lib=library)
    op_backward = getattr(getattr(torch.ops, namespace), "attention_backward")

    def setup_context(ctx, inputs, output):
        q, k, v, cu_q, cu_k, max_q, max_k, scale, *options = inputs
        # The schema's defaults for options the call left out.
        softcap, causal, left, right = [*options] + [0.0, False, -1, -1][len(options) :]
        o, lse = output
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.options = (max_q, max_k, scale, softcap, causal, left, right)

    def autograd_backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        if grad_lse is None:
            grad_lse = torch.zeros_like(lse)
        if grad_o is None:
            grad_o = torch.zeros_like(o)
        dq, dk, dv = op_backward(grad_o, grad_lse, q, k, v, o, lse, cu_q, cu_k, *ctx.options)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None

    torch.library.register_autograd(
        f"{namespace}::attention", autograd_backward, setup_context=setup_context, lib=library
    )
    return True
