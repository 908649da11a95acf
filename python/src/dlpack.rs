//! Arrays from any library that speaks DLPack (numpy, cupy, jax, torch too): the facts a
//! launch checks, read from the `DLManagedTensor` in the capsule that `__dlpack__()` returns.
//! The capsule is only read, never consumed: its producer frees it, and the memory stays the
//! array's.

use std::ffi::c_void;

use hkload::abi::ScalarType;
use pyo3::prelude::*;
use pyo3::{ffi, intern};

use crate::errors::Refusal;
use crate::memory::{Memory, MemoryKind};

/// DLPack's device types that hkload's devices use (`DLDeviceType`).
const CPU: i32 = 1;
const CUDA: i32 = 2;
const CUDA_MANAGED: i32 = 13;
const ROCM: i32 = 10;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// The facts of `array` (an object with `__dlpack__`) that a launch checks, and the capsule
/// that must stay alive until the launch has been queued.
pub(crate) fn memory<'py>(
    array: &Bound<'py, PyAny>,
    kind: MemoryKind,
) -> PyResult<(Result<Memory, Refusal>, Bound<'py, PyAny>)> {
    let capsule = array.call_method0(intern!(array.py(), "__dlpack__"))?;
    // SAFETY: a capsule named "dltensor" holds a legacy (unversioned) DLManagedTensor, what
    // `__dlpack__()` without arguments returns, whose first field is the DLTensor. The name
    // check is PyCapsule_GetPointer's own, which returns null for any other object.
    let managed = unsafe {
        ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dltensor".as_ptr()) as *const DLTensor
    };
    if managed.is_null() {
        return Err(PyErr::take(array.py()).unwrap_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err("__dlpack__ returned no DLPack capsule")
        }));
    }
    // SAFETY: the producer keeps the tensor, its shape and strides alive while the capsule
    // lives, and `capsule` lives past this read.
    let tensor = unsafe { &*managed };
    Ok((describe(tensor, kind), capsule))
}

fn describe(tensor: &DLTensor, kind: MemoryKind) -> Result<Memory, Refusal> {
    let Some(elem) = scalar_type(&tensor.dtype) else {
        let DLDataType { code, bits, lanes } = tensor.dtype;
        return Err(Refusal::Type(format!(
            "an array of DLPack type code {code} with {bits} bits and {lanes} lanes"
        )));
    };
    let on_kind = match kind {
        MemoryKind::Cuda => matches!(tensor.device.device_type, CUDA | CUDA_MANAGED),
        MemoryKind::Rocm => tensor.device.device_type == ROCM,
        MemoryKind::Host => tensor.device.device_type == CPU,
    };
    if !on_kind {
        return Err(Refusal::Value(format!(
            "is an array on DLPack device type {} ({}), but the kernel runs on {}",
            tensor.device.device_type,
            device_type_name(tensor.device.device_type),
            kind.describe()
        )));
    }
    let ndim = usize::try_from(tensor.ndim).unwrap_or(0);
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: DLPack's shape holds `ndim` entries.
        unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }
    };
    let strides: Option<&[i64]> = (!tensor.strides.is_null() && ndim > 0)
        // SAFETY: non-null strides hold `ndim` entries.
        .then(|| unsafe { std::slice::from_raw_parts(tensor.strides, ndim) });
    if let Some(strides) = strides.filter(|s| !is_row_major(shape, s)) {
        return Err(Refusal::Value(format!(
            "must be contiguous, but the array of shape {shape:?} has strides {strides:?} (in elements)"
        )));
    }
    let len = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?));
    let Some(len) = len else {
        return Err(Refusal::Value(format!(
            "has the impossible shape {shape:?}"
        )));
    };
    Ok(Memory {
        ptr: (tensor.data as u64).wrapping_add(tensor.byte_offset),
        device: usize::try_from(tensor.device.device_id).unwrap_or(usize::MAX),
        elem,
        len,
    })
}

/// Whether `strides` (in elements) lay `shape` out densely in row-major order; dimensions of
/// one element have no stride that matters, and an empty array is contiguous whatever they say.
fn is_row_major(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for (&extent, &stride) in shape.iter().zip(strides).rev() {
        if extent != 1 && stride != expected {
            return false;
        }
        expected = expected.saturating_mul(extent);
    }
    true
}

/// DLPack's type codes (`DLDataTypeCode`): int 0, uint 1, float 2, bfloat 4, and since DLPack
/// 1.1 the FP8 formats (e4m3fn 10, e4m3fnuz 11, e5m2 12, e5m2fnuz 13); one lane.
fn scalar_type(dtype: &DLDataType) -> Option<ScalarType> {
    Some(match (dtype.code, dtype.bits, dtype.lanes) {
        (4, 16, 1) => ScalarType::Bf16,
        (2, 16, 1) => ScalarType::F16,
        (2, 32, 1) => ScalarType::F32,
        (2, 64, 1) => ScalarType::F64,
        (0, 8, 1) => ScalarType::I8,
        (1, 8, 1) => ScalarType::U8,
        (0, 16, 1) => ScalarType::I16,
        (1, 16, 1) => ScalarType::U16,
        (0, 32, 1) => ScalarType::I32,
        (1, 32, 1) => ScalarType::U32,
        (0, 64, 1) => ScalarType::I64,
        (1, 64, 1) => ScalarType::U64,
        (10, 8, 1) => ScalarType::Fp8E4m3fn,
        (11, 8, 1) => ScalarType::Fp8E4m3fnuz,
        (12, 8, 1) => ScalarType::Fp8E5m2,
        (13, 8, 1) => ScalarType::Fp8E5m2fnuz,
        _ => return None,
    })
}

fn device_type_name(device_type: i32) -> &'static str {
    match device_type {
        CPU => "cpu",
        CUDA => "cuda",
        3 => "pinned host memory",
        ROCM => "rocm",
        CUDA_MANAGED => "cuda managed",
        _ => "another device",
    }
}

// The layout the protocol fixes, checked at build time.
const _: () = assert!(std::mem::size_of::<DLTensor>() == 48);
