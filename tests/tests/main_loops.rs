//! The main-loop report (`hkpack inspect --main-loops`) over the repository's GEMM modules,
//! built by the real hkpack for gfx90a, gfx942 and gfx950: every kernel of them is a matrix
//! kernel on every target it is built for, with a main loop that holds its MFMAs, and llvm-mca
//! (llvm-22, which scripts/setup installs) gives the matrix unit a share of the loop's cycles in
//! (0, 1], the same from its resource pressure as from the MFMAs' throughputs.

mod common;

use common::*;
use hkload::Bundle;
use hkpack::inspect::main_loop::{self, LlvmTools, LoopView};

/// The modules of matrix kernels.
const GEMM_MODULES: [&str; 5] = [
    "gemm.toml",
    "gemm_a8w8.toml",
    "gemm_fp8_e4m3fn.toml",
    "gemm_fp8_e4m3fnuz.toml",
    "gemm_a16w8.toml",
];

fn check_view(what: &str, view: &LoopView) {
    let simulation = &view.simulation;
    assert!(view.mix.mfma > 0, "{what}: no MFMA");
    assert!(
        simulation.matrix_share > 0.0 && simulation.matrix_share <= 1.0,
        "{what}: share {simulation:?}"
    );
    // Nothing but the MFMAs holds the matrix unit.
    assert!(
        (simulation.matrix_cycles - simulation.mfma_cycles).abs() < 1e-6,
        "{what}: {simulation:?}"
    );
}

#[test]
fn every_gemm_kernel_has_a_main_loop_that_keeps_the_matrix_unit_busy() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = build_repo_modules(
        scratch.path(),
        &GEMM_MODULES,
        &["gfx90a", "gfx942", "gfx950"],
    );
    let tools = LlvmTools::discover().unwrap();
    let report = main_loop::report(&bundle, &tools, None).unwrap();

    let opened = Bundle::open(&bundle).unwrap();
    let manifest = opened.manifest().unwrap();
    let mut expected = 0;
    for module in &manifest.modules {
        for entry in &module.entries {
            let target = entry.id.target();
            for kernel in &module.kernels {
                expected += 1;
                let what = format!("{kernel} on {target}");
                let row = report
                    .kernels
                    .iter()
                    .find(|row| row.kernel == *kernel && row.target == target)
                    .unwrap_or_else(|| panic!("{what} is not in the report"));
                assert_eq!(row.module, module.name);
                let found = row
                    .main_loop
                    .as_ref()
                    .unwrap_or_else(|| panic!("{what}: no main loop"));
                check_view(&format!("{what}, body"), &found.body);
                if let Some(path) = &found.aligned_path {
                    check_view(&format!("{what}, aligned path"), path);
                    // The path leaves out the element-wise fallback, never a matrix instruction.
                    assert_eq!(path.mix.mfma, found.body.mix.mfma, "{what}");
                    assert!(path.mix.instructions < found.body.mix.instructions);
                }
            }
        }
    }
    assert_eq!(report.kernels.len(), expected);
    // gfx942 holds every family: the BF16, INT8, FNUZ FP8 and weight-only GEMMs.
    let gfx942 = "gfx942".parse().unwrap();
    for module in ["gemm", "gemm_a8w8", "gemm_fp8_e4m3fnuz", "gemm_a16w8"] {
        assert!(
            report
                .kernels
                .iter()
                .any(|row| row.module == module && row.target == gfx942),
            "no {module} kernel on gfx942"
        );
    }

    // The BF16 GEMM chooses its copy path before the K loop: its main loop is the aligned
    // one, whose only vector memory is the four 16-byte loads of the next stage, with no
    // element-wise fallback beside them.
    let bf16 = report
        .kernels
        .iter()
        .find(|row| row.kernel == "gemm_a16w16_nt_bf16" && row.target == gfx942)
        .and_then(|row| row.main_loop.as_ref())
        .unwrap();
    assert_eq!((bf16.body.mix.mfma, bf16.body.mix.vector_memory), (32, 4));
    assert!(bf16.aligned_path.is_none());

    let table = main_loop::table(&report);
    assert!(table.starts_with("module"), "{table}");
    assert!(table.contains("gemm_a16w16_nt_bf16"), "{table}");
}
