//! A kernel call's Python arguments as hkload's [`Arg`]s: numbers converted to the declared
//! scalar type (range checked), memory (torch tensors, DLPack arrays, `hkload.Pointer`s)
//! described by address, device, element type and length. Matching them against the
//! signature and the launch contract is hkload's own work, in [`hkload::Kernel::call`].

use hkload::abi::{Param, ParamType, ScalarType, ScalarValue};
use hkload::driver::DevicePtr;
use hkload::{Arg, RawPointer};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyInt};

use crate::dlpack;
use crate::errors::{Exception, Refusal};
use crate::memory::MemoryKind;
use crate::pointer::PyPointer;
use crate::torch::Torch;

/// One argument's place in a call, for messages.
pub(crate) struct ArgPlace<'a> {
    pub(crate) kernel: &'a str,
    pub(crate) index: usize,
    pub(crate) param: &'a Param,
}

impl ArgPlace<'_> {
    fn refuse(&self, refusal: Refusal) -> PyErr {
        let head = format!(
            "kernel `{}` argument {} (`{}`)",
            self.kernel, self.index, self.param
        );
        match refusal {
            Refusal::Type(found) => Exception::LaunchType.with(format!(
                "{head} expects {}, got {found}",
                expectation(self.param.ty)
            )),
            Refusal::Value(problem) => Exception::LaunchValue.with(format!("{head} {problem}")),
        }
    }
}

/// What a parameter takes, in a caller's words.
fn expectation(ty: ParamType) -> String {
    match ty {
        ParamType::Pointer { pointee, mutable } => format!(
            "a contiguous {}tensor of {pointee} (`{ty}`): a torch tensor, an object with \
             __dlpack__, or an hkload.Pointer",
            if mutable { "writable " } else { "" }
        ),
        ParamType::Scalar(t) if t.is_integer() => format!("a {t} value (an int)"),
        ParamType::Scalar(t) => format!("a {t} value (a float)"),
    }
}

/// Converts `object` for parameter `place.param`. DLPack capsules read go to `keep`: they must
/// outlive the launch.
pub(crate) fn convert<'py>(
    place: &ArgPlace<'_>,
    object: &Bound<'py, PyAny>,
    kind: MemoryKind,
    keep: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<Arg<'static>> {
    let converted = match place.param.ty {
        ParamType::Scalar(ty) => scalar(ty, object)?.map(Arg::Scalar),
        ParamType::Pointer { .. } => memory(object, kind, keep)?.map(Arg::Raw),
    };
    converted.map_err(|refusal| place.refuse(refusal))
}

fn memory<'py>(
    object: &Bound<'py, PyAny>,
    kind: MemoryKind,
    keep: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<Result<RawPointer, Refusal>> {
    let py = object.py();
    if let Ok(pointer) = object.cast::<PyPointer>() {
        return Ok(Ok(pointer.get().raw()));
    }
    let memory = match Torch::get(py).filter(|torch| torch.is_tensor(object)) {
        Some(torch) => torch.memory(object, kind)?,
        None if object.hasattr(pyo3::intern!(py, "__dlpack__"))? => {
            let (memory, capsule) = dlpack::memory(object, kind)?;
            keep.push(capsule);
            memory
        }
        None => return Ok(Err(Refusal::Type(describe(object)?))),
    };
    // SAFETY: the tensor or array is the caller's and lives through the call; it stays
    // allocated while the kernel runs as any framework's memory does for kernels queued on its
    // stream (torch's caching allocator reuses a freed block only in stream order).
    Ok(memory.map(|m| unsafe { RawPointer::new(DevicePtr(m.ptr), m.device, m.elem, m.len, true) }))
}

