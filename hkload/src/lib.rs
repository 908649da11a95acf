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
//! **4. Call a kernel by name, with its arguments alone.** [`LoadedBundle::kernel`] finds
//! it; [`Kernel::call`] checks the arguments against the declared signature and the code
//! object's metadata (count, buffer or value, element type, writability, size, device), then
//! the kernel's launch contract ([`contract`]: declared in its manifest, it checks the
//! preconditions, computes the launch shape and proves every buffer long enough), packs the
//! arguments at the offsets the code object gives, and only then calls the driver. A mismatch
//! is a [`LaunchError`] naming the kernel, the argument and what was expected.
//!
//! ```no_run
//! use hkload::abi::ScalarType;
//! use hkload::driver::StreamHandle;
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
//! rmsnorm.call(StreamHandle::DEFAULT, &args)?;
//! println!("launched as {:?}", rmsnorm.launch_shape(&args)?);
//! device.synchronize()?;
//!
//! // A buffer shorter than the contract's extent never reaches the GPU.
//! let short = device.alloc(ScalarType::Bf16, n - 1)?;
//! let error = rmsnorm.call(StreamHandle::DEFAULT, &[Arg::from(&mut out), Arg::from(&short),
//!     Arg::from(&weight), Arg::from(1e-6f32), Arg::from(rows), Arg::from(cols)]).unwrap_err();
//! assert!(error.to_string().contains("holds 16383 elements, but the kernel may touch 16384"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The matrix kernels are called the same way. A GEMM `C = A·Bᵀ` of bf16 `[m, k]` and
//! `[n, k]` matrices (a torch `Linear` weight) into `[m, n]` takes the leading dimensions of
//! each, so views of larger tensors work; its contract picks the grid from `m` and `n` and
//! checks that `c` holds `(m - 1) * ldc + n` elements:
//!
//! ```no_run
//! # use hkload::{abi::ScalarType, driver::StreamHandle, Arg};
//! # let bundle = hkload::Bundle::open("dist/hk-kernels-0.1.0")?;
//! # let device = hkload::auto::first_device()?;
//! # let kernels = bundle.load(&device)?;
//! let (m, n, k) = (16u32, 4096u32, 4096u32);
//! let a = device.alloc(ScalarType::Bf16, (m * k) as usize)?;
//! let w = device.alloc(ScalarType::Bf16, (n * k) as usize)?;
//! let mut c = device.alloc(ScalarType::Bf16, (m * n) as usize)?;
//! let gemm = kernels.kernel("gemm_a16w16_nt_bf16")?;
//! gemm.call(StreamHandle::DEFAULT, &[(&mut c).into(), (&a).into(), (&w).into(),
//!     m.into(), n.into(), k.into(), k.into(), k.into(), n.into()])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Kernel::launch`] takes explicit dimensions instead, for experts (and for bundles older
//! than launch contracts); it is `unsafe`, as a kernel is correct only for the shapes it is
//! written for.
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

pub mod auto;
pub mod bundle;
pub mod device;
pub mod driver;
mod error;
mod launch;
pub mod package_set;
pub mod select;

// The bundle's formats, at the paths hkload's own types name them by.
pub use hk_format::{abi, contract, digest, fp8, index, manifest, signing, target};
use hk_format::{file, image, offload};

pub use bundle::{Bundle, Explanation, Kernel, LoadedBundle, OpenOptions};
pub use device::{Device, DeviceBuffer};
pub use error::{Error, LaunchError, Result};
pub use launch::{Arg, RawPointer};
