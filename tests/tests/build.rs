//! `hkpack build` end to end: the repository's kernels built by the real compiler into real
//! bundles, cross-checked by LLVM's own tools; incremental rebuilds; and every manifest,
//! toolchain, compile and signature error a user can meet, with the message they see.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::*;
use hk_format::index::{INDEX_FILE, Index};
use hk_format::manifest::{BundleManifest, MANIFEST_FILE, ModuleAbi};
use hk_format::target::{EntryId, TargetId};
use hkload::Bundle;
use hkload::select::choose;
use hkpack::toolchain::ToolPaths;
use sha2::{Digest, Sha256};

fn manifest(bundle: &Path) -> BundleManifest {
    BundleManifest::from_toml(&std::fs::read_to_string(bundle.join(MANIFEST_FILE)).unwrap())
        .unwrap()
}

/// Real GPUs of both vendors, as their runtimes report them.
const GPUS: [&str; 9] = [
    "gfx90a:sramecc+:xnack-",
    "gfx942:sramecc+:xnack-",
    "gfx950:sramecc+:xnack-",
    "sm_80",
    "sm_86",
    "sm_89",
    "sm_90",
    "sm_100",
    "sm_120",
];

/// Whether module `module` is built for `target` unless it skips it: an architecture-specific
/// target only if the module asks for it.
fn asks_for(module: &str, target: &TargetId) -> bool {
    !target.is_arch_specific() || SM_90A_MODULES.contains(&module)
}

/// The entries one of the package's default targets contributes to a module file.
fn entries_of(target: &TargetId) -> Vec<String> {
    match target {
        TargetId::Amd(_) => vec![format!("hipv4-amdgcn-amd-amdhsa--{target}")],
        // sm_90a's PTX would serve no device its cubin does not: it does not ship.
        TargetId::Nvidia(_) if target.is_arch_specific() => {
            vec![format!("cuda-nvptx64-nvidia-cuda-{target}")]
        }
        // The newest NVIDIA target also ships its PTX, for GPUs newer than any cubin.
        TargetId::Nvidia(_) if target.to_string() == "sm_90" => vec![
            "cuda-nvptx64-nvidia-cuda-sm_90".into(),
            "cuda-nvptx64-nvidia-cuda-compute_90".into(),
        ],
        TargetId::Nvidia(_) => vec![format!("cuda-nvptx64-nvidia-cuda-{target}")],
    }
}

#[test]
fn every_module_has_every_default_target_it_does_not_skip() {
    let (compressed, plain) = repo_bundles();
    let targets: Vec<TargetId> = ["gfx90a", "gfx942", "gfx950", "sm_80", "sm_90", "sm_90a"]
        .map(|t| t.parse().unwrap())
        .into();
    for bundle in [compressed, plain] {
        let manifest = manifest(bundle);
        assert!(!manifest.modules.is_empty());
        assert_eq!(manifest.targets, targets);
        for module in &manifest.modules {
            let skipped: Vec<TargetId> = module.not_built.iter().map(|n| n.target).collect();
            // A module not asking for sm_90a is not built for it, and nothing records that.
            let asked: Vec<&TargetId> = targets
                .iter()
                .filter(|t| asks_for(&module.name, t))
                .collect();
            let built: Vec<&TargetId> = asked
                .iter()
                .copied()
                .filter(|t| !skipped.contains(t))
                .collect();
            assert_eq!(
                built.len() + skipped.len(),
                asked.len(),
                "module {}",
                module.name
            );
            let expected: BTreeSet<String> = built.iter().flat_map(|t| entries_of(t)).collect();
            let ids: BTreeSet<String> = module.entries.iter().map(|e| e.id.to_string()).collect();
            assert_eq!(ids, expected, "module {}", module.name);
            // Every entry is one some GPU runs: the compute_80 PTX, which none chose (sm_8x
            // take the sm_80 cubin, newer GPUs the compute_90 PTX), no longer ships. The sm_90
            // cubin beside sm_90a's is one an sm_90 runs where the sm_90a package is not
            // installed (`hkpack split`), so a bundle without arch-specific code counts too.
            let entries: Vec<EntryId> = module.entries.iter().map(|e| e.id).collect();
            let portable: Vec<EntryId> = entries
                .iter()
                .copied()
                .filter(|e| !e.target().is_arch_specific())
                .collect();
            for entry in &entries {
                let chosen = GPUS.iter().any(|gpu| {
                    [&entries, &portable].into_iter().any(|installed| {
                        choose(&gpu.parse::<TargetId>().unwrap(), installed)
                            .is_some_and(|(i, _)| installed[i] == *entry)
                    })
                });
                assert!(chosen, "no GPU runs {entry} of module {}", module.name);
            }
        }
        // Every kernel has its ABI for every target its module is built for, with no spills or
        // scratch anywhere.
        let opened = Bundle::open(bundle).unwrap();
        let records = opened.kernel_records().unwrap();
        for (at, kernel) in opened.table().kernels().zip(records) {
            let module = &manifest.modules[at.module];
            let asked = targets.iter().filter(|t| asks_for(&module.name, t)).count();
            assert_eq!(
                kernel.targets.len() + module.not_built.len(),
                asked,
                "kernel {}",
                kernel.symbol
            );
            for abi in &kernel.targets {
                assert_eq!(
                    abi.spills, 0,
                    "kernel {} spills on {}",
                    kernel.symbol, abi.target
                );
                assert_eq!(
                    abi.private_segment_size, 0,
                    "{} scratch on {}",
                    kernel.symbol, abi.target
                );
            }
        }
    }
}

