//! Architecture-specific targets end to end: a package listing sm_90a beside sm_80 and sm_90,
//! built by the real compiler and ptxas, where one module asks for sm_90a (and uses
//! `HK_SM90A` from the repository's own device header) and one does not. hkload runs the sm_90a
//! cubin on sm_90 devices first and on no other, explains why on each, gives its contract the
//! fact `arch_specific`, and serves split packages the same way; the manifest's mistakes are
//! build errors at their line.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use common::*;
use hk_format::abi::ScalarType;
use hk_format::target::{EntryId, TargetId};
use hkload::driver::{LaunchDims, RecordingDriver, StreamHandle};
use hkload::select::{Match, Outcome};
use hkload::{Arg, Bundle, Device, OpenOptions};

/// `tiles`: out[i] = 2 on sm_90a code, 1 elsewhere, with more static shared memory on sm_90a
/// (4 KiB against 1 KiB), so the code's own records tell which build `HK_SM90A` was 1 in.
/// Its contract launches blocks of 128 threads on arch-specific code, 64 elsewhere.
const TILES_SOURCE: &str = r#"
#include "hk/device.h"
HK_KERNEL void tiles(float* out, unsigned n) {
#if HK_SM90A
    __shared__ float stage[1024];
#else
    __shared__ float stage[256];
#endif
    unsigned i = hk::block_idx_x() * hk::block_dim_x() + hk::thread_idx_x();
    stage[hk::thread_idx_x()] = HK_SM90A ? 2.0f : 1.0f;
    hk::block_sync();
    if (i < n) out[i] = stage[hk::thread_idx_x()];
}
"#;

const TILES_MANIFEST: &str = r#"
[module]
name = "tiles"
source = "../kernels/tiles.hip"
arch_specific = ["sm_90a"]

[module.contract]
block = "arch_specific ? 128 : 64"
grid = "ceil_div(n, arch_specific ? 128 : 64)"

[[kernel]]
symbol = "tiles"
args = ["out: *mut f32 [n]", "n: u32"]
"#;

const TARGETS: [&str; 3] = ["sm_80", "sm_90", "sm_90a"];

/// Real NVIDIA devices, as the CUDA driver reports them, and the entry each module runs there.
const DEVICES: [(&str, &str, &str); 5] = [
    ("sm_80", "sm_80", "sm_80"),
    ("sm_89", "sm_80", "sm_80"),
    ("sm_90", "sm_90a", "sm_90"),
    ("sm_100", "compute_90", "compute_90"),
    ("sm_120", "compute_90", "compute_90"),
];

/// The package (`tiles`, which asks for sm_90a, and `scale`, which does not), built for
/// `TARGETS` once for every test; the package and its bundle folder.
fn built() -> &'static (TempPackage, PathBuf) {
    static BUILT: OnceLock<(TempPackage, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let package = package();
        let bundle = build_ok(&package.options()).bundle;
        (package, bundle)
    })
}

fn package() -> TempPackage {
    let package = TempPackage::new(
        &TARGETS,
        &[
            ("tiles", TILES_SOURCE, TILES_MANIFEST),
            ("scale", SCALE_SOURCE, SCALE_MANIFEST),
        ],
    );
    let header = package.path("kernels/include/hk");
    std::fs::create_dir_all(&header).unwrap();
    std::fs::copy(
        repo().join("kernels/include/hk/device.h"),
        header.join("device.h"),
    )
    .unwrap();
    package
}

fn cuda(arch: &str) -> EntryId {
    format!("cuda-nvptx64-nvidia-cuda-{arch}").parse().unwrap()
}

fn target(text: &str) -> TargetId {
    text.parse().unwrap()
}

fn simulated(id: &str) -> Device {
    let driver = Arc::new(RecordingDriver::new([target(id)]));
    Device::new(driver, 0).unwrap()
}

