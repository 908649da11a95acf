//! A driver that pretends to be GPUs of any target IDs and records what it is asked to do:
//! which code images were loaded where, and every launch with its packed argument bytes.
//! Memory is plain host memory, so uploads read back; kernels do not run.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{
    DeviceInfo, DevicePtr, Driver, DriverError, FunctionHandle, ImageKind, LaunchDims,
    ModuleHandle, StreamHandle,
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
#[derive(Debug)]
pub struct RecordingDriver {
    targets: Vec<TargetId>,
    max_threads_per_block: u32,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    log: Vec<Recorded>,
    next_handle: u64,
    /// Live modules: which device each is on.
    modules: HashMap<u64, usize>,
    /// Functions: their module and symbol name.
    functions: HashMap<u64, (u64, String)>,
    /// Allocations by base address.
    memory: HashMap<u64, Vec<u8>>,
}

impl RecordingDriver {
    /// One simulated device per target ID, with ordinals in the given order.
    pub fn new(targets: impl IntoIterator<Item = TargetId>) -> Self {
        Self {
            targets: targets.into_iter().collect(),
            max_threads_per_block: SIMULATED_MAX_THREADS_PER_BLOCK,
            state: Mutex::new(State {
                next_handle: 1,
                ..State::default()
            }),
        }
    }

    /// The same devices reporting `threads` as the most a block may have, as a driver may
    /// for a device (or a partition of one) smaller than the code objects assume.
    pub fn with_max_threads_per_block(mut self, threads: u32) -> Self {
        self.max_threads_per_block = threads;
        self
    }

    /// Everything recorded so far, in order.
    pub fn log(&self) -> Vec<Recorded> {
        self.lock().log.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the log half-updated in a way that
        // matters to a test, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_device(&self, device: usize) -> Result<(), DriverError> {
        if device < self.targets.len() {
            Ok(())
        } else {
            Err(call_error(
                "device",
                format!("no device {device}; there are {}", self.targets.len()),
            ))
        }
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
            .find(|(base, bytes)| ptr.0 >= **base && ptr.0 - **base < bytes.len().max(1) as u64)
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

impl Driver for RecordingDriver {
    fn api(&self) -> &'static str {
        "recording"
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>, DriverError> {
        Ok(self
            .targets
            .iter()
            .enumerate()
            .map(|(ordinal, target)| DeviceInfo {
                ordinal,
                name: format!("simulated {target}"),
                target: *target,
                compute_units: SIMULATED_COMPUTE_UNITS,
                shared_memory_per_block: target.shared_memory_per_block(),
                max_threads_per_block: self.max_threads_per_block,
            })
            .collect())
    }

    fn load_module(
        &self,
        device: usize,
        kind: ImageKind,
        image: &[u8],
    ) -> Result<ModuleHandle, DriverError> {
        self.check_device(device)?;
        let mut state = self.lock();
        let module = ModuleHandle(state.handle());
        state.modules.insert(module.0, device);
        state.log.push(Recorded::Load {
            device,
            kind,
            image: image.to_vec(),
            module,
        });
        Ok(module)
    }

    fn unload_module(&self, module: ModuleHandle) -> Result<(), DriverError> {
        let mut state = self.lock();
        state
            .modules
            .remove(&module.0)
            .ok_or_else(|| call_error("unload_module", format!("no module {}", module.0)))?;
        state.functions.retain(|_, (m, _)| *m != module.0);
        state.log.push(Recorded::Unload { module });
        Ok(())
    }

    fn function(&self, module: ModuleHandle, name: &str) -> Result<FunctionHandle, DriverError> {
        let mut state = self.lock();
        if !state.modules.contains_key(&module.0) {
            return Err(call_error("function", format!("no module {}", module.0)));
        }
        let function = FunctionHandle(state.handle());
        state
            .functions
            .insert(function.0, (module.0, name.to_owned()));
        Ok(function)
    }

    fn launch(
        &self,
        function: FunctionHandle,
        dims: &LaunchDims,
        stream: StreamHandle,
        args: &[u8],
    ) -> Result<(), DriverError> {
        let mut state = self.lock();
        let (module, kernel) = state
            .functions
            .get(&function.0)
            .cloned()
            .ok_or_else(|| call_error("launch", format!("no function {}", function.0)))?;
        let device = state.modules[&module];
        state.log.push(Recorded::Launch {
            device,
            kernel,
            dims: *dims,
            stream,
            args: args.to_vec(),
        });
        Ok(())
    }

    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.check_device(device)?;
        let mut state = self.lock();
        // Distinct, 256-byte-aligned fake addresses, as real allocators give.
        let base = state.handle() << 32;
        state.memory.insert(base, vec![0; bytes]);
        Ok(DevicePtr(base))
    }

    fn free(&self, _device: usize, ptr: DevicePtr) -> Result<(), DriverError> {
        self.lock()
            .memory
            .remove(&ptr.0)
            .map(drop)
            .ok_or_else(|| call_error("free", format!("{:#x} is not allocated", ptr.0)))
    }

    fn copy_to_device(&self, device: usize, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        self.check_device(device)?;
        let mut state = self.lock();
        let (bytes, offset) = state.region(dst, src.len())?;
        bytes[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn copy_to_host(
        &self,
        device: usize,
        dst: &mut [u8],
        src: DevicePtr,
    ) -> Result<(), DriverError> {
        self.check_device(device)?;
        let mut state = self.lock();
        let (bytes, offset) = state.region(src, dst.len())?;
        dst.copy_from_slice(&bytes[offset..offset + dst.len()]);
        Ok(())
    }

    fn synchronize(&self, device: usize) -> Result<(), DriverError> {
        self.check_device(device)
    }
}
