#!/usr/bin/env python3
"""gemm_a16w16 on an NVIDIA GPU: correctness against a float64 reference and speed against
torch.matmul (cuBLAS), in one run.

Calls the kernels through hkload's Python package with their arguments alone, as a user does:
each kernel's contract (manifests/gemm.toml) computes the launch and checks every buffer. The
split-K kernels' other z counts are checked by gpu_parity, which may set them.

Checks: fresh random inputs (uniform in [-1, 1), rounded to the input type), every symbol
variant, views (leading dimensions past the row width, pointers offset into a larger buffer,
unaligned rows), and C inside a poisoned buffer with guard bands before, between (ldc > n) and
after its rows: every element of C must be written and close to the reference, every other
element must still hold the poison. The bound, for C[i][j] with K terms:
    |got - ref| <= u_out |ref| + K 2^-22 sqrt(sum_k a_ik^2 b_kj^2) + tiny_out
u_out the output's rounding (2^-8 bf16, 2^-11 f16, 2^-24 f32), tiny_out half its subnormal
spacing (2^-25 for f16); the second term is f32
accumulation (products of 16-bit values are exact in f32), a generous statistical bound of
K roundings of partial sums. A negative control (k - 1 passed to the kernel) must fail it.

Every kernel is called with its arguments by name through kernel_calls.py, which puts them in
the order of the bundle's signature and names the symbols.

usage: gemm_bench.py BUNDLE [--check-only | --bench-only]   (hkload installed, or on PYTHONPATH)
"""

from __future__ import annotations

import math
import statistics
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # before torch and hkload load: the usage needs neither
    sys.exit(0)

import hkload  # noqa: E402
import torch  # noqa: E402

import kernel_calls as calls  # noqa: E402

POISON = -1  # 0xffff.. bits: NaN in bf16, f16 and f32

DT = {"bf16": torch.bfloat16, "f16": torch.float16}
UNIT = {"bf16": 2.0**-8, "f16": 2.0**-11, "f32": 2.0**-24}
# Half the spacing of the output type's subnormals: the rounding error of results too small for
# the relative term (f16 outputs below 2^-14, which a gated product reaches easily).
TINY = {"bf16": 2.0**-134, "f16": 2.0**-25, "f32": 2.0**-150}


def load(bundle):
    """The bundle's GEMMs on CUDA device 0. Matrices are passed as tensors whose first element
    is the matrix's (a view from an offset into a larger buffer is one)."""
    return hkload.Bundle(bundle).load(torch.device("cuda", 0))


