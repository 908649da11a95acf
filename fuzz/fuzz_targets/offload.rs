//! A module file: plain clang offload bundle or compressed `CCOB`, parsed whole, decompressed,
//! and each entry extracted as hkload does when it loads one.
#![no_main]

use hk_format::offload::{OffloadBundle, decompress, extract_entry};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(plain) = decompress(bytes) else {
        // Extraction reads a compressed file without decompressing all of it: try it anyway.
        let _ = extract_entry(bytes, "hipv4-amdgcn-amd-amdhsa--gfx942");
        return;
    };
    if let Ok(bundle) = OffloadBundle::parse(&plain) {
        for entry in bundle.entries() {
            let _ = extract_entry(bytes, entry.id);
        }
    }
    let _ = extract_entry(bytes, "cuda-nvptx64-nvidia-cuda-sm_90");
});
