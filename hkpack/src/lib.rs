//! hkpack: compile GPU kernels ahead of time, for every target, into versioned bundles.
//!
//! The library does the work; the `hkpack` binary is flag parsing and wiring. A build goes
//! [`manifest`] → [`toolchain`] → [`job`] (planned per module and target, run through the
//! [`cache`], local and optionally shared by machines, each ending with the signature
//! [`probe`]) → [`signature`] check → [`package`], all driven by [`build::build`].

pub mod build;
pub mod cache;
pub mod error;
pub mod inspect;
pub mod job;
pub mod manifest;
pub mod package;
pub mod probe;
pub mod provenance;
pub mod sign;
pub mod signature;
pub mod split;
pub mod staging;
pub mod toolchain;
pub mod verify;

pub use build::{BuildOptions, BuildReport, build};
pub use error::Error;
