"""Every kernel of the bundle on a GPU, called on torch tensors with fresh random inputs and
compared with torch's own implementation in float64; the same calls through the registered
torch ops, eagerly, under ``torch.compile(fullgraph=True)``, and through
``torch.library.opcheck``. Needs torch and a GPU: skipped elsewhere (CI has neither)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU for torch", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import hkload  # noqa: E402
import hkload.torch  # noqa: E402
from conftest import readme_example  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
# (atol, rtol) against a float64 reference: the kernels compute in f32 and round once.
TOLERANCE = {"bf16": (2e-2, 2e-2), "f16": (2e-3, 2e-3), "f32": (2e-5, 2e-5)}


@dataclass
class Case:
    """One call of a kernel: its arguments, and the check of its outputs after the call."""

    kernel: str
    args: list
    check: Callable[[], None]


def close(got, want, suffix: str, what: str) -> None:
    atol, rtol = TOLERANCE[suffix]
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def split(kernel: str) -> tuple[str, str]:
    """`rmsnorm_bf16` -> (`rmsnorm`, `bf16`)."""
    stem, suffix = kernel.rsplit("_", 1)
    return stem, suffix


ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "tanh": torch.tanh,
}


def rope_reference(x, cos, sin, style: str):
    """(a, b) -> (a cos - b sin, b cos + a sin) over the pairs `style` forms among the first
    2 * cos.shape[-1] elements of each vector; the rest unchanged."""
    half = cos.shape[-1]
    out = x.double().clone()
    if style == "neox":
        first, second = slice(0, half), slice(half, 2 * half)
    else:
        first, second = slice(0, 2 * half, 2), slice(1, 2 * half, 2)
    a, b = out[..., first].clone(), out[..., second].clone()
    out[..., first] = a * cos - b * sin
    out[..., second] = b * cos + a * sin
    return out


def gemm_case(kernel: str, generator: torch.Generator) -> Case:
    """A call of one of the GEMMs (`gemm_a16w16_{nt,nn}_T[_bias][_out_f32]`, split K, batched,
    gated) on fresh random inputs, against torch.matmul in float64."""
    words = kernel.split("_")
    suffix = next(w for w in words if w in ("bf16", "f16"))
    dtype = DTYPES[suffix]
    m, n, k = 37, 70, 96

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device="cuda", dtype=torch.float64).to(dtype)

    out_f32 = kernel.endswith("_out_f32") or "splitk" in words
    out_suffix = "f32" if out_f32 else suffix
    odtype = torch.float32 if out_f32 else dtype
    a = randn(m, k)
    if "gated" in words:
        act = ACTIVATIONS["gelu_tanh" if "gelu" in words else "silu"]
        w_gate, w_up = randn(n, k), randn(n, k)
        c = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
        want = lambda: act(a.double() @ w_gate.double().t()) * (a.double() @ w_up.double().t())  # noqa: E731
        return Case(kernel, [c, a, w_gate, w_up, m, n, k, k, k, n], lambda: close(c, want(), suffix, kernel))
    nn = "nn" in words
    if words[0] == "batched":
        batch = 3
        a = randn(batch, m, k)
        b = randn(batch, k, n) if nn else randn(batch, n, k)
        c = torch.full((batch, m, n), float("nan"), dtype=dtype, device="cuda")
        want = lambda: a.double() @ (b.double() if nn else b.double().transpose(1, 2))  # noqa: E731
        args = [c, a, b, m, n, k, k, n if nn else k, n, batch, m * k, b[0].numel(), m * n]
        return Case(kernel, args, lambda: close(c, want(), suffix, kernel))
    b = randn(k, n) if nn else randn(n, k)
    bias = randn(n) if "bias" in words else None
    if "splitk" in words:  # C += A·Bᵀ (+ bias) into f32
        start = torch.randn(m, n, generator=generator, device="cuda", dtype=torch.float64).float()
        c = start.clone()
    else:
        start = None
        c = torch.full((m, n), float("nan"), dtype=odtype, device="cuda")

    def want():
        product = a.double() @ (b.double() if nn else b.double().t())
        product = product + (bias.double() if bias is not None else 0)
        return product + (start.double() if start is not None else 0)

    args = [c, a, b] + ([bias] if bias is not None else []) + [m, n, k, k, n if nn else k, n]
    return Case(kernel, args, lambda: close(c, want(), out_suffix, kernel))


def q8_gemm_case(kernel: str, generator: torch.Generator) -> Case:
    """A call of an 8-bit GEMM (`gemm_a8w8_nt[_bias]_bf16`, `gemm_fp8_<format>_nt_{per_tensor,
    per_token}[_bias]_bf16`, `gemm_fp8_blockscale_<format>_nt[_bias]_bf16`, and batched
    `batched_gemm_a8w8_nt_bf16`, `batched_gemm_fp8_<format>_nt_per_token_bf16`): C = (A·Bᵀ) ·
    a_scale · b_scale (+ bias) in bf16 (block scales: per 128-deep group; batched: per product),
    against float64 from the same 8-bit values and scales. Weight-only
    (`gemm_a16w8_blockscale_<format>_nt[_bias]_bf16`): A in bf16, no a_scale; its split-K form
    (`gemm_a16w8_blockscale_splitk_<format>_nt[_bias]_f32`) adds the same to an f32 C."""
    m, n, k = 37, 170, 300
    words = kernel.split("_")

    def uniform(*shape, low=-1.0, high=1.0):
        return torch.rand(*shape, generator=generator, device="cuda", dtype=torch.float64) * (high - low) + low

    def wide(x):  # float64 from int8 or FP8 (torch converts FP8 only to floats as wide as f32)
        return x.double() if x.dtype == torch.int8 else x.float().double()

    if words[0] == "batched":  # per-token scales per product: a_scale [batch][m], b_scale [batch][n]
        batch = 3
        # The int8 GEMM shares one weight among the products (stride_b = 0), the FP8 ones don't.
        shared = "a8w8" in words
        if shared:
            a = uniform(batch, m, k, low=-127, high=127).round().to(torch.int8)
            b = uniform(1, n, k, low=-127, high=127).round().to(torch.int8)
        else:
            dtype = FP8[fp8_format(kernel)]
            a, b = uniform(batch, m, k, low=-200, high=200).to(dtype), uniform(batch, n, k, low=-200, high=200).to(dtype)
        a_scale = uniform(batch, m, low=0.001, high=0.01).float()
        b_scale = uniform(batch, n, low=0.001, high=0.01).float()
        c = torch.full((batch, m, n), float("nan"), dtype=torch.bfloat16, device="cuda")

        def batched_want():  # B (1, n, k) broadcasts over the batch
            product = wide(a) @ wide(b).transpose(1, 2)
            return product * a_scale.double()[:, :, None] * b_scale.double()[:, None, :]

        strides = [m * k, 0 if shared else n * k, m * n]
        args = [c, a, b, a_scale, b_scale, m, n, k, k, k, n, batch] + strides
        return Case(kernel, args, lambda: close(c, batched_want(), "bf16", kernel))

    weight_only = kernel.startswith("gemm_a16w8")
    if kernel.startswith("gemm_a8w8"):
        a = uniform(m, k, low=-127, high=127).round().to(torch.int8)
        b = uniform(n, k, low=-127, high=127).round().to(torch.int8)
        a_scale, b_scale = uniform(m, low=0.001, high=0.01).float(), uniform(n, low=0.001, high=0.01).float()
    else:
        dtype = FP8[fp8_format(kernel)]
        a, b = uniform(m, k, low=-200, high=200).to(dtype), uniform(n, k, low=-200, high=200).to(dtype)
        groups = -(-k // 128)
        if weight_only:  # A in bf16 and unscaled
            a, a_scale = uniform(m, k, low=-4, high=4).to(torch.bfloat16), torch.ones(m, groups, device="cuda")
        if "blockscale" in kernel:  # per 1x128 group of A's rows, per 128x128 block of B
            if not weight_only:
                a_scale = uniform(m, groups, low=0.001, high=0.01).float()
            b_scale = uniform(-(-n // 128), groups, low=0.001, high=0.01).float()
        else:
            rows = (m, n) if "per_token" in kernel else (1, 1)
            a_scale, b_scale = (uniform(r, low=0.001, high=0.01).float() for r in rows)
    bias = uniform(n).to(torch.bfloat16) if "bias" in words else None
    split = "splitk" in words  # C += the product (+ bias), in f32
    start = uniform(m, n, low=-4, high=4).float() if split else None
    c = start.clone() if split else torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")

    def want():
        a64, b64 = wide(a), wide(b)
        if "blockscale" in kernel:
            product = torch.zeros(m, n, dtype=torch.float64, device="cuda")
            for g in range(groups):
                part = a64[:, 128 * g : 128 * (g + 1)] @ b64[:, 128 * g : 128 * (g + 1)].t()
                b_block = b_scale.double()[:, g].repeat_interleave(128)[:n]
                product += part * a_scale.double()[:, g, None] * b_block[None, :]
        else:
            product = (a64 @ b64.t()) * a_scale.double()[:, None] * b_scale.double()[None, :]
        product = product + (start.double() if split else 0)
        return product + (bias.double() if bias is not None else 0)

    scales = [b_scale] if weight_only else [a_scale, b_scale]
    args = [c, a, b] + scales + ([bias] if bias is not None else []) + [m, n, k, k, k, n]
    return Case(kernel, args, lambda: close(c, want(), "f32" if split else "bf16", kernel))


FP8 = {
    "fp8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e4m3fnuz": torch.float8_e4m3fnuz,
    "fp8_e5m2": torch.float8_e5m2,
    "fp8_e5m2fnuz": torch.float8_e5m2fnuz,
}


def fp8_format(kernel: str) -> str:
    """The FP8 format a kernel's name gives (`fp8_e4m3fn`, or `e4m3fn` in `gemm_fp8_blockscale_e4m3fn_*`)."""
    return next(name for name in sorted(FP8, key=len, reverse=True) if name.removeprefix("fp8_") in kernel)


