//! The HIP backend: AMD GPUs through the HIP runtime, `libamdhip64`.
//!
//! The library is opened with libloading when a [`HipDriver`] is created, never linked. A
//! link-time binding (as `hip-sys` makes) would put libamdhip64 among the libraries the system
//! loader must find before `main` runs, so a binary built with both backends would not even
//! start on an NVIDIA-only machine; opened at run time, its absence is just a
//! [`DriverError::Unavailable`].
//!
//! Three facts of CLR (ROCm's HIP runtime) shape this driver:
//!
//! * A module belongs to the device that was current when it was loaded (CLR builds a module
//!   for the current device only), so the module's device is made current before each call
//!   on it or its functions.
//! * `hipModuleLoadData` uses a bare code object in place rather than copying it, so the
//!   driver keeps its own copy of the bytes until the module is unloaded.
//! * `hipDeviceProp_t` changed layout in ROCm 6.0, and the exported `hipGetDeviceProperties`
//!   kept the old one. The driver binds `hipGetDevicePropertiesR0600` and reads the target ID
//!   (`gcnArchName`, e.g. `gfx942:sramecc+:xnack-`) at that layout's offset, falling back to
//!   `hipGetDeviceProperties` and the old layout on ROCm 5, which lacks the new symbol.
//!
//! Handles are HIP's own: a [`ModuleHandle`] holds a `hipModule_t`, a [`FunctionHandle`] a
//! `hipFunction_t`, a [`StreamHandle`] a `hipStream_t` (0 is the default stream) and a
//! [`DevicePtr`] a device address.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use libloading::Library;

use super::vendor::{
    ExtraMarkers, HandleMap, describe_launch, doing, unknown_function, with_packed_args,
};
use super::{
    DeviceInfo, DevicePtr, Driver, DriverError, FunctionHandle, ImageKind, LaunchDims,
    ModuleHandle, StreamHandle,
};
use crate::target::TargetId;

const API: &str = "hip";

/// Where the runtime is looked for, in order: the development link, the versioned names of
/// ROCm 7, 6 and 5 (what a runtime-only install has), and ROCm's default folder for systems
/// that do not put it on the loader path.
const LIBRARY_NAMES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "/opt/rocm/lib/libamdhip64.so",
];

/// `hipError_t`.
type Status = c_int;
const HIP_SUCCESS: Status = 0;
/// `hipErrorNoDevice`: what `hipGetDeviceCount` returns on a machine without an AMD GPU.
const HIP_ERROR_NO_DEVICE: Status = 100;

/// `hipMemcpyKind` values (`driver_types.h`).
const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;

/// Markers of `hipModuleLaunchKernel`'s `extra` array (`hip_runtime_api.h`). Note that the end
/// marker differs from CUDA's (0).
const EXTRA_MARKERS: ExtraMarkers = ExtraMarkers {
    buffer_pointer: 0x01,
    buffer_size: 0x02,
    end: 0x03,
};

/// Where `hipDeviceProp_t` keeps what hkload reads, in one ABI version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PropertiesLayout {
    /// The entry point that fills this layout.
    symbol: &'static str,
    /// `sizeof(hipDeviceProp_t)`.
    size: usize,
    /// Offset of `char gcnArchName[256]`; `char name[256]` is at 0 in both layouts.
    arch_offset: usize,
    /// Offset of `int multiProcessorCount` (the compute units).
    compute_units_offset: usize,
    /// Offset of `int maxThreadsPerBlock`.
    max_threads_offset: usize,
}

/// ROCm 6.0 and later (`hipDeviceProp_tR0600`).
const PROPERTIES_R0600: PropertiesLayout = PropertiesLayout {
    symbol: "hipGetDevicePropertiesR0600",
    size: 1472,
    arch_offset: 1160,
    // As in CUDA 12's `cudaDeviceProp`, which this layout mirrors field for field.
    compute_units_offset: 388,
    max_threads_offset: 320,
};

/// ROCm 5 (`hipDeviceProp_tR0000`), checked against Debian's ROCm 5.2 headers.
const PROPERTIES_R0000: PropertiesLayout = PropertiesLayout {
    symbol: "hipGetDeviceProperties",
    size: 792,
    arch_offset: 396,
    compute_units_offset: 336,
    max_threads_offset: 280,
};

