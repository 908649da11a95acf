//! The CUDA backend: NVIDIA GPUs through the CUDA driver API.
//!
//! `libcuda` is found and bound when the program runs (cudarc's `dynamic-loading`), never at
//! link time, so a program built with this backend starts on any machine and reports
//! [`DriverError::Unavailable`] where NVIDIA's driver is missing. The backend calls cudarc's
//! raw [`sys`] layer: its safe layer would add reference counting and stream bookkeeping to
//! every launch, and hkload already ties the lifetimes together (a kernel holds its module, a
//! buffer its device).
//!
//! Each device is used through its primary context, the one the CUDA runtime uses too, so
//! memory and modules interoperate with any framework in the same process. The context is
//! retained on first use and made current on the calling thread before each call that needs
//! it: one read of the current context, and a switch only when it differs.
//!
//! Handles are the CUDA handles themselves: a [`ModuleHandle`] holds a `CUmodule`, a
//! [`FunctionHandle`] a `CUfunction`, a [`StreamHandle`] a `CUstream` (0 is the default
//! stream) and a [`DevicePtr`] a `CUdeviceptr`. Code that calls CUDA directly through [`sys`]
//! (interop, benchmarks) can use them after [`CudaDriver::make_current`].

use std::borrow::Cow;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The raw CUDA driver API (cudarc's bindings, CUDA 13.0 names), for code that must call CUDA
/// directly next to hkload. Every entry point hkload itself uses is checked to exist when a
/// [`CudaDriver`] is created; cudarc panics on the first call of one that does not.
pub use cudarc::driver::sys;

use super::packed_args::{ExtraMarkers, LaunchKernelFn, launch_packed};
use super::tables::Tables;
use super::vendor::{Found, Image, Launch, Vendor, doing};
use super::{
    DeviceInfo, DevicePtr, DriverError, FunctionHandle, ImageKind, ModuleHandle, StreamHandle,
};
use crate::target::{SmArch, TargetId};

const API: &str = "cuda";

/// The entry points this backend calls. cudarc binds each one on its first call and panics
/// if it is missing, so all of them are looked up before the first call instead: an old or
/// partial libcuda becomes an error, with no `catch_unwind` (which a `panic = "abort"` build
/// could not use anyway).
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncSetAttribute",
    "cuLaunchKernel",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// The event entry points of [`CudaDriver::time_on_device`], checked when it is first used so
/// that a driver older than CUDA 12.8 (which added `cuEventElapsedTime_v2`) can still launch.
/// Code that times with events through [`sys`] checks them with [`CudaDriver::require`].
pub const EVENT_SYMBOLS: &[&str] = &[
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
];

/// Markers of `cuLaunchKernel`'s `extra` array (`cuda.h`).
const EXTRA_MARKERS: ExtraMarkers = ExtraMarkers {
    buffer_pointer: sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize,
    buffer_size: sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize,
    end: sys::CU_LAUNCH_PARAM_END_AS_INT as usize,
};

/// Room for the JIT's error log when PTX fails to compile.
const JIT_LOG_BYTES: usize = 16 * 1024;

/// `cuLaunchKernel`, as the C function pointer `packed_args` launches through.
type CuLaunchKernel = LaunchKernelFn<sys::CUfunction, sys::CUstream, sys::CUresult>;

/// NVIDIA GPUs through the CUDA driver API. See the module docs.
pub struct CudaDriver {
    devices: Vec<CudaDevice>,
    /// The CUDA version the driver supports, `(13, 0)` for driver 580.
    version: (u32, u32),
    /// `cuLaunchKernel`, the one entry point bound here rather than called through [`sys`]: as
    /// a C function pointer it has the shape of HIP's, so that one launch path serves both
    /// APIs. It is the symbol `sys` would bind, from the library `sys` loaded.
    cu_launch_kernel: CuLaunchKernel,
    tables: Tables<(), DynamicShared>,
}

struct CudaDevice {
    handle: sys::CUdevice,
    /// The device's primary context, once retained.
    context: OnceLock<Context>,
}

/// A `CUcontext`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Context(sys::CUcontext);

// SAFETY: a CUDA context is a process-wide object that the driver API accepts from any
// thread; hkload only passes it to the driver.
unsafe impl Send for Context {}
// SAFETY: as above; the handle is never dereferenced here.
unsafe impl Sync for Context {}

/// Dynamic shared memory a launch may ask for without the kernel opting in.
const DEFAULT_DYNAMIC_SHARED: u32 = 48 * 1024;

/// The dynamic shared memory a kernel may use, as last set (0: the default 48 KiB less its
/// static shared memory).
#[derive(Debug, Default)]
pub(crate) struct DynamicShared(AtomicU32);

impl std::fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDriver")
            .field("version", &self.version)
            .field("devices", &self.tables.devices())
            .finish_non_exhaustive()
    }
}

