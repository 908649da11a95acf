#!/usr/bin/env python3
"""The moe_gemm module's AMD code objects (the grouped MoE GEMMs and their combine) run on a CPU
emulator of the CDNA instruction set (tinygrad's test/mockgpu/amd/emu.py, a test instrument: see
/work/shared/amd-emulator.md), against a float64 reference. No AMD GPU runs anywhere here.

usage: HK_TINYGRAD=<tinygrad source tree> moe_gemm_emu.py BUNDLE [--target gfx942,gfx950]
       (cargo test -p hk-tests --test moe_gemm_amd runs it when HK_TINYGRAD is set)

Skips cleanly (exit 0, saying so) when HK_TINYGRAD is unset, as gemm_emu.py does, whose code
object loading and launching this reuses. Each case routes random tokens, builds the sorted
layout as moe_align_block_size does (block_m = 128, or 16 for the _m16 kernels: each local
expert's choices in ascending flat index, padded with the sentinel tokens * topk), launches with the contract's grid (hkload
on a simulated device of the target), and checks every written row against the f64 reference
with the bounds of tests/src/kernels/moe_gemm.rs, and that nothing else changed: the rows of
choices of experts that are not local (expert parallelism), the gaps between strided rows, the
guard bands around every buffer. Rows the kernels must not read (gaps, dropped choices' rows of
h and out) hold NaN. A deliberately broken copy (the first MFMA of moe_gemm_gated_silu_bf16 made
an f16 one) must fail.

gfx90a is left out: the emulator decodes every target with gfx942's opcode map, in which
gfx90a's v_mfma_f32_16x16x16bf16_1k encoding is another instruction.
"""

from __future__ import annotations

import math
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_emu  # noqa: E402
from gemm_emu import (MFMA_OPCODE, POISON16, Buffer, CodeObject, file_offset, from_bits,  # noqa: E402
                      kernel_metadata, launch, to_bits, unbundle)

# The GEMMs' forms: the kernel name's infix and its block of sorted rows (block_m).
BLOCK_M = {"": 128, "_m16": 16}

# (kernel, ty, tokens, experts, topk, n, k, pad_a, pad_c, local_every, routing)
# n and k: tails (not multiples of the blocks or of the 32-deep steps); pad: strided rows, odd
# ones not 16-byte aligned (the element-wise copies), aligned ones the whole-chunk walk;
# local_every 2: every second expert local; routing "one": expert 0 in every token (its rows
# fill two blocks), "few": only the first topk + 1 experts chosen (the others receive none).
# Kernels gated_m16 and down_m16: the decode form, blocks of 16 rows (1 and 3 tokens; 40
# tokens fill several blocks an expert; n past one block of 64 / 128 columns).
CASES = [
    ("gated", "bf16", 5, 4, 2, 70, 61, 3, 2, 1, "uniform"),
    ("gated", "f16", 40, 4, 2, 64, 96, 0, 0, 2, "uniform"),
    ("gated", "bf16", 150, 3, 2, 16, 40, 8, 0, 1, "one"),
    ("down", "bf16", 40, 3, 2, 130, 72, 0, 8, 1, "few"),
    ("down", "f16", 7, 4, 3, 33, 40, 1, 1, 2, "uniform"),
    ("gated_m16", "bf16", 1, 4, 2, 70, 61, 3, 2, 1, "uniform"),
    ("gated_m16", "f16", 40, 4, 2, 130, 96, 0, 0, 2, "one"),
    ("down_m16", "f16", 3, 4, 2, 33, 40, 1, 1, 1, "few"),
    ("down_m16", "bf16", 40, 3, 2, 136, 72, 0, 8, 2, "uniform"),
    ("sum", "bf16", 9, 4, 3, 300, 0, 1, 3, 2, "uniform"),
    ("sum", "f16", 3, 8, 2, 20, 0, 0, 0, 1, "uniform"),
]


def route(np, rng, tokens, experts, topk, local_every, routing):
    ids = []
    for _ in range(tokens):
        if routing == "one":
            ids += [0] + list(rng.choice(np.arange(1, experts), topk - 1, replace=False))
        elif routing == "few":
            ids += list(rng.choice(min(topk + 1, experts), topk, replace=False))
        else:
            ids += list(rng.choice(experts, topk, replace=False))
    expert_map, local = [], 0
    for g in range(experts):
        if g % local_every == local_every - 1:
            expert_map.append(local)
            local += 1
        else:
            expert_map.append(-1)
    return [int(e) for e in ids], expert_map, local


