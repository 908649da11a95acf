//! The TOML files of a bundle: `bundle.toml` and a module's ABI file (`<module>.abi.toml`).
//! An input is read as both; an ABI file is checked against the manifest's first module when
//! the input is a manifest, else against a one-kernel module.
#![no_main]

use hk_format::manifest::{Blake3Digest, BundleManifest, ModuleAbi, ModuleRecord, Sha256Digest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let manifest = BundleManifest::from_toml(text);
    if let Ok(manifest) = &manifest {
        let _ = manifest.to_toml();
    }
    let module = match manifest.ok().and_then(|m| m.modules.into_iter().next()) {
        Some(module) => module,
        None => ModuleRecord {
            name: "scale".into(),
            file: "scale.hipfb".into(),
            size: 0,
            sha256: Sha256Digest([0; 32]),
            compressed: false,
            kernels: vec!["scale".into()],
            abi_file: "scale.abi.toml".into(),
            abi_sha256: Sha256Digest([0; 32]),
            entries: Vec::new(),
            not_built: Vec::new(),
            blake3: Blake3Digest([0; 32]),
        },
    };
    if let Ok(abi) = ModuleAbi::from_toml(text, &module) {
        let _ = abi.to_toml();
    }
});
