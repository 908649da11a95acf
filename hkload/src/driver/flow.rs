//! The one driver flow: [`Driver`] for every [`Vendor`], so that CUDA, HIP and the recording
//! driver keep their handle tables, make the device current, allocate, copy and launch the same
//! way, and a test on the recording driver exercises the bookkeeping a GPU run relies on.
//!
//! What the flow refuses without calling the API (another vendor's image, a handle its tables
//! do not hold, a kernel name with a NUL byte) is reported under the name of the [`Driver`]
//! method that refused.
//!
//! Locks are taken in one order, the modules before the functions, and a vendor takes none of
//! the flow's: a lookup holds the modules while it calls the API, so that no unload can race
//! it, and a launch holds the functions for reading until its call returns.

use std::collections::hash_map::Entry;
use std::ffi::CString;

use super::tables::{LoadedFunction, LoadedModule};
use super::vendor::{Image, Launch, Vendor, doing};
use super::{
    DeviceInfo, DevicePtr, Driver, DriverError, FunctionHandle, ImageKind, LaunchDims,
    ModuleHandle, StreamHandle,
};

impl<V: Vendor> Driver for V {
    fn api(&self) -> &'static str {
        V::API
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>, DriverError> {
        Ok(self.tables().devices().to_vec())
    }

    fn load_module(
        &self,
        device: usize,
        kind: ImageKind,
        image: &[u8],
    ) -> Result<ModuleHandle, DriverError> {
        let (maker, form) = describe_image(kind);
        if !V::IMAGES.contains(&kind) {
            return Err(DriverError::Call {
                call: "load_module",
                detail: format!(
                    "an {maker} {form} cannot run on {} ({})",
                    V::GPUS,
                    self.describe_device(device)
                ),
            });
        }
        self.make_current(device)?;
        let what = || {
            let on = self.describe_device(device);
            format!("loading a {}-byte {form} on {on}", image.len())
        };
        let image = Image {
            device,
            kind,
            bytes: image,
            what: &what,
        };
        // SAFETY: what the vendor keeps goes into the table with the module, and leaves it only
        // for `module_unload` (in `unload_module`).
        let (module, kept) = unsafe { self.module_load(image) }?;
        self.tables()
            .modules()
            .insert(module.0, LoadedModule { device, kept });
        Ok(module)
    }

    fn unload_module(&self, module: ModuleHandle) -> Result<(), DriverError> {
        let mut modules = self.tables().modules();
        let Entry::Occupied(entry) = modules.entry(module.0) else {
            return Err(unknown_module("unload_module", module));
        };
        // Before the module leaves the table, so that it stays whole if this fails.
        self.make_current(entry.get().device)?;
        let LoadedModule { kept, .. } = entry.remove();
        self.tables()
            .functions_mut()
            .retain(|_, function| function.module != module.0);
        // SAFETY: the module was live (it was in the table, which stays locked) and no function
        // of it remains to be launched.
        unsafe { self.module_unload(module, kept) }
    }

    fn function(&self, module: ModuleHandle, name: &str) -> Result<FunctionHandle, DriverError> {
        let modules = self.tables().modules();
        let device = modules
            .get(&module.0)
            .ok_or_else(|| unknown_module("function", module))?
            .device;
        let symbol = CString::new(name).map_err(|_| DriverError::Call {
            call: "function",
            detail: format!("the kernel name {name:?} holds a NUL byte"),
        })?;
        self.make_current(device)?;
        // SAFETY: the module is live: it is in the table, whose lock is held.
        let (function, state) =
            unsafe { self.module_get_function(module, &symbol) }.map_err(doing(|| {
                let on = self.describe_device(device);
                format!("looking up kernel `{name}` in its module on {on}")
            }))?;
        let entry = LoadedFunction {
            device,
            module: module.0,
            state,
        };
        self.tables().functions_mut().insert(function.0, entry);
        Ok(function)
    }

    fn launch(
        &self,
        function: FunctionHandle,
        dims: &LaunchDims,
        stream: StreamHandle,
        args: &[u8],
    ) -> Result<(), DriverError> {
        let functions = self.tables().functions();
        let entry = functions
            .get(&function.0)
            .ok_or_else(|| unknown_function("launch", function))?;
        self.make_current(entry.device)?;
        let launch = Launch {
            function,
            device: entry.device,
            dims,
            stream,
            args,
        };
        // SAFETY: the function belongs to a live module: it is in the table, which stays
        // read-locked until the launch returns, so no unload can intervene. The stream and the
        // arguments are the caller's, as `Kernel::launch`'s contract requires.
        unsafe { self.prepare_launch(&launch, &entry.state) }?;
        // SAFETY: as above.
        let launched = unsafe { self.launch_kernel(&launch, &entry.state) };
        drop(functions);
        launched.map_err(doing(|| describe_launch(dims, args)))
    }

    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr, DriverError> {
        // cuMemAlloc refuses zero bytes; a null pointer stands for an empty allocation on every
        // API, and `free` and the copies accept it.
        if bytes == 0 {
            return Ok(DevicePtr(0));
        }
        self.make_current(device)?;
        self.mem_alloc(bytes).map_err(doing(|| {
            let on = self.describe_device(device);
            format!("allocating {bytes} bytes on {on}")
        }))
    }

