//! A GPU as hkload uses it: a driver and one of its devices, and device memory that knows its
//! element type so launches can check pointer arguments.

use std::sync::Arc;

use crate::abi::ScalarType;
use crate::driver::{DeviceInfo, DevicePtr, Driver};
use crate::error::{Error, Result};
use crate::target::TargetId;

/// One device of one driver. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    driver: Arc<dyn Driver>,
    info: DeviceInfo,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("api", &self.driver.api())
            .field("info", &self.info)
            .finish()
    }
}

impl Device {
    /// Device `ordinal` of `driver`.
    pub fn new(driver: Arc<dyn Driver>, ordinal: usize) -> Result<Self> {
        let devices = driver.devices()?;
        let count = devices.len();
        let info =
            devices
                .into_iter()
                .find(|d| d.ordinal == ordinal)
                .ok_or(Error::NoSuchDevice {
                    api: driver.api(),
                    ordinal,
                    count,
                })?;
        Ok(Self { driver, info })
    }

    pub fn target(&self) -> &TargetId {
        &self.info.target
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn ordinal(&self) -> usize {
        self.info.ordinal
    }

    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// Device memory for `len` elements of `elem`, uninitialised.
    pub fn alloc(&self, elem: ScalarType, len: usize) -> Result<DeviceBuffer> {
        let bytes = len.checked_mul(elem.size() as usize).ok_or_else(|| {
            Error::Driver(crate::driver::DriverError::Call {
                call: "alloc",
                detail: format!("{len} elements of {elem} overflow the address space"),
            })
        })?;
        let ptr = self.driver.alloc(self.ordinal(), bytes)?;
        Ok(DeviceBuffer {
            device: self.clone(),
            ptr,
            elem,
            len,
        })
    }

    /// Device memory holding `bytes`, read as elements of `elem`.
    pub fn upload(&self, elem: ScalarType, bytes: &[u8]) -> Result<DeviceBuffer> {
        let buffer = self.alloc(elem, bytes.len() / elem.size() as usize)?;
        buffer.write(bytes)?;
        Ok(buffer)
    }

    /// Waits for all work queued on the device.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.driver.synchronize(self.ordinal())?)
    }
}

/// Device memory holding `len` elements of one scalar type; freed on drop.
pub struct DeviceBuffer {
    device: Device,
    ptr: DevicePtr,
    elem: ScalarType,
    len: usize,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer({} x {} at {:#x})",
            self.len, self.elem, self.ptr.0
        )
    }
}

impl DeviceBuffer {
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn elem(&self) -> ScalarType {
        self.elem
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn device(&self) -> usize {
        self.device.ordinal()
    }

    /// The driver instance the memory belongs to.
    pub(crate) fn driver(&self) -> &Arc<dyn Driver> {
        self.device.driver()
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len * self.elem.size() as usize
    }

    /// Copies `bytes` (exactly [`Self::byte_len`] of them) into the buffer.
    pub fn write(&self, bytes: &[u8]) -> Result<()> {
        self.check_len(bytes.len())?;
        Ok(self
            .device
            .driver
            .copy_to_device(self.device(), self.ptr, bytes)?)
    }

    /// Copies the buffer's contents into `bytes` (exactly [`Self::byte_len`] of them).
    pub fn read(&self, bytes: &mut [u8]) -> Result<()> {
        self.check_len(bytes.len())?;
        Ok(self
            .device
            .driver
            .copy_to_host(self.device(), bytes, self.ptr)?)
    }

    /// The buffer's contents as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut bytes = vec![0; self.byte_len()];
        self.read(&mut bytes)?;
        Ok(bytes)
    }

    fn check_len(&self, found: usize) -> Result<()> {
        if found == self.byte_len() {
            return Ok(());
        }
        Err(Error::Driver(crate::driver::DriverError::Call {
            call: "copy",
            detail: format!(
                "the buffer holds {} bytes ({} x {}) but the host side has {found}",
                self.byte_len(),
                self.len,
                self.elem
            ),
        }))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Kernels run asynchronously: wait for the work queued so far, which may still use
        // this memory, before freeing it, so that a checked `Kernel::call` can be safe. (CUDA
        // documents only that cuMemFree *may* synchronise.)
        // Nothing useful can be done with a failure here; the driver reports it on its next
        // call if the context is broken.
        let _ = self.device.driver.synchronize(self.device());
        let _ = self.device.driver.free(self.device(), self.ptr);
    }
}
