//! Cache benchmark at scale: a generated package of many small modules (1,000 by default)
//! built for the repository package's targets, through a remote cache. Prints the cold build,
//! a no-op rebuild, a rebuild after one module changed, and a build from an empty local cache
//! with the remote warm.
//!
//! ```text
//! cargo run --release -p hk-bench --bin cache_scale [-- MODULES [TARGETS]]
//! cargo run --release -p hk-bench --bin cache_scale -- 1000 gfx942,sm_90
//! HKPACK_CACHE_URL=redis://127.0.0.1:6379/0 cargo run --release -p hk-bench --bin cache_scale
//! ```
//!
//! The remote is `HKPACK_CACHE_URL` if set, else a folder in the benchmark's temporary
//! directory (`file://`). The targets are those of `manifests/package.toml` unless given.
//! Everything else (sources, caches, bundles) lives in a temporary directory removed at the end.

use std::path::Path;
use std::time::{Duration, Instant};

use hk_format::target::TargetId;
use hkpack::cache::RemoteOptions;
use hkpack::manifest::Package;
use hkpack::toolchain::ToolPaths;
use hkpack::{BuildOptions, BuildReport};

/// Every module includes it, as a real package's kernels share a device header.
const HEADER: &str = r#"
#pragma once
#define KERNEL extern "C" __attribute__((global))
#if defined(__AMDGCN__)
#define THREAD_X() __builtin_amdgcn_workitem_id_x()
#else
#define THREAD_X() __nvvm_read_ptx_sreg_tid_x()
#endif
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let modules: usize = args.next().map_or(Ok(1000), |a| a.parse())?;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("no workspace")?;
    let targets: Vec<TargetId> = match args.next() {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => Package::load(&repo.join("manifests"))?.targets,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    let work = tempfile::tempdir()?;
    generate(work.path(), modules, &targets)?;
    let url = std::env::var("HKPACK_CACHE_URL")
        .unwrap_or_else(|_| format!("file://{}", work.path().join("remote").display()));
    let options = |cache: &str| BuildOptions {
        manifests: work.path().join("manifests"),
        targets: None,
        jobs: cores,
        out_dir: work.path().join("dist"),
        cache_dir: work.path().join(cache),
        remote_cache: Some(RemoteOptions {
            url: url.clone(),
            read_only: false,
            timeout: RemoteOptions::DEFAULT_TIMEOUT,
            s3_credentials: None,
            signer: None,
            trusted_keys: Vec::new(),
        }),
        compress: false,
        tools: ToolPaths::default(),
        progress: false,
    };

    let cold = timed(&options("cache"))?;
    let noop = timed(&options("cache"))?;
    let changed = work.path().join("kernels/m0.hip");
    let text = std::fs::read_to_string(&changed)?;
    std::fs::write(&changed, text + "\n// changed by cache_scale\n")?;
    let one = timed(&options("cache"))?;
    let warm = timed(&options("second-machine-cache"))?;

    let names: Vec<String> = targets.iter().map(ToString::to_string).collect();
    println!(
        "hkpack build of {modules} modules x {} targets ({}) = {} jobs on {cores} cores; remote {}",
        targets.len(),
        names.join(", "),
        cold.1.jobs,
        cold.1.remote.as_ref().map_or("-", |r| r.url.as_str()),
    );
    println!(
        "{:<36} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "build", "time (s)", "compiled", "local", "remote", "moved (MB)"
    );
    for (name, (time, report)) in [
        ("cold (empty caches)", &cold),
        ("no-op rebuild", &noop),
        ("one module changed", &one),
        ("empty local cache, warm remote", &warm),
    ] {
        let moved = report
            .remote
            .as_ref()
            .map_or(0, |r| r.bytes_read + r.bytes_written);
        println!(
            "{name:<36} {:>9.2} {:>9} {:>9} {:>9} {:>10.1}",
            time.as_secs_f64(),
            report.compiled,
            report.local_hits,
            report.remote_hits,
            moved as f64 / 1e6,
        );
        for warning in &report.warnings {
            println!("  warning: {warning}");
        }
    }
    println!(
        "no-op rebuild {:.2} s (target < 1 s); warm remote {:.1} % of cold (target <= 10 %)",
        noop.0.as_secs_f64(),
        100.0 * warm.0.as_secs_f64() / cold.0.as_secs_f64()
    );
    Ok(())
}

/// A package of `modules` one-kernel modules in `root/manifests` and `root/kernels`.
fn generate(root: &Path, modules: usize, targets: &[TargetId]) -> std::io::Result<()> {
    let manifests = root.join("manifests");
    let kernels = root.join("kernels");
    std::fs::create_dir_all(&manifests)?;
    std::fs::create_dir_all(kernels.join("include"))?;
    std::fs::write(kernels.join("include/scale.h"), HEADER)?;
    let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    std::fs::write(
        manifests.join("package.toml"),
        format!(
            "[package]\nname = \"scale\"\nversion = \"0.1.0\"\ntargets = [{}]\n\
             amd_code_object_version = 5\ninclude_dirs = [\"../kernels/include\"]\n",
            targets.join(", ")
        ),
    )?;
    for i in 0..modules {
        std::fs::write(
            kernels.join(format!("m{i}.hip")),
            format!(
                "#include \"scale.h\"\n\
                 KERNEL void k{i}(float* out, const float* x, float a, unsigned n) {{\n\
                     unsigned t = THREAD_X();\n\
                     if (t < n) out[t] = x[t] * a + {i}.0f;\n\
                 }}\n"
            ),
        )?;
        std::fs::write(
            manifests.join(format!("m{i}.toml")),
            format!(
                "[module]\nname = \"m{i}\"\nsource = \"../kernels/m{i}.hip\"\n\n\
                 [[kernel]]\nsymbol = \"k{i}\"\n\
                 args = [\"out: *mut f32\", \"x: *const f32\", \"a: f32\", \"n: u32\"]\n"
            ),
        )?;
    }
    Ok(())
}

fn timed(options: &BuildOptions) -> Result<(Duration, BuildReport), hkpack::Error> {
    let start = Instant::now();
    let report = hkpack::build(options)?;
    Ok((start.elapsed(), report))
}
