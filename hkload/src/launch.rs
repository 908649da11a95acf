//! Checked launches: arguments are matched against the kernel's declared signature and packed
//! at the offsets its code object gives, and the launch shape is checked against the code
//! object's limits, all before the driver is called.

use crate::abi::{Param, ParamType, ScalarType, ScalarValue};
use crate::device::DeviceBuffer;
use crate::driver::{DevicePtr, LaunchDims};
use crate::error::LaunchError;
use crate::manifest::KernelAbi;
use crate::target::TargetId;

/// One argument of a launch.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// A device buffer, read-only for the kernel.
    Buffer(&'a DeviceBuffer),
    /// A device buffer the kernel may write.
    BufferMut(&'a DeviceBuffer),
    /// Memory hkload did not allocate (a framework's tensor, say), described by the caller.
    Raw(RawPointer),
    /// A value passed by copy.
    Scalar(ScalarValue),
}

/// A device pointer from elsewhere, with the facts hkload cannot find out by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPointer {
    pub ptr: DevicePtr,
    pub device: usize,
    pub elem: ScalarType,
    pub mutable: bool,
}

impl<'a> From<&'a DeviceBuffer> for Arg<'a> {
    fn from(buffer: &'a DeviceBuffer) -> Self {
        Self::Buffer(buffer)
    }
}

impl<'a> From<&'a mut DeviceBuffer> for Arg<'a> {
    fn from(buffer: &'a mut DeviceBuffer) -> Self {
        Self::BufferMut(buffer)
    }
}

impl<T: Into<ScalarValue>> From<T> for Arg<'_> {
    fn from(value: T) -> Self {
        Self::Scalar(value.into())
    }
}

impl Arg<'_> {
    /// What the argument is, in the words of a signature, for error messages.
    fn describe(&self) -> String {
        match self {
            Self::Buffer(b) => format!("a read-only buffer of {}", b.elem()),
            Self::BufferMut(b) => format!("a writable buffer of {}", b.elem()),
            Self::Raw(r) if r.mutable => format!("a writable pointer to {}", r.elem),
            Self::Raw(r) => format!("a read-only pointer to {}", r.elem),
            Self::Scalar(v) => format!("a {} value", v.ty()),
        }
    }
}

/// Where each declared parameter goes in the packed argument buffer of one kernel on one
/// target, and the limits its launches are checked against.
#[derive(Debug, Clone)]
pub(crate) struct ArgLayout {
    params: Vec<(Param, u32)>,
    size: usize,
    max_block_threads: u32,
    static_shared: u32,
    shared_limit: u32,
}

/// A packed argument buffer this small lives on the stack; larger ones (rare) on the heap.
const INLINE_ARGS: usize = 256;

impl ArgLayout {
    /// Pairs the declared signature with the argument offsets of the code for `target`. hkpack
    /// checked them at build time; a disagreement here means the manifest was edited by hand.
    pub(crate) fn new(
        signature: &[Param],
        abi: &KernelAbi,
        shared_limit: u32,
    ) -> Result<Self, String> {
        if signature.len() != abi.arg_offsets.len() {
            return Err(format!(
                "the signature declares {} arguments but the code for {} has {}",
                signature.len(),
                abi.target,
                abi.arg_offsets.len()
            ));
        }
        let mut params = Vec::with_capacity(signature.len());
        let mut size = 0usize;
        for (param, &offset) in signature.iter().zip(&abi.arg_offsets) {
            if offset % param.ty.align() != 0 {
                return Err(format!(
                    "`{param}` sits at offset {offset} in the code for {}, not a multiple of its alignment",
                    abi.target
                ));
            }
            size = size.max(offset as usize + param.ty.size() as usize);
            params.push((param.clone(), offset));
        }
        Ok(Self {
            params,
            size,
            max_block_threads: abi.max_flat_workgroup_size,
            static_shared: abi.group_segment_size,
            shared_limit,
        })
    }

