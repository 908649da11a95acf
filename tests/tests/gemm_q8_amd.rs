//! The 8-bit GEMM modules on AMD, statically (no AMD GPU runs here): `gemm_a8w8` (int8) for
//! gfx90a, gfx942 and gfx950, `gemm_fp8_e4m3fnuz` for gfx942 and `gemm_fp8_e4m3fn` for gfx950,
//! `gemm_a16w8` (bf16 x FP8 weights widened to bf16, both formats) for all three, built by the
//! real hkpack. Every code object reads back with `llvm-readelf`, every kernel
//! fits its target without spills or scratch, and its disassembly (`llvm-objdump
//! --mcpu=<target>`) holds exactly the target's 8-bit MFMA (bf16 MFMA for the weight-only
//! kernels) and no other. Each FP8 format goes
//! to the target whose MFMA reads it, proven on the code objects (their ELF machine against
//! their kernels' pointee types) and by the compiler refusing the other format.
//!
//! With `HK_TINYGRAD` set to a tinygrad source tree, the code also runs on its CDNA emulator
//! against an f64 reference (`tests/emu/gemm_q8_emu.py`, which says what it cannot run there);
//! without it that test says it skipped and passes.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use hk_format::manifest::{BundleManifest, MANIFEST_FILE};
use hk_format::target::TargetId;
use hkload::Bundle;

/// `(target, LDS bytes a workgroup may have, int8 MFMA, its count in a step)`: eight atoms a
/// wave (64 x 32 of 16 x 16) times the step's bytes (64; 128 on gfx950, whose LDS holds two
/// blocks of them) over the instruction's k.
const TARGETS: [(&str, u32, &str, usize); 3] = [
    ("gfx90a", 64 * 1024, "v_mfma_i32_16x16x16i8", 8 * 4),
    ("gfx942", 64 * 1024, "v_mfma_i32_16x16x32_i8", 8 * 2),
    ("gfx950", 160 * 1024, "v_mfma_i32_16x16x64_i8", 8 * 2),
];

/// The FP8 MFMA of gfx942 and gfx950 (one encoding, read as FNUZ on gfx942 and OCP on
/// gfx950).
const FP8_MFMA: &str = "v_mfma_f32_16x16x32_fp8_fp8";

/// `(module, the AMD target it is built for, its element type as the ABI names it, its MFMA
/// count in a step)`: each FP8 format goes only where the MFMA reads it; eight atoms a wave
/// times the step's bytes (as for int8) over 32.
const FP8_MODULES: [(&str, &str, &str, usize); 2] = [
    ("gemm_fp8_e4m3fnuz", "gfx942", "fp8_e4m3fnuz", 8 * 2),
    ("gemm_fp8_e4m3fn", "gfx950", "fp8_e4m3fn", 8 * 4),
];

/// The weight-only module, and per target its bf16 MFMA and count: eight atoms a wave times
/// the 32-deep step over the instruction's k (16, 32 on gfx950). Its split-K kernels' waves hold
/// one atom, 64 deep: a quarter of that (SPLITK_SHARE).
const A16W8: (&str, [(&str, &str, usize); 3]) = (
    "gemm_a16w8",
    [
        ("gfx90a", "v_mfma_f32_16x16x16bf16_1k", 8 * 2),
        ("gfx942", "v_mfma_f32_16x16x16_bf16", 8 * 2),
        ("gfx950", "v_mfma_f32_16x16x32_bf16", 8),
    ],
);

/// The split-K weight-only kernels' MFMA count, as a share of the others'.
const SPLITK_SHARE: usize = 4;

const MANIFESTS: [&str; 4] = [
    "gemm_a8w8.toml",
    "gemm_fp8_e4m3fnuz.toml",
    "gemm_fp8_e4m3fn.toml",
    "gemm_a16w8.toml",
];

fn build_q8(dir: &Path) -> std::path::PathBuf {
    let targets: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
    build_repo_modules(dir, &MANIFESTS, &targets)
}

/// The processor `llvm-readelf -h` reads from a code object's ELF header (its `e_flags`).
fn elf_processor(object: &Path) -> String {
    let output = Command::new(llvm_tool("llvm-readelf"))
        .args(["-h", "--notes"])
        .arg(object)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "llvm-readelf rejects {}: {}",
        object.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let flags = text
        .lines()
        .find(|line| line.trim_start().starts_with("Flags:"))
        .unwrap_or_else(|| panic!("no Flags line in llvm-readelf -h of {}", object.display()));
    flags
        .split(',')
        .map(str::trim)
        .find(|part| part.starts_with("gfx"))
        .unwrap_or_else(|| panic!("no processor in `{flags}`"))
        .to_owned()
}