#[test]
fn the_index_holds_exactly_the_records_of_the_toml_files() {
    let (compressed, plain) = repo_bundles();
    for bundle in [compressed, plain] {
        let toml = manifest(bundle);
        let index = Index::open(std::fs::read(bundle.join(INDEX_FILE)).unwrap(), true).unwrap();
        assert_eq!(index.manifest().unwrap(), &toml);
        for (i, module) in toml.modules.iter().enumerate() {
            let text = std::fs::read_to_string(bundle.join(&module.abi_file)).unwrap();
            assert_eq!(
                index.module_abi(i).unwrap(),
                ModuleAbi::from_toml(&text, module).unwrap(),
                "module {}",
                module.name
            );
        }
    }
}

#[test]
fn llvm_tools_agree_with_our_bundles() {
    let bundler = llvm_tool("clang-offload-bundler");
    let readelf = llvm_tool("llvm-readelf");
    let scratch = tempfile::tempdir().unwrap();
    let (compressed, plain) = repo_bundles();
    for bundle in [compressed, plain] {
        let manifest = manifest(bundle);
        for module in &manifest.modules {
            let file = bundle.join(&module.file);
            let listed = Command::new(&bundler)
                .args(["--list", "--type=o"])
                .arg(format!("--input={}", file.display()))
                .output()
                .unwrap();
            assert!(
                listed.status.success(),
                "{}",
                String::from_utf8_lossy(&listed.stderr)
            );
            let listed: BTreeSet<String> = String::from_utf8(listed.stdout)
                .unwrap()
                .lines()
                .map(String::from)
                .collect();
            let ours: BTreeSet<String> = module.entries.iter().map(|e| e.id.to_string()).collect();
            assert_eq!(listed, ours, "{}", file.display());

            let kernels = &module.kernels;
            for entry in &module.entries {
                let EntryId::AmdCodeObject(_) = entry.id else {
                    continue;
                };
                let out = scratch.path().join("entry.co");
                let status = Command::new(&bundler)
                    .args(["--unbundle", "--type=o"])
                    .arg(format!("--input={}", file.display()))
                    .arg(format!("--targets={}", entry.id))
                    .arg(format!("--output={}", out.display()))
                    .status()
                    .unwrap();
                assert!(status.success());
                let bytes = std::fs::read(&out).unwrap();
                assert_eq!(
                    hk_format::manifest::hex(&Sha256::digest(&bytes)),
                    entry.sha256.to_string()
                );
                let notes = Command::new(&readelf)
                    .arg("--notes")
                    .arg(&out)
                    .output()
                    .unwrap();
                let notes = String::from_utf8_lossy(&notes.stdout);
                for kernel in kernels {
                    assert!(
                        notes.contains(&format!(".name:           {kernel}")),
                        "{kernel} missing from the notes of {} in {}",
                        entry.id,
                        file.display()
                    );
                }
            }
        }
    }
}

