//! The GPU parity suite: every kernel of a bundle, run through hkload on CUDA device 0 and
//! compared with the f64 references of [`hk_tests::kernels`] on fresh random inputs.
//!
//! ```text
//! gpu_parity <bundle folder> [--seed N] [--only PREFIX] [--exact-extents]
//! ```
//!
//! Prints the device, the code object chosen for each module, the seed (pass it back with
//! `--seed` to repeat a run), one line per kernel (cases passed, worst error as a fraction of
//! the tolerance) with a line per failed case, and last `N passed, M failed`, counting cases
//! and every kernel of the bundle that has no case. `--only` runs the kernels whose symbols
//! start with PREFIX alone (for a slow instrument such as `compute-sanitizer`).
//! `--exact-extents` allocates every buffer at exactly the extent the kernel's contract gives
//! for its case, with no room around it: under `compute-sanitizer --tool memcheck` (which
//! checks each access against its allocation's exact size) a pass proves that the contracts'
//! extents cover everything the kernels touch. Exits with 1
//! when anything failed, 2 when the suite could not start.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use hk_tests::case::Case;
use hk_tests::kernels::cases_of;
use hkload::driver::{CudaDriver, StreamHandle};
use hkload::select::Outcome;
use hkload::{Bundle, Device, LoadedBundle};
use rand::SeedableRng;
use rand::rngs::StdRng;

use hk_tests::device_case::{CaseBuffers, Sizing, run_case};

const USAGE: &str =
    "usage: gpu_parity <bundle folder> [--seed N] [--only PREFIX] [--exact-extents]";

/// Failed cases shown per kernel; the rest are counted.
const SHOWN_FAILURES: usize = 3;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("gpu_parity: {error}");
            ExitCode::from(2)
        }
    }
}

struct Options {
    bundle: PathBuf,
    seed: Option<u64>,
    only: Option<String>,
    sizing: Sizing,
}

fn parse_args() -> Result<Options, String> {
    let mut bundle = None;
    let mut seed = None;
    let mut only = None;
    let mut sizing = Sizing::Case;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seed" => {
                let value = args
                    .next()
                    .ok_or(format!("--seed needs a value\n{USAGE}"))?;
                let value = value
                    .parse()
                    .map_err(|_| format!("--seed takes an unsigned integer, not `{value}`"))?;
                seed = Some(value);
            }
            "--only" => {
                only = Some(
                    args.next()
                        .ok_or(format!("--only needs a symbol prefix\n{USAGE}"))?,
                );
            }
            "--exact-extents" => sizing = Sizing::Exact,
            "-h" | "--help" => return Err(USAGE.into()),
            _ if bundle.is_none() && !arg.starts_with('-') => bundle = Some(PathBuf::from(arg)),
            _ => return Err(format!("unexpected argument `{arg}`\n{USAGE}")),
        }
    }
    Ok(Options {
        bundle: bundle.ok_or(USAGE)?,
        seed,
        only,
        sizing,
    })
}