def to_fp8(x, dtype):
    """torch's conversion (round to nearest even) made saturating as the kernels' is: values
    clamped to the format's largest first (NaN stays NaN). On the CPU, which converts to every
    format."""
    top = torch.finfo(dtype).max
    return x.float().cpu().clamp(-top, top).to(dtype).cuda()


def same_codes(got, want, what: str) -> None:
    """The same FP8 codes, or both NaN."""
    g, w = got.view(torch.uint8), want.view(torch.uint8)
    both_nan = got.float().isnan() & want.float().isnan()
    wrong = (g != w) & ~both_nan
    assert not wrong.any(), f"{what}: {int(wrong.sum())} codes differ, first at {wrong.nonzero()[0].tolist()}: got {g[wrong][0]:#04x}, want {w[wrong][0]:#04x}"


def fp8_case(kernel: str, generator: torch.Generator) -> Case:
    """The FP8 conversions and quantizations against torch's own conversion."""
    name = fp8_format(kernel)
    dtype = FP8[name]
    top = torch.finfo(dtype).max

    def randn(*shape, scale=1.0, like=torch.bfloat16):
        return (torch.randn(*shape, generator=generator, device="cuda", dtype=torch.float64) * scale).to(like)

    def poisoned(*shape, like=dtype):
        return torch.full(shape, 0xFF, dtype=torch.uint8, device="cuda").view(like) if like in FP8.values() else torch.full(shape, float("nan"), dtype=like, device="cuda")

    if kernel.startswith("cast_f32_to_"):
        special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, top, -top, 2 * top], device="cuda")
        x = torch.cat([randn(4099, scale=top / 2, like=torch.float32), randn(1000, scale=1e-3, like=torch.float32), special])
        out = poisoned(x.numel())
        return Case(kernel, [out, x, x.numel()], lambda: same_codes(out, to_fp8(x, dtype), kernel))
    if kernel.startswith("cast_"):
        codes = torch.arange(256, dtype=torch.uint8, device="cuda").view(dtype)
        out = poisoned(256, like=torch.float32)
        want = codes.cpu().float().cuda()
        return Case(kernel, [out, codes, 256], lambda: torch.testing.assert_close(out, want, atol=0, rtol=0, equal_nan=True, msg=lambda m: f"{kernel}: {m}"))

    def ieee_quotient(amax, top):
        # amax / top rounded once to f32, as the kernels divide: torch's CUDA division by a
        # Python number multiplies by its reciprocal (1 ulp off at times); f64 then f32 rounds
        # a quotient correctly.
        return (amax.double() / top).float()

    def quantized(x, scale):
        return to_fp8(x.float() / scale, dtype)

    def check_quant(out, scales, want, want_scales):
        same_codes(out, want, kernel)
        torch.testing.assert_close(scales, want_scales, atol=0, rtol=0, msg=lambda m: f"{kernel} scales: {m}")

    rows, cols = 5, 1000
    if kernel.startswith("quant_fp8_per_tensor"):
        n = 40_000
        x = randn(n, scale=50.0)
        scale = (x.float().abs().amax() * 0.9 / top).reshape(1)
        out = poisoned(n)
        return Case(kernel, [out, x, scale, n], lambda: same_codes(out, quantized(x, scale), kernel))
    if kernel.startswith("quant_fp8_per_token"):
        x = randn(rows, cols, scale=3.0)
        out, scales = poisoned(rows, cols), poisoned(rows, like=torch.float32)
        want_scales = ieee_quotient(x.abs().amax(dim=1), top)
        return Case(kernel, [out, scales, x, rows, cols], lambda: check_quant(out, scales, quantized(x, want_scales[:, None]), want_scales))
    if kernel.startswith("quant_fp8_block"):
        cols = 1024  # whole groups here; partial ones are the Rust suite's
        x = randn(rows, cols, scale=3.0)
        groups = cols // 128
        out, scales = poisoned(rows, cols), poisoned(rows, groups, like=torch.float32)
        want_scales = ieee_quotient(x.reshape(rows, groups, 128).abs().amax(dim=2), top)
        want = quantized(x.reshape(rows, groups, 128), want_scales[..., None]).reshape(rows, cols)
        return Case(kernel, [out, scales, x, rows, cols], lambda: check_quant(out, scales, want, want_scales))
    if kernel.startswith("rmsnorm_quant_fp8"):
        x, weight = randn(rows, cols), randn(cols) + 1
        out, scales = poisoned(rows, cols), poisoned(rows, like=torch.float32)
        normed = F.rms_norm(x.double(), (cols,), weight.double(), 1e-6).to(torch.bfloat16).double()

        def check():
            # One FP8 step (2^-3 relative for E4M3) from the device's approximate rsqrt.
            step = 2.0 ** -3 * normed.abs().amax(dim=1, keepdim=True)
            err = (out.double() * scales.double()[:, None] - normed).abs()
            assert (err <= step).all(), f"{kernel}: worst error {float(err.max())}"

        return Case(kernel, [out, scales, x, weight, 1e-6, rows, cols], check)
    raise AssertionError(f"no torch reference for {kernel}: add one to this suite")


