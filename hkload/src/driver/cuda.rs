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
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::time::Duration;

/// The raw CUDA driver API (cudarc's bindings, CUDA 13.0 names), for code that must call CUDA
/// directly next to hkload. Every entry point hkload itself uses is checked to exist when a
/// [`CudaDriver`] is created; cudarc panics on the first call of one that does not.
pub use cudarc::driver::sys;

use super::vendor::{
    ExtraMarkers, HandleMap, describe_launch, doing, unknown_function, with_packed_args,
};
use super::{
    DeviceInfo, DevicePtr, Driver, DriverError, FunctionHandle, ImageKind, LaunchDims,
    ModuleHandle, StreamHandle,
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

/// NVIDIA GPUs through the CUDA driver API. See the module docs.
pub struct CudaDriver {
    devices: Vec<CudaDevice>,
    /// The CUDA version the driver supports, `(13, 0)` for driver 580.
    version: (u32, u32),
    /// Live modules and the device each was loaded on. Held while functions are looked up
    /// and modules unloaded, so a lookup cannot race the unload of its module.
    modules: Mutex<HashMap<u64, usize>>,
    /// Functions of live modules. Read on every launch, and held for its duration so that an
    /// unload (which takes it for writing) cannot pull the function out from under it.
    functions: RwLock<HandleMap<FunctionEntry>>,
}

struct CudaDevice {
    handle: sys::CUdevice,
    info: DeviceInfo,
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

#[derive(Debug)]
struct FunctionEntry {
    context: Context,
    module: u64,
    /// The dynamic shared memory the kernel may use, as last set (0: the default 48 KiB
    /// less its static shared memory).
    dynamic_shared: AtomicU32,
}

impl std::fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<&DeviceInfo> = self.devices.iter().map(|d| &d.info).collect();
        f.debug_struct("CudaDriver")
            .field("version", &self.version)
            .field("devices", &devices)
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
        let devices = (0..count).map(device_at).collect::<Result<_, _>>()?;
        let version = u32::try_from(version).unwrap_or(0);
        Ok(Self {
            devices,
            version: (version / 1000, version % 1000 / 10),
            modules: Mutex::default(),
            functions: RwLock::default(),
        })
    }

    /// The CUDA version the driver supports, e.g. `(13, 0)`.
    pub fn driver_version(&self) -> (u32, u32) {
        self.version
    }

    /// Makes `device`'s primary context current on the calling thread (retaining it on first
    /// use), for code that calls [`sys`] directly next to hkload.
    pub fn make_current(&self, device: usize) -> Result<(), DriverError> {
        make_current(self.context(device)?)
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
            format!("creating the context of {}", describe_device(slot))
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

    fn lock_modules(&self) -> MutexGuard<'_, HashMap<u64, usize>> {
        // The maps are only changed by single inserts and removals, so a panic elsewhere
        // cannot leave them half-updated.
        self.modules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn unknown_module(call: &'static str, module: ModuleHandle) -> DriverError {
        DriverError::Call {
            call,
            detail: format!(
                "module {:#x} was not loaded by this driver, or is unloaded",
                module.0
            ),
        }
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

impl Driver for CudaDriver {
    fn api(&self) -> &'static str {
        API
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>, DriverError> {
        Ok(self.devices.iter().map(|d| d.info.clone()).collect())
    }

    fn load_module(
        &self,
        device: usize,
        kind: ImageKind,
        image: &[u8],
    ) -> Result<ModuleHandle, DriverError> {
        let slot = self.device(device)?;
        if kind == ImageKind::AmdCodeObject {
            return Err(DriverError::Call {
                call: "cuModuleLoadData",
                detail: format!(
                    "an AMD code object cannot run on an NVIDIA GPU ({})",
                    describe_device(slot)
                ),
            });
        }
        self.make_current(device)?;
        let what = |form: &str| {
            format!(
                "loading a {}-byte {form} on {}",
                image.len(),
                describe_device(slot)
            )
        };
        let module = if kind == ImageKind::Ptx {
            load_ptx(image, || what("PTX text"))?
        } else {
            load_cubin(image).map_err(doing(|| what("cubin")))?
        };
        self.lock_modules().insert(module as u64, device);
        Ok(ModuleHandle(module as u64))
    }

    fn unload_module(&self, module: ModuleHandle) -> Result<(), DriverError> {
        let mut modules = self.lock_modules();
        let device = modules
            .remove(&module.0)
            .ok_or_else(|| Self::unknown_module("cuModuleUnload", module))?;
        self.functions
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, entry| entry.module != module.0);
        self.make_current(device)?;
        // SAFETY: the module was live (it was in the table) and no function of it remains.
        check("cuModuleUnload", unsafe {
            sys::cuModuleUnload(module.0 as sys::CUmodule)
        })
    }

    fn function(&self, module: ModuleHandle, name: &str) -> Result<FunctionHandle, DriverError> {
        let modules = self.lock_modules();
        let device = *modules
            .get(&module.0)
            .ok_or_else(|| Self::unknown_module("cuModuleGetFunction", module))?;
        let symbol = CString::new(name).map_err(|_| DriverError::Call {
            call: "cuModuleGetFunction",
            detail: format!("the kernel name {name:?} holds a NUL byte"),
        })?;
        let context = self.context(device)?;
        make_current(context)?;
        let mut function = ptr::null_mut();
        // SAFETY: the module is live (it is in the table, whose lock is held); `symbol` is
        // NUL-terminated and `function` a valid place to write.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut function, module.0 as sys::CUmodule, symbol.as_ptr())
        })
        .map_err(doing(|| {
            format!("looking up kernel `{name}` in its module on CUDA device {device}")
        }))?;
        self.functions
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                function as u64,
                FunctionEntry {
                    context,
                    module: module.0,
                    dynamic_shared: AtomicU32::new(0),
                },
            );
        Ok(FunctionHandle(function as u64))
    }

    fn launch(
        &self,
        function: FunctionHandle,
        dims: &LaunchDims,
        stream: StreamHandle,
        args: &[u8],
    ) -> Result<(), DriverError> {
        let functions = self
            .functions
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = functions
            .get(&function.0)
            .ok_or_else(|| unknown_function("cuLaunchKernel", function))?;
        make_current(entry.context)?;
        // Past 48 KiB of dynamic shared memory a kernel must opt in; hkload checked the amount
        // against the device's opt-in maximum already. Set once per kernel and size.
        if dims.shared_bytes > DEFAULT_DYNAMIC_SHARED
            && dims.shared_bytes > entry.dynamic_shared.load(Ordering::Relaxed)
        {
            use sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_DYNAMIC;
            // SAFETY: the function belongs to a live module (the table's lock is held).
            check("cuFuncSetAttribute", unsafe {
                sys::cuFuncSetAttribute(
                    function.0 as sys::CUfunction,
                    MAX_DYNAMIC,
                    dims.shared_bytes as c_int,
                )
            })
            .map_err(doing(|| {
                format!(
                    "letting the kernel use {} bytes of dynamic shared memory",
                    dims.shared_bytes
                )
            }))?;
            entry
                .dynamic_shared
                .fetch_max(dims.shared_bytes, Ordering::Relaxed);
        }
        let [gx, gy, gz] = dims.grid;
        let [bx, by, bz] = dims.block;
        let result = with_packed_args(args, &EXTRA_MARKERS, |extra| {
            // SAFETY: the function belongs to a live module (it is in the table, which stays
            // read-locked until the call returns, so no unload can intervene). `extra` and the
            // buffer and size it points to outlive the call, which copies the arguments. The
            // stream is 0 (the default stream) or one the caller created in this context, as
            // `Kernel::launch`'s contract requires.
            unsafe {
                sys::cuLaunchKernel(
                    function.0 as sys::CUfunction,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    dims.shared_bytes,
                    stream.0 as sys::CUstream,
                    ptr::null_mut(),
                    extra,
                )
            }
        });
        drop(functions);
        check("cuLaunchKernel", result).map_err(doing(|| describe_launch(dims, args)))
    }

    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr, DriverError> {
        // cuMemAlloc refuses zero bytes; a null pointer stands for an empty allocation, and
        // `free` and the copies accept it.
        if bytes == 0 {
            return Ok(DevicePtr(0));
        }
        self.make_current(device)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid place to write.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }).map_err(doing(
            || format!("allocating {bytes} bytes on CUDA device {device}"),
        ))?;
        Ok(DevicePtr(ptr))
    }

    fn free(&self, device: usize, ptr: DevicePtr) -> Result<(), DriverError> {
        if ptr.0 == 0 {
            return Ok(());
        }
        self.make_current(device)?;
        // SAFETY: the driver checks that `ptr` is an allocation of the context; a stale or
        // foreign pointer is an error, not undefined behaviour.
        check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr.0) }).map_err(doing(|| {
            format!("freeing {:#x} on CUDA device {device}", ptr.0)
        }))
    }

    fn copy_to_device(&self, device: usize, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        if src.is_empty() {
            return Ok(());
        }
        self.make_current(device)?;
        // SAFETY: `src` is valid for its length; the driver checks that the device range
        // lies in one allocation.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(dst.0, src.as_ptr().cast(), src.len())
        })
        .map_err(doing(|| {
            format!(
                "copying {} bytes to {:#x} on CUDA device {device}",
                src.len(),
                dst.0
            )
        }))
    }

    fn copy_to_host(
        &self,
        device: usize,
        dst: &mut [u8],
        src: DevicePtr,
    ) -> Result<(), DriverError> {
        if dst.is_empty() {
            return Ok(());
        }
        self.make_current(device)?;
        // SAFETY: `dst` is valid for writes of its length; the driver checks the device range.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src.0, dst.len())
        })
        .map_err(doing(|| {
            format!(
                "copying {} bytes from {:#x} on CUDA device {device}",
                dst.len(),
                src.0
            )
        }))
    }

    fn synchronize(&self, device: usize) -> Result<(), DriverError> {
        self.make_current(device)?;
        // SAFETY: no pointers; the context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() }).map_err(doing(|| {
            format!("waiting for CUDA device {device} (an earlier launch may have failed)")
        }))
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

/// Device `ordinal` as hkload sees it.
fn device_at(ordinal: c_int) -> Result<CudaDevice, DriverError> {
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
    Ok(CudaDevice {
        handle,
        info: DeviceInfo {
            ordinal: ordinal as usize,
            name,
            target,
            compute_units,
            shared_memory_per_block,
            max_threads_per_block,
        },
        context: OnceLock::new(),
    })
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
fn make_current(context: Context) -> Result<(), DriverError> {
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

fn describe_device(slot: &CudaDevice) -> String {
    format!(
        "CUDA device {} ({}, {})",
        slot.info.ordinal, slot.info.name, slot.info.target
    )
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
