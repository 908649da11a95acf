//! The generic target gfx9-4-generic on the repository's own package: every module is built for
//! it with the instructions gfx942 and gfx950 share (a code object that says gfx9-4-generic,
//! code object v6) or is not built for it with the reason its manifest gives, which the bundle
//! records and `inspect` and `explain` print; a gfx942 or gfx950 runs the generic code only
//! where the bundle has no native code for it. And a generic target without code object v6 is
//! one error before anything is compiled, naming the setting that fixes it.
//!
//! The default targets come from the shared cache (scripts/setup's build in CI), so the real
//! package costs the generic target's compiles alone.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::*;
use hk_code_object::read_amd_code_object;
use hk_format::target::{EntryId, TargetId};
use hkload::Bundle;
use hkload::select::{Match, Outcome};
use hkpack::BuildReport;
use hkpack::manifest::Package;

const GENERIC: &str = "gfx9-4-generic";

fn generic() -> TargetId {
    GENERIC.parse().unwrap()
}

/// The repository's manifests, as hkpack reads them.
fn repo_package() -> Package {
    Package::load(&repo().join("manifests")).unwrap()
}

/// The repository's package built for `targets` into a folder of its own; the build's report.
fn build_repo(name: &str, targets: &[TargetId]) -> BuildReport {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("generic-{name}-{}", std::process::id()));
    let mut options = options(&repo().join("manifests"), &out, &shared_cache());
    options.targets = Some(targets.to_vec());
    build_ok(&options)
}

/// The package's default targets and gfx9-4-generic: each device has its native code beside
/// the generic code.
fn with_natives() -> &'static BuildReport {
    static BUILT: OnceLock<BuildReport> = OnceLock::new();
    BUILT.get_or_init(|| {
        let mut targets = repo_package().targets;
        targets.push(generic());
        build_repo("natives", &targets)
    })
}

/// gfx90a, gfx9-4-generic and sm_90: a package that serves gfx942 and gfx950 through the
/// generic target alone.
fn generic_only() -> &'static BuildReport {
    static BUILT: OnceLock<BuildReport> = OnceLock::new();
    BUILT.get_or_init(|| {
        let targets = ["gfx90a", GENERIC, "sm_90"].map(|t| t.parse().unwrap());
        build_repo("generic-only", &targets)
    })
}

