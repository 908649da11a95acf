//! A module that opts out of targets (`skip_targets` in its manifest): built for none of them,
//! its reason recorded in the bundle and printed by `explain` and `inspect`, and the other
//! modules still served on those targets' devices.

mod common;

use std::sync::Arc;

use common::*;
use hkload::driver::{LaunchDims, RecordingDriver, StreamHandle};
use hkload::{Arg, Bundle, Device, Error};

const REASON: &str = "no FP8 tensor-core instruction before sm_89";

/// `scale` for every target; `offset` skips gfx90a, which the package builds.
fn package() -> TempPackage {
    let offset = OFFSET_MANIFEST.replace(
        "source = \"../kernels/offset.hip\"\n",
        &format!(
            "source = \"../kernels/offset.hip\"\nskip_targets = {{ gfx90a = \"{REASON}\" }}\n"
        ),
    );
    TempPackage::new(
        &["gfx90a", "sm_80"],
        &[
            ("scale", SCALE_SOURCE, SCALE_MANIFEST),
            ("offset", OFFSET_SOURCE, &offset),
        ],
    )
}

fn simulated(id: &str) -> Device {
    let driver = Arc::new(RecordingDriver::new([id.parse().unwrap()]));
    Device::new(driver, 0).unwrap()
}

#[test]
fn a_skipped_target_is_not_built_and_says_why_while_the_other_modules_load() {
    let package = package();
    let dir = build_ok(&package.options()).bundle;
    let bundle = Bundle::open(&dir).unwrap();

    // Nothing was built for gfx90a in `offset`, and the bundle says why.
    let manifest = bundle.manifest().unwrap();
    let offset = manifest.module("offset").unwrap();
    let ids: Vec<String> = offset.entries.iter().map(|e| e.id.to_string()).collect();
    assert!(ids.iter().all(|id| !id.contains("gfx90a")), "{ids:?}");
    assert!(ids.iter().any(|id| id.contains("sm_80")), "{ids:?}");
    assert_eq!(offset.not_built.len(), 1, "{:?}", offset.not_built);
    assert_eq!(offset.not_built[0].target.to_string(), "gfx90a");
    assert_eq!(offset.not_built[0].reason, REASON);
    let toml = std::fs::read_to_string(dir.join("bundle.toml")).unwrap();
    assert!(toml.contains(REASON), "{toml}");
    assert!(manifest.module("scale").unwrap().not_built.is_empty());

    // explain and inspect say it.
    let line = format!("module offset is not built for gfx90a: {REASON}");
    let explanation = bundle.explain(&"gfx90a:sramecc+:xnack-".parse().unwrap());
    assert!(explanation.to_string().contains(&line), "{explanation}");
    assert!(explanation.is_servable(), "{explanation}");
    let skipped = hkpack::inspect::not_built(&bundle).unwrap();
    assert_eq!(skipped.len(), 1);
    assert_eq!(
        (
            skipped[0].module.as_str(),
            skipped[0].target.to_string(),
            skipped[0].reason.as_str()
        ),
        ("offset", "gfx90a".to_owned(), REASON)
    );
    assert_eq!(skipped[0].to_string(), line);
    // On the target it is built for, nothing is said.
    let explanation = bundle.explain(&"sm_80".parse().unwrap());
    assert!(
        !explanation.to_string().contains("not built"),
        "{explanation}"
    );
    // A device no target serves is still refused, with no reason invented.
    let explanation = bundle.explain(&"gfx942:sramecc+:xnack-".parse().unwrap());
    assert!(!explanation.is_servable(), "{explanation}");
    assert!(
        !explanation.to_string().contains("not built"),
        "{explanation}"
    );
    let refused = bundle
        .load(&simulated("gfx942:sramecc+:xnack-"))
        .err()
        .unwrap();
    assert!(matches!(refused, Error::NoCodeObject { .. }), "{refused}");

    // The bundle loads on gfx90a: `scale` runs, `offset` says why it cannot.
    let device = simulated("gfx90a:sramecc+:xnack-");
    let kernels = bundle.load(&device).unwrap();
    kernels.preload().unwrap();
    assert_eq!(kernels.chosen_entry("offset"), None);
    let scale = kernels.kernel("scale").unwrap();
    let dims = LaunchDims {
        grid: [1, 1, 1],
        block: [64, 1, 1],
        shared_bytes: 0,
    };
    let mut out = device.alloc(hk_format::abi::ScalarType::F32, 64).unwrap();
    let x = device.alloc(hk_format::abi::ScalarType::F32, 64).unwrap();
    let args: [Arg; 4] = [(&mut out).into(), (&x).into(), 2.0f32.into(), 64u32.into()];
    // SAFETY: a simulated device runs nothing; one block of 64 covers n = 64.
    unsafe { scale.launch(&dims, StreamHandle::DEFAULT, &args) }.unwrap();
    let error = kernels.kernel("offset").err().unwrap();
    assert!(matches!(error, Error::NotBuilt { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        format!("kernel `offset` (module `offset`) is not built for gfx90a, by design: {REASON}")
    );

    // On sm_80 both are there.
    let kernels = bundle.load(&simulated("sm_80")).unwrap();
    kernels.kernel("offset").unwrap();
    kernels.kernel("scale").unwrap();
}

#[test]
fn skip_targets_errors_name_the_file_and_line() {
    let package = package();
    let offset = package.manifests().join("offset.toml");
    let written = std::fs::read_to_string(&offset).unwrap();
    let cases: [(String, &[&str]); 2] = [
        (
            written.replace("gfx90a = ", "gfx1234 = "),
            &["offset.toml:5:18", "unknown target", "gfx1234"],
        ),
        (
            written.replace(&format!("\"{REASON}\""), "\" \""),
            &[
                "offset.toml:5:27",
                "say why module `offset` is not built for gfx90a",
            ],
        ),
    ];
    for (edit, expected) in &cases {
        std::fs::write(&offset, edit).unwrap();
        let error = hkpack::build(&package.options()).err().unwrap().to_string();
        for part in *expected {
            assert!(error.contains(part), "`{part}` not in:\n{error}");
        }
    }
}

/// A `skip_targets` key that names a valid target the package does not build is an error at
/// its line (a misspelt or forgotten target would otherwise skip nothing, silently), naming
/// the key and the package's targets.
#[test]
fn a_skipped_target_the_package_does_not_build_is_an_error_at_its_line() {
    let package = package();
    let offset = package.manifests().join("offset.toml");
    let written = std::fs::read_to_string(&offset).unwrap();
    let edited = written.replace(
        &format!("gfx90a = \"{REASON}\""),
        &format!("gfx90a = \"{REASON}\", \"gfx9-4-generic\" = \"not tried\""),
    );
    assert_ne!(edited, written);
    std::fs::write(&offset, edited).unwrap();
    let error = hkpack::build(&package.options()).err().unwrap().to_string();
    // The key's column: where its quoted name starts on line 5.
    let column = format!("skip_targets = {{ gfx90a = \"{REASON}\", ").len() + 1;
    for part in [
        &format!("offset.toml:5:{column}: "),
        "gfx9-4-generic",
        "not among the package's targets (gfx90a, sm_80)",
    ] {
        assert!(error.contains(part), "`{part}` not in:\n{error}");
    }
}

/// A module with nothing to build (it skips every target of the build: `--arch gfx942` and an
/// OCP-only FP8 module, say) is left out of the bundle with a warning, and the others build;
/// when no module is left, the build is an error.
#[test]
fn a_module_skipping_every_target_of_the_build_is_left_out_with_a_warning() {
    let package = package();
    let offset = package.manifests().join("offset.toml");
    let written = std::fs::read_to_string(&offset).unwrap();
    std::fs::write(
        &offset,
        written.replace("gfx90a = ", &format!("sm_80 = \"{REASON}\", gfx90a = ")),
    )
    .unwrap();
    let report = build_ok(&package.options());
    let warning = format!(
        "module `offset` is left out of the bundle: it skips every target of this build (gfx90a: {REASON}; sm_80: {REASON})"
    );
    assert!(report.warnings.contains(&warning), "{:?}", report.warnings);
    let bundle = Bundle::open(&report.bundle).unwrap();
    assert!(bundle.manifest().unwrap().module("offset").is_none());
    bundle
        .load(&simulated("sm_80"))
        .unwrap()
        .kernel("scale")
        .unwrap();

    let scale = package.manifests().join("scale.toml");
    let written = std::fs::read_to_string(&scale).unwrap();
    let skipping = written.replace(
        "source = \"../kernels/scale.hip\"\n",
        &format!("source = \"../kernels/scale.hip\"\nskip_targets = {{ gfx90a = \"{REASON}\", sm_80 = \"{REASON}\" }}\n"),
    );
    assert_ne!(skipping, written);
    std::fs::write(&scale, skipping).unwrap();
    let error = hkpack::build(&package.options()).err().unwrap().to_string();
    assert!(
        error.contains("every module skips every target of this build (gfx90a, sm_80)"),
        "{error}"
    );
}
