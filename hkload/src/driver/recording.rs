//! A driver that pretends to be GPUs of any target IDs and records what it is asked to do:
//! which code images were loaded where, and every launch with its packed argument bytes.
//! Memory is plain host memory, so uploads read back; kernels do not run.
//!
//! It is a [`Vendor`] like CUDA and HIP, so the driver flow's bookkeeping (handle tables,
//! zero-byte allocations, empty copies, the errors for stale handles) is the same one a test
//! on it exercises.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::tables::Tables;
use super::vendor::{Found, Image, Launch, Vendor};
use super::{
    DeviceInfo, DevicePtr, DriverError, FunctionHandle, ImageKind, LaunchDims, ModuleHandle,
    StreamHandle,
};
use crate::target::TargetId;

/// Something the recording driver was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    Load {
        device: usize,
        kind: ImageKind,
        image: Vec<u8>,
        module: ModuleHandle,
    },
    Unload {
        module: ModuleHandle,
    },
    Launch {
        device: usize,
        kernel: String,
        dims: LaunchDims,
        stream: StreamHandle,
        args: Vec<u8>,
    },
}

/// The compute units every simulated device reports (an MI300X's 304; an H100 SXM has 132).
pub const SIMULATED_COMPUTE_UNITS: u32 = 304;

/// The most threads a block may have on every simulated device, unless
/// [`RecordingDriver::with_max_threads_per_block`] says otherwise: what CUDA and HIP report for
/// every GPU hkload supports.
pub const SIMULATED_MAX_THREADS_PER_BLOCK: u32 = 1024;

/// A stand-in GPU driver for tests. See the module docs.
pub struct RecordingDriver {
    state: Mutex<State>,
    /// Functions are kept with their kernel's name, for the log.
    tables: Tables<(), String>,
}

#[derive(Debug, Default)]
struct State {
    log: Vec<Recorded>,
    next_handle: u64,
    /// Allocations by base address.
    memory: HashMap<u64, Vec<u8>>,
}

impl std::fmt::Debug for RecordingDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingDriver")
            .field("devices", &self.tables.devices())
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl RecordingDriver {
    /// One simulated device per target ID, with ordinals in the given order.
    pub fn new(targets: impl IntoIterator<Item = TargetId>) -> Self {
        let devices = targets
            .into_iter()
            .enumerate()
            .map(|(ordinal, target)| DeviceInfo {
                ordinal,
                name: format!("simulated {target}"),
                target,
                compute_units: SIMULATED_COMPUTE_UNITS,
                shared_memory_per_block: target.shared_memory_per_block(),
                max_threads_per_block: SIMULATED_MAX_THREADS_PER_BLOCK,
            })
            .collect();
        Self {
            state: Mutex::new(State {
                next_handle: 1,
                ..State::default()
            }),
            tables: Tables::new(devices),
        }
    }

    /// The same devices reporting `threads` as the most a block may have, as a driver may
    /// for a device (or a partition of one) smaller than the code objects assume.
    pub fn with_max_threads_per_block(mut self, threads: u32) -> Self {
        for device in self.tables.devices_mut() {
            device.max_threads_per_block = threads;
        }
        self
    }

    /// Everything recorded so far, in order.
    pub fn log(&self) -> Vec<Recorded> {
        self.lock().log.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the log half-updated in a way that
        // matters to a test, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn call_error(call: &'static str, detail: String) -> DriverError {
    DriverError::Call { call, detail }
}

impl State {
    fn handle(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }

    /// The allocation holding `len` bytes at `ptr`, and the offset of `ptr` within it.
    fn region(&mut self, ptr: DevicePtr, len: usize) -> Result<(&mut Vec<u8>, usize), DriverError> {
        let (base, bytes) = self
            .memory
            .iter_mut()
            .find(|(base, bytes)| ptr.0 >= **base && ptr.0 - **base < bytes.len() as u64)
            .ok_or_else(|| call_error("copy", format!("{:#x} is not allocated", ptr.0)))?;
        let offset = (ptr.0 - base) as usize;
        if offset + len > bytes.len() {
            return Err(call_error(
                "copy",
                format!("{len} bytes at {:#x} run past the allocation", ptr.0),
            ));
        }
        Ok((bytes, offset))
    }
}

impl Vendor for RecordingDriver {
    const API: &'static str = "recording";
    const DEVICE: &'static str = "simulated";
    const GPUS: &'static str = "a simulated GPU";
    const IMAGES: &'static [ImageKind] =
        &[ImageKind::AmdCodeObject, ImageKind::Cubin, ImageKind::Ptx];
    type Module = ();
    type Function = String;

    fn tables(&self) -> &Tables<(), String> {
        &self.tables
    }

    /// A simulated device has nothing to make current; the ordinal is checked all the same.
    fn make_current(&self, device: usize) -> Result<(), DriverError> {
        if device < self.tables.devices().len() {
            return Ok(());
        }
        let detail = format!(
            "no device {device}; there are {}",
            self.tables.devices().len()
        );
        Err(call_error("device", detail))
    }

    unsafe fn module_load(&self, image: Image<'_>) -> Result<(ModuleHandle, ()), DriverError> {
        let mut state = self.lock();
        let module = ModuleHandle(state.handle());
        state.log.push(Recorded::Load {
            device: image.device,
            kind: image.kind,
            image: image.bytes.to_vec(),
            module,
        });
        Ok((module, ()))
    }

    unsafe fn module_unload(&self, module: ModuleHandle, (): ()) -> Result<(), DriverError> {
        self.lock().log.push(Recorded::Unload { module });
        Ok(())
    }

    unsafe fn module_get_function(
        &self,
        _: ModuleHandle,
        name: &CStr,
    ) -> Result<Found<String>, DriverError> {
        let function = FunctionHandle(self.lock().handle());
        Ok((function, name.to_string_lossy().into_owned()))
    }

    unsafe fn launch_kernel(
        &self,
        launch: &Launch<'_>,
        kernel: &String,
    ) -> Result<(), DriverError> {
        self.lock().log.push(Recorded::Launch {
            device: launch.device,
            kernel: kernel.clone(),
            dims: *launch.dims,
            stream: launch.stream,
            args: launch.args.to_vec(),
        });
        Ok(())
    }

    fn mem_alloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        let mut state = self.lock();
        // Distinct, 256-byte-aligned fake addresses, as real allocators give.
        let base = state.handle() << 32;
        state.memory.insert(base, vec![0; bytes]);
        Ok(DevicePtr(base))
    }

    fn mem_free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.lock()
            .memory
            .remove(&ptr.0)
            .map(drop)
            .ok_or_else(|| call_error("free", format!("{:#x} is not allocated", ptr.0)))
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        let mut state = self.lock();
        let (bytes, offset) = state.region(dst, src.len())?;
        bytes[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), DriverError> {
        let mut state = self.lock();
        let (bytes, offset) = state.region(src, dst.len())?;
        dst.copy_from_slice(&bytes[offset..offset + dst.len()]);
        Ok(())
    }

    fn device_synchronize(&self) -> Result<(), DriverError> {
        Ok(())
    }
}