def check_case(g, layout, ty, bias_on, out_f32, m, n, k, pad=(0, 0, 0), offset=0, control=False):
    """One launch; returns (ok, worst error / bound, description). layout "splitk" is the
    split-K kernel (nt, f32 C that the product adds to)."""
    split = layout == "splitk"
    if split:
        layout, out_f32 = "nt", True
    dt = DT[ty]
    pa, pb, pc = pad
    lda = k + pa
    ldb = (k if layout == "nt" else n) + pb
    ldc = n + pc
    brows = n if layout == "nt" else k
    bcols = k if layout == "nt" else n
    # Inputs as views into larger buffers (offset elements in), random in [-1, 1).
    abuf = (torch.rand(offset + m * lda + 8, device="cuda", dtype=torch.float32) * 2 - 1).to(dt)
    bbuf = (torch.rand(offset + brows * ldb + 8, device="cuda", dtype=torch.float32) * 2 - 1).to(dt)
    a = abuf[offset : offset + m * lda].view(m, lda)[:, :k]
    bm = bbuf[offset : offset + brows * ldb].view(brows, ldb)[:, :bcols]
    bias = (torch.rand(n, device="cuda") * 2 - 1).to(dt) if bias_on else None
    odt = torch.float32 if out_f32 else dt
    guard = 1024
    span = (m - 1) * ldc + n
    cbuf = torch.full((guard + m * ldc + guard,), POISON, device="cuda", dtype=torch.int32 if out_f32 else torch.int16).view(odt)
    start = None
    if split:  # C starts from random values, which the product adds to
        start = torch.rand(m, n, device="cuda") * 8 - 4
        cbuf[guard : guard + m * ldc].view(m, ldc)[:, :n] = start
    name = calls.gemm_symbol("splitk" if split else layout, ty, bias_on, out_f32)
    calls.call(g, name, c=cbuf[guard:], a=abuf[offset:], b=bbuf[offset:],
               **({"bias": bias} if bias_on else {}), m=m, n=n, k=k - 1 if control else k,
               lda=lda, ldb=ldb, ldc=ldc)
    torch.cuda.synchronize()
    a64, b64 = a.double(), bm.double()
    bk = b64.t() if layout == "nt" else b64  # [k, n]
    ref = a64 @ bk
    if bias_on:
        ref += bias.double()
    if start is not None:
        ref += start.double()
    spread = ((a64 * a64) @ (bk * bk)).sqrt()
    unit = 2.0**-20 if split else UNIT["f32" if out_f32 else ty]  # split K: a rounding per split
    bound = unit * ref.abs() + k * 2.0**-22 * spread + TINY["f32" if out_f32 else ty]
    cview = cbuf[guard : guard + m * ldc].view(m, ldc)
    got = cview[:, :n].double()
    err = (got - ref).abs()
    ok_values = bool((err <= bound).all())  # NaN (unwritten) fails
    worst = float((err / bound).max()) if ok_values else float("inf") if err.isnan().any() else float((err / bound).max())
    bits = cbuf.view(torch.int32 if out_f32 else torch.int16)
    untouched = bool((bits[:guard] == POISON).all() and (bits[guard + span :] == POISON).all())
    if pc:
        untouched &= bool((cview.view(torch.int32 if out_f32 else torch.int16)[:, n:] == POISON).all())
    desc = f"{name:<34} m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc} off={offset}"
    return ok_values and untouched, worst, untouched, desc


def check_batched(g, layout, ty, m, n, k, batch, shared_b):
    """A batch of products, B shared (stride 0) or not, C in a poisoned buffer with guards."""
    dt = DT[ty]
    a = (torch.rand(batch, m, k, device="cuda") * 2 - 1).to(dt)
    bshape = (n, k) if layout == "nt" else (k, n)
    b = (torch.rand(1 if shared_b else batch, *bshape, device="cuda") * 2 - 1).to(dt)
    guard = 1024
    cbuf = torch.full((guard + batch * m * n + guard,), POISON, device="cuda", dtype=torch.int16).view(dt)
    name = calls.batched_gemm_symbol(layout, ty)
    calls.call(g, name, c=cbuf[guard:], a=a, b=b, **calls.dense(m, n, k, layout), batch=batch,
               stride_a=m * k, stride_b=0 if shared_b else n * k, stride_c=m * n)
    torch.cuda.synchronize()
    bk = b.double().transpose(1, 2) if layout == "nt" else b.double()
    ref = a.double() @ bk
    spread = ((a.double() ** 2) @ (bk ** 2)).sqrt()
    bound = UNIT[ty] * ref.abs() + k * 2.0**-22 * spread + TINY[ty]
    got = cbuf[guard : guard + batch * m * n].view(batch, m, n).double()
    ok = bool(((got - ref).abs() <= bound).all())
    bits = cbuf.view(torch.int16)
    ok &= bool((bits[:guard] == POISON).all() and (bits[guard + batch * m * n :] == POISON).all())
    worst = float(((got - ref).abs() / bound).max())
    return ok, worst, f"{name:<34} m={m} n={n} k={k} batch={batch} shared_b={shared_b}"