#[test]
fn every_module_is_built_for_the_generic_target_or_says_why_not() {
    let package = repo_package();
    let dir = &with_natives().bundle;
    let bundle = Bundle::open(dir).unwrap();
    let manifest = bundle.manifest().unwrap();
    let not_built: Vec<String> = hkpack::inspect::not_built(&bundle)
        .unwrap()
        .iter()
        .filter(|row| row.target == generic())
        .map(ToString::to_string)
        .collect();
    // `explain` for the generic target itself: what its code object holds, and why not more.
    let explanation = bundle.explain(&generic()).to_string();
    let scratch = tempfile::tempdir().unwrap();
    let mut skipped = Vec::new();
    for module in &package.modules {
        let record = manifest.module(&module.name).unwrap();
        let generic_entries: Vec<&EntryId> = record
            .entries
            .iter()
            .map(|e| &e.id)
            .filter(|id| id.target() == generic())
            .collect();
        if let Some(reason) = module.skip_targets.get(&generic()) {
            assert!(generic_entries.is_empty(), "{}", module.name);
            let line = format!(
                "module {} is not built for {GENERIC}: {reason}",
                module.name
            );
            assert!(not_built.contains(&line), "{line}\nnot in {not_built:#?}");
            assert!(
                explanation.contains(&line),
                "{line}\nnot in:\n{explanation}"
            );
            skipped.push(module.name.as_str());
            continue;
        }
        assert_eq!(generic_entries.len(), 1, "{}", module.name);
        // The code object itself says what it is for, as the ROCm loader reads it.
        let out = scratch.path().join(format!("{}.co", module.name));
        hkpack::verify::extract(
            dir,
            &module.name,
            &hkpack::verify::Pick::Target(generic()),
            &out,
        )
        .unwrap();
        let object = read_amd_code_object(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(
            TargetId::from_amd_e_flags(object.header.e_flags).unwrap(),
            generic(),
            "{}: e_flags {:#x}",
            module.name,
            object.header.e_flags
        );
        // EI_ABIVERSION 4 is code object v6, which generic targets need.
        assert_eq!(object.header.abi_version, 4, "{}", module.name);
    }
    // The FP8 GEMMs alone: their one FP8 matrix instruction computes on FNUZ on gfx942 and on
    // OCP on gfx950. Every other module, int8 GEMMs included, runs on the family's common
    // instructions.
    assert_eq!(skipped, ["gemm_fp8_e4m3fn", "gemm_fp8_e4m3fnuz"]);

    // The int8 GEMM multiplies with the i8 MFMA that gfx942 and gfx950 both have (gfx90a's
    // 16x16x16i8 is gone from both).
    let file = &manifest.module("gemm_a8w8").unwrap().file;
    let disassembly = amd_disassembly(dir, file, GENERIC, scratch.path());
    let body = function_body(&disassembly, "gemm_a8w8_nt_bf16").unwrap();
    assert!(
        mnemonics(body).contains(&"v_mfma_i32_16x16x32_i8"),
        "{body}"
    );
}

/// The ROCm rule: a native code object first, the generic one only for a processor that has
/// none, and never for a processor the generic target does not cover.
#[test]
fn gfx942_and_gfx950_run_the_generic_code_only_without_native_code() {
    let package = repo_package();
    let devices = ["gfx942:sramecc+:xnack-", "gfx950:sramecc+:xnack-"];

    // Beside native code objects every module runs its native one; the generic one would run.
    let bundle = Bundle::open(&with_natives().bundle).unwrap();
    for device in devices {
        let explanation = bundle.explain(&device.parse().unwrap());
        assert!(explanation.is_servable(), "{device}:\n{explanation}");
        for module in &explanation.modules {
            // The FP8 GEMM of the other format is not built for the device by design.
            let Some((chosen, matched)) = module.selection.chosen() else {
                continue;
            };
            assert_ne!(matched, Match::Generic, "{device}:\n{explanation}");
            assert_ne!(chosen.target(), generic(), "{device}:\n{explanation}");
            let generic_verdict = module
                .selection
                .verdicts()
                .iter()
                .find(|v| v.entry().target() == generic());
            if let Some(verdict) = generic_verdict {
                assert!(
                    matches!(
                        verdict.outcome(),
                        Outcome::Outranked {
                            matched: Match::Generic,
                            ..
                        }
                    ),
                    "{device}:\n{explanation}"
                );
            }
        }
    }

    // Without them, gfx942 and gfx950 run the generic code of every module built for it, and
    // `explain` says why the FP8 GEMM that would serve them is not there.
    let report = generic_only();
    let bundle = Bundle::open(&report.bundle).unwrap();
    for device in devices {
        let explanation = bundle.explain(&device.parse().unwrap());
        assert!(explanation.is_servable(), "{device}:\n{explanation}");
        for module in &explanation.modules {
            let declared = package
                .modules
                .iter()
                .find(|m| m.name == module.module)
                .unwrap();
            match declared.skip_targets.get(&generic()) {
                None => assert_eq!(
                    module.selection.chosen().map(|(id, m)| (id.target(), m)),
                    Some((generic(), Match::Generic)),
                    "{device}:\n{explanation}"
                ),
                Some(reason) => {
                    assert!(module.selection.chosen().is_none());
                    let line = format!(
                        "module {} is not built for {GENERIC}: {reason}",
                        module.module
                    );
                    assert!(
                        explanation.to_string().contains(&line),
                        "{line}\nnot in:\n{explanation}"
                    );
                }
            }
        }
    }
    // gfx90a takes its own code, and the generic target is not for it.
    let explanation = bundle.explain(&"gfx90a:sramecc+:xnack-".parse().unwrap());
    for module in &explanation.modules {
        if let Some((chosen, _)) = module.selection.chosen() {
            assert_eq!(chosen.target().to_string(), "gfx90a", "{explanation}");
        }
    }
    // The OCP FP8 GEMM has sm_90 code here; the FNUZ one has no target of this build, so it is
    // left out, and the build says why.
    assert!(
        report.warnings.iter().any(|w| w.starts_with(
            "module `gemm_fp8_e4m3fnuz` is left out of the bundle: it skips every target of this build"
        ) && w.contains(&format!("{GENERIC}: gfx9-4-generic covers gfx942"))),
        "{:#?}",
        report.warnings
    );
}

/// `--arch gfx9-4-generic` on a package that builds AMD targets with code object v5 is one
/// error, before the toolchain is looked for or anything is compiled or written, at the
/// setting that gives it v5, naming the one to add; with it, the target builds.
#[test]
fn a_generic_target_without_code_object_6_is_one_error_before_any_compile() {
    let package = TempPackage::new(&["gfx90a"], &[("scale", SCALE_SOURCE, SCALE_MANIFEST)]);
    let toml = package.manifests().join("package.toml");
    let written = std::fs::read_to_string(&toml).unwrap();
    let with_version = |version: u32| {
        format!("{written}amd_code_object_versions = {{ \"{GENERIC}\" = {version} }}\n")
    };
    let mut options = package.options();
    options.targets = Some(vec![generic()]);

    // No code-object version for it: the package's 5 applies. A clang that does not exist
    // shows that nothing looked for one.
    let mut no_clang = options.clone();
    no_clang.tools.clang = Some(package.path("no-such-clang"));
    let error = hkpack::build(&no_clang).err().unwrap();
    assert!(matches!(error, hkpack::Error::Manifest(_)), "{error:?}");
    let message = error.to_string();
    for part in [
        "package.toml:5:27: ",
        "gfx9-4-generic is a generic target, which needs code object version 6 (ROCm 6.3+), but this package builds it with version 5",
        "add `amd_code_object_versions = { \"gfx9-4-generic\" = 6 }` to [package] in package.toml",
    ] {
        assert!(message.contains(part), "`{part}` not in:\n{message}");
    }
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(!package.path("dist").exists());
    assert!(!package.path("cache").exists());

    // A version below 6 given to it is an error at that version.
    std::fs::write(&toml, with_version(5)).unwrap();
    let message = hkpack::build(&options).err().unwrap().to_string();
    let column = format!("amd_code_object_versions = {{ \"{GENERIC}\" = ").len() + 1;
    let expected = format!(
        "package.toml:7:{column}: gfx9-4-generic is a generic target, which needs code object version 6"
    );
    assert!(
        message.contains(&expected),
        "`{expected}` not in:\n{message}"
    );

    // With 6 it builds on request, though not among the package's targets, and a module may
    // skip it, saying why.
    std::fs::write(&toml, with_version(6)).unwrap();
    std::fs::write(package.path("kernels/offset.hip"), OFFSET_SOURCE).unwrap();
    std::fs::write(
        package.manifests().join("offset.toml"),
        OFFSET_MANIFEST.replace(
            "source = \"../kernels/offset.hip\"\n",
            "source = \"../kernels/offset.hip\"\nskip_targets = { \"gfx9-4-generic\" = \"not tried there\" }\n",
        ),
    )
    .unwrap();
    let report = build_ok(&options);
    let bundle = Bundle::open(&report.bundle).unwrap();
    let manifest = bundle.manifest().unwrap();
    let ids: Vec<String> = manifest
        .module("scale")
        .unwrap()
        .entries
        .iter()
        .map(|e| e.id.to_string())
        .collect();
    assert_eq!(ids, ["hipv4-amdgcn-amd-amdhsa--gfx9-4-generic"]);
    assert!(manifest.module("offset").is_none());
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("module `offset` is left out")
                && w.contains("gfx9-4-generic: not tried there")),
        "{:#?}",
        report.warnings
    );
    // The default targets do not include it.
    options.targets = None;
    let report = build_ok(&options);
    let manifest = Bundle::open(&report.bundle)
        .unwrap()
        .manifest()
        .unwrap()
        .clone();
    assert_eq!(manifest.targets, ["gfx90a".parse::<TargetId>().unwrap()]);
}
