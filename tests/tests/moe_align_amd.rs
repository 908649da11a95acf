//! The MoE alignment module on AMD (no AMD GPU runs here): built by the real hkpack for gfx90a,
//! gfx942 and gfx950, its kernel fits each target without spills or scratch (the manifest's
//! `no_spills` also fails such a build) and keeps its LDS under the target's limit.
//!
//! With `HK_TINYGRAD` set to a tinygrad source tree, the code of all three targets also runs on
//! its CDNA emulator against a host reference (`tests/emu/moe_align_emu.py`, which runs two
//! deliberately broken copies that must fail); without it that test says it skipped and passes.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use hkload::Bundle;

fn build_moe_align(dir: &Path) -> PathBuf {
    let targets = AMD_LDS.map(|t| t.0);
    build_repo_modules(dir, &["moe_align.toml"], &targets)
}

#[test]
fn moe_align_fits_every_amd_target_without_spills() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = build_moe_align(scratch.path());
    let kernels = Bundle::open(&bundle).unwrap();
    let records = kernels.kernel_records().unwrap();
    assert_eq!(records.len(), 1, "moe_align_block_size alone");
    assert_eq!(records[0].symbol, "moe_align_block_size");
    assert_fits_amd_targets(&records);
}

#[test]
fn moe_align_computes_on_the_cdna_emulator() {
    run_on_emulator("moe_align_emu.py", build_moe_align);
}