impl CudaDriver {
    /// Finds libcuda, initialises it and lists the devices. Fails with
    /// [`DriverError::Unavailable`] when there is no usable library and with
    /// [`DriverError::NoDevice`] when it sees no GPU. No context is created yet: that happens
    /// on a device's first use.
    pub fn new() -> Result<Self, DriverError> {
        check_library(REQUIRED_SYMBOLS)?;
        // SAFETY: every symbol is present (checked above); cuInit takes no pointers.
        let init = unsafe { sys::cuInit(0) };
        match init {
            sys::CUresult::CUDA_SUCCESS => {}
            sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                return Err(DriverError::NoDevice {
                    api: API,
                    detail: format!(
                        "cuInit reports {}; check `nvidia-smi` and CUDA_VISIBLE_DEVICES",
                        describe(init)
                    ),
                });
            }
            _ => {
                return Err(DriverError::Unavailable {
                    api: API,
                    detail: format!(
                        "cuInit failed with {}; check that the NVIDIA kernel driver is loaded \
                         (`nvidia-smi`)",
                        describe(init)
                    ),
                });
            }
        }
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid place for the driver to write an int.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut version)
        })?;
        let mut count: c_int = 0;
        // SAFETY: as above.
        check("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        if count <= 0 {
            return Err(DriverError::NoDevice {
                api: API,
                detail: "cuDeviceGetCount reports no device; check `nvidia-smi` and \
                         CUDA_VISIBLE_DEVICES"
                    .into(),
            });
        }
        let (devices, infos) = (0..count).map(device_at).collect::<Result<_, _>>()?;
        let version = u32::try_from(version).unwrap_or(0);
        Ok(Self {
            devices,
            version: (version / 1000, version % 1000 / 10),
            cu_launch_kernel: bind_launch_kernel()?,
            tables: Tables::new(infos),
        })
    }

    /// The CUDA version the driver supports, e.g. `(13, 0)`.
    pub fn driver_version(&self) -> (u32, u32) {
        self.version
    }

    /// Makes `device`'s primary context current on the calling thread (retaining it on first
    /// use), for code that calls [`sys`] directly next to hkload.
    pub fn make_current(&self, device: usize) -> Result<(), DriverError> {
        ensure_current(self.context(device)?)
    }

    /// Checks that the driver has every entry point in `symbols`, for code that calls them
    /// through [`sys`]: its loader panics on a missing one (an older driver than the one the
    /// call came with).
    pub fn require(&self, symbols: &[&str]) -> Result<(), DriverError> {
        check_library(symbols)
    }

    /// Runs `enqueue`, which should queue work on `stream` of `device`, between two CUDA
    /// events, waits for the second, and returns what `enqueue` returned with the device time
    /// between the events (resolution about half a microsecond).
    pub fn time_on_device<R>(
        &self,
        device: usize,
        stream: StreamHandle,
        enqueue: impl FnOnce() -> R,
    ) -> Result<(R, Duration), DriverError> {
        check_library(EVENT_SYMBOLS)?;
        self.make_current(device)?;
        let stream = stream.0 as sys::CUstream;
        let start = Event::new()?;
        let end = Event::new()?;
        // SAFETY: both events are live until dropped at the end of this function; the stream
        // is the caller's, as for launches.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(start.0, stream)
        })?;
        let output = enqueue();
        // SAFETY: as above.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(end.0, stream)
        })?;
        // SAFETY: as above.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(end.0)
        })?;
        let mut milliseconds = 0f32;
        // SAFETY: both events were recorded and `end` has completed.
        check("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut milliseconds, start.0, end.0)
        })?;
        let elapsed = Duration::try_from_secs_f64(f64::from(milliseconds) / 1e3).map_err(|_| {
            DriverError::Call {
                call: "cuEventElapsedTime",
                detail: format!("it reported {milliseconds} ms, which is not a duration"),
            }
        })?;
        Ok((output, elapsed))
    }

    fn device(&self, device: usize) -> Result<&CudaDevice, DriverError> {
        self.devices.get(device).ok_or_else(|| DriverError::Call {
            call: "device",
            detail: format!(
                "there is no CUDA device {device}; the driver sees {}",
                self.devices.len()
            ),
        })
    }

    /// The primary context of `device`, retained on first use.
    fn context(&self, device: usize) -> Result<Context, DriverError> {
        let slot = self.device(device)?;
        if let Some(context) = slot.context.get() {
            return Ok(*context);
        }
        let mut raw = ptr::null_mut();
        // SAFETY: `slot.handle` came from cuDeviceGet; `raw` is a valid place to write.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut raw, slot.handle)
        })
        .map_err(doing(|| {
            format!("creating the context of {}", self.describe_device(device))
        }))?;
        let context = Context(raw);
        if slot.context.set(context).is_err() {
            // Another thread retained it first. A device has one primary context, so both
            // hold the same handle: give back the extra reference.
            // SAFETY: this thread holds a reference from the retain above.
            let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(slot.handle) };
        }
        Ok(context)
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        for slot in &self.devices {
            if slot.context.get().is_some() {
                // Every module and buffer is gone (they hold the driver), so nothing uses the
                // context any more. A failure leaves nothing to do.
                // SAFETY: this driver holds one reference, from `context`.
                let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(slot.handle) };
            }
        }
    }
}

