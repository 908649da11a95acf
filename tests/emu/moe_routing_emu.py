#!/usr/bin/env python3
"""The moe_routing module's AMD code objects (topk_softmax_*, grouped_topk_*) run on tinygrad's
CDNA emulator (a test instrument: see /work/shared/amd-emulator.md) against a float64 reference.

usage: HK_TINYGRAD=<tinygrad source tree> moe_routing_emu.py BUNDLE [--target gfx90a,gfx942,gfx950]
       (cargo test -p hk-tests --test moe_routing_amd runs it when HK_TINYGRAD is set)

Skips cleanly (exit 0, saying so) as gemm_emu.py does.

Per target, every case of CASES (small, odd token counts and expert counts, strided logits rows,
ties, all-equal rows, DeepSeek-V3's shape, one launch with a single block striding over all its
tokens) runs with the launch shape of the kernel's contract (hkload's Python package on a
simulated device of the target). Every buffer sits between guard bands; the outputs start
poisoned, the gaps between logits rows hold NaN. A case passes when the ids equal the
reference's exactly, every weight is within 1e-6 + 2e-5 |want| (the bound of
tests/src/kernels/moe_routing.rs), guards and inputs are unchanged, and every global access
lay inside its buffer's extent (extents_emu.py's Recorder watches them). Random rows whose
choice would hinge on two different values closer than 1e-5 are drawn again, as the Rust cases
do: the kernel chooses in f32, the reference in f64.

The emulator's faults met here, and what this does about them (every job line says which it
relied on):
- ds_swizzle_b32 (the 32-lane step of every wave reduction) cannot be compiled by the stock
  emulator: extents_emu.py's Recorder stands in for it, as the CDNA ISA defines it;
- DS instructions read inactive lanes' addresses: the Recorder gives those lanes address 0;
- DPP with its destination as its source runs wrong: attention_backward_emu.py's correction,
  proven by its probe here first. The kernels compile their reductions with a DPP destination
  other than the source, so the count of in-place DPP each kernel relied on is printed (0 is
  expected);
- one opcode map decodes every target: before running, every instruction of each kernel is
  decoded by the emulator and by llvm-objdump --mcpu=<target> (encoding suffixes aside, and
  ALIASES), and a kernel with any disagreement is NOT RUN on that target (said on its own line and
  counted at the end), never passed. (grouped_topk_* hides the experts' range from LLVM for
  this: it divided by n_group through f32 with gfx90a's v_mad_f32, which the emulator's gfx942
  opcode map does not hold, and gfx90a's grouped routing was NOT RUN.)

Each target also runs a broken copy of topk_softmax_f32 and of grouped_topk_bf16: the first
v_cmp_gt_u64 after a DPP move (the first step of the wave maximum that picks each expert) made a
v_cmp_lt_u64. Both must FAIL.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_emu  # noqa: E402
from gemm_emu import LLVM, CodeObject, dispatch, file_offset, kernel_metadata, unbundle  # noqa: E402

WEIGHT_ABS, WEIGHT_REL = 1e-6, 2e-5
DECIDING_GAP = 1e-5
POISON32 = 0xFFFFFFFF  # NaN as f32, -1 as an id
GUARD = 64
TARGETS = ["gfx90a", "gfx942", "gfx950"]

# ("softmax", ty, tokens, experts, ld, k, renormalize, values)
# ("grouped", ty, tokens, experts, n_group, topk_group, k, scaling, values)
# A trailing ("grid", n) launches n blocks instead of the contract's (any grid is correct).
CASES = [
    ("softmax", "bf16", 5, 8, 11, 2, 1, "spread"),
    ("softmax", "f16", 7, 128, 128, 8, 0, "ties"),
    ("softmax", "f32", 3, 256, 260, 16, 1, "spread"),
    ("softmax", "bf16", 2, 33, 33, 5, 0, "equal"),
    ("softmax", "f32", 9, 65, 67, 8, 0, "spread", ("grid", 1)),
    ("softmax", "f16", 1, 1, 1, 1, 0, "spread"),
    ("grouped", "bf16", 3, 256, 8, 4, 8, 2.5, "spread"),
    ("grouped", "f32", 5, 256, 8, 4, 8, 2.5, "ties"),
    ("grouped", "f16", 2, 256, 8, 4, 8, 2.5, "equal"),
    ("grouped", "f32", 3, 64, 32, 3, 6, 1.5, "spread"),
    ("grouped", "bf16", 4, 96, 1, 1, 16, 1.0, "ties"),
    ("grouped", "f16", 9, 6, 3, 1, 2, 1.0, "spread", ("grid", 1)),
]


# ---- The f64 reference ----------------------------------------------------------------------


def ranked(values, candidates):
    """The candidates by value, larger first, equal values by lower index."""
    return sorted(candidates, key=lambda e: (-values[e], e))


def decisive(values, order, decided):
    return all(values[a] == values[b] or values[a] - values[b] >= DECIDING_GAP
               for a, b in list(zip(order, order[1:]))[:decided])


def topk_softmax(np, row, k, renormalize):
    exps = np.exp(row - row.max())
    chosen = ranked(row, range(len(row)))[:k]
    total = exps[chosen].sum() if renormalize else exps.sum()
    return chosen, [exps[e] / total for e in chosen]


def grouped_topk(np, row, bias, n_group, topk_group, k, scaling):
    score = 1.0 / (1.0 + np.exp(-row))
    choice = score + bias
    size = len(row) // n_group
    decided = True
    value = []
    for g in range(n_group):
        order = ranked(choice, range(g * size, (g + 1) * size))
        decided &= decisive(choice, order, 2)
        value.append(choice[order[0]] + choice[order[1]])
    groups = ranked(value, range(n_group))
    decided &= decisive(value, groups, topk_group)
    kept = set(groups[:topk_group])
    order = ranked(choice, [e for e in range(len(row)) if e // size in kept])
    decided &= decisive(choice, order, k)
    chosen = order[:k]
    total = score[chosen].sum()
    return chosen, [score[e] / total * scaling for e in chosen], decided


def draw(np, rng, values, n, ty):
    if values == "spread":
        x = rng.uniform(-4.0, 4.0, n)
    elif values == "ties":
        x = rng.integers(-3, 4, n).astype(np.float64)
    else:
        x = np.full(n, 0.75)
    return gemm_emu.to_bits(np, x, ty)[1] if ty != "f32" else x.astype(np.float32).astype(np.float64)


def element_bits(np, values, ty):
    if ty == "f32":
        return values.astype(np.float32).view(np.uint32), np.uint32
    return gemm_emu.to_bits(np, values, ty)[0], np.uint16


# ---- One case -------------------------------------------------------------------------------


class Guarded:
    """A buffer of n elements of dtype between guard bands of GUARD elements of `fill`."""

    def __init__(self, np, data, dtype, fill):
        self.n = len(data)
        self.fill = fill
        self.full = np.full(self.n + 2 * GUARD, fill, dtype=dtype)
        self.full[GUARD:GUARD + self.n] = data
        self.initial = self.full.copy()

    @property
    def view(self):
        return self.full[GUARD:GUARD + self.n]

    @property
    def address(self):
        return self.full.ctypes.data + GUARD * self.full.itemsize

    @property
    def bytes(self):
        return self.n * self.full.itemsize

    def guards_intact(self):
        return bool((self.full[:GUARD] == self.fill).all() and (self.full[GUARD + self.n:] == self.fill).all())


def kernel_name(case):
    return f"{'topk_softmax' if case[0] == 'softmax' else 'grouped_topk'}_{case[1]}"


def run_case(np, run_asm, recorder, extents, target, co, disassembly, meta, kernels, case, rng):
    """Runs one case on code object `co`; returns (ok, what went wrong or the worst weight's
    share of its bound, label)."""
    grid_override = case[-1][1] if isinstance(case[-1], tuple) else None
    case = case[:-1] if grid_override else case
    import hkload

    family, ty = case[0], case[1]
    if family == "softmax":
        _, _, tokens, experts, ld, k, renormalize, values = case
        name = f"topk_softmax_{ty}"
        label = f"{name} tokens={tokens} experts={experts} ld={ld} k={k} renormalize={renormalize} {values}"
    else:
        _, _, tokens, experts, n_group, topk_group, k, scaling, values = case
        ld = experts
        name = f"grouped_topk_{ty}"
        label = (f"{name} tokens={tokens} experts={experts} n_group={n_group} topk_group={topk_group} "
                 f"k={k} scaling={scaling} {values}")
    if grid_override:
        label += f" grid={grid_override}"

    logits = np.full((tokens - 1) * ld + experts, np.nan)
    want_ids, want_w = [], []
    if family == "grouped":
        if values == "spread":
            bias = rng.uniform(-0.1, 0.1, experts).astype(np.float32).astype(np.float64)
        elif values == "ties":
            bias = rng.choice([0.0, 0.125], experts)
        else:
            bias = np.zeros(experts)
    t = 0
    while t < tokens:
        row = draw(np, rng, values, experts, ty)
        if family == "softmax":
            ids, weights = topk_softmax(np, row, k, renormalize)
        else:
            ids, weights, decided = grouped_topk(np, row, bias, n_group, topk_group, k, scaling)
            if not decided:
                continue
        logits[t * ld:t * ld + experts] = row
        want_ids += ids
        want_w += weights
        t += 1

    bits, dtype = element_bits(np, logits, ty)
    x = Guarded(np, bits, dtype, dtype(0x7FC0 if dtype == np.uint16 else 0x7FC00000))
    weights_out = Guarded(np, np.full(tokens * k, POISON32, np.uint32), np.uint32, np.uint32(POISON32))
    ids_out = Guarded(np, np.full(tokens * k, POISON32, np.uint32), np.uint32, np.uint32(POISON32))
    buffers = [("topk_weights", weights_out, True), ("topk_ids", ids_out, True), ("logits", x, False)]
    if family == "grouped":
        b = Guarded(np, bias.astype(np.float32).view(np.uint32), np.uint32, np.uint32(POISON32))
        buffers.append(("bias", b, False))
        scalars = [tokens, experts, ld, n_group, topk_group, k]
    else:
        scalars = [tokens, experts, ld, k, renormalize]

    elems = {"topk_weights": "f32", "topk_ids": "i32", "logits": ty, "bias": "f32"}
    pointers = [hkload.Pointer(buf.address, elems[what], buf.n) for what, buf, _ in buffers]
    factor = [float(scaling)] if family == "grouped" else []
    shape = getattr(kernels, name).launch_shape(*pointers, *scalars, *factor)
    grid, block = tuple(shape["grid"]), tuple(shape["block"])
    if grid_override:
        grid = (grid_override,) + grid[1:]
    # The explicit arguments in the signature's order, each as the bits of its metadata size.
    explicit = [buf.address for _, buf, _ in buffers] + scalars
    explicit += [struct.unpack("<I", struct.pack("<f", scaling))[0]] if family == "grouped" else []

    def write(kernarg):
        values_left = iter(explicit)
        for offset, size, kind in meta[name]["args"]:
            if kind in ("global_buffer", "by_value"):
                ctypes.memmove(kernarg + offset, int(next(values_left)).to_bytes(size, "little"), size)

    allowed = [("the code object", co.base, co.size)]
    regions = [(extents.Region(what, buf.address, buf.bytes), writable) for what, buf, writable in buffers]
    recorder.begin(co, disassembly, regions, allowed)
    try:
        dispatch(run_asm, co, meta, name, grid, block, write, allowed)
    except extents.Outside:
        return False, f"outside its buffers: {recorder.outside[:2]}", label
    if recorder.outside:
        return False, f"outside its buffers: {recorder.outside[:2]}", label

    problems = []
    got_ids = ids_out.view.view(np.int32).astype(np.int64)
    if list(got_ids) != want_ids:
        bad = next(i for i in range(len(want_ids)) if got_ids[i] != want_ids[i])
        problems.append(f"ids differ first at token {bad // k} place {bad % k}: got {got_ids[bad]}, "
                        f"want {want_ids[bad]}")
    got_w = weights_out.view.view(np.float32).astype(np.float64)
    want = np.array(want_w)
    bound = WEIGHT_ABS + WEIGHT_REL * np.abs(want)
    err = np.abs(got_w - want)
    share = float(np.nanmax(np.where(np.isnan(err), np.inf, err / bound)))
    if not share <= 1.0:
        i = int(np.argmax(np.where(np.isnan(err), np.inf, err / bound)))
        problems.append(f"weight {i}: got {got_w[i]!r}, want {want[i]!r}")
    for what, buf, _ in buffers:
        if not buf.guards_intact():
            problems.append(f"{what}'s guard bands changed")
    for what, buf, writable in buffers:
        if not writable and not (buf.full == buf.initial).all():
            problems.append(f"input {what} changed")
    if problems:
        return False, "; ".join(problems), label
    return True, f"worst weight {share:.3f} of the bound", label


# ---- Decoding and the broken copies ---------------------------------------------------------


# LLVM's names for gfx940 and later of an encoding the emulator calls by its gfx9 name: VOP3P
# opcode 32, a product of two (f16 or f32) operands plus a third, in f32; the emulator's pseudocode
# may round the product before the add, which moves a result by one f32 rounding at most.
ALIASES = {"v_fma_mix_f32": "v_mad_mix_f32"}


def command_line(np, usage, default_targets):
    """(bundle, targets, rng) of a script's run: `BUNDLE [--target a,b]` (exits with `usage`
    without a bundle), and inputs drawn from HK_EMU_SEED or a fresh seed, printed to repeat."""
    args = sys.argv[1:]
    if not args:
        sys.exit(usage)
    targets = args[args.index("--target") + 1].split(",") if "--target" in args else default_targets
    seed = int(os.environ.get("HK_EMU_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"seed {seed} (HK_EMU_SEED={seed} draws the same inputs again)")
    return args[0], targets, np.random.default_rng(seed)


def decoding_disagreements(emu, co, disassembly, names):
    """Instructions of `names` the emulator decodes as another instruction than LLVM does."""
    symbols = co.symbols()
    out = []
    for name in names:
        start, size = symbols[name]
        for offset, (mnemonic, _, length) in sorted(disassembly.items()):
            if not start <= offset < start + size or mnemonic == "s_code_end":
                continue
            raw = bytes((ctypes.c_char * 16).from_address(co.base + offset).raw)
            try:
                inst = emu.decode_inst(raw, "cdna")
                theirs = inst.op.name.lower()
            except Exception as error:  # an instruction it cannot decode at all
                theirs = f"nothing ({type(error).__name__})"
            # Encoding suffixes (_e32, _e64, _dpp, _sdwa) name the same operation.
            ours, theirs = (re.sub(r"_(e32|e64|dpp|sdwa)$", "", m) for m in (mnemonic, theirs))
            if theirs != ALIASES.get(ours, ours):
                out.append(f"{name}+{offset - start:#x}: {mnemonic} decoded as {theirs}")
    return out


def broken_copy(data, disassembly, co, name):
    """The code object with the first v_cmp_gt_u64_e32 after a v_mov_b32_dpp in `name` made a
    v_cmp_lt_u64_e32 (the VOPC opcode field, bits 24:17; both encodings from llvm-mc)."""
    start, size = co.symbols()[name]
    seen_dpp = False
    for offset, (mnemonic, _, _) in sorted(disassembly.items()):
        if not start <= offset < start + size:
            continue
        seen_dpp |= mnemonic == "v_mov_b32_dpp"
        if seen_dpp and mnemonic == "v_cmp_gt_u64_e32":
            broken = bytearray(data)
            at = file_offset(data, offset)
            word, = struct.unpack_from("<I", broken, at)
            assert word >> 16 == 0x7DD8, f"{word:#x} is not v_cmp_gt_u64_e32"
            struct.pack_into("<I", broken, at, (word & 0xFFFF) | (0x7DD2 << 16))
            return bytes(broken)
    raise SystemExit(f"no v_cmp_gt_u64_e32 after a DPP move in {name}")


def main():
    run_asm = gemm_emu.load_emulator()
    import numpy as np

    import extents_emu as extents
    from attention_backward_emu import dpp_in_place, probe_and_correct_dpp
    from test.mockgpu.amd import emu
    import hkload
    import hkload.testing

    bundle, targets, rng = command_line(np, __doc__, TARGETS)
    failed = passed = caught = not_run = 0
    names = [f"{f}_{ty}" for f in ("topk_softmax", "grouped_topk") for ty in ("bf16", "f16", "f32")]
    with tempfile.TemporaryDirectory() as tmp:
        stock, corrected = probe_and_correct_dpp(np, run_asm, "gfx942", tmp)
        print(f"{'corrected' if corrected == 64 else 'CORRECTION FAILED'}: DPP with its source as its "
              f"destination, {stock} of 64 probe lanes right as shipped, {corrected} corrected")
        failed += corrected != 64
        # After the probe, which runs on the emulator as shipped but for the DPP correction.
        recorder = extents.Recorder(emu)
        for target in targets:
            path = os.path.join(tmp, f"{target}.co")
            data = unbundle(bundle, target, path, module="moe_routing")
            meta = kernel_metadata(path)
            co = CodeObject(data)
            disassembly = extents.disassemble(path, target)
            # A kernel with an instruction the emulator decodes otherwise than LLVM is not run on
            # this target: its result would be the emulator's, not the kernel's.
            undecodable = {}
            for name in names:
                disagreements = decoding_disagreements(emu, co, disassembly, [name])
                if disagreements:
                    undecodable[name] = disagreements
                    print(f"NOT RUN {target} {name}: the emulator decodes {len(disagreements)} of its "
                          f"instructions otherwise than LLVM: {disagreements[0]}")
            not_run += sum(1 for case in CASES if kernel_name(case) in undecodable)
            in_place = dpp_in_place(path, target)
            relied = ", ".join(f"{n} {in_place.get(n, 0)}" for n in names if n not in undecodable)
            print(f"{target}: in-place DPP (run with the correction) in {relied}")
            device = hkload.testing.simulated_device(f"{target}:sramecc+:xnack-")
            kernels = hkload.Bundle(bundle).load(device)
            for case in CASES:
                if kernel_name(case) in undecodable:
                    continue
                ok, detail, label = run_case(np, run_asm, recorder, extents, target, co, disassembly, meta,
                                             kernels, case, rng)
                failed += not ok
                passed += ok
                print(f"{'PASS' if ok else 'FAIL'} {target} {label}: {detail}", flush=True)
            for case in (CASES[2], CASES[6]):
                name = kernel_name(case)
                if name in undecodable:
                    continue
                broken = CodeObject(broken_copy(data, disassembly, co, name))
                ok, detail, label = run_case(np, run_asm, recorder, extents, target, broken, disassembly, meta,
                                             kernels, case, rng)
                failed += ok
                caught += not ok
                print(f"{'caught' if not ok else 'NOT CAUGHT'} {target} broken {name} (one v_cmp_gt_u64 -> "
                      f"lt in its wave maximum): {label}: {detail}", flush=True)
    print(f"{passed} cases passed, {failed} failed, {not_run} not run (undecodable on the emulator); "
          f"{caught} broken copies caught")
    print(f"moe_routing_emu: {'FAILED' if failed else 'all passed'} ({failed} failed)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
