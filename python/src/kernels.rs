//! `hkload.Kernels` (a bundle loaded on a device) and `hkload.Kernel` (one kernel, callable).

use hkload::abi::Param;
use hkload::driver::StreamHandle;
use hkload::{Bundle, Kernel, LaunchError, LoadedBundle};
use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::args::{self, ArgPlace};
use crate::device::PyDevice;
use crate::errors::to_py;
use crate::memory::MemoryKind;
use crate::signature::PySignature;
use crate::torch::Torch;

/// A bundle loaded on one device: every kernel is an attribute
/// (``kernels.rmsnorm_bf16(out, x, weight, 1e-6, rows, cols)``), also by name
/// (``kernels["rmsnorm_bf16"]``, ``kernels.call("rmsnorm_bf16", …)``).
///
/// A kernel is looked up (and its module loaded) on first use, then kept in the object's
/// ``__dict__``, so later attribute reads cost what any Python attribute does.
#[pyclass(name = "Kernels", module = "hkload", frozen, dict)]
pub(crate) struct PyKernels {
    bundle: Bundle,
    loaded: LoadedBundle,
    device: PyDevice,
}

impl PyKernels {
    pub(crate) fn new(bundle: Bundle, loaded: LoadedBundle, device: PyDevice) -> Self {
        Self {
            bundle,
            loaded,
            device,
        }
    }

    fn kernel(slf: &Bound<'_, Self>, name: &str) -> PyResult<Py<PyKernel>> {
        let py = slf.py();
        let this = slf.get();
        let kernel = this.loaded.kernel(name).map_err(to_py)?;
        let record = this.bundle.kernel_record(name).map_err(to_py)?;
        let kernel = Py::new(
            py,
            PyKernel {
                params: record.args.clone(),
                signature: Py::new(py, PySignature::of(py, record)?)?,
                memory: MemoryKind::of_api(this.loaded.device().driver().api()),
                ordinal: this.loaded.device().ordinal(),
                kernel,
            },
        )?;
        // Cached where Python's attribute lookup finds it before calling __getattr__ again.
        let dict = slf.getattr(intern!(py, "__dict__"))?;
        dict.set_item(name, &kernel)?;
        Ok(kernel)
    }
}

#[pymethods]
impl PyKernels {
    fn __getattr__(slf: &Bound<'_, Self>, name: &str) -> PyResult<Py<PyKernel>> {
        Self::kernel(slf, name)
    }

    fn __getitem__(slf: &Bound<'_, Self>, name: &str) -> PyResult<Py<PyKernel>> {
        match slf.getattr(intern!(slf.py(), "__dict__"))?.get_item(name) {
            Ok(kernel) => Ok(kernel.extract()?),
            Err(_) => Self::kernel(slf, name),
        }
    }

    /// ``call(name, *args, stream=None)``: calls kernel ``name``, as ``kernels.name(*args)``.
    #[pyo3(signature = (name, *args, stream = None))]
    fn call(
        slf: &Bound<'_, Self>,
        name: &str,
        args: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let kernel = Self::__getitem__(slf, name)?;
        kernel.get().call(args, stream)
    }

    /// Every kernel name of the bundle, for ``dir()`` and completion.
    fn __dir__(&self) -> Vec<String> {
        self.bundle
            .table()
            .kernel_symbols()
            .map(str::to_owned)
            .collect()
    }

    /// The device the bundle is loaded on.
    #[getter]
    fn device(&self) -> PyDevice {
        self.device.clone()
    }

    /// Loads every module now rather than on first use.
    fn preload(&self) -> PyResult<()> {
        self.loaded.preload().map_err(to_py)
    }

    fn __repr__(&self) -> String {
        format!(
            "hkload.Kernels({:?} on {} {} {})",
            self.bundle,
            self.loaded.device().driver().api(),
            self.loaded.device().ordinal(),
            self.loaded.device().target()
        )
    }
}

