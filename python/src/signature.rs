//! `hkload.Signature` and `hkload.Param`: a kernel's declared signature, as `Bundle.kernels`
//! lists it and `Kernel.signature` gives it.

use hkload::abi::{Param, ParamType};
use hkload::manifest::KernelRecord;
use pyo3::prelude::*;

/// A kernel's declared signature, with its launch contract's extents and preconditions.
#[pyclass(name = "Signature", module = "hkload", frozen)]
pub(crate) struct PySignature {
    /// The kernel's symbol.
    #[pyo3(get)]
    name: String,
    /// The parameters, in order.
    #[pyo3(get)]
    params: Vec<Py<PyParam>>,
    /// How many elements the kernel may touch through each pointer parameter: ``(name,
    /// expression)`` pairs of its contract (``("x", "rows * cols")``); empty for a kernel
    /// without a contract.
    #[pyo3(get)]
    extents: Vec<(String, String)>,
    /// The contract's preconditions: ``(condition, message)`` pairs.
    #[pyo3(get)]
    requires: Vec<(String, String)>,
    text: String,
}

impl PySignature {
    pub(crate) fn of(py: Python<'_>, record: &KernelRecord) -> PyResult<Self> {
        Ok(Self {
            name: record.symbol.clone(),
            params: record
                .args
                .iter()
                .map(|p| Py::new(py, PyParam::of(p)))
                .collect::<PyResult<_>>()?,
            extents: record
                .contract
                .iter()
                .flat_map(|c| &c.extents)
                .map(|e| (e.name.clone(), e.value.to_string()))
                .collect(),
            requires: record
                .contract
                .iter()
                .flat_map(|c| &c.requires)
                .map(|r| (r.check.to_string(), r.message.clone()))
                .collect(),
            text: format!("{}({})", record.symbol, join(&record.args)),
        })
    }
}

fn join(params: &[Param]) -> String {
    params
        .iter()
        .map(Param::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl PySignature {
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The parameter list: `out: *mut bf16, …`.
    pub(crate) fn params_text(&self) -> &str {
        &self.text[self.name.len() + 1..self.text.len() - 1]
    }
}

#[pymethods]
impl PySignature {
    fn __str__(&self) -> &str {
        &self.text
    }

    fn __repr__(&self) -> String {
        format!("<hkload.Signature {}>", self.text)
    }
}

/// One declared parameter: ``out: *mut bf16``, ``eps: f32``.
#[pyclass(name = "Param", module = "hkload", frozen)]
pub(crate) struct PyParam {
    /// The parameter's name (``"out"``).
    #[pyo3(get)]
    name: String,
    /// The element type of a pointer, or the type of a value (``"bf16"``, ``"u32"``).
    #[pyo3(get)]
    dtype: &'static str,
    /// Whether the parameter is memory (a tensor) rather than a value.
    #[pyo3(get)]
    is_pointer: bool,
    /// Whether the kernel may write the memory (``*mut``).
    #[pyo3(get)]
    mutable: bool,
    text: String,
}

impl PyParam {
    fn of(param: &Param) -> Self {
        let (dtype, is_pointer, mutable) = match param.ty {
            ParamType::Pointer { pointee, mutable } => (pointee, true, mutable),
            ParamType::Scalar(t) => (t, false, false),
        };
        Self {
            name: param.name.clone(),
            dtype: dtype.name(),
            is_pointer,
            mutable,
            text: param.to_string(),
        }
    }
}

#[pymethods]
impl PyParam {
    fn __str__(&self) -> &str {
        &self.text
    }

    fn __repr__(&self) -> String {
        format!("<hkload.Param {}>", self.text)
    }
}
