//! The form of a code image: an AMDGPU code object, an NVIDIA cubin or PTX text.
//!
//! Both sides of loading name it: a bundle entry ID says which form its image has
//! ([`EntryId::image_kind`](crate::target::EntryId::image_kind)), and a driver is told which
//! form it is given ([`Driver::load_module`](crate::driver::Driver::load_module)). It lives
//! apart from both so that neither imports the other for it; `hkload::driver::ImageKind` is
//! its public path.

/// The form of a code image handed to [`Driver::load_module`].
///
/// [`Driver::load_module`]: crate::driver::Driver::load_module
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// A bare AMDGPU code object (ELF), for `hipModuleLoadData`.
    AmdCodeObject,
    /// An NVIDIA cubin for one SM architecture.
    Cubin,
    /// NVIDIA PTX text (NUL-terminated when handed over), compiled by the driver's JIT.
    Ptx,
}
