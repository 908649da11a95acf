#!/usr/bin/env python3
"""Every address an AMD kernel touches, recorded on tinygrad's CDNA emulator (a test instrument:
see /work/shared/amd-emulator.md) and checked against the buffers its call was given, each exactly
as long as its contract's extent. Driven by tests/tests/extents_amd.rs, which writes the jobs.

usage: HK_TINYGRAD=<tinygrad source tree> extents_emu.py JOBS.json [--only PREFIX] [--target T]
       (--only, --target: the jobs of kernels whose names start with PREFIX, of target T)

A job is one launch as hkload made it on a simulated device of the target: the code object
hkload chose, the kernel, the grid and block of its contract, the packed explicit arguments, and
each buffer argument (its offset among the arguments, its length in bytes, its initial bytes).
This maps every buffer into host memory of exactly that length, writes its address into the
arguments, adds what the HIP runtime would (code object v5's hidden arguments, the dispatch
packet, the user SGPRs: gemm_emu.py's `dispatch`) and runs every workgroup.

Before each global, flat, buffer (MUBUF) or scalar memory instruction runs, it computes the
addresses of its active lanes from the registers, as the emulator itself will (for buffer
instructions, only the lanes inside the descriptor's num_records: the hardware does not access
the others), and each access must lie inside one buffer, or the kernel arguments, the dispatch
packet or the code object (constants). LDS and scratch are not global memory and not recorded.

Prints one line per job, `PASS <target> <kernel>` with the accesses counted and the bytes of
each buffer touched, or `OUTSIDE <target> <kernel>` with the first accesses outside every
region (and where they lie from the nearest buffer), or `ERROR <target> <kernel>` with what the
emulator could not do; last `N jobs checked, M outside, E errors`. Exits 1 unless every job
passed. Skips cleanly (exit 0, saying so) as gemm_emu.py does.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_emu  # noqa: E402
from gemm_emu import CodeObject, dispatch, kernel_metadata  # noqa: E402

# Accesses shown per job that touched memory outside its regions.
SHOWN = 5


def access_bytes(op_name):
    """Bytes one lane of a memory instruction moves, from its mnemonic."""
    dwords = re.search(r"DWORDX(\d)", op_name)
    if dwords:
        return 4 * int(dwords.group(1))
    if "ATOMIC" in op_name:
        return 8 if op_name.endswith("_X2") or "F64" in op_name else 4
    formats = re.search(r"FORMAT_(X|XY|XYZ|XYZW)$", op_name)
    if formats:
        return 4 * len(formats.group(1))
    for word, size in (("DWORD", 4), ("SHORT", 2), ("BYTE", 1)):
        if word in op_name:
            return size
    raise RuntimeError(f"{op_name}: no access size known for this memory instruction")


class Recorder:
    """Wraps the emulator's per-instruction runners so that memory instructions record the
    addresses of their active lanes (from the registers before the instruction runs), and stands
    in for the instructions the stock emulator cannot run (see `stand_in`)."""

    def __init__(self, emu):
        self.emu = emu
        self.exec_lo = emu.EXEC_LO.offset
        stock = emu._decode_at

        def decode_at(pc, arch):
            try:
                (prg, runtime), inst = stock(pc, arch)
            except Exception as error:
                return self.stand_in(pc, error)
            if inst.op.name == "S_SETPC_B64":
                return self.stand_in(pc, None)
            if isinstance(inst, emu.irc.DS):
                return self.inactive_lanes_at_zero(prg, runtime, inst), inst
            self.check_decoding(pc, inst)
            compute = self.addresses_of(inst)
            if compute is None:
                return (prg, runtime), inst
            order, fxn = list(prg.arg.globals), runtime.fxn

            def recorded(*buffers):
                by_index = dict(zip(order, buffers))
                compute(by_index)
                # Memory is the host's and unchecked: an access outside every region ends the
                # job before it runs, rather than scribble over this process.
                if self.outside:
                    raise Outside()
                return fxn(*buffers)

            return (prg, types.SimpleNamespace(fxn=recorded)), inst

        emu._decode_at = decode_at
        # Atomics return the old value when bit 16 is set: `glc` on gfx90a, `sc0` on gfx942 and
        # gfx950, and the same bit in the instruction. The stock emulator reads an attribute
        # `glc` that its CDNA classes name `sc0`, so it never returns the old value and a
        # compare-and-swap loop (a float atomic add on gfx90a) never ends.
        stock_iattr = emu._iattr

        def iattr(inst, name, default=0):
            if name == "glc" and isinstance(inst, (emu.irc.GLOBAL, emu.irc.FLAT)):
                name = "sc0"
            return stock_iattr(inst, name, default)

        emu._iattr = iattr

    def inactive_lanes_at_zero(self, prg, runtime, inst):
        """The stock emulator's DS instructions read the LDS address of every lane, active or
        not, and an inactive lane's stale address can fall outside the emulator's LDS and crash
        it: inactive lanes get address 0 while the instruction runs, and their own back after."""
        order, fxn = list(prg.arg.globals), runtime.fxn
        if 0 not in order or 1 not in order:
            return prg, runtime
        address = inst.addr.offset - 256

        def guarded(*buffers):
            by_index = dict(zip(order, buffers))
            sgpr, vgpr = self.sgprs(by_index), self.vgprs(by_index)
            active = set(self.lanes(sgpr))
            saved = {lane: vgpr[address * 64 + lane] for lane in range(64) if lane not in active}
            for lane in saved:
                vgpr[address * 64 + lane] = 0
            result = fxn(*buffers)
            for lane, value in saved.items():
                vgpr[address * 64 + lane] = value
            return result

        return prg, types.SimpleNamespace(fxn=guarded)

    def swizzle(self, inst, size, operands):
        """ds_swizzle_b32 (which the stock emulator cannot compile), as the CDNA ISA defines it:
        offset[15] set, each lane of a group of four takes the lane offset[2i+1:2i] of its group;
        else, within each 32 lanes, lane i takes lane ((i & and) | or) ^ xor, the masks in
        offset[4:0], [9:5], [14:10]. Inactive lanes keep their destination. The lanes chosen
        are checked against LLVM's reading of the same offset (`swizzle(SWAP,n)`: lane i ^ n),
        the only form our kernels use; another form is an error until it is checked too."""
        emu = self.emu
        offset = inst.offset1 << 8 | inst.offset0
        source, target = inst.addr.offset - 256, inst.vdst.offset - 256
        if offset >> 15:
            pick = [i & ~3 | (offset >> 2 * (i & 3)) & 3 for i in range(64)]
        else:
            and_mask, or_mask, xor_mask = offset & 31, offset >> 5 & 31, offset >> 10 & 31
            pick = [i & 32 | ((i & 31 & and_mask) | or_mask) ^ xor_mask for i in range(64)]
        swap = re.search(r"swizzle\(SWAP,(\d+)\)", operands)
        if not swap or pick != [i ^ int(swap.group(1)) for i in range(64)]:
            raise RuntimeError(f"ds_swizzle_b32 {operands}: a form the stand-in was not checked on")

        def run(sgprs, vgprs):
            sgpr = (ctypes.c_uint32 * emu.SGPR_COUNT).from_address(sgprs.value)
            vgpr = (ctypes.c_uint32 * (256 * 64)).from_address(vgprs.value)
            values = [vgpr[source * 64 + lane] for lane in range(64)]
            for lane in self.lanes(sgpr):
                vgpr[target * 64 + lane] = values[pick[lane]]
            advance(emu, sgpr, size)

        return run

    def begin(self, code_object, disassembly, buffers, allowed):
        """A new job: its code object and LLVM's reading of it, its buffers ((Region, writable)
        pairs) and the other memory it may read ((what, address, bytes); the dispatch adds the
        kernel arguments and its packet)."""
        self.code = (code_object.base, disassembly)  # {offset: (mnemonic, operands, bytes)}
        self.buffers, self.allowed = buffers, allowed
        self.count = 0
        self.outside = []
        self.touched = {region.what: [None, None] for region, _ in buffers}
        self.stood_in = {}  # mnemonic -> executions whose results were not computed

    def access(self, kind, address, size, mnemonic):
        """Judges one access of one lane."""
        self.count += 1
        for region, writable in self.buffers:
            if region.holds(address, size):
                span = self.touched[region.what]
                start = address - region.address
                span[0] = start if span[0] is None else min(span[0], start)
                span[1] = start + size if span[1] is None else max(span[1], start + size)
                if kind == "store" and not writable:
                    self.outside.append(f"{mnemonic} stores {size} bytes into read-only `{region.what}`")
                return
        if kind == "load" and any(start <= address and address + size <= start + length
                                  for _, start, length in self.allowed):
            return
        regions = [region for region, _ in self.buffers]
        self.outside.append(f"{mnemonic} ({kind} of {size} bytes): {where(address, size, regions)}")

    def objdump_at(self, pc):
        base, disassembly = self.code
        return disassembly.get(pc - base)

    def check_decoding(self, pc, inst):
        """Memory instructions make the addresses this checks: one the emulator decodes as
        another than LLVM does (its one opcode map for every CDNA target) is an error, never a
        silent pass."""
        irc = self.emu.irc
        if not isinstance(inst, (irc.GLOBAL, irc.FLAT, irc.MUBUF, irc.SMEM)):
            return
        llvm = self.objdump_at(pc)
        if llvm is None or llvm[0].lower() != inst.op.name.lower():
            raise RuntimeError(f"the emulator decodes {llvm[0] if llvm else 'an instruction'} at "
                               f"{pc - self.code[0]:#x} as {inst.op.name}")

    def stand_in(self, pc, error):
        """A runner for an instruction the stock emulator cannot decode or compile (`error`), or
        runs wrong (None: s_setpc_b64, whose jump it drops), as LLVM's disassembler names it:
        s_setpc_b64 jumps to the address in its SGPR pair, s_getpc_b64 runs exactly (the
        address of the next instruction into an SGPR pair), ds_swizzle_b32 as `swizzle` says;
        an MFMA advances the program counter without computing its result (no address depends
        on a matrix product; every job says how many it stood in for); any other instruction is
        the error it was."""
        llvm = self.objdump_at(pc)
        if llvm is None:
            raise error
        mnemonic, operands, size = llvm
        emu = self.emu
        if mnemonic == "s_setpc_b64":
            first = int(re.match(r"s\[(\d+):", operands).group(1))

            def setpc(sgprs):
                sgpr = (ctypes.c_uint32 * emu.SGPR_COUNT).from_address(sgprs.value)
                sgpr[emu.PC_LO_IDX], sgpr[emu.PC_HI_IDX] = sgpr[first], sgpr[first + 1]

            runner, reads = setpc, [0]
        elif mnemonic == "s_getpc_b64":
            first = int(re.match(r"s\[(\d+):", operands).group(1))

            def getpc(sgprs):
                sgpr = (ctypes.c_uint32 * emu.SGPR_COUNT).from_address(sgprs.value)
                after = advance(emu, sgpr, size)
                sgpr[first], sgpr[first + 1] = after & 0xFFFFFFFF, after >> 32

            runner, reads = getpc, [0]
        elif mnemonic == "ds_swizzle_b32":
            inst = emu.decode_inst(bytes((ctypes.c_char * 16).from_address(pc).raw), "cdna")
            runner, reads = self.swizzle(inst, size, operands), [0, 1]
        elif mnemonic.startswith("v_mfma"):
            def skip_mfma(sgprs):
                advance(emu, (ctypes.c_uint32 * emu.SGPR_COUNT).from_address(sgprs.value), size)
                self.stood_in[mnemonic] = self.stood_in.get(mnemonic, 0) + 1

            runner, reads = skip_mfma, [0]
        else:
            raise error or RuntimeError(f"{mnemonic}: no stand-in")
        program = types.SimpleNamespace(arg=types.SimpleNamespace(globals=reads))
        return (program, types.SimpleNamespace(fxn=runner)), types.SimpleNamespace(op=None)

    # The emulator passes its state as buffers by index: SGPRs, VGPRs, global memory, LDS,
    # scratch, AccVGPRs (run_asm's c_bufs).
    def sgprs(self, buffers):
        return (ctypes.c_uint32 * self.emu.SGPR_COUNT).from_address(buffers[0].value)

    def vgprs(self, buffers):
        return (ctypes.c_uint32 * (256 * 64)).from_address(buffers[1].value)

    def lanes(self, sgpr):
        mask = sgpr[self.exec_lo] | (sgpr[self.exec_lo + 1] << 32)
        return [lane for lane in range(64) if mask >> lane & 1]

    def addresses_of(self, inst):
        """A function recording `inst`'s accesses from the emulator's state, or None for an
        instruction that touches no global memory."""
        irc = self.emu.irc
        name = inst.op.name
        kind = "store" if ("STORE" in name or "ATOMIC" in name) else "load"
        if isinstance(inst, irc.SMEM):
            if not ("LOAD" in name or "STORE" in name or "ATOMIC" in name) or "SCRATCH" in name:
                return None
            if "BUFFER" in name:
                raise RuntimeError(f"{name}: scalar buffer instructions are not recorded")
            size = access_bytes(name)
            base = inst.sbase.offset
            offset = signed(inst.offset, type(inst).offset)
            uses_soffset = bool(inst.soffset_en)
            soffset = inst.soffset.offset

            def smem(buffers):
                sgpr = self.sgprs(buffers)
                address = (sgpr[base] | sgpr[base + 1] << 32) + offset
                if uses_soffset:
                    address += sgpr[soffset]
                self.access(kind, address & (1 << 64) - 1, size, name)

            return smem
        if isinstance(inst, (irc.GLOBAL, irc.FLAT)):
            size = access_bytes(name)
            vaddr = inst.addr.offset - 256
            saddr = inst.saddr.offset
            offset = signed(inst.offset, type(inst).offset)

            def flat(buffers):
                sgpr, vgpr = self.sgprs(buffers), self.vgprs(buffers)
                for lane in self.lanes(sgpr):
                    low = vgpr[vaddr * 64 + lane]
                    if saddr < 124:  # an SGPR pair as the base, the VGPR a 32-bit offset
                        address = (sgpr[saddr] | sgpr[saddr + 1] << 32) + low
                    else:
                        address = low | vgpr[(vaddr + 1) * 64 + lane] << 32
                    self.access(kind, (address + offset) & (1 << 64) - 1, size, name)

            return flat
        if isinstance(inst, irc.MUBUF):
            size = access_bytes(name)
            vaddr, rsrc = inst.vaddr.offset - 256, inst.srsrc.offset
            soffset = getattr(inst.soffset, "offset", inst.soffset)
            offset, offen, idxen = inst.offset, inst.offen, inst.idxen

            def mubuf(buffers):
                sgpr, vgpr = self.sgprs(buffers), self.vgprs(buffers)
                base = (sgpr[rsrc] | sgpr[rsrc + 1] << 32) & 0xFFFF_FFFF_FFFF
                records, stride = sgpr[rsrc + 2], sgpr[rsrc + 3] & 0x3FFF
                extra = sgpr[soffset] if soffset < 128 else soffset - 128
                for lane in self.lanes(sgpr):
                    index = vgpr[vaddr * 64 + lane] if idxen else 0
                    voffset = vgpr[(vaddr + (1 if idxen else 0)) * 64 + lane] if offen else 0
                    within = (stride * index + voffset + offset) & 0xFFFF_FFFF
                    # Outside num_records the hardware reads zeros and drops stores.
                    if within < records:
                        self.access(kind, base + extra + within, size, name)

            return mubuf
        if isinstance(inst, irc.MTBUF):
            raise RuntimeError(f"{name}: typed buffer instructions are not recorded")
        # LDS (DS) and scratch are not global memory.
        return None


def advance(emu, sgpr, size):
    """Moves the program counter (which the emulator keeps in two SGPR slots) past an
    instruction of `size` bytes; returns the new value."""
    after = (sgpr[emu.PC_LO_IDX] | sgpr[emu.PC_HI_IDX] << 32) + size
    sgpr[emu.PC_LO_IDX], sgpr[emu.PC_HI_IDX] = after & 0xFFFFFFFF, after >> 32
    return after


def signed(value, field):
    width = field.hi - field.lo + 1
    return value - (1 << width) if value >> (width - 1) & 1 else value


class Region:
    def __init__(self, what, address, size):
        self.what, self.address, self.size = what, address, size

    def holds(self, address, size):
        return self.address <= address and address + size <= self.address + self.size


def where(address, size, buffers):
    """Where an access lies relative to the nearest buffer, in words."""
    def distance(b):
        if address < b.address:
            return b.address - address
        return max(0, address + size - (b.address + b.size))

    if not buffers:
        return "no buffer is near"
    b = min(buffers, key=distance)
    if address < b.address:
        return f"{b.address - address} bytes before `{b.what}`"
    return f"{address + size - (b.address + b.size)} bytes past the end of `{b.what}` ({b.size} bytes)"


def disassemble(path, target):
    """{offset in the code object: (mnemonic, operands, bytes)} of every instruction, as LLVM's
    disassembler for `target` reads them: the emulator decodes every CDNA target with one
    opcode map."""
    text = subprocess.run([f"{gemm_emu.LLVM}/llvm-objdump", "-d", f"--mcpu={target}", path],
                          capture_output=True, text=True, check=True).stdout
    out = {}
    for line in text.splitlines():
        match = re.match(r"\s+(\S+)\s*(.*?)\s*// ([0-9A-F]+): ((?:[0-9A-F]{8} ?)+)$", line)
        if match:
            mnemonic, operands, address, words = match.groups()
            out[int(address, 16)] = (mnemonic, operands, 4 * len(words.split()))
    return out


def run_job(run_asm, recorder, job, objects, metadata):
    path = job["code_object"]
    if path not in objects:
        metadata[path] = kernel_metadata(path)
        objects[path] = (CodeObject(open(path, "rb").read()), disassemble(path, job["target"]))
    (co, disassembly), meta = objects[path], metadata[path]
    keep = []
    buffers = []
    for b in job["buffers"]:
        data = open(b["data"], "rb").read()
        assert len(data) == b["bytes"], f"{b['name']}: {len(data)} bytes of data for {b['bytes']}"
        # Exactly the extent: an empty buffer gets no memory at all (address 0 is never valid).
        memory = ctypes.create_string_buffer(data, max(len(data), 1))
        keep.append(memory)
        address = ctypes.addressof(memory) if b["bytes"] else 0
        buffers.append((b, Region(b["name"], address, b["bytes"])))
    kernarg = bytes(job["kernarg"])

    def write(address):
        ctypes.memmove(address, kernarg, len(kernarg))
        for b, region in buffers:
            ctypes.memmove(address + b["offset"], region.address.to_bytes(8, "little"), 8)

    # (what, address, bytes) the kernel may read besides its buffers; the dispatch adds its own.
    allowed = [("the code object", co.base, co.size)]
    recorder.begin(co, disassembly, [(region, b["writable"]) for b, region in buffers], allowed)
    try:
        dispatch(run_asm, co, meta, job["kernel"], job["grid"], job["block"], write, allowed)
    except Outside:
        pass
    return recorder.count, recorder.touched, recorder.outside, dict(recorder.stood_in)


class Outside(Exception):
    """An access outside every region: the job ends there."""


def describe_touched(touched, job):
    sizes = {b["name"]: b["bytes"] for b in job["buffers"]}
    parts = []
    for name, (start, end) in touched.items():
        parts.append(f"{name} {'-' if start is None else f'{start}..{end}'} of {sizes[name]}")
    return ", ".join(parts)


def main():
    args = sys.argv[1:]
    options = {flag: args[args.index(flag) + 1] for flag in ("--only", "--target") if flag in args}
    if len(args) != 1 + 2 * len(options):
        print(__doc__)
        sys.exit(2)
    run_asm = gemm_emu.load_emulator(needs_hkload=False)
    from test.mockgpu.amd import emu  # loaded by load_emulator

    recorder = Recorder(emu)
    jobs = [job for job in json.load(open(args[0]))["jobs"]
            if job["kernel"].startswith(options.get("--only", ""))
            and job["target"] == options.get("--target", job["target"])]
    objects, metadata = {}, {}
    checked = outside_count = errors = 0
    started = time.time()
    for job in jobs:
        label = f"{job['target']} {job['kernel']}"
        began = time.time()
        try:
            count, touched, outside, stood_in = run_job(run_asm, recorder, job, objects, metadata)
        except Exception as error:  # the emulator's own failures are reported, never passed
            errors += 1
            message = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
            print(f"ERROR {label} ({job['case']}): {message}", flush=True)
            continue
        checked += 1
        seconds = time.time() - began
        # Instructions run without their results: said on every line they concern.
        stood = "".join(f"; {n} x {m} not computed (the emulator cannot run it)"
                        for m, n in sorted(stood_in.items()))
        if outside:
            outside_count += 1
            print(f"OUTSIDE {label} ({job['case']}): {len(outside)} of {count} accesses{stood}",
                  flush=True)
            for line in outside[:SHOWN]:
                print(f"    {line}")
        else:
            print(f"PASS {label} ({job['case']}): {count} accesses in {seconds:.1f}s; touched "
                  f"{describe_touched(touched, job)}{stood}", flush=True)
    print(f"{checked} jobs checked, {outside_count} outside, {errors} errors "
          f"({time.time() - started:.0f}s)")
    sys.exit(0 if outside_count == 0 and errors == 0 else 1)


if __name__ == "__main__":
    main()
