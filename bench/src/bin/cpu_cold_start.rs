//! hkload's own share of a cold start, on the CPU, with no GPU: the phases `gpu_bench` times
//! (open the bundle, choose the code objects, load the module, first call), against the
//! recording driver, whose "load" copies the image as a driver reads it and whose launch
//! records the packed arguments. What remains is hkload's work: reading the index, choosing,
//! mapping and extracting the image, verifying it, checking and packing the arguments.
//!
//! ```text
//! cpu_cold_start <bundle folder> [--kernel NAME] [--target ID] [--reps N] [--only on|off]
//! ```
//!
//! Prints, for verification on and off, the median of each phase over `--reps` cold starts
//! (default 400; each opens the bundle afresh, so nothing is cached in hkload, while the page
//! cache is warm), and the time to hash the chosen image alone with BLAKE3 and SHA-256. With
//! `--only` one variant runs, for `valgrind --tool=callgrind`, whose instruction counts are
//! repeatable on a busy machine where times are not.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use hk_bench::timing::Stats;
use hk_format::manifest::{Blake3Digest, Sha256Digest};
use hk_format::target::TargetId;
use hk_tests::device_case::CaseBuffers;
use hk_tests::kernels::cases_of;
use hkload::driver::{RecordingDriver, StreamHandle};
use hkload::{Bundle, Device, OpenOptions};
use rand::SeedableRng;
use rand::rngs::StdRng;

const USAGE: &str = "usage: cpu_cold_start <bundle folder> [--kernel NAME] [--target ID] [--reps N] [--only on|off]";

const PHASES: [&str; 4] = [
    "open (index)",
    "choose code objects",
    "load module (map, extract, verify, copy)",
    "first call (checks, pack, record)",
];

struct Options {
    bundle: PathBuf,
    kernel: Option<String>,
    target: TargetId,
    reps: usize,
    /// `Some(verify)` to run one variant only.
    only: Option<bool>,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cpu_cold_start: {error}");
            ExitCode::FAILURE
        }
    }
}

fn parse_args() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mut options = Options {
        bundle: PathBuf::new(),
        kernel: None,
        target: "sm_90".parse().map_err(|e| format!("{e}"))?,
        reps: 400,
        only: None,
    };
    let mut bundle = None;
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--kernel" => options.kernel = Some(value("--kernel")?),
            "--target" => {
                options.target = value("--target")?.parse().map_err(|e| format!("{e}"))?
            }
            "--reps" => {
                options.reps = value("--reps")?
                    .parse()
                    .map_err(|_| format!("--reps needs a number\n{USAGE}"))?
            }
            "--only" => {
                options.only = Some(match value("--only")?.as_str() {
                    "on" => true,
                    "off" => false,
                    other => return Err(format!("--only takes on or off, not `{other}`")),
                })
            }
            _ if bundle.is_none() && !arg.starts_with('-') => bundle = Some(PathBuf::from(arg)),
            _ => return Err(format!("unexpected argument `{arg}`\n{USAGE}")),
        }
    }
    options.bundle = bundle.ok_or(USAGE)?;
    Ok(options)
}

