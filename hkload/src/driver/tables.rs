//! The tables every driver keeps: its devices, which modules are live and on which device, and
//! which functions were looked up in them. The driver flow ([`super::flow`]) decides what goes
//! in and out and which locks are held across which calls; this module only holds the maps.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::DeviceInfo;

/// A table keyed by a handle the vendor API hands out (a function or module pointer), read on
/// every launch.
pub(crate) type HandleMap<V> = HashMap<u64, V, BuildHasherDefault<HandleHasher>>;

/// Hashes handle keys with one folded multiply. SipHash's resistance to chosen keys buys
/// nothing for pointers the driver hands out, and costs several nanoseconds on every launch.
#[derive(Default)]
pub(crate) struct HandleHasher(u64);

impl Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(self.0 ^ u64::from(byte));
        }
    }

    fn write_u64(&mut self, key: u64) {
        // The high half of the product carries every key bit into the low bits that pick the
        // bucket, which aligned pointers would otherwise leave all zero.
        let product = u128::from(key) * 0x9E37_79B9_7F4A_7C15;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

/// The devices, live modules and functions of one driver. `M` is what a vendor keeps with each
/// module until it is unloaded, `F` what it keeps with each function.
pub(crate) struct Tables<M, F> {
    /// The devices, by ordinal.
    devices: Vec<DeviceInfo>,
    /// Live modules by handle. Held while functions are looked up and modules unloaded, so a
    /// lookup cannot race the unload of its module.
    modules: Mutex<HashMap<u64, LoadedModule<M>>>,
    /// Functions of live modules by handle. Read on every launch, and held for its duration so
    /// that an unload (which takes it for writing) cannot pull the function out from under it.
    functions: RwLock<HandleMap<LoadedFunction<F>>>,
}

/// A live module.
pub(crate) struct LoadedModule<M> {
    /// The device it was loaded on.
    pub device: usize,
    /// What the vendor keeps until the module is unloaded.
    pub kept: M,
}

/// A function looked up in a live module.
pub(crate) struct LoadedFunction<F> {
    /// The device of its module.
    pub device: usize,
    /// Its module's handle.
    pub module: u64,
    /// What the vendor keeps with it.
    pub state: F,
}

// The maps are only changed by single inserts, removals and retains, so a panic elsewhere
// cannot leave them half-updated: a poisoned lock is still good.
impl<M, F> Tables<M, F> {
    /// Tables of `devices`, with no module loaded yet.
    pub fn new(devices: Vec<DeviceInfo>) -> Self {
        Self {
            devices,
            modules: Mutex::default(),
            functions: RwLock::default(),
        }
    }

    pub fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    pub fn devices_mut(&mut self) -> &mut [DeviceInfo] {
        &mut self.devices
    }

    pub fn modules(&self) -> MutexGuard<'_, HashMap<u64, LoadedModule<M>>> {
        self.modules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn functions(&self) -> RwLockReadGuard<'_, HandleMap<LoadedFunction<F>>> {
        self.functions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub fn functions_mut(&self) -> RwLockWriteGuard<'_, HandleMap<LoadedFunction<F>>> {
        self.functions
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_hashes_spread_aligned_pointers_over_buckets() {
        let buckets: std::collections::HashSet<u64> = (0..64u64)
            .map(|i| {
                let mut hasher = HandleHasher::default();
                hasher.write_u64(0x7f3a_1200_0000 + i * 4096);
                hasher.finish() % 64
            })
            .collect();
        assert!(buckets.len() >= 32, "{} of 64 buckets used", buckets.len());
    }
}
