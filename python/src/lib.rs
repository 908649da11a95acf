//! The Python extension module `hkload._native`: the [`hkload`] crate's bundles, devices and
//! kernels as Python objects. The Python package `hkload` re-exports them, adds the exception
//! classes (`hkload/errors.py`) and the torch integration (`hkload/torch.py`).
//!
//! A kernel call converts its Python arguments (torch tensors through a fast path, any object
//! with `__dlpack__`, `hkload.Pointer`s and Python numbers) into [`hkload::Arg`]s, and leaves
//! every check of the signature and the launch contract to [`hkload::Kernel::call`].

mod args;
mod bundle;
mod device;
mod dlpack;
mod errors;
mod kernels;
mod memory;
mod pointer;
mod signature;
mod torch;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<bundle::PyBundle>()?;
    m.add_class::<signature::PySignature>()?;
    m.add_class::<signature::PyParam>()?;
    m.add_class::<device::PyDevice>()?;
    m.add_class::<kernels::PyKernels>()?;
    m.add_class::<kernels::PyKernel>()?;
    m.add_class::<pointer::PyPointer>()?;
    m.add_function(wrap_pyfunction!(device::device, m)?)?;
    m.add_function(wrap_pyfunction!(device::simulated_device, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
