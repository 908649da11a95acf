//! Build benchmark: times a cold full build, a no-op rebuild and a one-module rebuild of the
//! repository's kernels, and compares bundle sizes compressed and plain. Prints tables.
//!
//! ```text
//! cargo run --release -p hk-bench --bin build_bench [-- REPEATS]
//! ```
//!
//! Each run works on a private copy of `manifests/` and `kernels/` with an empty cache, so the
//! repository's own cache and `dist/` are untouched. Times are medians over REPEATS runs
//! (default 3).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hkpack::toolchain::ToolPaths;
use hkpack::{BuildOptions, BuildReport};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let repeats: usize = std::env::args().nth(1).map_or(Ok(3), |a| a.parse())?;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("no workspace")?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    let mut cold = Vec::new();
    let mut noop = Vec::new();
    let mut one = Vec::new();
    let mut last = None;
    for _ in 0..repeats {
        let work = tempfile::tempdir()?;
        copy_tree(&repo.join("manifests"), &work.path().join("manifests"))?;
        copy_tree(&repo.join("kernels"), &work.path().join("kernels"))?;
        let compressed = options(work.path(), cores, true);

        let (t, report) = timed(&compressed)?;
        cold.push((t, report.compiled));
        let (t, report) = timed(&compressed)?;
        noop.push((t, report.compiled));
        let source = work.path().join("kernels/rmsnorm.hip");
        let text = std::fs::read_to_string(&source)?;
        std::fs::write(&source, text + "\n// touched by build_bench\n")?;
        let (t, report) = timed(&compressed)?;
        one.push((t, report.compiled));

        let plain = options(work.path(), cores, false);
        hkpack::build(&plain)?;
        last = Some((work, compressed, plain));
    }

    println!("hkpack build on {cores} cores, median of {repeats} runs");
    println!("{:<22} {:>10} {:>10}", "build", "time (s)", "compiled");
    for (name, runs) in [
        ("cold, empty cache", &mut cold),
        ("no-op rebuild", &mut noop),
        ("one module touched", &mut one),
    ] {
        runs.sort();
        let (time, compiled) = runs[runs.len() / 2];
        println!("{name:<22} {:>10.3} {compiled:>10}", time.as_secs_f64());
    }

    let (_work, compressed, plain) = last.ok_or("no run")?;
    let bundle = |o: &BuildOptions| o.out_dir.join("hk-kernels-0.1.0");
    println!();
    println!(
        "{:<26} {:>12} {:>12} {:>7}",
        "file", "plain (B)", "zstd (B)", "ratio"
    );
    let (mut total_plain, mut total_zstd) = (0, 0);
    let mut names: Vec<_> = std::fs::read_dir(bundle(&plain))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    for name in names {
        let p = std::fs::metadata(bundle(&plain).join(&name))?.len();
        let z = std::fs::metadata(bundle(&compressed).join(&name))?.len();
        total_plain += p;
        total_zstd += z;
        println!(
            "{name:<26} {p:>12} {z:>12} {:>6.1}%",
            100.0 * z as f64 / p as f64
        );
    }
    println!(
        "{:<26} {total_plain:>12} {total_zstd:>12} {:>6.1}%",
        "total",
        100.0 * total_zstd as f64 / total_plain as f64
    );
    Ok(())
}

fn options(root: &Path, jobs: usize, compress: bool) -> BuildOptions {
    BuildOptions {
        manifests: root.join("manifests"),
        targets: None,
        jobs,
        out_dir: root.join(if compress { "dist" } else { "dist-plain" }),
        cache_dir: root.join("cache"),
        remote_cache: None,
        compress,
        tools: ToolPaths::default(),
        progress: false,
    }
}

fn timed(options: &BuildOptions) -> Result<(Duration, BuildReport), hkpack::Error> {
    let start = Instant::now();
    let report = hkpack::build(options)?;
    Ok((start.elapsed(), report))
}

fn copy_tree(from: &Path, to: &PathBuf) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &dest)?;
        } else {
            std::fs::copy(entry.path(), dest)?;
        }
    }
    Ok(())
}
