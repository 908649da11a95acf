#!/usr/bin/env python3
"""The 8-bit GEMMs' AMD code objects (kernels/gemm_q8.hip) on tinygrad's CDNA emulator, against
a float64 reference from the same quantized values and scales. The emulator harness (code
object mapping, launch state, guarded buffers) is gemm_emu.py's; this adds the 8-bit cases.

usage: HK_TINYGRAD=<tinygrad source tree> gemm_q8_emu.py BUNDLE MODULE TARGETS
       (BUNDLE holds MODULE alone, built for the comma-separated AMD TARGETS;
       cargo test -p hk-tests --test gemm_q8_amd runs it when HK_TINYGRAD is set)

Skips cleanly (exit 0) as gemm_emu.py does. What the emulator cannot run, and what checks it
instead (amd-emulator.md lists the faults):
- int8, every target (NOT_EMULATED below): on gfx90a the emulator decodes with gfx942's opcode
  map, where v_mfma_i32_16x16x16i8's encoding is another instruction; on gfx942 and gfx950 it
  cannot compile its own model of v_mfma_i32_16x16x32_i8 / 16x16x64_i8. One case runs and is
  reported, never counted. Checked instead: statically (gemm_q8_amd.rs: the instruction and
  its count, no spills), and the same source's int8 path (copies, tile layout, scales,
  epilogue) on NVIDIA by gpu_parity; the AMD int8 atom's lane layout is mfma8.h's FP8 one,
  which runs here.
- gfx942 FP8: the emulator reads every FP8 byte as OCP E4M3, which gfx942's MFMA reads as FNUZ.
  For codes other than 0x80 and 0x7F / 0xFF an OCP value is exactly twice the FNUZ one (one
  less in the exponent bias; checked here on every code the inputs use, by two independent
  decoders), so the inputs avoid those codes and a_scale is passed divided by 4: every such
  result is labelled "corrected". Which format gfx942's code reads is proven statically
  (gemm_q8_amd.rs: ELF processor against the kernels' pointee types, and the compiler refusing
  OCP for gfx942).

- gemm_a16w8 (bf16 x FP8 weights widened to bf16, both formats): gfx942 and gfx950 run; gfx90a
  is not counted, as for gemm_emu.py's bf16 GEMMs (its bf16 MFMA decodes as another
  instruction). gfx942 widens FNUZ weights with its conversion instruction, which the emulator
  reads as OCP: those cases get b_scale halved (OCP = 2 x FNUZ, as above) and are labelled
  "corrected"; OCP weights there, and FNUZ weights on gfx950, are widened in software. Its
  split-K kernels run too, C (f32) added to from random values, K split SPLITK ways.

Each case checks C against the reference bound and that nothing outside C changed; each target
also runs a deliberately broken copy (its first 8-bit MFMA turned into another one), which must
fail.
"""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_emu  # noqa: E402
from gemm_emu import LLVM, POISON16, Buffer, CodeObject, file_offset, from_bits, kernel_metadata, launch, to_bits, unbundle  # noqa: E402

# (target, mnemonic) -> the high half of its first dword (llvm-mc -show-encoding), and the
# instruction a broken copy gets instead: i8 -> FP8 (f32 sums read as i32), i8 k64 -> k32 (half
# of k dropped), FP8 x FP8 -> FP8 x BF8 (B read as E5M2).
MFMA = {
    "gfx90a": {"i8": (0xD3D5, None), "bf16": (None, None)},
    "gfx942": {"i8": (0xD3D7, 0xD3F3), "fp8": (0xD3F3, 0xD3F2), "bf16": gemm_emu.MFMA_OPCODE["gfx942"]},
    "gfx950": {"i8": (0xD3B6, 0xD3D7), "fp8": (0xD3F3, 0xD3F2), "bf16": gemm_emu.MFMA_OPCODE["gfx950"]},
}
# (element kind, target) whose runs cannot count, and why (measured on the 2026-08 snapshot):
# one case runs and is reported, never counted.
NOT_EMULATED = {
    ("i8", "gfx90a"): "the emulator decodes gfx942's opcode map, in which v_mfma_i32_16x16x16i8 is another instruction",
    ("i8", "gfx942"): "the emulator's C for v_mfma_i32_16x16x32_i8 does not compile (int4 assigned to unsigned int4)",
    ("i8", "gfx950"): "the emulator's C for v_mfma_i32_16x16x64_i8 does not compile (int4 assigned to unsigned int4)",
    ("bf16", "gfx90a"): "the emulator decodes gfx942's opcode map, in which v_mfma_f32_16x16x16bf16_1k is another instruction",
}


