//! One test case on a device, shared by the GPU programs and the tests with a simulated device: its inputs uploaded and outputs
//! poisoned, the launch arguments, the outputs read back, and the verdict of
//! [`Case::check`] with the worst error seen.

use crate::case::{Case, CaseArg, Mismatch};
use crate::host::{POISON_BYTE, decode, encode};
use hk_format::abi::ScalarValue;
use hkload::driver::StreamHandle;
use hkload::{Arg, Device, DeviceBuffer, Kernel};

/// How long each buffer of a case is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// As long as the case's data: an output may be longer than what the kernel writes, and
    /// the poison there must survive.
    Case,
    /// Exactly the extent the kernel's contract gives for the call, with nothing around it, so
    /// that a tool checking every access against its allocation (compute-sanitizer's memcheck)
    /// proves that the contract covers all the kernel touches. Elements of the case's data
    /// past an extent are left out (an output's read back as the poison: they do not exist);
    /// a buffer whose extent exceeds the case's data keeps the data's length, and the call
    /// refuses it.
    Exact,
}

/// A case's arguments on a device, in the case's order.
pub struct CaseBuffers {
    slots: Vec<Slot>,
}

enum Slot {
    Buffer {
        buffer: DeviceBuffer,
        writable: bool,
        /// Elements the case's data has (the buffer may be shorter: [`Sizing::Exact`]).
        len: usize,
    },
    Scalar(ScalarValue),
}

impl CaseBuffers {
    /// Uploads the case's inputs and fills its outputs with [`POISON_BYTE`], so an element the
    /// kernel does not write cannot pass.
    pub fn upload(device: &Device, case: &Case) -> Result<Self, hkload::Error> {
        Self::upload_cut(device, case, &vec![u64::MAX; case.args.len()])
    }

    /// [`CaseBuffers::upload`] with each buffer as [`Sizing`] says: `Exact` asks `kernel`'s
    /// contract for the extents of the case's call.
    pub fn upload_sized(
        device: &Device,
        kernel: &Kernel,
        case: &Case,
        sizing: Sizing,
    ) -> Result<Self, hkload::Error> {
        let full = Self::upload(device, case)?;
        match sizing {
            Sizing::Case => Ok(full),
            Sizing::Exact => {
                let extents = kernel.extents(&full.args())?;
                drop(full);
                Self::upload_cut(device, case, &extents)
            }
        }
    }

    /// Uploads the case with buffer `i` cut to at most `limits[i]` elements.
    fn upload_cut(device: &Device, case: &Case, limits: &[u64]) -> Result<Self, hkload::Error> {
        let mut slots = Vec::with_capacity(case.args.len());
        for (arg, &limit) in case.args.iter().zip(limits) {
            let cut = |len: usize| usize::try_from(limit).map_or(len, |limit| len.min(limit));
            slots.push(match arg {
                CaseArg::Input { elem, data, .. } | CaseArg::InOut { elem, data, .. } => {
                    Slot::Buffer {
                        buffer: device.upload(*elem, &encode(*elem, &data[..cut(data.len())]))?,
                        writable: matches!(arg, CaseArg::InOut { .. }),
                        len: data.len(),
                    }
                }
                CaseArg::Output { elem, len, .. } => Slot::Buffer {
                    buffer: device
                        .upload(*elem, &vec![POISON_BYTE; cut(*len) * elem.size() as usize])?,
                    writable: true,
                    len: *len,
                },
                CaseArg::Scalar(value) => Slot::Scalar(*value),
            });
        }
        Ok(Self { slots })
    }

