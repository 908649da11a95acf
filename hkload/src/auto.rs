//! Choosing a GPU without naming an API: [`first_device`] tries each backend compiled in, CUDA
//! first, then HIP, and returns the first device of the first backend that has one;
//! [`first_driver`] returns that backend itself, for programs that open several of its devices.

use std::sync::Arc;

use crate::device::Device;
use crate::driver::{Driver, DriverError};
use crate::error::{Error, Result};

/// Opens one backend and returns its first device.
type Backend = fn() -> Result<Device>;

/// The backends compiled in, by API name, in the order they are tried.
const BACKENDS: &[(&str, Backend)] = &[
    #[cfg(feature = "cuda")]
    ("cuda", || {
        first_device_of(std::sync::Arc::new(crate::driver::CudaDriver::new()?))
    }),
    #[cfg(feature = "hip")]
    ("hip", || {
        first_device_of(std::sync::Arc::new(crate::driver::HipDriver::new()?))
    }),
];

/// The first GPU of the first backend that has one: CUDA (feature `cuda`), then HIP (feature
/// `hip`).
///
/// When none has a GPU, the error is [`DriverError::NoDevice`] with the reason of every
/// backend tried, one per line:
///
/// ```text
/// hkload found no GPU: tried cuda, then hip:
///   cuda is not available: the NVIDIA driver's CUDA library (libcuda.so.1) is not on …
///   hip found no GPU: hipGetDeviceCount reports hipErrorNoDevice (libamdhip64.so, HIP 5.2); …
/// ```
pub fn first_device() -> Result<Device> {
    first_of_backends()
}

/// The driver of [`first_device`]: the first backend that has a GPU, with the same error when
/// none has. Open its devices with [`Device::new`]; they share the one driver instance.
pub fn first_driver() -> Result<Arc<dyn Driver>> {
    first_of_backends().map(|device| device.driver().clone())
}

fn first_of_backends() -> Result<Device> {
    let mut reasons = String::new();
    for (_, open) in BACKENDS {
        match open() {
            Ok(device) => return Ok(device),
            Err(error) => reasons.push_str(&format!("\n  {error}")),
        }
    }
    let names: Vec<&str> = BACKENDS.iter().map(|(name, _)| *name).collect();
    Err(Error::Driver(DriverError::NoDevice {
        api: "hkload",
        detail: if names.is_empty() {
            "this build of hkload has no GPU backend; enable its `cuda` or `hip` feature".into()
        } else {
            format!("tried {}:{reasons}", names.join(", then "))
        },
    }))
}

#[cfg(any(feature = "cuda", feature = "hip"))]
fn first_device_of(driver: std::sync::Arc<dyn crate::driver::Driver>) -> Result<Device> {
    let ordinal = driver
        .devices()?
        .first()
        .map(|device| device.ordinal)
        .ok_or(DriverError::NoDevice {
            api: driver.api(),
            detail: "the driver lists no device".into(),
        })?;
    Device::new(driver, ordinal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_names_every_backend_tried() {
        // Without a GPU (CI), every compiled-in backend must explain itself; with one, the
        // device found must come from a compiled-in backend.
        match first_device() {
            Ok(device) => assert!(["cuda", "hip"].contains(&device.driver().api())),
            Err(Error::Driver(DriverError::NoDevice { api, detail })) => {
                assert_eq!(api, "hkload");
                if BACKENDS.is_empty() {
                    assert!(detail.contains("`cuda` or `hip` feature"), "{detail}");
                }
                let tried: &[&str] = &[
                    #[cfg(feature = "cuda")]
                    "cuda ",
                    #[cfg(feature = "hip")]
                    "hip ",
                ];
                for backend in tried {
                    assert!(
                        detail.contains(&format!("\n  {backend}")),
                        "{backend}: {detail}"
                    );
                }
            }
            Err(other) => panic!("expected NoDevice, got {other}"),
        }
    }
}
