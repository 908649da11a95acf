//! The torch fast path: a tensor's facts read through its own attributes (no DLPack capsule
//! per call), and torch's current stream. hkload never imports torch: it looks for it in
//! `sys.modules`, where any program that holds a tensor has put it.

use hkload::abi::ScalarType;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

use crate::errors::Refusal;
use crate::memory::{Memory, MemoryKind};

/// What hkload uses of an imported torch.
pub(crate) struct Torch {
    tensor: Py<PyType>,
    /// Each torch dtype hkload has a scalar type for, by the dtype object's address (dtypes
    /// are singletons).
    dtypes: Vec<(usize, ScalarType)>,
    /// `torch._C._cuda_getCurrentRawStream`, in builds of torch with CUDA or ROCm.
    current_stream: Option<Py<PyAny>>,
}

/// torch's dtype names for hkload's scalar types (`uint16` and wider came with torch 2.3, the
/// FP8 types with 2.1).
const DTYPES: [(&str, ScalarType); 16] = [
    ("bfloat16", ScalarType::Bf16),
    ("float16", ScalarType::F16),
    ("float32", ScalarType::F32),
    ("float64", ScalarType::F64),
    ("int8", ScalarType::I8),
    ("uint8", ScalarType::U8),
    ("int16", ScalarType::I16),
    ("uint16", ScalarType::U16),
    ("int32", ScalarType::I32),
    ("uint32", ScalarType::U32),
    ("int64", ScalarType::I64),
    ("uint64", ScalarType::U64),
    ("float8_e4m3fn", ScalarType::Fp8E4m3fn),
    ("float8_e4m3fnuz", ScalarType::Fp8E4m3fnuz),
    ("float8_e5m2", ScalarType::Fp8E5m2),
    ("float8_e5m2fnuz", ScalarType::Fp8E5m2fnuz),
];

impl Torch {
    /// torch, once the program has imported it.
    pub(crate) fn get(py: Python<'_>) -> Option<&Self> {
        static TORCH: PyOnceLock<Torch> = PyOnceLock::new();
        if let Some(torch) = TORCH.get(py) {
            return Some(torch);
        }
        let module = sys_modules(py).get_item("torch").ok().flatten()?;
        let torch = Self::from_module(&module).ok()?;
        Some(TORCH.get_or_init(py, || torch))
    }

    fn from_module(torch: &Bound<'_, PyAny>) -> PyResult<Self> {
        let dtypes = DTYPES
            .iter()
            .filter_map(|(name, elem)| {
                let dtype = torch.getattr(*name).ok()?;
                Some((dtype.as_ptr() as usize, *elem))
            })
            .collect();
        Ok(Self {
            tensor: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
            dtypes,
            current_stream: torch
                .getattr("_C")?
                .getattr("_cuda_getCurrentRawStream")
                .ok()
                .map(Bound::unbind),
        })
    }

    pub(crate) fn is_tensor(&self, object: &Bound<'_, PyAny>) -> bool {
        object
            .is_instance(self.tensor.bind(object.py()))
            .unwrap_or(false)
    }

    /// hkload's scalar type for a `torch.dtype`.
    pub(crate) fn scalar_type(&self, dtype: &Bound<'_, PyAny>) -> Option<ScalarType> {
        let address = dtype.as_ptr() as usize;
        self.dtypes
            .iter()
            .find(|(a, _)| *a == address)
            .map(|(_, elem)| *elem)
    }

    /// The facts of `tensor` that a launch checks, if it is contiguous memory of `kind`.
    pub(crate) fn memory(
        &self,
        tensor: &Bound<'_, PyAny>,
        kind: MemoryKind,
    ) -> PyResult<Result<Memory, Refusal>> {
        let py = tensor.py();
        let dtype = tensor.getattr(intern!(py, "dtype"))?;
        let Some(elem) = self.scalar_type(&dtype) else {
            return Ok(Err(Refusal::Type(format!("a tensor of {dtype}"))));
        };
        if !tensor
            .call_method0(intern!(py, "is_contiguous"))?
            .is_truthy()?
        {
            return Ok(Err(Refusal::Value(format!(
                "must be contiguous, but the tensor of shape {} has strides {}",
                tensor.getattr(intern!(py, "shape"))?.str()?,
                tensor.call_method0(intern!(py, "stride"))?.str()?
            ))));
        }
        // A GPU tensor's `get_device()` is its index (CUDA and ROCm builds alike), anything
        // else's -1: one call tells both where the tensor is and whether that is a GPU.
        let device = match kind {
            MemoryKind::Host if tensor.getattr(intern!(py, "is_cpu"))?.is_truthy()? => Some(0),
            MemoryKind::Host => None,
            MemoryKind::Cuda | MemoryKind::Rocm => {
                let index: i64 = tensor.call_method0(intern!(py, "get_device"))?.extract()?;
                usize::try_from(index).ok()
            }
        };
        let Some(device) = device else {
            return Ok(Err(Refusal::Value(format!(
                "is a tensor on {}, but the kernel runs on {}",
                tensor.getattr(intern!(py, "device"))?,
                kind.describe()
            ))));
        };
        // `nbytes` is a property, cheaper than the method `numel()`.
        let bytes: usize = tensor.getattr(intern!(py, "nbytes"))?.extract()?;
        Ok(Ok(Memory {
            ptr: tensor.call_method0(intern!(py, "data_ptr"))?.extract()?,
            device,
            elem,
            len: bytes / elem.size() as usize,
        }))
    }

    /// torch's current stream on GPU `device`, if this torch has GPUs.
    pub(crate) fn current_stream(&self, py: Python<'_>, device: usize) -> PyResult<Option<u64>> {
        self.current_stream
            .as_ref()
            .map(|f| f.bind(py).call1((device,))?.extract())
            .transpose()
    }
}

fn sys_modules(py: Python<'_>) -> &Bound<'_, PyDict> {
    static MODULES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    MODULES
        .get_or_init(py, || {
            py.import("sys")
                .and_then(|sys| sys.getattr("modules"))
                .and_then(|m| Ok(m.cast_into::<PyDict>()?))
                .expect("sys.modules is a dict")
                .unbind()
        })
        .bind(py)
}
