//! hkload opens a kernel bundle built by `hkpack`, picks the code object that runs on the GPU
//! by the same rules as the ROCm runtime (or the CUDA driver), explains that choice on request,
//! loads it, and launches kernels by name with every argument checked against the kernel's
//! ABI before the GPU is touched.
//!
//! # A walk-through
//!
//! **1. Open a bundle.** [`Bundle::open`] reads the bundle's index (`bundle.msgpack`, the
//! binary twin of its `bundle.toml`), checks its format version and its lookup table, and
//! decodes nothing else: the full manifest when [`Bundle::manifest`] asks for it, module
//! files when first used. Nothing touches a GPU or the network. A bundle embedded in the
//! program with `include_bytes!` opens with [`Bundle::from_bytes`].
//!
//! ```no_run
//! let bundle = hkload::Bundle::open("dist/hk-kernels-0.1.0")?;
//! println!("{} kernels", bundle.table().kernel_symbols().count());
//! println!("built by {}", bundle.manifest()?.toolchain.clang);
//! # Ok::<(), hkload::Error>(())
//! ```
//!
//! **2. Ask what would run where.** [`Bundle::explain`] works on any machine: give it a
//! device's full target ID and it tells, for every module, which code object would be chosen
//! and why each other one was passed over.
//!
//! ```no_run
//! # let bundle = hkload::Bundle::open("dist/hk-kernels-0.1.0")?;
//! let mi300x = "gfx942:sramecc+:xnack-".parse()?;
//! print!("{}", bundle.explain(&mi300x));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **3. Open a device and bind the bundle to it.** A [`Device`] is one GPU of a [`Driver`]:
//! CUDA or HIP (cargo features `cuda`, `hip`; [`auto::first_device`] takes the first GPU of
//! either), or the [`RecordingDriver`] that tests use to pretend to be any GPU. [`Bundle::load`] chooses every module's code object for the device
//! and fails right there, with the explanation, if some module has none that can run on it.
//! Modules are then loaded on first use, once, however many threads ask.
//!
//! ```no_run
//! use std::sync::Arc;
//! use hkload::driver::RecordingDriver;
//!
//! # let bundle = hkload::Bundle::open("dist/hk-kernels-0.1.0")?;
//! let driver = Arc::new(RecordingDriver::new(["gfx942:sramecc+:xnack-".parse()?]));
//! let device = hkload::Device::new(driver, 0)?;
//! let kernels = bundle.load(&device)?;
//! kernels.preload()?; // optional: load every module now rather than on first use
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **4. Launch a kernel by name.** [`LoadedBundle::kernel`] finds it; [`Kernel::launch`]
//! checks the arguments against the declared signature and the code object's metadata
//! (count, buffer or value, element type, writability, size, device; block size and shared
//! memory against the kernel's limits), packs them at the offsets the code object gives, and
//! only then calls the driver. A mismatch is a [`LaunchError`] naming the kernel, the argument
//! and what was expected.
//!
//! ```no_run
//! use hkload::abi::ScalarType;
//! use hkload::driver::{LaunchDims, StreamHandle};
//! use hkload::Arg;
//!
//! # let bundle = hkload::Bundle::open("dist/hk-kernels-0.1.0")?;
//! # let device = hkload::Device::new(std::sync::Arc::new(
//! #     hkload::driver::RecordingDriver::new(["sm_90".parse()?])), 0)?;
//! # let kernels = bundle.load(&device)?;
//! let (rows, cols) = (4u32, 4096u32);
//! let n = (rows * cols) as usize;
//! let x = device.upload(ScalarType::Bf16, &vec![0u8; 2 * n])?;
//! let weight = device.upload(ScalarType::Bf16, &vec![0u8; 2 * cols as usize])?;
//! let mut out = device.alloc(ScalarType::Bf16, n)?;
//!
//! let rmsnorm = kernels.kernel("rmsnorm_bf16")?;
//! let args = [Arg::from(&mut out), Arg::from(&x), Arg::from(&weight), Arg::from(1e-6f32),
//!             Arg::from(rows), Arg::from(cols)];
//! // The launch shape is the kernel's own (its source says): for 4096 bf16 columns a team of
//! // 128 lanes a row, in blocks of 128 threads, so a block a row.
//! let dims = LaunchDims::linear(rows, 128);
//! // SAFETY: the buffers hold `rows * cols` and `cols` elements, as the kernel reads them,
//! // and outlive the kernel: `synchronize` waits for it.
//! unsafe { rmsnorm.launch(&dims, StreamHandle::DEFAULT, &args)? };
//! device.synchronize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What this crate does not do
//!
//! It never compiles anything and never touches the network: a bundle that cannot serve the
//! device is refused with an explanation. It links no GPU vendor library at build time; the
//! CUDA and HIP backends load their libraries when first used, so one binary starts on a
//! machine with either vendor's driver, or none.
//!
//! [`Driver`]: driver::Driver
//! [`RecordingDriver`]: driver::RecordingDriver

pub mod abi;
pub mod auto;
pub mod bundle;
#[cfg(feature = "code-object")]
pub mod code_object;
pub mod contract;
pub mod device;
pub mod driver;
mod error;
pub mod file;
pub mod index;
mod launch;
pub mod manifest;
pub mod offload;
pub mod select;
pub mod target;
mod text;

pub use bundle::{Bundle, Explanation, Kernel, LoadedBundle, OpenOptions};
pub use device::{Device, DeviceBuffer};
pub use error::{Error, LaunchError, Result};
pub use launch::{Arg, RawPointer};
