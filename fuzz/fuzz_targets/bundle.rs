//! A whole bundle folder as hkload uses it: the index and a module file, opened unverified (a
//! verified open only adds hashes over the same bytes), explained, and loaded for a simulated
//! GPU of each vendor, with every kernel looked up.
//!
//! An input is the index's size (4 bytes, little-endian), the index, then the bytes of the
//! module file the index names first.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use hkload::driver::RecordingDriver;
use hkload::{Bundle, Device, OpenOptions};
use libfuzzer_sys::fuzz_target;

/// The bundle folder, emptied before each input.
static DIR: LazyLock<PathBuf> =
    LazyLock::new(|| std::env::temp_dir().join(format!("hk-fuzz-bundle-{}", std::process::id())));

const DEVICES: [&str; 3] = ["gfx942:sramecc+:xnack-", "sm_90", "sm_100"];

fuzz_target!(|bytes: &[u8]| {
    let Some((size, rest)) = bytes.split_first_chunk::<4>() else {
        return;
    };
    let Some((index, module)) = rest.split_at_checked(u32::from_le_bytes(*size) as usize) else {
        return;
    };
    let dir = &*DIR;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("the fuzzer can write its temporary folder");
    std::fs::write(dir.join("bundle.msgpack"), index).expect("the fuzzer can write the index");
    let options = OpenOptions {
        verify_hashes: false,
        ..OpenOptions::DEFAULT
    };
    let Ok(bundle) = Bundle::open_with(dir, options) else {
        return;
    };
    // A name the file system refuses (too long, say) leaves the module missing, which
    // hkload must report as well.
    if let Some(first) = bundle.table().modules().next() {
        let _ = std::fs::write(dir.join(first.file()), module);
    }
    let _ = bundle.manifest();
    let _ = bundle.kernel_records();
    let symbols: Vec<String> = bundle.table().kernel_symbols().map(str::to_owned).collect();
    for device in DEVICES {
        let Ok(target) = device.parse() else {
            continue;
        };
        let _ = bundle.explain(&target).to_string();
        let driver = Arc::new(RecordingDriver::new([target]));
        let Ok(device) = Device::new(driver, 0) else {
            continue;
        };
        let Ok(loaded) = bundle.load(&device) else {
            continue;
        };
        let _ = loaded.preload();
        for symbol in &symbols {
            let _ = loaded.kernel(symbol);
        }
    }
});
