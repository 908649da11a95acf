//! Proof that the contracts' extents cover everything the AMD code touches. Every kernel of the
//! repository's bundle runs on tinygrad's CDNA emulator for gfx90a, gfx942 and gfx950
//! (`tests/emu/extents_emu.py`), on two of its parity cases (the smallest that launches, and the
//! largest of at most 64 KiB), with every buffer exactly as long as its contract's extent for
//! that call and nothing around it. The emulator records
//! each address that a global, flat, buffer or scalar memory instruction of an active lane
//! touches, and each must lie inside one of the call's buffers (or the kernel's own arguments,
//! dispatch packet and code). A manifest whose output extent is one row short must be caught
//! the same way.
//!
//! The launches are hkload's own: the case's call on a simulated device of each target (the
//! recording driver) gives the packed arguments, the launch shape and the code object hkload
//! chose; the script adds only what the HIP runtime would (the hidden arguments, the dispatch
//! packet). The emulator is a test instrument with known faults (/work/shared/amd-emulator.md):
//! those met here are corrected or stood in for (the script's `Recorder` says how, and each job
//! line says what it relied on); any other instruction it cannot run fails the job with the
//! emulator's words, never passes. On this machine: 707 jobs in about 12 minutes.
//!
//! Without `HK_TINYGRAD` (a tinygrad source tree) the test says it skipped and passes.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::*;
use hk_tests::case::{Case, CaseArg};
use hk_tests::device_case::{CaseBuffers, Sizing, launch_case};
use hk_tests::kernels::cases_of;
use hkload::driver::{LaunchDims, Recorded, RecordingDriver};
use hkload::{Arg, Bundle, Device, Kernel};
use rand::SeedableRng;
use rand::rngs::StdRng;

const TARGETS: [&str; 3] = [
    "gfx90a:sramecc+:xnack-",
    "gfx942:sramecc+:xnack-",
    "gfx950:sramecc+:xnack-",
];

/// Buffer bytes of the larger case each kernel runs: the emulator runs every workgroup, one after
/// another, on the CPU (a GEMM of 800 KB takes about 10 s).
const LARGER_CASE_BYTES: usize = 64 * 1024;

/// The cases of `kernel`, those with the fewest buffer bytes first.
fn cases_by_size<'a>(cases: &'a [Case], kernel: &str) -> Vec<&'a Case> {
    let mut of_kernel: Vec<&Case> = cases.iter().filter(|case| case.kernel == kernel).collect();
    of_kernel.sort_by_key(|case| byte_len(case));
    of_kernel
}

fn byte_len(case: &Case) -> usize {
    case.args
        .iter()
        .map(|arg| match arg {
            CaseArg::Input { elem, data, .. } | CaseArg::InOut { elem, data, .. } => {
                data.len() * elem.size() as usize
            }
            CaseArg::Output { elem, len, .. } => len * elem.size() as usize,
            CaseArg::Scalar(_) => 0,
        })
        .sum()
}

/// One case's call as hkload makes it: its buffers at exact extents, the launch shape and the
/// packed arguments; `None` when the call launches nothing (an empty grid).
fn launch(
    driver: &RecordingDriver,
    device: &Device,
    kernel: &Kernel,
    case: &Case,
) -> Option<(CaseBuffers, LaunchDims, Vec<u8>)> {
    let label = |e: hkload::Error| format!("{} ({}): {e}", case.kernel, case.label);
    let buffers = CaseBuffers::upload_sized(device, kernel, case, Sizing::Exact)
        .unwrap_or_else(|e| panic!("{}", label(e)));
    let seen = driver.log().len();
    launch_case(kernel, case, &buffers.args()).unwrap_or_else(|e| panic!("{}", label(e)));
    let launched = driver.log()[seen..].iter().find_map(|record| match record {
        Recorded::Launch { dims, args, .. } => Some((*dims, args.clone())),
        _ => None,
    });
    launched.map(|(dims, kernarg)| (buffers, dims, kernarg))
}

