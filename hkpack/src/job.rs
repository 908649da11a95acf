//! Build jobs: one per (module, target), with the exact compiler command that produces the
//! module's code for that target, and running that command.
//!
//! AMD targets compile device code only and link it with lld into a bare code object:
//! `clang -x hip --cuda-device-only -nogpuinc -nogpulib --offload-arch=gfx942
//! -mcode-object-version=5 --no-gpu-bundle-output -c`. NVIDIA targets compile to PTX with the
//! same clang (`-x cuda -nocudainc -nocudalib --cuda-gpu-arch=sm_90 -c -S`), then ptxas makes
//! a cubin. Every job then runs the signature probe ([`crate::probe`]) over the kernels it
//! compiled.
//!
//! `-c` changes no output byte (a non-RDC HIP compile links its device code either way, and
//! `-S` outranks `-c`), but it is what makes a compile cacheable for a launcher such as
//! sccache, which passes through any command without `-c` as "not a compilation".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use hk_format::target::TargetId;

use crate::manifest::{Module, Package};
use crate::probe;
use crate::toolchain::Toolchain;

/// The PTX ISA version clang writes: 8.0 is the oldest that knows sm_90, and CUDA 12.0+
/// drivers can JIT it.
pub const PTX_FEATURE: &str = "+ptx80";

/// One module built for one target.
#[derive(Debug, Clone)]
pub struct Job<'p> {
    pub module: &'p Module,
    pub target: TargetId,
    /// Relative to the package's manifests folder, where the compiler runs.
    pub source: PathBuf,
    pub defines: BTreeMap<String, String>,
    pub flags: Vec<String>,
}

/// The files a job leaves in its output folder.
pub mod outputs {
    /// The AMD code object (linked ELF).
    pub const CODE_OBJECT: &str = "code.co";
    /// NVIDIA PTX text.
    pub const PTX: &str = "code.ptx";
    /// NVIDIA cubin, when ptxas ran.
    pub const CUBIN: &str = "code.cubin";
    /// ptxas's `-v` report (registers, spills, shared memory per kernel).
    pub const PTXAS_REPORT: &str = "ptxas.txt";
    /// The compiler's dependency file: the source and every header it included.
    pub const DEPS: &str = "deps.d";
    /// What the signature probe printed of the compiled kernels' parameter types.
    pub const SIGNATURES: &str = "signatures.txt";
}

/// The signature probe's source while it runs, in the job's output folder.
const PROBE: &str = "probe.hip";

/// Every job of a build, modules in manifest order, targets in the order requested, but for
/// the targets a module is not built for (those it skips, and the architecture-specific ones
/// it does not ask for: see [`Module::arch_specific`]).
pub fn plan<'p>(package: &'p Package, targets: &[TargetId]) -> Vec<Job<'p>> {
    let mut jobs = Vec::with_capacity(package.modules.len() * targets.len());
    for module in &package.modules {
        for target in targets {
            if !module.builds_for(target) {
                continue;
            }
            let mut job = Job {
                module,
                target: *target,
                source: module.source.clone(),
                defines: module.defines.clone(),
                flags: module.flags.clone(),
            };
            if let Some(over) = module.overrides.get(target) {
                if let Some(source) = &over.source {
                    job.source = source.clone();
                }
                job.defines.extend(over.defines.clone());
                job.flags.extend(over.flags.iter().cloned());
            }
            jobs.push(job);
        }
    }
    jobs
}

/// A job that failed, with what the tool said.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{job}: {command} failed ({status})\n{diagnostics}")]
pub struct JobFailure {
    pub job: String,
    pub command: String,
    pub status: String,
    pub diagnostics: String,
}

