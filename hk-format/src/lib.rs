//! The files of an hkpack bundle, read (and, with the `write` feature, written): what `hkpack`
//! writes and `hkload` reads, in one place so that both sides agree by construction.
//!
//! - [`offload`]: clang offload bundles, the standard container of a module's code images;
//! - [`index`]: `bundle.msgpack`, the bundle's index, and its lookup table;
//! - [`manifest`]: the records the index holds (modules, entries, kernels, provenance);
//! - [`target`]: target IDs (`gfx942:sramecc+:xnack-`, `sm_90a`), the processor table, and the
//!   entry IDs of code images;
//! - [`abi`]: kernel signatures and their per-target argument layouts;
//! - [`contract`]: launch contracts, evaluated at every call;
//! - [`digest`], [`signing`]: the digests and signatures that vouch for a bundle's bytes;
//! - [`package_set`]: a bundle split into per-target packages.

pub mod abi;
pub mod contract;
pub mod digest;
pub mod file;
pub mod fp8;
pub mod image;
pub mod index;
pub mod manifest;
pub mod offload;
pub mod package_set;
pub mod signing;
#[cfg(test)]
mod small_stack;
pub mod target;
mod text;
