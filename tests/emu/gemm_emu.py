#!/usr/bin/env python3
"""The gemm module's AMD code objects run on a CPU emulator of the CDNA instruction set
(tinygrad's test/mockgpu/amd/emu.py, a test instrument: see /work/shared/amd-emulator.md), against
a float64 reference. No AMD GPU runs anywhere here; this is the closest check of what the
gfx942/gfx950 code computes.

usage: HK_TINYGRAD=<tinygrad source tree> gemm_emu.py BUNDLE [--target gfx942,gfx950]
       (cargo test -p hk-tests --test gemm_amd runs it when HK_TINYGRAD is set)

Skips cleanly (exit 0, saying so) when HK_TINYGRAD is unset or lacks test/mockgpu/amd, or
numpy is missing. The emulator's CPU backend compiles with `clang` and `ld.lld`; where PATH has
none, Debian's clang-22 and ld.lld-22 are linked under those names for this process.

What it does, per target: unbundles the code object (clang-offload-bundler), maps its load
segments at their virtual addresses in host memory, reads each kernel's descriptor (`.kd`) and
metadata (llvm-readelf --notes), builds the launch state the hardware would (explicit
arguments and code object v5 hidden arguments at their metadata offsets, user SGPRs in
hardware order as kernel_code_properties enables them), and runs every workgroup. Memory is
host memory and unchecked, so every buffer has guard bands and C starts poisoned: each case
checks C against the reference bound of tests/src/kernels/gemm.rs and that nothing outside C
changed. Each run also runs a deliberately broken copy of the code (its first MFMA instruction
turned into the other element type's) and requires that to fail.

gfx90a is left out: the emulator decodes every target with gfx942's opcode map, in which
gfx90a's v_mfma_f32_16x16x16bf16_1k encoding is another instruction.
"""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

LLVM = "/usr/lib/llvm-22/bin"
POISON16 = 0xFFFF  # NaN in bf16 and f16

# kernel_code_properties bits (AMDGPU code object v5, gfx9) and the user SGPRs each enables.
USER_SGPRS = [(0, "private_segment_buffer", 4), (1, "dispatch_ptr", 2), (2, "queue_ptr", 2),
              (3, "kernarg_segment_ptr", 2), (4, "dispatch_id", 2), (5, "flat_scratch_init", 2),
              (6, "private_segment_size", 1)]

# The MFMA mnemonics' encodings (first two bytes of the 8, little-endian high word), by target:
# bf16 form, f16 form. Swapping one for the other breaks a kernel on purpose.
MFMA_OPCODE = {"gfx942": (0xD3E1, 0xD3CD), "gfx950": (0xD3B5, 0xD3D4)}


def skip(reason):
    script = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    print(f"{script}: SKIPPED: {reason}")
    sys.exit(0)


def load_emulator(needs_hkload=True):
    tree = os.environ.get("HK_TINYGRAD")
    if not tree:
        skip("set HK_TINYGRAD to a tinygrad source tree (its test/mockgpu/amd is the emulator)")
    if not os.path.isfile(os.path.join(tree, "test/mockgpu/amd/emu.py")):
        skip(f"HK_TINYGRAD={tree} has no test/mockgpu/amd/emu.py")
    try:
        import numpy  # noqa: F401
    except ImportError:
        skip("the emulator needs numpy")
    try:
        import yaml  # noqa: F401
    except ImportError:
        skip("reading the code objects' metadata needs PyYAML (pip install pyyaml)")
    try:
        if needs_hkload:
            import hkload  # noqa: F401
    except ImportError:
        skip("the launch shapes come from the kernels' contracts through hkload's Python package (scripts/setup installs it in .venv)")
    if not (shutil.which("clang") and shutil.which("ld.lld")):
        links = tempfile.mkdtemp()
        for name, versioned in (("clang", "clang-22"), ("ld.lld", "ld.lld-22")):
            found = shutil.which(versioned)
            if not found:
                skip(f"the emulator needs `{name}` (or {versioned}) on PATH")
            os.symlink(found, os.path.join(links, name))
        os.environ["PATH"] = links + os.pathsep + os.environ["PATH"]
    sys.path.insert(0, tree)
    try:
        from test.mockgpu.amd.emu import run_asm  # noqa: E402
    except ImportError as missing:
        skip(f"the emulator needs the Python module `{missing.name}` (pip install it)")
    return run_asm


