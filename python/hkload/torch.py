"""Every kernel of a loaded bundle as a ``torch.library`` custom op, so that
``torch.compile(fullgraph=True)`` traces through calls without graph breaks.

>>> import hkload, hkload.torch, torch
>>> kernels = hkload.Bundle("dist/hk-kernels-0.1.0").load(torch.device("cuda", 0))
>>> ops = hkload.torch.register(kernels, namespace="hk")
>>> ops.rmsnorm_bf16(out, x, weight, 1e-6, rows, cols)    # torch.ops.hk.rmsnorm_bf16

Each op takes the kernel's arguments in order: ``Tensor`` for pointers (``Tensor(a!)`` for
``*mut`` ones, which the op mutates), ``float`` for floating-point values and ``SymInt`` for
integers; it returns nothing. Its fake (meta) implementation does nothing either, as the op
only writes into tensors it was given. The CUDA implementation is the kernel itself, with all
of hkload's checks; ROCm builds of torch dispatch to it under the same key.

Where the bundle has the attention kernels, ``register`` also defines
``torch.ops.<namespace>.attention``: flash attention as one op with an autograd formula (the
``attn_bwd_*`` kernels), see ``hkload.attention``; where it has the MoE kernels,
``torch.ops.<namespace>.moe``: a mixture-of-experts layer (routing, alignment, grouped GEMMs,
combine) as one op, see ``hkload.moe``.
"""

from __future__ import annotations

import string

import torch

from . import FLOAT_DTYPES, Kernels, NoCodeObjectError, Signature, attention, moe

# Libraries must outlive their ops: torch removes a library's registrations when it is freed.
_libraries: list[torch.library.Library] = []


def schema(signature: Signature) -> str:
    """The ``torch.library`` schema of a kernel:
    ``rmsnorm_bf16(Tensor(a!) out, Tensor x, Tensor weight, float eps, SymInt rows, SymInt cols) -> ()``.
    """
    aliases = iter(string.ascii_lowercase)
    params = []
    for param in signature.params:
        if param.is_pointer:
            kind = f"Tensor({next(aliases)}!)" if param.mutable else "Tensor"
        elif param.dtype in FLOAT_DTYPES:
            kind = "float"
        else:
            kind = "SymInt"
        params.append(f"{kind} {param.name}")
    return f"{signature.name}({', '.join(params)}) -> ()"


def _fake(*args: object) -> None:
    """The meta implementation: the op's only effect is writing its ``*mut`` tensors."""


def register(kernels: Kernels, namespace: str = "hk") -> torch._ops._OpNamespace:
    """Defines every kernel of ``kernels`` as the op ``torch.ops.<namespace>.<kernel>`` (and
    ``attention`` and ``moe``, where their kernels are there) and returns ``torch.ops.<namespace>``. A namespace holds one bundle's kernels once: register
    another device's or bundle's under another namespace. Kernels the bundle builds on purpose
    for other targets only (``kernels[name]`` raises NoCodeObjectError saying why) are left
    out."""
    library = torch.library.Library(namespace, "FRAGMENT")
    for name in dir(kernels):
        try:
            kernel = kernels[name]
        except NoCodeObjectError:
            continue
        library.define(schema(kernel.signature))
        library.impl(name, kernel, "CUDA")
        torch.library.register_fake(f"{namespace}::{name}", _fake, lib=library)
    attention.define(library, namespace, kernels)
    moe.define(library, namespace, kernels)
    _libraries.append(library)
    return getattr(torch.ops, namespace)
