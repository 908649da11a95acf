//! `bundle.msgpack`: the header, the lookup table and every accessor over it, the manifest,
//! and every kernel's record, unverified (a verified open only adds a hash over the same bytes).
#![no_main]

use hk_format::index::Index;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(index) = Index::open(bytes.to_vec(), false) else {
        return;
    };
    let table = index.table();
    let _ = table.package();
    for module in table.modules() {
        let _ = (
            module.name(),
            module.file(),
            module.size(),
            module.compressed(),
        );
        let _ = module.entry_ids();
    }
    let symbols: Vec<String> = table.kernel_symbols().map(str::to_owned).collect();
    for symbol in &symbols {
        let _ = table.find_kernel(symbol);
    }
    for at in table.kernels().collect::<Vec<_>>() {
        let _ = index.kernel_record(at.row);
    }
    for module in 0..table.modules().len() {
        let _ = index.module_abi(module);
    }
    let _ = index.manifest();
});