/// Length of the `name` and `gcnArchName` fields.
const PROPERTY_STRING_LEN: usize = 256;

/// The properties buffer, in 8-byte words (the struct holds `size_t` fields): 4 KiB, well
/// past both layouts, so a runtime that writes a larger struct cannot overrun it.
const PROPERTIES_BUFFER_WORDS: usize = 512;

type RawModule = *mut c_void;
type RawFunction = *mut c_void;

/// `hipModuleLaunchKernel(f, grid x, y, z, block x, y, z, shared bytes, stream, kernelParams,
/// extra)`.
type LaunchKernelFn = unsafe extern "C" fn(
    RawFunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> Status;

/// The runtime's entry points, bound by name (signatures from `hip_runtime_api.h`).
struct Api {
    get_device_count: unsafe extern "C" fn(*mut c_int) -> Status,
    get_device_properties: unsafe extern "C" fn(*mut c_void, c_int) -> Status,
    properties: PropertiesLayout,
    get_device: unsafe extern "C" fn(*mut c_int) -> Status,
    set_device: unsafe extern "C" fn(c_int) -> Status,
    module_load_data: unsafe extern "C" fn(*mut RawModule, *const c_void) -> Status,
    module_unload: unsafe extern "C" fn(RawModule) -> Status,
    module_get_function: unsafe extern "C" fn(*mut RawFunction, RawModule, *const c_char) -> Status,
    module_launch_kernel: LaunchKernelFn,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Status,
    free: unsafe extern "C" fn(*mut c_void) -> Status,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> Status,
    device_synchronize: unsafe extern "C" fn() -> Status,
    get_error_name: unsafe extern "C" fn(Status) -> *const c_char,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    runtime_get_version: unsafe extern "C" fn(*mut c_int) -> Status,
    /// The library the entry points live in, which must stay loaded as long as they are used.
    _library: Library,
}

/// AMD GPUs through the HIP runtime. See the module docs.
pub struct HipDriver {
    api: Api,
    /// Which file was loaded, for messages.
    library: &'static str,
    /// The HIP version of the runtime, `(6, 2)`.
    version: (u32, u32),
    devices: Vec<DeviceInfo>,
    /// Live modules. Held while functions are looked up and modules unloaded, so a lookup
    /// cannot race the unload of its module.
    modules: Mutex<HashMap<u64, LoadedModule>>,
    /// Functions of live modules. Read on every launch, and held for its duration so that an
    /// unload (which takes it for writing) cannot pull the function out from under it.
    functions: RwLock<HandleMap<FunctionEntry>>,
}

struct LoadedModule {
    device: usize,
    /// The code object HIP reads in place. Never read here: it is kept so that it is dropped
    /// only after `hipModuleUnload`.
    _image: CodeImage,
}

#[derive(Debug, Clone, Copy)]
struct FunctionEntry {
    device: usize,
    module: u64,
}

impl std::fmt::Debug for HipDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipDriver")
            .field("library", &self.library)
            .field("version", &self.version)
            .field("devices", &self.devices)
            .finish_non_exhaustive()
    }
}

impl HipDriver {
    /// Opens the HIP runtime and lists the devices. Fails with [`DriverError::Unavailable`]
    /// when the runtime cannot be found or lacks an entry point, and with
    /// [`DriverError::NoDevice`] when it sees no GPU.
    pub fn new() -> Result<Self, DriverError> {
        Self::open(LIBRARY_NAMES)
    }