    fn free(&self, device: usize, ptr: DevicePtr) -> Result<(), DriverError> {
        if ptr.0 == 0 {
            return Ok(());
        }
        self.make_current(device)?;
        self.mem_free(ptr).map_err(doing(|| {
            let on = self.describe_device(device);
            format!("freeing {:#x} on {on}", ptr.0)
        }))
    }

    fn copy_to_device(&self, device: usize, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        if src.is_empty() {
            return Ok(());
        }
        self.make_current(device)?;
        self.memcpy_htod(dst, src).map_err(doing(|| {
            let on = self.describe_device(device);
            format!("copying {} bytes to {:#x} on {on}", src.len(), dst.0)
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
        self.memcpy_dtoh(dst, src).map_err(doing(|| {
            let on = self.describe_device(device);
            format!("copying {len} bytes from {:#x} on {on}", src.0)
        }))
    }

    fn synchronize(&self, device: usize) -> Result<(), DriverError> {
        self.make_current(device)?;
        self.device_synchronize().map_err(doing(|| {
            let on = self.describe_device(device);
            format!("waiting for {on} (an earlier launch may have failed)")
        }))
    }
}

/// Whose a form of code image is, and what messages call it: `("NVIDIA", "PTX text")`.
fn describe_image(kind: ImageKind) -> (&'static str, &'static str) {
    match kind {
        ImageKind::AmdCodeObject => ("AMD", "code object"),
        ImageKind::Cubin => ("NVIDIA", "cubin"),
        ImageKind::Ptx => ("NVIDIA", "PTX text"),
    }
}

/// The error for a module the driver's tables do not hold.
fn unknown_module(call: &'static str, module: ModuleHandle) -> DriverError {
    DriverError::Call {
        call,
        detail: format!(
            "module {:#x} was not loaded by this driver, or is unloaded",
            module.0
        ),
    }
}

/// The error for launching a function the driver's tables do not hold.
fn unknown_function(call: &'static str, function: FunctionHandle) -> DriverError {
    DriverError::Call {
        call,
        detail: format!(
            "function {:#x} was not looked up through this driver, or its module is unloaded",
            function.0
        ),
    }
}

/// What a failed launch was doing, for [`doing`].
fn describe_launch(dims: &LaunchDims, args: &[u8]) -> String {
    format!(
        "launching grid {:?}, block {:?}, {} bytes of dynamic shared memory, {} bytes of \
         arguments",
        dims.grid,
        dims.block,
        dims.shared_bytes,
        args.len()
    )
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;
    use std::sync::Mutex;

    use super::*;
    use crate::driver::tables::Tables;
    use crate::driver::vendor::Found;

    /// A vendor that writes down each call it gets, failing the one named in `failing`: the
    /// order in which the flow calls CUDA and HIP, seen without a GPU.
    struct Script {
        tables: Tables<(), ()>,
        calls: Mutex<Vec<String>>,
        failing: Mutex<&'static str>,
    }

    impl Script {
        fn new() -> Self {
            let device = DeviceInfo {
                ordinal: 0,
                name: "GPU".into(),
                target: "sm_90".parse().unwrap(),
                compute_units: 1,
                shared_memory_per_block: 1,
                max_threads_per_block: 1,
            };
            Self {
                tables: Tables::new(vec![device]),
                calls: Mutex::default(),
                failing: Mutex::new(""),
            }
        }

        fn call(&self, call: &'static str, what: String) -> Result<(), DriverError> {
            self.calls.lock().unwrap().push(what);
            match *self.failing.lock().unwrap() == call {
                true => Err(DriverError::Call {
                    call,
                    detail: "SCRIPTED_ERROR".into(),
                }),
                false => Ok(()),
            }
        }

        fn fail(&self, call: &'static str) {
            *self.failing.lock().unwrap() = call;
        }

        fn take_calls(&self) -> Vec<String> {
            std::mem::take(&mut self.calls.lock().unwrap())
        }
    }

    impl Vendor for Script {
        const API: &'static str = "script";
        const DEVICE: &'static str = "scripted";
        const GPUS: &'static str = "an NVIDIA GPU";
        const IMAGES: &'static [ImageKind] = &[ImageKind::Cubin];
        type Module = ();
        type Function = ();

        fn tables(&self) -> &Tables<(), ()> {
            &self.tables
        }

        fn make_current(&self, device: usize) -> Result<(), DriverError> {
            self.call("make_current", format!("make_current {device}"))
        }

        unsafe fn module_load(&self, image: Image<'_>) -> Result<(ModuleHandle, ()), DriverError> {
            let what = format!("module_load {} bytes", image.bytes.len());
            self.call("module_load", what).map_err(doing(image.what))?;
            Ok((ModuleHandle(0x100), ()))
        }

        unsafe fn module_unload(&self, module: ModuleHandle, (): ()) -> Result<(), DriverError> {
            self.call("module_unload", format!("module_unload {:#x}", module.0))
        }

        unsafe fn module_get_function(
            &self,
            _: ModuleHandle,
            name: &CStr,
        ) -> Result<Found<()>, DriverError> {
            self.call(
                "module_get_function",
                format!("module_get_function {name:?}"),
            )?;
            Ok((FunctionHandle(0x200), ()))
        }

        unsafe fn prepare_launch(&self, launch: &Launch<'_>, (): &()) -> Result<(), DriverError> {
            let shared = launch.dims.shared_bytes;
            self.call("prepare_launch", format!("prepare_launch {shared}"))
        }

        unsafe fn launch_kernel(&self, launch: &Launch<'_>, (): &()) -> Result<(), DriverError> {
            let what = format!("launch_kernel {:#x}", launch.function.0);
            self.call("launch_kernel", what)
        }

        fn mem_alloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
            self.call("mem_alloc", format!("mem_alloc {bytes}"))?;
            Ok(DevicePtr(0x300))
        }

        fn mem_free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
            self.call("mem_free", format!("mem_free {:#x}", ptr.0))
        }

        fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
            self.call(
                "memcpy_htod",
                format!("memcpy_htod {} to {:#x}", src.len(), dst.0),
            )
        }

        fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), DriverError> {
            self.call(
                "memcpy_dtoh",
                format!("memcpy_dtoh {} from {:#x}", dst.len(), src.0),
            )
        }