impl Vendor for CudaDriver {
    const API: &'static str = API;
    const DEVICE: &'static str = "CUDA";
    const GPUS: &'static str = "an NVIDIA GPU";
    const IMAGES: &'static [ImageKind] = &[ImageKind::Cubin, ImageKind::Ptx];
    type Module = ();
    type Function = DynamicShared;

    fn tables(&self) -> &Tables<(), DynamicShared> {
        &self.tables
    }

    fn make_current(&self, device: usize) -> Result<(), DriverError> {
        // The inherent method, public for code that calls `sys` directly.
        CudaDriver::make_current(self, device)
    }

    unsafe fn module_load(&self, image: Image<'_>) -> Result<(ModuleHandle, ()), DriverError> {
        let module = match image.kind {
            ImageKind::Ptx => load_ptx(image.bytes, image.what)?,
            _ => load_cubin(image.bytes).map_err(doing(image.what))?,
        };
        Ok((ModuleHandle(module as u64), ()))
    }

    unsafe fn module_unload(&self, module: ModuleHandle, (): ()) -> Result<(), DriverError> {
        // SAFETY: the caller vouches that the module is live and none of its functions is used
        // again.
        check("cuModuleUnload", unsafe {
            sys::cuModuleUnload(module.0 as sys::CUmodule)
        })
    }

