"""How the bench scripts call the bundle's kernels, described once for all of them.

Arguments go by name, the names of the kernel's parameters in its manifest (``c``, ``a``, ``b``,
``a_scale``, ``m``, ``lda`` ...), and ``arguments`` puts them in the order of the bundle's own
signature (``kernels[symbol].signature``): no script repeats an argument order, and a name that
is wrong or missing is an error that shows the signature. Each family's symbol names are made by
one function here, and the shapes the GEMM scripts share are listed here.

The attention forward's call is the one ``hkload.attention`` (the package's differentiable op)
makes, through its ``call_forward``. The parity tests describe the same calls in Rust
(``tests/src/kernels/*``, checked against the manifests there); Python cannot take them from
there, so the symbol names below repeat theirs.

Imports nothing but the standard library, so that it loads without torch or a GPU.
"""

from __future__ import annotations

from typing import Any

# The linear layers of Llama 3 (8B and 70B) as (N, K): attention's projections, the MLP's
# gate/up and down, at both sizes.
LLAMA3_LINEAR = [(4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672)]

_ORDER: dict[tuple[int, str], tuple[str, ...]] = {}


def order(kernels, symbol: str) -> tuple[str, ...]:
    """The names of ``symbol``'s parameters in the bundle's order."""
    key = (id(kernels), symbol)
    if key not in _ORDER:
        _ORDER[key] = tuple(param.name for param in kernels[symbol].signature.params)
    return _ORDER[key]


def arguments(kernels, symbol: str, **named: Any) -> tuple:
    """The arguments of a call of ``symbol`` given by name, in the order its signature takes
    them: for ``kernels.call(symbol, *args)``, made once outside a timed loop."""
    names = order(kernels, symbol)
    missing = [name for name in names if name not in named]
    unknown = [name for name in named if name not in names]
    if missing or unknown:
        raise TypeError(
            f"{kernels[symbol].signature}: "
            + "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"no parameter {', '.join(unknown)}" if unknown else "",
                )
                if part
            )
        )
    return tuple(named[name] for name in names)


def call(kernels, symbol: str, **named: Any) -> None:
    """Calls ``symbol`` with its arguments given by name."""
    kernels.call(symbol, *arguments(kernels, symbol, **named))


def dense(m: int, n: int, k: int, layout: str = "nt") -> dict[str, int]:
    """A GEMM's sizes with dense operands: C ``[m, n]``, A ``[m, k]``, B ``[n, k]`` (``nt``) or
    ``[k, n]`` (``nn``), rows one after another."""
    return {"m": m, "n": n, "k": k, "lda": k, "ldb": k if layout == "nt" else n, "ldc": n}


# ---- Symbols ---------------------------------------------------------------------------------


def gemm_symbol(layout: str, ty: str, bias: bool = False, out_f32: bool = False) -> str:
    """``gemm_a16w16_{nt,nn}_{bf16,f16}[_bias][_out_f32]``; layout ``splitk`` is the split-K
    kernel (``nt``, f32 C it adds to), ``gemm_a16w16_splitk_nt_{ty}[_bias]``."""
    if layout == "splitk":
        return f"gemm_a16w16_splitk_nt_{ty}" + ("_bias" if bias else "")
    return f"gemm_a16w16_{layout}_{ty}" + ("_bias" if bias else "") + ("_out_f32" if out_f32 else "")


def batched_gemm_symbol(layout: str, ty: str) -> str:
    return f"batched_gemm_a16w16_{layout}_{ty}"


def gated_gemm_symbol(act: str, ty: str) -> str:
    """C = act(A·W_gateᵀ) ⊙ (A·W_upᵀ): ``gemm_a16w16_gated_{silu,gelu_tanh}_{ty}``."""
    return f"gemm_a16w16_gated_{act}_{ty}"


def fp8_gemm_symbol(scales: str) -> str:
    """E4M3 (OCP) A and B in bf16 out, with scales ``per_tensor``, ``per_token`` (a row of A,
    a column of B) or ``block`` (DeepSeek-V3's 1 x 128 of A, 128 x 128 of B)."""
    if scales == "block":
        return "gemm_fp8_blockscale_e4m3fn_nt_bf16"
    return f"gemm_fp8_e4m3fn_nt_{scales}_bf16"


def a8w8_gemm_symbol() -> str:
    """int8 A and B with per-row scales, bf16 out."""
    return "gemm_a8w8_nt_bf16"


def a16w8_gemm_symbol(splitk: bool = False) -> str:
    """bf16 A, E4M3 B with 128 x 128 block scales; the split-K form adds to an f32 C."""
    if splitk:
        return "gemm_a16w8_blockscale_splitk_e4m3fn_nt_f32"
    return "gemm_a16w8_blockscale_e4m3fn_nt_bf16"


def rmsnorm_symbol(ty: str) -> str:
    return f"rmsnorm_{ty}"


def topk_softmax_symbol(ty: str) -> str:
    """Softmax over the experts, then the top k: ``topk_softmax_{bf16,f16,f32}``."""
    return f"topk_softmax_{ty}"


def grouped_topk_symbol(ty: str) -> str:
    """DeepSeek-V3's grouped sigmoid routing: ``grouped_topk_{bf16,f16,f32}``."""
    return f"grouped_topk_{ty}"


def moe_align_symbol() -> str:
    """Tokens sorted by expert and padded to the grouped GEMM's block of rows."""
    return "moe_align_block_size"
