//! Checked launches: arguments are matched against the kernel's declared signature and packed
//! at the offsets its code object gives; the kernel's contract checks its preconditions and
//! every buffer's extent and computes the launch shape; and the shape is checked against the
//! code object's and the device's limits; all before the driver is called.

use std::sync::{Arc, Mutex};

use crate::abi::{Param, ParamType, ScalarType, ScalarValue};
use crate::contract::{Contract, EvalError, Facts, MAX_PARAMS, Program, Run};
use crate::device::{Device, DeviceBuffer};
use crate::driver::{DevicePtr, Driver, LaunchDims};
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

/// A device pointer from elsewhere (a framework's tensor), with the facts hkload cannot find
/// out by itself: its device, element type, length and whether the kernel may write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPointer {
    ptr: DevicePtr,
    device: usize,
    elem: ScalarType,
    len: usize,
    mutable: bool,
}

impl RawPointer {
    /// Describes `len` elements of `elem` at `ptr` on device `device` of the driver the kernel
    /// runs on.
    ///
    /// # Safety
    ///
    /// `ptr` must address at least `len` elements of `elem` in memory of that device and
    /// driver, allocated (and, if `mutable`, writable) until every kernel launched with it has
    /// finished. hkload checks everything else against the kernel's contract.
    pub const unsafe fn new(
        ptr: DevicePtr,
        device: usize,
        elem: ScalarType,
        len: usize,
        mutable: bool,
    ) -> Self {
        Self {
            ptr,
            device,
            elem,
            len,
            mutable,
        }
    }

    pub const fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub const fn len(&self) -> usize {
        self.len
    }

    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
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

    /// Elements the argument holds, if it is memory.
    fn len(&self) -> Option<usize> {
        match self {
            Self::Buffer(b) | Self::BufferMut(b) => Some(b.len()),
            Self::Raw(r) => Some(r.len),
            Self::Scalar(_) => None,
        }
    }
}

/// The largest argument buffer hkload packs: far above what either vendor allows (4 KiB of
/// CUDA parameters, or 32 KiB since Volta with CUDA 12.1; AMD's kernarg segments of our
/// kernels are a few hundred bytes), so a damaged ABI cannot make a launch allocate more.
pub const MAX_KERNARG_SIZE: u32 = 32 * 1024;

/// Where each declared parameter goes in the packed argument buffer of one kernel on one
/// target, the kernel's contract, and the limits its launches are checked against.
#[derive(Debug)]
pub(crate) struct ArgLayout {
    /// The declared signature, for messages and the contract.
    params: Vec<Param>,
    /// Where each parameter goes, by increasing offset: the launch path's compact view.
    slots: Vec<Slot>,
    size: usize,
    limits: Limits,
    contract: Option<(Contract, Program)>,
    facts: Facts,
    memo: Mutex<Memo>,
}

/// One parameter as the launch path reads it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The parameter's place in the signature (and of its argument in a call).
    index: usize,
    /// Byte offset in the packed arguments of the code for the device's target.
    offset: u32,
    ty: ParamType,
}

/// What the contract said for the last scalar arguments it was evaluated with. It is a pure
/// function of them (the facts are fixed per kernel), and serving code calls a kernel with the
/// same shape again and again: a repeated call compares its values and buffer lengths with
/// these, in the pass that packs the arguments, and evaluates nothing (`gpu_bench` on the H200
/// machine: `Kernel::call` went from 1.145x to 1.058x raw `cuLaunchKernel`, in two runs on two
/// machines).
#[derive(Debug, Default)]
struct Memo {
    /// Whether the rest holds a successful evaluation.
    valid: bool,
    scalars: Vec<i64>,
    /// The contract's launch shape, if that evaluation computed it (`call` does, `launch`
    /// with explicit dimensions does not); it passed [`ArgLayout::check_dims`] before it was
    /// remembered.
    shape: Option<LaunchDims>,
    /// Elements each parameter must hold (0 for values).
    extents: Vec<u64>,
}

