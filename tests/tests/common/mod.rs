//! Fixtures shared by the end-to-end tests: the repository's own kernels built by the real
//! hkpack with the real compiler, and small synthetic packages for the error paths.

#![allow(dead_code)] // Each test binary uses its own subset of these fixtures.

pub mod servers;
pub mod workspace;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hkpack::toolchain::ToolPaths;
use hkpack::{BuildOptions, BuildReport};

/// The repository root (the workspace folder).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Build cache shared by every test binary, so the repository's kernels compile once per
/// `cargo test` run: `HK_TEST_CACHE` where set (scripts/test points it at the cache that
/// `hkpack build` in scripts/setup filled, so that CI compiles the kernels once, not twice),
/// else one in the target folder. Entries are keyed by everything that decides a compile and
/// checked on every hit, so a shared one serves the same bytes a cold one would compile.
pub fn shared_cache() -> PathBuf {
    std::env::var_os("HK_TEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("hkpack-cache"))
}

pub fn options(manifests: &Path, out: &Path, cache: &Path) -> BuildOptions {
    BuildOptions {
        manifests: manifests.to_owned(),
        targets: None,
        jobs: 2,
        out_dir: out.to_owned(),
        cache_dir: cache.to_owned(),
        remote_cache: None,
        compress: false,
        tools: ToolPaths::default(),
        progress: false,
    }
}

/// The repository's modules whose manifests ask for the architecture-specific sm_90a
/// (`arch_specific`): the expectation the build and load tests hold the bundle to.
pub const SM_90A_MODULES: [&str; 4] = ["attention", "attention_backward", "gemm", "gemm_a8w8"];

/// The repository's kernels built once per test binary into a private folder, compressed
/// and plain: `(compressed bundle folder, plain bundle folder)`.
pub fn repo_bundles() -> &'static (PathBuf, PathBuf) {
    static BUNDLES: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUNDLES.get_or_init(|| {
        let out =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bundles-{}", std::process::id()));
        let manifests = repo().join("manifests");
        let mut compressed_options = options(&manifests, &out.join("ccob"), &shared_cache());
        compressed_options.compress = true;
        let compressed = build_ok(&compressed_options);
        let plain = build_ok(&options(&manifests, &out.join("plain"), &shared_cache()));
        (compressed.bundle, plain.bundle)
    })
}

pub fn build_ok(options: &BuildOptions) -> BuildReport {
    match hkpack::build(options) {
        Ok(report) => report,
        Err(e) => panic!("hkpack build failed:\n{e}"),
    }
}

/// An LLVM tool from the toolchain the build uses (Debian's llvm-22).
pub fn llvm_tool(name: &str) -> PathBuf {
    let path = Path::new("/usr/lib/llvm-22/bin").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup to install llvm-22",
        path.display()
    );
    path
}

/// Some of the repository's modules alone, built for `targets` into `dir`: a package folder
/// with the repository's package manifest and the named module manifests (`"gemm.toml"`), and
/// its kernels folder linked in. Returns the bundle folder.
pub fn build_repo_modules(dir: &Path, manifests: &[&str], targets: &[&str]) -> PathBuf {
    let files: Vec<(&str, String)> = manifests
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(repo().join("manifests").join(file)).unwrap();
            (*file, text)
        })
        .collect();
    build_repo_package(dir, &files, targets)
}

/// [`build_repo_modules`] with module manifests of the caller's own text (`(file name, text)`),
/// for a repository kernel described otherwise (a deliberately wrong extent, say).
pub fn build_repo_package(dir: &Path, manifests: &[(&str, String)], targets: &[&str]) -> PathBuf {
    let folder = dir.join("manifests");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(
        repo().join("manifests/package.toml"),
        folder.join("package.toml"),
    )
    .unwrap();
    for (file, text) in manifests {
        std::fs::write(folder.join(file), text).unwrap();
    }
    std::os::unix::fs::symlink(repo().join("kernels"), dir.join("kernels")).unwrap();
    let mut options = options(&folder, &dir.join("dist"), &shared_cache());
    options.targets = Some(targets.iter().map(|t| t.parse().unwrap()).collect());
    build_ok(&options).bundle
}

/// The AMD targets the repository builds for, with the LDS a workgroup may have on each.
pub const AMD_LDS: [(&str, u32); 3] = [
    ("gfx90a", 64 * 1024),
    ("gfx942", 64 * 1024),
    ("gfx950", 160 * 1024),
];

