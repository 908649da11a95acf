//! The real backends on a machine without a GPU, as in CI: each must say clearly why it cannot
//! run, through the error a user sees, and nothing may panic.
//!
//! Whether the machine has a GPU is judged without hkload, by the device nodes the vendors'
//! kernel drivers create (`/dev/nvidiactl`, `/dev/kfd`). On a machine that has one, the test
//! about that vendor checks the device list instead.

use std::path::Path;

use hk_format::target::Vendor;
use hkload::driver::{Driver, DriverError};

fn has_nvidia_gpu() -> bool {
    Path::new("/dev/nvidiactl").exists()
}

fn has_amd_gpu() -> bool {
    Path::new("/dev/kfd").exists()
}

/// Checks that a driver that did open lists devices of `vendor`.
fn assert_lists_devices(driver: &dyn Driver, vendor: Vendor) {
    let devices = driver
        .devices()
        .expect("an opened driver lists its devices");
    assert!(
        !devices.is_empty(),
        "{} opened with no device",
        driver.api()
    );
    for device in devices {
        assert_eq!(device.target.vendor(), vendor, "{device:?}");
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_says_why_it_cannot_run() {
    use hkload::driver::CudaDriver;
    use hkload::driver::cuda::sys;

    let outcome = CudaDriver::new();
    if has_nvidia_gpu() {
        assert_lists_devices(
            &outcome.expect("the machine has an NVIDIA GPU"),
            Vendor::Nvidia,
        );
        return;
    }
    // SAFETY: probing for libcuda only loads it, as CudaDriver::new just did.
    let library_present = unsafe { sys::is_culib_present() };
    match &outcome {
        Err(DriverError::Unavailable { api, detail }) if !library_present => {
            assert_eq!(*api, "cuda");
            assert!(detail.contains("libcuda.so.1"), "{detail}");
            assert!(detail.contains("LD_LIBRARY_PATH"), "{detail}");
        }
        // A libcuda without the kernel driver (a container's stub, say) fails in cuInit.
        Err(DriverError::Unavailable { detail, .. } | DriverError::NoDevice { detail, .. })
            if library_present =>
        {
            assert!(
                detail.contains("cuInit") || detail.contains("cuDeviceGetCount"),
                "{detail}"
            );
        }
        other => panic!(
            "libcuda {}: unexpected outcome {other:?}",
            if library_present { "present" } else { "absent" }
        ),
    }
    // A second attempt takes the cached path and must say the same, not panic.
    assert_eq!(CudaDriver::new().err(), outcome.err());
}

#[cfg(feature = "hip")]
#[test]
fn hip_says_why_it_cannot_run() {
    use hkload::driver::HipDriver;

    let outcome = HipDriver::new();
    if has_amd_gpu() {
        assert_lists_devices(&outcome.expect("the machine has an AMD GPU"), Vendor::Amd);
        return;
    }
    match &outcome {
        // Debian's libamdhip64 (installed by scripts/setup) loads and finds no GPU.
        Err(DriverError::NoDevice { api, detail }) => {
            assert_eq!(*api, "hip");
            assert!(detail.contains("hipErrorNoDevice"), "{detail}");
            assert!(detail.contains("/dev/kfd"), "{detail}");
        }
        // Without ROCm installed, the library is missing.
        Err(DriverError::Unavailable { api, detail }) => {
            assert_eq!(*api, "hip");
            assert!(detail.contains("libamdhip64"), "{detail}");
            assert!(
                !Path::new("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5").exists(),
                "the runtime is installed, so it should load and report no device: {detail}"
            );
        }
        other => panic!("unexpected outcome {other:?}"),
    }
    assert_eq!(HipDriver::new().err(), outcome.err());
}

#[test]
fn automatic_choice_reports_every_backend() {
    if has_nvidia_gpu() || has_amd_gpu() {
        let device = hkload::auto::first_device().expect("the machine has a GPU");
        assert!(["cuda", "hip"].contains(&device.driver().api()));
        return;
    }
    // From several threads at once, since the first use of each backend initialises state.
    let messages: Vec<String> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| hkload::auto::first_device().map(drop)))
            .collect();
        threads
            .into_iter()
            .map(|thread| match thread.join().expect("no panic") {
                Err(error) => error.to_string(),
                Ok(()) => panic!("found a GPU on a machine without one"),
            })
            .collect()
    });
    let message = &messages[0];
    assert!(messages.iter().all(|m| m == message), "{messages:#?}");
    assert!(message.starts_with("hkload found no GPU: "), "{message}");
    // One line per backend tried, each starting with its name.
    let expected: &[&str] = &[
        #[cfg(feature = "cuda")]
        "cuda ",
        #[cfg(feature = "hip")]
        "hip ",
    ];
    for reason in expected {
        assert!(
            message.contains(&format!("\n  {reason}")),
            "{reason:?} missing from: {message}"
        );
    }
    if expected.is_empty() {
        assert!(message.contains("`cuda` or `hip` feature"), "{message}");
    }
}
