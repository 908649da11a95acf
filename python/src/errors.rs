//! hkload's errors as the Python exceptions of `hkload/errors.py`, with the crate's own text,
//! and the refusal of a kernel argument that becomes one.

use hkload::{Error, LaunchError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The exception classes, by their names in `hkload.errors`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Exception {
    Bundle,
    NoCodeObject,
    UnknownKernel,
    Driver,
    Launch,
    LaunchType,
    LaunchValue,
}

impl Exception {
    const fn class_name(self) -> &'static str {
        match self {
            Self::Bundle => "BundleError",
            Self::NoCodeObject => "NoCodeObjectError",
            Self::UnknownKernel => "UnknownKernelError",
            Self::Driver => "DriverError",
            Self::Launch => "LaunchError",
            Self::LaunchType => "LaunchTypeError",
            Self::LaunchValue => "LaunchValueError",
        }
    }

    /// The exception carrying `message`.
    pub(crate) fn with(self, message: impl Into<String>) -> PyErr {
        let message = message.into();
        Python::attach(|py| match class(py, self) {
            Ok(class) => PyErr::from_type(class, message),
            Err(missing) => missing,
        })
    }
}

/// Why an argument cannot be passed: its kind (`TypeError`, raised as
/// [`Exception::LaunchType`]) or its value (`ValueError`, raised as
/// [`Exception::LaunchValue`]); the text completes "kernel `k` argument 1 (`x: *const bf16`) …".
#[derive(Debug)]
pub(crate) enum Refusal {
    /// What was given instead of what the parameter takes.
    Type(String),
    /// What is wrong with the value.
    Value(String),
}

fn class(py: Python<'_>, exception: Exception) -> PyResult<Bound<'_, PyType>> {
    static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let module = ERRORS.get_or_try_init(py, || py.import("hkload.errors").map(Bound::unbind))?;
    Ok(module
        .bind(py)
        .getattr(exception.class_name())?
        .cast_into::<PyType>()?)
}

/// The Python exception for an error of the hkload crate.
pub(crate) fn to_py(error: Error) -> PyErr {
    let exception = match &error {
        Error::Io { .. }
        | Error::Manifest { .. }
        | Error::Format { .. }
        | Error::Mismatch { .. }
        | Error::Signature { .. }
        | Error::Pinned { .. }
        | Error::NotOnSearchPath { .. }
        | Error::ForeignPackage { .. } => Exception::Bundle,
        Error::NoCodeObject { .. } | Error::NotBuilt { .. } => Exception::NoCodeObject,
        Error::UnknownKernel { .. } => Exception::UnknownKernel,
        Error::Driver(_) | Error::NoSuchDevice { .. } => Exception::Driver,
        Error::Launch(launch) => launch_exception(launch),
    };
    exception.with(error.to_string())
}

/// Arguments of the wrong kind are `TypeError`s, as Python's own; the rest `ValueError`s, but
/// for a kernel without a contract, which no argument can fix.
fn launch_exception(error: &LaunchError) -> Exception {
    match error {
        LaunchError::ArgCount { .. } | LaunchError::ArgType { .. } => Exception::LaunchType,
        LaunchError::ArgDevice { .. }
        | LaunchError::ArgDriver { .. }
        | LaunchError::Dims { .. }
        | LaunchError::Requirement { .. }
        | LaunchError::Extent { .. }
        | LaunchError::Contract { .. } => Exception::LaunchValue,
        LaunchError::NoContract { .. } => Exception::Launch,
    }
}
