"""The MoE layer op (``torch.ops.<namespace>.moe``, hkload/moe.py) on a GPU against a plain
PyTorch mixture of experts in float64 (a loop over the experts, routing included), for Mixtral-,
Qwen3-MoE- and DeepSeek-V3-shaped layers scaled to fit: token counts 1 to 1000, experts that get
no token, every token on one expert, an expert-parallel split whose ranks add up to the whole
layer; ``opcheck``; ``torch.compile(fullgraph=True)``; a CUDA graph capture. Needs torch and a
GPU: skipped elsewhere (CI has neither).

The bound, element by element: the kernels keep the gated activation h in x's type (one rounding,
u = 2^-8 for bf16) and sum in f32, so for y[t][j] = Σ_e w_e Σ_i W2[e][j][i] h_e[i]:
    |got - want| <= u |want| + u Σ_e w_e Σ_i |W2[e][j][i] h_e[i]| + 1e-5
(the second term: every h element one rounding off; the first: y's own rounding). A wrong
expert, weight or row is off by the order of |want| itself, which the relative RMS check
(<= 2^-6) also catches where the elementwise bound is loose."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU for torch", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import hkload  # noqa: E402
import hkload.torch  # noqa: E402
from conftest import readme_example  # noqa: E402

UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}

# (name, experts, topk, n_group, topk_group, hidden, inter): the models' routing at their own
# expert counts, hidden and intermediate sizes scaled down (DeepSeek-V3's hidden 7168 kept).
MODELS = [
    ("mixtral", 8, 2, 0, 0, 512, 384),
    ("qwen3_moe", 128, 8, 0, 0, 256, 192),
    ("deepseek_v3", 256, 8, 8, 4, 7168, 64),
]


@pytest.fixture(scope="module")
def ops(bundle):
    kernels = bundle.load(torch.device("cuda", 0))
    return hkload.torch.register(kernels, namespace="hk_moe_test")


def route(logits, topk, n_group, topk_group, bias, scale, renormalize=True):
    """The routing in float64, as the README's "MoE routing" section states it."""
    x = logits.double()
    if not n_group:
        p = torch.softmax(x, dim=-1)
        w, ids = p.topk(topk, dim=-1)
        return (w / w.sum(-1, keepdim=True) if renormalize else w), ids
    scores = torch.sigmoid(x)
    choice = scores + bias.double()
    groups = choice.view(x.shape[0], n_group, -1)
    kept = groups.topk(2, dim=-1).values.sum(-1).topk(topk_group, dim=-1).indices
    mask = torch.zeros(x.shape[0], n_group, device=x.device).scatter_(1, kept, 1.0)
    mask = mask.unsqueeze(-1).expand_as(groups).reshape(x.shape[0], -1)
    ids = choice.masked_fill(mask == 0, float("-inf")).topk(topk, dim=-1).indices
    w = scores.gather(1, ids)
    return w / w.sum(-1, keepdim=True) * scale, ids


def reference(x, w13, w2, weights, ids, expert_map=None):
    """y in float64 and its bound's sum term, looping over the (local) experts; h rounded to x's
    type as the kernels keep it."""
    tokens, hidden = x.shape
    inter = w13.shape[1] // 2
    y = torch.zeros(tokens, hidden, dtype=torch.float64, device=x.device)
    spread = torch.zeros_like(y)
    for e in range(w13.shape[0]):
        g = e if expert_map is None else int((expert_map == e).nonzero()[0])
        t, j = (ids == g).nonzero(as_tuple=True)
        if t.numel() == 0:
            continue
        xs = x[t].double()
        gate, up = w13[e, :inter].double(), w13[e, inter:].double()
        h = (F.silu(xs @ gate.T) * (xs @ up.T)).to(x.dtype).double()
        w = weights[t, j].double()[:, None]
        y.index_add_(0, t, w * (h @ w2[e].double().T))
        spread.index_add_(0, t, w.abs() * (h.abs() @ w2[e].double().abs().T))
    return y, spread


def check(got, want, spread, dtype):
    u = UNIT[dtype]
    err = (got.double() - want).abs()
    bound = u * want.abs() + u * spread + 1e-5
    assert torch.isfinite(got).all()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"worst error {worst:.3g} of the bound"
    rms = (err.square().mean() / want.square().mean().clamp_min(1e-30)).sqrt().item()
    assert rms <= 2.0**-6, f"relative RMS error {rms:.3g}"


