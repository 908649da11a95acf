//! `hkload.Pointer`: memory known only by its address, for callers whose arrays speak neither
//! torch nor DLPack.

use hkload::abi::ScalarType;
use pyo3::prelude::*;

use crate::errors::Exception;
use crate::torch;

/// ``Pointer(ptr, dtype, length, device=0, mutable=True)``: ``length`` elements of ``dtype``
/// (``"bf16"``, ``"f32"``, … or a ``torch.dtype``) at address ``ptr`` on device ``device``.
///
/// hkload cannot check raw memory: the caller vouches that it holds ``length`` elements and
/// stays allocated until every kernel launched with it has finished. Everything else (dtype,
/// device, length against the kernel's contract, writability) is checked as for tensors.
#[pyclass(name = "Pointer", module = "hkload", frozen)]
pub(crate) struct PyPointer {
    #[pyo3(get)]
    ptr: u64,
    pub(crate) elem: ScalarType,
    #[pyo3(get)]
    length: usize,
    #[pyo3(get)]
    device: usize,
    #[pyo3(get)]
    mutable: bool,
}

#[pymethods]
impl PyPointer {
    #[new]
    #[pyo3(signature = (ptr, dtype, length, device = 0, mutable = true))]
    fn new(
        ptr: u64,
        dtype: &Bound<'_, PyAny>,
        length: usize,
        device: usize,
        mutable: bool,
    ) -> PyResult<Self> {
        Ok(Self {
            ptr,
            elem: scalar_type(dtype)?,
            length,
            device,
            mutable,
        })
    }

    /// The element type, in hkload's spelling (``"bf16"``).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.elem.name()
    }

    fn __repr__(&self) -> String {
        format!(
            "hkload.Pointer({:#x}, {:?}, {}, device={}, mutable={})",
            self.ptr,
            self.elem.name(),
            self.length,
            self.device,
            if self.mutable { "True" } else { "False" }
        )
    }
}

impl PyPointer {
    /// The pointer as hkload takes it.
    pub(crate) fn raw(&self) -> hkload::RawPointer {
        // SAFETY: the caller who made this Pointer vouched for the memory (see the class docs).
        unsafe {
            hkload::RawPointer::new(
                hkload::driver::DevicePtr(self.ptr),
                self.device,
                self.elem,
                self.length,
                self.mutable,
            )
        }
    }
}

/// An element type given as hkload's name (`"bf16"`) or as a `torch.dtype`.
fn scalar_type(dtype: &Bound<'_, PyAny>) -> PyResult<ScalarType> {
    if let Ok(name) = dtype.extract::<String>() {
        return name
            .parse()
            .map_err(|e: hkload::abi::SignatureError| Exception::LaunchType.with(e.to_string()));
    }
    if let Some(elem) = torch::Torch::get(dtype.py()).and_then(|t| t.scalar_type(dtype)) {
        return Ok(elem);
    }
    Err(Exception::LaunchType.with(format!(
        "a Pointer's dtype is one of {} or the torch.dtype of one, not {}",
        ScalarType::ALL.map(ScalarType::name).join(", "),
        dtype.repr()?
    )))
}
