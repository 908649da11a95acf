//! PTX text and the `ptxas -v` report on it: an input is the PTX, then optionally a NUL byte
//! and the report.
#![no_main]

use hk_code_object::{apply_ptxas_report, read_ptx_entries};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let (ptx, report) = match bytes.iter().position(|&b| b == 0) {
        Some(nul) => (&bytes[..nul], bytes.get(nul + 1..)),
        None => (bytes, None),
    };
    let Ok(ptx) = std::str::from_utf8(ptx) else {
        return;
    };
    let Ok(mut kernels) = read_ptx_entries(ptx) else {
        return;
    };
    if let Some(report) = report {
        let _ = apply_ptxas_report(&mut kernels, &String::from_utf8_lossy(report));
    }
});
