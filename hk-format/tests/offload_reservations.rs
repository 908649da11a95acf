//! A compressed module whose header claims far more than its payload can hold is refused
//! before anything of that size is reserved (hardening issue #38): one edited byte of a small
//! file's header used to make hkload reserve 2 GiB before any digest was checked, which a
//! process under a memory limit cannot survive.
//!
//! Its own test binary, since it watches every allocation through the global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use hk_format::offload;

/// The system allocator, noting the largest block each thread asks for.
struct Watch;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: a thread's slot may be gone while the thread exits.
    let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static WATCH: Watch = Watch;

/// What `f` returns, and the largest block it asked for on this thread.
fn largest_block<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.set(0);
    let value = f();
    (value, LARGEST.get())
}

/// More than any step of reading this test's 16 KB module needs, far less than its header
/// claims.
const MODEST: usize = 64 << 20;

const ID: &str = "hipv4-amdgcn-amd-amdhsa--gfx942";

/// A valid compressed module (CCOB version 2, as hkpack writes) of one 10 KB image.
fn module() -> Vec<u8> {
    let image: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let plain = offload::write_bundle(&[(ID, &image)]).unwrap();
    offload::compress(&plain, 3).unwrap()
}

/// Version 2's header: magic, version, method, total size (4 bytes), then the uncompressed size
/// (4 bytes, little-endian) and the hash.
const UNCOMPRESSED_SIZE_AT: usize = 12;
const V2_HEADER_LEN: usize = 24;

/// Both ways hkload and hkpack read a compressed module refuse `bytes`, asking for no block
/// near what its header claims; returns their messages.
fn refused_modestly(bytes: &[u8]) -> [String; 2] {
    let reads: [&dyn Fn() -> Result<(), offload::FormatError>; 2] =
        [&|| offload::decompress(bytes).map(drop), &|| {
            offload::extract_entry(bytes, ID).map(drop)
        }];
    reads.map(|read| {
        let (result, largest) = largest_block(read);
        let message = match result {
            Ok(()) => panic!("a header that lies about its size was accepted"),
            Err(error) => error.to_string(),
        };
        assert!(
            largest < MODEST,
            "reading the module asked for a block of {largest} bytes before refusing it: {message}"
        );
        message
    })
}

#[test]
fn the_module_reads_when_its_header_is_honest() {
    let bytes = module();
    let (image, largest) = largest_block(|| offload::extract_entry(&bytes, ID).unwrap());
    assert_eq!(image.len(), 10_000);
    assert!(largest < MODEST);
}

#[test]
fn a_header_edited_to_claim_2_gib_is_refused_before_anything_is_reserved() {
    let mut bytes = module();
    // One byte: the size's highest, which makes it almost 2 GiB, just under the absolute cap.
    bytes[UNCOMPRESSED_SIZE_AT + 3] = 0x7f;
    for message in refused_modestly(&bytes) {
        assert!(
            message.contains("more than a compressed file of"),
            "the error names the bound: {message}"
        );
    }
}

#[test]
fn a_version_3_header_claiming_u64_max_is_refused_before_anything_is_reserved() {
    let v2 = module();
    let payload = &v2[V2_HEADER_LEN..];
    let mut bytes = b"CCOB".to_vec();
    bytes.extend_from_slice(&3u16.to_le_bytes());
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&(32 + payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    bytes.extend_from_slice(&v2[16..V2_HEADER_LEN]);
    bytes.extend_from_slice(payload);
    refused_modestly(&bytes);
}
