//! `hkpack build`: load the manifests, find the toolchain, run every (module, target) job in
//! parallel through the cache, check each result against its declared signatures, and write
//! the bundle.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hk_code_object::KernelFacts;
use hk_format::manifest::Toolchain as ToolchainRecord;
use hk_format::target::{EntryId, TargetId};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cache::{Cache, Identity, Level, Remote, RemoteOptions, RemoteReport};
use crate::error::{Error, JobError};
use crate::job::{Job, outputs, plan};
use crate::manifest::Package;
use crate::package::{self, BundleContents, TargetCode};
use crate::probe;
use crate::signature;
use crate::toolchain::{ToolPaths, Toolchain};

/// What to build and where.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The manifests folder (holding `package.toml`).
    pub manifests: PathBuf,
    /// Targets to build; the package's default targets when `None`.
    pub targets: Option<Vec<TargetId>>,
    /// Parallel jobs; at least 1.
    pub jobs: usize,
    /// Where bundle folders go (`dist/`).
    pub out_dir: PathBuf,
    pub cache_dir: PathBuf,
    /// A remote store shared by machines, behind the local cache.
    pub remote_cache: Option<RemoteOptions>,
    /// Write CCOB-compressed module files instead of plain bundles (the default, fastest to
    /// load: hkload maps a plain file and hands the driver the image in place).
    pub compress: bool,
    pub tools: ToolPaths,
    /// Show progress bars (still hidden when stdout is not a terminal).
    pub progress: bool,
}

/// What a build did, for the summary.
#[derive(Debug, Clone)]
pub struct BuildReport {
    pub bundle: PathBuf,
    pub bundle_bytes: u64,
    pub jobs: usize,
    pub compiled: usize,
    /// Jobs found in the local cache.
    pub local_hits: usize,
    /// Jobs read through from the remote cache.
    pub remote_hits: usize,
    /// What the remote cache did, when there is one.
    pub remote: Option<RemoteReport>,
    pub elapsed: Duration,
    /// NVIDIA targets shipped as PTX only because ptxas was not found.
    pub ptx_only: Vec<TargetId>,
    /// What the signature check allowed but found probably wrong, one sentence each.
    pub warnings: Vec<String>,
    pub modules: usize,
    pub targets: usize,
}

impl std::fmt::Display for BuildReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} job{}: {} compiled, {} cached",
            self.jobs,
            if self.jobs == 1 { "" } else { "s" },
            self.compiled,
            self.local_hits,
        )?;
        if self.remote.is_some() {
            write!(f, ", {} from the remote cache", self.remote_hits)?;
        }
        write!(
            f,
            ", {:.1} s; {} ({} modules x {} targets, {} KiB)",
            self.elapsed.as_secs_f64(),
            self.bundle.display(),
            self.modules,
            self.targets,
            self.bundle_bytes.div_ceil(1024),
        )?;
        if let Some(remote) = &self.remote {
            write!(
                f,
                "\nremote cache {}: {} written back{}, {} read, {} written",
                remote.url,
                remote.written_back,
                if remote.read_only { " (read-only)" } else { "" },
                bytes(remote.bytes_read),
                bytes(remote.bytes_written),
            )?;
            if remote.unavailable {
                write!(f, ", unavailable part of the way")?;
            }
        }
        if !self.ptx_only.is_empty() {
            let targets: Vec<String> = self.ptx_only.iter().map(ToString::to_string).collect();
            write!(
                f,
                "\nnote: ptxas not found, so {} ship PTX only (compiled by the driver at load); install it with `pip install nvidia-cuda-nvcc==13.0.88` or point --ptxas at one",
                targets.join(", ")
            )?;
        }
        Ok(())
    }
}

impl BuildReport {
    /// The report for machines (`hkpack build --json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "bundle": self.bundle,
            "bundle_bytes": self.bundle_bytes,
            "modules": self.modules,
            "targets": self.targets,
            "jobs": self.jobs,
            "compiled": self.compiled,
            "local_hits": self.local_hits,
            "remote_hits": self.remote_hits,
            "remote": self.remote,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "ptx_only": self.ptx_only.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "warnings": self.warnings,
        })
    }
}

/// `12.3 KiB`: a byte count as people read it.
fn bytes(count: u64) -> String {
    match count {
        0..1024 => format!("{count} B"),
        1024..1_048_576 => format!("{:.1} KiB", count as f64 / 1024.0),
        _ => format!("{:.1} MiB", count as f64 / 1_048_576.0),
    }
}

/// One finished job.
struct JobOutput {
    code: TargetCode,
    /// Where its outputs came from; `None` when it was compiled.
    hit: Option<Level>,
    warnings: Vec<String>,
}

