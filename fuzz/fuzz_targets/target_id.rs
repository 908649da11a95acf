//! Target IDs, entry IDs and AMD `e_flags`, and the choice among entries: an input is lines,
//! the first a device's target ID and the rest a module's entry IDs; its first four bytes are
//! also read as `e_flags`.
#![no_main]

use hk_format::target::{EntryId, TargetId, generic_version};
use hkload::select::select;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Some(flags) = bytes.first_chunk::<4>() {
        let e_flags = u32::from_le_bytes(*flags);
        let _ = (
            TargetId::from_amd_e_flags(e_flags),
            generic_version(e_flags),
        );
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let mut lines = text.lines();
    let device = lines.next().map(str::parse::<TargetId>);
    let entries: Vec<EntryId> = lines
        .filter_map(|line| {
            let _ = line.parse::<TargetId>().map(|t| t.to_string());
            line.parse().ok()
        })
        .collect();
    for entry in &entries {
        assert_eq!(entry.to_string().parse::<EntryId>().as_ref(), Ok(entry));
    }
    if let Some(Ok(device)) = device {
        assert_eq!(device.to_string().parse::<TargetId>().as_ref(), Ok(&device));
        let _ = select(&device, &entries).to_string();
    }
});