#[derive(Debug, Clone)]
struct Limits {
    vendor: Vendor,
    static_shared: u32,
    shared_limit: u32,
    /// The most threads a block may have on the device, as its driver reports it: the code
    /// object's own maximum ([`Facts::max_block_threads`]) says what the kernel was compiled
    /// for, not what this device can run.
    device_block_threads: u32,
    /// The code object's target and the device, as messages name them.
    code_target: TargetId,
    device: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vendor {
    Amd,
    Nvidia,
}

/// What a checked launch did.
pub(crate) enum Launched<R> {
    /// Launched with this shape; the driver said `R`.
    Done(LaunchDims, R),
    /// The contract's grid is empty: nothing to do, nothing launched.
    Empty(LaunchDims),
}

/// What evaluating a contract gave: the launch shape (when asked for) and the elements each
/// parameter must hold (0 for values).
struct Evaluated {
    shape: Option<LaunchDims>,
    extents: [u64; MAX_PARAMS],
}

/// Whether a shape has no blocks to run (a contract's grid over zero rows, say).
fn is_empty(dims: &LaunchDims) -> bool {
    dims.grid.contains(&0) && dims.block.iter().all(|&b| b > 0)
}

/// Writes an argument's eight bytes (its value, then zeros) at `offset`: one fixed-size move
/// instead of a copy of the argument's own size. Arguments are packed by increasing offset
/// into a buffer with eight bytes of slack, so the zeros past a short argument land in the
/// padding or the next argument's place, which is written after it, or in the slack.
#[inline(always)]
fn put(packed: &mut [u8], offset: u32, bytes: [u8; 8]) {
    let at = offset as usize;
    packed[at..at + 8].copy_from_slice(&bytes);
}

/// A packed argument buffer this small lives on the stack; larger ones (rare) on the heap.
const INLINE_ARGS: usize = 120;

impl ArgLayout {
    /// Pairs the declared signature with the argument offsets of the code for `target`, and
    /// binds the kernel's contract. hkpack checked both at build time; a disagreement here
    /// means the bundle was edited by hand or damaged.
    pub(crate) fn new(
        signature: &[Param],
        abi: &KernelAbi,
        contract: Option<&Contract>,
        device: &Device,
    ) -> Result<Self, String> {
        if signature.len() != abi.arg_offsets.len() {
            return Err(format!(
                "the signature declares {} arguments but the code for {} has {}",
                signature.len(),
                abi.target,
                abi.arg_offsets.len()
            ));
        }
        if abi.kernarg_size > MAX_KERNARG_SIZE {
            return Err(format!(
                "the code for {} declares {} bytes of arguments, more than the {MAX_KERNARG_SIZE} any target allows",
                abi.target, abi.kernarg_size
            ));
        }
        let mut slots: Vec<Slot> = signature
            .iter()
            .zip(&abi.arg_offsets)
            .enumerate()
            .map(|(index, (param, &offset))| Slot {
                index,
                offset,
                ty: param.ty,
            })
            .collect();
        slots.sort_by_key(|slot| slot.offset);
        let mut end = 0u64;
        for slot in &slots {
            let (param, offset) = (&signature[slot.index], u64::from(slot.offset));
            if offset % u64::from(param.ty.align()) != 0 {
                return Err(format!(
                    "`{param}` sits at offset {offset} in the code for {}, not a multiple of its alignment",
                    abi.target
                ));
            }
            if offset < end {
                return Err(format!(
                    "`{param}` at offset {offset} overlaps the argument before it in the code for {}",
                    abi.target
                ));
            }
            end = offset + u64::from(param.ty.size());
            if end > u64::from(abi.kernarg_size) {
                return Err(format!(
                    "`{param}` at offset {offset} ends past the {} bytes of arguments of the code for {}",
                    abi.kernarg_size, abi.target
                ));
            }
        }
        let contract = contract
            .map(|c| {
                c.bind(signature)
                    .map(|program| (c.clone(), program))
                    .map_err(|e| format!("its launch contract does not fit its signature: {e}"))
            })
            .transpose()?;
        let vendor = match device.target() {
            TargetId::Amd(_) => Vendor::Amd,
            TargetId::Nvidia(_) => Vendor::Nvidia,
        };
        Ok(Self {
            params: signature.to_vec(),
            slots,
            size: end as usize,
            limits: Limits {
                vendor,
                static_shared: abi.group_segment_size,
                shared_limit: device.info().shared_memory_per_block,
                device_block_threads: device.info().max_threads_per_block,
                code_target: abi.target,
                device: format!(
                    "{} (device {} of the {} driver)",
                    device.info().name,
                    device.ordinal(),
                    device.driver().api()
                ),
            },
            contract,
            facts: Facts {
                wave_size: abi.wavefront_size,
                compute_units: device.info().compute_units,
                max_block_threads: abi.max_flat_workgroup_size,
                // The ABI is the chosen code object's: its target says what it was built for.
                arch_specific: abi.target.is_arch_specific(),
            },
            memo: Mutex::new(Memo {
                valid: false,
                scalars: vec![0; signature.len()],
                shape: None,
                extents: vec![0; signature.len()],
            }),
        })
    }

