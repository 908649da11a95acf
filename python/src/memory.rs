//! Memory as a launch sees it, and where a device's memory lives: what the readers of torch
//! tensors (`torch.rs`) and DLPack arrays (`dlpack.rs`) find, and what a kernel's device
//! accepts.

use hkload::abi::ScalarType;

/// Where a device's memory lives, in the words of Python's array libraries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemoryKind {
    /// NVIDIA GPU memory (torch `cuda`, DLPack `kDLCUDA`).
    Cuda,
    /// AMD GPU memory (torch `cuda` in ROCm builds, DLPack `kDLROCM`).
    Rocm,
    /// Host memory: a simulated device's, whose driver never dereferences a pointer.
    Host,
}

impl MemoryKind {
    /// The memory of devices of the driver named `api`.
    pub(crate) fn of_api(api: &str) -> Self {
        match api {
            "hip" => Self::Rocm,
            "recording" => Self::Host,
            _ => Self::Cuda,
        }
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::Cuda => "a CUDA device",
            Self::Rocm => "a ROCm device",
            Self::Host => "a simulated device, whose memory is host memory",
        }
    }
}

/// Contiguous memory, as a launch sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memory {
    pub(crate) ptr: u64,
    pub(crate) device: usize,
    pub(crate) elem: ScalarType,
    pub(crate) len: usize,
}