    unsafe fn module_get_function(
        &self,
        module: ModuleHandle,
        name: &CStr,
    ) -> Result<Found<DynamicShared>, DriverError> {
        let mut function = ptr::null_mut();
        // SAFETY: the module is live (the caller vouches for it); `name` is NUL-terminated and
        // `function` a valid place to write.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut function, module.0 as sys::CUmodule, name.as_ptr())
        })?;
        Ok((FunctionHandle(function as u64), DynamicShared::default()))
    }

    unsafe fn prepare_launch(
        &self,
        launch: &Launch<'_>,
        function: &DynamicShared,
    ) -> Result<(), DriverError> {
        // Past 48 KiB of dynamic shared memory a kernel must opt in; hkload checked the amount
        // against the device's opt-in maximum already. Set once per kernel and size.
        let shared_bytes = launch.dims.shared_bytes;
        if shared_bytes <= DEFAULT_DYNAMIC_SHARED
            || shared_bytes <= function.0.load(Ordering::Relaxed)
        {
            return Ok(());
        }
        use sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_DYNAMIC;
        // SAFETY: the function belongs to a live module (the caller vouches for it).
        check("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(
                launch.function.0 as sys::CUfunction,
                MAX_DYNAMIC,
                shared_bytes as c_int,
            )
        })
        .map_err(doing(|| {
            format!("letting the kernel use {shared_bytes} bytes of dynamic shared memory")
        }))?;
        function.0.fetch_max(shared_bytes, Ordering::Relaxed);
        Ok(())
    }

    unsafe fn launch_kernel(
        &self,
        launch: &Launch<'_>,
        _: &DynamicShared,
    ) -> Result<(), DriverError> {
        // SAFETY: the entry point is cuLaunchKernel; the caller vouches for the function (of a
        // live module, in the context made current), the stream (0, the default stream, or
        // one the caller created in this context) and the arguments.
        check("cuLaunchKernel", unsafe {
            launch_packed(
                self.cu_launch_kernel,
                &EXTRA_MARKERS,
                launch.function.0 as sys::CUfunction,
                launch.dims,
                launch.stream.as_raw() as sys::CUstream,
                launch.args,
            )
        })
    }

    fn mem_alloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid place to write.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) })?;
        Ok(DevicePtr(ptr))
    }

    fn mem_free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        // SAFETY: the driver checks that `ptr` is an allocation of the context; a stale or
        // foreign pointer is an error, not undefined behaviour.
        check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr.0) })
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        // SAFETY: `src` is valid for its length; the driver checks that the device range
        // lies in one allocation.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(dst.0, src.as_ptr().cast(), src.len())
        })
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), DriverError> {
        // SAFETY: `dst` is valid for writes of its length; the driver checks the device range.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src.0, dst.len())
        })
    }

    fn device_synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: no pointers; the context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }
}

/// Checks that libcuda can be loaded and has every entry point in `symbols`.
fn check_library(symbols: &[&str]) -> Result<(), DriverError> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: loading libcuda runs its initialisers, as in every CUDA program.
    let present = *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() });
    if !present {
        return Err(DriverError::Unavailable {
            api: API,
            detail: "the NVIDIA driver's CUDA library (libcuda.so.1) is not on the library \
                     path; install the NVIDIA driver, or add the folder holding libcuda.so.1 \
                     to LD_LIBRARY_PATH"
                .into(),
        });
    }
    // SAFETY: the library is present, so cudarc's loader finds it and does not panic.
    let library = unsafe { sys::culib() };
    let missing: Vec<&str> = symbols
        .iter()
        .copied()
        // SAFETY: the symbol is only looked up, never called through this type.
        .filter(|name| unsafe { library.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(DriverError::Unavailable {
        api: API,
        detail: format!(
            "libcuda lacks {}: the NVIDIA driver is older than hkload's CUDA backend needs; \
             update it (hkload is built against CUDA 13.0, driver 580)",
            missing.join(", ")
        ),
    })
}

/// `cuLaunchKernel`, from the library [`sys`] loaded.
fn bind_launch_kernel() -> Result<CuLaunchKernel, DriverError> {
    // SAFETY: `check_library` found the library and the symbol; `CuLaunchKernel` is its C
    // signature (cuda.h, and cudarc's own declaration of it). The library stays loaded for the
    // life of the process.
    unsafe { sys::culib().get::<CuLaunchKernel>(b"cuLaunchKernel") }
        .map(|symbol| *symbol)
        .map_err(|error| DriverError::Unavailable {
            api: API,
            detail: format!("libcuda's cuLaunchKernel cannot be bound: {error}"),
        })
}

/// Device `ordinal`: its handle, and what hkload knows of it.
fn device_at(ordinal: c_int) -> Result<(CudaDevice, DeviceInfo), DriverError> {
    let mut handle: sys::CUdevice = 0;
    // SAFETY: `handle` is a valid place to write; the ordinal is below the device count.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut handle, ordinal)
    })?;
    let mut name = [0u8; 256];
    // SAFETY: the buffer holds the length passed.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr().cast(), name.len() as c_int, handle)
    })?;
    let name = CStr::from_bytes_until_nul(&name)
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&name).into_owned());
    let attribute = |attribute| {
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid place to write.
        check("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(&mut value, attribute, handle)
        })
        .map(|()| value)
    };
    use sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as MINOR,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as SHARED_OPTIN,
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK as MAX_THREADS,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as SMS,
    };
    let (major, minor) = (attribute(MAJOR)?, attribute(MINOR)?);
    let target = target_of(major, minor).map_err(|detail| DriverError::Call {
        call: "cuDeviceGetAttribute",
        detail: format!("CUDA device {ordinal} ({name}) {detail}"),
    })?;
    let compute_units = attribute(SMS)?.max(0) as u32;
    let shared_memory_per_block = attribute(SHARED_OPTIN)?.max(0) as u32;
    let max_threads_per_block = attribute(MAX_THREADS)?.max(0) as u32;
    let device = CudaDevice {
        handle,
        context: OnceLock::new(),
    };
    let info = DeviceInfo {
        ordinal: ordinal as usize,
        name,
        target,
        compute_units,
        shared_memory_per_block,
        max_threads_per_block,
    };
    Ok((device, info))
}

