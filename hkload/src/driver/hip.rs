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
//! `hipFunction_t`, a [`StreamHandle`](super::StreamHandle) a `hipStream_t` (0 is the default
//! stream) and a [`DevicePtr`] a device address.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;

use libloading::Library;

use super::packed_args::{ExtraMarkers, LaunchKernelFn, launch_packed};
use super::tables::Tables;
use super::vendor::{Found, Image, Launch, Vendor, doing};
use super::{DeviceInfo, DevicePtr, DriverError, FunctionHandle, ImageKind, ModuleHandle};
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
    module_launch_kernel: LaunchKernelFn<RawFunction, *mut c_void, Status>,
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
    tables: Tables<CodeImage, ()>,
}

impl std::fmt::Debug for HipDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipDriver")
            .field("library", &self.library)
            .field("version", &self.version)
            .field("devices", &self.tables.devices())
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
            tables: Tables::new(devices),
        })
    }

    /// The HIP version of the runtime, e.g. `(6, 2)`.
    pub fn runtime_version(&self) -> (u32, u32) {
        self.version
    }
}

impl Vendor for HipDriver {
    const API: &'static str = API;
    const DEVICE: &'static str = "HIP";
    const GPUS: &'static str = "an AMD GPU";
    const IMAGES: &'static [ImageKind] = &[ImageKind::AmdCodeObject];
    /// The code object CLR reads in place, kept until the module is unloaded.
    type Module = CodeImage;
    type Function = ();

    fn tables(&self) -> &Tables<CodeImage, ()> {
        &self.tables
    }

    fn make_current(&self, device: usize) -> Result<(), DriverError> {
        let ordinal = c_int::try_from(device)
            .ok()
            .filter(|_| device < self.tables.devices().len())
            .ok_or_else(|| DriverError::Call {
                call: "hipSetDevice",
                detail: format!(
                    "there is no HIP device {device}; the runtime sees {}",
                    self.tables.devices().len()
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

    unsafe fn module_load(
        &self,
        image: Image<'_>,
    ) -> Result<(ModuleHandle, CodeImage), DriverError> {
        let code = CodeImage::new(image.bytes);
        let mut module = ptr::null_mut();
        // SAFETY: `code` holds a copy of the code object that the caller keeps, unmoved, until
        // the module is unloaded (CLR reads it in place); CLR finds its size in its ELF headers
        // and rejects what is not a code object with an error.
        self.api
            .check("hipModuleLoadData", unsafe {
                (self.api.module_load_data)(&mut module, code.as_ptr())
            })
            .map_err(doing(image.what))?;
        Ok((ModuleHandle(module as u64), code))
    }

    unsafe fn module_unload(
        &self,
        module: ModuleHandle,
        code: CodeImage,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller vouches that the module is live and none of its functions is used
        // again.
        let result = self.api.check("hipModuleUnload", unsafe {
            (self.api.module_unload)(module.0 as RawModule)
        });
        // Only now may the bytes CLR read in place go.
        drop(code);
        result
    }

    unsafe fn module_get_function(
        &self,
        module: ModuleHandle,
        name: &CStr,
    ) -> Result<Found<()>, DriverError> {
        let mut function = ptr::null_mut();
        // SAFETY: the module is live (the caller vouches for it); `name` is NUL-terminated and
        // `function` a valid place to write.
        self.api.check("hipModuleGetFunction", unsafe {
            (self.api.module_get_function)(&mut function, module.0 as RawModule, name.as_ptr())
        })?;
        Ok((FunctionHandle(function as u64), ()))
    }

    unsafe fn launch_kernel(&self, launch: &Launch<'_>, (): &()) -> Result<(), DriverError> {
        // SAFETY: the entry point is hipModuleLaunchKernel; the caller vouches for the function
        // (of a live module, on the device made current), the stream (0, the default stream,
        // or one the caller created on this device) and the arguments.
        let status = unsafe {
            launch_packed(
                self.api.module_launch_kernel,
                &EXTRA_MARKERS,
                launch.function.0 as RawFunction,
                launch.dims,
                launch.stream.as_raw() as *mut c_void,
                launch.args,
            )
        };
        self.api.check("hipModuleLaunchKernel", status)
    }

    fn mem_alloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        let mut ptr = ptr::null_mut();
        // SAFETY: `ptr` is a valid place to write.
        self.api
            .check("hipMalloc", unsafe { (self.api.malloc)(&mut ptr, bytes) })?;
        Ok(DevicePtr(ptr as u64))
    }

    fn mem_free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        // SAFETY: the runtime checks that `ptr` is one of its allocations; a stale or foreign
        // pointer is an error.
        self.api
            .check("hipFree", unsafe { (self.api.free)(ptr.0 as *mut c_void) })
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        let (dst, len) = (dst.0 as *mut c_void, src.len());
        // SAFETY: `src` is valid for its length; the runtime checks the device range.
        self.api.check("hipMemcpy", unsafe {
            (self.api.memcpy)(dst, src.as_ptr().cast(), len, HIP_MEMCPY_HOST_TO_DEVICE)
        })
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), DriverError> {
        let (src, len) = (src.0 as *const c_void, dst.len());
        // SAFETY: `dst` is valid for writes of its length; the runtime checks the device range.
        self.api.check("hipMemcpy", unsafe {
            (self.api.memcpy)(dst.as_mut_ptr().cast(), src, len, HIP_MEMCPY_DEVICE_TO_HOST)
        })
    }

    fn device_synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: no pointers; the device is current.
        self.api.check("hipDeviceSynchronize", unsafe {
            (self.api.device_synchronize)()
        })
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
pub(crate) struct CodeImage {
    words: Box<[u64]>,
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
        Self { words }
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
        for len in [0usize, 1, 7, 8, 9, 4100] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let image = CodeImage::new(&bytes);
            assert_eq!(image.words.len(), len.div_ceil(8));
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
