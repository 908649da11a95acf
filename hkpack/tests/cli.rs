//! The `hkpack` command as a user runs it: build, inspect and explain on a small package
//! compiled by the real toolchain, exit codes included.

use std::path::Path;
use std::process::{Command, Output};

const SOURCE: &str = r#"
#if defined(__AMDGCN__)
#define THREAD_X() __builtin_amdgcn_workitem_id_x()
#else
#define THREAD_X() __nvvm_read_ptx_sreg_tid_x()
#endif
extern "C" __attribute__((global)) void scale(float* out, const float* x, float a, unsigned n) {
    unsigned i = THREAD_X();
    if (i < n) out[i] = x[i] * a;
}
"#;

const MODULE: &str = include_str!("../../tests/fixtures/scale.toml");

const PACKAGE: &str = r#"
[package]
name = "cli"
version = "1.2.3"
targets = ["gfx90a", "gfx942", "sm_90"]
amd_code_object_version = 5
"#;

fn package(root: &Path) {
    std::fs::create_dir_all(root.join("manifests")).unwrap();
    std::fs::create_dir_all(root.join("kernels")).unwrap();
    std::fs::write(root.join("manifests/package.toml"), PACKAGE).unwrap();
    // The test kernel with a launch contract: a thread an element.
    let module = MODULE
        .replace("\"out: *mut f32\"", "\"out: *mut f32 [n]\"")
        .replace("\"x: *const f32\"", "\"x: *const f32 [n]\"")
        + "[kernel.contract]\nblock = \"64\"\ngrid = \"ceil_div(n, 64)\"\n\
           requires = [{ check = \"n >= 1\", message = \"nothing to scale\" }]\n";
    std::fs::write(root.join("manifests/scale.toml"), module).unwrap();
    std::fs::write(root.join("kernels/scale.hip"), SOURCE).unwrap();
}

fn hkpack(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hkpack"))
        .current_dir(root)
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn build_inspect_and_explain_from_the_command_line() {
    let root = tempfile::tempdir().unwrap();
    package(root.path());
    let build = hkpack(root.path(), &["build", "--quiet"]);
    assert!(build.status.success(), "{}", text(&build.stderr));
    assert!(build.stdout.is_empty(), "--quiet prints nothing on success");

    let inspect = hkpack(root.path(), &["inspect", "dist/cli-1.2.3"]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    let table = text(&inspect.stdout);
    assert_eq!(
        table.lines().count(),
        4,
        "a header and one row per target:\n{table}"
    );
    assert!(table.starts_with("module"), "{table}");
    let json = hkpack(root.path(), &["inspect", "dist/cli-1.2.3", "--json"]);
    let json = text(&json.stdout);
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed["rows"].as_array().unwrap().len(), 3, "{json}");
    assert_eq!(parsed["rows"][0]["kernel"], "scale", "{json}");
    assert_eq!(parsed["not_built"], serde_json::json!([]), "{json}");

    assert!(
        json.contains("\"ceil_div(n, 64)\""),
        "every row carries its contract:\n{json}"
    );

    let one = hkpack(
        root.path(),
        &["inspect", "dist/cli-1.2.3", "--kernel", "scale"],
    );
    assert!(one.status.success(), "{}", text(&one.stderr));
    let one = text(&one.stdout);
    for part in [
        "kernel scale (module scale)",
        "signature: (out: *mut f32, x: *const f32, a: f32, n: u32)",
        "requires n >= 1  (nothing to scale)",
        "grid [ceil_div(n, 64), 1, 1]",
        "out holds at least n elements",
        "sm_90",
    ] {
        assert!(one.contains(part), "`{part}` not in:\n{one}");
    }
    let missing = hkpack(
        root.path(),
        &["inspect", "dist/cli-1.2.3", "--kernel", "scal"],
    );
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("no kernel `scal`; it has scale"));

    let explain = hkpack(
        root.path(),
        &[
            "explain",
            "dist/cli-1.2.3",
            "--target",
            "gfx942:sramecc+:xnack-",
        ],
    );
    assert!(explain.status.success(), "{}", text(&explain.stderr));
    let out = text(&explain.stdout);
    assert!(
        out.contains("chosen    hipv4-amdgcn-amd-amdhsa--gfx942"),
        "{out}"
    );
    assert!(
        out.contains("rejected  hipv4-amdgcn-amd-amdhsa--gfx90a"),
        "{out}"
    );

    let explain = hkpack(
        root.path(),
        &["explain", "dist/cli-1.2.3", "--target", "gfx1100"],
    );
    assert_eq!(explain.status.code(), Some(1));
    let (out, err) = (text(&explain.stdout), text(&explain.stderr));
    assert!(out.contains("no entry runs on gfx1100"), "{out}");
    assert!(err.contains("no code object for gfx1100"), "{err}");

    let json = hkpack(
        root.path(),
        &["explain", "dist/cli-1.2.3", "--target", "sm_90", "--json"],
    );
    assert!(json.status.success());
    assert!(text(&json.stdout).contains("\"status\": \"chosen\""));

    let bad = hkpack(
        root.path(),
        &["explain", "dist/cli-1.2.3", "--target", "gfx9999"],
    );
    assert_eq!(bad.status.code(), Some(2), "clap rejects an unknown target");
    assert!(text(&bad.stderr).contains("gfx9999"));
}

