//! What hkload needs from a GPU API, as one object-safe trait, and the drivers that provide it.
//!
//! A driver is a thin layer: it turns each GPU-API call into a `Result` and nothing more.
//! Choosing a code object, checking arguments and packing them all happen in hkload *before* a
//! driver is called, so every backend gets the same checks and a recording driver can stand in
//! for a GPU in tests.
//!
//! Each driver is a vendor (a private trait with one method for each API call) under one
//! shared flow (the handle tables, making the device current, the rules for empty allocations
//! and copies, what a failure was doing), so the drivers differ only in their calls.
//!
//! Handles are plain numbers owned by the driver that issued them; the safe types in the crate
//! root ([`crate::Bundle`], [`crate::Kernel`], [`crate::DeviceBuffer`]) own them and release
//! them on drop.

#[cfg(feature = "cuda")]
pub mod cuda;
mod flow;
#[cfg(feature = "hip")]
pub mod hip;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod packed_args;
mod recording;
mod tables;
mod vendor;

#[cfg(feature = "cuda")]
pub use cuda::CudaDriver;
#[cfg(feature = "hip")]
pub use hip::HipDriver;
pub use recording::{Recorded, RecordingDriver};

pub use crate::contract::LaunchDims;
pub use crate::image::ImageKind;
use crate::target::TargetId;

/// One GPU as a driver sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The driver's own index of the device.
    pub ordinal: usize,
    /// The marketing name, for messages (`NVIDIA H100 80GB HBM3`, `AMD Instinct MI300X`).
    pub name: String,
    /// The full target ID the device reports (`gfx942:sramecc+:xnack-`, `sm_90`).
    pub target: TargetId,
    /// Compute units (AMD) or streaming multiprocessors (NVIDIA): launch contracts may size
    /// grids by it.
    pub compute_units: u32,
    /// The most shared memory (LDS) one block may use, static and dynamic together. On
    /// NVIDIA this is the opt-in maximum (227 KiB on sm_90), which the CUDA driver unlocks per
    /// kernel when a launch asks for more than the default 48 KiB.
    pub shared_memory_per_block: u32,
    /// The most threads one block may have on the device, as its driver reports it (CUDA's
    /// `MAX_THREADS_PER_BLOCK` attribute, HIP's `maxThreadsPerBlock` property): a launch is
    /// checked against it as well as against the code object's own maximum.
    pub max_threads_per_block: u32,
}

/// A module loaded on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModuleHandle(pub u64);

/// A kernel entry point inside a loaded module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FunctionHandle(pub u64);

/// A device memory address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevicePtr(pub u64);

/// A stream (queue) of device work. [`StreamHandle::DEFAULT`] is the device's default stream;
/// another comes from the framework that made it, through [`StreamHandle::from_raw`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamHandle(u64);

impl StreamHandle {
    pub const DEFAULT: StreamHandle = StreamHandle(0);

    /// A stream made outside hkload (`torch.cuda.current_stream().cuda_stream`, say).
    ///
    /// # Safety
    ///
    /// `raw` must be a live `CUstream` (or `hipStream_t`) of the context of the device the
    /// kernel runs on, or 0 for the default stream: the driver cannot tell a stale or foreign
    /// handle from a good one.
    pub const unsafe fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The driver's own handle.
    pub const fn as_raw(self) -> u64 {
        self.0
    }
}

/// An error reported by a GPU API, or the absence of one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The vendor library could not be found or opened.
    #[error("{api} is not available: {detail}")]
    Unavailable { api: &'static str, detail: String },
    /// The library loaded but found no device.
    #[error("{api} found no GPU: {detail}")]
    NoDevice { api: &'static str, detail: String },
    /// A call failed; `call` names it and `detail` is the API's own error name and text.
    #[error("{call} failed: {detail}")]
    Call { call: &'static str, detail: String },
}

/// The operations hkload needs from a GPU API.
///
/// Implementations must be thread-safe: loads and launches may come from any thread.
pub trait Driver: Send + Sync {
    /// A short name for messages: `cuda`, `hip`, `recording`.
    fn api(&self) -> &'static str;

    /// The devices this API can use, with their target IDs.
    fn devices(&self) -> Result<Vec<DeviceInfo>, DriverError>;

    /// Loads a code image on a device. The driver keeps whatever it needs from `image` (HIP
    /// uses a bare code object in place, so its driver keeps a copy until unload).
    fn load_module(
        &self,
        device: usize,
        kind: ImageKind,
        image: &[u8],
    ) -> Result<ModuleHandle, DriverError>;

    /// Releases a module and every function taken from it.
    fn unload_module(&self, module: ModuleHandle) -> Result<(), DriverError>;

    /// Looks up a kernel by its symbol name.
    fn function(&self, module: ModuleHandle, name: &str) -> Result<FunctionHandle, DriverError>;

    /// Launches a kernel with a packed argument buffer laid out as the kernel's ABI says
    /// (explicit arguments only; AMD hidden arguments are the runtime's business).
    fn launch(
        &self,
        function: FunctionHandle,
        dims: &LaunchDims,
        stream: StreamHandle,
        args: &[u8],
    ) -> Result<(), DriverError>;

    /// Allocates `bytes` of device memory.
    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr, DriverError>;

    /// Frees memory from [`Driver::alloc`].
    fn free(&self, device: usize, ptr: DevicePtr) -> Result<(), DriverError>;

    /// Copies host bytes to device memory, synchronously.
    fn copy_to_device(&self, device: usize, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError>;

    /// Copies device memory to host bytes, synchronously.
    fn copy_to_host(
        &self,
        device: usize,
        dst: &mut [u8],
        src: DevicePtr,
    ) -> Result<(), DriverError>;

    /// Waits until all work queued on the device has finished.
    fn synchronize(&self, device: usize) -> Result<(), DriverError>;
}
