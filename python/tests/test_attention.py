"""The attention op (``torch.ops.<namespace>.attention``, hkload/attention.py) on a GPU: forward
and gradients against a float64 reference built from torch's own operations, on packed
sequences of mixed lengths with GQA, causal masks, windows and a soft-cap; ``opcheck``; and a
model using it under ``torch.compile(fullgraph=True)``, forward and backward. Needs torch and
a GPU: skipped elsewhere (CI has neither)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU for torch", allow_module_level=True)

import hkload  # noqa: E402
import hkload.torch  # noqa: E402
from conftest import readme_example  # noqa: E402

LENGTHS = [1, 7, 130, 64]  # one batch: a single token, a tail, two blocks and a tail, a block


@pytest.fixture(scope="module")
def ops(bundle):
    kernels = bundle.load(torch.device("cuda", 0))
    return hkload.torch.register(kernels, namespace="hk_attention_test")


def reference(q, k, v, lengths, scale, softcap=0.0, causal=False, left=-1, right=-1):
    """O and the LSE in float64, sequence by sequence and head by head, with the kernels' masks
    (bottom-right causal, windows) written out."""
    hq, hkv = q.shape[1], k.shape[1]
    outs, lses = [], []
    start = 0
    for n in lengths:
        qs, ks, vs = (x[start : start + n].double() for x in (q, k, v))
        ks = ks.repeat_interleave(hq // hkv, dim=1)
        vs = vs.repeat_interleave(hq // hkv, dim=1)
        s = torch.einsum("ihd,jhd->hij", qs, ks) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(n, device=q.device)[:, None]
        j = torch.arange(n, device=q.device)[None, :]
        visible = torch.ones(n, n, dtype=torch.bool, device=q.device)
        if causal:
            visible &= j <= i
        if left >= 0:
            visible &= j >= i - left
        if right >= 0 and not causal:
            visible &= j <= i + right
        s = s.masked_fill(~visible, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        outs.append(torch.einsum("hij,jhd->ihd", p, vs))
        lses.append(lse)
        start += n
    return torch.cat(outs), torch.cat(lses, dim=1)


def problem(d, dtype, heads=(4, 2), dv=None, fused=True):
    """Packed Q, K, V (views of one fused projection when `fused`) with gradients, and the
    sequence offsets."""
    dv = dv or d
    hq, hkv = heads
    tokens = sum(LENGTHS)
    gen = torch.Generator(device="cuda").manual_seed(d * 7 + hq)
    width = hq * d + hkv * d + hkv * dv
    qkv = (torch.rand(tokens, width, generator=gen, device="cuda") * 2 - 1).to(dtype)
    if not fused:
        qkv = qkv.clone()
    qkv.requires_grad_(True)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(tokens, hkv, dv)
    cu = torch.tensor([0, *LENGTHS], device="cuda").cumsum(0).to(torch.int32)
    return qkv, q, k, v, cu


OPTIONS = [
    dict(causal=True),
    dict(causal=False),
    dict(causal=True, left=40),
    dict(causal=False, left=20, right=5, softcap=15.0),
]


@pytest.mark.parametrize("d, dv", [(64, 64), (128, 128), (256, 256), (192, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_forward_and_gradients_match_float64(ops, d, dv, dtype, options):
    qkv, q, k, v, cu = problem(d, dtype, dv=dv)
    scale = 1 / math.sqrt(d)
    kw = dict(softcap=options.get("softcap", 0.0), causal=options["causal"],
              window_left=options.get("left", -1), window_right=options.get("right", -1))
    o, lse = ops.attention(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), scale, **kw)
    grad_o = torch.rand_like(o) * 2 - 1
    (o.float() * grad_o.float()).sum().backward()
    got_grad = qkv.grad.clone()

    qkv64 = qkv.detach().double().requires_grad_(True)
    hq, hkv = q.shape[1], k.shape[1]
    q64 = qkv64[:, : hq * d].view(-1, hq, d)
    k64 = qkv64[:, hq * d : (hq + hkv) * d].view(-1, hkv, d)
    v64 = qkv64[:, (hq + hkv) * d :].view(-1, hkv, dv)
    want_o, want_lse = reference(q64, k64, v64, LENGTHS, scale, options.get("softcap", 0.0),
                                 options["causal"], options.get("left", -1), options.get("right", -1))
    (want_o * grad_o.double()).sum().backward()

    eps = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    # The forward bound of the README (|V| <= 1); the gradients' sums run over up to 130 keys
    # or queries of products up to sqrt(d) in size, so their bound is scaled by their own
    # largest magnitude (the parity suite holds them to per-element bounds).
    torch.testing.assert_close(o.double(), want_o.detach(), atol=eps + 2 * d * d * 2.0**-24 * scale, rtol=0)
    finite = want_lse.isfinite()
    assert torch.equal(finite, lse.isfinite()), "rows that see no key, and only those, have LSE -inf"
    torch.testing.assert_close(lse.double()[finite], want_lse.detach()[finite], atol=1e-4, rtol=0)
    want_grad = qkv64.grad
    scale_of = want_grad.abs().max().item()
    torch.testing.assert_close(got_grad.double(), want_grad, atol=4 * eps * scale_of, rtol=0)


def test_a_gradient_of_the_lse_reaches_the_inputs(ops):
    qkv, q, k, v, cu = problem(64, torch.bfloat16, fused=False)
    _, lse = ops.attention(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), 0.125, causal=True)
    lse.sum().backward()
    got = qkv.grad.double()
    qkv64 = qkv.detach().double().requires_grad_(True)
    q64, k64, v64 = qkv64[:, :256].view(-1, 4, 64), qkv64[:, 256:384].view(-1, 2, 64), qkv64[:, 384:].view(-1, 2, 64)
    _, want_lse = reference(q64, k64, v64, LENGTHS, 0.125, causal=True)
    want_lse.sum().backward()
    torch.testing.assert_close(got, qkv64.grad, atol=4 * 2.0**-7 * qkv64.grad.abs().max().item(), rtol=0)
    assert got[:, 384:].abs().max() == 0, "V does not reach the LSE"


def test_opcheck(ops):
    _, q, k, v, cu = problem(128, torch.bfloat16, fused=False)
    args = (q.detach().requires_grad_(True), k.detach().requires_grad_(True), v.detach().requires_grad_(True),
            cu, cu, max(LENGTHS), max(LENGTHS), 1 / math.sqrt(128))
    torch.library.opcheck(ops.attention.default, args, {"causal": True})


def test_a_model_compiles_without_graph_breaks_forward_and_backward(ops):
    torch._dynamo.reset()
    hq, hkv, d = 4, 2, 64
    tokens = sum(LENGTHS)
    proj = torch.nn.Linear(128, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, *LENGTHS], device="cuda").cumsum(0).to(torch.int32)

    def model(x):
        qkv = proj(x)
        q = qkv[:, : hq * d].view(tokens, hq, d)
        k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
        v = qkv[:, (hq + hkv) * d :].view(tokens, hkv, d)
        o, _ = ops.attention(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), 0.125, causal=True)
        return o.float().square().mean()

    x = torch.randn(tokens, 128, dtype=torch.bfloat16, device="cuda")
    eager = model(x)
    eager.backward()
    eager_grad = proj.weight.grad.clone()
    proj.weight.grad = None
    compiled = torch.compile(model, fullgraph=True)(x)
    compiled.backward()
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(proj.weight.grad, eager_grad)


def test_the_readme_prefill_example_runs():
    exec(readme_example("attn_fwd_d128_bf16"), {})
