"""hkload for Python: open a kernel bundle built by ``hkpack``, bind it to a GPU, and call its
kernels by name on torch tensors (or any DLPack array), every argument checked against the
kernel's signature and launch contract before anything reaches the GPU.

>>> import hkload, torch
>>> kernels = hkload.Bundle("dist/hk-kernels-0.1.0").load(torch.device("cuda", 0))
>>> x = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
>>> weight = torch.ones(4096, dtype=torch.bfloat16, device="cuda")
>>> out = torch.empty_like(x)
>>> kernels.rmsnorm_bf16(out, x, weight, 1e-6, 4, 4096)

Kernels are attributes of the loaded bundle, named by their symbols; their signatures are in
``Bundle.kernels`` (``python -m hkload.stubs BUNDLE`` writes them as a typed stub). One wheel
carries both GPU backends, loaded at run time: CUDA (``libcuda.so.1``) and HIP
(``libamdhip64.so``); it imports on machines with neither. ``hkload.torch.register`` makes
every kernel a ``torch.library`` custom op, and ``hkload.testing.simulated_device`` a GPU
that records launches, for tests without one.
"""

from ._native import (
    Bundle,
    Device,
    Kernel,
    Kernels,
    Param,
    Pointer,
    Signature,
    __version__,
    device,
)
from .errors import (
    BundleError,
    DriverError,
    Error,
    LaunchError,
    LaunchTypeError,
    LaunchValueError,
    NoCodeObjectError,
    UnknownKernelError,
)

# The element types whose values are floats (a Python float or int as a scalar argument).
FLOAT_DTYPES = ("bf16", "f16", "f32", "f64", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_e5m2", "fp8_e5m2fnuz")

__all__ = [
    "FLOAT_DTYPES",
    "Bundle",
    "BundleError",
    "Device",
    "DriverError",
    "Error",
    "Kernel",
    "Kernels",
    "LaunchError",
    "LaunchTypeError",
    "LaunchValueError",
    "NoCodeObjectError",
    "Param",
    "Pointer",
    "Signature",
    "UnknownKernelError",
    "__version__",
    "device",
]
