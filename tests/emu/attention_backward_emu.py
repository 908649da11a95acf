#!/usr/bin/env python3
"""The attention backward module's AMD code objects (kernels/attention_backward.hip: delta, dQ
and dK/dV of flash attention over packed sequences) on tinygrad's CDNA emulator, against a
float64 reference with the semantics and the per-element error bounds of
tests/src/kernels/attention_backward.rs (head_grads and problem_cases, ported line by line).
The harness is gemm_emu.py's (code object mapping, launch state, guarded buffers, bf16/f16
rounding) and attention_emu.py's (the f64 forward pass, the 16-bit destination correction).

usage: HK_TINYGRAD=<tinygrad source tree> attention_backward_emu.py BUNDLE [--target gfx942,gfx950]
       (BUNDLE holds the attention_backward module; cargo test -p hk-tests --test attention_amd
       runs it when HK_TINYGRAD is set)

Skips cleanly (exit 0, saying so) as gemm_emu.py does; gfx90a is left out for its reason (the
emulator decodes every target with gfx942's opcode map).

Each problem runs the three kernels of one call, each fed what the kernels before it would give
it, as attention_backward.rs does: O and the LSE from the f64 forward pass (attention_emu.attend)
rounded to the element type and to f32, delta from the rounded O (f32). Q is drawn from
[-spread, spread], K, V and dO from [-1, 1], all rounded to the element type. Every head
dimension (64, 128, 256, 192/128) and type runs
- causal: sequences (5 queries, 37 keys), (33, 33), (17, 3) (its first 14 queries see no key),
  (0, 6) (keys no query sees) and (4, 0) (queries without keys), GQA 2/1, rows padded by 8
  (16-byte aligned: the vector copies and stores);
- window and soft-cap: (33, 33) and (5, 70) under a window of 9 keys left and 2 right (the
  second's first 56 keys seen by no query) with a soft-cap of 2, spread 2, GQA 2/1, the input
  rows padded by 3 (the element-by-element copies), the gradients' by 2 (their element path,
  4-byte aligned: see below);
and each head dimension one sequence of several own-row blocks on both sides, (70, 75), causal
in a window of 40 keys, GQA 4/2 (two key heads, two query heads each): f16 for d = 64 and 256,
bf16 for 128 and 192; and (20, 45), (45, 20) unmasked, MQA 4/1: bf16 for d = 64 and 256, f16
for 128 and 192. O's rows are 2 elements wider than dO's (delta reads both with their own
stride), and the LSE's and delta's padding holds NaN (a kernel that used it would fail). All of
it takes about 100 s (the first launch of a target compiles the emulator's instructions: ~10 s);
the seed is printed, and HK_EMU_SEED=<seed> draws the same inputs again.

Each kernel is judged by the reference's bound, element by element: delta by d_v 2^-23 sum
|O dO| (+1e-30), dQ, dK and dV by head_grads' sums (+ half an ulp of the result + 1e-7). Every
output starts poisoned (NaN, whose bound check fails where a kernel leaves it), the padding
between rows and the guard bands around every buffer must still hold their poison or fill, and
Q, K, V, dO, O, LSE, delta and the sequence offsets must be unchanged. The launch shapes are the
kernels' contracts, evaluated by hkload's Python package on a simulated device of the target.
Each target also runs a broken copy of attn_bwd_dq_d64_bf16 (its first bf16 MFMA turned into
the f16 one), of attn_bwd_dkdv_d128_f16 (the other way round) and of attn_bwd_delta_bf16 (its
first DPP add made to add each lane to itself), which must fail.

Three emulator corrections, each checked by a probe kernel compiled here against an independent
numpy model before anything runs (the stock emulator shown wrong on the same probe), and every
result that relied on one says so:
- attention_emu.py's: VOP1/VOP2 16-bit results in v128 and above written to their own register
  (gfx942's f16 dK/dV kernels convert with v_cvt_f16_f32_e32 into v128+);
- f16 MFMA inputs that are subnormal read as their values, not 0 (the fault listed in
  /work/shared/amd-emulator.md; gfx942's and gfx950's MFMAs keep them, while MI200's, gfx90a,
  flush them, as AMD's MIOpen documentation says, so gfx90a's hardware would behave like the
  stock emulator here, which this script does not run). It matters here: an
  f16 input below 2^-14 (Q, K, V and dO hold a few; P and dS a few more) lost its products:
  attn_bwd_dkdv_d128_f16's causal problem on gfx942 failed twice in about 160 runs, at 1.32 and
  1.02 times the bound, the second a dK of 6.3e-5 made of two terms, one of them 3.1e-7 from a
  subnormal Q. correct_f16_mfma_inputs() replaces the conversion's one line in the emulator's
  _compile_mfma;
- DPP with the destination also its swizzled source (`v_add_f32_dpp v0, v0, v0 quad_perm:...`,
  the delta kernels' 16-lane sum): the emulator runs an instruction's lanes one after another,
  so a lane reads its partner's register after the partner has already written it (the stock
  emulator gets 0 of the probe's 64 lanes right). correct_dpp_in_place() gives such an
  instruction a copy of its source: before it runs, the source row is copied to another VGPR
  (saved and restored around it) and the instruction's src0 byte points there.

An emulator gap, as in attention_emu.py: the gradients' element path (rows not 16-byte aligned)
is compiled into global_store_dwordx2 runs, and the emulator stores a dword to an address that
is not 4-byte aligned 2 bytes low. So the judged problems pad the gradients' rows by an even
count, and one problem per target with them padded by 3 is not judged by the bound: every wrong
gradient must be one that the store fault explains (a run of 4 stored at an address 2 mod 4
whose value sits 2 bytes lower), and delta must pass.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_emu  # noqa: E402
from attention_emu import attend, broken_copy, corrected_instructions, f32, probe_and_correct, visible  # noqa: E402
from gemm_emu import LLVM, POISON16, Buffer, CodeObject, from_bits, kernel_metadata, launch, to_bits, unbundle  # noqa: E402

EPSILON = {"bf16": 2.0 ** -7, "f16": 2.0 ** -10}  # half::bf16::EPSILON, half::f16::EPSILON
DIMS = [(64, 64), (128, 128), (256, 256), (192, 128)]


def suffix(ty, d, dv):
    return f"d{d}_{ty}" if d == dv else f"d{d}_dv{dv}_{ty}"


# ---- The DPP correction ------------------------------------------------------------------------

# The delta kernels' reduction over 16 lanes, each DPP step with its destination as its source.
DPP_PROBE_SOURCE = r"""
extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(64, 64)))
void dpp_same_register(float* out, const float* x) {
  const unsigned l = __builtin_amdgcn_workitem_id_x();
  float v = x[l];
  asm volatile("s_nop 1\n"
               "v_add_f32_dpp %0, %0, %0 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf bound_ctrl:1\n s_nop 1\n"
               "v_add_f32_dpp %0, %0, %0 quad_perm:[2,3,0,1] row_mask:0xf bank_mask:0xf bound_ctrl:1\n s_nop 1\n"
               "v_add_f32_dpp %0, %0, %0 row_half_mirror row_mask:0xf bank_mask:0xf bound_ctrl:1\n s_nop 1\n"
               "v_mov_b32_dpp %0, %0 row_mirror row_mask:0xf bank_mask:0xf\n s_nop 1"
               : "+v"(v));
  out[l] = v;
}
"""


def correct_dpp_in_place(emu):
    """Makes CDNA DPP instructions (VOP1/VOP2 DPP16) whose destination is their swizzled source
    read every lane's value from before the instruction. The stock emulator runs the lanes in
    turn, reading and writing the one register file, so a lane whose partner comes earlier reads
    the partner's new value. The compiled instruction reads its src0 register number from the
    code at run time, so the corrected one copies the source row to another VGPR T (not the
    source and not src1), points the instruction's src0 byte at T, runs it, and restores both.
    Other instructions (and DPP with a source other than the destination) run as they were."""
    stock = emu._get_runner
    dpp_kinds = (emu.irc.VOP1_DPP16, emu.irc.VOP2_DPP16)
    pc_lo, pc_hi = emu.PC_LO_IDX, emu.PC_HI_IDX

    def get_runner(inst_bytes, arch="rdna3"):
        prg, runtime = stock(inst_bytes, arch)
        inst = emu.decode_inst(inst_bytes, arch)
        if arch != "cdna" or not isinstance(inst, dpp_kinds):
            return prg, runtime
        inner = list(prg.arg.globals)
        mine = sorted(set(inner) | {0, 1})  # SGPRs (the PC) and VGPRs
        vop2 = isinstance(inst, emu.irc.VOP2_DPP16)

        def fxn(*buffers):
            at = dict(zip(mine, buffers))
            sgpr, vgpr = at[0].value, at[1].value
            pc = ctypes.c_uint32.from_address(sgpr + 4 * pc_lo).value | \
                (ctypes.c_uint32.from_address(sgpr + 4 * pc_hi).value << 32)
            word = ctypes.c_uint32.from_address(pc).value
            src0 = ctypes.c_uint8.from_address(pc + 4)
            source, dest = src0.value, (word >> 17) & 0xFF
            if source != dest:
                return runtime.fxn(*[at[g] for g in inner])
            busy = {source, (word >> 9) & 0xFF if vop2 else source}
            temp = next(r for r in range(255, -1, -1) if r not in busy)
            row = lambda r: vgpr + 4 * 64 * r  # noqa: E731 (VGPR r of the 64 lanes)
            saved = ctypes.string_at(row(temp), 256)
            ctypes.memmove(row(temp), row(source), 256)
            src0.value = temp
            try:
                return runtime.fxn(*[at[g] for g in inner])
            finally:
                src0.value = source
                ctypes.memmove(row(temp), saved, 256)

        return types.SimpleNamespace(arg=types.SimpleNamespace(globals=mine)), types.SimpleNamespace(fxn=fxn)

    get_runner.cache_clear = stock.cache_clear
    emu._get_runner = get_runner


def probe_and_correct_dpp(np, run_asm, target, tmp):
    """Runs DPP_PROBE_SOURCE on the stock emulator, applies correct_dpp_in_place and runs it
    again, each against a numpy model of the four DPP steps (each lane reads its partner's value
    from before the step). Returns (stock lanes right, corrected lanes right) of 64."""
    import test.mockgpu.amd.emu as emu

    source, path = os.path.join(tmp, "dpp.hip"), os.path.join(tmp, f"dpp.{target}.co")
    with open(source, "w") as f:
        f.write(DPP_PROBE_SOURCE)
    subprocess.run([f"{LLVM}/clang", "-x", "hip", f"--offload-arch={target}", "-nogpulib", "-nogpuinc",
                    "--cuda-device-only", "--no-gpu-bundle-output", "-O2", "-mcode-object-version=5",
                    "-o", path, source], check=True)
    co, meta = CodeObject(open(path, "rb").read()), kernel_metadata(path)
    x = (np.arange(64) * 3 + 1).astype(np.float32)  # small integers: every sum exact
    lane = np.arange(64)
    quad = lambda p: (lane & ~3) + np.array(p)[lane & 3]  # noqa: E731
    half_mirror = (lane & ~15) + ((lane & 8) | (7 - (lane & 7)))
    mirror = (lane & ~15) + (15 - (lane & 15))
    want = x.astype(np.float64)
    want = want + want[quad([1, 0, 3, 2])]
    want = want + want[quad([2, 3, 0, 1])]
    want = want + want[half_mirror]
    want = want[mirror]
    right = []
    for corrected in (False, True):
        if corrected:
            correct_dpp_in_place(emu)
        out = np.zeros(64, np.float32)
        launch(run_asm, co, meta, "dpp_same_register", (1, 1, 1), (64, 1, 1), [out.ctypes.data, x.ctypes.data])
        right.append(int((out == want).sum()))
    return tuple(right)


def dpp_in_place(path, target):
    """Kernel name -> how many of its DPP instructions have their source as their destination."""
    text = subprocess.run([f"{LLVM}/llvm-objdump", "-d", f"--mcpu={target}", path], capture_output=True,
                          text=True, check=True).stdout
    counts, name = {}, None
    for line in text.splitlines():
        if line.endswith(">:"):
            name = line[line.index("<") + 1:-2]
            counts[name] = 0
        m = re.match(r"\s+v_\w+_dpp v(\d+), v(\d+)[, ]", line)
        if m and name and m.group(1) == m.group(2):
            counts[name] += 1
    return counts


# ---- The f16 MFMA correction --------------------------------------------------------------------

# One v_mfma_f32_16x16x16_f16 over A with subnormal and normal f16 values.
MFMA_PROBE_SOURCE = r"""
typedef _Float16 half4 __attribute__((ext_vector_type(4)));
typedef float float4 __attribute__((ext_vector_type(4)));
extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(64, 64)))
void mfma_f16_subnormal(float* out, const _Float16* a, const _Float16* b) {
  const unsigned l = __builtin_amdgcn_workitem_id_x();
  half4 x, y;
  for (int e = 0; e < 4; ++e) {
    x[e] = a[4 * l + e];
    y[e] = b[4 * l + e];
  }
  const float4 c = __builtin_amdgcn_mfma_f32_16x16x16f16(x, y, float4{0, 0, 0, 0}, 0, 0, 0);
  for (int v = 0; v < 4; ++v) out[4 * l + v] = c[v];
}
"""
STOCK_F16_INPUT = "return exp.eq(_c(0)).where(_c(0), f32_bits)"
CORRECTED_F16_INPUT = ("return exp.eq(_c(0)).where((sign << _c(31)) | (mant.cast(dtypes.float32) * "
                       "UOp.const(2.0 ** -24, dtypes.float32)).bitcast(dtypes.uint32), f32_bits)")


def correct_f16_mfma_inputs(emu):
    """Makes the emulator's MFMAs read f16 subnormal inputs as their values (mantissa 2^-24, as
    gfx942's and gfx950's MFMAs do) rather than as 0: its f16 -> f32 conversion of A and B (in
    _compile_mfma) maps exponent 0 to 0. The one line is replaced in _compile_mfma's source,
    which is compiled again into the emulator's module (found exactly once, or this stops)."""
    import inspect

    source = inspect.getsource(emu._compile_mfma)
    if source.count(STOCK_F16_INPUT) != 1:
        raise RuntimeError("the emulator's MFMA f16 conversion is not the one this correction replaces")
    exec(compile(source.replace(STOCK_F16_INPUT, CORRECTED_F16_INPUT), emu.__file__, "exec"), emu.__dict__)
    emu._get_runner.cache_clear()
    emu._canonical_runner_cache.clear()