#[test]
fn q8_gemms_fit_every_amd_target_and_use_its_mfma() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = build_q8(scratch.path());
    let manifest =
        BundleManifest::from_toml(&std::fs::read_to_string(bundle.join(MANIFEST_FILE)).unwrap())
            .unwrap();
    let kernels = Bundle::open(&bundle).unwrap();
    let records = kernels.kernel_records().unwrap();
    // int8: two kernels and the batched one; each FP8 format: per tensor, per token and block
    // scales, each with and without a bias, and the batched per-token one; weight-only: two
    // formats, with and without a bias, stored or split K.
    assert_eq!(records.len(), 3 + 7 + 7 + 8);
    for batched in [
        "batched_gemm_a8w8_nt_bf16",
        "batched_gemm_fp8_e4m3fnuz_nt_per_token_bf16",
        "batched_gemm_fp8_e4m3fn_nt_per_token_bf16",
    ] {
        assert!(records.iter().any(|r| r.symbol == batched), "{batched}");
    }

    let mut checked = 0;
    for module in &manifest.modules {
        let fp8 = FP8_MODULES.iter().find(|m| m.0 == module.name);
        for &(target, lds_limit, int8_mfma, int8_count) in &TARGETS {
            if fp8.is_some_and(|m| m.1 != target) {
                continue;
            }
            let bf16 = A16W8.1.iter().find(|t| t.0 == target).unwrap();
            let (want, count) = match fp8 {
                Some(&(.., count)) => (FP8_MFMA, count),
                None if module.name == A16W8.0 => (bf16.1, bf16.2),
                None => (int8_mfma, int8_count),
            };
            let text = amd_disassembly(&bundle, &module.file, target, scratch.path());
            let target_id: TargetId = target.parse().unwrap();
            for symbol in &module.kernels {
                let abi = records
                    .iter()
                    .find(|r| &r.symbol == symbol)
                    .and_then(|r| r.abi_for(&target_id))
                    .unwrap_or_else(|| panic!("{symbol} has no code for {target}"));
                assert_eq!(abi.spills, 0, "{symbol} spills on {target}");
                assert_eq!(
                    abi.private_segment_size, 0,
                    "{symbol} needs scratch on {target}"
                );
                assert!(
                    abi.group_segment_size > 0 && abi.group_segment_size <= lds_limit,
                    "{symbol} uses {} bytes of LDS on {target}, limit {lds_limit}",
                    abi.group_segment_size
                );
                let body = function_body(&text, symbol)
                    .unwrap_or_else(|| panic!("{symbol} not in the disassembly for {target}"));
                let mfmas: Vec<&str> = mnemonics(body)
                    .into_iter()
                    .filter(|m| m.starts_with("v_mfma"))
                    .collect();
                let found = mfmas.iter().filter(|&&m| m == want).count();
                let count = if symbol.contains("splitk") {
                    count / SPLITK_SHARE
                } else {
                    count
                };
                // The int8 and FP8 kernels hold the step twice: in the whole-chunk K loop and in
                // the chunk-by-chunk one (hk/tile/k_loop.h chooses before the loop). The
                // weight-only kernels' step comes out twice on every target too (clang 22 emits
                // their one main loop in two copies): whole steps, then.
                let whole_steps = if module.name == A16W8.0 {
                    found > 0 && found % count == 0
                } else {
                    found == 2 * count
                };
                assert!(
                    whole_steps,
                    "{symbol} on {target}: expected steps of {count} x {want}, found {mfmas:?}"
                );
                assert!(
                    mfmas.iter().all(|&m| m == want),
                    "{symbol} on {target} has another MFMA than {want}: {mfmas:?}"
                );
                checked += 1;
            }
        }
    }
    // int8 on three targets, each FP8 format on one, weight-only on three.
    assert_eq!(checked, 3 * 3 + 7 + 7 + 3 * 8);
}

