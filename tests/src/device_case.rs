//! One test case on a device, shared by the GPU programs and the tests with a simulated device: its inputs uploaded and outputs
//! poisoned, the launch arguments, the outputs read back, and the verdict of
//! [`Case::check`] with the worst error seen.

use crate::case::{Case, CaseArg, Mismatch};
use crate::host::{POISON_BYTE, decode, encode};
use hkload::abi::ScalarValue;
use hkload::driver::StreamHandle;
use hkload::{Arg, Device, DeviceBuffer, Kernel};

/// A case's arguments on a device, in the case's order.
pub struct CaseBuffers {
    slots: Vec<Slot>,
}

enum Slot {
    Buffer {
        buffer: DeviceBuffer,
        writable: bool,
    },
    Scalar(ScalarValue),
}

impl CaseBuffers {
    /// Uploads the case's inputs and fills its outputs with [`POISON_BYTE`], so an element the
    /// kernel does not write cannot pass.
    pub fn upload(device: &Device, case: &Case) -> Result<Self, hkload::Error> {
        let mut slots = Vec::with_capacity(case.args.len());
        for arg in &case.args {
            slots.push(match arg {
                CaseArg::Input { elem, data, .. } => Slot::Buffer {
                    buffer: device.upload(*elem, &encode(*elem, data))?,
                    writable: false,
                },
                CaseArg::InOut { elem, data, .. } => Slot::Buffer {
                    buffer: device.upload(*elem, &encode(*elem, data))?,
                    writable: true,
                },
                CaseArg::Output { elem, len, .. } => Slot::Buffer {
                    buffer: device.upload(*elem, &vec![POISON_BYTE; len * elem.size() as usize])?,
                    writable: true,
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
                } => Arg::Buffer(buffer),
                Slot::Buffer { buffer, .. } => Arg::BufferMut(buffer),
                Slot::Scalar(value) => Arg::Scalar(*value),
            })
            .collect()
    }

    /// The decoded contents of every writable buffer (`None` for the other arguments), as
    /// [`Case::check`] takes them.
    pub fn outputs(&self) -> Result<Vec<Option<Vec<f64>>>, hkload::Error> {
        let mut outputs = Vec::with_capacity(self.slots.len());
        for slot in &self.slots {
            outputs.push(match slot {
                Slot::Buffer {
                    buffer,
                    writable: true,
                } => Some(decode(buffer.elem(), &buffer.to_bytes()?)),
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

/// Uploads the case, calls the kernel with its arguments alone (its contract gives the launch
/// shape and checks every buffer), waits, reads the outputs back and judges them. `Err` when
/// hkload or the driver failed.
pub fn run_case(device: &Device, kernel: &Kernel, case: &Case) -> Result<Judged, hkload::Error> {
    let buffers = CaseBuffers::upload(device, case)?;
    let args = buffers.args();
    match case.grid {
        [None, None, None] => kernel.call(StreamHandle::DEFAULT, &args)?,
        grid => {
            let mut dims = kernel.launch_shape(&args)?;
            for (axis, blocks) in dims.grid.iter_mut().zip(grid) {
                *axis = blocks.unwrap_or(*axis);
            }
            // SAFETY: the contract's own shape with other block counts, which the case sets only
            // on axes where the kernel's contract says any count is correct; hkload still
            // checks every extent.
            unsafe { kernel.launch(&dims, StreamHandle::DEFAULT, &args) }?;
        }
    }
    device.synchronize()?;
    let outputs = buffers.outputs()?;
    Ok(Judged {
        verdict: case.check(&outputs),
        worst: worst_error(case, &outputs),
    })
}

/// The largest `|got − want|` over the tolerance `abs + rel·|want|` among the case's outputs
/// compared with [`Expect::Close`]; infinite for NaN, or for any miss of a zero tolerance.
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
            .filter_map(|(i, &g)| layout.at(i).map(|(w, tolerance)| (g, w, tolerance)));
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
