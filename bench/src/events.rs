//! Timing GPU work on the default stream of the current CUDA context: an event between each
//! two launches, the launches queued in chunks of [`CHUNK`] behind a [`Gate`] (the stream waits
//! on a word of host memory that the host sets once the whole chunk is queued). The GPU then
//! never waits for the host, and an event pair measures the kernel (and the gap between two
//! queued kernels), not the host's launch latency; nothing else runs on the GPU, so no cache is
//! touched in between. `bench/python/kernel_bench.py` times PyTorch the same way.

use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{Ordering, fence};

use hkload::Device;
use hkload::driver::CudaDriver;
use hkload::driver::cuda::{EVENT_SYMBOLS, sys};

use crate::timing::Stats;

/// Timed launches queued behind one gate; few enough that a chunk and its events stay
/// far below the depth of the driver's launch queue, so queueing never blocks the host.
pub const CHUNK: usize = 25;

/// Per-launch device times of one shape.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
}

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// A CUDA event of the current context; destroyed on drop.
struct Event(sys::CUevent);

impl Event {
    fn new() -> Result<Self, String> {
        let mut event = ptr::null_mut();
        // SAFETY: `event` is a valid place for the handle; flags 0 is CU_EVENT_DEFAULT (timed).
        cu("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut event, 0)
        })?;
        Ok(Self(event))
    }

    fn record(&self) -> Result<(), String> {
        // SAFETY: the event is live; the null stream is the default stream, where the
        // launches go.
        cu("cuEventRecord", unsafe {
            sys::cuEventRecord(self.0, ptr::null_mut())
        })
    }

    fn synchronize(&self) -> Result<(), String> {
        // SAFETY: the event is live and recorded.
        cu("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.0)
        })
    }

    /// Seconds from `self` to `end`, both completed.
    fn seconds_to(&self, end: &Event) -> Result<f64, String> {
        let mut milliseconds = 0f32;
        // SAFETY: both events are live, recorded and complete.
        cu("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut milliseconds, self.0, end.0)
        })?;
        Ok(f64::from(milliseconds) / 1e3)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once; nothing waits on it any more.
        let _ = unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

fn cu(call: &str, result: sys::CUresult) -> Result<(), String> {
    match result {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        error => Err(format!("{call} failed: {error:?}")),
    }
}

/// Holds the default stream back while the host queues work: the stream waits until a word
/// of pinned host memory reaches the turn of the current hold, and the host writes it when the
/// hold ends. Unlike a head start of busy work, it needs no guess of how long queueing takes
/// and touches no memory the kernels use.
struct Gate {
    /// The word, in host memory mapped for the device.
    word: *mut u32,
    /// The same word as the device addresses it.
    device_word: sys::CUdeviceptr,
    /// The turn of the last hold.
    turn: Cell<u32>,
}

impl Gate {
    /// The driver calls a gate makes, checked up front: cudarc's loader panics on a missing one.
    const SYMBOLS: &[&str] = &[
        "cuMemHostAlloc",
        "cuMemHostGetDevicePointer_v2",
        "cuMemFreeHost",
        "cuStreamWaitValue32_v2",
    ];

    fn new(cuda: &CudaDriver) -> Result<Self, String> {
        cuda.require(Self::SYMBOLS).map_err(text)?;
        let mut host = ptr::null_mut();
        // SAFETY: `host` is a valid place for the pointer; 4 bytes hold the word.
        cu("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut host, 4, sys::CU_MEMHOSTALLOC_DEVICEMAP)
        })?;
        let word = host.cast::<u32>();
        let mut gate = Self {
            word,
            device_word: 0,
            turn: Cell::new(0),
        };
        // SAFETY: `word` is pinned host memory of this process, aligned and live until drop.
        unsafe { word.write_volatile(0) };
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP; flags must be 0.
        cu("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut gate.device_word, host, 0)
        })?;
        Ok(gate)
    }

    /// Queues a wait on the default stream that lasts until the returned hold is dropped.
    fn hold(&self) -> Result<Hold<'_>, String> {
        let turn = self.turn.get().wrapping_add(1);
        self.turn.set(turn);
        // SAFETY: the word is live device-mapped memory; the null stream is the default
        // stream, where the launches go. Turns only grow (a wrap takes 4 billion chunks).
        cu("cuStreamWaitValue32", unsafe {
            sys::cuStreamWaitValue32_v2(
                ptr::null_mut(),
                self.device_word,
                turn,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        })?;
        Ok(Hold { gate: self, turn })
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once; every hold has ended (they
        // borrow the gate) and the timer synchronised after the last one.
        let _ = unsafe { sys::cuMemFreeHost(self.word.cast()) };
    }
}

/// A wait of the default stream on a [`Gate`]; the GPU goes on when it is dropped, also when
/// queueing failed half-way.
struct Hold<'a> {
    gate: &'a Gate,
    turn: u32,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        // Everything queued before this point is in the stream ahead of the wait's end.
        fence(Ordering::SeqCst);
        // SAFETY: the word is live pinned memory that only this thread writes.
        unsafe { self.gate.word.write_volatile(self.turn) };
    }
}

/// Times launches with an event between each two, in chunks queued behind a [`Gate`].
pub struct Timer<'a> {
    device: &'a Device,
    gate: Gate,
    /// `CHUNK + 1` events around the launches of a chunk.
    events: Vec<Event>,
}

impl<'a> Timer<'a> {
    /// A timer for launches on `device`'s default stream; its context must be current.
    pub fn new(cuda: &CudaDriver, device: &'a Device) -> Result<Self, String> {
        // cudarc's loader panics on a missing entry point; `require` reports it instead.
        cuda.require(EVENT_SYMBOLS).map_err(text)?;
        Ok(Self {
            device,
            gate: Gate::new(cuda)?,
            events: (0..=CHUNK)
                .map(|_| Event::new())
                .collect::<Result<_, _>>()?,
        })
    }

    /// Runs `launch(i)` for `warmup` untimed launches and `iters` timed ones (`i` counting on
    /// through both), and returns the statistics of the timed ones.
    pub fn time(
        &self,
        mut launch: impl FnMut(usize) -> Result<(), String>,
        warmup: usize,
        iters: usize,
    ) -> Result<Timing, String> {
        (0..warmup).try_for_each(&mut launch)?;
        self.device.synchronize().map_err(text)?;

        let (first, rest) = self.events.split_first().ok_or("the timer has no events")?;
        let mut samples = Vec::with_capacity(iters);
        let mut done = 0;
        while done < iters {
            let chunk = rest.get(..CHUNK.min(iters - done)).unwrap_or(rest);
            {
                let _hold = self.gate.hold()?;
                first.record()?;
                for (j, event) in chunk.iter().enumerate() {
                    launch(warmup + done + j)?;
                    event.record()?;
                }
            }
            chunk.last().unwrap_or(first).synchronize()?;
            let mut start = first;
            for end in chunk {
                samples.push(start.seconds_to(end)?);
                start = end;
            }
            done += chunk.len();
        }
        let stats = Stats::of(&samples);
        Ok(Timing {
            median_us: stats.median * 1e6,
            p10_us: stats.p10 * 1e6,
            p90_us: stats.p90 * 1e6,
        })
    }
}