def attention_case(kernel: str, generator: torch.Generator) -> Case:
    """A call of one attention kernel (`attn_fwd_*`, `attn_bwd_{delta,dq,dkdv}_*`) on two packed
    causal sequences with GQA 2/1, against the float64 reference of test_attention.py (and its
    autograd gradients); the backward kernels get the reference's O, LSE and delta."""
    from test_attention import reference

    words = kernel.split("_")
    suffix = words[-1]
    dtype = DTYPES[suffix]
    dims = [int(w.removeprefix("dv").removeprefix("d")) for w in words if w[0] == "d" and w[-1].isdigit()]
    d, dv = (dims[0], dims[-1]) if dims else (64, 64)
    lengths, hq, hkv = [5, 70], 2, 1
    tokens = sum(lengths)
    cu = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)

    def rand(*shape):
        return (torch.rand(*shape, generator=generator, device="cuda", dtype=torch.float64) * 2 - 1).to(dtype)

    q, k, v, grad_o = rand(tokens, hq, d), rand(tokens, hkv, d), rand(tokens, hkv, dv), rand(tokens, hq, dv)
    scale = 1 / d**0.5
    leaves = [x.double().requires_grad_(True) for x in (q, k, v)]
    want_o, want_lse = reference(*leaves, lengths, scale, causal=True)
    (want_o * grad_o.double()).sum().backward()
    o = want_o.detach().to(dtype)
    lse = want_lse.detach().float().contiguous()
    delta = (o.double() * grad_o.double()).sum(-1).T.contiguous()
    common = [lse, delta.float(), cu, cu, len(lengths), tokens, tokens, max(lengths), hq, hkv,
              hq * d, hkv * d, hkv * dv, hq * dv, tokens, scale, 0.0, 1, -1, -1]
    scale_of = lambda t: t.abs().max().item()  # noqa: E731

    def grad_close(got, want, what):
        torch.testing.assert_close(got.double(), want, atol=8 * TOLERANCE[suffix][0] * scale_of(want), rtol=0, msg=lambda m: f"{what}: {m}")

    if words[1] == "fwd":
        out = torch.full((tokens, hq, dv), float("nan"), dtype=dtype, device="cuda")
        lse_out = torch.full((hq, tokens), float("nan"), device="cuda")
        args = [out, lse_out, q, k, v, cu, cu, len(lengths), tokens, tokens, max(lengths), hq, hkv,
                hq * d, hkv * d, hkv * dv, hq * dv, tokens, scale, 0.0, 1, -1, -1]

        def check():
            close(out, want_o.detach(), suffix, kernel)
            torch.testing.assert_close(lse_out.double(), want_lse.detach(), atol=1e-4, rtol=0)

        return Case(kernel, args, check)
    if words[2] == "delta":
        out = torch.full((hq, tokens), float("nan"), device="cuda")
        args = [out, o, grad_o, tokens, hq, dv, hq * dv, hq * dv, tokens]
        return Case(kernel, args, lambda: torch.testing.assert_close(out.double(), delta, atol=1e-4, rtol=1e-5))
    if words[2] == "dq":
        dq = torch.full((tokens, hq, d), float("nan"), dtype=dtype, device="cuda")
        args = [dq, q, k, v, grad_o, hq * d] + common
        return Case(kernel, args, lambda: grad_close(dq, leaves[0].grad, kernel))
    dk = torch.full((tokens, hkv, d), float("nan"), dtype=dtype, device="cuda")
    dvv = torch.full((tokens, hkv, dv), float("nan"), dtype=dtype, device="cuda")
    args = [dk, dvv, q, k, v, grad_o, hkv * d, hkv * dv] + common

    def check():
        grad_close(dk, leaves[1].grad, f"{kernel} dk")
        grad_close(dvv, leaves[2].grad, f"{kernel} dv")

    return Case(kernel, args, check)


