//! The `hkpack` command: flag parsing and wiring over the hkpack library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use hk_format::target::TargetId;
use hkload::Bundle;
use hkpack::cache::{RemoteOptions, Signer};
use hkpack::toolchain::ToolPaths;
use hkpack::{BuildOptions, inspect, sign, verify};

/// Compile GPU kernels ahead of time for AMD and NVIDIA targets into versioned bundles.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build every kernel module for every target into dist/<name>-<version>/.
    Build(BuildArgs),
    /// Show what a bundle holds: modules x targets x kernels with their resource use.
    Inspect {
        /// The bundle folder (holding bundle.msgpack).
        bundle: PathBuf,
        /// Show one kernel whole: its signature, launch contract and per-target ABI.
        #[arg(long)]
        kernel: Option<String>,
        /// Print JSON instead of a table: `{"rows": [...], "not_built": [...]}`, every row with
        /// its kernel's launch contract, every target a module skips with the reason.
        #[arg(long)]
        json: bool,
        /// Show every AMD matrix kernel's main loop instead (with --kernel, one kernel's): its
        /// instruction mix and the matrix unit's share of its cycles as llvm-mca simulates them
        /// with LLVM's model of each processor (needs llvm-22).
        #[arg(long)]
        main_loops: bool,
    },
    /// Check every file of a bundle, or of a set of its packages, against every digest its
    /// index records, a line per file. Exits 0 when every file is intact, 1 when any is
    /// damaged or missing, 2 when the folders are not a bundle or package set.
    Verify {
        /// The bundle folder (holding bundle.msgpack), or a package set: the index package
        /// (or the full bundle) and any of the target packages `hkpack split` wrote from it.
        #[arg(required = true, value_name = "BUNDLE_OR_PACKAGES")]
        bundle: Vec<PathBuf>,
        /// A public key file (from `hkpack keygen`) whose signature the bundle must carry;
        /// repeat for several.
        #[arg(long = "key")]
        keys: Vec<PathBuf>,
        /// Print JSON instead of a line per file.
        #[arg(long)]
        json: bool,
    },
    /// Make an ed25519 key pair for signing bundles: <NAME>.key (secret) and <NAME>.pub.
    Keygen {
        /// The key pair's path without extension, e.g. keys/release.
        name: PathBuf,
    },
    /// Sign a bundle's index with a secret key: writes bundle.sig beside it.
    Sign {
        /// The bundle folder (holding bundle.msgpack).
        bundle: PathBuf,
        /// The secret key file (from `hkpack keygen`).
        #[arg(long)]
        key: PathBuf,
    },
    /// Write one code image of a bundle (AMD code object, cubin or PTX) to a file, checked
    /// against its SHA-256, for LLVM's and NVIDIA's own tools.
    Extract {
        /// The bundle folder (holding bundle.msgpack).
        bundle: PathBuf,
        /// The module holding the image.
        #[arg(long)]
        module: String,
        /// The build target whose native image to write (gfx942, sm_90).
        #[arg(long, conflicts_with = "entry", required_unless_present = "entry")]
        target: Option<TargetId>,
        /// An exact entry ID instead (cuda-nvptx64-nvidia-cuda-compute_90 for PTX).
        #[arg(long)]
        entry: Option<String>,
        /// The file to write.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Split a bundle into an index package and one package per target, written next to it
    /// (<name>-<version>-index/, <name>-<version>-<target>/), for hkload's search path.
    Split {
        /// The bundle folder (holding bundle.msgpack).
        bundle: PathBuf,
        /// Where the packages go (default: the folder holding the bundle).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Explain which code object of each module a device would run, and why the others not.
    Explain {
        /// The bundle folder (holding bundle.msgpack).
        bundle: PathBuf,
        /// The device's full target ID, e.g. gfx942:sramecc+:xnack- or sm_90.
        #[arg(long)]
        target: TargetId,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct BuildArgs {
    /// Targets to build, comma-separated (default: the package's targets), e.g. gfx942,sm_90.
    #[arg(long, value_delimiter = ',')]
    arch: Option<Vec<TargetId>>,
    /// The manifests folder.
    #[arg(long, default_value = "manifests")]
    manifests: PathBuf,
    /// Where bundle folders are written.
    #[arg(long, default_value = "dist")]
    out: PathBuf,
    /// The build cache folder.
    #[arg(long, env = "HKPACK_CACHE_DIR", default_value = ".hkpack-cache")]
    cache_dir: PathBuf,
    /// A build cache shared by machines, behind the local one: file:///shared/path,
    /// redis://host:port/db, webdav+http://host:port/path (or http(s)://),
    /// s3://bucket/prefix?endpoint=URL&region=REGION (keys from AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY).
    #[arg(long, env = "HKPACK_CACHE_URL")]
    cache_url: Option<String>,
    /// Read the remote cache but never write to it (for untrusted builds).
    #[arg(long, env = "HKPACK_CACHE_READONLY", value_parser = clap::builder::BoolishValueParser::new())]
    cache_readonly: bool,
    /// Seconds one remote cache read or write may take (default 10); past that the build
    /// goes on without the remote.
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    cache_timeout: Option<Duration>,
    /// Sign every entry this build writes to the remote cache with this secret key file (from
    /// `hkpack keygen`, as for `hkpack sign`), so that builds trusting its public key
    /// (--cache-trust) use them.
    #[arg(long, env = "HKPACK_CACHE_SIGN_KEY", value_name = "KEYFILE")]
    cache_sign_key: Option<PathBuf>,
    /// Use only remote cache entries signed by the key of this public key file (a `.pub` from
    /// `hkpack keygen`); an unsigned or otherwise signed entry is a miss, compiled here, and
    /// the build warns once. Repeat, or separate files with commas, to trust several keys.
    #[arg(
        long,
        env = "HKPACK_CACHE_TRUST",
        value_name = "PUBFILE",
        value_delimiter = ','
    )]
    cache_trust: Vec<PathBuf>,
    /// Run every clang and ptxas compile through this command, e.g. `sccache` (words
    /// separated by spaces).
    #[arg(long, env = "HKPACK_COMPILER_LAUNCHER", value_name = "CMD")]
    compiler_launcher: Option<String>,
    /// Print the summary as JSON (with the cache's counts) instead of text.
    #[arg(long)]
    json: bool,
    /// Parallel compile jobs (default: the number of cores).
    #[arg(short, long)]
    jobs: Option<usize>,
    /// Write zstd-compressed (CCOB) module files, about 14 times smaller than plain ones but
    /// slower to load: hkload then decompresses the image (milliseconds) where it would map it.
    #[arg(long)]
    compress: bool,
    /// Also split the bundle into per-target packages next to it (as `hkpack split` does).
    #[arg(long)]
    split: bool,
    /// Print nothing but errors: no progress bars, no summary.
    #[arg(short, long)]
    quiet: bool,
    /// The clang to use (else HKPACK_CLANG, clang on PATH, /usr/lib/llvm-NN/bin).
    #[arg(long)]
    clang: Option<PathBuf>,
    /// The ptxas to use (else HKPACK_PTXAS, ptxas on PATH, $CUDA_HOME/bin).
    #[arg(long)]
    ptxas: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, hkpack::Error> {
    match cli.command {
        Command::Build(args) => {
            let signer = args
                .cache_sign_key
                .as_deref()
                .map(sign::read_secret_key)
                .transpose()?
                .map(Signer::new);
            let trusted_keys = args
                .cache_trust
                .iter()
                .map(|path| sign::read_public_key(path))
                .collect::<Result<Vec<_>, _>>()?;
            let options = BuildOptions {
                manifests: args.manifests,
                targets: args.arch,
                jobs: args
                    .jobs
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
                out_dir: args.out,
                cache_dir: args.cache_dir,
                remote_cache: args.cache_url.map(|url| RemoteOptions {
                    url,
                    read_only: args.cache_readonly,
                    timeout: args.cache_timeout.unwrap_or(RemoteOptions::DEFAULT_TIMEOUT),
                    // The AWS defaults, read by the S3 client itself.
                    s3_credentials: None,
                    signer,
                    trusted_keys,
                }),
                compress: args.compress,
                tools: ToolPaths {
                    clang: args.clang,
                    ptxas: args.ptxas,
                    launcher: args
                        .compiler_launcher
                        .iter()
                        .flat_map(|command| command.split_whitespace())
                        .map(String::from)
                        .collect(),
                },
                progress: !args.quiet && !args.json,
            };
            let report = hkpack::build(&options)?;
            for warning in &report.warnings {
                eprintln!("warning: {warning}");
            }
            if args.json {
                emit(&to_json(&report.to_json()));
            } else if !args.quiet {
                emit(&format!("{report}\n"));
            }
            if args.split {
                split(&report.bundle, None, args.quiet)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect {
            bundle: dir,
            kernel,
            json,
            main_loops,
        } => {
            let bundle = Bundle::open(&dir)?;
            if main_loops {
                let report = inspect::main_loop::LlvmTools::discover()
                    .and_then(|tools| inspect::main_loop::report(&dir, &tools, kernel.as_deref()));
                let report = match report {
                    Ok(report) => report,
                    Err(problem) => {
                        eprintln!("error: {problem}");
                        return Ok(ExitCode::FAILURE);
                    }
                };
                emit(&if json {
                    to_json(&report)
                } else {
                    inspect::main_loop::table(&report)
                });
                return module_files_verdict(&bundle, &dir);
            }
            match kernel {
                Some(symbol) => {
                    let view = inspect::kernel(&bundle, &symbol)?;
                    emit(&if json {
                        to_json(&view)
                    } else {
                        view.to_string()
                    });
                }
                None => {
                    let inspection = inspect::Inspection {
                        rows: inspect::rows(&bundle)?,
                        not_built: inspect::not_built(&bundle)?,
                    };
                    emit(&if json {
                        to_json(&inspection)
                    } else {
                        let mut text = inspect::table(&inspection.rows);
                        for skipped in &inspection.not_built {
                            text.push_str(&format!("{skipped}\n"));
                        }
                        text
                    });
                }
            }
            Ok(module_files_verdict(&bundle, &dir)?)
        }
        Command::Keygen { name } => {
            let key = sign::keygen(&name)?;
            emit(&format!(
                "wrote {} (keep it secret) and {}: {key}\n",
                sign::secret_key_file(&name).display(),
                sign::public_key_file(&name).display()
            ));
            Ok(ExitCode::SUCCESS)
        }
        Command::Sign { bundle, key } => {
            let key = sign::sign(&bundle, &key)?;
            emit(&format!("signed {} with {key}\n", bundle.display()));
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify {
            bundle: dirs,
            keys,
            json,
        } => {
            let keys = keys
                .iter()
                .map(|path| sign::read_public_key(path))
                .collect::<Result<Vec<_>, _>>()?;
            let verdicts = match verify::packages::verify_set(&dirs, &keys) {
                Ok(verdicts) => verdicts,
                Err(problem) => {
                    eprintln!("error: {problem}");
                    return Ok(ExitCode::from(2));
                }
            };
            emit(&if json {
                to_json(&verdicts)
            } else {
                verify::report(&dirs, &verdicts)
            });
            Ok(if verdicts.iter().all(|v| v.intact) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Extract {
            bundle,
            module,
            target,
            entry,
            output,
        } => {
            let pick = match (target, entry) {
                (Some(target), _) => verify::Pick::Target(target),
                (None, Some(entry)) => verify::Pick::Entry(entry),
                (None, None) => unreachable!("clap requires one of --target and --entry"),
            };
            let written = verify::extract(&bundle, &module, &pick, &output)?;
            eprintln!(
                "wrote {written} of module `{module}` to {}",
                output.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Split { bundle, out } => {
            split(&bundle, out, false)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain {
            bundle: dir,
            target,
            json,
        } => {
            let bundle = Bundle::open(&dir)?;
            let explanation = bundle.explain(&target);
            emit(&if json {
                to_json(&explanation)
            } else {
                explanation.to_string()
            });
            if !explanation.is_servable() {
                eprintln!(
                    "error: this bundle has no code object for {target} in at least one module (see above)"
                );
                return Ok(ExitCode::FAILURE);
            }
            Ok(module_files_verdict(&bundle, &dir)?)
        }
    }
}

/// Splits the bundle folder `bundle` into packages in `out` (default: beside it), and says
/// which unless `quiet`.
fn split(bundle: &Path, out: Option<PathBuf>, quiet: bool) -> Result<(), hkpack::Error> {
    let out = out.unwrap_or_else(|| {
        bundle
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_owned)
    });
    let packages = hkpack::split::split(bundle, &out)?;
    if !quiet {
        for package in packages {
            emit(&format!("wrote {}\n", package.display()));
        }
    }
    Ok(())
}

/// What `inspect` and `explain` print comes from the index; they fail if the module files it
/// describes are not the ones beside it.
fn module_files_verdict(bundle: &Bundle, dir: &Path) -> Result<ExitCode, hkpack::Error> {
    let damaged = inspect::damaged_module_files(bundle, dir)?;
    for problem in &damaged {
        eprintln!("error: {problem}");
    }
    if damaged.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "error: the bundle's module files do not match its index; rebuild it with `hkpack build`"
    );
    Ok(ExitCode::FAILURE)
}

/// `--cache-timeout`: a positive number of seconds.
fn seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("`{text}` is not a positive number of seconds"))
}

fn to_json(value: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(value)
        .expect("inspection and explanation values hold only strings and numbers")
        + "\n"
}

/// Writes to stdout; a reader that went away (`hkpack inspect … | head`) is not an error.
fn emit(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