def decode_e4m3(code, fnuz):
    """The value of an E4M3 byte: OCP (bias 7, 0x7F/0xFF NaN) or FNUZ (bias 8, 0x80 NaN)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 7
    if fnuz and code == 0x80 or not fnuz and code & 0x7F == 0x7F:
        return math.nan
    bias = 8 if fnuz else 7
    if exponent == 0:
        return sign * mantissa / 8 * 2.0 ** (1 - bias)
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - bias)


def element_bits(np, rng, count, element):
    """(uint8 bits, the float64 values they hold) for `count` random elements."""
    if element == "i8":
        bits = rng.integers(-128, 128, count).astype(np.int8).view(np.uint8)
        return bits, bits.view(np.int8).astype(np.float64)
    fnuz = element == "fp8_e4m3fnuz"
    # Every code but NaN and, so that the emulator's OCP reading is exactly twice the FNUZ
    # value, the codes the formats give other meanings (0x80, 0x7F, 0xFF).
    codes = np.array([c for c in range(256) if c not in (0x80, 0x7F, 0xFF)], dtype=np.uint8)
    bits = rng.choice(codes, count)
    table = np.array([decode_e4m3(c, fnuz) for c in range(256)])
    return bits, table[bits]


def check_ocp_is_twice_fnuz(bits):
    """The gfx942 correction's premise, on every code the inputs use."""
    for code in set(int(c) for c in bits):
        ocp, fnuz = decode_e4m3(code, False), decode_e4m3(code, True)
        # An independent decoder: FNUZ's value as E4M3 with bias 8, from the bits by arithmetic.
        assert ocp == 2 * fnuz, f"code {code:#x}: OCP {ocp} is not twice FNUZ {fnuz}"


def symbol(module, scales, bias):
    b = "_bias" if bias else ""
    if scales.startswith("a16w8_splitk_"):
        return f"gemm_a16w8_blockscale_splitk_{scales[len('a16w8_splitk_'):]}_nt{b}_f32"
    if module == "gemm_a16w8":
        return f"gemm_a16w8_blockscale_{scales[len('a16w8_'):]}_nt{b}_bf16"
    if scales.startswith("batched"):
        return f"batched_{module}_nt_bf16" if module == "gemm_a8w8" else f"batched_{module}_nt_per_token_bf16"
    if module == "gemm_a8w8":
        return f"gemm_a8w8_nt{b}_bf16"
    if scales == "blockscale":
        return f"gemm_fp8_blockscale_{module[len('gemm_fp8_'):]}_nt{b}_bf16"
    return f"{module}_nt_{scales}{b}_bf16"


def bias_buffer(np, rng, n):
    """A random bf16 bias of n values: (its guarded buffer, the values it holds)."""
    bits, values = to_bits(np, rng.uniform(-4, 4, n), "bf16")
    buf = Buffer(np, n, np.uint16, POISON16)
    buf.view[:] = bits
    return buf, values


