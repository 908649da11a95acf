//! The GEMM module on AMD, statically (no AMD GPU runs here): built by the real hkpack for
//! gfx90a, gfx942 and gfx950, every kernel must fit its target without spills or scratch, keep
//! its LDS under the target's limit, and contain the MFMA instructions of its element type
//! (read back by `llvm-objdump --mcpu=<target>`, not taken from our own metadata). And
//! `no_spills = true`, which the module's manifest sets, must fail a build that spills.
//!
//! With `HK_TINYGRAD` set to a tinygrad source tree, the gfx942 and gfx950 code also runs on
//! its CDNA emulator against an f64 reference (`tests/emu/gemm_emu.py`); without it that test
//! says it skipped and passes.

mod common;

use std::path::Path;

use common::*;
use hk_format::manifest::{BundleManifest, MANIFEST_FILE};
use hk_format::target::TargetId;
use hkload::Bundle;

/// `(target, LDS bytes a workgroup may have, MFMA mnemonic of bf16 kernels, of f16 kernels)`.
const TARGETS: [(&str, u32, &str, &str); 3] = [
    (
        "gfx90a",
        64 * 1024,
        "v_mfma_f32_16x16x16bf16_1k",
        "v_mfma_f32_16x16x16f16",
    ),
    (
        "gfx942",
        64 * 1024,
        "v_mfma_f32_16x16x16_bf16",
        "v_mfma_f32_16x16x16_f16",
    ),
    (
        "gfx950",
        160 * 1024,
        "v_mfma_f32_16x16x32_bf16",
        "v_mfma_f32_16x16x32_f16",
    ),
];

/// The repository's gemm module alone, built for the AMD targets into `dir`.
fn build_gemm(dir: &Path) -> std::path::PathBuf {
    let targets: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
    build_repo_modules(dir, &["gemm.toml"], &targets)
}

#[test]
fn gemm_fits_every_amd_target_and_uses_its_mfma() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = build_gemm(scratch.path());

    let kernels = Bundle::open(&bundle).unwrap();
    let records = kernels.kernel_records().unwrap();
    assert_eq!(records.len(), 28);
    for record in &records {
        for &(target, lds_limit, ..) in &TARGETS {
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
                abi.group_segment_size > 0 && abi.group_segment_size <= lds_limit,
                "{} uses {} bytes of LDS on {target}, limit {lds_limit}",
                record.symbol,
                abi.group_segment_size
            );
        }
    }

    let manifest =
        BundleManifest::from_toml(&std::fs::read_to_string(bundle.join(MANIFEST_FILE)).unwrap())
            .unwrap();
    let module = &manifest.modules[0];
    for &(target, _, bf16_mfma, f16_mfma) in &TARGETS {
        let text = amd_disassembly(&bundle, &module.file, target, scratch.path());
        for record in &records {
            let body = function_body(&text, &record.symbol)
                .unwrap_or_else(|| panic!("{} not in the disassembly for {target}", record.symbol));
            let (want, other) = if record.symbol.contains("_bf16") {
                (bf16_mfma, f16_mfma)
            } else {
                (f16_mfma, bf16_mfma)
            };
            let mnemonics = mnemonics(body);
            let count = mnemonics.iter().filter(|&&m| m == want).count();
            // Atoms a wave holds (4 x 4 of a 64 x 64 wave block, 2 x (4 x 2) for the gated
            // kernels' two products, 1 of split K's 16 x 16) times the step's depth over the
            // instruction's k (16; 32 on gfx950), in each of the two K loops (one per copy path,
            // chosen before the loop). Steps are 32 deep, split K's 64, and on gfx950, whose
            // LDS holds two blocks of them, the 128 x 128 kernels' 64.
            let gfx950 = target == "gfx950";
            let (atoms, depth) = if record.symbol.contains("splitk") {
                (1, 64)
            } else if record.symbol.contains("gated") {
                (16, 32)
            } else {
                (16, if gfx950 { 64 } else { 32 })
            };
            let expected = 2 * atoms * depth / if gfx950 { 32 } else { 16 };
            assert_eq!(
                count, expected,
                "{} on {target}: {count} x {want}, expected {expected}",
                record.symbol
            );
            assert!(
                !mnemonics.contains(&other),
                "{} on {target} has {other}",
                record.symbol
            );
        }
    }
}

#[test]
fn gemm_computes_on_the_cdna_emulator() {
    run_on_emulator("gemm_emu.py", build_gemm);
}

/// Indexes a private array by a run-time value, which puts it in scratch memory.
const SCRATCH_SOURCE: &str = r#"
#include "mini.h"
KERNEL void gather(float* out, const float* x, unsigned n) {
    float buf[64];
    for (unsigned i = 0; i < 64; ++i) buf[i] = x[i * n + THREAD_X()];
    out[THREAD_X()] = buf[(THREAD_X() * 7 + n) % 64];
}
"#;

const SCRATCH_MANIFEST: &str = r#"
[module]
name = "gather"
source = "../kernels/gather.hip"
no_spills = true

[[kernel]]
symbol = "gather"
args = ["out: *mut f32", "x: *const f32", "n: u32"]
"#;

#[test]
fn no_spills_fails_a_build_that_needs_scratch() {
    let package = TempPackage::new(&["gfx942"], &[("gather", SCRATCH_SOURCE, SCRATCH_MANIFEST)]);
    let error = match hkpack::build(&package.options()) {
        Ok(report) => panic!("the build should have failed but said: {report}"),
        Err(e) => e.to_string(),
    };
    for part in [
        "kernel `gather` on gfx942",
        "bytes of scratch",
        "no_spills = true",
    ] {
        assert!(error.contains(part), "`{part}` not in:\n{error}");
    }
    // Without the key the same module builds.
    let allowed = SCRATCH_MANIFEST.replace("no_spills = true\n", "");
    let package = TempPackage::new(&["gfx942"], &[("gather", SCRATCH_SOURCE, &allowed)]);
    build_ok(&package.options());
}