/// Asserts that every kernel of `records` has code for each of [`AMD_LDS`]'s targets that
/// neither spills nor needs scratch, and keeps its LDS within the target's limit.
pub fn assert_fits_amd_targets(records: &[&hk_format::manifest::KernelRecord]) {
    for record in records {
        for &(target, lds_limit) in &AMD_LDS {
            let target: hk_format::target::TargetId = target.parse().unwrap();
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

/// `llvm-objdump -d --mcpu=<target>` of module file `module` (in `bundle`)'s code object for
/// AMD `target`, unbundled into `scratch`.
pub fn amd_disassembly(bundle: &Path, module: &str, target: &str, scratch: &Path) -> String {
    let object = scratch.join(format!("{module}.{target}.co"));
    let status = std::process::Command::new(llvm_tool("clang-offload-bundler"))
        .args(["--unbundle", "--type=o"])
        .arg(format!("--input={}", bundle.join(module).display()))
        .arg(format!("--targets=hipv4-amdgcn-amd-amdhsa--{target}"))
        .arg(format!("--output={}", object.display()))
        .status()
        .unwrap();
    assert!(status.success(), "no {target} code object in {module}");
    let disassembly = std::process::Command::new(llvm_tool("llvm-objdump"))
        .args(["-d", &format!("--mcpu={target}")])
        .arg(&object)
        .output()
        .unwrap();
    assert!(disassembly.status.success());
    String::from_utf8(disassembly.stdout).unwrap()
}

/// The instructions of function `symbol` in `llvm-objdump -d` output.
pub fn function_body<'a>(disassembly: &'a str, symbol: &str) -> Option<&'a str> {
    let start = disassembly.find(&format!("<{symbol}>:\n"))?;
    let body = &disassembly[start..];
    let end = body.find("\n\n").unwrap_or(body.len());
    Some(&body[..end])
}

/// Every mnemonic of a disassembled body, so that `_bf16` does not also match `_bf16_1k`.
pub fn mnemonics(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect()
}

/// The Python of .venv, where scripts/setup installs hkload (the emulator scripts take launch
/// shapes from its contracts); any python3 otherwise (the scripts say what they lack).
pub fn python() -> PathBuf {
    let venv = repo().join(".venv/bin/python");
    if venv.is_file() {
        venv
    } else {
        "python3".into()
    }
}

/// A small package in a temporary folder: `package.toml` with the given targets and one
/// module per `(name, source, manifest body)`.
pub struct TempPackage {
    pub root: tempfile::TempDir,
}

impl TempPackage {
    pub fn new(targets: &[&str], modules: &[(&str, &str, &str)]) -> Self {
        let root = tempfile::tempdir().unwrap();
        let manifests = root.path().join("manifests");
        let kernels = root.path().join("kernels");
        std::fs::create_dir_all(&manifests).unwrap();
        std::fs::create_dir_all(kernels.join("include")).unwrap();
        std::fs::write(kernels.join("include/mini.h"), MINI_HEADER).unwrap();
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        std::fs::write(
            manifests.join("package.toml"),
            format!(
                "[package]\nname = \"mini\"\nversion = \"0.1.0\"\ntargets = [{}]\n\
                 amd_code_object_version = 5\ninclude_dirs = [\"../kernels/include\"]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
        for (name, source, manifest) in modules {
            std::fs::write(kernels.join(format!("{name}.hip")), source).unwrap();
            std::fs::write(manifests.join(format!("{name}.toml")), manifest).unwrap();
        }
        Self { root }
    }

    pub fn manifests(&self) -> PathBuf {
        self.root.path().join("manifests")
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    pub fn options(&self) -> BuildOptions {
        options(&self.manifests(), &self.path("dist"), &self.path("cache"))
    }
}

/// Just enough of a device header for the synthetic kernels.
const MINI_HEADER: &str = r#"
#pragma once
#define KERNEL extern "C" __attribute__((global))
#if defined(__AMDGCN__)
#define THREAD_X() __builtin_amdgcn_workitem_id_x()
#else
#define THREAD_X() __nvvm_read_ptx_sreg_tid_x()
#endif
"#;

/// `scale`: out[i] = x[i] * a, in f32.
pub const SCALE_SOURCE: &str = r#"
#include "mini.h"
KERNEL void scale(float* out, const float* x, float a, unsigned n) {
    unsigned i = THREAD_X();
    if (i < n) out[i] = x[i] * a;
}
"#;

pub const SCALE_MANIFEST: &str = include_str!("../../fixtures/scale.toml");

/// `offset`: out[i] = x[i] + b, in f32.
pub const OFFSET_SOURCE: &str = r#"
#include "mini.h"
KERNEL void offset(float* out, const float* x, float b, unsigned n) {
    unsigned i = THREAD_X();
    if (i < n) out[i] = x[i] + b;
}
"#;

pub const OFFSET_MANIFEST: &str = r#"
[module]
name = "offset"
source = "../kernels/offset.hip"

[[kernel]]
symbol = "offset"
args = ["out: *mut f32", "x: *const f32", "b: f32", "n: u32"]
"#;

/// Runs `tests/emu/<script>` over the bundle `build` writes into a scratch folder, on the CDNA
/// emulator of the tinygrad tree in `HK_TINYGRAD`, printing what it says and failing the test
/// if it fails; without `HK_TINYGRAD` the test says it skipped (and passes).
pub fn run_on_emulator(script: &str, build: impl FnOnce(&Path) -> PathBuf) {
    let Some(tree) = std::env::var_os("HK_TINYGRAD") else {
        eprintln!("skipped: set HK_TINYGRAD to a tinygrad source tree to run the CDNA emulator");
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let bundle = build(scratch.path());
    let output = std::process::Command::new(python())
        .arg(repo().join("tests/emu").join(script))
        .arg(&bundle)
        .env("HK_TINYGRAD", tree)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{script} failed");
}