def probe_and_correct_mfma(np, run_asm, target, tmp):
    """Runs MFMA_PROBE_SOURCE on the stock emulator, applies correct_f16_mfma_inputs and runs it
    again, against numpy's f64 product (every product and sum exact in f32: A's values are
    multiples of 2^-24 below 2^-13, half of them subnormal, B's small integers), read through
    the 16x16x16 layout (lane l: A[l % 16][4 (l / 16) + e], B[4 (l / 16) + e][l % 16],
    D[4 (l / 16) + v][l % 16]). Returns (stock outputs right, corrected outputs right) of 256."""
    import test.mockgpu.amd.emu as emu

    source, path = os.path.join(tmp, "mfma.hip"), os.path.join(tmp, f"mfma.{target}.co")
    with open(source, "w") as f:
        f.write(MFMA_PROBE_SOURCE)
    subprocess.run([f"{LLVM}/clang", "-x", "hip", f"--offload-arch={target}", "-nogpulib", "-nogpuinc",
                    "--cuda-device-only", "--no-gpu-bundle-output", "-O2", "-mcode-object-version=5",
                    "-o", path, source], check=True)
    co, meta = CodeObject(open(path, "rb").read()), kernel_metadata(path)
    rng = np.random.default_rng(7)
    mantissa = np.where(rng.random((16, 16)) < 0.5, rng.integers(1, 1024, (16, 16)), rng.integers(1024, 2048, (16, 16)))
    a_matrix = (mantissa * 2.0 ** -24).astype(np.float16)
    b_matrix = rng.integers(-4, 5, (16, 16)).astype(np.float16)
    assert (a_matrix.astype(np.float64) == mantissa * 2.0 ** -24).all()
    lane = np.arange(64)[:, None]
    e = np.arange(4)[None, :]
    a = np.ascontiguousarray(a_matrix[lane % 16, 4 * (lane // 16) + e].reshape(-1))
    b = np.ascontiguousarray(b_matrix[4 * (lane // 16) + e, lane % 16].reshape(-1))
    d = a_matrix.astype(np.float64) @ b_matrix.astype(np.float64)
    want = d[4 * (lane // 16) + e, lane % 16].reshape(-1)
    right = []
    for corrected in (False, True):
        if corrected:
            correct_f16_mfma_inputs(emu)
        out = np.zeros(256, np.float32)
        launch(run_asm, co, meta, "mfma_f16_subnormal", (1, 1, 1), (64, 1, 1),
               [out.ctypes.data, a.ctypes.data, b.ctypes.data])
        right.append(int((out == want).sum()))
    return tuple(right)


# ---- The reference (tests/src/kernels/attention_backward.rs) ------------------------------------


def head_grads(np, x, span, h, p):
    """head_grads of attention_backward.rs for one (sequence, query head), vectorized: (dq, dq
    bound [sq, d]), (dk, dk bound [sk, d]), (dv, dv bound [sk, dv]) of its keys' shares."""
    q0, sq, k0, sk = span
    d, dv, ty, scale, cap = p["d"], p["dv"], p["ty"], p["scale"], p["softcap"]
    hk = h // (p["heads_q"] // p["heads_kv"])
    u = EPSILON[ty] / 2
    logit_err = d * d * 2.0 ** -24 * p["spread"] * scale
    dp_err = dv * dv * 2.0 ** -24
    qi = x["q"][q0:q0 + sq, h * d:(h + 1) * d]
    kj = x["k"][k0:k0 + sk, hk * d:(hk + 1) * d]
    vj = x["v"][k0:k0 + sk, hk * dv:(hk + 1) * dv]
    doi = x["d_o"][q0:q0 + sq, h * dv:(h + 1) * dv]
    lse = x["lse"][h, q0:q0 + sq]
    delta = x["delta"][h, q0:q0 + sq]
    seen = visible(np, sq, sk, p["causal"], p["left"], p["right"])
    n = seen.sum(axis=1).astype(np.float64)[:, None]
    # A row that sees no key adds nothing (its LSE, -inf, is never used).
    lse = np.where(seen.any(axis=1), lse, 0.0)[:, None]
    dot = qi @ kj.T
    logit = cap * np.tanh(dot * scale / cap) if cap > 0 else dot * scale
    with np.errstate(over="ignore"):
        prob = np.where(seen, np.exp(logit - lse), 0.0)
    dp = doi @ vj.T
    slope = 1.0 - (logit / cap) ** 2 if cap > 0 else 1.0
    ds = prob * (dp - delta[:, None]) * slope
    e_p = EPSILON[ty] / 2.0 + 2.0 ** -22 * (1.0 + np.abs(lse)) + logit_err  # probability_error
    e_slope = 2.0 * (e_p + 2.0 ** -22) / cap if cap > 0 else 0.0
    ds_err = prob * (np.abs(dp - delta[:, None]) * (e_p + u + e_slope + n * 2.0 ** -24) + dp_err)
    g = scale * (ds_err + u * np.abs(ds))
    return ((scale * ds @ kj, g @ np.abs(kj)), (scale * ds.T @ qi, g.T @ np.abs(qi)),
            (prob.T @ doi, (prob * (e_p + n * 2.0 ** -24)).T @ np.abs(doi)))


# ---- One problem -------------------------------------------------------------------------------


def problem(np, case, rng):
    """The inputs, the forward pass's outputs and the reference gradients of one case:
    (ty, (d, dv), seqs, (heads_q, heads_kv), (causal, left, right), softcap, spread,
    (pad of the inputs' rows, pad of the gradients' rows))."""
    ty, (d, dv), seqs, (heads_q, heads_kv), (causal, left, right), softcap, spread, (pad, pad_out) = case
    cu_q, cu_k = [0], [0]
    for sq, sk in seqs:
        cu_q.append(cu_q[-1] + sq)
        cu_k.append(cu_k[-1] + sk)
    total_q, total_k = max(cu_q[-1], 1), max(cu_k[-1], 1)
    scale, scale_bits = f32(1.0 / math.sqrt(d))
    cap, cap_bits = f32(softcap)
    p = dict(ty=ty, d=d, dv=dv, seqs=seqs, heads_q=heads_q, heads_kv=heads_kv, causal=causal, left=left,
             right=right, softcap=cap, spread=spread, scale=scale, scale_bits=scale_bits, cap_bits=cap_bits,
             cu_q=cu_q, cu_k=cu_k, total_q=total_q, total_k=total_k, batch=len(seqs),
             ldq=heads_q * d + pad, ldk=heads_kv * d + pad, ldv=heads_kv * dv + pad, lddo=heads_q * dv + pad,
             ldo=heads_q * dv + pad + 2, ld_lse=total_q + pad, lddq=heads_q * d + pad_out,
             lddk=heads_kv * d + pad_out, lddv=heads_kv * dv + pad_out, pad=pad, pad_out=pad_out)

    def rounded(rows, ld, width):
        bits, vals = to_bits(np, rng.uniform(-width, width, rows * ld), ty)
        return bits, vals.reshape(rows, ld)

    x, bits = {}, {}
    bits["q"], x["q"] = rounded(total_q, p["ldq"], spread)
    bits["k"], x["k"] = rounded(total_k, p["ldk"], 1.0)
    bits["v"], x["v"] = rounded(total_k, p["ldv"], 1.0)
    bits["d_o"], x["d_o"] = rounded(total_q, p["lddo"], 1.0)

    # The forward pass as its kernels would leave it: O rounded to the element type, LSE to f32.
    o = np.zeros((total_q, p["ldo"]))
    lse = np.full((heads_q, total_q), -np.inf)
    for b, (sq, sk) in enumerate(seqs):
        for h in range(heads_q):
            out, row_lse = attend(np, x["q"], x["k"], x["v"], (cu_q[b], sq, cu_k[b], sk), h,
                                  heads_q // heads_kv, (d, dv), (causal, left, right), scale, cap)
            o[cu_q[b]:cu_q[b] + sq, h * dv:(h + 1) * dv] = out
            lse[h, cu_q[b]:cu_q[b] + sq] = row_lse
    bits["o"], o_vals = to_bits(np, o.reshape(-1), ty)
    o_vals = o_vals.reshape(total_q, p["ldo"])
    x["lse"] = lse.astype(np.float32).astype(np.float64)
    # delta from the rounded O, and its bound; the next kernels read it in f32.
    od = np.stack([o_vals[:, h * dv:(h + 1) * dv] * x["d_o"][:, h * dv:(h + 1) * dv] for h in range(heads_q)])
    delta = od.sum(axis=2)
    delta_bound = dv * 2.0 ** -23 * np.abs(od).sum(axis=2) + 1e-30
    x["delta"] = delta.astype(np.float32).astype(np.float64)

    group = heads_q // heads_kv
    want = {"dq": np.zeros((total_q, heads_q * d, 2)), "dk": np.zeros((total_k, heads_kv * d, 2)),
            "dv": np.zeros((total_k, heads_kv * dv, 2))}
    for b, (sq, sk) in enumerate(seqs):
        q0, k0 = cu_q[b], cu_k[b]
        for h in range(heads_q):
            (dq, dq_b), (dk, dk_b), (dvg, dv_b) = head_grads(np, x, (q0, sq, k0, sk), h, p)
            hk = h // group
            want["dq"][q0:q0 + sq, h * d:(h + 1) * d] = np.stack([dq, dq_b], axis=2)
            want["dk"][k0:k0 + sk, hk * d:(hk + 1) * d] += np.stack([dk, dk_b], axis=2)
            want["dv"][k0:k0 + sk, hk * dv:(hk + 1) * dv] += np.stack([dvg, dv_b], axis=2)
    # The output's own rounding, and a floor for subnormal f16 results.
    for g in want.values():
        g[..., 1] += EPSILON[ty] / 2 * np.abs(g[..., 0]) + 1e-7
    return p, x, bits, (delta, delta_bound), want


def run_problem(np, run_asm, co, meta, kernels, case, rng, only=None):
    """Runs delta, dQ and dK/dV (or the one named `only`: "delta", "dq", "dkdv") on one case.
    Returns [(kernel, ok, worst / bound, details)]; details["bad"] has each gradient's wrong
    elements for store_fault_explains."""
    p, x, bits, (delta, delta_bound), want = problem(np, case, rng)
    ty, d, dv = p["ty"], p["d"], p["dv"]
    heads_q, heads_kv, total_q, total_k, ld_lse = p["heads_q"], p["heads_kv"], p["total_q"], p["total_k"], p["ld_lse"]

    inputs = {}
    for name, ld, rows in (("q", p["ldq"], total_q), ("k", p["ldk"], total_k), ("v", p["ldv"], total_k),
                           ("d_o", p["lddo"], total_q), ("o", p["ldo"], total_q)):
        buf = Buffer(np, rows * ld, np.uint16, 0)
        buf.view[:] = bits[name]
        inputs[name] = buf
    for name in ("lse", "delta"):
        buf = Buffer(np, heads_q * ld_lse, np.float32, np.nan)  # NaN in the padding too
        buf.view.reshape(heads_q, ld_lse)[:, :total_q] = x[name]
        inputs[name] = buf
    for name in ("cu_q", "cu_k"):
        buf = Buffer(np, p["batch"] + 1, np.int32, -7)
        buf.view[:] = p[name]
        inputs[name] = buf
    before = {name: (buf.full.view(np.uint8).copy()) for name, buf in inputs.items()}

    def ptr(name, elem):
        buf = inputs[name]
        return (buf.address, elem, buf.n)

    common = [ptr("lse", "f32"), ptr("delta", "f32"), ptr("cu_q", "i32"), ptr("cu_k", "i32")]
    max_q = max(max(sq for sq, _ in p["seqs"]), 1)
    max_k = max(max(sk for _, sk in p["seqs"]), 1)

    def counts(max_seqlen):
        return [p["batch"], total_q, total_k, max_seqlen, heads_q, heads_kv, p["ldq"], p["ldk"], p["ldv"],
                p["lddo"], ld_lse]

    tail = [int(p["causal"]), p["left"], p["right"]]

    results = []
    scale = (p["scale"], p["scale_bits"])
    cap = (p["softcap"], p["cap_bits"])

    def shape_and_launch(name, args):
        """args in the kernel's order: pointers as (address, elem, length), scalars as ints or
        (float, bits)."""
        hk_args = [hkload_pointer(a) if isinstance(a, tuple) and len(a) == 3 else
                   (a[0] if isinstance(a, tuple) else a) for a in args]
        shape = getattr(kernels, name).launch_shape(*hk_args)
        grid, block = tuple(shape["grid"]), tuple(shape["block"])
        explicit = [a[0] if isinstance(a, tuple) and len(a) == 3 else (a[1] if isinstance(a, tuple) else a)
                    for a in args]
        launch(run_asm, co, meta, name, grid, block, explicit)
        return grid

    def ratio(err, bound):
        err = np.nan_to_num(err, nan=np.inf)
        return float((err / bound).max()) if err.size else 0.0

    def inputs_intact():
        return all((buf.full.view(np.uint8) == before[name]).all() for name, buf in inputs.items())

    def judge_gradient(buf, ld, width, rows, w):
        got_rows = buf.view.reshape(rows, ld)
        got = from_bits(np, got_rows[:, :width].copy(), ty)
        err = np.abs(got - w[..., 0])
        good = err <= w[..., 1]  # NaN (unwritten) fails
        ok = bool(good.all()) and bool((got_rows[:, width:] == POISON16).all()) and buf.guards_intact(POISON16)
        return ok, ratio(err, w[..., 1]), {"bad": ~good, "flat": from_bits(np, buf.view.copy(), ty),
                                           "want": w, "ld": ld, "address": buf.address}

    if only in (None, "delta"):
        out = Buffer(np, heads_q * ld_lse, np.float32, np.nan)
        name = f"attn_bwd_delta_{ty}"
        grid = shape_and_launch(name, [(out.address, "f32", out.n), ptr("o", ty), ptr("d_o", ty), total_q, heads_q,
                                       dv, p["ldo"], p["lddo"], ld_lse])
        rows = out.view.reshape(heads_q, ld_lse)
        err = np.abs(rows[:, :total_q].astype(np.float64) - delta)
        ok = bool((err <= delta_bound).all())
        ok &= bool(np.isnan(rows[:, total_q:]).all() and np.isnan(out.full[:out.guard]).all()
                   and np.isnan(out.full[out.guard + out.n:]).all())
        ok &= inputs_intact()
        results.append((name, ok, ratio(err, delta_bound), {"grid": grid}))

    if only in (None, "dq"):
        dq = Buffer(np, total_q * p["lddq"], np.uint16, POISON16)
        name = f"attn_bwd_dq_{suffix(ty, d, dv)}"
        grid = shape_and_launch(name, [(dq.address, ty, dq.n), ptr("q", ty), ptr("k", ty), ptr("v", ty),
                                       ptr("d_o", ty), p["lddq"]] + common + counts(max_q) + [scale, cap] + tail)
        ok, worst, details = judge_gradient(dq, p["lddq"], heads_q * d, total_q, want["dq"])
        ok &= inputs_intact()
        results.append((name, ok, worst, dict(details, grid=grid, grads=[details])))

    if only in (None, "dkdv"):
        dk = Buffer(np, total_k * p["lddk"], np.uint16, POISON16)
        dvb = Buffer(np, total_k * p["lddv"], np.uint16, POISON16)
        name = f"attn_bwd_dkdv_{suffix(ty, d, dv)}"
        grid = shape_and_launch(name, [(dk.address, ty, dk.n), (dvb.address, ty, dvb.n), ptr("q", ty), ptr("k", ty),
                                       ptr("v", ty), ptr("d_o", ty), p["lddk"], p["lddv"]] + common + counts(max_k)
                                + [scale, cap] + tail)
        ok_k, worst_k, details_k = judge_gradient(dk, p["lddk"], heads_kv * d, total_k, want["dk"])
        ok_v, worst_v, details_v = judge_gradient(dvb, p["lddv"], heads_kv * dv, total_k, want["dv"])
        ok = ok_k and ok_v and inputs_intact()
        results.append((name, ok, max(worst_k, worst_v), {"grid": grid, "grads": [details_k, details_v]}))
    return p, results


def hkload_pointer(arg):
    import hkload

    address, elem, length = arg
    return hkload.Pointer(address, elem, length)


def describe(p):
    lengths = ",".join(f"{sq}" if sq == sk else f"{sq}/{sk}" for sq, sk in p["seqs"])
    what = "causal" if p["causal"] else ""
    if p["left"] >= 0 or p["right"] >= 0:
        what += f"{' ' if what else ''}window=({p['left']},{p['right']})"
    if p["softcap"] > 0:
        what += f" softcap={p['softcap']:g}"
    return (f"seqs=[{lengths}] heads={p['heads_q']}/{p['heads_kv']} {what or 'no mask'} spread={p['spread']:g} "
            f"pad={p['pad']}/{p['pad_out']}")


def store_fault_explains(np, grads):
    """Whether every wrong gradient is what the emulator's dword-store fault makes of a right one:
    in a run of 4 (one global_store_dwordx2) stored at an address 2 mod 4, and found 2 bytes
    lower. Returns (wrong elements, how many of them it explains)."""
    wrong = explained = 0
    for g in grads:
        rows, cols = np.nonzero(g["bad"])
        ld = g["ld"]
        run_address = g["address"] + 2 * (rows * ld + cols // 4 * 4)
        lower = g["flat"][rows * ld + cols - 1]
        want, bound = g["want"][rows, cols, 0], g["want"][rows, cols, 1]
        wrong += len(rows)
        explained += int(((run_address % 4 == 2) & (np.abs(lower - want) <= bound)).sum())
    return wrong, explained


def cases():
    out = []
    for dims in DIMS:
        for ty in ("bf16", "f16"):
            out.append((ty, dims, [(5, 37), (33, 33), (17, 3), (0, 6), (4, 0)], (2, 1), (True, -1, -1), 0.0, 1.0,
                        (8, 8)))
            out.append((ty, dims, [(33, 33), (5, 70)], (2, 1), (False, 9, 2), 2.0, 2.0, (3, 2)))
    # Several blocks of own rows on each side (64 a block; 32 for d_qk = 256 on AMD), a tail,
    # GQA over two key heads, causal within a window of 40 keys.
    for i, dims in enumerate(DIMS):
        out.append(("f16" if i % 2 == 0 else "bf16", dims, [(70, 75)], (4, 2), (True, 40, -1), 0.0, 1.0, (8, 8)))
    # No mask, MQA (4 query heads on 1 key head), more queries than keys and fewer.
    for i, dims in enumerate(DIMS):
        out.append(("bf16" if i % 2 == 0 else "f16", dims, [(20, 45), (45, 20)], (4, 1), (False, -1, -1), 0.0, 1.0,
                    (8, 8)))
    return out


# The broken copies: (kernel, its element type's MFMA -> the other one's, which of the problem's
# kernels it is).
BROKEN = [("attn_bwd_dq_d64_bf16", 0, "dq"), ("attn_bwd_dkdv_d128_f16", 1, "dkdv")]

V_ADD_F32 = 1  # VOP2 opcode (gfx9)
DPP_QUAD_IDENTITY = 0xE4  # quad_perm:[0,1,2,3]


def broken_dpp_copy(data, co, kernel):
    """The code object with the first v_add_f32_dpp of `kernel` made to add each lane to itself
    (quad_perm:[0,1,2,3]): a 16-lane sum that misses lanes."""
    start, size = co.symbols()[kernel]
    broken = bytearray(data)
    text = gemm_emu.file_offset(broken, start)
    for at in range(text, text + size - 4, 4):
        word, = struct.unpack_from("<I", broken, at)
        if word >> 31 == 0 and (word >> 25) & 0x3F == V_ADD_F32 and word & 0x1FF == 0xFA:  # VOP2, src0 = DPP
            dpp, = struct.unpack_from("<I", broken, at + 4)
            struct.pack_into("<I", broken, at + 4, (dpp & ~(0x1FF << 8)) | (DPP_QUAD_IDENTITY << 8))
            return bytes(broken)
    raise SystemExit(f"no v_add_f32_dpp in {kernel}")


def main():
    run_asm = gemm_emu.load_emulator()
    import numpy as np
    import hkload
    import hkload.testing

    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    bundle = args[0]
    targets = ["gfx942", "gfx950"]
    if "--target" in args:
        targets = args[args.index("--target") + 1].split(",")
    seed = int(os.environ.get("HK_EMU_SEED") or int.from_bytes(os.urandom(4), "little"))
    rng = np.random.default_rng(seed)
    print(f"attention_backward_emu: seed {seed}", flush=True)
    failed = counted = 0
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        stock, corrected = probe_and_correct(np, run_asm, "gfx942", tmp)
        failed += corrected != 64
        print(f"{'corrected' if corrected == 64 else 'CORRECTION FAILED'}: v_cvt_f16_f32_e32 into v150 "
              f"(probe against numpy's f16 rounding): stock emulator right on {stock} of 64 lanes, "
              f"corrected on {corrected} of 64", flush=True)
        stock, corrected = probe_and_correct_dpp(np, run_asm, "gfx942", tmp)
        failed += corrected != 64 or stock == 64
        print(f"{'corrected' if corrected == 64 else 'CORRECTION FAILED'}: DPP with its source as its "
              f"destination (the delta kernels' 16-lane sum; probe against a numpy model): stock emulator "
              f"right on {stock} of 64 lanes, corrected on {corrected} of 64", flush=True)
        stock, corrected = probe_and_correct_mfma(np, run_asm, "gfx942", tmp)
        failed += corrected != 256 or stock == 256
        print(f"{'corrected' if corrected == 256 else 'CORRECTION FAILED'}: f16 MFMA inputs that are "
              f"subnormal (probe of v_mfma_f32_16x16x16_f16 against numpy's product): stock emulator right "
              f"on {stock} of 256 outputs, corrected on {corrected} of 256", flush=True)
        for target in targets:
            path = os.path.join(tmp, f"{target}.co")
            data = unbundle(bundle, target, path, module="attention_backward")
            meta = kernel_metadata(path)
            co = CodeObject(data)
            relied_16 = corrected_instructions(path, target)
            relied_dpp = dpp_in_place(path, target)
            device = hkload.testing.simulated_device(f"{target}:sramecc+:xnack-")
            kernels = hkload.Bundle(bundle).load(device)

            def mark(kernel):
                notes = ["f16 MFMA subnormal inputs"] if kernel.endswith("_f16") and "delta" not in kernel else []
                if relied_16.get(kernel):
                    notes.append(f"{relied_16[kernel]} v_cvt_f16_f32_e32 into v128+")
                if relied_dpp.get(kernel):
                    notes.append(f"{relied_dpp[kernel]} DPP in place")
                return f"  [corrected: {', '.join(notes)}]" if notes else ""

            for case in cases():
                start = time.monotonic()
                p, results = run_problem(np, run_asm, co, meta, kernels, case, rng)
                took = time.monotonic() - start
                for kernel, ok, worst, details in results:
                    failed += not ok
                    counted += 1
                    print(f"{'PASS' if ok else 'FAIL'} {target} {kernel} {describe(p)} grid={details['grid']}  "
                          f"worst {worst:.3f} of the bound{mark(kernel)}", flush=True)
                print(f"  ({took:.1f} s for the three)", flush=True)
            # The gradients' rows at an odd stride: judged by what the emulator's store fault explains.
            case = ("bf16", (64, 64), [(33, 33), (5, 70)], (2, 1), (False, 9, 2), 2.0, 2.0, (3, 3))
            p, results = run_problem(np, run_asm, co, meta, kernels, case, rng)
            delta_ok = results[0][1]
            for kernel, ok, worst, details in results[1:]:
                wrong, explained = store_fault_explains(np, details["grads"])
                fine = explained == wrong and delta_ok
                failed += not fine
                counted += 1
                print(f"{'explained' if fine else 'UNEXPLAINED'} {target} {kernel} {describe(p)}: not judged by the "
                      f"bound (this run {'passed' if ok else 'failed'} it, worst {worst:.3g}); {explained} of its "
                      f"{wrong} wrong outputs are the emulator's store fault (found 2 bytes low, stored at an "
                      f"address 2 mod 4); delta {'passed' if delta_ok else 'FAILED'}", flush=True)
            for kernel, which, only in BROKEN:
                broken = CodeObject(broken_copy(data, co, kernel, target, which))
                case = next(c for c in cases() if f"attn_bwd_{only}_{suffix(c[0], *c[1])}" == kernel)
                p, results = run_problem(np, run_asm, broken, meta, kernels, case, rng, only=only)
                _, ok, worst, _ = results[0]
                failed += ok
                counted += 1
                swap = "bf16 -> f16" if which == 0 else "f16 -> bf16"
                print(f"{'caught' if not ok else 'NOT CAUGHT'} {target} broken kernel (one MFMA {swap}): "
                      f"{kernel} {describe(p)}  worst {worst:.3g}{mark(kernel)}", flush=True)
            # The delta kernel has no MFMA: its broken copy sums 16 lanes wrong instead.
            kernel = "attn_bwd_delta_bf16"
            broken = CodeObject(broken_dpp_copy(data, co, kernel))
            p, results = run_problem(np, run_asm, broken, meta, kernels, cases()[0], rng, only="delta")
            _, ok, worst, _ = results[0]
            failed += ok
            counted += 1
            print(f"{'caught' if not ok else 'NOT CAUGHT'} {target} broken kernel (its first DPP add with "
                  f"quad_perm:[0,1,2,3]): {kernel} {describe(p)}  worst {worst:.3g}{mark(kernel)}", flush=True)
    print(f"attention_backward_emu: {'FAILED' if failed else 'all passed'} ({failed} of {counted} counted "
          f"runs failed, {time.monotonic() - began:.0f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
