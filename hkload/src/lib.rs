//! hkload: open an hkpack bundle, pick the code object for the GPU, launch kernels checked.

pub mod abi;
pub mod auto;
pub mod bundle;
pub mod code_object;
pub mod device;
pub mod driver;
mod error;
mod launch;
pub mod manifest;
pub mod offload;
pub mod select;
pub mod target;

pub use bundle::{Bundle, Explanation, Kernel, LoadedBundle, OpenOptions};
pub use device::{Device, DeviceBuffer};
pub use error::{Error, LaunchError, Result};
pub use launch::{Arg, RawPointer};