def run_and_judge(np, run_asm, co, meta, kernels, name, pointers, scalars, c, shape, want, bound,
                  z=1):
    """Launches kernel `name` on `pointers` and `scalars` (the launch shape from its contract;
    z blocks along z for a split K), then judges C, `shape` = (rows, n, ldc), bf16 or (a
    split K's) f32, against `want` within `bound`: (ok, worst error over the bound). ok also
    needs the gaps between C's rows and C's guards untouched (poison, NaN in f32)."""
    rows, n, ldc = shape
    grid, block = gemm_emu.launch_shape(kernels, name, pointers, scalars, z)
    launch(run_asm, co, meta, name, grid, block, [p[0] for p in pointers] + scalars)
    f32 = c.view.dtype == np.float32
    got = np.stack([c.view[i * ldc:i * ldc + n] for i in range(rows)])
    got = got.astype(np.float64) if f32 else from_bits(np, got, "bf16")
    err = np.abs(got - want)
    ok = bool((err <= bound).all())
    worst = float(np.max(err / bound)) if not np.isnan(err).any() else math.inf
    gaps = [c.view[i * ldc + n:(i + 1) * ldc] for i in range(rows - 1)]
    if f32:
        guards = np.concatenate([c.full[:c.guard], c.full[c.guard + c.n:]])
        ok &= all(bool(np.isnan(g).all()) for g in gaps) and bool(np.isnan(guards).all())
    else:
        ok &= all(bool((g == POISON16).all()) for g in gaps) and c.guards_intact(POISON16)
    return ok, worst