impl Job<'_> {
    /// `rmsnorm for gfx942`, for progress lines and errors.
    pub fn name(&self) -> String {
        format!("{} for {}", self.module.name, self.target)
    }

    pub fn is_nvidia(&self) -> bool {
        matches!(self.target, TargetId::Nvidia(_))
    }

    /// The clang arguments that decide the output, without output and dependency-file paths:
    /// everything here goes into the cache key.
    pub fn clang_args(&self, package: &Package) -> Vec<String> {
        let mut args = self.compile_args(package);
        args.push(self.source.display().to_string());
        args
    }

    /// [`Job::clang_args`] without the source: what the signature probe is compiled with too.
    fn compile_args(&self, package: &Package) -> Vec<String> {
        let mut args: Vec<String> = match &self.target {
            TargetId::Amd(_) => [
                "-x",
                "hip",
                "--cuda-device-only",
                "-nogpuinc",
                "-nogpulib",
                "--no-gpu-bundle-output",
                "-c",
            ]
            .map(String::from)
            .into_iter()
            .chain([
                format!("--offload-arch={}", self.target),
                format!(
                    "-mcode-object-version={}",
                    package.code_object_version_for(&self.target)
                ),
            ])
            .collect(),
            TargetId::Nvidia(_) => [
                "-x",
                "cuda",
                "--cuda-device-only",
                "-nocudainc",
                "-nocudalib",
                "-c",
                "-S",
            ]
            .map(String::from)
            .into_iter()
            .chain([
                format!("--cuda-gpu-arch={}", self.target),
                format!("--cuda-feature={PTX_FEATURE}"),
            ])
            .collect(),
        };
        // Without `-fuse-cuid=none` clang names a symbol after a hash of the source's absolute
        // path, and the same kernels built in two checkouts would differ.
        args.extend(["-std=c++17", "-O3", "-fuse-cuid=none"].map(String::from));
        for dir in &package.include_dirs {
            args.push(format!("-I{}", dir.display()));
        }
        for (name, value) in &self.defines {
            args.push(format!("-D{name}={value}"));
        }
        args.extend(self.flags.iter().cloned());
        args
    }

    /// The ptxas arguments that decide the cubin (NVIDIA jobs only).
    pub fn ptxas_args(&self) -> Vec<String> {
        vec![format!("-arch={}", self.target), "-O3".into(), "-v".into()]
    }

    /// Runs the compiler (and ptxas) with outputs in `out`, which must exist and be empty.
    pub fn run(
        &self,
        package: &Package,
        toolchain: &Toolchain,
        out: &Path,
    ) -> Result<(), JobFailure> {
        let main_output = out.join(if self.is_nvidia() {
            outputs::PTX
        } else {
            outputs::CODE_OBJECT
        });
        let mut clang = toolchain.command(&toolchain.clang);
        clang
            .current_dir(&package.dir)
            .args(self.clang_args(package))
            // The driver's -MD is ignored with --cuda-device-only; the front end's own
            // dependency-file option is not.
            .args(["-Xclang", "-dependency-file", "-Xclang"])
            .arg(out.join(outputs::DEPS))
            .args(["-Xclang", "-MT", "-Xclang", "code"])
            .arg("-o")
            .arg(&main_output);
        if !self.is_nvidia() {
            clang.arg(format!("--ld-path={}", toolchain.lld.display()));
        }
        self.run_tool(clang, "clang")?;

        if let (true, Some((ptxas, _))) = (self.is_nvidia(), &toolchain.ptxas) {
            let mut command = toolchain.command(ptxas);
            command
                .args(self.ptxas_args())
                .arg(&main_output)
                .arg("-o")
                .arg(out.join(outputs::CUBIN));
            let report = self.run_tool(command, "ptxas")?.stderr;
            self.write(&out.join(outputs::PTXAS_REPORT), report.as_bytes())?;
        }
        self.run_probe(package, toolchain, out, &main_output)
    }

    /// Runs the signature probe over the kernels compiled into `code` and keeps what clang
    /// printed of their types in [`outputs::SIGNATURES`]. Code that cannot be read is left
    /// for reading its outputs to report.
    fn run_probe(
        &self,
        package: &Package,
        toolchain: &Toolchain,
        out: &Path,
        code: &Path,
    ) -> Result<(), JobFailure> {
        let bytes = std::fs::read(code).map_err(|e| self.io_failure("reading its output", e))?;
        let kernels = if self.is_nvidia() {
            std::str::from_utf8(&bytes)
                .ok()
                .and_then(|ptx| hk_code_object::read_ptx_entries(ptx).ok())
        } else {
            hk_code_object::read_amd_code_object(&bytes)
                .ok()
                .map(|object| object.kernels)
        };
        let Some(kernels) = kernels else {
            return Ok(());
        };
        let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
        let probe = out.join(PROBE);
        let source = probe::source(&package.dir.join(&self.source), &names);
        self.write(&probe, source.as_bytes())?;
        let mut clang = toolchain.command(&toolchain.clang);
        clang
            .current_dir(&package.dir)
            .args(self.compile_args(package))
            .args([
                "-fsyntax-only",
                "-Xclang",
                "-fdump-record-layouts-canonical",
            ])
            .arg(&probe);
        let printed = self.run_tool(clang, "clang (signature probe)")?.stdout;
        let _ = std::fs::remove_file(&probe);
        let block = probe::extract(&printed).ok_or_else(|| JobFailure {
            job: self.name(),
            command: "clang (signature probe)".into(),
            status: "printed no kernel types".into(),
            diagnostics: printed.chars().take(2000).collect(),
        })?;
        self.write(&out.join(outputs::SIGNATURES), block.as_bytes())
    }

    fn write(&self, path: &Path, bytes: &[u8]) -> Result<(), JobFailure> {
        std::fs::write(path, bytes).map_err(|e| self.io_failure("writing its outputs", e))
    }

    fn io_failure(&self, doing: &str, error: std::io::Error) -> JobFailure {
        JobFailure {
            job: self.name(),
            command: doing.into(),
            status: "error".into(),
            diagnostics: error.to_string(),
        }
    }

    /// Runs `command`, returning what it printed (ptxas's report is on stderr, the probe's
    /// types on stdout) on success.
    fn run_tool(&self, mut command: Command, tool: &str) -> Result<Printed, JobFailure> {
        let failure = |status: String, diagnostics: String| JobFailure {
            job: self.name(),
            command: tool.to_owned(),
            status,
            diagnostics,
        };
        let output = command
            .output()
            .map_err(|e| failure("could not start".into(), e.to_string()))?;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if output.status.success() {
            Ok(Printed {
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr,
            })
        } else {
            Err(failure(
                output.status.to_string(),
                stderr.trim_end().to_owned(),
            ))
        }
    }
}