    /// Checks `args` and `dims`, packs the arguments, and hands the packed bytes to `launch`.
    pub(crate) fn check_and_pack<R>(
        &self,
        kernel: &str,
        device: usize,
        dims: &LaunchDims,
        args: &[Arg<'_>],
        launch: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, LaunchError> {
        self.check_dims(kernel, dims)?;
        if args.len() != self.params.len() {
            return Err(LaunchError::ArgCount {
                kernel: kernel.to_owned(),
                expected: self.params.len(),
                found: args.len(),
                signature: self.signature(),
            });
        }
        let mut inline = [0u8; INLINE_ARGS];
        let mut heap = Vec::new();
        let packed: &mut [u8] = if self.size <= INLINE_ARGS {
            &mut inline[..self.size]
        } else {
            heap.resize(self.size, 0);
            &mut heap
        };
        for (index, ((param, offset), arg)) in self.params.iter().zip(args).enumerate() {
            let bytes = argument_bytes(param, arg, device).map_err(|mismatch| match mismatch {
                ArgMismatch::Type => LaunchError::ArgType {
                    kernel: kernel.to_owned(),
                    index,
                    param: param.to_string(),
                    expected: describe_param(param.ty),
                    found: arg.describe(),
                },
                ArgMismatch::Device(found) => LaunchError::ArgDevice {
                    kernel: kernel.to_owned(),
                    index,
                    param: param.to_string(),
                    expected: device,
                    found,
                },
            })?;
            let start = *offset as usize;
            let size = param.ty.size() as usize;
            packed[start..start + size].copy_from_slice(&bytes[..size]);
        }
        Ok(launch(packed))
    }

    fn check_dims(&self, kernel: &str, dims: &LaunchDims) -> Result<(), LaunchError> {
        let refuse = |detail: String| {
            Err(LaunchError::Dims {
                kernel: kernel.to_owned(),
                detail,
            })
        };
        if dims.grid.contains(&0) || dims.block.contains(&0) {
            return refuse(format!(
                "grid {:?} and block {:?} must be at least 1 in every dimension",
                dims.grid, dims.block
            ));
        }
        let threads = dims.block_threads();
        if threads > u64::from(self.max_block_threads) {
            return refuse(format!(
                "a block of {threads} threads ({:?}) exceeds the kernel's maximum of {}",
                dims.block, self.max_block_threads
            ));
        }
        let shared = u64::from(self.static_shared) + u64::from(dims.shared_bytes);
        if shared > u64::from(self.shared_limit) {
            return refuse(format!(
                "{} bytes of dynamic shared memory plus the kernel's {} static bytes exceed the {} bytes a block may use",
                dims.shared_bytes, self.static_shared, self.shared_limit
            ));
        }
        Ok(())
    }

    fn signature(&self) -> String {
        let params: Vec<String> = self.params.iter().map(|(p, _)| p.to_string()).collect();
        format!("({})", params.join(", "))
    }
}

enum ArgMismatch {
    Type,
    Device(usize),
}

/// The bytes `arg` contributes for `param`, if it fits the declaration.
fn argument_bytes(param: &Param, arg: &Arg<'_>, device: usize) -> Result<[u8; 8], ArgMismatch> {
    let pointer = |ptr: DevicePtr, on: usize, elem: ScalarType, writable: bool| match param.ty {
        ParamType::Pointer { pointee, mutable } if pointee == elem && (writable || !mutable) => {
            if on == device {
                Ok(ptr.0.to_le_bytes())
            } else {
                Err(ArgMismatch::Device(on))
            }
        }
        _ => Err(ArgMismatch::Type),
    };
    match *arg {
        Arg::Buffer(b) => pointer(b.ptr(), b.device(), b.elem(), false),
        Arg::BufferMut(b) => pointer(b.ptr(), b.device(), b.elem(), true),
        Arg::Raw(r) => pointer(r.ptr, r.device, r.elem, r.mutable),
        Arg::Scalar(value) => match param.ty {
            ParamType::Scalar(t) if t == value.ty() => Ok(value.to_le_bytes()),
            _ => Err(ArgMismatch::Type),
        },
    }
}

fn describe_param(ty: ParamType) -> String {
    match ty {
        ParamType::Pointer {
            pointee,
            mutable: true,
        } => format!("a writable buffer of {pointee} (`*mut {pointee}`)"),
        ParamType::Pointer { pointee, .. } => {
            format!("a buffer of {pointee} (`*const {pointee}`)")
        }
        ParamType::Scalar(t) => format!("a {t} value"),
    }
}

/// Shared memory (LDS) one block may use on a device, static and dynamic together.
///
/// gfx950 has 160 KiB of LDS per workgroup, earlier CDNA 64 KiB. On NVIDIA, 48 KiB is what a
/// block gets without opting in through a function attribute, which hkload does not set.
pub(crate) fn shared_memory_limit(device: &TargetId) -> u32 {
    match device {
        TargetId::Amd(amd) if amd.processor() == "gfx950" => 160 * 1024,
        TargetId::Amd(_) => 64 * 1024,
        TargetId::Nvidia(_) => 48 * 1024,
    }
}