/// Runs the suite; `Ok(false)` when something failed.
fn run() -> Result<bool, String> {
    let options = parse_args()?;
    let driver = CudaDriver::new().map_err(|e| e.to_string())?;
    let (major, minor) = driver.driver_version();
    let device = Device::new(Arc::new(driver), 0).map_err(|e| e.to_string())?;
    println!(
        "device 0: {} ({}), CUDA driver {major}.{minor}",
        device.info().name,
        device.target()
    );
    let bundle = Bundle::open(&options.bundle).map_err(|e| e.to_string())?;
    let manifest = bundle.manifest().map_err(|e| e.to_string())?;
    let package = &manifest.package;
    println!(
        "bundle {} ({} {})",
        options.bundle.display(),
        package.name,
        package.version
    );
    for choice in &bundle.explain(device.target()).modules {
        let chosen = choice
            .selection
            .verdicts()
            .iter()
            .find(|verdict| matches!(verdict.outcome(), Outcome::Chosen { .. }));
        match chosen {
            Some(verdict) => println!(
                "module {}: {} ({})",
                choice.module,
                verdict.entry(),
                verdict.reason()
            ),
            None => println!("module {}: no entry runs here", choice.module),
        }
    }
    let loaded = bundle.load(&device).map_err(|e| e.to_string())?;
    loaded.preload().map_err(|e| e.to_string())?;

    let seed = options.seed.unwrap_or_else(rand::random);
    println!("seed {seed} (repeat with --seed {seed})");
    if options.sizing == Sizing::Exact {
        println!("every buffer allocated at exactly its contract extent");
    }
    let selected = |symbol: &str| {
        options
            .only
            .as_deref()
            .is_none_or(|p| symbol.starts_with(p))
    };
    // Only the selected kernels' cases are made (their references cost seconds of CPU).
    let cases = cases_of(&mut StdRng::seed_from_u64(seed), selected);

    let mut passed = 0usize;
    let mut failed = 0usize;
    let mut without_case = Vec::new();
    for symbol in manifest.kernel_symbols().filter(|symbol| selected(symbol)) {
        let kernel_cases: Vec<&Case> = cases.iter().filter(|c| c.kernel == symbol).collect();
        if kernel_cases.is_empty() {
            without_case.push(symbol);
            continue;
        }
        // A kernel its module does not build for this device (the other FP8 format) has
        // nothing to run here; the line says why.
        if let Err(error @ hkload::Error::NotBuilt { .. }) = loaded.kernel(symbol) {
            println!("SKIP {symbol}: {error}");
            continue;
        }
        let report = run_kernel(&loaded, symbol, &kernel_cases, options.sizing);
        passed += report.passed;
        failed += report.failures.len();
        println!("{report}");
    }
    let known = |case: &&Case| manifest.module_of(&case.kernel).is_some();
    for case in cases.iter().filter(|case| !known(case)) {
        failed += 1;
        println!(
            "FAIL {}: the case {} names a kernel the bundle does not have",
            case.kernel, case.label
        );
    }
    if !without_case.is_empty() {
        failed += without_case.len();
        println!(
            "FAIL {} kernel(s) of the bundle have no case: {}",
            without_case.len(),
            without_case.join(", ")
        );
    }
    if options.only.is_none() {
        match shared_memory_past_the_default(&device, &loaded, &cases) {
            Ok(()) => {
                passed += 1;
                println!("PASS {OPT_IN} (a softmax case, still right)");
            }
            Err(error) => {
                failed += 1;
                println!("FAIL {OPT_IN}: {error}");
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(failed == 0)
}

const OPT_IN: &str = "96 KiB of dynamic shared memory, past CUDA's 48 KiB default";

/// A launch with more dynamic shared memory than a CUDA kernel gets without opting in, which
/// the driver must unlock for the kernel: a softmax case with its contract's shape and 96 KiB
/// it does not use, judged as usual.
fn shared_memory_past_the_default(
    device: &Device,
    loaded: &LoadedBundle,
    cases: &[Case],
) -> Result<(), String> {
    let case = cases
        .iter()
        .find(|case| case.kernel == "softmax_f32")
        .ok_or("no softmax_f32 case")?;
    let kernel = loaded.kernel(&case.kernel).map_err(|e| e.to_string())?;
    let buffers = CaseBuffers::upload(device, case).map_err(|e| e.to_string())?;
    let args = buffers.args();
    let mut dims = kernel.launch_shape(&args).map_err(|e| e.to_string())?;
    dims.shared_bytes = 96 * 1024;
    // SAFETY: the contract's own shape; the kernel never touches dynamic shared memory.
    unsafe { kernel.launch(&dims, StreamHandle::DEFAULT, &args) }.map_err(|e| e.to_string())?;
    device.synchronize().map_err(|e| e.to_string())?;
    let outputs = buffers.outputs().map_err(|e| e.to_string())?;
    case.check(&outputs)
        .map_err(|mismatch| mismatch.to_string())
}

/// The outcome of every case of one kernel.
struct KernelReport<'a> {
    kernel: &'a str,
    cases: usize,
    passed: usize,
    /// The largest error of any close-to-reference output, as a fraction of its tolerance;
    /// `None` when the kernel's outputs are all compared exactly.
    worst: Option<f64>,
    /// `(case label, what went wrong)`.
    failures: Vec<(String, String)>,
}

impl std::fmt::Display for KernelReport<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = if self.failures.is_empty() {
            "PASS"
        } else {
            "FAIL"
        };
        let passed = format!("{}/{}", self.passed, self.cases);
        write!(f, "{verdict} {:<28} {passed:>7} cases", self.kernel)?;
        match self.worst {
            Some(worst) => write!(f, "  worst error {worst:.3} of tolerance")?,
            None => write!(f, "  exact")?,
        }
        for (label, failure) in self.failures.iter().take(SHOWN_FAILURES) {
            write!(f, "\n     {label}: {failure}")?;
        }
        if let Some(more) = self
            .failures
            .len()
            .checked_sub(SHOWN_FAILURES)
            .filter(|&n| n > 0)
        {
            write!(f, "\n     ... and {more} more failed case(s)")?;
        }
        Ok(())
    }
}

fn run_kernel<'a>(
    loaded: &LoadedBundle,
    symbol: &'a str,
    cases: &[&Case],
    sizing: Sizing,
) -> KernelReport<'a> {
    let mut report = KernelReport {
        kernel: symbol,
        cases: cases.len(),
        passed: 0,
        worst: None,
        failures: Vec::new(),
    };
    let kernel = match loaded.kernel(symbol) {
        Ok(kernel) => kernel,
        Err(error) => {
            let error = error.to_string();
            for case in cases {
                report.failures.push((case.label.clone(), error.clone()));
            }
            return report;
        }
    };
    for case in cases {
        match run_case(loaded.device(), &kernel, case, sizing) {
            Ok(judged) => {
                if let Some(worst) = judged.worst {
                    report.worst = Some(report.worst.map_or(worst, |w| w.max(worst)));
                }
                match judged.verdict {
                    Ok(()) => report.passed += 1,
                    Err(mismatch) => report
                        .failures
                        .push((case.label.clone(), mismatch.to_string())),
                }
            }
            Err(error) => report
                .failures
                .push((case.label.clone(), error.to_string())),
        }
    }
    report
}