pub fn build(options: &BuildOptions) -> Result<BuildReport, Error> {
    let started = Instant::now();
    let package = Package::load(&options.manifests)?;
    let targets = options
        .targets
        .clone()
        .unwrap_or_else(|| package.targets.clone());
    package.check_code_object_versions(&targets)?;
    hk_format::target::check_composition(&targets)?;
    let toolchain = Toolchain::discover(&options.tools)?;
    toolchain.check_targets(&targets)?;
    let remote = options
        .remote_cache
        .as_ref()
        .map(Remote::open)
        .transpose()?;
    let cache = Cache::with_remote(&options.cache_dir, remote)?;
    let left_out = modules_without_targets(&package, &targets)?;
    let jobs = plan(&package, &targets);

    let bar = progress_bar(options.progress, jobs.len() as u64);
    let results = run_all(&jobs, options.jobs, &bar, |job| {
        run_job(job, &package, &toolchain, &cache)
    });
    bar.finish_and_clear();

    let mut failures = Vec::new();
    let mut outputs = Vec::with_capacity(jobs.len());
    for (job, result) in jobs.iter().zip(results) {
        match result {
            Ok(output) => outputs.push(output),
            Err(detail) => failures.push(JobError {
                job: job.name(),
                detail,
            }),
        }
    }
    if !failures.is_empty() {
        return Err(Error::Jobs(failures));
    }

    let count = |hit| outputs.iter().filter(|o| o.hit == hit).count();
    let (compiled, local_hits, remote_hits) = (
        count(None),
        count(Some(Level::Local)),
        count(Some(Level::Remote)),
    );
    let (remote, mut warnings) = match cache.remote_report() {
        Some((report, warnings)) => (Some(report), warnings),
        None => (None, Vec::new()),
    };
    warnings.extend(left_out);
    warnings.extend(outputs.iter().flat_map(|o| o.warnings.clone()));
    let mut per_module: Vec<_> = package
        .modules
        .iter()
        .filter(|m| targets.iter().any(|t| m.builds_for(t)))
        .map(|m| (m, Vec::new()))
        .collect();
    for (job, output) in jobs.iter().zip(outputs) {
        if let Some((_, code)) = per_module
            .iter_mut()
            .find(|(m, _)| std::ptr::eq(*m, job.module))
        {
            code.push(output.code);
        }
    }
    let modules = per_module.len();
    let contents = BundleContents {
        package: &package,
        toolchain: ToolchainRecord {
            clang: toolchain.clang_version.clone(),
            ptxas: toolchain.ptxas.as_ref().map(|(_, version)| version.clone()),
            amd_code_object_version: package.code_object_version,
        },
        provenance: crate::provenance::of(&package.dir),
        targets: targets.clone(),
        modules: per_module,
        compress: options.compress,
    };
    let (bundle, bundle_bytes) = package::write(&contents, &options.out_dir, &cache)?;
    // After writing: the local entries found bad include those of the compressed modules.
    warnings.extend(cache.warnings());
    let ptx_only = match toolchain.ptxas {
        Some(_) => Vec::new(),
        None => targets
            .iter()
            .filter(|t| matches!(t, TargetId::Nvidia(_)))
            .copied()
            .collect(),
    };
    Ok(BuildReport {
        bundle,
        bundle_bytes,
        jobs: jobs.len(),
        compiled,
        local_hits,
        remote_hits,
        remote,
        elapsed: started.elapsed(),
        ptx_only,
        warnings,
        modules,
        targets: targets.len(),
    })
}

/// A module that is built for no target of the build (`--arch gfx942` and an FP8 module for
/// OCP targets, say, or `--arch sm_90a` and a module without sm_90a code) has no code in it:
/// it is left out of the bundle, with a warning naming its reasons. A build of which every
/// module is left out is an error: it would ship nothing.
fn modules_without_targets(package: &Package, targets: &[TargetId]) -> Result<Vec<String>, Error> {
    let mut warnings = Vec::new();
    for module in &package.modules {
        let reasons: Option<Vec<String>> = targets
            .iter()
            .map(|t| Some(format!("{t}: {}", module.not_built_reason(t)?)))
            .collect();
        if let Some(reasons) = reasons {
            warnings.push(format!(
                "module `{}` is left out of the bundle: it skips every target of this build ({})",
                module.name,
                reasons.join("; ")
            ));
        }
    }
    if warnings.len() == package.modules.len() {
        let (line, column) = package.modules.first().map_or((1, 1), |m| m.name_at);
        let names: Vec<String> = targets.iter().map(ToString::to_string).collect();
        return Err(crate::manifest::ManifestError {
            path: package
                .modules
                .first()
                .map_or_else(|| package.dir.clone(), |m| m.manifest.clone()),
            line,
            column,
            message: format!(
                "every module skips every target of this build ({}); build at least one target they support (`--arch`)",
                names.join(", ")
            ),
        }
        .into());
    }
    Ok(warnings)
}

fn progress_bar(wanted: bool, len: u64) -> ProgressBar {
    if !wanted || !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stdout());
    if let Ok(style) = ProgressStyle::with_template("{prefix:>9} [{bar:30}] {pos}/{len} {wide_msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix("Compiling");
    bar
}

