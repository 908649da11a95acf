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
use hk_format::target::TargetId;
use hkload::Bundle;

/// `(target, LDS bytes a workgroup may have)`.
const TARGETS: [(&str, u32); 3] = [
    ("gfx90a", 64 * 1024),
    ("gfx942", 64 * 1024),
    ("gfx950", 160 * 1024),
];

fn build_moe_routing(dir: &Path) -> PathBuf {
    let targets: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
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
    for record in &records {
        for &(target, lds_limit) in &TARGETS {
            let target: TargetId = target.parse().unwrap();
            let abi = record
                .targets
                .iter()
                .find(|abi| abi.target == target)
                .unwrap_or_else(|| panic!("{} has no code for {target}", record.symbol));
            assert_eq!(abi.spills, 0, "{} spills on {target}", record.symbol);
            assert_eq!(
                abi.private_segment_size, 0,
                "{} needs scratch on {target}",
                record.symbol
            );
            assert!(
                abi.group_segment_size <= lds_limit,
                "{} uses {} bytes of LDS on {target}, limit {lds_limit}",
                record.symbol,
                abi.group_segment_size
            );
        }
    }
}

#[test]
fn moe_routing_computes_on_the_cdna_emulator() {
    run_on_emulator("moe_routing_emu.py", build_moe_routing);
}