# ---- The code object -------------------------------------------------------------------------


class CodeObject:
    """An AMDGPU code object mapped into host memory at its virtual addresses."""

    def __init__(self, data: bytes, patch=None):
        self.data = bytearray(data)
        if patch:
            patch(self)
        e_phoff, = struct.unpack_from("<Q", self.data, 0x20)
        e_phentsize, e_phnum = struct.unpack_from("<HH", self.data, 0x36)
        segments = []
        for i in range(e_phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack_from(
                "<IIQQQQQQ", self.data, e_phoff + i * e_phentsize)
            if p_type == 1:  # PT_LOAD
                segments.append((p_offset, p_vaddr, p_filesz, p_memsz))
        size = max(v + m for _, v, _, m in segments)
        self.memory = ctypes.create_string_buffer(size + 4096)
        self.base = (ctypes.addressof(self.memory) + 4095) & ~4095
        for offset, vaddr, filesz, _ in segments:
            ctypes.memmove(self.base + vaddr, bytes(self.data[offset:offset + filesz]), filesz)
        self.size = size

    def symbols(self):
        """name -> (value, size) from .symtab."""
        e_shoff, = struct.unpack_from("<Q", self.data, 0x28)
        e_shentsize, e_shnum = struct.unpack_from("<HH", self.data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", self.data, e_shoff + i * e_shentsize)
                    for i in range(e_shnum)]
        out = {}
        for sh in sections:
            if sh[1] != 2:  # SHT_SYMTAB
                continue
            strtab = sections[sh[6]]
            for j in range(sh[5] // 24):
                st_name, _, _, _, st_value, st_size = struct.unpack_from("<IBBHQQ", self.data, sh[4] + j * 24)
                end = self.data.index(b"\0", strtab[4] + st_name)
                out[self.data[strtab[4] + st_name:end].decode()] = (st_value, st_size)
        return out


def kernel_metadata(path):
    """kernel name -> {"args": [(offset, size, kind)], "kernarg_size": n} from the metadata note."""
    import yaml
    text = subprocess.run([f"{LLVM}/llvm-readelf", "--notes", path], capture_output=True, text=True,
                          check=True).stdout
    body = text[text.index("---"):text.rindex("...") + 3]
    meta = yaml.safe_load(body)
    return {k[".name"]: {"args": [(a[".offset"], a[".size"], a[".value_kind"]) for a in k[".args"]],
                         "kernarg_size": k[".kernarg_segment_size"]}
            for k in meta["amdhsa.kernels"]}


def unbundle(bundle, target, out, module="gemm"):
    subprocess.run([f"{LLVM}/clang-offload-bundler", "--unbundle", "--type=o",
                    f"--input={os.path.join(bundle, module + '.hipfb')}",
                    f"--targets=hipv4-amdgcn-amd-amdhsa--{target}", f"--output={out}"], check=True)
    return open(out, "rb").read()


# ---- Host buffers ------------------------------------------------------------------------------


class Buffer:
    """A numpy array with guard bands of `guard` elements on each side, filled with fill."""

    def __init__(self, np, n, dtype, fill, guard=256):
        self.np, self.guard, self.n = np, guard, n
        self.full = np.full(n + 2 * guard, fill, dtype=dtype)

    @property
    def view(self):
        return self.full[self.guard:self.guard + self.n]

    @property
    def address(self):
        return self.full.ctypes.data + self.guard * self.full.itemsize

    def guards_intact(self, fill):
        return bool((self.full[:self.guard] == fill).all() and (self.full[self.guard + self.n:] == fill).all())


def to_bits(np, x, ty):
    """float64 values -> (uint16 bits, the values they hold) of bf16 (round to nearest even) or f16."""
    if ty == "f16":
        h = x.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float64)
    f = x.astype(np.float32).view(np.uint32)
    bits = ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def from_bits(np, bits, ty):
    if ty == "f16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# ---- One launch --------------------------------------------------------------------------------


def launch(run_asm, co, meta, name, grid, block, explicit):
    """Runs kernel `name` over grid x block with explicit argument values (ints: pointers and
    integers, by the metadata's sizes)."""
    values = iter(explicit)

    def write(kernarg_addr):
        for offset, size, kind in meta[name]["args"]:
            if kind in ("global_buffer", "by_value"):
                value = next(values)
                ctypes.memmove(kernarg_addr + offset, int(value).to_bytes(size, "little", signed=value < 0), size)

    dispatch(run_asm, co, meta, name, grid, block, write)


def dispatch(run_asm, co, meta, name, grid, block, write_explicit, regions=None):
    """Runs kernel `name` over grid x block (blocks counted per dimension, a block's threads per
    dimension; missing dimensions are 1): write_explicit(address) writes the explicit arguments
    into the kernel argument segment, this adds the hidden ones of code object v5, the dispatch
    packet and the user SGPRs. `regions`, where given, gets (what, address, bytes) of the
    argument segment and the packet: memory the kernel may read besides its buffers."""
    grid, block = (tuple(grid) + (1, 1, 1))[:3], (tuple(block) + (1, 1, 1))[:3]
    kd_addr = co.symbols()[f"{name}.kd"][0]
    kd = ctypes.string_at(co.base + kd_addr, 64)
    lds_size, private_size = struct.unpack_from("<II", kd, 0)
    entry_offset, = struct.unpack_from("<q", kd, 16)
    rsrc2, = struct.unpack_from("<I", kd, 52)
    # The dispatch, not the descriptor, gives the hardware its LDS size (the packet's
    # group_segment_size); the emulator takes it from rsrc2's LDS_SIZE field, in 512-byte granules.
    rsrc2 = (rsrc2 & ~(0x1FF << 15)) | (((lds_size + 511) // 512) << 15)
    properties, = struct.unpack_from("<H", kd, 56)
    info = meta[name]
    kernarg_bytes = max(info["kernarg_size"], 256)
    kernarg = ctypes.create_string_buffer(kernarg_bytes + 64)
    kernarg_addr = (ctypes.addressof(kernarg) + 63) & ~63
    hidden = {"hidden_block_count_x": grid[0], "hidden_block_count_y": grid[1], "hidden_block_count_z": grid[2],
              "hidden_group_size_x": block[0], "hidden_group_size_y": block[1], "hidden_group_size_z": block[2],
              "hidden_remainder_x": 0, "hidden_remainder_y": 0, "hidden_remainder_z": 0,
              "hidden_grid_dims": 3 if grid[2] > 1 else (2 if grid[1] > 1 else 1)}
    write_explicit(kernarg_addr)
    for offset, size, kind in info["args"]:
        if kind not in ("global_buffer", "by_value"):
            value = hidden.get(kind, 0)
            ctypes.memmove(kernarg_addr + offset, int(value).to_bytes(size, "little", signed=value < 0), size)
    # A dispatch packet for code that reads one (sizes as the hardware's AQL packet holds them).
    packet = ctypes.create_string_buffer(64)
    struct.pack_into("<HHHHHHIII", packet, 0, 0, 3, block[0], block[1], block[2], 0,
                     grid[0] * block[0], grid[1] * block[1], grid[2] * block[2])
    if regions is not None:
        regions += [("the kernel arguments", kernarg_addr, kernarg_bytes),
                    ("the dispatch packet", ctypes.addressof(packet), 64)]
    user = []
    for bit, what, count in USER_SGPRS:
        if properties & (1 << bit):
            value = {"kernarg_segment_ptr": kernarg_addr, "dispatch_ptr": ctypes.addressof(packet)}.get(what, 0)
            user += [value & 0xFFFFFFFF, value >> 32][:count] + [0] * max(0, count - 2)
    user_count = (rsrc2 >> 1) & 0x1F
    assert len(user) == user_count, f"{name}: {len(user)} user SGPRs built, rsrc2 says {user_count}"
    entry = co.base + kd_addr + entry_offset
    run_asm(entry, co.size - (kd_addr + entry_offset), grid[0], grid[1], grid[2], block[0], block[1], block[2],
            kernarg_addr, rsrc2=rsrc2, scratch_size=private_size, arch="cdna", user_data=user)


# ---- Cases --------------------------------------------------------------------------------------


def launch_shape(kernels, name, pointers, scalars, z):
    """The grid and block of kernel `name`'s contract for these arguments (hkload on a simulated
    device of the target), z blocks along z for split K, whose contract lets any z be."""
    import hkload

    args = [hkload.Pointer(address, elem, length) for address, elem, length in pointers] + scalars
    shape = getattr(kernels, name).launch_shape(*args)
    grid = list(shape["grid"])
    if "_splitk_" in name:
        grid[2] = z
    return tuple(grid), tuple(shape["block"])


def check(np, run_asm, co, meta, kernels, case, rng):
    """One case: (kind, layout, ty, m, n, k, pads, z). Returns (ok, worst / bound, label)."""
    kind, layout, ty, m, n, k, (pa, pb, pc), z = case
    lda, ldc = k + pa, n + pc
    b_rows, b_cols = (n, k) if layout == "nt" else (k, n)
    ldb = b_cols + pb
    batch = z if kind == "batched" else 1
    stride_a, stride_b, stride_c = m * lda, b_rows * ldb, m * ldc
    a_bits, a_vals = to_bits(np, rng.uniform(-1, 1, batch * stride_a), ty)
    b_bits, b_vals = to_bits(np, rng.uniform(-1, 1, batch * stride_b), ty)
    a = Buffer(np, batch * stride_a, np.uint16, 0)
    b = Buffer(np, batch * stride_b, np.uint16, 0)
    a.view[:], b.view[:] = a_bits, b_bits
    split = kind == "splitk"
    out_f32 = split
    if out_f32:
        c = Buffer(np, batch * stride_c, np.float32, np.nan)
        start = rng.uniform(-4, 4, (m, n)).astype(np.float32)
        c.view.reshape(m, ldc)[:, :n] = start
    else:
        c = Buffer(np, batch * stride_c, np.uint16, POISON16)
    want, spread = [], []
    for i in range(batch):
        ai = a_vals[i * stride_a:(i + 1) * stride_a].reshape(m, lda)[:, :k]
        bi = b_vals[i * stride_b:(i + 1) * stride_b].reshape(b_rows, ldb)[:, :b_cols]
        bk = bi.T if layout == "nt" else bi
        ref = ai @ bk
        if split:
            ref = ref + start
        want.append(ref)
        spread.append(np.sqrt((ai * ai) @ (bk * bk)))
    gated = kind == "gated"
    if gated:  # a second weight, W_up; C = silu(A·W_gateᵀ) ⊙ (A·W_upᵀ)
        u_bits, u_vals = to_bits(np, rng.uniform(-1, 1, stride_b), ty)
        w_up = Buffer(np, stride_b, np.uint16, 0)
        w_up.view[:] = u_bits
        gate = want[0]
        ub = u_vals.reshape(b_rows, ldb)[:, :b_cols]
        up = a_vals.reshape(m, lda)[:, :k] @ ub.T
        silu = gate / (1 + np.exp(-gate))
        want = [silu * up]
        e = k * 2.0 ** -22 * np.maximum(spread[0], np.sqrt((a_vals.reshape(m, lda)[:, :k] ** 2) @ (ub.T ** 2)))
        spread = [e * (1.2 * np.abs(up) + np.abs(silu)) / (k * 2.0 ** -22)]
    name = {
        "gemm": f"gemm_a16w16_{layout}_{ty}",
        "gated": f"gemm_a16w16_gated_silu_{ty}",
        "batched": f"batched_gemm_a16w16_{layout}_{ty}",
        "splitk": f"gemm_a16w16_splitk_nt_{ty}",
    }[kind]
    pointers = [(c.address, "f32" if out_f32 else ty, c.n), (a.address, ty, a.n), (b.address, ty, b.n)]
    if gated:
        pointers.append((w_up.address, ty, w_up.n))
    scalars = [m, n, k, lda, ldb, ldc] + ([batch, stride_a, stride_b, stride_c] if kind == "batched" else [])
    grid, block = launch_shape(kernels, name, pointers, scalars, z)
    explicit = [address for address, _, _ in pointers] + scalars
    launch(run_asm, co, meta, name, grid, block, explicit)
    unit = 2.0 ** -20 if split else {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}[ty]
    worst, ok = 0.0, True
    for i in range(batch):
        block = c.view[i * stride_c:(i + 1) * stride_c].reshape(m, ldc)
        got = block[:, :n].astype(np.float64) if out_f32 else from_bits(np, block[:, :n].copy(), ty)
        # Plus half the f16 subnormal spacing, the rounding of results below 2^-14.
        bound = unit * np.abs(want[i]) + k * 2.0 ** -22 * spread[i] + (2.0 ** -25 if ty == "f16" else 0)
        err = np.abs(got - want[i])
        ok &= bool((err <= bound).all())
        worst = max(worst, float(np.nanmax(err / bound)) if not np.isnan(err).any() else math.inf)
        gaps = block[:, n:]
        ok &= bool(np.isnan(gaps).all()) if out_f32 else bool((gaps == POISON16).all())
    if out_f32:
        ok &= bool(np.isnan(c.full[:c.guard]).all() and np.isnan(c.full[c.guard + c.n:]).all())
    else:
        ok &= c.guards_intact(POISON16)
    label = f"{name} m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc}" + (f" z={z}" if kind != "gemm" else "")
    return ok, worst, label


CASES = [
    ("gemm", "nt", "bf16", 33, 70, 61, (2, 1, 2), 1),     # unaligned rows: the element-wise path
    ("gemm", "nn", "f16", 33, 70, 61, (2, 1, 2), 1),
    ("gemm", "nt", "f16", 130, 129, 72, (8, 0, 3), 1),    # 2 x 2 blocks, aligned rows, K tail
    ("gemm", "nn", "bf16", 20, 140, 100, (0, 4, 0), 1),
    ("splitk", "nt", "bf16", 5, 70, 300, (0, 0, 1), 3),   # K split 3 ways, C added to
    ("batched", "nt", "bf16", 17, 40, 48, (0, 0, 2), 2),
    ("gated", "nt", "f16", 20, 70, 40, (0, 0, 1), 1),
    # Aligned rows, k whole steps: the whole-chunk loop alone, past the M edge and B's N edge
    ("gemm", "nn", "bf16", 70, 136, 96, (0, 8, 0), 1),
    # Aligned rows, split K: the last split's whole step, then its K tail in the other loop
    ("splitk", "nt", "bf16", 5, 70, 200, (0, 0, 1), 3),
]


def main():
    run_asm = load_emulator()
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
            data = unbundle(bundle, target, path)
            meta = kernel_metadata(path)
            co = CodeObject(data)
            device = hkload.testing.simulated_device(f"{target}:sramecc+:xnack-")
            kernels = hkload.Bundle(bundle).load(device)
            for case in CASES:
                ok, worst, label = check(np, run_asm, co, meta, kernels, case, rng)
                failed += not ok
                print(f"{'PASS' if ok else 'FAIL'} {target} {label}  worst {worst:.3f} of the bound", flush=True)
            # The broken kernel: the first bf16 MFMA of gemm_a16w16_nt_bf16 made an f16 one.
            bf16_op, f16_op = MFMA_OPCODE[target]
            start, size = co.symbols()["gemm_a16w16_nt_bf16"]

            def patch(obj, start=start, size=size):
                text = obj.segment_offset(start)
                for at in range(text, text + size, 4):
                    if struct.unpack_from("<H", obj.data, at + 2)[0] == bf16_op:
                        struct.pack_into("<H", obj.data, at + 2, f16_op)
                        return
                raise SystemExit(f"no {bf16_op:#x} MFMA in gemm_a16w16_nt_bf16 for {target}")

            broken = CodeObject.__new__(CodeObject)
            broken.data = bytearray(data)
            broken.segment_offset = lambda vaddr, d=broken: file_offset(d.data, vaddr)
            patch(broken)
            broken_co = CodeObject(bytes(broken.data))
            ok, worst, label = check(np, run_asm, broken_co, meta, kernels, CASES[2][:2] + ("bf16",) + CASES[2][3:], rng)
            failed += ok
            print(f"{'caught' if not ok else 'NOT CAUGHT'} {target} broken kernel (one MFMA bf16 -> f16): {label}  worst {worst:.3g}", flush=True)
    print(f"gemm_emu: {'FAILED' if failed else 'all passed'} ({failed} failed)")
    sys.exit(1 if failed else 0)


def file_offset(data, vaddr):
    """The file offset of virtual address vaddr (through the PT_LOAD headers)."""
    e_phoff, = struct.unpack_from("<Q", data, 0x20)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(e_phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, e_phoff + i * e_phentsize)
        if p_type == 1 and p_vaddr <= vaddr < p_vaddr + p_filesz:
            return p_offset + vaddr - p_vaddr
    raise ValueError(f"address {vaddr:#x} is in no loaded segment")


if __name__ == "__main__":
    main()