    pub(crate) fn contract(&self) -> Option<&Contract> {
        self.contract.as_ref().map(|(c, _)| c)
    }

    /// Checks `args` (and `dims`, or computes them from the contract when `None`), packs the
    /// arguments, and hands the shape and packed bytes to `launch`. A contract whose grid is
    /// empty (no rows to work on, say) launches nothing.
    ///
    /// This is every launch's path, so it makes one pass over the arguments: each is checked
    /// against its parameter, packed, and compared with the memo; only a miss evaluates the
    /// contract.
    pub(crate) fn check_and_pack<R>(
        &self,
        kernel: &str,
        device: &Device,
        dims: Option<&LaunchDims>,
        args: &[Arg<'_>],
        launch: impl FnOnce(&LaunchDims, &[u8]) -> R,
    ) -> Result<Launched<R>, LaunchError> {
        if args.len() != self.slots.len() {
            return Err(LaunchError::ArgCount {
                kernel: kernel.to_owned(),
                expected: self.slots.len(),
                found: args.len(),
                signature: self.signature(),
            });
        }
        // Eight bytes of slack past the arguments: see `put`.
        let mut inline = [0u8; INLINE_ARGS + 8];
        let mut heap = Vec::new();
        let packed: &mut [u8] = if self.size <= INLINE_ARGS {
            &mut inline[..self.size + 8]
        } else {
            heap.resize(self.size + 8, 0);
            &mut heap
        };
        // A busy memo (another thread launching the kernel) is a miss, never a wait.
        let memo = match self.contract {
            Some(_) => self.memo.try_lock().ok().filter(|memo| memo.valid),
            None => None,
        };
        let mut remembered = memo.is_some();
        for slot in &self.slots {
            let (index, arg) = (slot.index, &args[slot.index]);
            let bytes = argument_bytes(slot.ty, arg, device)
                .map_err(|mismatch| self.mismatch(kernel, device, index, arg, mismatch))?;
            put(packed, slot.offset, bytes);
            if let Some(memo) = &memo {
                remembered &= match arg {
                    Arg::Scalar(value) => {
                        !value.ty().is_integer() || value.as_i64() == Some(memo.scalars[index])
                    }
                    _ => arg
                        .len()
                        .is_some_and(|len| len as u64 >= memo.extents[index]),
                };
            }
        }
        let remembered = memo
            .and_then(|memo| dims.copied().or(memo.shape))
            .filter(|_| remembered);
        let (dims, checked) = match (remembered, &self.contract) {
            // The contract's own shape was checked before it was remembered; a caller's is not.
            (Some(shape), _) => (shape, dims.is_none()),
            (None, Some((contract, program))) => {
                let values = self.contract_values(kernel, args)?;
                let evaluated =
                    self.check_contract(kernel, contract, program, &values, dims, Some(args))?;
                let shape = dims
                    .copied()
                    .or(evaluated.shape)
                    .unwrap_or(LaunchDims::linear(0, 0));
                if !is_empty(&shape) {
                    self.check_dims(kernel, &shape)?;
                }
                if let Ok(mut memo) = self.memo.try_lock() {
                    memo.valid = true;
                    memo.scalars.copy_from_slice(&values[..self.slots.len()]);
                    memo.shape = evaluated.shape;
                    memo.extents
                        .copy_from_slice(&evaluated.extents[..self.slots.len()]);
                }
                (shape, true)
            }
            (None, None) => (
                *dims.ok_or_else(|| LaunchError::NoContract {
                    kernel: kernel.to_owned(),
                })?,
                false,
            ),
        };
        if self.contract.is_some() && is_empty(&dims) {
            return Ok(Launched::Empty(dims));
        }
        if !checked {
            self.check_dims(kernel, &dims)?;
        }
        Ok(Launched::Done(dims, launch(&dims, &packed[..self.size])))
    }

    /// The error for an argument that does not fit its parameter: off the hot path.
    #[cold]
    fn mismatch(
        &self,
        kernel: &str,
        device: &Device,
        index: usize,
        arg: &Arg<'_>,
        mismatch: ArgMismatch,
    ) -> LaunchError {
        let (kernel, param) = (kernel.to_owned(), self.params[index].to_string());
        match mismatch {
            ArgMismatch::Type => LaunchError::ArgType {
                kernel,
                index,
                param,
                expected: describe_param(self.params[index].ty),
                found: match fp8_mixup(self.params[index].ty, arg) {
                    Some(why) => format!("{}: {why}", arg.describe()),
                    None => arg.describe(),
                },
            },
            ArgMismatch::Device(found) => LaunchError::ArgDevice {
                kernel,
                index,
                param,
                expected: device.ordinal(),
                found,
            },
            ArgMismatch::Driver => LaunchError::ArgDriver {
                kernel,
                index,
                param,
                expected: device.driver().api(),
            },
        }
    }

    /// The integer scalars of `args` by parameter index (0 for the other parameters), as the
    /// contract reads them.
    fn contract_values(
        &self,
        kernel: &str,
        args: &[Arg<'_>],
    ) -> Result<[i64; MAX_PARAMS], LaunchError> {
        let mut values = [0i64; MAX_PARAMS];
        for ((param, arg), slot) in self.params.iter().zip(args).zip(&mut values) {
            if let Arg::Scalar(value) = arg
                && value.ty().is_integer()
            {
                *slot = value.as_i64().ok_or_else(|| LaunchError::Contract {
                    kernel: kernel.to_owned(),
                    detail: format!(
                        "argument `{param}` is {}, above the 64-bit signed range the contract computes in",
                        match value {
                            ScalarValue::U64(v) => v.to_string(),
                            other => format!("{other:?}"),
                        }
                    ),
                })?;
            }
        }
        Ok(values)
    }

    /// The elements each parameter must hold for `args` (0 for values), by the contract: its
    /// requirements and every argument's type are checked, the lengths of the buffers passed
    /// are not read.
    pub(crate) fn extents(
        &self,
        kernel: &str,
        device: &Device,
        args: &[Arg<'_>],
    ) -> Result<Vec<u64>, LaunchError> {
        if args.len() != self.slots.len() {
            return Err(LaunchError::ArgCount {
                kernel: kernel.to_owned(),
                expected: self.slots.len(),
                found: args.len(),
                signature: self.signature(),
            });
        }
        for slot in &self.slots {
            let (index, arg) = (slot.index, &args[slot.index]);
            argument_bytes(slot.ty, arg, device)
                .map_err(|mismatch| self.mismatch(kernel, device, index, arg, mismatch))?;
        }
        let Some((contract, program)) = &self.contract else {
            return Err(LaunchError::NoContract {
                kernel: kernel.to_owned(),
            });
        };
        let values = self.contract_values(kernel, args)?;
        let evaluated = self.check_contract(kernel, contract, program, &values, None, None)?;
        Ok(evaluated.extents[..self.params.len()].to_vec())
    }

    /// Evaluates the contract for one call: its requirements, the launch shape (unless the
    /// caller gives one) and every pointer's extent, against the memory passed where `args`
    /// are given.
    fn check_contract(
        &self,
        kernel: &str,
        contract: &Contract,
        program: &Program,
        values: &[i64],
        dims: Option<&LaunchDims>,
        args: Option<&[Arg<'_>]>,
    ) -> Result<Evaluated, LaunchError> {
        let values = &values[..self.params.len()];
        let mut run = program.run(values, &self.facts);
        let fail = |error: EvalError, run: &mut Run<'_>| match error {
            EvalError::Unmet { index } => {
                let requirement = &contract.requires[index];
                LaunchError::Requirement {
                    kernel: kernel.to_owned(),
                    message: requirement.message.clone(),
                    condition: requirement.check.to_string(),
                    values: run.values(&requirement.check.names()),
                }
            }
            EvalError::Arithmetic { place, detail } => LaunchError::Contract {
                kernel: kernel.to_owned(),
                detail: format!("the contract's {place} cannot be computed: {detail}"),
            },
            EvalError::OutOfRange {
                place,
                value,
                limit,
            } => LaunchError::Contract {
                kernel: kernel.to_owned(),
                detail: format!("the contract's {place} comes out as {value}, but must be {limit}"),
            },
        };
        if let Err(error) = run.check_requirements() {
            return Err(fail(error, &mut run));
        }
        let shape = match dims {
            Some(_) => None,
            None => match run.shape() {
                Ok(shape) => Some(shape),
                Err(error) => return Err(fail(error, &mut run)),
            },
        };
        // Every extent first, so that one that cannot be computed is reported before a
        // buffer too short for another.
        let mut extents = [0u64; MAX_PARAMS];
        for (index, param) in self.params.iter().enumerate() {
            match run.extent(index, &param.name) {
                Ok(needed) => extents[index] = needed.unwrap_or(0),
                Err(error) => return Err(fail(error, &mut run)),
            }
        }
        for (index, (param, arg)) in self.params.iter().zip(args.unwrap_or_default()).enumerate() {
            let (needed, given) = (extents[index], arg.len().unwrap_or(0));
            if (given as u64) < needed {
                let extent = contract
                    .extents
                    .iter()
                    .find(|e| e.name == param.name)
                    .map_or_else(String::new, |e| e.value.to_string());
                return Err(LaunchError::Extent {
                    kernel: kernel.to_owned(),
                    index,
                    param: param.to_string(),
                    needed,
                    given,
                    extent: format!(
                        "{extent} with {}",
                        run.values(&extent_names(contract, &param.name))
                    ),
                });
            }
        }
        Ok(Evaluated { shape, extents })
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
        if threads > u64::from(self.facts.max_block_threads) {
            return refuse(format!(
                "a block of {threads} threads ({:?}) exceeds the kernel's maximum of {}, the \
                 max_flat_workgroup_size of its code object for {}",
                dims.block, self.facts.max_block_threads, self.limits.code_target
            ));
        }
        if threads > u64::from(self.limits.device_block_threads) {
            return refuse(format!(
                "a block of {threads} threads ({:?}) exceeds the device's maximum of {} threads \
                 a block, as its driver reports it for {}",
                dims.block, self.limits.device_block_threads, self.limits.device
            ));
        }
        match self.limits.vendor {
            Vendor::Nvidia => {
                const BLOCK: [u32; 3] = [1024, 1024, 64];
                const GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];
                for axis in 0..3 {
                    if dims.block[axis] > BLOCK[axis] || dims.grid[axis] > GRID[axis] {
                        return refuse(format!(
                            "grid {:?} and block {:?} exceed the CUDA limits of grid {GRID:?} and block {BLOCK:?}",
                            dims.grid, dims.block
                        ));
                    }
                }
            }
            Vendor::Amd => {
                // The dispatch packet holds the grid in work-items, 32 bits per dimension.
                for axis in 0..3 {
                    let items = u64::from(dims.grid[axis]) * u64::from(dims.block[axis]);
                    if items > u64::from(u32::MAX) || dims.block[axis] > 1024 {
                        return refuse(format!(
                            "grid {:?} of blocks {:?} exceeds the HSA limits: at most 1024 threads a block and 2^32 - 1 work-items in each dimension",
                            dims.grid, dims.block
                        ));
                    }
                }
            }
        }
        let shared = u64::from(self.limits.static_shared) + u64::from(dims.shared_bytes);
        if shared > u64::from(self.limits.shared_limit) {
            return refuse(format!(
                "{} bytes of dynamic shared memory plus the kernel's {} static bytes exceed the {} bytes a block may use",
                dims.shared_bytes, self.limits.static_shared, self.limits.shared_limit
            ));
        }
        Ok(())
    }

    fn signature(&self) -> String {
        let params: Vec<String> = self.params.iter().map(Param::to_string).collect();
        format!("({})", params.join(", "))
    }
}

/// The names an extent reads, for its message.
fn extent_names<'a>(contract: &'a Contract, param: &str) -> Vec<&'a str> {
    contract
        .extents
        .iter()
        .find(|e| e.name == param)
        .map(|e| e.value.names())
        .unwrap_or_default()
}

enum ArgMismatch {
    Type,
    Device(usize),
    Driver,
}

/// The bytes `arg` contributes for `param`, if it fits the declaration.
#[inline(always)]
fn argument_bytes(ty: ParamType, arg: &Arg<'_>, device: &Device) -> Result<[u8; 8], ArgMismatch> {
    let pointer = |ptr: DevicePtr, on: usize, elem: ScalarType, writable: bool| match ty {
        ParamType::Pointer { pointee, mutable } if pointee == elem && (writable || !mutable) => {
            if on == device.ordinal() {
                Ok(ptr.0.to_le_bytes())
            } else {
                Err(ArgMismatch::Device(on))
            }
        }
        _ => Err(ArgMismatch::Type),
    };
    let same_driver = |buffer: &DeviceBuffer| {
        if same(buffer.driver(), device.driver()) {
            Ok(())
        } else {
            Err(ArgMismatch::Driver)
        }
    };
    match *arg {
        Arg::Buffer(b) => pointer(b.ptr(), b.device(), b.elem(), false).and_then(|bytes| {
            same_driver(b)?;
            Ok(bytes)
        }),
        Arg::BufferMut(b) => pointer(b.ptr(), b.device(), b.elem(), true).and_then(|bytes| {
            same_driver(b)?;
            Ok(bytes)
        }),
        Arg::Raw(r) => pointer(r.ptr, r.device, r.elem, r.mutable),
        Arg::Scalar(value) => match ty {
            ParamType::Scalar(t) if t == value.ty() => Ok(value.to_le_bytes()),
            _ => Err(ArgMismatch::Type),
        },
    }
}

/// Whether two handles are the same driver instance (not merely the same kind of driver).
fn same(a: &Arc<dyn Driver>, b: &Arc<dyn Driver>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// Why `arg` is worse than a plain type mismatch for a parameter of type `ty`: an FP8 buffer
/// of the other encoding family ([`ScalarType::fp8_mixup`]).
fn fp8_mixup(ty: ParamType, arg: &Arg<'_>) -> Option<String> {
    let ParamType::Pointer { pointee, .. } = ty else {
        return None;
    };
    let found = match arg {
        Arg::Buffer(b) | Arg::BufferMut(b) => b.elem(),
        Arg::Raw(r) => r.elem,
        Arg::Scalar(_) => return None,
    };
    pointee.fp8_mixup(found)
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