        fn device_synchronize(&self) -> Result<(), DriverError> {
            self.call("device_synchronize", "device_synchronize".into())
        }
    }

    const DIMS: LaunchDims = LaunchDims {
        grid: [2, 1, 1],
        block: [64, 1, 1],
        shared_bytes: 128,
    };

    /// A driver with module 0x100 loaded and its function 0x200 looked up, calls forgotten.
    fn loaded() -> Script {
        let script = Script::new();
        let module = script.load_module(0, ImageKind::Cubin, &[1, 2, 3]).unwrap();
        script.function(module, "k").unwrap();
        script.take_calls();
        script
    }

    #[test]
    fn each_call_comes_after_its_device_is_made_current() {
        let script = Script::new();
        let module = script.load_module(0, ImageKind::Cubin, &[1, 2, 3]).unwrap();
        let function = script.function(module, "k").unwrap();
        let stream = StreamHandle::DEFAULT;
        script.launch(function, &DIMS, stream, &[0; 8]).unwrap();
        let ptr = script.alloc(0, 16).unwrap();
        script.copy_to_device(0, ptr, &[0; 16]).unwrap();
        script.copy_to_host(0, &mut [0; 16], ptr).unwrap();
        script.synchronize(0).unwrap();
        script.free(0, ptr).unwrap();
        script.unload_module(module).unwrap();
        let expected = [
            "make_current 0",
            "module_load 3 bytes",
            "make_current 0",
            "module_get_function \"k\"",
            "make_current 0",
            "prepare_launch 128",
            "launch_kernel 0x200",
            "make_current 0",
            "mem_alloc 16",
            "make_current 0",
            "memcpy_htod 16 to 0x300",
            "make_current 0",
            "memcpy_dtoh 16 from 0x300",
            "make_current 0",
            "device_synchronize",
            "make_current 0",
            "mem_free 0x300",
            "make_current 0",
            "module_unload 0x100",
        ];
        assert_eq!(script.take_calls(), expected);
    }

    #[test]
    fn empty_allocations_and_copies_call_nothing() {
        let script = Script::new();
        let empty = script.alloc(0, 0).unwrap();
        assert_eq!(empty, DevicePtr(0), "a null pointer stands for no bytes");
        script.copy_to_device(0, empty, &[]).unwrap();
        script.copy_to_host(0, &mut [], empty).unwrap();
        script.free(0, empty).unwrap();
        assert_eq!(script.take_calls(), Vec::<String>::new());
    }

    #[test]
    fn another_vendors_image_is_refused_before_any_call() {
        let script = Script::new();
        let error = script
            .load_module(0, ImageKind::AmdCodeObject, &[0; 4])
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "load_module failed: an AMD code object cannot run on an NVIDIA GPU (scripted device \
             0 (GPU, sm_90))"
        );
        assert_eq!(script.take_calls(), Vec::<String>::new());
    }

    #[test]
    fn stale_handles_and_bad_names_are_refused_without_a_call() {
        let script = loaded();
        let error = script.function(ModuleHandle(0x100), "k\0").unwrap_err();
        assert!(error.to_string().contains("holds a NUL byte"), "{error}");
        assert_eq!(script.take_calls(), Vec::<String>::new());
        script.unload_module(ModuleHandle(0x100)).unwrap();
        script.take_calls();
        let refusals = [
            script.unload_module(ModuleHandle(0x100)).unwrap_err(),
            script.function(ModuleHandle(0x100), "k").unwrap_err(),
            script
                .launch(FunctionHandle(0x200), &DIMS, StreamHandle::DEFAULT, &[])
                .unwrap_err(),
        ];
        assert_eq!(
            refusals.map(|error| error.to_string()),
            [
                "unload_module failed: module 0x100 was not loaded by this driver, or is unloaded",
                "function failed: module 0x100 was not loaded by this driver, or is unloaded",
                "launch failed: function 0x200 was not looked up through this driver, or its \
                 module is unloaded",
            ]
        );
        assert_eq!(script.take_calls(), Vec::<String>::new());
    }

    #[test]
    fn failures_say_what_they_were_doing() {
        let script = loaded();
        let failure = |call| {
            script.fail(call);
            let outcome = match call {
                "module_load" => script.load_module(0, ImageKind::Cubin, &[0; 5]).map(drop),
                "module_get_function" => script.function(ModuleHandle(0x100), "k").map(drop),
                "prepare_launch" | "launch_kernel" => {
                    script.launch(FunctionHandle(0x200), &DIMS, StreamHandle::DEFAULT, &[0; 8])
                }
                "mem_alloc" => script.alloc(0, 8).map(drop),
                "mem_free" => script.free(0, DevicePtr(0x300)),
                "memcpy_htod" => script.copy_to_device(0, DevicePtr(0x300), &[0; 4]),
                "memcpy_dtoh" => script.copy_to_host(0, &mut [0; 4], DevicePtr(0x300)),
                _ => script.synchronize(0),
            };
            let detail = outcome.unwrap_err().to_string();
            detail
                .strip_prefix(&format!("{call} failed: SCRIPTED_ERROR"))
                .unwrap_or_else(|| panic!("{detail}"))
                .to_owned()
        };
        let on = "scripted device 0 (GPU, sm_90)";
        assert_eq!(
            failure("module_load"),
            format!(" while loading a 5-byte cubin on {on}")
        );
        assert_eq!(
            failure("module_get_function"),
            format!(" while looking up kernel `k` in its module on {on}")
        );
        // Preparing is not the launch: its failure is the vendor's own to describe.
        assert_eq!(failure("prepare_launch"), "");
        assert_eq!(
            failure("launch_kernel"),
            " while launching grid [2, 1, 1], block [64, 1, 1], 128 bytes of dynamic shared \
             memory, 8 bytes of arguments"
        );
        assert_eq!(
            failure("mem_alloc"),
            format!(" while allocating 8 bytes on {on}")
        );
        assert_eq!(failure("mem_free"), format!(" while freeing 0x300 on {on}"));
        assert_eq!(
            failure("memcpy_htod"),
            format!(" while copying 4 bytes to 0x300 on {on}")
        );
        assert_eq!(
            failure("memcpy_dtoh"),
            format!(" while copying 4 bytes from 0x300 on {on}")
        );
        assert_eq!(
            failure("device_synchronize"),
            format!(" while waiting for {on} (an earlier launch may have failed)")
        );
    }

    #[test]
    fn a_module_stays_whole_when_its_device_cannot_be_made_current() {
        let script = loaded();
        script.fail("make_current");
        script.unload_module(ModuleHandle(0x100)).unwrap_err();
        script.fail("");
        script
            .launch(FunctionHandle(0x200), &DIMS, StreamHandle::DEFAULT, &[])
            .unwrap();
        script.unload_module(ModuleHandle(0x100)).unwrap();
    }
}