/// `object` converted to the scalar type `ty`: ints to integer types within their range, ints
/// and floats to floating-point types within theirs.
fn scalar(ty: ScalarType, object: &Bound<'_, PyAny>) -> PyResult<Result<ScalarValue, Refusal>> {
    if ty.is_integer() {
        if object.is_instance_of::<PyFloat>() || !is_integer(object)? {
            return Ok(Err(Refusal::Type(describe(object)?)));
        }
        return Ok(integer(ty, object));
    }
    // Anything Python reads as a float (ints, numpy's floats), but arrays and tensors, which
    // are memory even when they hold one element.
    let value = if object.is_instance_of::<PyFloat>() {
        object.extract::<f64>()?
    } else {
        match object.extract::<f64>() {
            Ok(v) if !object.hasattr(pyo3::intern!(object.py(), "__dlpack__"))? => v,
            _ => return Ok(Err(Refusal::Type(describe(object)?))),
        }
    };
    let converted = match ty {
        ScalarType::F64 => ScalarValue::F64(value),
        ScalarType::F32 => ScalarValue::F32(value as f32),
        ScalarType::F16 => ScalarValue::F16(half::f16::from_f64(value).to_bits()),
        ScalarType::Bf16 => ScalarValue::Bf16(half::bf16::from_f64(value).to_bits()),
        // Through f32, as the kernels convert (rounding twice differs from rounding once only
        // for f64 values within 2^-29 relative of a tie).
        _ => match ty.fp8() {
            Some(format) => ScalarValue::Fp8(format, format.encode(value as f32)),
            None => unreachable!("integer types took the branch above"),
        },
    };
    let overflows = match converted {
        // The conversion saturates; a caller's value past the largest is refused all the same.
        ScalarValue::Fp8(format, _) => value.abs() > f64::from(format.max()),
        ScalarValue::F32(v) => v.is_infinite(),
        ScalarValue::F16(bits) => half::f16::from_bits(bits).is_infinite(),
        ScalarValue::Bf16(bits) => half::bf16::from_bits(bits).is_infinite(),
        _ => false,
    };
    Ok(if overflows && value.is_finite() {
        Err(Refusal::Value(format!(
            "is {}, beyond the range of {ty}",
            object.repr()?
        )))
    } else {
        Ok(converted)
    })
}

/// Whether `object` is a Python int or stands for one (`__index__`: numpy's integers), but not
/// a bool, which is an int to Python and a mistake here.
fn is_integer(object: &Bound<'_, PyAny>) -> PyResult<bool> {
    if object.is_instance_of::<PyInt>() {
        return Ok(!object.is_instance_of::<pyo3::types::PyBool>());
    }
    object.hasattr(pyo3::intern!(object.py(), "__index__"))
}

fn integer(ty: ScalarType, object: &Bound<'_, PyAny>) -> Result<ScalarValue, Refusal> {
    let value: i128 = match object.extract::<i64>() {
        Ok(v) => v.into(),
        Err(e) if e.is_instance_of::<PyOverflowError>(object.py()) => match object.extract::<u64>()
        {
            Ok(v) => v.into(),
            Err(_) => return Err(out_of_range(ty, object)),
        },
        Err(_) => return Err(out_of_range(ty, object)),
    };
    let out = || out_of_range(ty, object);
    Ok(match ty {
        ScalarType::I8 => ScalarValue::I8(value.try_into().map_err(|_| out())?),
        ScalarType::U8 => ScalarValue::U8(value.try_into().map_err(|_| out())?),
        ScalarType::I16 => ScalarValue::I16(value.try_into().map_err(|_| out())?),
        ScalarType::U16 => ScalarValue::U16(value.try_into().map_err(|_| out())?),
        ScalarType::I32 => ScalarValue::I32(value.try_into().map_err(|_| out())?),
        ScalarType::U32 => ScalarValue::U32(value.try_into().map_err(|_| out())?),
        ScalarType::I64 => ScalarValue::I64(value.try_into().map_err(|_| out())?),
        ScalarType::U64 => ScalarValue::U64(value.try_into().map_err(|_| out())?),
        _ => unreachable!("called for integer types only"),
    })
}

fn out_of_range(ty: ScalarType, object: &Bound<'_, PyAny>) -> Refusal {
    let (low, high): (i128, i128) = match ty {
        ScalarType::I8 => (i8::MIN.into(), i8::MAX.into()),
        ScalarType::U8 => (0, u8::MAX.into()),
        ScalarType::I16 => (i16::MIN.into(), i16::MAX.into()),
        ScalarType::U16 => (0, u16::MAX.into()),
        ScalarType::I32 => (i32::MIN.into(), i32::MAX.into()),
        ScalarType::U32 => (0, u32::MAX.into()),
        ScalarType::I64 => (i64::MIN.into(), i64::MAX.into()),
        _ => (0, u64::MAX.into()),
    };
    let shown = object
        .str()
        .map_or_else(|_| "a number".to_owned(), |s| s.to_string());
    Refusal::Value(format!(
        "is {shown}, outside the {ty} range {low} to {high}"
    ))
}

/// An argument's type, and its value if it is short, for messages.
fn describe(object: &Bound<'_, PyAny>) -> PyResult<String> {
    let ty = object.get_type().name()?;
    let repr = object.repr()?.to_string();
    Ok(if repr.len() <= 40 {
        format!("{ty} {repr}")
    } else {
        ty.to_string()
    })
}