#[test]
fn only_the_module_that_asks_is_built_for_sm_90a_and_nothing_records_the_others() {
    let (_, dir) = built();
    let bundle = Bundle::open(dir).unwrap();
    let manifest = bundle.manifest().unwrap();
    assert_eq!(manifest.targets, TARGETS.map(target));
    let entries = |module: &str| -> Vec<EntryId> {
        let record = manifest.module(module).unwrap();
        assert!(
            record.not_built.is_empty(),
            "{module}: {:?}",
            record.not_built
        );
        record.entries.iter().map(|e| e.id).collect()
    };
    // Native code first, then the one PTX some device chooses: compute_90a, which would JIT
    // on compute capability 9.0 alone, where the sm_90a cubin runs, does not ship.
    assert_eq!(
        entries("tiles"),
        ["sm_80", "sm_90", "sm_90a", "compute_90"].map(cuda)
    );
    assert_eq!(entries("scale"), ["sm_80", "sm_90", "compute_90"].map(cuda));

    // HK_SM90A was 1 in the sm_90a build alone: its static shared memory says so.
    let record = bundle.kernel_record("tiles").unwrap();
    for (built_for, stage) in [("sm_80", 1024), ("sm_90", 1024), ("sm_90a", 4096)] {
        let abi = record.abi_for(&target(built_for)).unwrap();
        assert_eq!(abi.group_segment_size, stage, "{built_for}");
    }
    assert!(
        bundle
            .kernel_record("scale")
            .unwrap()
            .abi_for(&target("sm_90a"))
            .is_none()
    );
}

#[test]
fn each_device_runs_what_its_architecture_allows_and_explain_says_why() {
    let (_, dir) = built();
    let bundle = Bundle::open(dir).unwrap();
    for (device, tiles, scale) in DEVICES {
        let explanation = bundle.explain(&target(device));
        assert!(explanation.is_servable(), "{explanation}");
        let text = explanation.to_string();
        assert!(!text.contains("not built"), "{text}");
        for module in &explanation.modules {
            let expected = if module.module == "tiles" {
                tiles
            } else {
                scale
            };
            assert_eq!(
                module.selection.chosen().map(|(entry, _)| *entry),
                Some(cuda(expected)),
                "{device}\n{text}"
            );
        }
        let tiles_line = |status: &str| format!("  {status} cuda-nvptx64-nvidia-cuda-sm_90a");
        if device == "sm_90" {
            assert!(
                text.contains(&format!(
                    "{} (arch-specific cubin for sm_90a, built for this architecture alone: it \
                     may use instructions no other has)",
                    tiles_line("chosen   ")
                )),
                "{text}"
            );
            assert!(
                text.contains(
                    "  outranked cuda-nvptx64-nvidia-cuda-sm_90 (usable (cubin for this exact \
                     architecture), but cuda-nvptx64-nvidia-cuda-sm_90a is built for this \
                     architecture alone and comes first)"
                ),
                "{text}"
            );
        } else {
            assert!(
                text.contains(&format!(
                    "{}: sm_90a code runs only on sm_90 (compute capability 9.0) devices; this \
                     device is {device}",
                    tiles_line("rejected ")
                )),
                "{text}"
            );
        }
        // The module without sm_90a code reads as it would in a bundle without sm_90a.
        let scale = &explanation.modules[0];
        assert_eq!(scale.module, "scale");
        assert!(
            scale
                .selection
                .verdicts()
                .iter()
                .all(|v| !v.entry().target().is_arch_specific())
        );
    }

    // No device reports sm_90a; named so, it is explained as the sm_90 device it means.
    let named = bundle.explain(&target("sm_90a"));
    let sm_90 = bundle.explain(&target("sm_90"));
    let text = named.to_string();
    assert_eq!(named.device, target("sm_90"));
    assert_eq!(named.named_as, Some(target("sm_90a")));
    assert_eq!(
        text.lines().next().unwrap(),
        "device sm_90 (named as sm_90a, which is a target of code, not of a device: its code \
         runs on sm_90 devices alone)"
    );
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        sm_90.to_string().lines().skip(1).collect::<Vec<_>>()
    );
}

#[test]
fn the_contract_reads_whether_the_chosen_code_is_arch_specific() {
    let (_, dir) = built();
    let bundle = Bundle::open(dir).unwrap();
    for (device, expected, _) in DEVICES {
        let device = simulated(device);
        let loaded = bundle.load(&device).unwrap();
        assert_eq!(loaded.chosen_entry("tiles"), Some(&cuda(expected)));
        let kernel = loaded.kernel("tiles").unwrap();
        let out = device.alloc(ScalarType::F32, 1000).unwrap();
        let args = [Arg::BufferMut(&out), 1000u32.into()];
        let block = if expected == "sm_90a" { 128 } else { 64 };
        assert_eq!(
            kernel.launch_shape(&args).unwrap(),
            LaunchDims {
                grid: [1000u32.div_ceil(block), 1, 1],
                block: [block, 1, 1],
                shared_bytes: 0,
            },
            "{}",
            device.target()
        );
        kernel.call(StreamHandle::DEFAULT, &args).unwrap();
    }
}