def case(kernel: str, generator: torch.Generator) -> Case:
    """A call of `kernel` on fresh random inputs, with the float64 torch reference."""
    if kernel.startswith("attn_"):
        return attention_case(kernel, generator)
    if kernel.startswith(("gemm_a8w8", "gemm_a16w8", "gemm_fp8", "batched_gemm_a8w8", "batched_gemm_fp8")):
        return q8_gemm_case(kernel, generator)
    if "gemm" in kernel:
        return gemm_case(kernel, generator)
    if "fp8" in kernel:
        return fp8_case(kernel, generator)
    stem, suffix = split(kernel)
    dtype = DTYPES[suffix]

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator, device="cuda", dtype=torch.float64) * scale).to(dtype)

    def empty(*shape, like_dtype=dtype):
        return torch.full(shape, float("nan"), dtype=like_dtype, device="cuda") if like_dtype.is_floating_point else torch.zeros(shape, dtype=like_dtype, device="cuda")

    if stem in ACTIVATIONS:
        n = 4099
        x, out = randn(n, scale=3.0), empty(n)
        return Case(kernel, [out, x, n], lambda: close(out, ACTIVATIONS[stem](x.double()), suffix, kernel))
    if stem.endswith("_and_mul"):
        rows, cols = 5, 1031
        x, out = randn(rows, 2 * cols, scale=3.0), empty(rows, cols)
        act = ACTIVATIONS[stem.removesuffix("_and_mul")]
        want = lambda: act(x[:, :cols].double()) * x[:, cols:].double()  # noqa: E731
        return Case(kernel, [out, x, rows, cols], lambda: close(out, want(), suffix, kernel))
    if stem in ("rmsnorm", "layernorm", "fused_add_rmsnorm", "fused_add_layernorm"):
        rows, cols, eps = 6, 4099, 1e-5
        x, weight, bias, out = randn(rows, cols), randn(cols), randn(cols), empty(rows, cols)
        fused = stem.startswith("fused_add_")
        residual = randn(rows, cols)
        stored = (x.double() + residual.double()).to(dtype)  # the sum the fused kernels keep
        source = stored if fused else x

        def norm(v):
            if stem.endswith("rmsnorm"):
                return F.rms_norm(v.double(), (cols,), weight.double(), eps)
            return F.layer_norm(v.double(), (cols,), weight.double(), bias.double(), eps)

        def check():
            close(out, norm(source), suffix, kernel)
            if fused:
                close(residual, stored, suffix, f"{kernel} residual")

        args = [out] + ([residual] if fused else []) + [x, weight] + ([bias] if "layernorm" in stem else [])
        return Case(kernel, args + [eps, rows, cols], check)
    if stem == "softmax":
        rows, cols = 7, 3001
        x, out = randn(rows, cols, scale=4.0), empty(rows, cols)
        return Case(kernel, [out, x, rows, cols], lambda: close(out, torch.softmax(x.double(), -1), suffix, kernel))
    if stem == "topk":
        rows, n, k = 9, 2000, 32
        x = randn(rows, n)
        values, indices = empty(rows, k), empty(rows, k, like_dtype=torch.int32)

        def check():
            assert torch.equal(values, torch.topk(x, k, dim=-1).values), kernel
            assert torch.equal(x.gather(-1, indices.long()), values), f"{kernel} indices"

        return Case(kernel, [values, indices, x, rows, n, k], check)
    if stem.startswith("rope_"):
        _, style, layout = stem.split("_")
        heads, dim, rot_dim = 3, 128, 96
        angles = torch.rand(11, rot_dim // 2, generator=generator, device="cuda", dtype=torch.float64) * 6
        cos, sin = angles.cos().float(), angles.sin().float()
        if layout == "bhsd":
            batch, seq = 2, 11
            x, out = randn(batch, heads, seq, dim), empty(batch, heads, seq, dim)
            want = lambda: rope_reference(x, cos.double(), sin.double(), style)  # noqa: E731
            args = [out, x, cos, sin, batch, heads, seq, dim, rot_dim]
        else:
            tokens, table_rows = 13, 11
            positions = torch.randint(0, table_rows, (tokens,), generator=generator, device="cuda", dtype=torch.int32)
            x, out = randn(tokens, heads, dim), empty(tokens, heads, dim)
            rows = lambda t: t[positions.long()].double()[:, None, :]  # noqa: E731
            want = lambda: rope_reference(x, rows(cos), rows(sin), style)  # noqa: E731
            args = [out, x, cos, sin, positions, table_rows, tokens, heads, dim, rot_dim]
        return Case(kernel, args, lambda: close(out, want(), suffix, kernel))
    if stem.startswith("causal_conv1d"):
        batch, dim, seqlen, width = 2, 5, 1030, 4
        x, weight, bias, out = randn(batch, dim, seqlen), randn(dim, width), randn(dim), empty(batch, dim, seqlen)
        with_bias = stem.endswith("bias_silu")

        def want():
            padded = F.pad(x.double(), (width - 1, 0))
            y = F.conv1d(padded, weight.double()[:, None, :], bias.double() if with_bias else None, groups=dim)
            return F.silu(y) if with_bias else y

        args = [out, x, weight] + ([bias] if with_bias else []) + [batch, dim, seqlen, width]
        return Case(kernel, args, lambda: close(out, want(), suffix, kernel))
    raise AssertionError(f"no torch reference for {kernel}: add one to this suite")


@pytest.fixture(scope="module")
def kernels(bundle):
    return bundle.load(torch.device("cuda", 0))


@pytest.fixture(scope="module")
def ops(kernels):
    return hkload.torch.register(kernels, namespace="hk_test")


@pytest.fixture(scope="module")
def runnable(bundle, kernels) -> list[str]:
    """The bundle's kernels built for this GPU: an FP8 module for another target's format is
    not, and says so."""
    names = []
    for name in bundle.kernels:
        try:
            kernels[name]
        except hkload.NoCodeObjectError as absent:
            assert "by design" in str(absent), absent
            continue
        names.append(name)
    return names


@pytest.fixture
def generator():
    return torch.Generator(device="cuda").manual_seed(0x686B)


def modules(names) -> dict[str, list[str]]:
    """Kernel names grouped by their stem without the dtype (one compiled graph each)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(split(name)[0].split("_")[0], []).append(name)
    return groups


def test_every_kernel_matches_torch(runnable, kernels, generator):
    for name in runnable:
        call = case(name, generator)
        getattr(kernels, name)(*call.args)
        torch.cuda.synchronize()
        call.check()


def test_every_op_matches_torch_eagerly(runnable, ops, generator):
    for name in runnable:
        call = case(name, generator)
        getattr(ops, name)(*call.args)
        torch.cuda.synchronize()
        call.check()


def test_every_op_compiles_without_graph_breaks(runnable, ops, generator):
    for group in modules(runnable).values():
        torch._dynamo.reset()  # each group is a new graph of the same function
        calls = [case(name, generator) for name in group]

        def run(calls_args):
            for name, args in zip(group, calls_args):
                getattr(ops, name)(*args)

        torch.compile(run, fullgraph=True)([c.args for c in calls])
        torch.cuda.synchronize()
        for call in calls:
            call.check()


# opcheck's tests but its schema test (see below).
OPCHECK_WITHOUT_SCHEMA = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_opcheck_passes_for_every_op(runnable, ops, generator):
    for name in runnable:
        call = case(name, generator)
        # opcheck's schema test compares arguments before and after the call with operators
        # torch has no float8 kernels for ("mul_cuda" not implemented for 'Float8_e4m3fn'); the
        # other tests run for the FP8 kernels too.
        fp8 = any(isinstance(a, torch.Tensor) and a.dtype in FP8.values() for a in call.args)
        if fp8:
            torch.library.opcheck(getattr(ops, name).default, tuple(call.args), test_utils=OPCHECK_WITHOUT_SCHEMA)
        else:
            torch.library.opcheck(getattr(ops, name).default, tuple(call.args))


def test_launches_go_on_the_current_stream(kernels, generator):
    call = case("softmax_f32", generator)
    out = call.args[0]
    stream, observer = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time ahead of the kernel
        kernels.softmax_f32(*call.args)
    time.sleep(0.02)
    with torch.cuda.stream(observer):
        snapshot = out.clone()
    observer.synchronize()
    # Queued behind the sleep, the kernel has not run yet; on any other stream it would have.
    assert snapshot.isnan().all()
    stream.synchronize()
    call.check()


def test_an_fp8_tensor_of_the_other_family_is_refused_naming_both(kernels):
    out = torch.empty(16, device="cuda")
    fnuz = torch.zeros(16, device="cuda").to(torch.float8_e4m3fnuz)
    with pytest.raises(hkload.LaunchTypeError, match=r"fp8_e4m3fnuz \(torch.float8_e4m3fnuz, the FNUZ encoding\) is not fp8_e4m3fn \(torch.float8_e4m3fn, the OCP encoding\)"):
        kernels.cast_fp8_e4m3fn_to_f32(out, fnuz, 16)
    ocp = torch.zeros(16, device="cuda").to(torch.float8_e4m3fn)
    with pytest.raises(hkload.LaunchTypeError, match=r"fp8_e4m3fn \(torch.float8_e4m3fn, the OCP encoding\) is not fp8_e4m3fnuz"):
        kernels.cast_fp8_e4m3fnuz_to_f32(out, ocp, 16)


def test_tensor_checks_name_the_argument(kernels):
    x = torch.randn(4, 64, device="cuda")
    out = torch.empty_like(x)
    with pytest.raises(hkload.LaunchTypeError, match=r"argument 1 \(`x: \*const f32`\) expects a buffer of f32 \(`\*const f32`\), got a writable pointer to bf16"):
        kernels.softmax_f32(out, x.bfloat16(), 4, 64)
    with pytest.raises(hkload.LaunchValueError, match=r"argument 1 \(`x: \*const f32`\) must be contiguous, but the tensor of shape torch.Size\(\[64, 4\]\) has strides \(1, 64\)"):
        kernels.softmax_f32(out, x.T, 64, 4)
    with pytest.raises(hkload.LaunchValueError, match=r"argument 1 \(`x: \*const f32`\) is a tensor on cpu, but the kernel runs on a CUDA device"):
        kernels.softmax_f32(out, x.cpu(), 4, 64)
    with pytest.raises(hkload.LaunchValueError, match=r"argument 0 \(`out: \*mut f32`\) holds 255 elements, but the kernel may touch 256"):
        kernels.softmax_f32(out.view(-1)[1:], x, 4, 64)
    with pytest.raises(hkload.LaunchTypeError, match=r"argument 1 \(`x: \*const f32`\) expects .* got a tensor of torch.complex64"):
        kernels.softmax_f32(out, x.to(torch.complex64), 4, 64)


def test_dlpack_and_pointer_arguments_reach_the_kernel(kernels, generator):
    call = case("relu_f32", generator)
    out, x, n = call.args
    kernels.relu_f32(hkload.Pointer(out.data_ptr(), torch.float32, n), _DLPackOnly(x), n)
    torch.cuda.synchronize()
    call.check()


def test_the_readme_example_runs(capsys):
    exec(readme_example("hkload.torch.register"), {})
    printed = capsys.readouterr().out
    assert "rmsnorm_bf16(out: *mut bf16, x: *const bf16" in printed
    assert "argument 1 (`x: *const bf16`) must be contiguous" in printed


class _DLPackOnly:
    """A GPU array known to hkload only through DLPack, as a cupy or jax array would be."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None):
        return self.tensor.__dlpack__()

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()
