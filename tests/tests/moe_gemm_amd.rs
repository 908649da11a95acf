//! The MoE grouped GEMMs on AMD, statically (no AMD GPU runs here): built by the real hkpack
//! for gfx90a, gfx942 and gfx950, every kernel fits its target without spills or scratch and
//! keeps its LDS under the target's limit, and the GEMMs contain the MFMA instructions of their
//! element type (read back by `llvm-objdump --mcpu=<target>`).
//!
//! With `HK_TINYGRAD` set to a tinygrad source tree, the gfx942 and gfx950 code also runs on
//! its CDNA emulator against an f64 reference (`tests/emu/moe_gemm_emu.py`, with a host form of
//! the routing's sorted layout, and a deliberately broken copy that must fail); without it that
//! test says it skipped and passes.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use hk_format::manifest::{BundleManifest, MANIFEST_FILE};
use hkload::Bundle;

/// `(target, MFMA mnemonic of bf16 kernels, of f16 kernels)`.
const TARGETS: [(&str, &str, &str); 3] = [
    (
        "gfx90a",
        "v_mfma_f32_16x16x16bf16_1k",
        "v_mfma_f32_16x16x16f16",
    ),
    (
        "gfx942",
        "v_mfma_f32_16x16x16_bf16",
        "v_mfma_f32_16x16x16_f16",
    ),
    (
        "gfx950",
        "v_mfma_f32_16x16x32_bf16",
        "v_mfma_f32_16x16x32_f16",
    ),
];

fn build_moe_gemm(dir: &Path) -> PathBuf {
    let targets: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
    build_repo_modules(dir, &["moe_gemm.toml"], &targets)
}

#[test]
fn moe_gemm_fits_every_amd_target_and_uses_its_mfma() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = build_moe_gemm(scratch.path());
    let kernels = Bundle::open(&bundle).unwrap();
    let records = kernels.kernel_records().unwrap();
    // Stage 1 and stage 2 in both forms (blocks of 128 and of 16 rows) and the combine, each
    // for bf16 and f16.
    assert_eq!(records.len(), 10);
    assert_fits_amd_targets(&records);

    let manifest =
        BundleManifest::from_toml(&std::fs::read_to_string(bundle.join(MANIFEST_FILE)).unwrap())
            .unwrap();
    let module = &manifest.modules[0];
    for &(target, bf16_mfma, f16_mfma) in &TARGETS {
        let text = amd_disassembly(&bundle, &module.file, target, scratch.path());
        for record in &records {
            let body = function_body(&text, &record.symbol)
                .unwrap_or_else(|| panic!("{} not in the disassembly for {target}", record.symbol));
            let mnemonics = mnemonics(body);
            let mfmas = mnemonics.iter().filter(|m| m.starts_with("v_mfma")).count();
            if record.symbol.starts_with("moe_sum") {
                assert_eq!(
                    mfmas, 0,
                    "{} on {target} multiplies matrices",
                    record.symbol
                );
                continue;
            }
            let (want, other) = if record.symbol.ends_with("_bf16") {
                (bf16_mfma, f16_mfma)
            } else {
                (f16_mfma, bf16_mfma)
            };
            let count = mnemonics.iter().filter(|&&m| m == want).count();
            // Atoms a wave holds (2 x (4 x 2) for stage 1's two 64 x 32 products, 4 x 4 for
            // stage 2's 64 x 64; in the _m16 form 2 x 1 for stage 1's two 16 x 16, 1 x 2 for
            // stage 2's 16 x 32) times the step's depth over the instruction's k (16; 32 on
            // gfx950), in each of the two K loops (one per copy path, chosen before the loop).
            // Steps are 32 deep; stage 2's are 64 on gfx950, as the dense GEMM's.
            let gfx950 = target == "gfx950";
            let m16 = record.symbol.contains("_m16_");
            let depth = if gfx950 && !m16 && record.symbol.contains("_down_") {
                64
            } else {
                32
            };
            let atoms = if m16 { 2 } else { 16 };
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
fn moe_gemm_computes_on_the_cdna_emulator() {
    run_on_emulator("moe_gemm_emu.py", build_moe_gemm);
}