#[test]
fn a_rebuild_compiles_nothing_and_changes_no_byte() {
    let (compressed, _) = repo_bundles();
    let before = snapshot(compressed);
    let out = compressed.parent().unwrap();
    let mut options = options(&repo().join("manifests"), out, &shared_cache());
    options.compress = true;
    let report = build_ok(&options);
    assert_eq!(report.compiled, 0, "{report}");
    assert_eq!(report.local_hits, report.jobs);
    assert_eq!(snapshot(compressed), before);
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn editing_one_source_rebuilds_only_its_module_and_a_header_rebuilds_all() {
    let package = TempPackage::new(
        &["gfx942", "sm_90"],
        &[
            ("scale", SCALE_SOURCE, SCALE_MANIFEST),
            ("offset", OFFSET_SOURCE, OFFSET_MANIFEST),
        ],
    );
    let first = build_ok(&package.options());
    assert_eq!((first.jobs, first.compiled), (4, 4));

    let source = package.path("kernels/scale.hip");
    std::fs::write(&source, format!("{SCALE_SOURCE}\n// edited\n")).unwrap();
    let second = build_ok(&package.options());
    assert_eq!((second.compiled, second.local_hits), (2, 2), "{second}");

    let header = package.path("kernels/include/mini.h");
    let text = std::fs::read_to_string(&header).unwrap();
    std::fs::write(&header, text + "\n// edited\n").unwrap();
    let third = build_ok(&package.options());
    assert_eq!(third.compiled, 4, "{third}");

    let fourth = build_ok(&package.options());
    assert_eq!(fourth.compiled, 0, "{fourth}");
}

#[test]
fn builds_from_scratch_in_two_places_are_byte_identical() {
    let modules = [
        ("scale", SCALE_SOURCE, SCALE_MANIFEST),
        ("offset", OFFSET_SOURCE, OFFSET_MANIFEST),
    ];
    let targets = ["gfx90a", "gfx942", "gfx950", "sm_80", "sm_90"];
    let (a, b) = (
        TempPackage::new(&targets, &modules),
        TempPackage::new(&targets, &modules),
    );
    let (first, second) = (build_ok(&a.options()), build_ok(&b.options()));
    assert_eq!((first.compiled, second.compiled), (10, 10));
    assert_eq!(digests(&first.bundle), digests(&second.bundle));
}

/// Each file of a folder with the SHA-256 of its bytes, for comparisons that print readably.
fn digests(dir: &Path) -> Vec<(String, String)> {
    snapshot(dir)
        .into_iter()
        .map(|(name, bytes)| (name, hk_format::manifest::hex(&Sha256::digest(bytes))))
        .collect()
}

#[test]
fn two_builds_sharing_a_cache_both_succeed() {
    let package = TempPackage::new(
        &["gfx90a", "gfx942", "sm_80"],
        &[
            ("scale", SCALE_SOURCE, SCALE_MANIFEST),
            ("offset", OFFSET_SOURCE, OFFSET_MANIFEST),
        ],
    );
    let reports = std::thread::scope(|s| {
        let a = s.spawn(|| hkpack::build(&package.options()));
        let b = s.spawn(|| hkpack::build(&package.options()));
        [a.join().unwrap(), b.join().unwrap()]
    });
    for report in reports {
        report.unwrap();
    }
    let bundle = Bundle::open(package.path("dist/mini-0.1.0")).unwrap();
    assert_eq!(bundle.manifest().unwrap().modules.len(), 2);
    assert!(
        std::fs::read_dir(package.path("cache/tmp"))
            .unwrap()
            .next()
            .is_none()
    );
}

/// One flipped bit in the `.text` of a cached code object (a bad disk, a stray write) no
/// longer matches the digest its entry was stored with: the hit is a miss with one warning
/// naming the entry and the file, the job compiles again, its result replaces the entry, and
/// the bundle is the one the first build wrote.
#[test]
fn a_flipped_bit_in_a_cached_code_object_is_a_miss_compiled_again_and_replaced() {
    let package = TempPackage::new(&["gfx942"], &[("scale", SCALE_SOURCE, SCALE_MANIFEST)]);
    let first = build_ok(&package.options());
    assert_eq!(first.compiled, 1, "{first}");

    let entries: Vec<_> = std::fs::read_dir(package.path("cache/objects"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let code = entries[0].join("code.co");
    let mut bytes = std::fs::read(&code).unwrap();
    let text = elf_section(&bytes, ".text");
    bytes[text.start + text.len() / 2] ^= 0x01;
    std::fs::write(&code, bytes).unwrap();

    let mut options = package.options();
    options.out_dir = package.path("second");
    let second = build_ok(&options);
    assert_eq!((second.compiled, second.local_hits), (1, 0), "{second}");
    assert_eq!(second.warnings.len(), 1, "{:?}", second.warnings);
    let entry = entries[0].file_name().unwrap().to_string_lossy();
    let said = &second.warnings[0];
    assert!(
        said.contains(&format!("ignored entry `objects/{entry}`"))
            && said.contains("`code.co` does not match")
            && said.contains("replacing the entry"),
        "{said}"
    );
    assert_eq!(digests(&second.bundle), digests(&first.bundle));

    options.out_dir = package.path("third");
    let third = build_ok(&options);
    assert_eq!((third.compiled, third.local_hits), (0, 1), "{third}");
    assert!(third.warnings.is_empty(), "{:?}", third.warnings);
}

/// Where section `name` of a 64-bit little-endian ELF file lies in it.
fn elf_section(elf: &[u8], name: &str) -> std::ops::Range<usize> {
    let at = |offset: usize, size: usize| {
        let mut field = [0u8; 8];
        field[..size].copy_from_slice(&elf[offset..offset + size]);
        u64::from_le_bytes(field) as usize
    };
    let (headers, header_size, count, names) = (at(0x28, 8), at(0x3a, 2), at(0x3c, 2), at(0x3e, 2));
    let header = |index: usize| headers + index * header_size;
    let names = at(header(names) + 0x18, 8);
    let wanted = format!("{name}\0");
    (0..count)
        .map(header)
        .find(|&h| elf[names + at(h, 4)..].starts_with(wanted.as_bytes()))
        .map(|h| at(h + 0x18, 8)..at(h + 0x18, 8) + at(h + 0x20, 8))
        .unwrap_or_else(|| panic!("no {name} section"))
}

fn build_err(package: &TempPackage) -> String {
    build_err_with(package, &package.options())
}

fn assert_contains(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "`{part}` not in:\n{message}");
    }
}

#[test]
fn manifest_errors_name_the_file_and_line() {
    let cases: [(&str, &[&str]); 6] = [
        (
            "[module]\nname = \"scale\"\nsorce = \"../kernels/scale.hip\"\n",
            &["scale.toml:3:1", "unknown field `sorce`"],
        ),
        (
            "[module]\nname = \"scale\"\nsource = \"../kernels/nope.hip\"\n",
            &[
                "scale.toml:3:10",
                "source file `../kernels/nope.hip` does not exist",
            ],
        ),
        (
            &format!("{SCALE_MANIFEST}\n[target.gfx1234]\nflags = []\n"),
            &["scale.toml:10:9", "unknown target", "gfx1234"],
        ),
        (
            &format!("{SCALE_MANIFEST}\n[[kernel]]\nsymbol = \"scale\"\nargs = []\n"),
            &["scale.toml:11:10", "kernel `scale` is declared twice"],
        ),
        (
            &SCALE_MANIFEST.replace("\"a: f32\"", "\"a: float\""),
            &["scale.toml:8:43", "unknown type `float`"],
        ),
        (
            &SCALE_MANIFEST
                .replace("\"scale\"\n\n", "\"offset\"\n\n")
                .replace("symbol = \"scale\"", "symbol = \"offset\""),
            &[
                "kernel `offset` is also declared by module `offset`",
                "symbols must be unique",
            ],
        ),
    ];
    for (manifest, expected) in cases {
        let package = TempPackage::new(
            &["gfx942"],
            &[
                ("scale", SCALE_SOURCE, manifest),
                ("offset", OFFSET_SOURCE, OFFSET_MANIFEST),
            ],
        );
        assert_contains(&build_err(&package), expected);
    }
}

#[test]
fn two_modules_of_one_name_are_refused_and_leave_the_bundle_alone() {
    // Both modules' files were written under one name: one overwrote the other, the build
    // exited 0, and dist/ held a bundle that no longer matched its index.
    let package = TempPackage::new(&["gfx942"], &[("scale", SCALE_SOURCE, SCALE_MANIFEST)]);
    let report = build_ok(&package.options());
    let before = snapshot(&report.bundle);
    let twin = OFFSET_MANIFEST.replace("name = \"offset\"", "name = \"scale\"");
    std::fs::write(package.manifests().join("twin.toml"), twin).unwrap();
    std::fs::write(package.path("kernels/offset.hip"), OFFSET_SOURCE).unwrap();
    let error = hkpack::build(&package.options()).unwrap_err().to_string();
    assert_contains(
        &error,
        &[
            "twin.toml:3:8",
            "module `scale` is also named by",
            "scale.toml",
            "module names must be unique",
        ],
    );
    assert_eq!(snapshot(&report.bundle), before);
}

#[test]
fn a_build_removes_what_killed_builds_left_and_nothing_a_running_one_holds() {
    let package = TempPackage::new(&["gfx942"], &[("scale", SCALE_SOURCE, SCALE_MANIFEST)]);
    let dist = package.path("dist");
    std::fs::create_dir_all(&dist).unwrap();
    // What killed builds leave: folders whose lock files nobody holds, a lock file whose
    // folder was already removed, and a folder from before lock files.
    for name in [".staging-killed", ".retired-killed"] {
        std::fs::create_dir_all(dist.join(name).join("bundle")).unwrap();
        std::fs::write(dist.join(format!("{name}.lock")), "").unwrap();
    }
    std::fs::write(dist.join(".staging-halfway.lock"), "").unwrap();
    std::fs::create_dir(dist.join(".retired-old")).unwrap();
    // A build running beside this one holds its lock.
    std::fs::create_dir(dist.join(".staging-running")).unwrap();
    let running = std::fs::File::create(dist.join(".staging-running.lock")).unwrap();
    running.lock().unwrap();

    build_ok(&package.options());
    let mut left: Vec<String> = std::fs::read_dir(&dist)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [".staging-running", ".staging-running.lock", "mini-0.1.0"]
    );

    // Once that build is gone too, the next build removes its folder.
    drop(running);
    build_ok(&package.options());
    let left: Vec<_> = std::fs::read_dir(&dist).unwrap().collect();
    assert_eq!(left.len(), 1);
}

