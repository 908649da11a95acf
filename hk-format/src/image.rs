//! The form of a code image: an AMDGPU code object, an NVIDIA cubin or PTX text.
//!
//! Both sides of loading name it: a bundle entry ID says which form its image has
//! ([`EntryId::image_kind`](crate::target::EntryId::image_kind)), and hkload's driver is told
//! which form it is given (`hkload::driver::ImageKind`, this type).

/// The form of a code image, as a bundle entry names it and a driver loads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// A bare AMDGPU code object (ELF), for `hipModuleLoadData`.
    AmdCodeObject,
    /// An NVIDIA cubin for one SM architecture.
    Cubin,
    /// NVIDIA PTX text (NUL-terminated when handed over), compiled by the driver's JIT.
    Ptx,
}
