//! What the driver flow ([`super::flow`]) needs from one GPU API: the [`Vendor`] trait, a
//! method for each call (or for the few calls the API needs together), each turning the API's
//! status into a `Result`. What the backends share around those calls (the handle tables,
//! making the device current before each call, the zero-byte and empty-copy rules, what a
//! failure says it was doing) is the flow's, written once.

use std::ffi::CStr;

use super::tables::Tables;
use super::{
    DevicePtr, DriverError, FunctionHandle, ImageKind, LaunchDims, ModuleHandle, StreamHandle,
};

pub(crate) type Result<T> = std::result::Result<T, DriverError>;

/// A function found in a module, and what the vendor keeps with it.
pub(crate) type Found<F> = (FunctionHandle, F);

/// A code image to load, as the flow hands it to [`Vendor::module_load`].
pub(crate) struct Image<'a> {
    pub device: usize,
    pub kind: ImageKind,
    pub bytes: &'a [u8],
    /// What loading it is, for messages: `loading a 4096-byte cubin on CUDA device 0 (…)`.
    /// Only the GPU vendors read it: the recording driver's loads cannot fail.
    #[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
    pub what: &'a dyn Fn() -> String,
}

/// A launch, as the flow hands it to [`Vendor::launch_kernel`].
pub(crate) struct Launch<'a> {
    /// Only the GPU vendors read it: the recording driver logs the kernel's name instead.
    #[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
    pub function: FunctionHandle,
    /// The device of the function's module, current on this thread.
    pub device: usize,
    pub dims: &'a LaunchDims,
    pub stream: StreamHandle,
    /// The kernel's packed argument buffer.
    pub args: &'a [u8],
}

/// One GPU API's calls, for the driver flow. The flow makes a device current (through
/// [`Vendor::make_current`]) before each call on it, and calls with handles only from its
/// tables; a vendor only calls its API and reports the outcome.
pub(crate) trait Vendor: Send + Sync + Sized {
    /// The API's short name, [`Driver::api`](super::Driver::api): `cuda`.
    const API: &'static str;
    /// How messages name a device: `CUDA` gives `CUDA device 0 (NVIDIA H100 80GB HBM3, sm_90)`.
    const DEVICE: &'static str;
    /// The GPUs it runs code on, for refusing another vendor's image: `an NVIDIA GPU`.
    const GPUS: &'static str;
    /// The forms of code image it loads.
    const IMAGES: &'static [ImageKind];

    /// What it keeps with a module until the module is unloaded.
    type Module: Send;
    /// What it keeps with a function.
    type Function: Send + Sync;

    /// Where the flow keeps this driver's devices, modules and functions.
    fn tables(&self) -> &Tables<Self::Module, Self::Function>;

    /// Makes `device` current on the calling thread unless it already is, refusing a device
    /// the API does not have.
    fn make_current(&self, device: usize) -> Result<()>;

    /// Loads `image`, of a form in [`Vendor::IMAGES`], on its device. A failure says
    /// `image.what`.
    ///
    /// # Safety
    ///
    /// The caller keeps the returned `Self::Module` until [`Vendor::module_unload`] has returned
    /// for the module (HIP reads the image it holds in place).
    unsafe fn module_load(&self, image: Image<'_>) -> Result<(ModuleHandle, Self::Module)>;

    /// Unloads `module`, dropping `kept` only after.
    ///
    /// # Safety
    ///
    /// `module` was loaded by this vendor and is live, and no function of it is used again.
    unsafe fn module_unload(&self, module: ModuleHandle, kept: Self::Module) -> Result<()>;

    /// Looks up the kernel `name` in `module`.
    ///
    /// # Safety
    ///
    /// `module` was loaded by this vendor and stays live during the call.
    unsafe fn module_get_function(
        &self,
        module: ModuleHandle,
        name: &CStr,
    ) -> Result<Found<Self::Function>>;

    /// Prepares `function` for a launch of `launch.dims`, where the API needs it (CUDA: letting
    /// the kernel use more than 48 KiB of dynamic shared memory). Its failure is its own, not
    /// the launch's.
    ///
    /// # Safety
    ///
    /// As for [`Vendor::launch_kernel`].
    unsafe fn prepare_launch(&self, launch: &Launch<'_>, function: &Self::Function) -> Result<()> {
        let _ = (launch, function);
        Ok(())
    }

    /// Launches `launch.function`, whose state is `function`.
    ///
    /// # Safety
    ///
    /// The function was found by this vendor in a module that stays live during the call; the
    /// stream is null or one of the device's (as `Kernel::launch`'s contract requires); the
    /// arguments are laid out as the kernel's parameters are.
    unsafe fn launch_kernel(&self, launch: &Launch<'_>, function: &Self::Function) -> Result<()>;

    /// Allocates `bytes` (more than zero) of device memory.
    fn mem_alloc(&self, bytes: usize) -> Result<DevicePtr>;

    /// Frees memory from [`Vendor::mem_alloc`] (never null).
    fn mem_free(&self, ptr: DevicePtr) -> Result<()>;

    /// Copies host bytes (at least one) to device memory, synchronously.
    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;

    /// Copies device memory to host bytes (at least one), synchronously.
    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()>;

    /// Waits until all work queued on the device has finished.
    fn device_synchronize(&self) -> Result<()>;

    /// `CUDA device 0 (NVIDIA H100 80GB HBM3, sm_90)`, or just `CUDA device 9` for a device the
    /// API does not have.
    fn describe_device(&self, device: usize) -> String {
        match self.tables().devices().get(device) {
            Some(info) => format!(
                "{} device {device} ({}, {})",
                Self::DEVICE,
                info.name,
                info.target
            ),
            None => format!("{} device {device}", Self::DEVICE),
        }
    }
}

/// Adds what the failed call was doing to its error, as `… while <what>`.
pub(crate) fn doing(what: impl FnOnce() -> String) -> impl FnOnce(DriverError) -> DriverError {
    move |error| match error {
        DriverError::Call { call, detail } => DriverError::Call {
            call,
            detail: format!("{detail} while {}", what()),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_calls_say_what_they_were_doing() {
        let error = DriverError::Call {
            call: "cuMemAlloc",
            detail: "CUDA_ERROR_OUT_OF_MEMORY (out of memory)".into(),
        };
        let error = doing(|| "allocating 8 bytes on CUDA device 0".into())(error);
        assert_eq!(
            error.to_string(),
            "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory) while allocating 8 \
             bytes on CUDA device 0"
        );
        let unavailable = DriverError::Unavailable {
            api: "cuda",
            detail: "no library".into(),
        };
        assert_eq!(doing(String::new)(unavailable.clone()), unavailable);
    }
}