/// The target ID of a device of compute capability `major.minor`: `sm_90` for 9.0. The error
/// completes a sentence about the device.
fn target_of(major: c_int, minor: c_int) -> Result<TargetId, String> {
    let (Ok(major), Ok(minor)) = (u32::try_from(major), u32::try_from(minor)) else {
        return Err(format!(
            "reports compute capability {major}.{minor}, which is not a version"
        ));
    };
    SmArch::new(major, minor)
        .map(TargetId::Nvidia)
        .map_err(|error| format!("reports an unusable compute capability: {error}"))
}

/// Makes `context` current on the calling thread unless it already is.
fn ensure_current(context: Context) -> Result<(), DriverError> {
    let mut current = ptr::null_mut();
    // SAFETY: `current` is a valid place to write.
    check("cuCtxGetCurrent", unsafe {
        sys::cuCtxGetCurrent(&mut current)
    })?;
    if current == context.0 {
        return Ok(());
    }
    // SAFETY: the context is retained by the driver object that handed it out.
    check("cuCtxSetCurrent", unsafe {
        sys::cuCtxSetCurrent(context.0)
    })
}

fn load_cubin(image: &[u8]) -> Result<sys::CUmodule, DriverError> {
    let mut module = ptr::null_mut();
    // SAFETY: the driver reads the cubin's size from its ELF headers and copies what it
    // needs; it rejects what is not a cubin with an error.
    check("cuModuleLoadData", unsafe {
        sys::cuModuleLoadData(&mut module, image.as_ptr().cast())
    })?;
    Ok(module)
}

/// Loads PTX text, compiled by the driver's JIT. A failure says `what` was being done, followed
/// by the JIT's log.
fn load_ptx(image: &[u8], what: impl Fn() -> String) -> Result<sys::CUmodule, DriverError> {
    let text = nul_terminated(image).map_err(|detail| DriverError::Call {
        call: "cuModuleLoadDataEx",
        detail: format!("{detail} ({})", what()),
    })?;
    let mut log = vec![0u8; JIT_LOG_BYTES];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    // The size option's value is the number itself, passed in place of a pointer.
    let mut values = [
        log.as_mut_ptr().cast::<c_void>(),
        JIT_LOG_BYTES as *mut c_void,
    ];
    let mut module = ptr::null_mut();
    // SAFETY: `text` is NUL-terminated; `options` and `values` have the length passed, and the
    // log buffer holds the size given.
    let result = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            text.as_ptr().cast(),
            options.len() as c_uint,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    check("cuModuleLoadDataEx", result).map_err(doing(|| {
        let log = CStr::from_bytes_until_nul(&log)
            .map(|log| log.to_string_lossy().trim().to_owned())
            .unwrap_or_default();
        match log.is_empty() {
            true => what(),
            false => format!("{}; the JIT's log:\n{log}", what()),
        }
    }))?;
    Ok(module)
}