def align(ids, expert_map, local, block_m):
    """The sorted layout (sorted_token_ids, expert_ids, num_tokens_post_pad)."""
    choices = len(ids)
    max_sorted = choices + local * (block_m - 1)
    sorted_ids = [choices] * max_sorted
    expert_ids = [-1] * -(-max_sorted // block_m)
    at = 0
    for e in range(local):
        start = at
        for f, g in enumerate(ids):
            if expert_map[g] == e:
                sorted_ids[at] = f
                at += 1
        at = start + -(-(at - start) // block_m) * block_m
        for block in range(start // block_m, at // block_m):
            expert_ids[block] = e
    return sorted_ids, expert_ids, at


def rows_input(np, rng, ty, rows, cols, ld, keep):
    """(bits, values) of rows x cols values ld apart, NaN in the gaps and in rows not kept."""
    values = np.full(rows * ld, np.nan)
    grid = values.reshape(rows, ld)
    for r in range(rows):
        if keep(r):
            grid[r, :cols] = rng.uniform(-1, 1, cols)
    values = values[:(rows - 1) * ld + cols]
    bits, held = to_bits(np, values, ty)
    return bits, held


def i32_buffer(np, values):
    b = Buffer(np, len(values), np.int32, -7)
    b.view[:] = values
    return b


def run_case(np, run_asm, co, meta, kernels, case, rng, name_override=None):
    """Returns (ok, worst error / bound, label)."""
    import hkload

    kernel, ty, tokens, experts, topk, n, k, pad_a, pad_c, local_every, routing = case
    kind = kernel.split("_")[0]
    form = kernel[len(kind):]
    ids, expert_map, local = route(np, rng, tokens, experts, topk, local_every, routing)
    choices = tokens * topk
    local_of = [expert_map[g] for g in ids]
    u = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}[ty]
    tiny = 2.0 ** -25 if ty == "f16" else 0.0
    name = name_override or {"gated": f"moe_gemm_gated_silu{form}_{ty}",
                             "down": f"moe_gemm_down{form}_{ty}", "sum": f"moe_sum_{ty}"}[kind]
    ldc = n + pad_c
    inputs = []  # (buffer, element type) in the signature's order after the output
    want_rows = {}  # output row -> (want, bound)
    if kind in ("gated", "down"):
        lda = k + pad_a
        a_rows = tokens if kind == "gated" else choices
        keep = (lambda r: True) if kind == "gated" else (lambda r: local_of[r] >= 0)
        a_bits, a_vals = rows_input(np, rng, ty, a_rows, k, lda, keep)
        products = 2 if kind == "gated" else 1
        w_bits, w_vals = to_bits(np, rng.uniform(-1, 1, local * products * n * k), ty)
        w = w_vals.reshape(local, products * n, k)
        a = Buffer(np, len(a_bits), np.uint16, POISON16)
        a.view[:] = a_bits
        wb = Buffer(np, len(w_bits), np.uint16, POISON16)
        wb.view[:] = w_bits
        inputs += [(a, ty), (wb, ty)]
        if kind == "down":
            weights = rng.uniform(0.01, 1.0, choices).astype(np.float32)
            wt = Buffer(np, choices, np.float32, np.nan)
            wt.view[:] = weights
            inputs.append((wt, "f32"))
        sorted_ids, expert_ids, post_pad = align(ids, expert_map, local, BLOCK_M[form])
        inputs += [(i32_buffer(np, sorted_ids), "i32"), (i32_buffer(np, expert_ids), "i32"),
                   (i32_buffer(np, [post_pad]), "i32")]
        scalars = [tokens, topk, local, n, k, lda, ldc]
        for f in range(choices):
            e = local_of[f]
            if e < 0:
                continue
            row = a_vals[(f // topk if kind == "gated" else f) * lda:][:k]
            spread = np.sqrt((row * row) @ (w[e].T ** 2))
            sums = row @ w[e].T
            err = k * 2.0 ** -22 * spread
            if kind == "gated":
                gate, up = sums[:n], sums[n:]
                silu = gate / (1 + np.exp(-gate))
                want = silu * up
                bound = u * np.abs(want) + 1.2 * err[:n] * np.abs(up) + err[n:] * np.abs(silu) + tiny
            else:
                want = float(weights[f]) * sums
                bound = (u + 2.0 ** -24) * np.abs(want) + float(weights[f]) * err + tiny
            want_rows[f] = (want, bound)
        out_rows = choices
    else:
        ldo = n + pad_a
        o_bits, o_vals = rows_input(np, rng, ty, choices, n, ldo, lambda f: local_of[f] >= 0)
        o = Buffer(np, len(o_bits), np.uint16, POISON16)
        o.view[:] = o_bits
        inputs += [(o, ty), (i32_buffer(np, ids), "i32"), (i32_buffer(np, expert_map), "i32")]
        scalars = [tokens, topk, experts, n, ldo, ldc]
        for t in range(tokens):
            terms = [o_vals[f * ldo:][:n] for f in range(t * topk, (t + 1) * topk) if local_of[f] >= 0]
            want = np.sum(terms, axis=0) if terms else np.zeros(n)
            magnitude = np.sum(np.abs(terms), axis=0) if terms else np.zeros(n)
            want_rows[t] = (want, u * np.abs(want) + topk * 2.0 ** -24 * magnitude + tiny)
        out_rows = tokens
    c = Buffer(np, (out_rows - 1) * ldc + n, np.uint16, POISON16)
    pointers = [(c.address, ty, c.n)] + [(b.address, elem, b.n) for b, elem in inputs]
    args = [hkload.Pointer(address, elem, length) for address, elem, length in pointers] + scalars
    shape = getattr(kernels, name).launch_shape(*args)
    launch(run_asm, co, meta, name, tuple(shape["grid"]), tuple(shape["block"]),
           [address for address, _, _ in pointers] + scalars)

    ok, worst = True, 0.0
    full = np.full(out_rows * ldc, POISON16, dtype=np.uint16)
    full[:c.n] = c.view
    grid = full.reshape(out_rows, ldc)
    for r in range(out_rows):
        got = grid[r, :n]
        if r in want_rows:
            want, bound = want_rows[r]
            err = np.abs(from_bits(np, got.copy(), ty) - want)
            if np.isnan(err).any():
                ok, worst = False, math.inf
            else:
                ok &= bool((err <= bound).all())
                worst = max(worst, float((err / bound).max()))
        else:
            ok &= bool((got == POISON16).all())  # a dropped choice's row: never written
        ok &= bool((grid[r, n:] == POISON16).all())
    ok &= c.guards_intact(POISON16)
    dropped = sum(e < 0 for e in local_of)
    label = (f"{name} tokens={tokens} experts={experts} local={local} topk={topk} n={n} k={k} "
             f"pad={pad_a},{pad_c} routing={routing} dropped={dropped}")
    return ok, worst, label


def main():
    run_asm = gemm_emu.load_emulator()
    import numpy as np
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    bundle = args[0]
    targets = ["gfx942", "gfx950"]
    if "--target" in args:
        targets = args[args.index("--target") + 1].split(",")
    import hkload
    import hkload.testing

    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for target in targets:
            path = os.path.join(tmp, f"{target}.co")
            data = unbundle(bundle, target, path, module="moe_gemm")
            meta = kernel_metadata(path)
            co = CodeObject(data)
            device = hkload.testing.simulated_device(f"{target}:sramecc+:xnack-")
            kernels = hkload.Bundle(bundle).load(device)
            for case in CASES:
                ok, worst, label = run_case(np, run_asm, co, meta, kernels, case, rng)
                failed += not ok
                print(f"{'PASS' if ok else 'FAIL'} {target} {label}  worst {worst:.3f} of the bound", flush=True)
            # The broken kernel: the first bf16 MFMA of moe_gemm_gated_silu_bf16 made an f16 one.
            bf16_op, f16_op = MFMA_OPCODE[target]
            start, size = co.symbols()["moe_gemm_gated_silu_bf16"]
            broken = bytearray(data)
            text = file_offset(broken, start)
            for at in range(text, text + size, 4):
                if struct.unpack_from("<H", broken, at + 2)[0] == bf16_op:
                    struct.pack_into("<H", broken, at + 2, f16_op)
                    break
            else:
                raise SystemExit(f"no {bf16_op:#x} MFMA in moe_gemm_gated_silu_bf16 for {target}")
            ok, worst, label = run_case(np, run_asm, CodeObject(bytes(broken)), meta, kernels,
                                        CASES[1][:1] + ("bf16",) + CASES[1][2:], rng)
            failed += ok
            print(f"{'caught' if not ok else 'NOT CAUGHT'} {target} broken kernel (one MFMA bf16 -> f16): {label}  worst {worst:.3g}", flush=True)
    print(f"moe_gemm_emu: {'FAILED' if failed else 'all passed'} ({failed} failed)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