/// One kernel loaded on a device. Call it with its arguments in the declared order:
/// tensors (torch, any ``__dlpack__`` array, ``hkload.Pointer``) for pointers, Python numbers
/// for values. Every argument is checked against the signature and the kernel's launch
/// contract (dtype, device, contiguity, length, preconditions) before anything reaches the
/// GPU; the launch goes on torch's current stream for the device, or on ``stream`` (a
/// ``torch.cuda.Stream`` or a raw ``CUstream``/``hipStream_t`` as an int).
#[pyclass(name = "Kernel", module = "hkload", frozen)]
pub(crate) struct PyKernel {
    kernel: Kernel,
    params: Vec<Param>,
    signature: Py<PySignature>,
    memory: MemoryKind,
    ordinal: usize,
}

#[pymethods]
impl PyKernel {
    #[pyo3(signature = (*args, stream = None))]
    fn __call__(
        &self,
        args: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.call(args, stream)
    }

    /// The launch shape a call with ``args`` would use, after the same checks, launching
    /// nothing: a dict with ``grid``, ``block`` and ``shared_bytes``.
    #[pyo3(signature = (*args))]
    fn launch_shape<'py>(&self, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyDict>> {
        let py = args.py();
        let mut keep = Vec::new();
        let converted = self.convert(args, &mut keep)?;
        let dims = self.kernel.launch_shape(&converted).map_err(to_py)?;
        let shape = PyDict::new(py);
        shape.set_item("grid", dims.grid)?;
        shape.set_item("block", dims.block)?;
        shape.set_item("shared_bytes", dims.shared_bytes)?;
        Ok(shape)
    }

    /// The kernel's symbol.
    #[getter]
    fn name(&self) -> &str {
        self.kernel.name()
    }

    /// The kernel's declared signature.
    #[getter]
    fn signature(&self, py: Python<'_>) -> Py<PySignature> {
        self.signature.clone_ref(py)
    }

    fn __repr__(&self) -> String {
        format!("<hkload.Kernel {}>", self.signature.get().text())
    }
}

impl PyKernel {
    fn call(&self, args: &Bound<'_, PyTuple>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let mut keep = Vec::new();
        let converted = self.convert(args, &mut keep)?;
        let stream = self.stream(args.py(), stream)?;
        self.kernel.call(stream, &converted).map_err(to_py)
    }

    fn convert<'py>(
        &self,
        args: &Bound<'py, PyTuple>,
        keep: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<hkload::Arg<'static>>> {
        if args.len() != self.params.len() {
            return Err(to_py(hkload::Error::Launch(LaunchError::ArgCount {
                kernel: self.kernel.name().to_owned(),
                expected: self.params.len(),
                found: args.len(),
                signature: self.signature.get().params_text().to_owned(),
            })));
        }
        let mut converted = Vec::with_capacity(args.len());
        for (index, (param, object)) in self.params.iter().zip(args.iter()).enumerate() {
            let place = ArgPlace {
                kernel: self.kernel.name(),
                index,
                param,
            };
            converted.push(args::convert(&place, &object, self.memory, keep)?);
        }
        Ok(converted)
    }

    /// The stream to launch on: the one given, else torch's current stream for the device
    /// (when torch is imported), else the device's default stream.
    fn stream(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<StreamHandle> {
        let raw = match stream {
            Some(stream) => match stream.extract::<u64>() {
                Ok(raw) => raw,
                Err(_) => stream
                    .getattr(intern!(py, "cuda_stream"))
                    .and_then(|s| s.extract::<u64>())
                    .map_err(|_| {
                        PyTypeError::new_err(format!(
                            "stream= takes a torch.cuda.Stream or a raw stream handle (an int), not {}",
                            stream.repr().map_or_else(|_| "that".into(), |r| r.to_string())
                        ))
                    })?,
            },
            None if self.memory == MemoryKind::Host => 0,
            None => match Torch::get(py) {
                Some(torch) => torch.current_stream(py, self.ordinal)?.unwrap_or(0),
                None => 0,
            },
        };
        // SAFETY: torch's current stream belongs to the device's primary context, which the
        // CUDA and HIP drivers use; a stream given by the caller is theirs to vouch for, as
        // the docs of `stream=` say.
        Ok(unsafe { StreamHandle::from_raw(raw) })
    }
}
