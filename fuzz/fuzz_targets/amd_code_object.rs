//! A linked AMDGPU code object: ELF header, metadata notes, symbol tables, and the target its
//! `e_flags` name.
#![no_main]

use hk_code_object::read_amd_code_object;
use hk_format::target::TargetId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(object) = read_amd_code_object(bytes) {
        let _ = TargetId::from_amd_e_flags(object.header.e_flags);
    }
});
