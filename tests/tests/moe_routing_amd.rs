//! The MoE routing module on AMD (no AMD GPU runs here): built by the real hkpack for gfx90a,
//! gfx942 and gfx950, every kernel fits its target without spills or scratch (the manifest's
//! `no_spills` also fails such a build) and keeps its LDS under the target's limit.
//!
//! With `HK_TINYGRAD` set to a tinygrad source tree, the code of all three targets also runs on
//! its CDNA emulator against an f64 reference (`tests/emu/moe_routing_emu.py`, which says which
//! emulator faults it corrects and runs two deliberately broken copies that must fail); without
//! it that test says it skipped and passes.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use hkload::Bundle;

fn build_moe_routing(dir: &Path) -> PathBuf {
    let targets = AMD_LDS.map(|t| t.0);
    build_repo_modules(dir, &["moe_routing.toml"], &targets)
}

#[test]
fn moe_routing_fits_every_amd_target_without_spills() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = build_moe_routing(scratch.path());
    let kernels = Bundle::open(&bundle).unwrap();
    let records = kernels.kernel_records().unwrap();
    // topk_softmax and grouped_topk, each for bf16, f16 and f32 logits.
    assert_eq!(records.len(), 6);
    assert_fits_amd_targets(&records);
}

#[test]
fn moe_routing_computes_on_the_cdna_emulator() {
    run_on_emulator("moe_routing_emu.py", build_moe_routing);
}
