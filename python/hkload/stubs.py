"""A typed stub of one bundle's kernels, so that an IDE shows every call's signature:

    python -m hkload.stubs dist/hk-kernels-0.1.0 > hk_kernels.pyi

writes a ``Kernels`` class with one method per kernel. Use it as the declared type of a
loaded bundle::

    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        from hk_kernels import Kernels
    kernels: "Kernels" = bundle.load(0)  # type: ignore[assignment]
"""

from __future__ import annotations

import sys

from . import FLOAT_DTYPES, Bundle, Signature

# What each parameter kind accepts, as Python types.
MEMORY = "Memory"
INTEGER = "int"
FLOAT = "float"


def method(signature: Signature) -> str:
    params = []
    for param in signature.params:
        if param.is_pointer:
            kind = MEMORY
        elif param.dtype in FLOAT_DTYPES:
            kind = FLOAT
        else:
            kind = INTEGER
        params.append(f"{param.name}: {kind}")
    extents = ", ".join(f"{name}: {value}" for name, value in signature.extents)
    doc = f"{signature}" + (f"\n\n        Elements touched: {extents}." if extents else "")
    return (
        f"    def {signature.name}(self, {', '.join(params)}, *, stream: Any = None) -> None:\n"
        f'        """{doc}"""\n'
    )


def stub(bundle: Bundle) -> str:
    """The stub text of `bundle`'s kernels."""
    methods = "\n".join(method(signature) for signature in bundle.kernels.values())
    return (
        f'"""The kernels of {bundle.name} {bundle.version}, written by `python -m hkload.stubs`."""\n\n'
        "from typing import Any, Union\n\n"
        "import hkload\n\n"
        "# A torch tensor, any object with __dlpack__, or an hkload.Pointer.\n"
        f"{MEMORY} = Union[Any, hkload.Pointer]\n\n"
        "class Kernels(hkload.Kernels):\n"
        f"{methods}"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m hkload.stubs BUNDLE > kernels.pyi", file=sys.stderr)
        return 2
    sys.stdout.write(stub(Bundle(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
