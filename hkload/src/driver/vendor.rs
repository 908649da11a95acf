//! What the CUDA and HIP drivers share: the two vendor APIs launch a kernel from a packed
//! argument buffer the same way (an `extra` array of markers, differently numbered), keep their
//! launch tables keyed by the same kind of handle, and word their failures alike.

use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::{BuildHasherDefault, Hasher};
use std::ptr;

use super::{DriverError, FunctionHandle, LaunchDims};

/// A table keyed by a handle the vendor API hands out (a function or module pointer), read on
/// every launch.
pub(crate) type HandleMap<V> = HashMap<u64, V, BuildHasherDefault<HandleHasher>>;

/// Hashes handle keys with one folded multiply. SipHash's resistance to chosen keys buys
/// nothing for pointers the driver hands out, and costs several nanoseconds on every launch.
#[derive(Default)]
pub(crate) struct HandleHasher(u64);

impl Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(self.0 ^ u64::from(byte));
        }
    }

    fn write_u64(&mut self, key: u64) {
        // The high half of the product carries every key bit into the low bits that pick the
        // bucket, which aligned pointers would otherwise leave all zero.
        let product = u128::from(key) * 0x9E37_79B9_7F4A_7C15;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

/// The markers of a launch's `extra` array, as one vendor numbers them: the packed argument
/// buffer, its size, and the end of the array.
pub(crate) struct ExtraMarkers {
    pub buffer_pointer: usize,
    pub buffer_size: usize,
    pub end: usize,
}

/// Calls `launch` with the `extra` array that hands the driver `args`, a kernel's packed
/// argument buffer, or with null for a kernel without arguments (which gets no buffer at all).
/// The array and the size it points to live until `launch` returns; the driver copies the
/// arguments during the call.
pub(crate) fn with_packed_args<R>(
    args: &[u8],
    markers: &ExtraMarkers,
    launch: impl FnOnce(*mut *mut c_void) -> R,
) -> R {
    let mut size = args.len();
    let mut extra = [
        markers.buffer_pointer as *mut c_void,
        args.as_ptr().cast_mut().cast(),
        markers.buffer_size as *mut c_void,
        (&raw mut size).cast(),
        markers.end as *mut c_void,
    ];
    launch(if args.is_empty() {
        ptr::null_mut()
    } else {
        extra.as_mut_ptr()
    })
}

/// The error for launching a function the driver's launch table does not hold.
pub(crate) fn unknown_function(call: &'static str, function: FunctionHandle) -> DriverError {
    DriverError::Call {
        call,
        detail: format!(
            "function {:#x} was not looked up through this driver, or its module is unloaded",
            function.0
        ),
    }
}

/// What a failed launch was doing, for [`doing`].
pub(crate) fn describe_launch(dims: &LaunchDims, args: &[u8]) -> String {
    format!(
        "launching grid {:?}, block {:?}, {} bytes of dynamic shared memory, {} bytes of \
         arguments",
        dims.grid,
        dims.block,
        dims.shared_bytes,
        args.len()
    )
}

/// Adds what the failed call was doing to its error, as `… while <what>`.
pub(crate) fn doing(what: impl FnOnce() -> String) -> impl FnOnce(DriverError) -> DriverError {
    move |error| match error {
        DriverError::Call { call, detail } => DriverError::Call {
            call,
            detail: format!("{detail} while {}", what()),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_hashes_spread_aligned_pointers_over_buckets() {
        let buckets: std::collections::HashSet<u64> = (0..64u64)
            .map(|i| {
                let mut hasher = HandleHasher::default();
                hasher.write_u64(0x7f3a_1200_0000 + i * 4096);
                hasher.finish() % 64
            })
            .collect();
        assert!(buckets.len() >= 32, "{} of 64 buckets used", buckets.len());
    }

    #[test]
    fn packed_args_go_behind_the_vendor_markers() {
        let markers = ExtraMarkers {
            buffer_pointer: 1,
            buffer_size: 2,
            end: 3,
        };
        let args = [7u8; 12];
        with_packed_args(&args, &markers, |extra| {
            // SAFETY: a non-empty buffer gets the five-slot array, live during the call.
            let extra = unsafe { std::slice::from_raw_parts(extra, 5) };
            assert_eq!(extra[0] as usize, 1);
            assert_eq!(extra[1].cast_const(), args.as_ptr().cast());
            assert_eq!(extra[2] as usize, 2);
            // SAFETY: the size slot points at a live usize.
            assert_eq!(unsafe { *extra[3].cast::<usize>() }, 12);
            assert_eq!(extra[4] as usize, 3);
        });
        with_packed_args(&[], &markers, |extra| assert!(extra.is_null()));
    }

    #[test]
    fn failed_calls_say_what_they_were_doing() {
        let error = DriverError::Call {
            call: "cuMemAlloc",
            detail: "CUDA_ERROR_OUT_OF_MEMORY (out of memory)".into(),
        };
        let error = doing(|| "allocating 8 bytes on CUDA device 0".into())(error);
        assert_eq!(
            error.to_string(),
            "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory) while allocating 8 \
             bytes on CUDA device 0"
        );
        let unavailable = DriverError::Unavailable {
            api: "cuda",
            detail: "no library".into(),
        };
        assert_eq!(doing(String::new)(unavailable.clone()), unavailable);
    }
}
