#!/usr/bin/env python3
"""The CPU time of one call on small tensors, in one run, on one GPU:

- ``kernels.rmsnorm_bf16(...)``: a direct hkload call (every check, then the launch);
- ``torch.ops.hk.rmsnorm_bf16(...)``: the same kernel as a registered torch op;
- ``torch.add(a, b, out=c)``: torch's own cheapest launch, for scale;
- a plain ``torch.library.custom_op`` wrapping ``torch.add``: what a custom op costs.

Each is called ROUNDS times in a loop of CALLS calls, the four interleaved round by round;
the table shows the median round's time per call. The kernel's arguments are put in order by
kernel_calls.py once, outside the loops.

usage: call_overhead.py [BUNDLE]   (default: HKLOAD_BUNDLE, else dist/hk-kernels-0.1.0)
"""

from __future__ import annotations

import os
import statistics
import sys
import time

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # before torch and hkload load: the usage needs neither
    sys.exit(0)

import torch  # noqa: E402

import hkload  # noqa: E402
import hkload.torch  # noqa: E402
import kernel_calls as calls  # noqa: E402

CALLS = 2000
ROUNDS = 15
ROWS, COLS = 4, 512


def bench_add(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    torch.add(a, b, out=c)


def main() -> None:
    bundle = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("HKLOAD_BUNDLE", "dist/hk-kernels-0.1.0")
    kernels = hkload.Bundle(bundle).load(torch.device("cuda", 0))
    ops = hkload.torch.register(kernels, namespace="hk")
    add = torch.library.custom_op("bench::add", mutates_args=("c",))(bench_add)
    add.register_fake(lambda a, b, c: None)

    x = torch.randn(ROWS, COLS, dtype=torch.bfloat16, device="cuda")
    weight = torch.randn(COLS, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(x)
    rmsnorm = calls.rmsnorm_symbol("bf16")
    args = calls.arguments(kernels, rmsnorm, out=out, x=x, weight=weight, eps=1e-6, rows=ROWS, cols=COLS)
    a, b = torch.randn(ROWS * COLS, device="cuda"), torch.randn(ROWS * COLS, device="cuda")
    c = torch.empty_like(a)
    cases = {
        "kernels.rmsnorm_bf16(out, x, w, eps, rows, cols)": (kernels[rmsnorm], args),
        "torch.ops.hk.rmsnorm_bf16(...) (registered op)": (getattr(ops, rmsnorm), args),
        "  breakdown: the checks alone (launch_shape)": (kernels[rmsnorm].launch_shape, args),
        "  breakdown: the call with stream= given": (kernels[rmsnorm], args),
        "torch.add(a, b, out=c)": (torch.add, (a, b)),
        "torch.library.custom_op wrapping torch.add": (add, (a, b, c)),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(ROUNDS + 1):
        for name, (function, args) in cases.items():
            kwargs = {"out": c} if function is torch.add else {}
            if "stream=" in name:
                kwargs = {"stream": torch.cuda.current_stream().cuda_stream}
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(CALLS):
                function(*args, **kwargs)
            took = time.perf_counter() - start
            if round_:  # the first round warms up
                times[name].append(took / CALLS * 1e6)
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, hkload {hkload.__version__}")
    print(f"CPU time per call, median of {ROUNDS} rounds of {CALLS} calls ({ROWS} x {COLS} bf16 / {ROWS * COLS} f32):")
    print(f"{'call':<52} {'µs/call':>8} {'min':>8}")
    for name, samples in times.items():
        print(f"{name:<52} {statistics.median(samples):>8.2f} {min(samples):>8.2f}")


if __name__ == "__main__":
    main()