    /// Like [`HipDriver::new`], trying the library files in `candidates`.
    fn open(candidates: &[&'static str]) -> Result<Self, DriverError> {
        let (library, path) = open_library(candidates)?;
        let api = Api::bind(library, path)?;
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid place to write.
        api.check("hipRuntimeGetVersion", unsafe {
            (api.runtime_get_version)(&mut version)
        })?;
        // HIP_VERSION is major * 10^7 + minor * 10^5 + patch.
        let version = u32::try_from(version).unwrap_or(0);
        let version = (version / 10_000_000, version / 100_000 % 100);
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid place to write.
        let status = unsafe { (api.get_device_count)(&mut count) };
        let where_ = || format!("{path}, HIP {}.{}", version.0, version.1);
        if status == HIP_ERROR_NO_DEVICE || (status == HIP_SUCCESS && count <= 0) {
            return Err(DriverError::NoDevice {
                api: API,
                detail: format!(
                    "hipGetDeviceCount reports {} ({}); check that the amdgpu kernel driver is \
                     loaded and /dev/kfd is accessible (`rocminfo` lists the GPUs ROCm sees)",
                    api.describe(status),
                    where_()
                ),
            });
        }
        if status != HIP_SUCCESS {
            return Err(DriverError::Unavailable {
                api: API,
                detail: format!(
                    "hipGetDeviceCount failed with {} ({})",
                    api.describe(status),
                    where_()
                ),
            });
        }
        let devices = (0..count)
            .map(|ordinal| api.device_info(ordinal))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            api,
            library: path,
            version,
            devices,
            modules: Mutex::default(),
            functions: RwLock::default(),
        })
    }

    /// The HIP version of the runtime, e.g. `(6, 2)`.
    pub fn runtime_version(&self) -> (u32, u32) {
        self.version
    }

    /// Makes `device` current on the calling thread unless it already is.
    fn make_current(&self, device: usize) -> Result<(), DriverError> {
        let ordinal = c_int::try_from(device)
            .ok()
            .filter(|_| device < self.devices.len())
            .ok_or_else(|| DriverError::Call {
                call: "hipSetDevice",
                detail: format!(
                    "there is no HIP device {device}; the runtime sees {}",
                    self.devices.len()
                ),
            })?;
        let mut current: c_int = -1;
        // SAFETY: `current` is a valid place to write.
        self.api.check("hipGetDevice", unsafe {
            (self.api.get_device)(&mut current)
        })?;
        if current == ordinal {
            return Ok(());
        }
        // SAFETY: the ordinal is below the device count.
        self.api
            .check("hipSetDevice", unsafe { (self.api.set_device)(ordinal) })
    }

    fn describe_device(&self, device: usize) -> String {
        match self.devices.get(device) {
            Some(info) => format!("HIP device {device} ({}, {})", info.name, info.target),
            None => format!("HIP device {device}"),
        }
    }

    fn lock_modules(&self) -> MutexGuard<'_, HashMap<u64, LoadedModule>> {
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

impl Driver for HipDriver {
    fn api(&self) -> &'static str {
        API
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>, DriverError> {
        Ok(self.devices.clone())
    }

    fn load_module(
        &self,
        device: usize,
        kind: ImageKind,
        image: &[u8],
    ) -> Result<ModuleHandle, DriverError> {
        if kind != ImageKind::AmdCodeObject {
            return Err(DriverError::Call {
                call: "hipModuleLoadData",
                detail: format!(
                    "an NVIDIA {} cannot run on an AMD GPU ({})",
                    if kind == ImageKind::Ptx {
                        "PTX text"
                    } else {
                        "cubin"
                    },
                    self.describe_device(device)
                ),
            });
        }
        self.make_current(device)?;
        let image = CodeImage::new(image);
        let mut module = ptr::null_mut();
        // SAFETY: `image` holds a copy of the code object that is kept, unmoved, until the
        // module is unloaded (CLR reads it in place); CLR finds its size in its ELF headers
        // and rejects what is not a code object with an error.
        self.api
            .check("hipModuleLoadData", unsafe {
                (self.api.module_load_data)(&mut module, image.as_ptr())
            })
            .map_err(doing(|| {
                format!(
                    "loading a {}-byte code object on {}",
                    image.len,
                    self.describe_device(device)
                )
            }))?;
        self.lock_modules().insert(
            module as u64,
            LoadedModule {
                device,
                _image: image,
            },
        );
        Ok(ModuleHandle(module as u64))
    }