#[test]
fn without_ptxas_nvidia_targets_ship_ptx_and_the_summary_says_so() {
    if Path::new("/usr/local/cuda/bin/ptxas").exists() {
        eprintln!("skipped: /usr/local/cuda/bin/ptxas would be found without PATH");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    package(root.path());
    // An empty PATH hides any ptxas; clang is still found in /usr/lib/llvm-NN/bin.
    let empty = root.path().join("empty-path");
    std::fs::create_dir(&empty).unwrap();
    let without_ptxas = |arch: &str| {
        Command::new(env!("CARGO_BIN_EXE_hkpack"))
            .current_dir(root.path())
            .args(["build", "--arch", arch])
            .env("PATH", &empty)
            .env_remove("HKPACK_PTXAS")
            .env_remove("CUDA_HOME")
            .output()
            .unwrap()
    };
    let build = without_ptxas("sm_90");
    assert!(build.status.success(), "{}", text(&build.stderr));
    let out = text(&build.stdout);
    assert!(out.contains("1 job: 1 compiled"), "{out}");
    assert!(
        out.contains("ptxas not found, so sm_90 ship PTX only"),
        "{out}"
    );
    let manifest = std::fs::read_to_string(root.path().join("dist/cli-1.2.3/bundle.toml")).unwrap();
    assert!(manifest.contains("cuda-nvptx64-nvidia-cuda-compute_90"));
    assert!(!manifest.contains("cuda-nvptx64-nvidia-cuda-sm_90\""));

    // Without cubins every PTX is some GPU's only code: sm_8x run compute_80's.
    let build = without_ptxas("sm_80,sm_90");
    assert!(build.status.success(), "{}", text(&build.stderr));
    let manifest = std::fs::read_to_string(root.path().join("dist/cli-1.2.3/bundle.toml")).unwrap();
    assert!(manifest.contains("cuda-nvptx64-nvidia-cuda-compute_80"));
    assert!(manifest.contains("cuda-nvptx64-nvidia-cuda-compute_90"));
}

/// Writes an executable shell script `name` into `dir`.
fn script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn a_clang_that_fails_or_has_no_lld_is_reported_with_what_to_do() {
    let root = tempfile::tempdir().unwrap();
    package(root.path());
    let tools = root.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    let empty = root.path().join("empty-path");
    std::fs::create_dir(&empty).unwrap();
    let build = |clang: &Path| {
        Command::new(env!("CARGO_BIN_EXE_hkpack"))
            .current_dir(root.path())
            .args(["build", "--clang"])
            .arg(clang)
            .env("PATH", &empty)
            .output()
            .unwrap()
    };

    let broken = script(&tools, "broken-clang", "exit 3");
    let out = build(&broken);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("broken-clang does not run: `--version` exited with exit status: 3"),
        "{err}"
    );

    let lonely = script(&tools, "clang", "echo 'clang version 99'");
    let out = build(&lonely);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("no ld.lld next to"), "{err}");
    assert!(err.contains("install lld-22"), "{err}");
    assert!(
        !root.path().join("dist").exists(),
        "nothing is written when the toolchain is unusable"
    );
}

