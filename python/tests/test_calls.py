"""Calling kernels on a simulated GPU (hkload's recording driver): numpy arrays stand for
device memory, every check runs as on a GPU, and the device records what was launched.
Every refusal names the kernel, the argument, what was expected and what was given, and
launches nothing."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import hkload
import hkload.testing
from conftest import SIZES, extent, readme_example, scalar

NUMPY = {
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
    "i32": np.int32,
    "u32": np.uint32,
    "i64": np.int64,
}


@pytest.fixture
def device() -> hkload.Device:
    return hkload.testing.simulated_device("sm_90")


@pytest.fixture
def kernels(bundle, device) -> hkload.Kernels:
    return bundle.load(device)


# Element types numpy lacks, by the numpy type of their storage.
STORAGE = {
    "bf16": np.uint16,
    "fp8_e4m3fn": np.uint8,
    "fp8_e4m3fnuz": np.uint8,
    "fp8_e5m2": np.uint8,
    "fp8_e5m2fnuz": np.uint8,
}


def buffer(param: hkload.Param, length: int):
    """Host memory for a pointer parameter: a numpy array, or (bf16 and FP8, which numpy lacks)
    an hkload.Pointer over storage of their width, returned with the array that owns the
    memory."""
    if param.dtype in STORAGE:
        storage = np.zeros(length, dtype=STORAGE[param.dtype])
        pointer = hkload.Pointer(storage.ctypes.data, param.dtype, length, mutable=param.mutable)
        return pointer, storage
    array = np.zeros(length, dtype=NUMPY[param.dtype])
    return array, array


def arguments(signature: hkload.Signature, sizes=SIZES, short: str | None = None):
    """Arguments that satisfy the kernel's contract (the buffer named `short` one element
    short), and the arrays that own the memory."""
    args, owners = [], []
    for param in signature.params:
        if param.is_pointer:
            length = extent(signature, param.name, sizes) - (param.name == short)
            arg, owner = buffer(param, length)
            args.append(arg)
            owners.append(owner)
        else:
            args.append(scalar(param, sizes))
    return args, owners


def address(arg) -> int:
    return arg.ptr if isinstance(arg, hkload.Pointer) else arg.ctypes.data


def test_every_kernel_launches_with_its_arguments_packed(bundle, kernels, device):
    for name, signature in bundle.kernels.items():
        args, _owners = arguments(signature)
        getattr(kernels, name)(*args)
        launch = device.launches()[-1]
        assert launch["kernel"] == name
        for arg, param in zip(args, signature.params):
            if param.is_pointer:
                assert struct.pack("<Q", address(arg)) in launch["args"], (name, param.name)
    assert len(device.launches()) == len(bundle.kernels)


def test_every_buffer_one_element_short_is_refused(bundle, kernels, device):
    for name, signature in bundle.kernels.items():
        for index, param in enumerate(signature.params):
            if not param.is_pointer:
                continue
            args, _owners = arguments(signature, short=param.name)
            needed = extent(signature, param.name, SIZES)
            with pytest.raises(hkload.LaunchValueError) as refused:
                kernels.call(name, *args)
            assert str(refused.value).startswith(
                f"kernel `{name}` argument {index} (`{param}`) holds {needed - 1} elements, "
                f"but the kernel may touch {needed} ("
            )
    assert device.launches() == []


def relu_args(n=8):
    x = np.linspace(-1, 1, n, dtype=np.float32)
    return np.empty_like(x), x, n


def test_a_good_call_records_pointers_scalars_shape_and_stream(kernels, device):
    out, x, n = relu_args()
    kernels.relu_f32(out, x, n, stream=0x1234)
    launch = device.launches()[0]
    assert launch["args"] == struct.pack("<QQQ", out.ctypes.data, x.ctypes.data, n)
    assert launch["stream"] == 0x1234
    assert kernels.relu_f32.launch_shape(out, x, n) == {
        "grid": launch["grid"],
        "block": launch["block"],
        "shared_bytes": launch["shared_bytes"],
    }


def test_floats_convert_to_the_declared_type(kernels, device, bundle):
    signature = bundle.kernels["rmsnorm_f32"]
    args, _owners = arguments(signature)
    args[3] = 1e-6
    kernels.rmsnorm_f32(*args)
    assert struct.pack("<f", 1e-6) in device.launches()[0]["args"]
    args[3] = 1  # an int is a fine f32
    kernels.rmsnorm_f32(*args)
    assert struct.pack("<f", 1.0) in device.launches()[1]["args"]
    args[3] = 1e39
    with pytest.raises(hkload.LaunchValueError, match=r"argument 3 \(`eps: f32`\) is 1e\+39, beyond the range of f32"):
        kernels.rmsnorm_f32(*args)


def test_wrong_dtype(kernels, device):
    out, x, n = relu_args()
    with pytest.raises(hkload.LaunchTypeError) as refused:
        kernels.relu_f32(out, x.astype(np.float64), n)
    assert str(refused.value) == (
        "kernel `relu_f32` argument 1 (`x: *const f32`) expects a buffer of f32 "
        "(`*const f32`), got a writable pointer to f64"
    )
    assert isinstance(refused.value, TypeError)
    assert device.launches() == []


def test_wrong_length(kernels, device):
    out, x, _ = relu_args()
    with pytest.raises(hkload.LaunchValueError) as refused:
        kernels.relu_f32(out, x, 9)
    assert str(refused.value) == (
        "kernel `relu_f32` argument 0 (`out: *mut f32`) holds 8 elements, but the kernel may "
        "touch 9 (`n with n = 9`)"
    )
    assert isinstance(refused.value, ValueError)
    assert device.launches() == []


def test_wrong_device(bundle):
    second = hkload.testing.simulated_device("sm_90", 1)
    out, x, n = relu_args()
    with pytest.raises(hkload.LaunchValueError) as refused:
        bundle.load(second).relu_f32(out, x, n)
    assert str(refused.value) == (
        "kernel `relu_f32` argument 0 (`out: *mut f32`) is a buffer on device 0, but the "
        "kernel runs on device 1"
    )
    assert second.launches() == []


def test_wrong_device_of_a_pointer(kernels, device):
    out, x, n = relu_args()
    pointer = hkload.Pointer(x.ctypes.data, "f32", n, device=3, mutable=False)
    with pytest.raises(hkload.LaunchValueError, match=r"argument 1 \(`x: \*const f32`\) is a buffer on device 3, but the kernel runs on device 0"):
        kernels.relu_f32(out, pointer, n)
    assert device.launches() == []


def test_non_contiguous(kernels, device):
    out, x, _ = relu_args(16)
    with pytest.raises(hkload.LaunchValueError) as refused:
        kernels.relu_f32(out[:8], x[::2], 8)
    assert str(refused.value) == (
        "kernel `relu_f32` argument 1 (`x: *const f32`) must be contiguous, but the array of "
        "shape [8] has strides [2] (in elements)"
    )
    matrix = np.zeros((4, 6), dtype=np.float32)
    with pytest.raises(hkload.LaunchValueError, match=r"shape \[6, 4\] has strides \[1, 6\]"):
        kernels.relu_f32(out, matrix.T, 8)
    kernels.relu_f32(out[:8], matrix[1:3].reshape(-1)[:8], 8)  # a contiguous slice is fine
    assert len(device.launches()) == 1


def test_missing_argument(kernels, device):
    out, x, _ = relu_args()
    with pytest.raises(hkload.LaunchTypeError) as refused:
        kernels.relu_f32(out, x)
    assert str(refused.value) == (
        "kernel `relu_f32` takes 3 arguments (out: *mut f32, x: *const f32, n: u64), got 2"
    )
    assert device.launches() == []


def test_an_fp8_buffer_of_the_other_family_is_refused_naming_both(kernels, device):
    n = 8
    out = np.empty(n, dtype=np.float32)
    storage = np.zeros(n, dtype=np.uint8)
    for kernel, given in (("cast_fp8_e4m3fn_to_f32", "fp8_e4m3fnuz"), ("cast_fp8_e4m3fnuz_to_f32", "fp8_e4m3fn")):
        fnuz = hkload.Pointer(storage.ctypes.data, given, n, mutable=False)
        with pytest.raises(hkload.LaunchTypeError) as refused:
            getattr(kernels, kernel)(out, fnuz, n)
        text = str(refused.value)
        wanted = kernel.removeprefix("cast_").removesuffix("_to_f32")
        for part in (f"torch.float8_{given[4:]}", f"torch.float8_{wanted[4:]}", f"{given} (", f"is not {wanted} ("):
            assert part in text, (part, text)
    assert device.launches() == []


def test_unknown_kernel(kernels):
    with pytest.raises(hkload.UnknownKernelError) as refused:
        kernels.rmsnorm_bf17
    assert str(refused.value).startswith("the bundle has no kernel `rmsnorm_bf17`; it has 109 kernels, e.g. silu_bf16")
    assert isinstance(refused.value, AttributeError)
    assert not hasattr(kernels, "rmsnorm_bf17")
    with pytest.raises(LookupError, match="no kernel `nope`"):
        kernels.call("nope")


def test_scalars_of_the_wrong_kind_or_range(kernels, device):
    out, x, _ = relu_args()
    with pytest.raises(hkload.LaunchTypeError, match=r"argument 2 \(`n: u64`\) expects a u64 value \(an int\), got float 8.0"):
        kernels.relu_f32(out, x, 8.0)
    with pytest.raises(hkload.LaunchTypeError, match="got bool True"):
        kernels.relu_f32(out, x, True)
    with pytest.raises(hkload.LaunchValueError, match=r"argument 2 \(`n: u64`\) is -1, outside the u64 range 0 to 18446744073709551615"):
        kernels.relu_f32(out, x, -1)
    with pytest.raises(hkload.LaunchValueError, match=r"is 4294967296, outside the u32 range 0 to 4294967295"):
        kernels.softmax_f32(out, x, 2**32, 1)
    with pytest.raises(hkload.LaunchTypeError, match=r"argument 1 \(`x: \*const f32`\) expects a contiguous tensor of f32 .* got list \[1.0\]"):
        kernels.relu_f32(out, [1.0], 1)
    kernels.relu_f32(out, x, np.uint64(8))  # numpy integers are integers
    assert len(device.launches()) == 1


def test_a_broken_requirement_quotes_the_contract(kernels, device, bundle):
    sizes = dict(SIZES, k=200, n=300)
    args, _owners = arguments(bundle.kernels["topk_f32"], sizes)
    with pytest.raises(hkload.LaunchValueError) as refused:
        kernels.topk_f32(*args)
    assert str(refused.value) == (
        "kernel `topk_f32`: this kernel finds at most 128 values a row (`k <= 128` is false "
        "with k = 200)"
    )
    assert device.launches() == []


def test_a_read_only_pointer_cannot_be_written(kernels, device):
    out, x, n = relu_args()
    pointer = hkload.Pointer(out.ctypes.data, "f32", n, mutable=False)
    with pytest.raises(hkload.LaunchTypeError, match=r"argument 0 \(`out: \*mut f32`\) expects a writable buffer of f32"):
        kernels.relu_f32(pointer, x, n)
    assert device.launches() == []


def test_pointer_facts():
    pointer = hkload.Pointer(0x7F00, "bf16", 12, device=1, mutable=False)
    assert (pointer.ptr, pointer.dtype, pointer.length, pointer.device, pointer.mutable) == (
        0x7F00, "bf16", 12, 1, False
    )
    assert repr(pointer) == "hkload.Pointer(0x7f00, \"bf16\", 12, device=1, mutable=False)"
    with pytest.raises(hkload.LaunchTypeError, match="unknown type `float32`"):
        hkload.Pointer(0, "float32", 1)


def test_kernels_are_attributes_items_and_listed(kernels, bundle):
    assert kernels.relu_f32 is kernels["relu_f32"]
    assert sorted(dir(kernels)) == sorted(bundle.kernels)
    assert str(kernels.relu_f32.signature) == "relu_f32(out: *mut f32, x: *const f32, n: u64)"
    assert kernels.device.target == "sm_90"


def test_stream_objects_are_read_for_their_handle(kernels, device):
    class Stream:
        cuda_stream = 77

    kernels.relu_f32(*relu_args(), stream=Stream())
    assert device.launches()[0]["stream"] == 77
    with pytest.raises(TypeError, match="stream= takes a torch.cuda.Stream"):
        kernels.relu_f32(*relu_args(), stream="default")


def test_the_readme_example_runs(capsys):
    exec(readme_example("simulated_device"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "[1, 1, 1]",
        "kernel `relu_f32` argument 0 (`out: *mut f32`) holds 8 elements, but the kernel may "
        "touch 9 (`n with n = 9`)",
    ]
