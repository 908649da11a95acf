#!/usr/bin/env python3
"""The moe_align module's AMD code objects (moe_align_block_size) run on tinygrad's CDNA emulator
(a test instrument: see /work/shared/amd-emulator.md) against a host reference.

usage: HK_TINYGRAD=<tinygrad source tree> moe_align_emu.py BUNDLE [--target gfx90a,gfx942,gfx950]
       (cargo test -p hk-tests --test moe_align_amd runs it when HK_TINYGRAD is set)

Skips cleanly (exit 0, saying so) as gemm_emu.py does.

Per target, every case of CASES (small token counts, 8 to 256 experts, every block size, experts
without pairs, all pairs on one expert, expert-parallel maps, ids out of range, and pairs past
one tile of 1024 so that the counts carry across tiles) runs with the launch shape of the
kernel's contract (hkload's Python package on a simulated device of the target). Every buffer
sits between guard bands; the outputs start as 0x5A5A5A5A, a value the kernel never writes. A
case passes when the used rows of sorted_token_ids (flat indices ascending within each local
expert, then the sentinel tokens * k), every block's expert (-1 for every block past the used
ones, up to the extent), the padded count, the untouched rows past it, guards and inputs are all
exactly as the reference says, and every global access lay inside its buffer's extent
(extents_emu.py's Recorder watches them).

The emulator's faults met here: DS instructions read inactive lanes' addresses (the Recorder
gives those lanes address 0). The kernel has no DPP, no ds_swizzle and no MFMA. Before running,
every instruction is decoded by the emulator and by llvm-objdump --mcpu=<target>
(moe_routing_emu.py's check), and a kernel with any disagreement is NOT RUN on that target.

Each target also runs two broken copies, which must FAIL: the padding loop's sentinel stores
(every global_store_dword of the first one's data register) made s_nop, so that every pair on one
expert with blocks of 256 rows leaves 228 rows of padding unwritten, and the first ds_add_u32 (the
counting pass's first tile) made a ds_max_u32, on a case of three tiles and blocks of 32 rows, so
that the wrong counts change the padded ones (where they do not, the placing pass writes the
right rows over the padding anyway).
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_emu  # noqa: E402
from gemm_emu import CodeObject, dispatch, file_offset, kernel_metadata, unbundle  # noqa: E402

UNWRITTEN = 0x5A5A5A5A
GUARD = 64
GUARD_FILL = 0xFFFFFFFF
TARGETS = ["gfx90a", "gfx942", "gfx950"]
NAME = "moe_align_block_size"

# (tokens, experts, k, block_m, routing, placement)
CASES = [
    (1, 8, 2, 16, "spread", "all"),
    (3, 256, 8, 64, "spread", "all"),
    (5, 128, 8, 16, "spread", "slice"),
    (7, 64, 4, 256, "all_on_one", "all"),
    (9, 96, 6, 32, "out_of_range", "scattered"),
    (3, 8, 2, 16, "spread", "none"),
    (300, 64, 8, 32, "spread", "all"),
    (150, 16, 8, 128, "one_hot", "scattered"),
    (1, 1, 1, 16, "spread", "all"),
]


def route(rng, tokens, experts, k, routing):
    ids = []
    for _ in range(tokens):
        if routing == "all_on_one":
            chosen = [experts - 1] * k
        elif routing == "one_hot":
            hot = experts // 2
            chosen = list(rng.choice([e for e in range(experts) if e != hot], k - 1, replace=False))
            chosen.insert(int(rng.integers(0, k)), hot)
        else:
            chosen = list(rng.choice(experts, k, replace=False))
            if routing == "out_of_range":
                chosen = [[-3, experts, 99999][int(rng.integers(0, 3))] if rng.integers(0, 4) == 0 else c
                          for c in chosen]
        ids += [int(c) for c in chosen]
    return ids


def place(rng, experts, placement):
    if placement == "all":
        return list(range(experts)), experts
    if placement == "slice":  # rank 1 of 4
        size = experts // 4
        return [e % size if e // size == 1 else -1 for e in range(experts)], size
    if placement == "none":
        return [-1] * experts, 1
    local = experts // 2
    order = list(rng.permutation(experts))
    emap = [-1] * experts
    for index, e in enumerate(order[:local]):
        emap[e] = index
    for e in order[local:]:
        if rng.integers(0, 3) == 0:
            emap[e] = local + int(rng.integers(0, 3))
    return emap, local


def align(topk_ids, emap, local_experts, block_m):
    """The reference: per local expert, its pairs' flat indices in order, padded with len(topk_ids)."""
    def local_of(g):
        if not 0 <= g < len(emap):
            return None
        loc = emap[g]
        return loc if 0 <= loc < local_experts else None

    sorted_ids, expert_ids = [], []
    for expert in range(local_experts):
        mine = [i for i, g in enumerate(topk_ids) if local_of(g) == expert]
        padded = -(-len(mine) // block_m) * block_m
        sorted_ids += mine + [len(topk_ids)] * (padded - len(mine))
        expert_ids += [expert] * (padded // block_m)
    return sorted_ids, expert_ids


class Guarded:
    """int32 data between guard bands of GUARD elements."""

    def __init__(self, np, data):
        self.np = np
        self.n = len(data)
        self.full = np.full(self.n + 2 * GUARD, GUARD_FILL, dtype=np.uint32)
        self.full[GUARD:GUARD + self.n] = np.array(data, dtype=np.int64).astype(np.uint32)
        self.initial = self.full.copy()

    @property
    def view(self):
        return self.full[GUARD:GUARD + self.n].view(self.np.int32)

    @property
    def address(self):
        return self.full.ctypes.data + GUARD * 4

    @property
    def bytes(self):
        return self.n * 4

    def guards_intact(self):
        return bool((self.full[:GUARD] == GUARD_FILL).all() and (self.full[GUARD + self.n:] == GUARD_FILL).all())


def run_case(np, run_asm, recorder, extents, co, disassembly, meta, kernels, case, rng):
    import hkload

    tokens, experts, k, block_m, routing, placement = case
    topk_ids = route(rng, tokens, experts, k, routing)
    emap, local_experts = place(rng, experts, placement)
    label = (f"tokens={tokens} experts={experts} k={k} block_m={block_m} local_experts={local_experts} "
             f"{routing} {placement}")
    want_sorted, want_blocks = align(topk_ids, emap, local_experts, block_m)
    max_sorted = tokens * k + experts * (block_m - 1)
    blocks = -(-max_sorted // block_m)

    sorted_out = Guarded(np, [UNWRITTEN] * max_sorted)
    blocks_out = Guarded(np, [UNWRITTEN] * blocks)
    post_pad = Guarded(np, [UNWRITTEN])
    ids_in = Guarded(np, topk_ids)
    map_in = Guarded(np, emap)
    buffers = [("sorted_token_ids", sorted_out, True), ("expert_ids", blocks_out, True),
               ("num_tokens_post_pad", post_pad, True), ("topk_ids", ids_in, False), ("expert_map", map_in, False)]
    scalars = [tokens, k, experts, local_experts, block_m]
    pointers = [hkload.Pointer(buf.address, "i32", buf.n) for _, buf, _ in buffers]
    shape = getattr(kernels, NAME).launch_shape(*pointers, *scalars)
    grid, block = tuple(shape["grid"]), tuple(shape["block"])
    explicit = [buf.address for _, buf, _ in buffers] + scalars

    def write(kernarg):
        values_left = iter(explicit)
        for offset, size, kind in meta[NAME]["args"]:
            if kind in ("global_buffer", "by_value"):
                ctypes.memmove(kernarg + offset, int(next(values_left)).to_bytes(size, "little"), size)

    allowed = [("the code object", co.base, co.size)]
    regions = [(extents.Region(what, buf.address, buf.bytes), writable) for what, buf, writable in buffers]
    recorder.begin(co, disassembly, regions, allowed)
    try:
        dispatch(run_asm, co, meta, NAME, grid, block, write, allowed)
    except extents.Outside:
        return False, f"outside its buffers: {recorder.outside[:2]}", label
    if recorder.outside:
        return False, f"outside its buffers: {recorder.outside[:2]}", label

    problems = []
    used = len(want_sorted)
    got_sorted = [int(x) for x in sorted_out.view]
    if got_sorted[:used] != want_sorted:
        bad = next(i for i in range(used) if got_sorted[i] != want_sorted[i])
        problems.append(f"sorted_token_ids differ first at row {bad}: got {got_sorted[bad]}, want {want_sorted[bad]}")
    if any(x != UNWRITTEN for x in got_sorted[used:]):
        bad = next(i for i in range(used, max_sorted) if got_sorted[i] != UNWRITTEN)
        problems.append(f"sorted_token_ids row {bad}, past the {used} used, written ({got_sorted[bad]})")
    got_blocks = [int(x) for x in blocks_out.view]
    want_all_blocks = want_blocks + [-1] * (blocks - len(want_blocks))
    if got_blocks != want_all_blocks:
        bad = next(i for i in range(blocks) if got_blocks[i] != want_all_blocks[i])
        problems.append(f"expert_ids differ first at block {bad}: got {got_blocks[bad]}, want {want_all_blocks[bad]}")
    if int(post_pad.view[0]) != used:
        problems.append(f"num_tokens_post_pad {int(post_pad.view[0])}, want {used}")
    for what, buf, _ in buffers:
        if not buf.guards_intact():
            problems.append(f"{what}'s guard bands changed")
    for what, buf, writable in buffers:
        if not writable and not (buf.full == buf.initial).all():
            problems.append(f"input {what} changed")
    if problems:
        return False, "; ".join(problems), label
    return True, f"{used} rows, {len(want_blocks)} blocks exact", label


# ---- The broken copies -----------------------------------------------------------------------


def broken_copy(data, disassembly, co, chosen, patch):
    """The code object with the instructions of NAME that chosen(instructions) picks (from its
    [(offset, mnemonic, operands)]) changed by patch(words, mnemonic), which returns each one's
    first two dwords replaced."""
    start, size = co.symbols()[NAME]
    instructions = [(offset, mnemonic, operands)
                    for offset, (mnemonic, operands, _) in sorted(disassembly.items())
                    if start <= offset < start + size]
    picked = chosen(instructions)
    if not picked:
        raise SystemExit(f"no instruction of {NAME} to break")
    broken = bytearray(data)
    for offset, mnemonic, _ in picked:
        at = file_offset(data, offset)
        words = list(struct.unpack_from("<2I", broken, at))
        struct.pack_into("<2I", broken, at, *patch(words, mnemonic))
    offset, mnemonic, _ = picked[0]
    return bytes(broken), f"{len(picked)} x {mnemonic} from +{offset - start:#x}"


def first(mnemonic):
    """The first instruction `mnemonic`."""
    return lambda instructions: [i for i in instructions if i[1] == mnemonic][:1]


def sentinel_stores(instructions):
    """Every global_store_dword of the first one's data register: the padding loop's sentinel
    stores (the compiler makes a path of two a trip beside the one of one)."""
    stores = [i for i in instructions if i[1] == "global_store_dword"]
    data = stores[0][2].split(",")[1].strip()
    return [i for i in stores if i[2].split(",")[1].strip() == data]


# DS opcodes (bits 24:17 of the first dword): ds_add_u32 0, ds_max_u32 8.
def add_to_max(words, mnemonic):
    word = words[0]
    assert (word >> 17) & 0xFF == 0, f"{word:#x} is not ds_add_u32"
    return [(word & ~(0xFF << 17)) | (8 << 17), words[1]]


# A global store (8 bytes) made two s_nop (SOPP 0xbf800000): the store is gone.
def dropped_store(words, mnemonic):
    return [0xBF800000, 0xBF800000]


def main():
    run_asm = gemm_emu.load_emulator()
    import numpy as np

    import extents_emu as extents
    from moe_routing_emu import command_line, decoding_disagreements
    from test.mockgpu.amd import emu
    import hkload
    import hkload.testing

    bundle, targets, rng = command_line(np, __doc__, TARGETS)
    failed = passed = caught = not_run = 0
    with tempfile.TemporaryDirectory() as tmp:
        recorder = extents.Recorder(emu)
        for target in targets:
            path = os.path.join(tmp, f"{target}.co")
            data = unbundle(bundle, target, path, module="moe_align")
            meta = kernel_metadata(path)
            co = CodeObject(data)
            disassembly = extents.disassemble(path, target)
            disagreements = decoding_disagreements(emu, co, disassembly, [NAME])
            if disagreements:
                not_run += len(CASES)
                print(f"NOT RUN {target} {NAME}: the emulator decodes {len(disagreements)} of its "
                      f"instructions otherwise than LLVM: {disagreements[0]}")
                continue
            device = hkload.testing.simulated_device(f"{target}:sramecc+:xnack-")
            kernels = hkload.Bundle(bundle).load(device)
            for case in CASES:
                ok, detail, label = run_case(np, run_asm, recorder, extents, co, disassembly, meta, kernels, case, rng)
                failed += not ok
                passed += ok
                print(f"{'PASS' if ok else 'FAIL'} {target} {label}: {detail}", flush=True)
            breakages = [
                (sentinel_stores, dropped_store, CASES[3]),
                (first("ds_add_u32"), add_to_max, CASES[6]),
            ]
            for chosen, patch, case in breakages:
                broken_data, what = broken_copy(data, disassembly, co, chosen, patch)
                ok, detail, label = run_case(np, run_asm, recorder, extents, CodeObject(broken_data), disassembly,
                                             meta, kernels, case, rng)
                failed += ok
                caught += not ok
                print(f"{'caught' if not ok else 'NOT CAUGHT'} {target} broken ({what} changed): {label}: {detail}",
                      flush=True)
    print(f"{passed} cases passed, {failed} failed, {not_run} not run (undecodable on the emulator); "
          f"{caught} broken copies caught")
    print(f"moe_align_emu: {'FAILED' if failed else 'all passed'} ({failed} failed)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