#[test]
fn inspect_and_explain_fail_on_damaged_module_files() {
    // Their facts come from the index alone: a damaged module file once went unnoticed.
    let root = tempfile::tempdir().unwrap();
    package(root.path());
    let build = hkpack(root.path(), &["build", "--quiet"]);
    assert!(build.status.success(), "{}", text(&build.stderr));
    let module = root.path().join("dist/cli-1.2.3/scale.hipfb");
    let mut bytes = std::fs::read(&module).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x5a;
    std::fs::write(&module, bytes).unwrap();

    let explain = ["explain", "dist/cli-1.2.3", "--target", "sm_90"];
    for args in [&["inspect", "dist/cli-1.2.3"][..], &explain] {
        let out = hkpack(root.path(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains("scale.hipfb has SHA-256"), "{err}");
        assert!(err.contains("rebuild it with `hkpack build`"), "{err}");
    }
    std::fs::remove_file(&module).unwrap();
    let out = hkpack(root.path(), &["inspect", "dist/cli-1.2.3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("scale.hipfb cannot be read"));
}

#[test]
fn verify_names_each_damaged_file_and_extract_writes_checked_images() {
    let root = tempfile::tempdir().unwrap();
    package(root.path());
    let build = hkpack(root.path(), &["build", "--quiet"]);
    assert!(build.status.success(), "{}", text(&build.stderr));
    let dir = root.path().join("dist/cli-1.2.3");

    let verify = hkpack(root.path(), &["verify", "dist/cli-1.2.3"]);
    assert!(verify.status.success(), "{}", text(&verify.stdout));
    let out = text(&verify.stdout);
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok ")).count(),
        4,
        "{out}"
    );
    assert!(out.ends_with("every file matches its index\n"), "{out}");

    // One byte changed in each file in turn: that file, and only it, is damaged.
    for file in [
        "scale.hipfb",
        "scale.abi.toml",
        "bundle.toml",
        "bundle.msgpack",
    ] {
        let path = dir.join(file);
        let original = std::fs::read(&path).unwrap();
        let mut damaged = original.clone();
        let at = damaged.len() - 2;
        damaged[at] ^= 0x01;
        std::fs::write(&path, &damaged).unwrap();
        let verify = hkpack(root.path(), &["verify", "dist/cli-1.2.3", "--json"]);
        assert_eq!(verify.status.code(), Some(1), "{file}");
        let json: serde_json::Value = serde_json::from_slice(&verify.stdout).unwrap();
        let bad: Vec<&str> = json
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["intact"] == false)
            .map(|v| v["file"].as_str().unwrap())
            .collect();
        assert_eq!(bad, [file], "{json}");
        std::fs::write(&path, &original).unwrap();
    }

    let code_object = root.path().join("scale-gfx942.co");
    let extract = hkpack(
        root.path(),
        &[
            "extract",
            "dist/cli-1.2.3",
            "--module",
            "scale",
            "--target",
            "gfx942",
            "-o",
            "scale-gfx942.co",
        ],
    );
    assert!(extract.status.success(), "{}", text(&extract.stderr));
    let notes = Command::new(llvm_readelf())
        .arg("--notes")
        .arg(&code_object)
        .output()
        .unwrap();
    assert!(notes.status.success());
    assert!(
        text(&notes.stdout).contains(".name:           scale"),
        "{}",
        text(&notes.stdout)
    );

    let extract = hkpack(
        root.path(),
        &[
            "extract",
            "dist/cli-1.2.3",
            "--module",
            "scale",
            "--target",
            "gfx950",
            "-o",
            "x",
        ],
    );
    assert_eq!(extract.status.code(), Some(1));
    assert!(
        text(&extract.stderr).contains("has no such entry; it has hipv4-amdgcn-amd-amdhsa--gfx90a")
    );
    let extract = hkpack(
        root.path(),
        &[
            "extract",
            "dist/cli-1.2.3",
            "--module",
            "nope",
            "--target",
            "gfx942",
            "-o",
            "x",
        ],
    );
    assert!(text(&extract.stderr).contains("no module `nope`; it has scale"));
}

/// llvm-readelf from Debian's LLVM, as the build found clang.
fn llvm_readelf() -> std::path::PathBuf {
    (14..=30)
        .rev()
        .map(|v| std::path::PathBuf::from(format!("/usr/lib/llvm-{v}/bin/llvm-readelf")))
        .find(|p| p.exists())
        .unwrap_or_else(|| "llvm-readelf".into())
}

#[test]
fn a_shared_cache_from_the_command_line_with_json_counts() {
    let root = tempfile::tempdir().unwrap();
    package(root.path());
    let url = format!("file://{}", root.path().join("remote").display());
    let build = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hkpack"))
            .current_dir(root.path())
            .arg("build")
            .args(args)
            .env("HKPACK_CACHE_URL", &url)
            .output()
            .unwrap()
    };
    let cold = build(&["--json"]);
    assert!(cold.status.success(), "{}", text(&cold.stderr));
    let report: serde_json::Value = serde_json::from_slice(&cold.stdout).unwrap();
    assert_eq!(report["jobs"], 3, "{report:#}");
    assert_eq!(report["compiled"], 3, "{report:#}");
    assert_eq!(report["remote"]["written_back"], 3, "{report:#}");
    assert_eq!(report["remote"]["url"], url.as_str(), "{report:#}");
    assert!(report["remote"]["bytes_written"].as_u64() > Some(0));

    // Another machine (no local cache), untrusted: reads everything, writes nothing.
    std::fs::remove_dir_all(root.path().join(".hkpack-cache")).unwrap();
    let warm = Command::new(env!("CARGO_BIN_EXE_hkpack"))
        .current_dir(root.path())
        .args(["build", "--cache-url", &url])
        .env("HKPACK_CACHE_READONLY", "1")
        .output()
        .unwrap();
    assert!(warm.status.success(), "{}", text(&warm.stderr));
    let summary = text(&warm.stdout);
    assert!(
        summary.starts_with("3 jobs: 0 compiled, 0 cached, 3 from the remote cache"),
        "{summary}"
    );
    assert!(summary.contains("0 written back (read-only)"), "{summary}");

    let bad = build(&["--cache-url", "ftp://cache.example/hkpack"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stderr).contains("scheme `ftp`"),
        "{}",
        text(&bad.stderr)
    );
    let bad = build(&["--cache-timeout=0"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("`0` is not a positive number of seconds"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn every_compile_goes_through_the_compiler_launcher() {
    let root = tempfile::tempdir().unwrap();
    package(root.path());
    let log = root.path().join("launched.txt");
    let launcher = script(
        root.path(),
        "launcher",
        &format!("echo \"$1 $2\" >> {}\nexec \"$@\"", log.display()),
    );
    let build = Command::new(env!("CARGO_BIN_EXE_hkpack"))
        .current_dir(root.path())
        .args(["build", "--quiet"])
        .env("HKPACK_COMPILER_LAUNCHER", &launcher)
        .output()
        .unwrap();
    assert!(build.status.success(), "{}", text(&build.stderr));
    let launched = std::fs::read_to_string(&log).unwrap();
    let mut tools: Vec<&str> = launched
        .lines()
        .map(|l| {
            let (tool, first) = l.split_once(' ').unwrap();
            let name = Path::new(tool).file_name().unwrap().to_str().unwrap();
            if name == "ptxas" { "ptxas" } else { first }
        })
        .collect();
    tools.sort();
    // Each job's clang compile (-x hip or -x cuda) and signature probe (also -x …), and
    // ptxas for the NVIDIA job: gfx90a, gfx942 and sm_90.
    assert_eq!(
        tools,
        ["-x", "-x", "-x", "-x", "-x", "-x", "ptxas"],
        "{launched}"
    );

    let missing = Command::new(env!("CARGO_BIN_EXE_hkpack"))
        .current_dir(root.path())
        .args(["build", "--compiler-launcher", "no-such-launcher --flag"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains("compiler launcher `no-such-launcher` not found on PATH"),
        "{}",
        text(&missing.stderr)
    );
}

/// A bundle split into packages, checked as a set: the index package with any of its target
/// packages, every file named by its package, exit 0, 1 or 2; and `inspect --json` listing the
/// target a module skips.
#[test]
fn verify_checks_a_package_set_and_inspect_lists_skipped_targets() {
    const REASON: &str = "no reason but this test";
    let root = tempfile::tempdir().unwrap();
    package(root.path());
    let module = root.path().join("manifests/scale.toml");
    let text_of = |path: &Path| std::fs::read_to_string(path).unwrap();
    let skipping = text_of(&module).replace(
        "source = \"../kernels/scale.hip\"\n",
        &format!("source = \"../kernels/scale.hip\"\nskip_targets = {{ gfx90a = \"{REASON}\" }}\n"),
    );
    std::fs::write(&module, skipping).unwrap();
    let build = hkpack(root.path(), &["build", "--quiet", "--split"]);
    assert!(build.status.success(), "{}", text(&build.stderr));

    let json = hkpack(root.path(), &["inspect", "dist/cli-1.2.3", "--json"]);
    assert!(json.status.success(), "{}", text(&json.stderr));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        json["not_built"],
        serde_json::json!([{ "module": "scale", "target": "gfx90a", "reason": REASON }])
    );

    let set = [
        "dist/cli-1.2.3-index",
        "dist/cli-1.2.3-sm_90",
        "dist/cli-1.2.3-gfx942",
    ];
    let verify = |extra: &[&str]| {
        let mut args = vec!["verify"];
        args.extend(set);
        args.extend(extra);
        hkpack(root.path(), &args)
    };
    let intact = verify(&[]);
    assert_eq!(intact.status.code(), Some(0), "{}", text(&intact.stdout));
    let out = text(&intact.stdout);
    for line in [
        "ok       cli-1.2.3-index/bundle.msgpack",
        "ok       cli-1.2.3-index/scale.abi.toml",
        "ok       cli-1.2.3-sm_90/target.toml",
        "ok       cli-1.2.3-sm_90/scale.hipfb",
        "ok       cli-1.2.3-gfx942/scale.hipfb",
    ] {
        assert!(out.contains(line), "`{line}` not in:\n{out}");
    }
    assert!(
        out.contains("2 code images for sm_90, each matching its SHA-256 and BLAKE3"),
        "{out}"
    );
    assert!(out.ends_with("every file matches its index\n"), "{out}");
    assert_eq!(
        out.lines().count(),
        8,
        "a line per file and the verdict:\n{out}"
    );

    let damaged_files = || {
        let verify = verify(&["--json"]);
        assert_eq!(verify.status.code(), Some(1), "{}", text(&verify.stdout));
        let json: serde_json::Value = serde_json::from_slice(&verify.stdout).unwrap();
        json.as_array()
            .unwrap()
            .iter()
            .filter(|v| v["intact"] == false)
            .map(|v| {
                (
                    v["file"].as_str().unwrap().to_owned(),
                    v["detail"].as_str().unwrap().to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    // A byte of the sm_90 package's module file (its last, in the last code image).
    let file = root.path().join("dist/cli-1.2.3-sm_90/scale.hipfb");
    let original = std::fs::read(&file).unwrap();
    let mut damaged = original.clone();
    *damaged.last_mut().unwrap() ^= 1;
    std::fs::write(&file, &damaged).unwrap();
    let bad = damaged_files();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].0, "cli-1.2.3-sm_90/scale.hipfb");
    assert!(bad[0].1.contains("has SHA-256"), "{bad:?}");
    std::fs::write(&file, &original).unwrap();

    // The gfx942 package's module file gone.
    let file = root.path().join("dist/cli-1.2.3-gfx942/scale.hipfb");
    let original = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    let bad = damaged_files();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].1.contains("cannot be read"), "{bad:?}");
    assert!(
        bad[0]
            .1
            .contains("the index lists code of module scale for gfx942"),
        "{bad:?}"
    );
    std::fs::write(&file, &original).unwrap();

    // A package split from another build: its description names another index.
    let description = root.path().join("dist/cli-1.2.3-sm_90/target.toml");
    let original = text_of(&description);
    let digest = original
        .lines()
        .find_map(|line| line.strip_prefix("index_digest = \""))
        .unwrap()
        .trim_end_matches('"')
        .to_owned();
    let other = "0".repeat(64);
    std::fs::write(&description, original.replace(&digest, &other)).unwrap();
    let bad = damaged_files();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].0, "cli-1.2.3-sm_90/target.toml");
    for part in [
        format!("cli 1.2.3 for sm_90, index {other}"),
        format!("cli 1.2.3 for sm_90, index {digest}"),
        "split from another build".to_owned(),
    ] {
        assert!(bad[0].1.contains(&part), "`{part}` not in {bad:?}");
    }
    std::fs::write(&description, original).unwrap();
    assert_eq!(verify(&[]).status.code(), Some(0));

    // Folders that are no package set: exit 2, nothing checked.
    for (args, problem) in [
        (&["dist/cli-1.2.3-sm_90"][..], "no index among"),
        (
            &["dist/cli-1.2.3", "dist/cli-1.2.3-index"][..],
            "both hold an index",
        ),
        (
            &["dist/cli-1.2.3-index", "manifests"][..],
            "neither a bundle, an index package nor a target package",
        ),
    ] {
        let mut all = vec!["verify"];
        all.extend(args);
        let refused = hkpack(root.path(), &all);
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        assert!(refused.stdout.is_empty(), "{args:?}");
        assert!(
            text(&refused.stderr).contains(problem),
            "{args:?}: {}",
            text(&refused.stderr)
        );
    }

    // The full bundle with a target package is a set too; alone, it is checked as before.
    let whole = hkpack(
        root.path(),
        &["verify", "dist/cli-1.2.3", "dist/cli-1.2.3-sm_90"],
    );
    assert_eq!(whole.status.code(), Some(0), "{}", text(&whole.stdout));
    assert!(text(&whole.stdout).contains("ok       cli-1.2.3/scale.hipfb"));
}