/// Runs `work` over `jobs` on `workers` threads, results in job order.
fn run_all<T: Send>(
    jobs: &[Job<'_>],
    workers: usize,
    bar: &ProgressBar,
    work: impl Fn(&Job<'_>) -> T + Sync,
) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<T>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    bar.set_message(job.name());
                    let result = work(job);
                    *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                    bar.inc(1);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every job index below the job count is taken by exactly one worker")
        })
        .collect()
}

/// Builds one job (or takes it from the cache) and reads and checks its kernels.
fn run_job(
    job: &Job<'_>,
    package: &Package,
    toolchain: &Toolchain,
    cache: &Cache,
) -> Result<JobOutput, String> {
    let identity = job_identity(job, package, toolchain);
    // A hit is checked as a compiled job's outputs are; one that fails is a miss (the cache
    // warns), so only a compiled job's failure fails the build.
    let check = |dir: &Path| read_outputs(job, package, dir);
    if let Some(((code, warnings), level)) = cache.lookup(&identity, &package.dir, check) {
        return Ok(JobOutput {
            code,
            hit: Some(level),
            warnings,
        });
    }
    let scratch = cache.scratch().map_err(|e| e.to_string())?;
    job.run(package, toolchain, scratch.path())
        .map_err(|e| format!("{} failed ({})\n{}", e.command, e.status, e.diagnostics))?;
    let depfile = scratch.path().join(outputs::DEPS);
    let dir = cache
        .store(&identity, &package.dir, scratch, &depfile)
        .map_err(|e| e.to_string())?;
    let (code, warnings) = read_outputs(job, package, &dir)?;
    Ok(JobOutput {
        code,
        hit: None,
        warnings,
    })
}

/// Everything that decides a job's outputs besides the files it reads.
fn job_identity(job: &Job<'_>, package: &Package, toolchain: &Toolchain) -> Identity {
    let mut parts = vec![toolchain.clang_version.clone(), job.target.to_string()];
    parts.extend(job.clang_args(package));
    if let (true, Some((_, ptxas))) = (job.is_nvidia(), &toolchain.ptxas) {
        parts.push(ptxas.clone());
        parts.extend(job.ptxas_args());
    }
    Identity::new(parts)
}

/// The code images and checked kernel facts of a finished job's output folder, and the
/// signature check's warnings.
fn read_outputs(
    job: &Job<'_>,
    package: &Package,
    dir: &Path,
) -> Result<(TargetCode, Vec<String>), String> {
    let read = |name: &str| {
        std::fs::read(dir.join(name)).map_err(|e| format!("cannot read {name} from the cache: {e}"))
    };
    let (images, facts) = match job.target {
        TargetId::Amd(amd) => {
            let bytes = read(outputs::CODE_OBJECT)?;
            let facts = amd_facts(job, package, &bytes)?;
            (vec![(EntryId::AmdCodeObject(amd), bytes)], facts)
        }
        TargetId::Nvidia(arch) => {
            let ptx = read(outputs::PTX)?;
            let text = String::from_utf8(ptx.clone())
                .map_err(|_| "clang wrote PTX that is not UTF-8".to_owned())?;
            let mut facts = hk_code_object::read_ptx_entries(&text).map_err(|e| e.to_string())?;
            let mut images = Vec::new();
            if dir.join(outputs::CUBIN).is_file() {
                let report = String::from_utf8_lossy(&read(outputs::PTXAS_REPORT)?).into_owned();
                hk_code_object::apply_ptxas_report(&mut facts, &report)
                    .map_err(|e| e.to_string())?;
                images.push((EntryId::Cubin(arch), read(outputs::CUBIN)?));
            }
            images.push((EntryId::Ptx(arch), ptx));
            (images, facts)
        }
    };
    let printed = String::from_utf8_lossy(&read(outputs::SIGNATURES)?).into_owned();
    let sources = probe::parse(&printed)?;
    let checked =
        signature::check(job.module, &job.target, facts, &sources).map_err(|e| e.to_string())?;
    let code = TargetCode {
        target: job.target,
        images,
        kernels: checked.kernels,
    };
    Ok((code, checked.warnings))
}

/// Reads an AMD code object and checks that it is what the job asked for: built for the
/// job's target, with the package's code-object version.
fn amd_facts(job: &Job<'_>, package: &Package, bytes: &[u8]) -> Result<Vec<KernelFacts>, String> {
    let object = hk_code_object::read_amd_code_object(bytes).map_err(|e| e.to_string())?;
    let built_for = TargetId::from_amd_e_flags(object.header.e_flags).map_err(|e| e.to_string())?;
    if built_for != job.target {
        return Err(format!(
            "the code object says it is for {built_for} (e_flags {:#x}), not {}",
            object.header.e_flags, job.target
        ));
    }
    // EI_ABIVERSION is the code-object version minus 2 (v4 = 2, v5 = 3, v6 = 4).
    let version = u32::from(object.header.abi_version) + 2;
    let wanted = package.code_object_version_for(&job.target);
    if version != wanted {
        return Err(format!(
            "the code object is version {version}, the package asks for {wanted}"
        ));
    }
    Ok(object.kernels)
}
