//! `hkload.Device`: one GPU of the CUDA or HIP driver, whichever the machine has, or a
//! simulated one for tests; and what `Bundle.load` accepts as a device.

use std::sync::{Arc, OnceLock};

use hkload::Device;
use hkload::driver::{Driver, Recorded, RecordingDriver};
use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::errors::to_py;

/// One device, of the machine's GPU driver or simulated (``hkload.testing``).
#[pyclass(name = "Device", module = "hkload", frozen)]
#[derive(Clone)]
pub(crate) struct PyDevice {
    pub(crate) device: Device,
    /// The simulated device's driver, whose record of launches tests read.
    recording: Option<Arc<RecordingDriver>>,
}

#[pymethods]
impl PyDevice {
    /// The device's full target ID (``"gfx942:sramecc+:xnack-"``, ``"sm_90"``).
    #[getter]
    fn target(&self) -> String {
        self.device.target().to_string()
    }

    /// The driver's index of the device.
    #[getter]
    fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    /// The device's name (``"NVIDIA H100 80GB HBM3"``).
    #[getter]
    fn name(&self) -> &str {
        &self.device.info().name
    }

    /// The driver: ``"cuda"``, ``"hip"`` or ``"recording"`` (simulated).
    #[getter]
    fn api(&self) -> &'static str {
        self.device.driver().api()
    }

    /// Waits until all work queued on the device has finished.
    fn synchronize(&self) -> PyResult<()> {
        self.device.synchronize().map_err(to_py)
    }

    /// The launches a simulated device was asked for, oldest first: dicts with ``kernel``,
    /// ``grid``, ``block``, ``shared_bytes``, ``stream`` and ``args`` (the packed argument
    /// bytes). Real devices keep no record.
    fn launches<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let Some(driver) = &self.recording else {
            return Err(PyTypeError::new_err(
                "only a simulated device (hkload.testing.simulated_device) records its launches",
            ));
        };
        let mut launches = Vec::new();
        for entry in driver.log() {
            if let Recorded::Launch {
                kernel,
                dims,
                stream,
                args,
                ..
            } = entry
            {
                let launch = PyDict::new(py);
                launch.set_item("kernel", kernel)?;
                launch.set_item("grid", dims.grid)?;
                launch.set_item("block", dims.block)?;
                launch.set_item("shared_bytes", dims.shared_bytes)?;
                launch.set_item("stream", stream.as_raw())?;
                launch.set_item("args", PyBytes::new(py, &args))?;
                launches.push(launch);
            }
        }
        Ok(launches)
    }

    fn __repr__(&self) -> String {
        format!(
            "hkload.Device({} {} {}: {})",
            self.device.driver().api(),
            self.device.ordinal(),
            self.device.target(),
            self.device.info().name
        )
    }
}

/// ``device(index=0)``: GPU ``index`` of the machine's driver (CUDA, else HIP).
#[pyfunction]
#[pyo3(signature = (index = 0))]
pub(crate) fn device(index: usize) -> PyResult<PyDevice> {
    Ok(PyDevice {
        device: Device::new(machine_driver()?, index).map_err(to_py)?,
        recording: None,
    })
}

/// ``simulated_device(target, index=0)``: a stand-in GPU of target ID ``target`` that records
/// launches and runs nothing; its memory is host memory, so numpy arrays (any DLPack array on
/// the CPU) pass as its buffers. Devices ``0`` to ``index`` of one driver exist; the one
/// returned is ``index``, so an array (on device 0) is on another device than a
/// ``simulated_device(target, 1)``.
#[pyfunction]
#[pyo3(signature = (target, index = 0))]
pub(crate) fn simulated_device(target: &str, index: usize) -> PyResult<PyDevice> {
    let target: hkload::target::TargetId =
        target.parse().map_err(|e: hkload::target::TargetIdError| {
            pyo3::exceptions::PyValueError::new_err(e.to_string())
        })?;
    let driver = Arc::new(RecordingDriver::new(vec![target; index + 1]));
    Ok(PyDevice {
        device: Device::new(driver.clone(), index).map_err(to_py)?,
        recording: Some(driver),
    })
}

/// The machine's GPU driver, opened once per process and shared by every device.
fn machine_driver() -> PyResult<Arc<dyn Driver>> {
    static DRIVER: OnceLock<Arc<dyn Driver>> = OnceLock::new();
    if let Some(driver) = DRIVER.get() {
        return Ok(driver.clone());
    }
    let driver = hkload::auto::first_driver().map_err(to_py)?;
    Ok(DRIVER.get_or_init(|| driver).clone())
}

/// The device `Bundle.load` was given: an ``hkload.Device``, a GPU index, or a
/// ``torch.device`` of type ``cuda`` (its index, or torch's current device).
pub(crate) fn resolve(object: &Bound<'_, PyAny>) -> PyResult<PyDevice> {
    if let Ok(device) = object.cast::<PyDevice>() {
        return Ok(device.get().clone());
    }
    if let Ok(index) = object.extract::<usize>() {
        return device(index);
    }
    let py = object.py();
    if let (Ok(kind), Ok(index)) = (
        object.getattr(intern!(py, "type")),
        object.getattr(intern!(py, "index")),
    ) && kind.extract::<String>().is_ok_and(|k| k == "cuda")
    {
        let index = if index.is_none() {
            py.import("torch")?
                .getattr("cuda")?
                .call_method0("current_device")?
                .extract()?
        } else {
            index.extract()?
        };
        return device(index);
    }
    Err(PyTypeError::new_err(format!(
        "a device is an hkload.Device, a GPU index or a torch.device('cuda', index), not {}",
        object.repr()?
    )))
}