/// What a tool printed.
struct Printed {
    stdout: String,
    stderr: String,
}

/// The files a compiler's dependency file names, relative to where the compiler ran.
pub fn parse_depfile(text: &str) -> Vec<PathBuf> {
    let joined = text.replace("\\\n", " ");
    let Some((_, deps)) = joined.split_once(": ") else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    let mut current = String::new();
    let mut chars = deps.chars();
    while let Some(c) = chars.next() {
        match c {
            // Make syntax escapes spaces in file names as `\ `.
            '\\' => match chars.next() {
                Some(' ') => current.push(' '),
                Some(other) => {
                    current.push('\\');
                    current.push(other);
                }
                None => current.push('\\'),
            },
            c if c.is_whitespace() => {
                if !current.is_empty() {
                    paths.push(PathBuf::from(std::mem::take(&mut current)));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        paths.push(PathBuf::from(current));
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depfiles_with_continuations_and_escaped_spaces() {
        let text = "code: ../kernels/rms\\ norm.hip \\\n  ../kernels/include/hk/device.h\n";
        assert_eq!(
            parse_depfile(text),
            [
                PathBuf::from("../kernels/rms norm.hip"),
                PathBuf::from("../kernels/include/hk/device.h")
            ]
        );
        assert!(parse_depfile("garbage").is_empty());
    }
}