/// What [`write_jobs`] wrote.
struct Jobs {
    /// Jobs written: two per kernel and target where the kernel has a second case small
    /// enough, else one.
    jobs: usize,
    /// `(kernel, target)` pairs with a job.
    kernels: usize,
    /// The kernels not built for a target (the other FP8 format), with hkload's reason.
    not_built: Vec<String>,
}

/// Writes the emulator's jobs for every kernel of `bundle` and AMD target into `dir`
/// (`jobs.json`, the code objects and the buffers' initial bytes): each kernel's smallest case
/// that launches something, and its largest case up to [`LARGER_CASE_BYTES`].
fn write_jobs(bundle: &Path, cases: &[Case], dir: &Path) -> Jobs {
    let bundle = Bundle::open(bundle).unwrap();
    let manifest = bundle.manifest().unwrap();
    let mut jobs = Vec::new();
    let mut written = Jobs {
        jobs: 0,
        kernels: 0,
        not_built: Vec::new(),
    };
    for target in TARGETS {
        let driver = Arc::new(RecordingDriver::new([target.parse().unwrap()]));
        let device = Device::new(driver.clone(), 0).unwrap();
        let loaded = bundle.load(&device).unwrap();
        let arch = target.split(':').next().unwrap();
        let mut images: HashMap<String, PathBuf> = HashMap::new();
        for symbol in manifest.kernel_symbols() {
            let module = &manifest.module_of(symbol).unwrap().name;
            let seen = driver.log().len();
            let kernel = match loaded.kernel(symbol) {
                Ok(kernel) => kernel,
                Err(error @ hkload::Error::NotBuilt { .. }) => {
                    written
                        .not_built
                        .push(format!("{symbol} on {arch}: {error}"));
                    continue;
                }
                Err(error) => panic!("{symbol} on {arch}: {error}"),
            };
            for record in &driver.log()[seen..] {
                if let Recorded::Load { image, .. } = record {
                    let path = dir.join(format!("{module}.{arch}.co"));
                    std::fs::write(&path, image).unwrap();
                    images.insert(module.clone(), path);
                }
            }
            let by_size = cases_by_size(cases, symbol);
            let smallest = by_size
                .iter()
                .find_map(|case| Some((*case, launch(&driver, &device, &kernel, case)?)))
                .unwrap_or_else(|| panic!("{symbol}: no parity case launches anything"));
            let larger = by_size
                .iter()
                .rev()
                .filter(|case| byte_len(case) <= LARGER_CASE_BYTES)
                .take_while(|case| !std::ptr::eq(**case, smallest.0))
                .find_map(|case| Some((*case, launch(&driver, &device, &kernel, case)?)));
            written.kernels += 1;
            for (case, (buffers, dims, kernarg)) in std::iter::once(smallest).chain(larger) {
                let params = &bundle.kernel_record(symbol).unwrap().args;
                let offsets = &kernel.abi().arg_offsets;
                let mut described = Vec::new();
                for (index, arg) in buffers.args().iter().enumerate() {
                    let (buffer, writable) = match arg {
                        Arg::Buffer(buffer) => (buffer, false),
                        Arg::BufferMut(buffer) => (buffer, true),
                        _ => continue,
                    };
                    let data = dir.join(format!("{}.{index}.bin", jobs.len()));
                    std::fs::write(&data, buffer.to_bytes().unwrap()).unwrap();
                    described.push(serde_json::json!({
                        "name": params[index].name,
                        "offset": offsets[index],
                        "bytes": buffer.len() * buffer.elem().size() as usize,
                        "data": data,
                        "writable": writable,
                    }));
                }
                jobs.push(serde_json::json!({
                    "target": arch,
                    "kernel": symbol,
                    "case": case.label,
                    "code_object": images[module],
                    "grid": dims.grid,
                    "block": dims.block,
                    "shared": dims.shared_bytes,
                    "kernarg": kernarg,
                    "buffers": described,
                }));
            }
        }
    }
    written.jobs = jobs.len();
    std::fs::write(
        dir.join("jobs.json"),
        serde_json::to_vec(&serde_json::json!({ "jobs": jobs })).unwrap(),
    )
    .unwrap();
    written
}

