//! Shared pieces of the end-to-end tests, the GPU parity suite and the benchmarks (`bench/`):
//! host-side dtype handling, kernel test cases, and the f64 reference of every kernel in the
//! library.

pub mod case;
pub mod device_case;
pub mod host;
pub mod kernels;
