"""Fixtures shared by the suites: the repository's bundle (built by `scripts/setup`, or the
folder named by HKLOAD_BUNDLE) and arguments that satisfy any kernel's contract."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import hkload

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = Path(os.environ.get("HKLOAD_BUNDLE", ROOT / "dist" / "hk-kernels-0.1.0"))

# Integer arguments every kernel of the repository's bundle accepts: its contracts'
# requirements hold (k <= n, rot_dim <= dim and even, width >= 1, the GEMMs' leading
# dimensions at least their rows' widths and a batch's outputs apart, attention's head groups
# and row strides) and every buffer is small.
SIZES = {
    "m": 3,
    "lda": 5,
    "ldb": 96,
    "ldc": 96,
    "stride_a": 15,
    "stride_b": 480,
    "stride_c": 288,
    "n": 96,
    "rows": 3,
    "cols": 40,
    "k": 5,
    "batch": 2,
    "heads": 3,
    "seq": 4,
    "dim": 16,
    "rot_dim": 12,
    "tokens": 5,
    "table_rows": 7,
    "seqlen": 9,
    "width": 4,
    # Attention: 2 sequences over 3 query and 4 key tokens, GQA 2/1, rows wide enough for the
    # widest head (256) and d_v = 4 for delta's kernel, no window.
    "total_q": 3,
    "total_k": 4,
    "max_seqlen_q": 2,
    "max_seqlen": 2,
    "heads_q": 2,
    "heads_kv": 1,
    "ldq": 512,
    "ldo": 512,
    "lddo": 512,
    "lddq": 512,
    "ldk": 256,
    "ldv": 256,
    "lddk": 256,
    "lddv": 256,
    "ld_lse": 4,
    "ld_delta": 4,
    "d_v": 4,
    "causal": 1,
    "window_left": -1,
    "window_right": -1,
    # MoE routing: 8 experts in rows 10 apart, k = 5 of them; grouped: 2 groups of 4, both kept.
    "experts": 8,
    "ld": 10,
    "renormalize": 1,
    "n_group": 2,
    "topk_group": 2,
    # MoE alignment: 6 of the 8 experts local, blocks of 16 rows.
    "local_experts": 6,
    "block_m": 16,
    # MoE GEMMs: 5 tokens top-2 over the 8 experts, rows of h and out 96 wide (ldc), the
    # combine's y rows too (ldy).
    "topk": 2,
    "ldy": 96,
}


@pytest.fixture(scope="session")
def bundle() -> hkload.Bundle:
    if not BUNDLE.is_dir():
        pytest.fail(f"no bundle at {BUNDLE}: run scripts/setup (or set HKLOAD_BUNDLE)")
    return hkload.Bundle(BUNDLE)


def readme_example(needle: str) -> str:
    """The README's Python example that contains `needle`, reading the bundle under test."""
    text = (ROOT / "README.md").read_text()
    blocks = [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]
    (example,) = [block for block in blocks if needle in block]
    return example.replace('"dist/hk-kernels-0.1.0"', repr(str(BUNDLE)))


def extent(signature: hkload.Signature, name: str, sizes: dict[str, int]) -> int:
    """The elements pointer argument `name` may be touched at, by the kernel's own contract
    (its integer expression, evaluated over `sizes` with integer division)."""
    expression = dict(signature.extents)[name]
    return eval(expression.replace("/", "//"), {"__builtins__": {}}, {**CONTRACT_FUNCTIONS, **sizes})


# The functions of the contract language that extents use, on Python ints.
CONTRACT_FUNCTIONS = {
    "ceil_div": lambda a, b: -(-a // b),
    "min": lambda a, b: a if a < b else b,
    "max": lambda a, b: a if a > b else b,
}


def scalar(param: hkload.Param, sizes: dict[str, int]) -> int | float:
    return sizes[param.name] if param.name in sizes else 1e-5