def layer(model, tokens, dtype=torch.bfloat16, skew=False):
    _, experts, topk, n_group, topk_group, hidden, inter = model
    dev = "cuda"
    x = torch.randn(tokens, hidden, device=dev).to(dtype)
    logits = torch.randn(tokens, experts, device=dev)
    if skew:  # every token on the same experts: the first topk get far the largest logits
        logits[:, :topk] += 30.0
    w13 = (torch.randn(experts, 2 * inter, hidden, device=dev) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=dev) / inter**0.5).to(dtype)
    bias = torch.randn(experts, device=dev) * 0.1
    return x, logits, w13, w2, bias


@pytest.mark.parametrize("model", MODELS, ids=[m[0] for m in MODELS])
@pytest.mark.parametrize("tokens", [1, 3, 64, 1000])
def test_the_layer_matches_a_float64_loop_over_experts(ops, model, tokens):
    name, experts, topk, n_group, topk_group, *_ = model
    torch.manual_seed(tokens * 7 + experts)
    if name == "deepseek_v3" and tokens == 1000:
        tokens = 257  # hidden 7168: the float64 reference's cost, not the kernels', sets this
    x, logits, w13, w2, bias = layer(model, tokens)
    scale = 2.5 if n_group else 1.0
    y = ops.moe(x, logits.bfloat16(), w13, w2, topk, n_group=n_group, topk_group=topk_group,
                correction_bias=bias if n_group else None, routed_scaling_factor=scale)
    weights, ids = route(logits.bfloat16(), topk, n_group, topk_group, bias, scale)
    want, spread = reference(x, w13, w2, weights, ids)
    check(y, want, spread, x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_token_on_the_same_experts_and_experts_without_tokens(ops, dtype):
    model = MODELS[1]
    torch.manual_seed(3)
    x, logits, w13, w2, _ = layer(model, 300, dtype, skew=True)
    y = ops.moe(x, logits, w13, w2, 8, renormalize=False)
    weights, ids = route(logits, 8, 0, 0, None, 1.0, renormalize=False)
    assert (ids < 8).all()  # the skew did put every token on experts 0-7
    want, spread = reference(x, w13, w2, weights, ids)
    check(y, want, spread, dtype)


def test_expert_parallel_ranks_add_up_to_the_whole_layer(ops):
    model = MODELS[0]
    torch.manual_seed(5)
    x, logits, w13, w2, _ = layer(model, 64)
    weights, ids = route(logits, 2, 0, 0, None, 1.0)
    want, spread = reference(x, w13, w2, weights, ids)
    total = torch.zeros_like(want)
    # Two ranks: the even experts on one, the odd on the other.
    for parity in (0, 1):
        held = torch.arange(parity, 8, 2, device="cuda")
        expert_map = torch.full((8,), -1, dtype=torch.int32, device="cuda")
        expert_map[held] = torch.arange(4, dtype=torch.int32, device="cuda")
        y = ops.moe(x, logits, w13[held], w2[held], 2, expert_map=expert_map)
        part, part_spread = reference(x, w13[held], w2[held], weights, ids, expert_map)
        check(y, part, part_spread, x.dtype)
        total += y.double()
    check(total, want, 2 * spread, x.dtype)


def test_opcheck(ops):
    model = MODELS[0]
    x, logits, w13, w2, _ = layer(model, 5)
    torch.library.opcheck(ops.moe, (x, logits, w13, w2, 2))


def test_a_model_compiles_without_graph_breaks_and_captures_in_a_cuda_graph(ops):
    model = MODELS[2]
    torch.manual_seed(9)
    x, logits, w13, w2, bias = layer(model, 4)

    def step(x, logits):
        return ops.moe(x, logits, w13, w2, 8, n_group=8, topk_group=4, correction_bias=bias,
                       routed_scaling_factor=2.5)

    eager = step(x, logits)
    compiled = torch.compile(step, fullgraph=True)(x, logits)
    assert torch.equal(eager, compiled)
    graph = torch.cuda.CUDAGraph()
    step(x, logits)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = step(x, logits)
    x.copy_(torch.randn_like(x.float()).to(x.dtype))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, step(x, logits))


def test_the_readme_moe_example_runs():
    exec(readme_example("ops.moe("), {})