    fn unload_module(&self, module: ModuleHandle) -> Result<(), DriverError> {
        let mut modules = self.lock_modules();
        let loaded = modules
            .remove(&module.0)
            .ok_or_else(|| Self::unknown_module("hipModuleUnload", module))?;
        self.functions
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, entry| entry.module != module.0);
        self.make_current(loaded.device)?;
        // SAFETY: the module was live (it was in the table) and no function of it remains.
        let result = self.api.check("hipModuleUnload", unsafe {
            (self.api.module_unload)(module.0 as RawModule)
        });
        // Only now may the bytes CLR read in place go.
        drop(loaded);
        result
    }

    fn function(&self, module: ModuleHandle, name: &str) -> Result<FunctionHandle, DriverError> {
        let modules = self.lock_modules();
        let device = modules
            .get(&module.0)
            .ok_or_else(|| Self::unknown_module("hipModuleGetFunction", module))?
            .device;
        let symbol = CString::new(name).map_err(|_| DriverError::Call {
            call: "hipModuleGetFunction",
            detail: format!("the kernel name {name:?} holds a NUL byte"),
        })?;
        self.make_current(device)?;
        let mut function = ptr::null_mut();
        // SAFETY: the module is live (it is in the table, whose lock is held); `symbol` is
        // NUL-terminated and `function` a valid place to write.
        self.api
            .check("hipModuleGetFunction", unsafe {
                (self.api.module_get_function)(
                    &mut function,
                    module.0 as RawModule,
                    symbol.as_ptr(),
                )
            })
            .map_err(doing(|| {
                format!(
                    "looking up kernel `{name}` in its module on {}",
                    self.describe_device(device)
                )
            }))?;
        self.functions
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                function as u64,
                FunctionEntry {
                    device,
                    module: module.0,
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
            .ok_or_else(|| unknown_function("hipModuleLaunchKernel", function))?;
        self.make_current(entry.device)?;
        let [gx, gy, gz] = dims.grid;
        let [bx, by, bz] = dims.block;
        let status = with_packed_args(args, &EXTRA_MARKERS, |extra| {
            // SAFETY: the function belongs to a live module (it is in the table, which stays
            // read-locked until the call returns). `extra` and the buffer and size it points
            // to outlive the call, which copies the arguments. The stream is 0 (the default
            // stream) or one the caller created on this device, as `Kernel::launch`'s contract
            // requires.
            unsafe {
                (self.api.module_launch_kernel)(
                    function.0 as RawFunction,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    dims.shared_bytes,
                    stream.0 as *mut c_void,
                    ptr::null_mut(),
                    extra,
                )
            }
        });
        drop(functions);
        self.api
            .check("hipModuleLaunchKernel", status)
            .map_err(doing(|| describe_launch(dims, args)))
    }

    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr, DriverError> {
        // A null pointer stands for an empty allocation, as on CUDA; `free` and the copies
        // accept it.
        if bytes == 0 {
            return Ok(DevicePtr(0));
        }
        self.make_current(device)?;
        let mut ptr = ptr::null_mut();
        // SAFETY: `ptr` is a valid place to write.
        self.api
            .check("hipMalloc", unsafe { (self.api.malloc)(&mut ptr, bytes) })
            .map_err(doing(|| {
                format!(
                    "allocating {bytes} bytes on {}",
                    self.describe_device(device)
                )
            }))?;
        Ok(DevicePtr(ptr as u64))
    }

    fn free(&self, device: usize, ptr: DevicePtr) -> Result<(), DriverError> {
        if ptr.0 == 0 {
            return Ok(());
        }
        self.make_current(device)?;
        // SAFETY: the runtime checks that `ptr` is one of its allocations; a stale or foreign
        // pointer is an error.
        self.api
            .check("hipFree", unsafe { (self.api.free)(ptr.0 as *mut c_void) })
            .map_err(doing(|| {
                format!("freeing {:#x} on {}", ptr.0, self.describe_device(device))
            }))
    }

    fn copy_to_device(&self, device: usize, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        if src.is_empty() {
            return Ok(());
        }
        self.make_current(device)?;
        // SAFETY: `src` is valid for its length; the runtime checks the device range.
        self.api
            .check("hipMemcpy", unsafe {
                (self.api.memcpy)(
                    dst.0 as *mut c_void,
                    src.as_ptr().cast(),
                    src.len(),
                    HIP_MEMCPY_HOST_TO_DEVICE,
                )
            })
            .map_err(doing(|| {
                format!(
                    "copying {} bytes to {:#x} on {}",
                    src.len(),
                    dst.0,
                    self.describe_device(device)
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
        let len = dst.len();
        // SAFETY: `dst` is valid for writes of its length; the runtime checks the device range.
        self.api
            .check("hipMemcpy", unsafe {
                (self.api.memcpy)(
                    dst.as_mut_ptr().cast(),
                    src.0 as *const c_void,
                    len,
                    HIP_MEMCPY_DEVICE_TO_HOST,
                )
            })
            .map_err(doing(|| {
                format!(
                    "copying {len} bytes from {:#x} on {}",
                    src.0,
                    self.describe_device(device)
                )
            }))
    }

    fn synchronize(&self, device: usize) -> Result<(), DriverError> {
        self.make_current(device)?;
        // SAFETY: no pointers; the device is current.
        self.api
            .check("hipDeviceSynchronize", unsafe {
                (self.api.device_synchronize)()
            })
            .map_err(doing(|| {
                format!(
                    "waiting for {} (an earlier launch may have failed)",
                    self.describe_device(device)
                )
            }))
    }
}

/// Opens the first of `candidates` that loads.
fn open_library(candidates: &[&'static str]) -> Result<(Library, &'static str), DriverError> {
    let mut last_error = String::new();
    for &name in candidates {
        // SAFETY: loading the HIP runtime runs its initialisers, as in every HIP program.
        match unsafe { Library::new(name) } {
            Ok(library) => return Ok((library, name)),
            Err(error) => last_error = error.to_string(),
        }
    }
    Err(DriverError::Unavailable {
        api: API,
        detail: format!(
            "the HIP runtime (libamdhip64) is not installed or not on the library path: tried \
             {} (last error: {last_error}); install ROCm, or add its lib folder to \
             LD_LIBRARY_PATH",
            candidates.join(", ")
        ),
    })
}

impl Api {
    /// Binds every entry point the driver uses from `library` (opened from `path`).
    fn bind(library: Library, path: &str) -> Result<Self, DriverError> {
        let lib = (&library, path);
        // ROCm 6 and later export the current layout under its own name; ROCm 5 has only
        // the old one.
        let (get_device_properties, properties) = match bind_symbol(lib, PROPERTIES_R0600.symbol) {
            Ok(function) => (function, PROPERTIES_R0600),
            Err(_) => (bind_symbol(lib, PROPERTIES_R0000.symbol)?, PROPERTIES_R0000),
        };
        Ok(Self {
            get_device_count: bind_symbol(lib, "hipGetDeviceCount")?,
            get_device_properties,
            properties,
            get_device: bind_symbol(lib, "hipGetDevice")?,
            set_device: bind_symbol(lib, "hipSetDevice")?,
            module_load_data: bind_symbol(lib, "hipModuleLoadData")?,
            module_unload: bind_symbol(lib, "hipModuleUnload")?,
            module_get_function: bind_symbol(lib, "hipModuleGetFunction")?,
            module_launch_kernel: bind_symbol(lib, "hipModuleLaunchKernel")?,
            malloc: bind_symbol(lib, "hipMalloc")?,
            free: bind_symbol(lib, "hipFree")?,
            memcpy: bind_symbol(lib, "hipMemcpy")?,
            device_synchronize: bind_symbol(lib, "hipDeviceSynchronize")?,
            get_error_name: bind_symbol(lib, "hipGetErrorName")?,
            get_error_string: bind_symbol(lib, "hipGetErrorString")?,
            runtime_get_version: bind_symbol(lib, "hipRuntimeGetVersion")?,
            _library: library,
        })
    }

    /// What hkload needs to know of device `ordinal`.
    fn device_info(&self, ordinal: c_int) -> Result<DeviceInfo, DriverError> {
        let mut words = vec![0u64; PROPERTIES_BUFFER_WORDS];
        // SAFETY: the buffer is larger than either layout of hipDeviceProp_t and 8-byte
        // aligned; the ordinal is below the device count.
        self.check(self.properties.symbol, unsafe {
            (self.get_device_properties)(words.as_mut_ptr().cast(), ordinal)
        })?;
        let bytes: Vec<u8> = words.iter().flat_map(|word| word.to_ne_bytes()).collect();
        read_properties(&bytes, self.properties, ordinal as usize).map_err(|detail| {
            DriverError::Call {
                call: self.properties.symbol,
                detail: format!("HIP device {ordinal} {detail}"),
            }
        })
    }

    /// `Ok` for `hipSuccess`; otherwise the call's error with HIP's name and text for it.
    fn check(&self, call: &'static str, status: Status) -> Result<(), DriverError> {
        if status == HIP_SUCCESS {
            return Ok(());
        }
        Err(DriverError::Call {
            call,
            detail: self.describe(status),
        })
    }

    /// `hipErrorInvalidValue (invalid argument)`: HIP's name and text for `status`.
    fn describe(&self, status: Status) -> String {
        let text_of = |text: *const c_char| {
            // SAFETY: HIP returns a pointer to a static NUL-terminated string, or null.
            (!text.is_null()).then(|| {
                unsafe { CStr::from_ptr(text) }
                    .to_string_lossy()
                    .into_owned()
            })
        };
        // SAFETY: both functions accept any status value.
        let name = text_of(unsafe { (self.get_error_name)(status) })
            .unwrap_or_else(|| format!("HIP error {status}"));
        // SAFETY: as above.
        match text_of(unsafe { (self.get_error_string)(status) }) {
            // ROCm 5 answers with the name for both.
            Some(text) if text != name => format!("{name} ({text})"),
            _ => name,
        }
    }
}

/// The entry point `name` of `library` (opened from `path`), as a function pointer of type `F`.
fn bind_symbol<F: Copy>((library, path): (&Library, &str), name: &str) -> Result<F, DriverError> {
    // SAFETY: callers bind each symbol to the C signature hip_runtime_api.h declares for it;
    // the pointer stays valid while `library` is loaded, and `Api` keeps it loaded.
    unsafe { library.get::<F>(name.as_bytes()) }
        .map(|symbol| *symbol)
        .map_err(|error| DriverError::Unavailable {
            api: API,
            detail: format!(
                "{path} has no entry point {name} ({error}); hkload needs the HIP runtime of \
                 ROCm 5 or newer"
            ),
        })
}

/// Device `ordinal` as the bytes of its `hipDeviceProp_t` of `layout` describe it. The error
/// completes a sentence about the device.
fn read_properties(
    bytes: &[u8],
    layout: PropertiesLayout,
    ordinal: usize,
) -> Result<DeviceInfo, String> {
    let field = |offset: usize| {
        bytes
            .get(offset..offset + PROPERTY_STRING_LEN)
            .and_then(|field| CStr::from_bytes_until_nul(field).ok())
            .map(|text| text.to_string_lossy().into_owned())
    };
    let name = field(0).unwrap_or_default();
    let arch = field(layout.arch_offset).ok_or_else(|| {
        format!(
            "({name}) has no NUL-terminated gcnArchName at byte {} of hipDeviceProp_t",
            layout.arch_offset
        )
    })?;
    let int = |offset: usize| {
        bytes
            .get(offset..offset + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map_or(0, |b| i32::from_ne_bytes(b).max(0) as u32)
    };
    match arch.parse::<TargetId>() {
        Ok(target @ TargetId::Amd(_)) => Ok(DeviceInfo {
            ordinal,
            name,
            target,
            compute_units: int(layout.compute_units_offset),
            shared_memory_per_block: target.shared_memory_per_block(),
            max_threads_per_block: int(layout.max_threads_offset),
        }),
        Ok(_) => Err(format!(
            "({name}) reports `{arch}`, which is not an AMD target"
        )),
        Err(error) => Err(format!(
            "({name}) reports target `{arch}`, which hkload cannot use: {error}"
        )),
    }
}

/// A copy of a code object in 8-byte-aligned memory that stays put: CLR reads a bare code
/// object in place, through C structs, and a byte vector promises no alignment.
struct CodeImage {
    words: Box<[u64]>,
    len: usize,
}

impl CodeImage {
    fn new(bytes: &[u8]) -> Self {
        let words = bytes
            .chunks(8)
            .map(|chunk| {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                u64::from_ne_bytes(word)
            })
            .collect();
        Self {
            words,
            len: bytes.len(),
        }
    }

    fn as_ptr(&self) -> *const c_void {
        self.words.as_ptr().cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `hipDeviceProp_t` of `layout` with `name` and `arch` in place.
    fn properties(layout: PropertiesLayout, name: &str, arch: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0u8; layout.size];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        bytes[layout.arch_offset..layout.arch_offset + arch.len()].copy_from_slice(arch);
        bytes[layout.compute_units_offset..layout.compute_units_offset + 4]
            .copy_from_slice(&304i32.to_ne_bytes());
        bytes[layout.max_threads_offset..layout.max_threads_offset + 4]
            .copy_from_slice(&1024i32.to_ne_bytes());
        bytes
    }

    #[test]
    fn both_layouts_yield_name_and_target() {
        for layout in [PROPERTIES_R0600, PROPERTIES_R0000] {
            let bytes = properties(layout, "AMD Instinct MI300X", b"gfx942:sramecc+:xnack-");
            let info = read_properties(&bytes, layout, 3).unwrap();
            assert_eq!(info.ordinal, 3);
            assert_eq!(info.name, "AMD Instinct MI300X");
            assert_eq!(info.compute_units, 304);
            assert_eq!(info.max_threads_per_block, 1024);
            assert_eq!(info.target.to_string(), "gfx942:sramecc+:xnack-");
        }
    }

    #[test]
    fn layouts_fit_the_buffer_and_their_strings_fit_the_struct() {
        for layout in [PROPERTIES_R0600, PROPERTIES_R0000] {
            assert!(layout.arch_offset + PROPERTY_STRING_LEN <= layout.size);
            assert!(layout.max_threads_offset + 4 <= layout.size);
            assert!(layout.size <= PROPERTIES_BUFFER_WORDS * 8);
        }
    }

    #[test]
    fn unusable_targets_are_refused_with_the_device_name() {
        let layout = PROPERTIES_R0600;
        let cases: [(&[u8], &str); 3] = [
            (b"", "target ``"),
            (b"gfx9999", "target `gfx9999`"),
            (b"sm_90", "not an AMD target"),
        ];
        for (arch, expected) in cases {
            let error = read_properties(&properties(layout, "GPU", arch), layout, 0).unwrap_err();
            assert!(error.starts_with("(GPU)"), "{error}");
            assert!(error.contains(expected), "{error}");
        }
        let unterminated = properties(layout, "GPU", &[b'x'; PROPERTY_STRING_LEN]);
        let error = read_properties(&unterminated, layout, 0).unwrap_err();
        assert!(error.contains("byte 1160"), "{error}");
        let error = read_properties(&[0u8; 100], layout, 0).unwrap_err();
        assert!(error.contains("gcnArchName"), "{error}");
    }

    #[test]
    fn code_images_keep_every_byte() {
        for len in [0, 1, 7, 8, 9, 4100] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let image = CodeImage::new(&bytes);
            assert_eq!(image.len, len);
            assert_eq!(image.as_ptr() as usize % 8, 0);
            let back: Vec<u8> = image.words.iter().flat_map(|w| w.to_ne_bytes()).collect();
            assert_eq!(&back[..len], &bytes[..]);
        }
    }

    #[test]
    fn a_missing_library_is_unavailable_and_names_what_was_tried() {
        let error = HipDriver::open(&["/nonexistent/libamdhip64.so"]).unwrap_err();
        let DriverError::Unavailable { api, detail } = &error else {
            panic!("expected Unavailable, got {error:?}");
        };
        assert_eq!(*api, "hip");
        assert!(detail.contains("/nonexistent/libamdhip64.so"), "{detail}");
        assert!(detail.contains("LD_LIBRARY_PATH"), "{detail}");
    }

    #[test]
    fn a_library_without_the_entry_points_is_unavailable() {
        // libc loads anywhere and has no HIP entry points.
        let error = HipDriver::open(&["libc.so.6"]).unwrap_err();
        let DriverError::Unavailable { detail, .. } = &error else {
            panic!("expected Unavailable, got {error:?}");
        };
        assert!(
            detail.contains("libc.so.6 has no entry point hip"),
            "{detail}"
        );
    }
}