    /// The launch arguments: inputs read-only, outputs writable, scalars by value.
    pub fn args(&self) -> Vec<Arg<'_>> {
        self.slots
            .iter()
            .map(|slot| match slot {
                Slot::Buffer {
                    buffer,
                    writable: false,
                    ..
                } => Arg::Buffer(buffer),
                Slot::Buffer { buffer, .. } => Arg::BufferMut(buffer),
                Slot::Scalar(value) => Arg::Scalar(*value),
            })
            .collect()
    }

    /// The decoded contents of every writable buffer (`None` for the other arguments), as
    /// [`Case::check`] takes them: as long as the case's data, elements past a buffer cut to
    /// its extent read as the poison.
    pub fn outputs(&self) -> Result<Vec<Option<Vec<f64>>>, hkload::Error> {
        let mut outputs = Vec::with_capacity(self.slots.len());
        for slot in &self.slots {
            outputs.push(match slot {
                Slot::Buffer {
                    buffer,
                    writable: true,
                    len,
                } => {
                    let mut bytes = buffer.to_bytes()?;
                    bytes.resize(len * buffer.elem().size() as usize, POISON_BYTE);
                    Some(decode(buffer.elem(), &bytes))
                }
                _ => None,
            });
        }
        Ok(outputs)
    }
}

/// What became of one case.
pub struct Judged {
    pub verdict: Result<(), Mismatch>,
    /// The largest error of the outputs compared with [`Expect::Close`], as a fraction of its
    /// tolerance; `None` when every output is compared exactly.
    pub worst: Option<f64>,
}

/// Uploads the case with buffers as `sizing` says, calls the kernel with its arguments alone
/// (its contract gives the launch shape and checks every buffer), waits, reads the outputs back
/// and judges them. `Err` when hkload or the driver failed.
pub fn run_case(
    device: &Device,
    kernel: &Kernel,
    case: &Case,
    sizing: Sizing,
) -> Result<Judged, hkload::Error> {
    let buffers = CaseBuffers::upload_sized(device, kernel, case, sizing)?;
    launch_case(kernel, case, &buffers.args())?;
    device.synchronize()?;
    Ok(judge(case, &buffers.outputs()?))
}

/// The verdict on `outputs` (as [`CaseBuffers::outputs`] reads them back) and the worst error.
pub fn judge(case: &Case, outputs: &[Option<Vec<f64>>]) -> Judged {
    Judged {
        verdict: case.check(outputs),
        worst: worst_error(case, outputs),
    }
}

/// Launches the case's call on the default stream: with its arguments alone, or, where the case
/// sets block counts of its own, the contract's shape with those.
pub fn launch_case(kernel: &Kernel, case: &Case, args: &[Arg<'_>]) -> Result<(), hkload::Error> {
    match case.grid {
        [None, None, None] => kernel.call(StreamHandle::DEFAULT, args),
        grid => {
            let mut dims = kernel.launch_shape(args)?;
            for (axis, blocks) in dims.grid.iter_mut().zip(grid) {
                *axis = blocks.unwrap_or(*axis);
            }
            // SAFETY: the contract's own shape with other block counts, which the case sets only
            // on axes where the kernel's contract says any count is correct; hkload still
            // checks every extent.
            unsafe { kernel.launch(&dims, StreamHandle::DEFAULT, args) }
        }
    }
}

/// The largest `|got − want|` over the tolerance `abs + rel·|want|` among the case's outputs
/// compared with [`Expect::Close`]; infinite for NaN, or for any miss of a zero tolerance.
/// Elements the kernel must not write (a NaN reference) have no error: `Case::check` judges
/// them.
fn worst_error(case: &Case, outputs: &[Option<Vec<f64>>]) -> Option<f64> {
    let mut worst: Option<f64> = None;
    for (arg, got) in case.args.iter().zip(outputs) {
        let (CaseArg::Output { expect, .. } | CaseArg::InOut { expect, .. }) = arg else {
            continue;
        };
        // The strided form's gaps are judged by `Case::check` alone.
        let Some(layout) = expect.close_layout() else {
            continue;
        };
        let got = got.as_deref().unwrap_or(&[]);
        let pairs = got
            .iter()
            .enumerate()
            .filter_map(|(i, &g)| layout.at(i).map(|(w, tolerance)| (g, w, tolerance)))
            .filter(|&(_, w, _)| !w.is_nan());
        for (g, w, tolerance) in pairs {
            let error = (g - w).abs();
            let ratio = if g == w || error == 0.0 {
                0.0
            } else if error.is_nan() || tolerance == 0.0 {
                f64::INFINITY
            } else {
                error / tolerance
            };
            worst = Some(worst.map_or(ratio, |w| w.max(ratio)));
        }
    }
    worst
}
