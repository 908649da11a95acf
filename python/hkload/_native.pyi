"""Type stubs of the extension module; the package re-exports everything here."""

from os import PathLike
from typing import Any, Optional, Sequence, Union

__version__: str

class Param:
    """One declared parameter: ``out: *mut bf16``, ``eps: f32``."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str:
        """The element type of a pointer, or the type of a value (``"bf16"``, ``"u32"``)."""
    @property
    def is_pointer(self) -> bool: ...
    @property
    def mutable(self) -> bool:
        """Whether the kernel may write the memory (``*mut``)."""

class Signature:
    """A kernel's declared signature; ``str()`` gives ``rmsnorm_bf16(out: *mut bf16, …)``."""

    @property
    def name(self) -> str: ...
    @property
    def params(self) -> list[Param]: ...
    @property
    def extents(self) -> list[tuple[str, str]]:
        """``(pointer name, elements the kernel may touch)`` pairs of its launch contract."""
    @property
    def requires(self) -> list[tuple[str, str]]:
        """``(condition, message)`` pairs: the contract's preconditions."""

class Device:
    """One GPU of the machine's driver, or a simulated one (``hkload.testing``)."""

    @property
    def target(self) -> str: ...
    @property
    def ordinal(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def api(self) -> str:
        """``"cuda"``, ``"hip"`` or ``"recording"`` (simulated)."""
    def synchronize(self) -> None: ...
    def launches(self) -> list[dict[str, Any]]:
        """A simulated device's launches: ``kernel``, ``grid``, ``block``, ``shared_bytes``,
        ``stream``, ``args`` (the packed argument bytes)."""

class Pointer:
    """``length`` elements of ``dtype`` at address ``ptr`` on device ``device``, vouched for
    by the caller (hkload cannot check raw memory)."""

    def __init__(
        self, ptr: int, dtype: Any, length: int, device: int = 0, mutable: bool = True
    ) -> None: ...
    @property
    def ptr(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def length(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def mutable(self) -> bool: ...

class Kernel:
    """One kernel on one device. ``kernel(*args, stream=None)`` checks every argument against
    the signature and launch contract, then launches on torch's current stream (or
    ``stream``: a ``torch.cuda.Stream`` or a raw handle)."""

    def __call__(self, *args: Any, stream: Any = None) -> None: ...
    def launch_shape(self, *args: Any) -> dict[str, Any]:
        """``grid``, ``block``, ``shared_bytes`` of a call with ``args``, launching nothing."""
    @property
    def name(self) -> str: ...
    @property
    def signature(self) -> Signature: ...

class Kernels:
    """A bundle loaded on a device; every kernel is an attribute, e.g.
    ``kernels.rmsnorm_bf16(out, x, weight, eps, rows, cols)``. For typed attributes, generate
    a stub of the bundle: ``python -m hkload.stubs BUNDLE > hk_kernels.pyi``."""

    def __getattr__(self, name: str) -> Kernel: ...
    def __getitem__(self, name: str) -> Kernel: ...
    def call(self, name: str, *args: Any, stream: Any = None) -> None: ...
    @property
    def device(self) -> Device: ...
    def preload(self) -> None: ...

class Bundle:
    """``Bundle(path)``: a bundle folder written by ``hkpack build``, opened and checked."""

    def __init__(
        self,
        path: Union[str, PathLike[str]],
        trusted_keys: Sequence[str] = (),
        expect_digest: Optional[str] = None,
    ) -> None:
        """With ``trusted_keys`` the bundle must be signed by one of them (``hkpack sign``);
        with ``expect_digest`` its index must have that SHA-256 (hex)."""
    @staticmethod
    def open_search_path(
        name: str,
        path: Optional[Sequence[Union[str, PathLike[str]]]] = None,
        trusted_keys: Sequence[str] = (),
        expect_digest: Optional[str] = None,
    ) -> Bundle:
        """The bundle ``name`` (``"hk-kernels-0.1.0"``) composed from its packages on ``path``
        (by default ``HKLOAD_PATH``): the full bundle or its index package, and each target's
        package, as ``hkpack split`` writes them."""
    @property
    def index_digest(self) -> str:
        """The SHA-256 the index records of itself (hex): what names this build."""
    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def kernels(self) -> dict[str, Signature]: ...
    def explain(self, target: str) -> str:
        """What would run on a device of target ID ``target``: the text of ``hkpack explain``."""
    def load(self, device: Any = None) -> Kernels:
        """Binds the bundle to ``device`` (a GPU index, a ``torch.device`` or an
        ``hkload.Device``; GPU 0 by default)."""

def device(index: int = 0) -> Device: ...
def simulated_device(target: str, index: int = 0) -> Device: ...