ACT = {"silu": lambda x: x * torch.sigmoid(x),
       "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))}


def check_gated(g, act, ty, m, n, k):
    """C = act(A·W_gateᵀ) ⊙ (A·W_upᵀ), C poisoned with guards."""
    dt = DT[ty]
    a = (torch.rand(m, k, device="cuda") * 2 - 1).to(dt)
    wg = (torch.rand(n, k, device="cuda") * 2 - 1).to(dt)
    wu = (torch.rand(n, k, device="cuda") * 2 - 1).to(dt)
    guard = 1024
    cbuf = torch.full((guard + m * n + guard,), POISON, device="cuda", dtype=torch.int16).view(dt)
    name = calls.gated_gemm_symbol(act, ty)
    calls.call(g, name, c=cbuf[guard:], a=a, w_gate=wg, w_up=wu, **calls.dense(m, n, k))
    torch.cuda.synchronize()
    a64 = a.double()
    gate, up = a64 @ wg.double().t(), a64 @ wu.double().t()
    ref = ACT[act](gate) * up
    spread = torch.maximum(((a64**2) @ (wg.double().t() ** 2)).sqrt(), ((a64**2) @ (wu.double().t() ** 2)).sqrt())
    e = k * 2.0**-22 * spread
    bound = UNIT[ty] * ref.abs() + e * (1.2 * up.abs() + ACT[act](gate).abs()) + TINY[ty]
    got = cbuf[guard : guard + m * n].view(m, n).double()
    ok = bool(((got - ref).abs() <= bound).all())
    bits = cbuf.view(torch.int16)
    ok &= bool((bits[:guard] == POISON).all() and (bits[guard + m * n :] == POISON).all())
    return ok, float(((got - ref).abs() / bound).max()), f"{name:<34} m={m} n={n} k={k}"


def run_checks(g):
    torch.manual_seed(1234)
    shapes = [
        (1, 1, 1), (7, 7, 7), (1, 4096, 4096), (7, 127, 64), (64, 64, 64), (127, 127, 127),
        (64, 14336, 4096), (7, 4096, 14336), (127, 1, 4096), (1, 127, 14336), (4096, 64, 7),
        (4096, 4096, 64), (127, 4096, 127), (4096, 7, 4096), (200, 300, 1000), (1, 14336, 64),
        (4096, 4096, 4096), (2048, 14336, 4096), (129, 257, 4104),
    ]
    failures = 0
    total = 0
    worst_all = 0.0
    variants = [(l, t, b, o) for l in ("nt", "nn") for t in ("bf16", "f16") for b in (False, True) for o in (False, True)]
    cases = []
    for i, (m, n, k) in enumerate(shapes):
        # Each shape with every layout and type; bias and output type alternate.
        for layout in ("nt", "nn"):
            for ty in ("bf16", "f16"):
                cases.append((layout, ty, (i % 2) == 0, (i % 3) == 0, m, n, k, (0, 0, 0), 0))
    # Views: padded leading dimensions (aligned and not), offset pointers, for every variant.
    for j, (l, t, b, o) in enumerate(variants):
        cases.append((l, t, b, o, 77, 200, 136, (8, 16, 5), 0))  # aligned rows, ragged ldc
        cases.append((l, t, b, o, 33, 70, 61, (3, 1, 0), 1))  # unaligned rows and pointers
        cases.append((l, t, b, o, 130, 129, 128, (0, 0, 3), 8))  # aligned offset views
    # Split K: decode sizes, with the contract's z.
    for j, (m, n, k) in enumerate([(1, 4096, 4096), (16, 14336, 4096), (64, 4096, 14336), (7, 127, 7),
                                   (1, 28672, 8192), (33, 70, 61), (128, 1000, 4096)]):
        for ty in ("bf16", "f16"):
            cases.append(("splitk", ty, (j + (ty == "f16")) % 2 == 0, True, m, n, k, (0, 0, 0), 0))
    cases.append(("splitk", "bf16", True, True, 16, 4096, 4096, (8, 8, 3), 1))
    cases.append(("splitk", "f16", False, True, 5, 300, 1000, (3, 1, 0), 1))
    for case in cases:
        ok, worst, untouched, desc = check_case(g, *case[:7], pad=case[7], offset=case[8])
        total += 1
        worst_all = max(worst_all, worst)
        if not ok:
            failures += 1
            print(f"FAIL {desc} worst {worst:.3g} of bound, outside C untouched: {untouched}")
    for j, (layout, ty) in enumerate([(l, t) for l in ("nt", "nn") for t in ("bf16", "f16")]):
        for (m, n, k, batch) in [(127, 300, 200, 3), (256, 128, 4096, 8), (1, 4096, 4096, 2)]:
            ok, worst, desc = check_batched(g, layout, ty, m, n, k, batch, shared_b=(j + m) % 2 == 0)
            total += 1
            worst_all = max(worst_all, worst)
            if not ok:
                failures += 1
                print(f"FAIL {desc} worst {worst:.3g} of bound")
    for act in ("silu", "gelu_tanh"):
        for ty in ("bf16", "f16"):
            for (m, n, k) in [(1, 1, 1), (127, 300, 61), (130, 14336, 4096), (2048, 64, 4096)]:
                ok, worst, desc = check_gated(g, act, ty, m, n, k)
                total += 1
                worst_all = max(worst_all, worst)
                if not ok:
                    failures += 1
                    print(f"FAIL {desc} worst {worst:.3g} of bound")
    print(f"checks: {total - failures}/{total} passed, worst error {worst_all:.3f} of the bound")
    # Negative controls: the same check must fail for a kernel that skips a k value.
    caught = 0
    controls = [("nt", "bf16", False, False, 64, 64, 4096), ("nn", "f16", True, True, 7, 4096, 14336),
                ("nt", "bf16", False, False, 127, 127, 127), ("splitk", "bf16", False, True, 1, 4096, 4096)]
    for c in controls:
        ok, worst, _, desc = check_case(g, *c, control=True)
        caught += not ok
        print(f"control (k - 1 passed) {'caught' if not ok else 'NOT CAUGHT'}: {desc} worst {worst:.3g}")
    return failures == 0 and caught == len(controls)


def bench_ms(fn, rounds=7, warmup=3):
    """Median over rounds of the mean time of one call, each round a batch of calls queued
    back to back between two events: long enough (about 2 ms) that the host's launch overhead
    overlaps the GPU's work instead of adding idle gaps to small kernels."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # The batch from ten calls, not one: one call's time is mostly its launch latency for
    # kernels of tens of microseconds, which made batches too short to hide it.
    s.record()
    for _ in range(10):
        fn()
    e.record()
    e.synchronize()
    batch = max(1, min(200, int(2.0 / max(s.elapsed_time(e) / 10, 1e-3))))
    times = []
    for _ in range(rounds):
        s.record()
        for _ in range(batch):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / batch)
    return statistics.median(times)


def run_bench(g):
    torch.manual_seed(5)
    # Square, odd (m and n prime-ish, so no block or store pair is whole at the edges), and
    # Llama-3's linear layers at decode (1, 16), batched decode (64-256) and prefill sizes.
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (3001, 5003, 4096), (1021, 4093, 4096)]
    for n, k in calls.LLAMA3_LINEAR:
        for m in (1, 16, 64, 128, 256, 2048, 8192):
            shapes.append((m, n, k))
    print("ours: gemm_a16w16_nt_bf16 (bf16 out); split K: gemm_a16w16_splitk_nt_bf16 into f32, timed with the zeroing of C;")
    print("ratio = cuBLAS time / ours (best of the two for M <= 256); GB/s counts A + B + C once, copy = a same-bytes device copy")
    print(f"{'M':>5} {'N':>6} {'K':>6} {'ours ms':>9} {'ours TF/s':>9} {'splitK ms':>9} {'cuBLAS ms':>9} {'cuBLAS TF/s':>11} {'ratio':>6} {'GB/s ours':>9} {'GB/s copy':>9}")
    rows = []
    for m, n, k in shapes:
        bytes_moved = 2 * (m * k + n * k + m * n)
        # Rotate over enough weight copies to exceed the 50 MB L2.
        copies = max(1, min(8, math.ceil(200e6 / bytes_moved)))
        a = [(torch.rand(m, k, device="cuda") * 2 - 1).to(torch.bfloat16) for _ in range(copies)]
        w = [(torch.rand(n, k, device="cuda") * 2 - 1).to(torch.bfloat16) for _ in range(copies)]
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        it = [0]
        name = calls.gemm_symbol("nt", "bf16")
        # Each copy's arguments in the kernel's order, made once: the timed calls only launch.
        args = [calls.arguments(g, name, c=c, a=a[i], b=w[i], **calls.dense(m, n, k)) for i in range(copies)]

        def ours():
            i = it[0] = (it[0] + 1) % copies
            g.call(name, *args[i])

        def theirs():
            i = it[0] = (it[0] + 1) % copies
            torch.matmul(a[i], w[i].t(), out=c)

        t_ours = bench_ms(ours)
        t_split = None
        if m <= 256:
            c32 = torch.empty(m, n, device="cuda", dtype=torch.float32)
            split_name = calls.gemm_symbol("splitk", "bf16")
            split_args = [
                calls.arguments(g, split_name, c=c32, a=a[i], b=w[i], **calls.dense(m, n, k))
                for i in range(copies)
            ]

            def split():
                i = it[0] = (it[0] + 1) % copies
                c32.zero_()
                g.call(split_name, *split_args[i])

            t_split = bench_ms(split)
        t_theirs = bench_ms(theirs)
        best = min(t_ours, t_split or t_ours)
        flop = 2.0 * m * n * k
        src = torch.empty(bytes_moved // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        t_copy = bench_ms(lambda: dst.copy_(src))
        row = (m, n, k, t_ours, flop / t_ours / 1e9, t_split, t_theirs, flop / t_theirs / 1e9, t_theirs / best,
               bytes_moved / best / 1e6, bytes_moved / t_copy / 1e6)
        rows.append(row)
        split_text = f"{t_split:>9.4f}" if t_split is not None else f"{'-':>9}"
        print(f"{m:>5} {n:>6} {k:>6} {row[3]:>9.4f} {row[4]:>9.1f} {split_text} {row[6]:>9.4f} {row[7]:>11.1f} {row[8]:>6.2f} {row[9]:>9.0f} {row[10]:>9.0f}", flush=True)
        del a, w, c, src, dst
    print("gated (Llama MLP gate and up with silu_and_mul): gemm_a16w16_gated_silu_bf16 against torch eager "
          "(two matmuls, silu, mul), TF/s counting the two products")
    for m, n, k in [(2048, 14336, 4096), (8192, 14336, 4096)]:
        a = (torch.rand(m, k, device="cuda") * 2 - 1).to(torch.bfloat16)
        wg = (torch.rand(n, k, device="cuda") * 2 - 1).to(torch.bfloat16)
        wu = (torch.rand(n, k, device="cuda") * 2 - 1).to(torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        name = calls.gated_gemm_symbol("silu", "bf16")
        args = calls.arguments(g, name, c=c, a=a, w_gate=wg, w_up=wu, **calls.dense(m, n, k))
        t_ours = bench_ms(lambda: g.call(name, *args))
        t_theirs = bench_ms(lambda: torch.nn.functional.silu(a @ wg.t()) * (a @ wu.t()))
        flop = 4.0 * m * n * k
        print(f"{m:>5} {n:>6} {k:>6}  ours {t_ours:.4f} ms {flop / t_ours / 1e9:6.1f} TF/s   torch {t_theirs:.4f} ms {flop / t_theirs / 1e9:6.1f} TF/s   ratio {t_theirs / t_ours:.2f}", flush=True)
    return rows


def main():
    if len(sys.argv) not in (2, 3) or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    bundle = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "hkload", bundle)
    g = load(bundle)
    ok = True
    if mode != "--bench-only":
        ok = run_checks(g)
    if mode != "--check-only":
        run_bench(g)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
