//! `hkload.Bundle`: an opened bundle, its kernels' signatures, and the explanation of what
//! would run on a device.

use hkload::{Bundle, OpenOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::device;
use crate::errors::to_py;
use crate::kernels::PyKernels;
use crate::signature::PySignature;

/// ``Bundle(path, trusted_keys=(), expect_digest=None)``: the bundle folder ``hkpack build``
/// wrote (``dist/hk-kernels-0.1.0``), opened and checked. Reads only its index; touches no GPU.
/// With ``trusted_keys`` (``"ed25519:…"`` texts, as ``hkpack keygen`` writes them) the bundle
/// must carry a signature by one of them; with ``expect_digest`` (hex) its index must have
/// that SHA-256.
///
/// >>> bundle = hkload.Bundle("dist/hk-kernels-0.1.0")
/// >>> print(bundle.kernels["rmsnorm_bf16"])
/// rmsnorm_bf16(out: *mut bf16, x: *const bf16, weight: *const bf16, eps: f32, rows: u32, cols: u32)
#[pyclass(name = "Bundle", module = "hkload", frozen)]
pub(crate) struct PyBundle {
    bundle: Bundle,
}

#[pymethods]
impl PyBundle {
    #[new]
    #[pyo3(signature = (path, trusted_keys = Vec::new(), expect_digest = None))]
    fn new(
        path: std::path::PathBuf,
        trusted_keys: Vec<String>,
        expect_digest: Option<String>,
    ) -> PyResult<Self> {
        let options = open_options(&trusted_keys, expect_digest)?;
        Ok(Self {
            bundle: Bundle::open_with(path, options).map_err(to_py)?,
        })
    }

    /// ``Bundle.open_search_path(name, path=None, trusted_keys=(), expect_digest=None)``: the
    /// bundle ``name`` (``"hk-kernels-0.1.0"``) composed from the folders of ``path`` (a list
    /// of folders; by default the ``HKLOAD_PATH`` environment variable, separated as ``PATH``
    /// is): the first folder holding it whole or its index package, then each target's
    /// package (``hk-kernels-0.1.0-gfx942``) from the first folder holding it, as ``hkpack
    /// split`` wrote them. ``explain`` names the package each code object comes from and what
    /// to install when none fits; a package split from another build raises ``BundleError``
    /// naming both.
    ///
    /// >>> bundle = hkload.Bundle.open_search_path("hk-kernels-0.1.0", ["/opt/hk-kernels"])
    #[staticmethod]
    #[pyo3(signature = (name, path = None, trusted_keys = Vec::new(), expect_digest = None))]
    fn open_search_path(
        name: &str,
        path: Option<Vec<std::path::PathBuf>>,
        trusted_keys: Vec<String>,
        expect_digest: Option<String>,
    ) -> PyResult<Self> {
        let options = open_options(&trusted_keys, expect_digest)?;
        let dirs = path.unwrap_or_else(hkload::package_set::search_path_from_env);
        Ok(Self {
            bundle: Bundle::open_search_path(name, &dirs, options).map_err(to_py)?,
        })
    }

    /// The SHA-256 the index records of itself (hex): what names this build, and what its
    /// split packages record.
    #[getter]
    fn index_digest(&self) -> String {
        self.bundle.index_digest().to_string()
    }

    /// The package's name (``"hk-kernels"``).
    #[getter]
    fn name(&self) -> &str {
        self.bundle.table().package().0
    }

    /// The package's version (``"0.1.0"``).
    #[getter]
    fn version(&self) -> &str {
        self.bundle.table().package().1
    }

    /// Every kernel's signature by name, modules in manifest order.
    #[getter]
    fn kernels<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let kernels = PyDict::new(py);
        for record in self.bundle.kernel_records().map_err(to_py)? {
            kernels.set_item(&record.symbol, PySignature::of(py, record)?)?;
        }
        Ok(kernels)
    }

    /// Which code object of every module would run on a device of target ID ``target``
    /// (``"gfx942:sramecc+:xnack-"``, ``"sm_90"``) and why each other one would not: the text
    /// of ``hkpack explain``. Works on any machine.
    fn explain(&self, target: &str) -> PyResult<String> {
        let target = target
            .parse()
            .map_err(|e: hkload::target::TargetIdError| PyValueError::new_err(e.to_string()))?;
        Ok(self.bundle.explain(&target).to_string())
    }

    /// The bundle bound to ``device``: a GPU index, a ``torch.device("cuda", i)`` or an
    /// ``hkload.Device``. Chooses every module's code object now, and raises
    /// ``NoCodeObjectError`` with the explanation if some module has none for the device;
    /// modules are loaded on first use.
    #[pyo3(signature = (device = None))]
    fn load(&self, device: Option<&Bound<'_, PyAny>>) -> PyResult<PyKernels> {
        let device = match device {
            Some(device) => device::resolve(device)?,
            None => device::device(0)?,
        };
        let loaded = self.bundle.load(&device.device).map_err(to_py)?;
        Ok(PyKernels::new(self.bundle.clone(), loaded, device))
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.bundle)
    }
}

/// The options of a verified open with `trusted_keys` (`"ed25519:…"` texts) and
/// `expect_digest` (hex), which raise `ValueError` when malformed.
fn open_options(trusted_keys: &[String], expect_digest: Option<String>) -> PyResult<OpenOptions> {
    let trusted_keys = trusted_keys
        .iter()
        .map(|key| {
            key.parse()
                .map_err(|e| PyValueError::new_err(format!("{e}")))
        })
        .collect::<PyResult<_>>()?;
    let expect_digest = expect_digest
        .map(|digest| digest.parse().map_err(PyValueError::new_err))
        .transpose()?;
    Ok(OpenOptions {
        trusted_keys,
        expect_digest,
        ..OpenOptions::DEFAULT
    })
}