fn run() -> Result<(), String> {
    let options = parse_args()?;
    let text = |e: hkload::Error| e.to_string();
    let driver = Arc::new(RecordingDriver::new([options.target]));
    let device = Device::new(driver, 0).map_err(text)?;
    let bundle = Bundle::open(&options.bundle).map_err(text)?;
    let wanted = |kernel: &str| match &options.kernel {
        Some(name) => kernel == name,
        None => bundle.table().find_kernel(kernel).is_some(),
    };
    let case = cases_of(&mut StdRng::seed_from_u64(0x5eed), wanted)
        .into_iter()
        .next()
        .ok_or("no test case for the kernel in this bundle")?;
    let buffers = CaseBuffers::upload(&device, &case).map_err(text)?;
    let args = buffers.args();
    let loaded = bundle.load(&device).map_err(text)?;
    let kernel = loaded.kernel(&case.kernel).map_err(text)?;
    let module = bundle
        .table()
        .find_kernel(&case.kernel)
        .and_then(|at| bundle.table().module(at.module))
        .ok_or("the kernel's module is not in the table")?;
    let entry = loaded
        .chosen_entry(module.name())
        .copied()
        .ok_or("no code object for the target")?;
    let size = module
        .entries()
        .find(|e| e.id == entry)
        .map_or(0, |e| e.size);
    println!(
        "kernel {} ({}); module {}; {} on {}: {size} bytes",
        case.kernel,
        case.label,
        module.name(),
        entry,
        options.target
    );
    drop((kernel, loaded, bundle));

    let variants: Vec<bool> = match options.only {
        Some(verify) => vec![verify],
        None => vec![true, false],
    };
    let mut samples: Vec<Vec<[f64; 4]>> = vec![Vec::with_capacity(options.reps); variants.len()];
    // Interleaved, so that drift on a busy machine hits both alike.
    for _ in 0..options.reps {
        for (verify, samples) in variants.iter().zip(&mut samples) {
            samples.push(cold_start(
                &options.bundle,
                &device,
                &case.kernel,
                &args,
                *verify,
            )?);
        }
    }
    for (verify, samples) in variants.iter().zip(&samples) {
        let totals: Vec<f64> = samples.iter().map(|s| s.iter().sum()).collect();
        let total = Stats::of(&totals);
        println!(
            "verify {}: {:.1} µs (p10 {:.1}, p90 {:.1})",
            if *verify { "on " } else { "off" },
            total.median * 1e6,
            total.p10 * 1e6,
            total.p90 * 1e6
        );
        for (phase, name) in PHASES.iter().enumerate() {
            let times: Vec<f64> = samples.iter().map(|s| s[phase]).collect();
            println!("  {name:<42} {:>8.1} µs", Stats::of(&times).median * 1e6);
        }
    }
    if options.only.is_none() {
        let image = extract(
            &options.bundle,
            module_file(&options.bundle, &case.kernel)?,
            &entry,
        )?;
        let time = |hash: &dyn Fn(&[u8])| {
            let times: Vec<f64> = (0..options.reps)
                .map(|_| {
                    let start = Instant::now();
                    hash(&image);
                    start.elapsed().as_secs_f64()
                })
                .collect();
            Stats::of(&times).median * 1e6
        };
        println!(
            "hashing the image alone: BLAKE3 {:.1} µs, SHA-256 {:.1} µs",
            time(&|bytes| {
                std::hint::black_box(Blake3Digest::of(bytes));
            }),
            time(&|bytes| {
                std::hint::black_box(Sha256Digest::of(bytes));
            })
        );
    }
    Ok(())
}

/// Seconds of each of [`PHASES`] in one cold start: open the bundle at `dir`, choose, load the
/// kernel's module, call it once. Never inlined: `--toggle-collect=cpu_cold_start::cold_start`
/// makes callgrind count it alone.
#[inline(never)]
fn cold_start(
    dir: &std::path::Path,
    device: &Device,
    kernel: &str,
    args: &[hkload::Arg<'_>],
    verify_hashes: bool,
) -> Result<[f64; 4], String> {
    let text = |e: hkload::Error| e.to_string();
    let options = OpenOptions {
        verify_hashes,
        ..OpenOptions::DEFAULT
    };
    let mut phases = [0.0; 4];
    let mut last = Instant::now();
    let mut lap = |phase: usize| {
        let now = Instant::now();
        phases[phase] = (now - last).as_secs_f64();
        last = now;
    };
    let bundle = Bundle::open_with(dir, options).map_err(text)?;
    lap(0);
    let loaded = bundle.load(device).map_err(text)?;
    lap(1);
    let kernel = loaded.kernel(kernel).map_err(text)?;
    lap(2);
    kernel.call(StreamHandle::DEFAULT, args).map_err(text)?;
    lap(3);
    // Unloaded and unmapped outside the timing, as in gpu_bench.
    drop((kernel, loaded, bundle));
    Ok(phases)
}

/// The file name of the module holding `kernel`.
fn module_file(dir: &std::path::Path, kernel: &str) -> Result<String, String> {
    let bundle = Bundle::open(dir).map_err(|e| e.to_string())?;
    let table = bundle.table();
    table
        .find_kernel(kernel)
        .and_then(|at| table.module(at.module))
        .map(|module| module.file().to_owned())
        .ok_or_else(|| format!("no kernel `{kernel}`"))
}

/// The code image `entry` of the module file `file` of the bundle at `dir`.
fn extract(
    dir: &std::path::Path,
    file: String,
    entry: &hk_format::target::EntryId,
) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(dir.join(&file)).map_err(|e| format!("{file}: {e}"))?;
    hk_format::offload::extract_entry(&bytes, &entry.to_string())
        .map(|image| image.into_owned())
        .map_err(|e| format!("{file}: {e}"))
}