/// Runs the emulator over the jobs in `dir`: `(exit status, stdout)`.
fn emulate(tree: &std::ffi::OsStr, dir: &Path) -> (bool, String) {
    let output = Command::new(python())
        .arg(repo().join("tests/emu/extents_emu.py"))
        .arg(dir.join("jobs.json"))
        .env("HK_TINYGRAD", tree)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    (output.status.success(), stdout)
}

fn tinygrad() -> Option<std::ffi::OsString> {
    let tree = std::env::var_os("HK_TINYGRAD");
    if tree.is_none() {
        eprintln!("skipped: set HK_TINYGRAD to a tinygrad source tree to run the CDNA emulator");
    }
    tree
}

/// The cases of the kernels `wanted` accepts, from a fresh seed.
fn fresh_cases(wanted: impl Fn(&str) -> bool) -> Vec<Case> {
    let seed = rand::random();
    eprintln!("cases drawn with seed {seed}");
    cases_of(&mut StdRng::seed_from_u64(seed), wanted)
}

#[test]
fn every_amd_kernel_touches_only_its_contract_extents() {
    let Some(tree) = tinygrad() else {
        return;
    };
    let (_, bundle) = repo_bundles();
    let cases = fresh_cases(|_| true);
    // Kept after the run (replaced by the next), to run the script again by hand.
    let jobs = Path::new(env!("CARGO_TARGET_TMPDIR")).join("extents-amd-jobs");
    let _ = std::fs::remove_dir_all(&jobs);
    std::fs::create_dir_all(&jobs).unwrap();
    let written = write_jobs(bundle, &cases, &jobs);
    eprintln!(
        "{} jobs for {} kernels x targets; not built for their target: {}",
        written.jobs,
        written.kernels,
        written.not_built.join("; ")
    );
    let kernels = Bundle::open(bundle)
        .unwrap()
        .kernel_records()
        .unwrap()
        .len();
    assert_eq!(
        written.kernels + written.not_built.len(),
        kernels * TARGETS.len()
    );
    let (ok, stdout) = emulate(&tree, &jobs);
    assert!(
        ok,
        "extents_emu.py found accesses outside the extents, or failed"
    );
    assert!(
        stdout.contains(&format!("{} jobs checked", written.jobs)),
        "every job must be checked"
    );
}

/// rmsnorm's bf16 kernels with their output's extent one row short (`(rows - 1) * cols`): each
/// writes the last row past the buffer, and the check must say so on every target.
#[test]
fn an_extent_one_row_short_is_caught_on_the_emulator() {
    let Some(tree) = tinygrad() else {
        return;
    };
    let manifest = std::fs::read_to_string(repo().join("manifests/rmsnorm.toml")).unwrap();
    let honest = "\"out: *mut bf16 [rows * cols]\"";
    assert!(manifest.contains(honest));
    let short = manifest.replace(honest, "\"out: *mut bf16 [(rows - 1) * cols]\"");
    let scratch = tempfile::tempdir().unwrap();
    let targets: Vec<&str> = TARGETS
        .iter()
        .map(|t| t.split(':').next().unwrap())
        .collect();
    let bundle = build_repo_package(scratch.path(), &[("rmsnorm.toml", short)], &targets);
    let cases = fresh_cases(|kernel| kernel.contains("rmsnorm"));
    let jobs = scratch.path().join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    write_jobs(&bundle, &cases, &jobs);
    let (ok, stdout) = emulate(&tree, &jobs);
    assert!(!ok, "an extent one row short passed");
    for target in &targets {
        assert!(
            stdout.contains(&format!("OUTSIDE {target} rmsnorm_bf16")),
            "{target}: the short extent was not caught"
        );
    }
}