#[test]
fn each_fp8_format_is_built_only_for_the_target_whose_mfma_reads_it() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = build_q8(scratch.path());
    let manifest =
        BundleManifest::from_toml(&std::fs::read_to_string(bundle.join(MANIFEST_FILE)).unwrap())
            .unwrap();
    let kernels = Bundle::open(&bundle).unwrap();
    let records = kernels.kernel_records().unwrap();
    for (name, target, element, _) in FP8_MODULES {
        let module = manifest.modules.iter().find(|m| m.name == name).unwrap();
        // The module holds one AMD code object, and its ELF header says which processor it
        // was compiled for: the one whose MFMA reads `element`.
        let amd: Vec<String> = module
            .entries
            .iter()
            .map(|e| e.id.to_string())
            .filter(|id| id.starts_with("hipv4-amdgcn"))
            .collect();
        assert_eq!(amd, [format!("hipv4-amdgcn-amd-amdhsa--{target}")]);
        let object = scratch.path().join(format!("{name}.co"));
        let status = Command::new(llvm_tool("clang-offload-bundler"))
            .args(["--unbundle", "--type=o"])
            .arg(format!("--input={}", bundle.join(&module.file).display()))
            .arg(format!("--targets={}", amd[0]))
            .arg(format!("--output={}", object.display()))
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(elf_processor(&object), target);
        // Its kernels take that format: the signature hkpack checked against the type the
        // source declares, which hkload's argument checks then hold every call to.
        for symbol in &module.kernels {
            let record = records.iter().find(|r| &r.symbol == symbol).unwrap();
            let operands: Vec<String> = record
                .args
                .iter()
                .filter(|p| p.name == "a" || p.name == "b")
                .map(|p| p.ty.to_string())
                .collect();
            assert_eq!(
                operands,
                [format!("*const {element}"), format!("*const {element}")],
                "{symbol}"
            );
        }
    }
}

#[test]
fn the_compiler_refuses_an_fp8_format_the_target_mfma_does_not_read() {
    // Each FP8 module built for the other FP8 target, as if its skip_targets were forgotten.
    for (name, _, element, _) in FP8_MODULES {
        let (_, other, other_element, _) = FP8_MODULES.iter().find(|m| m.0 != name).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let folder = scratch.path().join("manifests");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::copy(
            repo().join("manifests/package.toml"),
            folder.join("package.toml"),
        )
        .unwrap();
        let text = std::fs::read_to_string(repo().join(format!("manifests/{name}.toml"))).unwrap();
        let unskipped: String = text
            .lines()
            .filter(|line| !line.starts_with("skip_targets"))
            .map(|line| format!("{line}\n"))
            .collect();
        assert_ne!(unskipped, text, "{name}.toml has no skip_targets line");
        std::fs::write(folder.join(format!("{name}.toml")), unskipped).unwrap();
        std::os::unix::fs::symlink(repo().join("kernels"), scratch.path().join("kernels")).unwrap();
        let mut options = options(&folder, &scratch.path().join("dist"), &shared_cache());
        options.targets = Some(vec![other.parse().unwrap()]);
        let error = match hkpack::build(&options) {
            Ok(report) => panic!("{name} built for {other}, which reads {other_element}: {report}"),
            Err(e) => e.to_string(),
        };
        for part in [
            format!("{name} for {other}"),
            format!("sizeof(hk::{element}) == 2"),
            "no MFMA of this target multiplies this element type".into(),
        ] {
            assert!(error.contains(&part), "`{part}` not in:\n{error}");
        }
    }
}

#[test]
fn q8_gemms_compute_on_the_cdna_emulator() {
    let Some(tree) = std::env::var_os("HK_TINYGRAD") else {
        eprintln!("skipped: set HK_TINYGRAD to a tinygrad source tree to run the CDNA emulator");
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let mut failed = Vec::new();
    // One bundle per module: each then loads (for its launch shapes) on every target it has.
    for manifest in MANIFESTS {
        let module = manifest.trim_end_matches(".toml");
        let dir = scratch.path().join(module);
        std::fs::create_dir_all(&dir).unwrap();
        let targets: Vec<&str> = match FP8_MODULES.iter().find(|m| m.0 == module) {
            Some(&(_, target, ..)) => vec![target],
            None => TARGETS.iter().map(|t| t.0).collect(),
        };
        let bundle = build_repo_modules(&dir, &[manifest], &targets);
        let output = Command::new(python())
            .arg(repo().join("tests/emu/gemm_q8_emu.py"))
            .arg(&bundle)
            .arg(module)
            .arg(targets.join(","))
            .env("HK_TINYGRAD", &tree)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        eprintln!("{text}{}", String::from_utf8_lossy(&output.stderr));
        if !output.status.success() {
            failed.push(module);
        }
    }
    assert!(failed.is_empty(), "gemm_q8_emu.py failed for {failed:?}");
}