#[test]
fn without_sm_90a_every_device_chooses_as_before() {
    let (package, with) = built();
    let mut options = package.options();
    options.out_dir = package.path("dist-without");
    options.targets = Some(vec![target("sm_80"), target("sm_90")]);
    let without = build_ok(&options).bundle;
    let (with, without) = (Bundle::open(with).unwrap(), Bundle::open(without).unwrap());
    let manifest = without.manifest().unwrap();
    assert!(
        manifest
            .modules
            .iter()
            .flat_map(|m| &m.entries)
            .all(|e| !e.id.target().is_arch_specific())
    );
    for (device, _, _) in DEVICES {
        let (before, after) = (
            without.explain(&target(device)),
            with.explain(&target(device)),
        );
        for (old, new) in before.modules.iter().zip(&after.modules) {
            if device == "sm_90" && new.module == "tiles" {
                // The one change: the sm_90 cubin it ran is outranked by sm_90a's.
                assert_eq!(old.selection.chosen(), Some((&cuda("sm_90"), Match::Cubin)));
                continue;
            }
            assert_eq!(old.selection.chosen(), new.selection.chosen(), "{device}");
        }
    }
    // Built without sm_90a, `tiles` launches with its portable shape on sm_90.
    let device = simulated("sm_90");
    let kernel = without.load(&device).unwrap().kernel("tiles").unwrap();
    let out = device.alloc(ScalarType::F32, 64).unwrap();
    let shape = kernel
        .launch_shape(&[Arg::BufferMut(&out), 64u32.into()])
        .unwrap();
    assert_eq!(shape.block, [64, 1, 1]);
}