def check(np, run_asm, co, meta, kernels, module, target, case, rng):
    """One case: (scales, bias, m, n, k, (pad a, pad b, pad c)). Returns (ok, worst, label).
    Scales "batched" and "batched_shared": two per-token products, the matrices 16 elements
    apart, or B shared (stride 0); their scales dense per product, C's rows m * ldc apart."""
    scales, bias, m, n, k, (pa, pb, pc) = case
    if module == "gemm_a16w8":
        return check_weight_only(np, run_asm, co, meta, kernels, target, case, rng)
    element = "i8" if module == "gemm_a8w8" else module[len("gemm_"):]
    lda, ldb, ldc = k + pa, k + pb, n + pc
    batch = 2 if scales.startswith("batched") else 1
    extent_a, extent_b = (m - 1) * lda + k, (n - 1) * ldb + k
    stride_a, stride_c = extent_a + 16, m * ldc
    stride_b = 0 if scales == "batched_shared" else extent_b + 16
    a_bits, a_vals = element_bits(np, rng, (batch - 1) * stride_a + extent_a, element)
    b_bits, b_vals = element_bits(np, rng, (batch - 1) * stride_b + extent_b, element)
    a = Buffer(np, a_bits.size, np.uint8, 0)
    b = Buffer(np, b_bits.size, np.uint8, 0)
    a.view[:], b.view[:] = a_bits, b_bits
    per_tensor, block = scales == "per_tensor", scales == "blockscale"
    groups = -(-k // 128)
    a_len, b_len = {"per_tensor": (1, 1), "per_token": (m, n), "batched": (2 * m, 2 * n),
                    "batched_shared": (2 * m, 2 * n),
                    "blockscale": (m * groups, -(-n // 128) * groups)}[scales]
    a_scale_vals = rng.uniform(0.5, 2, a_len).astype(np.float32)
    b_scale_vals = rng.uniform(0.5, 2, b_len).astype(np.float32)
    corrected = element == "fp8_e4m3fnuz"
    if corrected:
        check_ocp_is_twice_fnuz(np.concatenate([a_bits, b_bits]))
    a_scale = Buffer(np, a_scale_vals.size, np.float32, np.nan)
    b_scale = Buffer(np, b_scale_vals.size, np.float32, np.nan)
    # Exact: a power of two, the scales far from f32's subnormals.
    a_scale.view[:] = a_scale_vals / 4 if corrected else a_scale_vals
    b_scale.view[:] = b_scale_vals
    c = Buffer(np, (batch - 1) * stride_c + (m - 1) * ldc + n, np.uint16, POISON16)
    av = np.stack([a_vals[i * lda:i * lda + k] for i in range(m)])
    bv = np.stack([b_vals[j * ldb:j * ldb + k] for j in range(n)])
    if batch > 1:
        # Each product as the per-token one, stacked along C's rows.
        a64, b64 = a_scale_vals.astype(np.float64), b_scale_vals.astype(np.float64)
        sums, spread, scale = [], [], []
        for p in range(batch):
            ap = np.stack([a_vals[p * stride_a + i * lda:p * stride_a + i * lda + k] for i in range(m)])
            bp = np.stack([b_vals[p * stride_b + j * ldb:p * stride_b + j * ldb + k] for j in range(n)])
            sums.append(ap @ bp.T)
            spread.append(np.sqrt((ap * ap) @ (bp * bp).T))
            scale.append(np.outer(a64[p * m:(p + 1) * m], b64[p * n:(p + 1) * n]))
        sums, spread, scale = np.concatenate(sums), np.concatenate(spread), np.concatenate(scale)
        want = sums * scale
        rounding_terms = 4
    elif block:
        # Per 128-deep group g: a_scale[i][g] * b_scale[j / 128][g] on the group's sum.
        a_s = a_scale_vals.astype(np.float64).reshape(m, groups)
        b_s = np.repeat(b_scale_vals.astype(np.float64).reshape(-1, groups), 128, axis=0)[:n]
        want = np.zeros((m, n))
        spread2 = np.zeros((m, n))
        magnitude = np.zeros((m, n))
        for g in range(groups):
            ks = slice(g * 128, min(k, g * 128 + 128))
            s_g = np.outer(a_s[:, g], b_s[:, g])
            part = (av[:, ks] @ bv[:, ks].T) * s_g
            want += part
            magnitude += np.abs(part)
            spread2 += ((av[:, ks] ** 2) @ (bv[:, ks] ** 2).T) * s_g * s_g
        # As the others' bound below with scale 1, and a rounding of the total per group.
        sums, scale, spread = magnitude, 1.0, np.sqrt(spread2)
        rounding_terms = groups + 3
    else:
        sums = av @ bv.T
        spread = np.sqrt((av * av) @ (bv * bv).T)
        scale = (a_scale_vals[0] * b_scale_vals[0] if per_tensor
                 else np.outer(a_scale_vals.astype(np.float64), b_scale_vals.astype(np.float64)))
        want = sums * scale
        rounding_terms = 4
    pointers = [(c.address, "bf16", c.n), (a.address, element, a.n), (b.address, element, b.n),
                (a_scale.address, "f32", a_scale.n), (b_scale.address, "f32", b_scale.n)]
    if bias:
        bias_buf, bias_vals = bias_buffer(np, rng, n)  # kept alive until the launch
        pointers.append((bias_buf.address, "bf16", n))
        want = want + bias_vals
    name = symbol(module, scales, bias)
    scalars = [m, n, k, lda, ldb, ldc] + ([batch, stride_a, stride_b, stride_c] if batch > 1 else [])
    # f32 sums (exact for int8), two f32 scalings and a bias add, then bf16's rounding.
    bound = (2.0 ** -8 * np.abs(want) + k * 2.0 ** -22 * spread * np.abs(scale)
             + rounding_terms * 2.0 ** -24 * np.abs(sums * scale) + 2.0 ** -130)
    ok, worst = run_and_judge(np, run_asm, co, meta, kernels, name, pointers, scalars, c,
                              (batch * m, n, ldc), want, bound)
    label = f"{name} m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc}" + (" corrected" if corrected else "")
    if batch > 1:
        label += f" batch={batch} strides={stride_a},{stride_b},{stride_c}"
    return ok, worst, label


def check_weight_only(np, run_asm, co, meta, kernels, target, case, rng):
    """A weight-only case: scales "a16w8_<format>", A bf16, B in that FP8 format, b_scale per
    128 x 128 block of B; as check() otherwise. Scales "a16w8_splitk_<format>" add the same to
    an f32 C from random values, K split SPLITK ways."""
    scales, bias, m, n, k, (pa, pb, pc) = case
    split = scales.startswith("a16w8_splitk_")
    element = "fp8_" + scales.split("_")[-1]
    lda, ldb, ldc = k + pa, k + pb, n + pc
    count_a, count_b = (m - 1) * lda + k, (n - 1) * ldb + k
    a_bits, a_vals = to_bits(np, rng.uniform(-1, 1, count_a) * 2.0 ** rng.integers(-6, 8, count_a), "bf16")
    b_bits, b_vals = element_bits(np, rng, count_b, element)
    a = Buffer(np, count_a, np.uint16, POISON16)
    b = Buffer(np, count_b, np.uint8, 0)
    a.view[:], b.view[:] = a_bits, b_bits
    groups = -(-k // 128)
    b_scale_vals = rng.uniform(0.5, 2, -(-n // 128) * groups).astype(np.float32)
    # gfx942 widens FNUZ with its conversion instruction, which the emulator reads as OCP.
    corrected = element == "fp8_e4m3fnuz" and target == "gfx942"
    if corrected:
        check_ocp_is_twice_fnuz(b_bits)
    b_scale = Buffer(np, b_scale_vals.size, np.float32, np.nan)
    b_scale.view[:] = b_scale_vals / 2 if corrected else b_scale_vals
    if split:
        c = Buffer(np, (m - 1) * ldc + n, np.float32, np.nan)
        start = rng.uniform(-4, 4, (m, n)).astype(np.float32)
        for i in range(m):
            c.view[i * ldc:i * ldc + n] = start[i]
    else:
        c = Buffer(np, (m - 1) * ldc + n, np.uint16, POISON16)
    av = np.stack([a_vals[i * lda:i * lda + k] for i in range(m)])
    bv = np.stack([b_vals[j * ldb:j * ldb + k] for j in range(n)])
    b_s = np.repeat(b_scale_vals.astype(np.float64).reshape(-1, groups), 128, axis=0)[:n]
    want, spread2, magnitude = np.zeros((m, n)), np.zeros((m, n)), np.zeros((m, n))
    for g in range(groups):
        ks = slice(g * 128, min(k, g * 128 + 128))
        part = (av[:, ks] @ bv[:, ks].T) * b_s[:, g]
        want += part
        magnitude += np.abs(part)
        spread2 += ((av[:, ks] ** 2) @ (bv[:, ks] ** 2).T) * b_s[:, g] ** 2
    pointers = [(c.address, "f32" if split else "bf16", c.n), (a.address, "bf16", a.n),
                (b.address, element, b.n), (b_scale.address, "f32", b_scale.n)]
    if bias:
        bias_buf, bias_vals = bias_buffer(np, rng, n)  # kept alive until the launch
        pointers.append((bias_buf.address, "bf16", n))
        want = want + bias_vals
    name = symbol("gemm_a16w8", scales, bias)
    scalars = [m, n, k, lda, ldb, ldc]
    # As the block scales' bound in check(): f32 sums, a rounding of the total per group; a
    # split K rounds C (f32) once more per split that adds to it.
    unit = 2.0 ** -8
    if split:
        magnitude = magnitude + np.abs(start) + np.abs(want)
        want = want + start
        unit = 2.0 ** -24 * (SPLITK + 1)
    bound = (unit * np.abs(want) + k * 2.0 ** -22 * np.sqrt(spread2)
             + (groups + 3) * 2.0 ** -24 * magnitude + 2.0 ** -130)
    ok, worst = run_and_judge(np, run_asm, co, meta, kernels, name, pointers, scalars, c,
                              (m, n, ldc), want, bound, SPLITK if split else 1)
    label = f"{name} m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc}" + (" corrected" if corrected else "")
    return ok, worst, label + (f" z={SPLITK}" if split else "")


# The weight-only split-K cases' split: more than one group per split, and splits left empty.
SPLITK = 3


def cases(module):
    if module == "gemm_a16w8":
        schemes = ["a16w8_e4m3fn", "a16w8_e4m3fnuz"]
    elif module == "gemm_a8w8":
        schemes = ["per_token"]
    else:
        schemes = ["per_tensor", "per_token", "blockscale"]
    out = []
    for scales in schemes:
        out += [
            (scales, False, 33, 70, 61, (2, 1, 2)),     # unaligned rows: element by element
            # 2 x 2 blocks, aligned rows: whole steps (the whole-chunk K loop, which the broken
            # copy's first MFMA lies in), then a K tail (the chunk-by-chunk loop).
            (scales, True, 130, 129, 288, (16, 0, 3)),
            (scales, True, 1, 17, 200, (0, 8, 0)),      # M = 1; rows of B unaligned
        ]
    if module == "gemm_a16w8":
        # Split K (decode): 5 groups over 3 splits, aligned rows over 2 x 3 blocks of 16 x 64;
        # 1 group (two splits empty), unaligned rows.
        return out + [
            ("a16w8_splitk_e4m3fn", True, 20, 130, 600, (0, 8, 1)),
            ("a16w8_splitk_e4m3fnuz", False, 5, 70, 61, (2, 1, 2)),
        ]
    # Batched: aligned matrices over 2 x 2 blocks; unaligned rows with one B for both products.
    out += [
        ("batched", False, 130, 129, 96, (16, 0, 3)),
        ("batched_shared", False, 33, 70, 61, (2, 1, 2)),
    ]
    return out


def broken_copy(data, co, kernel, target, element):
    """The code object with the first 8-bit MFMA of `kernel` turned into another one."""
    op, other = MFMA[target][element]
    start, size = co.symbols()[kernel]
    broken = bytearray(data)
    text = file_offset(broken, start)
    for at in range(text, text + size, 4):
        if struct.unpack_from("<H", broken, at + 2)[0] == op:
            struct.pack_into("<H", broken, at + 2, other)
            return bytes(broken)
    raise SystemExit(f"no {op:#x} MFMA in {kernel} for {target}")


def main():
    run_asm = gemm_emu.load_emulator()
    import numpy as np
    import hkload
    import hkload.testing
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    bundle, module, targets = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    element = {"gemm_a8w8": "i8", "gemm_a16w8": "bf16"}.get(module, "fp8")
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    print(f"gemm_q8_emu: {module}, seed {seed}")
    failed = counted = 0
    with tempfile.TemporaryDirectory() as tmp:
        for target in targets:
            reason = NOT_EMULATED.get((element, target))
            path = os.path.join(tmp, f"{target}.co")
            data = unbundle(bundle, target, path, module)
            meta = kernel_metadata(path)
            co = CodeObject(data)
            device = hkload.testing.simulated_device(f"{target}:sramecc+:xnack-")
            kernels = hkload.Bundle(bundle).load(device)
            if reason:
                case = cases(module)[0]
                try:
                    ok, worst, label = check(np, run_asm, co, meta, kernels, module, target, case, rng)
                    outcome = f"{'passed' if ok else 'failed'}, worst {worst:.3g} of the bound"
                except (RuntimeError, ValueError) as error:  # the emulator's own (compile, decode)
                    outcome = f"emulator error: {str(error)[:120]}"
                print(f"NOT COUNTED {target} {symbol(module, case[0], case[1])}: {reason}; this run {outcome}", flush=True)
                continue
            for case in cases(module):
                ok, worst, label = check(np, run_asm, co, meta, kernels, module, target, case, rng)
                failed += not ok
                counted += 1
                print(f"{'PASS' if ok else 'FAIL'} {target} {label}  worst {worst:.3f} of the bound", flush=True)
            kernel = symbol(module, cases(module)[1][0], True)
            broken = CodeObject(broken_copy(data, co, kernel, target, element))
            ok, worst, label = check(np, run_asm, broken, meta, kernels, module, target, cases(module)[1], rng)
            failed += ok
            print(f"{'caught' if not ok else 'NOT CAUGHT'} {target} broken kernel (one MFMA changed): {label}  worst {worst:.3g}", flush=True)
    print(f"gemm_q8_emu: {'FAILED' if failed else 'all passed'} ({failed} of {counted} counted cases failed)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