#[test]
fn package_errors_name_the_file_and_line() {
    let package = TempPackage::new(
        &["gfx942", "sm_75x"],
        &[("scale", SCALE_SOURCE, SCALE_MANIFEST)],
    );
    assert_contains(
        &build_err(&package),
        &["package.toml:4:22", "unknown target", "sm_75x"],
    );

    let package = TempPackage::new(&["gfx942"], &[("scale", SCALE_SOURCE, SCALE_MANIFEST)]);
    let path = package.manifests().join("package.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("0.1.0", "one")).unwrap();
    assert_contains(
        &build_err(&package),
        &["package.toml:3:11", "version `one` is not semver"],
    );
    std::fs::write(&path, text.replace("= 5", "= 3")).unwrap();
    assert_contains(
        &build_err(&package),
        &["package.toml:5", "code object version 3"],
    );
}

#[test]
fn targets_that_cannot_share_a_bundle_are_refused() {
    let package = TempPackage::new(
        &["gfx942", "gfx942:xnack-"],
        &[("scale", SCALE_SOURCE, SCALE_MANIFEST)],
    );
    assert_contains(
        &build_err(&package),
        &[
            "targets gfx942 and gfx942:xnack- cannot share a bundle",
            "name xnack in every gfx942 target",
        ],
    );
    let mut options = package.options();
    options.targets = Some(vec![
        "gfx942:xnack-".parse().unwrap(),
        "gfx942:xnack+".parse().unwrap(),
    ]);
    let report = build_ok(&options);
    let manifest = manifest(&report.bundle);
    let ids: Vec<String> = manifest.modules[0]
        .entries
        .iter()
        .map(|e| e.id.to_string())
        .collect();
    assert_eq!(
        ids,
        [
            "hipv4-amdgcn-amd-amdhsa--gfx942:xnack-",
            "hipv4-amdgcn-amd-amdhsa--gfx942:xnack+"
        ]
    );
}

#[test]
fn signature_mismatches_fail_naming_kernel_target_and_argument() {
    let cases: [(String, &[&str]); 5] = [
        (
            SCALE_MANIFEST.replace("\"a: f32\"", "\"a: f64\""),
            &[
                "kernel `scale` on gfx942: argument 2 `a: f64` is declared 8 bytes but compiled as 4 bytes",
            ],
        ),
        (
            SCALE_MANIFEST.replace("\"a: f32\"", "\"a: *const f32\""),
            &[
                "kernel `scale` on gfx942: argument 2 `a: *const f32` is declared as a pointer but compiled as a value",
            ],
        ),
        (
            SCALE_MANIFEST.replace(", \"n: u32\"", ""),
            &[
                "kernel `scale` on gfx942: the manifest declares 3 arguments, the compiled kernel takes 4",
            ],
        ),
        (
            SCALE_MANIFEST.replace("symbol = \"scale\"", "symbol = \"scale2\""),
            &["has kernel `scale`, which", "does not declare"],
        ),
        (
            format!("{SCALE_MANIFEST}\n[[kernel]]\nsymbol = \"gone\"\nargs = []\n"),
            &[
                "kernel `gone` is declared in",
                "has no such kernel (it has: scale)",
            ],
        ),
    ];
    for (manifest, expected) in cases {
        let package = TempPackage::new(&["gfx942", "sm_90"], &[("scale", SCALE_SOURCE, &manifest)]);
        assert_contains(&build_err(&package), expected);
    }
    // NVIDIA is checked too: the same mismatch reported for sm_90 alone.
    let manifest = SCALE_MANIFEST.replace("\"a: f32\"", "\"a: f64\"");
    let package = TempPackage::new(&["sm_90"], &[("scale", SCALE_SOURCE, &manifest)]);
    assert_contains(
        &build_err(&package),
        &["kernel `scale` on sm_90: argument 2 `a: f64`"],
    );
}

/// A kernel whose parameters the layout alone cannot tell apart from others of their size.
const TYPED_SOURCE: &str = r#"
#include "mini.h"
KERNEL void typed(__bf16* out, const float* x, unsigned long n, int k) {
    unsigned i = THREAD_X();
    if (i < n) out[i] = (__bf16)(x[i] * k);
}
"#;

const TYPED_MANIFEST: &str = r#"
[module]
name = "typed"
source = "../kernels/typed.hip"

[[kernel]]
symbol = "typed"
args = ["out: *mut bf16", "x: *const f32", "n: u64", "k: i32"]
"#;

#[test]
fn exact_types_and_constness_are_checked_against_the_source() {
    // Each built before: the compiled layout has the same sizes and kinds.
    let cases: [(&str, &str, &str); 5] = [
        (
            "\"n: u64\"",
            "\"n: f64\"",
            "argument 2 `n: f64` is declared `f64` but the kernel's parameter is `unsigned long` (`u64`)",
        ),
        (
            "\"out: *mut bf16\"",
            "\"out: *mut f32\"",
            "argument 0 `out: *mut f32` is declared `*mut f32` but the kernel's parameter is `__bf16 *` (`*mut bf16`)",
        ),
        (
            "\"k: i32\"",
            "\"k: u32\"",
            "argument 3 `k: u32` is declared `u32` but the kernel's parameter is `int` (`i32`)",
        ),
        (
            "\"x: *const f32\"",
            "\"x: *const f16\"",
            "argument 1 `x: *const f16` is declared `*const f16` but the kernel's parameter is `const float *` (`*const f32`)",
        ),
        (
            "\"out: *mut bf16\"",
            "\"out: *const bf16\"",
            "argument 0 `out: *const bf16` is declared `*const bf16` but the kernel's parameter is `__bf16 *`, which it may write through: declare it `*mut bf16`, or make the parameter `const`",
        ),
    ];
    for (right, wrong, expected) in cases {
        let manifest = TYPED_MANIFEST.replace(right, wrong);
        assert_ne!(manifest, TYPED_MANIFEST);
        let package = TempPackage::new(&["gfx942", "sm_90"], &[("typed", TYPED_SOURCE, &manifest)]);
        let error = build_err(&package);
        for target in ["gfx942", "sm_90"] {
            assert_contains(
                &error,
                &[&format!("kernel `typed` on {target}: {expected}")],
            );
        }
    }

    // A `*mut` that the kernel cannot write builds, with a warning.
    let manifest = TYPED_MANIFEST.replace("\"x: *const f32\"", "\"x: *mut f32\"");
    let package = TempPackage::new(&["gfx942", "sm_90"], &[("typed", TYPED_SOURCE, &manifest)]);
    let report = build_ok(&package.options());
    assert_eq!(report.warnings.len(), 2, "{:?}", report.warnings);
    for (warning, target) in report.warnings.iter().zip(["gfx942", "sm_90"]) {
        assert_eq!(
            warning,
            &format!(
                "kernel `typed` on {target}: argument 1 `x: *mut f32` is never written: the \
                 kernel's parameter is `const float *`; declare it `*const f32`"
            )
        );
    }
    let package = TempPackage::new(
        &["gfx942", "sm_90"],
        &[("typed", TYPED_SOURCE, TYPED_MANIFEST)],
    );
    assert!(build_ok(&package.options()).warnings.is_empty());
}

#[test]
fn a_compile_error_shows_the_diagnostics_under_the_job() {
    let broken = SCALE_SOURCE.replace("x[i] * a", "x[i] * missing_name");
    let package = TempPackage::new(&["gfx942", "sm_90"], &[("scale", &broken, SCALE_MANIFEST)]);
    assert_contains(
        &build_err(&package),
        &[
            "2 of the build's jobs failed",
            "scale for gfx942:",
            "scale for sm_90:",
            "use of undeclared identifier 'missing_name'",
        ],
    );
}

#[test]
fn toolchain_errors_say_what_to_do() {
    let package = TempPackage::new(&["gfx942"], &[("scale", SCALE_SOURCE, SCALE_MANIFEST)]);
    let mut options = package.options();
    options.tools = ToolPaths {
        clang: Some(package.path("no/clang")),
        ..ToolPaths::default()
    };
    assert_contains(
        &build_err_with(&package, &options),
        &["no/clang (from --clang) does not exist"],
    );

    // A "clang" that runs but knows no GPU processor.
    let fake = package.path("fake-clang");
    std::fs::write(&fake, "#!/bin/sh\necho 'fake clang version 1.0'\n").unwrap();
    let mut perms = std::fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&fake, perms).unwrap();
    std::fs::write(package.path("ld.lld"), "").unwrap();
    options.tools.clang = Some(fake);
    assert_contains(
        &build_err_with(&package, &options),
        &[
            "cannot compile for target gfx942",
            "does not know processor `gfx942`",
            "fake clang version 1.0",
        ],
    );

    let mut options = package.options();
    options.tools.ptxas = Some(package.path("no/ptxas"));
    assert_contains(
        &build_err_with(&package, &options),
        &["no/ptxas (from --ptxas) does not exist"],
    );
}