#[test]
fn an_sm_90a_package_serves_sm_90_and_its_absence_is_named() {
    let (package, dir) = built();
    let out = package.path("packages");
    let written = hkpack::split::split(dir, &out).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "mini-0.1.0-index",
            "mini-0.1.0-sm_80",
            "mini-0.1.0-sm_90",
            "mini-0.1.0-sm_90a"
        ]
    );
    // The sm_90a package holds the one module built for it.
    let sm_90a = out.join("mini-0.1.0-sm_90a");
    assert!(sm_90a.join("tiles.hipfb").is_file());
    assert!(!sm_90a.join("scale.hipfb").exists());

    let install = |parts: &[&str]| -> PathBuf {
        let into = package.path(&format!("installed-{}", parts.join("-")));
        for part in parts {
            copy_dir(
                &out.join(format!("mini-0.1.0-{part}")),
                &into.join(format!("mini-0.1.0-{part}")),
            );
        }
        into
    };
    let whole = install(&["index", "sm_90", "sm_90a"]);
    let split = Bundle::open_search_path("mini-0.1.0", &[&whole], OpenOptions::default()).unwrap();
    let explanation = split.explain(&target("sm_90"));
    let tiles = &explanation.modules[1];
    assert_eq!(tiles.module, "tiles");
    assert_eq!(
        tiles.selection.chosen(),
        Some((&cuda("sm_90a"), Match::Cubin))
    );
    assert_eq!(
        tiles.package.as_deref(),
        Some(whole.join("mini-0.1.0-sm_90a").as_path())
    );
    let device = simulated("sm_90");
    let loaded = split.load(&device).unwrap();
    assert_eq!(loaded.chosen_entry("tiles"), Some(&cuda("sm_90a")));
    loaded.preload().unwrap();

    // Without the sm_90a package, sm_90 runs the portable cubin, and explain names what
    // would serve it better.
    let partial = install(&["index", "sm_90"]);
    let split =
        Bundle::open_search_path("mini-0.1.0", &[&partial], OpenOptions::default()).unwrap();
    let explanation = split.explain(&target("sm_90"));
    assert!(explanation.is_servable());
    let tiles = &explanation.modules[1];
    assert_eq!(
        tiles.selection.chosen(),
        Some((&cuda("sm_90"), Match::Cubin))
    );
    assert_eq!(
        tiles.missing_package.as_ref().map(|m| m.name.as_str()),
        Some("mini-0.1.0-sm_90a")
    );
    assert!(
        explanation.to_string().contains(
            "  mini-0.1.0-sm_90a, which is not installed, holds a better code object for sm_90"
        ),
        "{explanation}"
    );
    let loaded = split.load(&device).unwrap();
    assert_eq!(loaded.chosen_entry("tiles"), Some(&cuda("sm_90")));
    // And an sm_100 device never wants it.
    assert!(
        split.explain(&target("sm_100")).modules[1]
            .missing_package
            .is_none()
    );
    assert!(matches!(
        split.explain(&target("sm_100")).modules[1]
            .selection
            .verdicts()[0]
            .outcome(),
        Outcome::Rejected { .. }
    ));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn a_build_for_sm_90a_alone_leaves_out_the_modules_that_do_not_ask_for_it() {
    let (package, _) = built();
    let mut options = package.options();
    options.out_dir = package.path("dist-sm_90a");
    options.targets = Some(vec![target("sm_90a")]);
    let report = build_ok(&options);
    assert_eq!(
        report.warnings,
        [
            "module `scale` is left out of the bundle: it skips every target of this build \
          (sm_90a: architecture-specific, and the module's `arch_specific` does not list it)"
        ]
    );
    let bundle = Bundle::open(&report.bundle).unwrap();
    let modules: Vec<&str> = bundle.table().modules().map(|m| m.name()).collect();
    assert_eq!(modules, ["tiles"]);
    // Its code runs on sm_90 alone; any other device is told why, with no fallback to it.
    assert!(bundle.explain(&target("sm_90")).is_servable());
    let sm_100 = bundle.explain(&target("sm_100"));
    assert!(!sm_100.is_servable());
    assert!(
        sm_100.to_string().contains(
            "rejected  cuda-nvptx64-nvidia-cuda-sm_90a: sm_90a code runs only on sm_90 \
             (compute capability 9.0) devices; this device is sm_100"
        ),
        "{sm_100}"
    );
    let error = match bundle.load(&simulated("sm_89")) {
        Ok(_) => panic!("sm_89 loaded code that runs only on sm_90"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("this device is sm_89"), "{error}");
}

/// The build's error for `tiles` written with `module_lines` in its [module] table, and `extra`
/// after the manifest.
fn manifest_error(module_lines: &str, extra: &str) -> String {
    let manifest = TILES_MANIFEST.replace("arch_specific = [\"sm_90a\"]\n", module_lines) + extra;
    let package = TempPackage::new(&TARGETS, &[("tiles", TILES_SOURCE, &manifest)]);
    match hkpack::build(&package.options()) {
        Ok(report) => panic!("built {}", report.bundle.display()),
        Err(error) => error.to_string(),
    }
}

#[test]
fn arch_specific_mistakes_are_build_errors_at_their_line() {
    for (module_lines, extra, expected) in [
        (
            "arch_specific = [\"sm_90\"]\n",
            "",
            "tiles.toml:5:18: sm_90 is a portable target, which every module is built for; \
             `arch_specific` lists architecture-specific targets such as sm_90a",
        ),
        (
            "arch_specific = [\"sm_90a\", \"sm_90a\"]\n",
            "",
            "tiles.toml:5:28: sm_90a is listed twice in `arch_specific`",
        ),
        (
            "arch_specific = [\"sm_100f\"]\n",
            "",
            "tiles.toml:5:18: unknown target: `sm_100f` names a family-specific NVIDIA variant",
        ),
        (
            "skip_targets = { sm_90a = \"not yet\" }\n",
            "",
            "tiles.toml:5:18: module `tiles` skips sm_90a, but a module is built for an \
             architecture-specific target only if its `arch_specific` lists it; remove sm_90a \
             from skip_targets",
        ),
        (
            "",
            "\n[target.sm_90a]\ndefines = { TILE = \"128\" }\n",
            "module `tiles` has a [target.sm_90a] override, but it is built for sm_90a only if \
             `arch_specific` lists it; add `arch_specific = [\"sm_90a\"]` to [module] or remove \
             the override",
        ),
    ] {
        let error = manifest_error(module_lines, extra);
        assert!(error.contains(expected), "{error}\nexpected: {expected}");
    }
}
