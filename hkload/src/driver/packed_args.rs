//! How CUDA and HIP take a kernel's packed argument buffer: `cuLaunchKernel` and
//! `hipModuleLaunchKernel` have the same C signature and both accept the buffer through their
//! `extra` array of markers (numbered differently), so one function launches for both.

use std::ffi::{c_uint, c_void};
use std::ptr;

use super::LaunchDims;

/// The C signature `cuLaunchKernel` and `hipModuleLaunchKernel` share: the function; grid x, y,
/// z; block x, y, z; dynamic shared memory in bytes; the stream; `kernelParams`; `extra`.
pub(crate) type LaunchKernelFn<Function, Stream, Status> = unsafe extern "C" fn(
    Function,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Stream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> Status;

/// The markers of a launch's `extra` array, as one vendor numbers them: the packed argument
/// buffer, its size, and the end of the array.
pub(crate) struct ExtraMarkers {
    pub buffer_pointer: usize,
    pub buffer_size: usize,
    pub end: usize,
}

/// Calls `launch_kernel` for `function` on `stream` with the shape `dims` and `args`, the
/// kernel's packed argument buffer, in an `extra` array of `markers` (or null for a kernel
/// without arguments, which gets no buffer at all), and returns its status. The array and the
/// size it points to live until the call returns; the API copies the arguments during the call.
///
/// # Safety
///
/// `launch_kernel` must be the vendor's entry point; `function` a function of a live module,
/// in the context (or on the device) current on this thread; `stream` null or a stream of that
/// context; and `args` laid out as the kernel's parameters are.
pub(crate) unsafe fn launch_packed<Function, Stream, Status>(
    launch_kernel: LaunchKernelFn<Function, Stream, Status>,
    markers: &ExtraMarkers,
    function: Function,
    dims: &LaunchDims,
    stream: Stream,
    args: &[u8],
) -> Status {
    let mut size = args.len();
    let mut extra = [
        markers.buffer_pointer as *mut c_void,
        args.as_ptr().cast_mut().cast(),
        markers.buffer_size as *mut c_void,
        (&raw mut size).cast(),
        markers.end as *mut c_void,
    ];
    let extra = match args.is_empty() {
        true => ptr::null_mut(),
        false => extra.as_mut_ptr(),
    };
    let [grid_x, grid_y, grid_z] = dims.grid;
    let [block_x, block_y, block_z] = dims.block;
    // SAFETY: the caller vouches for the entry point, the function, the stream and the
    // arguments; `extra` and what it points to outlive the call.
    unsafe {
        launch_kernel(
            function,
            grid_x,
            grid_y,
            grid_z,
            block_x,
            block_y,
            block_z,
            dims.shared_bytes,
            stream,
            ptr::null_mut(),
            extra,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    const MARKERS: ExtraMarkers = ExtraMarkers {
        buffer_pointer: 1,
        buffer_size: 2,
        end: 3,
    };

    /// What [`fake_launch`] was given: its arguments up to `kernelParams` in order, and the
    /// `extra` array's five slots with the size read through its pointer (empty for a null
    /// array).
    type Seen = (Vec<u64>, Vec<usize>);

    thread_local! {
        static SEEN: RefCell<Option<Seen>> = const { RefCell::new(None) };
    }

    /// Stands in for a vendor's launch entry point, recording what it was given.
    unsafe extern "C" fn fake_launch(
        function: u64,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared: c_uint,
        stream: u64,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> i32 {
        let scalars = [grid_x, grid_y, grid_z, block_x, block_y, block_z, shared];
        let mut seen = vec![function];
        seen.extend(scalars.map(u64::from));
        seen.push(stream);
        seen.push(params as u64);
        let slots = match extra.is_null() {
            true => Vec::new(),
            false => {
                // SAFETY: a non-null array has the five slots `launch_packed` fills.
                let slots = unsafe { std::slice::from_raw_parts(extra, 5) };
                // SAFETY: the size slot points at a live usize.
                let size = unsafe { *slots[3].cast::<usize>() };
                let mut slots: Vec<usize> = slots.iter().map(|&slot| slot as usize).collect();
                slots[3] = size;
                slots
            }
        };
        SEEN.set(Some((seen, slots)));
        7
    }

    fn launch(args: &[u8]) -> Seen {
        let dims = LaunchDims {
            grid: [10, 11, 12],
            block: [20, 21, 22],
            shared_bytes: 30,
        };
        // SAFETY: the fake entry point reads only what `launch_packed` promises.
        let status = unsafe { launch_packed(fake_launch, &MARKERS, 5, &dims, 6, args) };
        assert_eq!(status, 7, "the entry point's status comes back");
        SEEN.take().expect("the entry point was called")
    }

    #[test]
    fn the_shape_goes_in_the_order_both_apis_declare() {
        let (scalars, _) = launch(&[]);
        // The last is `kernelParams`, null: the arguments go through `extra` only.
        assert_eq!(scalars, [5, 10, 11, 12, 20, 21, 22, 30, 6, 0]);
    }

    #[test]
    fn packed_args_go_behind_the_vendor_markers() {
        let args = [7u8; 12];
        let (_, slots) = launch(&args);
        assert_eq!(slots, [1, args.as_ptr() as usize, 2, 12, 3]);
        let (_, slots) = launch(&[]);
        assert!(
            slots.is_empty(),
            "a kernel without arguments gets a null `extra`"
        );
    }
}