/// `text` ending in a NUL byte, as cuModuleLoadData reads PTX: borrowed when it already ends
/// in one (or in NUL padding), copied otherwise. A NUL inside the text is an error, since the
/// driver would silently read only what comes before it.
fn nul_terminated(text: &[u8]) -> Result<Cow<'_, [u8]>, String> {
    match text.iter().position(|&byte| byte == 0) {
        None => {
            let mut owned = Vec::with_capacity(text.len() + 1);
            owned.extend_from_slice(text);
            owned.push(0);
            Ok(Cow::Owned(owned))
        }
        Some(at) if text[at..].iter().all(|&byte| byte == 0) => Ok(Cow::Borrowed(text)),
        Some(at) => Err(format!(
            "the PTX text holds a NUL byte at offset {at} of {}; it is damaged",
            text.len()
        )),
    }
}

/// A CUDA event, destroyed on drop.
struct Event(sys::CUevent);

impl Event {
    fn new() -> Result<Self, DriverError> {
        let mut event = ptr::null_mut();
        // SAFETY: `event` is a valid place to write.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut event, sys::CUevent_flags::CU_EVENT_DEFAULT as c_uint)
        })?;
        Ok(Self(event))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event was created by `new` and is destroyed once; the driver defers the
        // release if it is still pending. A failure leaves nothing to do.
        let _ = unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// `Ok` for success; otherwise the call's error with CUDA's name and text for it.
fn check(call: &'static str, result: sys::CUresult) -> Result<(), DriverError> {
    if result == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(DriverError::Call {
        call,
        detail: describe(result),
    })
}

/// `CUDA_ERROR_INVALID_VALUE (invalid argument)`: CUDA's name and text for `result`.
fn describe(result: sys::CUresult) -> String {
    let text_of = |lookup: unsafe fn(sys::CUresult, *mut *const c_char) -> sys::CUresult| {
        let mut text: *const c_char = ptr::null();
        // SAFETY: on success the driver points `text` at a static NUL-terminated string.
        let found = unsafe { lookup(result, &mut text) };
        (found == sys::CUresult::CUDA_SUCCESS && !text.is_null())
            // SAFETY: as above.
            .then(|| {
                unsafe { CStr::from_ptr(text) }
                    .to_string_lossy()
                    .into_owned()
            })
    };
    let name = text_of(sys::cuGetErrorName).unwrap_or_else(|| format!("{result:?}"));
    match text_of(sys::cuGetErrorString) {
        Some(text) => format!("{name} ({text})"),
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_gets_exactly_one_terminating_nul() {
        assert_eq!(
            &*nul_terminated(b".version 8.0").unwrap(),
            b".version 8.0\0"
        );
        assert!(matches!(
            nul_terminated(b"ptx\0"),
            Ok(Cow::Borrowed(b"ptx\0"))
        ));
        assert!(matches!(nul_terminated(b"ptx\0\0\0"), Ok(Cow::Borrowed(_))));
        assert_eq!(&*nul_terminated(b"").unwrap(), b"\0");
    }

    #[test]
    fn ptx_with_a_nul_inside_is_refused() {
        let error = nul_terminated(b"ptx\0more").unwrap_err();
        assert!(error.contains("offset 3 of 8"), "{error}");
    }

    #[test]
    fn compute_capability_names_the_target() {
        assert_eq!(target_of(9, 0).unwrap().to_string(), "sm_90");
        assert_eq!(target_of(12, 0).unwrap().to_string(), "sm_120");
        for (major, minor) in [(0, 0), (9, 10), (-1, 0), (8, -6)] {
            let error = target_of(major, minor).unwrap_err();
            assert!(
                error.contains(&format!("{major}.{minor}")),
                "{major}.{minor}: {error}"
            );
        }
    }
}