fn build_err_with(package: &TempPackage, options: &hkpack::BuildOptions) -> String {
    match hkpack::build(options) {
        Ok(report) => panic!("the build should have failed but said: {report}"),
        Err(e) => {
            assert!(
                !package.path("dist/mini-0.1.0").exists(),
                "a failed build must not write a bundle"
            );
            e.to_string()
        }
    }
}

/// The bundle records hkpack's version and the sources' git revision with a dirty flag, and
/// nothing that changes from one build of the same sources to the next.
#[test]
fn the_manifest_records_where_the_bundle_comes_from() {
    let package = TempPackage::new(&["gfx942"], &[("scale", SCALE_SOURCE, SCALE_MANIFEST)]);
    let outside = manifest(&build_ok(&package.options()).bundle);
    let recorded = outside.provenance.expect("a provenance");
    assert_eq!(recorded.hkpack, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        (recorded.source_revision, recorded.source_dirty),
        (None, false)
    );

    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .current_dir(package.root.path())
            .args(["-c", "user.name=hk", "-c", "user.email=hk@example.invalid"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    git(&["init", "-q"]);
    git(&["add", "kernels", "manifests"]);
    git(&["commit", "-q", "-m", "kernels"]);
    let head = git(&["rev-parse", "HEAD"]);
    let clean = manifest(&build_ok(&package.options()).bundle)
        .provenance
        .unwrap();
    assert_eq!(
        (clean.source_revision.as_deref(), clean.source_dirty),
        (Some(head.as_str()), false)
    );

    std::fs::write(
        package.path("kernels/scale.hip"),
        format!("{SCALE_SOURCE}\n// edited\n"),
    )
    .unwrap();
    let dirty = manifest(&build_ok(&package.options()).bundle)
        .provenance
        .unwrap();
    assert_eq!(
        (dirty.source_revision.as_deref(), dirty.source_dirty),
        (Some(head.as_str()), true)
    );
}

/// A generic target builds with the code-object version the package gives it (6: clang refuses
/// less), and serves the processors it covers when the bundle has no native entry for them,
/// as the ROCm runtime's rules say: gfx942 and gfx950 take gfx9-4-generic, gfx90a never does.
#[test]
fn a_generic_code_object_serves_the_processors_without_a_native_one() {
    let package = TempPackage::new(
        &["gfx90a", "gfx9-4-generic"],
        &[("scale", SCALE_SOURCE, SCALE_MANIFEST)],
    );
    let refused = build_err(&package);
    assert_contains(
        &refused,
        &[
            "gfx9-4-generic is a generic target, which needs code object version 6",
            "amd_code_object_versions",
        ],
    );

    let toml = package.manifests().join("package.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(
        &toml,
        format!("{text}amd_code_object_versions = {{ \"gfx9-4-generic\" = 6 }}\n"),
    )
    .unwrap();
    let bundle = build_ok(&package.options()).bundle;
    let opened = hkload::Bundle::open(&bundle).unwrap();
    for (device, chosen) in [
        (
            "gfx942:sramecc+:xnack-",
            "hipv4-amdgcn-amd-amdhsa--gfx9-4-generic",
        ),
        (
            "gfx950:sramecc-:xnack+",
            "hipv4-amdgcn-amd-amdhsa--gfx9-4-generic",
        ),
        ("gfx90a:sramecc+:xnack-", "hipv4-amdgcn-amd-amdhsa--gfx90a"),
    ] {
        let explanation = opened.explain(&device.parse().unwrap());
        let got = explanation.modules[0]
            .selection
            .chosen()
            .map(|(id, _)| id.to_string());
        assert_eq!(got.as_deref(), Some(chosen), "{device}:\n{explanation}");
    }
    let explanation = opened.explain(&"gfx1100".parse().unwrap());
    assert!(!explanation.is_servable(), "{explanation}");

    // The generic code object is a standard one, of version 6, that LLVM's tools read.
    let out = package.path("generic.co");
    hkpack::verify::extract(
        &bundle,
        "scale",
        &hkpack::verify::Pick::Target("gfx9-4-generic".parse().unwrap()),
        &out,
    )
    .unwrap();
    let notes = std::process::Command::new(llvm_tool("llvm-readelf"))
        .args(["--notes", "--file-header"])
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&notes.stdout);
    assert!(notes.status.success(), "{text}");
    assert!(
        text.contains("gfx9-4-generic, xnack, sramecc, generic_v1"),
        "{text}"
    );
    assert!(
        text.contains("ABI Version:                       4"),
        "v6 is ABI version 4:\n{text}"
    );
}
