//! `hkpack inspect --main-loops`: every AMD matrix kernel's main loop, statically (no AMD GPU
//! is needed): its instruction mix, and how busy `llvm-mca`, with LLVM's own scheduling model
//! of the processor, keeps the matrix unit in it.
//!
//! # Method
//!
//! 1. **Machine code.** Each AMD code object of the bundle (checked against its digest, as
//!    `hkpack extract` writes it) is disassembled by `llvm-objdump -d --mcpu=<processor>`. A
//!    kernel is a *matrix kernel* on a target if its code holds a matrix instruction (MFMA:
//!    `v_mfma*`, `v_smfmac*`); which modules those are comes from the code, not from a list.
//! 2. **The main loop.** A loop is a backward branch (`s_branch`, `s_cbranch_*`) to an earlier
//!    instruction of the kernel, its body the instructions from that header to its last
//!    backward branch (a loop may have several latches). Of the loops that hold MFMAs, the
//!    innermost ones (holding no other such loop) are candidates, and the one with the most
//!    MFMAs is the main loop; of equals, the shortest (where a kernel chooses its copy path
//!    once, before the K loop, each path is a loop of its own, and the aligned one is the
//!    short one). This assumes the compiler lays a loop out contiguously, header first, which
//!    is what LLVM does for the single-block and rotated loops of our kernels.
//! 3. **Two views of it.** The *body* is every instruction of the loop, every path at once, as
//!    straight-line code. The *aligned path* is the one a steady-state step takes when every
//!    row is aligned for the vector copies: from the header, it falls through conditional
//!    branches (no exit, no skipped work), follows forward `s_branch`es, and takes each
//!    `s_cbranch_execz` that skips a region holding exec-mask branches of its own: that region
//!    is an element-by-element fallback (one exec-masked load per element), which no lane runs
//!    when all are aligned. It runs to the loop's last latch, so where a step may branch back early it
//!    counts the longer way: the BF16 GEMM's next-stage LDS writes (skipped only by the last
//!    step), and the weight-only kernels' scaling at the end of each 128-deep group (once
//!    every few steps), which makes their share a lower bound. It is reported only where it
//!    differs from the body.
//! 4. **Instruction mix** of each view: MFMAs, vector memory (`global_`, `buffer_`, `flat_`,
//!    `scratch_`, `image_`), LDS (`ds_`), branches, waits (`s_waitcnt*`), other scalar
//!    (`s_`), other vector ALU (`v_`).
//! 5. **Simulation.** Each view without its branches (llvm-mca simulates a block as if it
//!    repeats) goes to `llvm-mca -mtriple=amdgcn-amd-amdhsa -mcpu=<processor>` for
//!    [`ITERATIONS`] iterations, read back as JSON. LLVM's AMDGPU model books every MFMA on
//!    one resource, `HWXDL` (the XDL matrix core), for the cycles it gives the instruction
//!    (its passes in the model: 4 for a 16 x 16 x 16 bf16 MFMA on gfx942, 8 on gfx90a). The *matrix cycles* of an iteration are llvm-mca's resource pressure on `HWXDL`,
//!    the *cycles* its total cycles over the iterations, and the **matrix share** the one over
//!    the other: 1 means the matrix unit never waits. As a cross-check the MFMAs' reciprocal
//!    throughputs from the model's instruction table are summed too
//!    ([`Simulation::mfma_cycles`]); the two agree when nothing but MFMAs uses `HWXDL`.
//!
//! What the model leaves out bounds what the share means: llvm-mca does not wait at
//! `s_waitcnt` or `s_barrier` (it books them as one-cycle instructions), knows no
//! other waves on the SIMD, and gives memory instructions a fixed latency. The share is the
//! model's view of one wave's instruction stream: a measure to compare kernels and
//! schedules by, not a prediction of the hardware's utilisation.

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use hk_format::target::TargetId;
use hkload::Bundle;

use crate::verify::{self, Pick};

/// How many times llvm-mca repeats a loop: enough that the first iteration's ramp-up is a
/// rounding error in the cycles of one.
pub const ITERATIONS: u32 = 100;

/// The resource of LLVM's AMDGPU scheduling model (`SISchedule.td`) that every MFMA holds.
const MATRIX_RESOURCE: &str = "HWXDL";

/// The LLVM release whose tools the report prefers: the one the build compiles with.
const LLVM_MAJOR: u32 = 22;

/// What can keep the report from being made.
#[derive(Debug, thiserror::Error)]
pub enum MainLoopError {
    #[error(
        "{tool}-{LLVM_MAJOR} not found (tried {tried}): install llvm-{LLVM_MAJOR} (scripts/setup, or `apt-get install llvm-{LLVM_MAJOR}`), or point HKPACK_LLVM_BIN at a folder holding {tool}"
    )]
    ToolNotFound { tool: &'static str, tried: String },
    #[error("{} could not run: {detail}", tool.display())]
    ToolFailed { tool: PathBuf, detail: String },
    #[error("llvm-objdump failed on module `{module}` for {target}: {detail}")]
    Disassembly {
        module: String,
        target: TargetId,
        detail: String,
    },
    #[error(
        "llvm-mca rejected the {view} of kernel `{kernel}`'s main loop for {target}: {detail}\n(the report feeds it the loop's instructions as llvm-objdump prints them; an instruction it names is one LLVM's scheduling model for {target} or its assembler does not know)"
    )]
    Simulation {
        kernel: String,
        target: TargetId,
        view: &'static str,
        detail: String,
    },
    #[error(transparent)]
    Bundle(#[from] crate::Error),
}

/// `llvm-objdump` and `llvm-mca`, and the release they come from.
#[derive(Debug, Clone)]
pub struct LlvmTools {
    objdump: PathBuf,
    mca: PathBuf,
    /// `llvm-mca --version`'s line naming the release: the model's version, which the numbers
    /// depend on.
    pub version: String,
}

impl LlvmTools {
    /// Finds both tools in `HKPACK_LLVM_BIN` if it is set, else in `/usr/lib/llvm-22/bin`,
    /// else on PATH as `llvm-mca-22` (Debian's names), else as `llvm-mca`.
    pub fn discover() -> Result<Self, MainLoopError> {
        let llvm_bin = std::env::var_os("HKPACK_LLVM_BIN").map(PathBuf::from);
        let objdump = find_tool("llvm-objdump", llvm_bin.as_deref())?;
        let mca = find_tool("llvm-mca", llvm_bin.as_deref())?;
        let output = Command::new(&mca).arg("--version").output().map_err(|e| {
            MainLoopError::ToolFailed {
                tool: mca.clone(),
                detail: e.to_string(),
            }
        })?;
        let version = String::from_utf8_lossy(&output.stdout)
            .lines()
            .find(|line| line.contains("version"))
            .unwrap_or_default()
            .trim()
            .to_owned();
        Ok(Self {
            objdump,
            mca,
            version,
        })
    }
}

/// `tool` in `llvm_bin` if given, else where [`LlvmTools::discover`] looks.
fn find_tool(tool: &'static str, llvm_bin: Option<&Path>) -> Result<PathBuf, MainLoopError> {
    let versioned = format!("{tool}-{LLVM_MAJOR}");
    let candidates: Vec<PathBuf> = match llvm_bin {
        Some(dir) => vec![dir.join(tool)],
        None => {
            let path_dirs: Vec<PathBuf> = std::env::var_os("PATH")
                .map(|path| std::env::split_paths(&path).collect())
                .unwrap_or_default();
            std::iter::once(PathBuf::from(format!(
                "/usr/lib/llvm-{LLVM_MAJOR}/bin/{tool}"
            )))
            .chain(
                [versioned.as_str(), tool]
                    .into_iter()
                    .flat_map(|name| path_dirs.iter().map(move |dir| dir.join(name))),
            )
            .collect()
        }
    };
    candidates
        .into_iter()
        .find(|path| path.is_file())
        .ok_or_else(|| MainLoopError::ToolNotFound {
            tool,
            tried: match llvm_bin {
                Some(dir) => format!("HKPACK_LLVM_BIN={}", dir.display()),
                None => format!("/usr/lib/llvm-{LLVM_MAJOR}/bin, {versioned} and {tool} on PATH"),
            },
        })
}

/// The report: one row per matrix kernel and AMD target.
#[derive(Debug, Clone, Serialize)]
pub struct MainLoopReport {
    /// The release of the LLVM tools (and so of the scheduling model) that made the report.
    pub llvm: String,
    pub iterations: u32,
    pub kernels: Vec<KernelMainLoop>,
}

/// One matrix kernel on one AMD target.
#[derive(Debug, Clone, Serialize)]
pub struct KernelMainLoop {
    pub module: String,
    pub target: TargetId,
    pub kernel: String,
    /// `None` when no loop holds the kernel's MFMAs (a fully unrolled kernel).
    pub main_loop: Option<MainLoop>,
}

/// A kernel's main loop and what the model makes of it.
#[derive(Debug, Clone, Serialize)]
pub struct MainLoop {
    /// Where the loop starts and ends (its last backward branch): byte offsets from the
    /// kernel's first instruction, as `llvm-objdump` prints them (`<kernel+0xb60>`).
    pub start: u64,
    pub end: u64,
    /// Every instruction of the loop, every path at once.
    pub body: LoopView,
    /// The path a steady-state step takes when every row is aligned for the vector copies
    /// (see the module's doc); `None` where it is the whole body.
    pub aligned_path: Option<LoopView>,
}

/// One view of a loop: its instructions counted, and simulated.
#[derive(Debug, Clone, Serialize)]
pub struct LoopView {
    pub mix: InstructionMix,
    pub simulation: Simulation,
}

/// A loop's instructions by kind; `instructions` is the sum of the others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct InstructionMix {
    pub instructions: usize,
    /// Matrix instructions: `v_mfma*`, `v_smfmac*`.
    pub mfma: usize,
    /// Global, buffer, flat, scratch and image loads and stores.
    pub vector_memory: usize,
    /// LDS (`ds_*`) reads, writes and atomics.
    pub lds: usize,
    /// Scalar instructions that are neither branches nor waits.
    pub scalar: usize,
    pub branches: usize,
    /// `s_waitcnt*`.
    pub waits: usize,
    /// Vector ALU instructions other than MFMAs.
    pub valu: usize,
    /// Anything else (none in today's kernels).
    pub other: usize,
}

/// llvm-mca's view of one iteration of a loop.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Simulation {
    /// Simulated cycles of one iteration: llvm-mca's total cycles over its iterations.
    pub cycles: f64,
    /// Cycles an iteration keeps the matrix unit busy: the resource pressure on `HWXDL`.
    pub matrix_cycles: f64,
    /// The cross-check: the sum of the MFMAs' reciprocal throughputs in the model's
    /// instruction table (an MFMA's passes, in the model's cycles).
    pub mfma_cycles: f64,
    /// `matrix_cycles / cycles`.
    pub matrix_share: f64,
}

/// The main loops of every matrix kernel of the bundle `dir` on every AMD target it is built
/// for, kernels in manifest order, targets in build order; only `kernel` with `Some`.
pub fn report(
    dir: &Path,
    tools: &LlvmTools,
    kernel: Option<&str>,
) -> Result<MainLoopReport, MainLoopError> {
    let bundle = Bundle::open(dir).map_err(crate::Error::from)?;
    let manifest = bundle.manifest().map_err(crate::Error::from)?;
    if let Some(symbol) = kernel {
        bundle.kernel_record(symbol).map_err(crate::Error::from)?;
    }
    let code_objects: Vec<CodeObject<'_>> = manifest
        .modules
        .iter()
        .filter(|module| kernel.is_none_or(|symbol| module.kernels.iter().any(|k| k == symbol)))
        .flat_map(|module| {
            module
                .entries
                .iter()
                .filter_map(|entry| match entry.id.target() {
                    target @ TargetId::Amd(amd) => Some(CodeObject {
                        module: &module.name,
                        kernels: &module.kernels,
                        target,
                        processor: amd.processor().name(),
                    }),
                    TargetId::Nvidia(_) => None,
                })
        })
        .collect();
    // Each code object is a disassembly and a few dozen simulations, all in other processes:
    // run them side by side.
    let results = parallel_map(&code_objects, |code_object| {
        code_object_main_loops(dir, tools, code_object, kernel)
    });
    let mut kernels = Vec::new();
    for result in results {
        kernels.extend(result?);
    }
    Ok(MainLoopReport {
        llvm: tools.version.clone(),
        iterations: ITERATIONS,
        kernels,
    })
}

/// `f` of every item on as many threads as there are cores, each taking the next item as it
/// finishes one (as the build's job pool does); the results in the items' order.
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut results: Vec<(usize, R)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers.clamp(1, items.len().max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        done.push((i, f(item)));
                    }
                    done
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    results.sort_by_key(|&(i, _)| i);
    results.into_iter().map(|(_, result)| result).collect()
}

/// One module's AMD code object for one target.
struct CodeObject<'a> {
    module: &'a str,
    kernels: &'a [String],
    target: TargetId,
    /// The processor LLVM's tools take as `--mcpu`: the target ID without its features.
    processor: &'static str,
}

/// The main loops of the matrix kernels in `code`; only kernel `only` with `Some`.
fn code_object_main_loops(
    dir: &Path,
    tools: &LlvmTools,
    code: &CodeObject<'_>,
    only: Option<&str>,
) -> Result<Vec<KernelMainLoop>, MainLoopError> {
    let CodeObject {
        module,
        kernels,
        target,
        processor,
    } = *code;
    let disassembly_failed = |detail: String| MainLoopError::Disassembly {
        module: module.to_owned(),
        target,
        detail,
    };
    let scratch =
        tempfile::tempdir().map_err(|e| disassembly_failed(format!("no temporary folder: {e}")))?;
    let object = scratch.path().join(format!("{module}.{processor}.co"));
    verify::extract(dir, module, &Pick::Target(target), &object)?;
    let output = Command::new(&tools.objdump)
        .args(["-d", &format!("--mcpu={processor}")])
        .arg(&object)
        .output()
        .map_err(|e| MainLoopError::ToolFailed {
            tool: tools.objdump.clone(),
            detail: e.to_string(),
        })?;
    if !output.status.success() {
        return Err(disassembly_failed(
            String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let functions = functions(&text);
    let mut rows = Vec::new();
    for symbol in kernels
        .iter()
        .filter(|k| only.is_none_or(|symbol| *k == symbol))
    {
        let Some(function) = functions.get(symbol.as_str()) else {
            return Err(disassembly_failed(format!(
                "kernel `{symbol}` is not in the disassembly"
            )));
        };
        if !function.iter().any(|i| is_mfma(i.mnemonic)) {
            continue;
        }
        let view = |name: &'static str, instructions: Vec<&Instruction<'_>>| {
            let simulation = simulate(tools, processor, &instructions).map_err(|detail| {
                MainLoopError::Simulation {
                    kernel: symbol.clone(),
                    target,
                    view: name,
                    detail,
                }
            })?;
            Ok::<_, MainLoopError>(LoopView {
                mix: InstructionMix::of(&instructions),
                simulation,
            })
        };
        // Offsets from the kernel's first instruction, as objdump's branch notes give them.
        let offset = |i: usize| function[i].address - function[0].address;
        let main_loop = main_loop(function)
            .map(|found| {
                Ok::<_, MainLoopError>(MainLoop {
                    start: offset(found.body.start),
                    end: offset(found.body.end - 1),
                    body: view("body", function[found.body].iter().collect())?,
                    aligned_path: found
                        .aligned_path
                        .map(|path| {
                            view("aligned path", path.iter().map(|&i| &function[i]).collect())
                        })
                        .transpose()?,
                })
            })
            .transpose()?;
        rows.push(KernelMainLoop {
            module: module.to_owned(),
            target,
            kernel: symbol.clone(),
            main_loop,
        });
    }
    Ok(rows)
}

/// One instruction of `llvm-objdump -d` output for AMDGPU.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Instruction<'a> {
    address: u64,
    mnemonic: &'a str,
    /// The instruction as the assembler reads it: objdump's line without its comment.
    text: &'a str,
    /// Where a branch goes, from objdump's `<kernel+0xOFFSET>` note; `None` for other
    /// instructions and for branches out of the function.
    target: Option<u64>,
}

/// The functions of `llvm-objdump -d` output by symbol, each its instructions in address
/// order. Lines that are not instructions (section headers, blank lines, notes) are skipped.
fn functions(disassembly: &str) -> BTreeMap<&str, Vec<Instruction<'_>>> {
    let mut functions: BTreeMap<&str, Vec<Instruction<'_>>> = BTreeMap::new();
    let mut current: Option<(&str, u64)> = None;
    for line in disassembly.lines() {
        // `0000000000001900 <gemm_a16w16_nt_bf16>:`
        if let Some((address, symbol)) = line
            .strip_suffix(">:")
            .and_then(|head| head.split_once(" <"))
        {
            current = u64::from_str_radix(address, 16)
                .ok()
                .map(|address| (symbol, address));
            if let Some((symbol, _)) = current {
                functions.entry(symbol).or_default();
            }
            continue;
        }
        let Some((symbol, base)) = current else {
            continue;
        };
        if let Some(instruction) = instruction(line, symbol, base) {
            functions.entry(symbol).or_default().push(instruction);
        }
    }
    functions
}

/// `\ts_cbranch_scc0 2904   // 00000000CB34: BF840B58 <gemm_a16w16_nt_bf16+0x2d98>`: an
/// instruction of function `symbol` (at `base`), its address and encoding in the comment, and
/// for a branch its target.
fn instruction<'a>(line: &'a str, symbol: &str, base: u64) -> Option<Instruction<'a>> {
    if !line.starts_with(char::is_whitespace) {
        return None;
    }
    let (text, comment) = line.split_once("//")?;
    let text = text.trim();
    let mnemonic = text.split_whitespace().next()?;
    let (address, rest) = comment.trim().split_once(':')?;
    let address = u64::from_str_radix(address, 16).ok()?;
    let target = rest
        .trim()
        .strip_suffix('>')
        .and_then(|rest| rest.rsplit_once('<'))
        .and_then(|(_, note)| note.strip_prefix(symbol)?.strip_prefix("+0x"))
        .and_then(|offset| u64::from_str_radix(offset, 16).ok())
        .map(|offset| base + offset);
    Some(Instruction {
        address,
        mnemonic,
        text,
        target,
    })
}

fn is_mfma(mnemonic: &str) -> bool {
    mnemonic.starts_with("v_mfma") || mnemonic.starts_with("v_smfmac")
}

fn is_branch(mnemonic: &str) -> bool {
    mnemonic == "s_branch" || mnemonic.starts_with("s_cbranch_")
}

/// Where a function's main loop is: its body as a range of instruction indices, and the
/// aligned path's instructions where they are fewer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FoundLoop {
    body: Range<usize>,
    aligned_path: Option<Vec<usize>>,
}

/// The main loop of `function` (see the module's doc), if a loop holds its MFMAs.
fn main_loop(function: &[Instruction<'_>]) -> Option<FoundLoop> {
    let index_of = |address: u64| function.binary_search_by_key(&address, |i| i.address).ok();
    // Each header's loop reaches to its last backward branch.
    let mut latches: BTreeMap<usize, usize> = BTreeMap::new();
    for (i, branch) in function.iter().enumerate() {
        let backward = branch
            .target
            .filter(|&target| is_branch(branch.mnemonic) && target <= branch.address);
        if let Some(header) = backward.and_then(index_of) {
            let latch = latches.entry(header).or_insert(i);
            *latch = (*latch).max(i);
        }
    }
    let mfmas = |range: &Range<usize>| {
        function[range.clone()]
            .iter()
            .filter(|i| is_mfma(i.mnemonic))
            .count()
    };
    let loops: Vec<Range<usize>> = latches
        .into_iter()
        .map(|(header, latch)| header..latch + 1)
        .filter(|body| mfmas(body) > 0)
        .collect();
    let contains = |outer: &Range<usize>, inner: &Range<usize>| {
        outer != inner && outer.start <= inner.start && inner.end <= outer.end
    };
    let body = loops
        .iter()
        .filter(|outer| !loops.iter().any(|inner| contains(outer, inner)))
        // The most MFMAs; of equals, the shortest (a kernel that chooses its copy path before
        // the loop has one loop per path: the aligned one is the short one), then the earliest.
        .max_by_key(|body| {
            let shorter = std::cmp::Reverse(body.len());
            (mfmas(body), shorter, std::cmp::Reverse(body.start))
        })?
        .clone();
    let path = aligned_path(function, body.clone(), index_of);
    Some(FoundLoop {
        aligned_path: (path.len() < body.len()).then_some(path),
        body,
    })
}

/// The instruction indices of the aligned path through the loop `body` (see the module's doc).
fn aligned_path(
    function: &[Instruction<'_>],
    body: Range<usize>,
    index_of: impl Fn(u64) -> Option<usize>,
) -> Vec<usize> {
    let mut path = Vec::new();
    let mut i = body.start;
    // Every step moves forward, so the walk ends.
    while i < body.end {
        path.push(i);
        let instruction = &function[i];
        let forward = instruction
            .target
            .filter(|&target| target > instruction.address)
            .and_then(&index_of)
            .filter(|&to| to < body.end);
        match (instruction.mnemonic, forward) {
            ("s_branch", Some(to)) => i = to,
            // Out of the loop or back to its header: the step ends.
            ("s_branch", None) => break,
            ("s_cbranch_execz", Some(to))
                if function[i + 1..to]
                    .iter()
                    .any(|skipped| skipped.mnemonic.starts_with("s_cbranch_exec")) =>
            {
                i = to;
            }
            _ => i += 1,
        }
    }
    path
}

impl InstructionMix {
    fn of(instructions: &[&Instruction<'_>]) -> Self {
        let mut mix = Self {
            instructions: instructions.len(),
            ..Self::default()
        };
        for instruction in instructions {
            let m = instruction.mnemonic;
            let count = if is_mfma(m) {
                &mut mix.mfma
            } else if ["global_", "buffer_", "flat_", "scratch_", "image_"]
                .iter()
                .any(|prefix| m.starts_with(prefix))
            {
                &mut mix.vector_memory
            } else if m.starts_with("ds_") {
                &mut mix.lds
            } else if is_branch(m) {
                &mut mix.branches
            } else if m.starts_with("s_waitcnt") {
                &mut mix.waits
            } else if m.starts_with("s_") {
                &mut mix.scalar
            } else if m.starts_with("v_") {
                &mut mix.valu
            } else {
                &mut mix.other
            };
            *count += 1;
        }
        mix
    }
}

/// llvm-mca's view of `instructions` (branches left out) repeated [`ITERATIONS`] times on
/// processor `cpu`; the error is what llvm-mca said.
fn simulate(
    tools: &LlvmTools,
    cpu: &str,
    instructions: &[&Instruction<'_>],
) -> Result<Simulation, String> {
    let source: String = instructions
        .iter()
        .filter(|i| !is_branch(i.mnemonic))
        .map(|i| format!("{}\n", i.text))
        .collect();
    let mut child = Command::new(&tools.mca)
        .args([
            "-mtriple=amdgcn-amd-amdhsa",
            &format!("-mcpu={cpu}"),
            &format!("-iterations={ITERATIONS}"),
            "--json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{} could not run: {e}", tools.mca.display()))?;
    // llvm-mca reads all of its input before it writes anything: writing first cannot block.
    let written = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(source.as_bytes()));
    let output = child
        .wait_with_output()
        .map_err(|e| format!("{} did not finish: {e}", tools.mca.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(stderr.lines().take(8).collect::<Vec<_>>().join("\n"));
    }
    if let Some(Err(e)) = written {
        return Err(format!("could not write its input: {e}"));
    }
    simulation(&output.stdout)
}

/// The parts of `llvm-mca --json` output the report reads.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct McaOutput {
    code_regions: Vec<McaRegion>,
    target_info: McaTargetInfo,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct McaTargetInfo {
    resources: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct McaRegion {
    instructions: Vec<String>,
    summary_view: McaSummary,
    resource_pressure_view: McaPressureView,
    instruction_info_view: McaInfoView,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct McaSummary {
    iterations: u64,
    total_cycles: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct McaPressureView {
    resource_pressure_info: Vec<McaPressure>,
}

/// Cycles per iteration that instruction `instruction_index` keeps resource `resource_index`
/// busy; an index one past the last instruction is the whole block's total.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct McaPressure {
    instruction_index: usize,
    resource_index: usize,
    resource_usage: f64,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct McaInfoView {
    instruction_list: Vec<McaInstructionInfo>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct McaInstructionInfo {
    r_throughput: f64,
}

/// The simulation in `llvm-mca --json` output.
fn simulation(json: &[u8]) -> Result<Simulation, String> {
    let output: McaOutput = serde_json::from_slice(json)
        .map_err(|e| format!("its JSON output is not what this report reads: {e}"))?;
    let [region] = output.code_regions.as_slice() else {
        return Err(format!(
            "it reported {} code regions, the report reads one",
            output.code_regions.len()
        ));
    };
    let matrix = output
        .target_info
        .resources
        .iter()
        .position(|name| name == MATRIX_RESOURCE)
        .ok_or_else(|| {
            format!(
                "its scheduling model names no matrix resource {MATRIX_RESOURCE}, only {}",
                output.target_info.resources.join(", ")
            )
        })?;
    let instructions = region.instructions.len();
    let matrix_cycles: f64 = region
        .resource_pressure_view
        .resource_pressure_info
        .iter()
        .filter(|p| p.resource_index == matrix && p.instruction_index < instructions)
        .map(|p| p.resource_usage)
        .sum();
    let mfma_cycles: f64 = region
        .instructions
        .iter()
        .zip(&region.instruction_info_view.instruction_list)
        .filter(|(text, _)| text.split_whitespace().next().is_some_and(is_mfma))
        .map(|(_, info)| info.r_throughput)
        .sum();
    let summary = &region.summary_view;
    if summary.iterations == 0 || summary.total_cycles == 0 {
        return Err("it simulated no cycles".into());
    }
    let cycles = summary.total_cycles as f64 / summary.iterations as f64;
    Ok(Simulation {
        cycles,
        matrix_cycles,
        mfma_cycles,
        matrix_share: matrix_cycles / cycles,
    })
}

/// The report as a text table: a row per kernel and target, its main loop's body, and a
/// second row for the aligned path where there is one.
pub fn table(report: &MainLoopReport) -> String {
    if report.kernels.is_empty() {
        return "no matrix kernel (one with MFMA instructions) on an AMD target in this bundle\n"
            .into();
    }
    const HEADER: [&str; 14] = [
        "module", "target", "kernel", "view", "instrs", "mfma", "vmem", "lds", "salu", "branch",
        "wait", "valu", "cycles", "share",
    ];
    let mut cells: Vec<Vec<String>> = vec![HEADER.map(String::from).to_vec()];
    for row in &report.kernels {
        let names = [
            row.module.clone(),
            row.target.to_string(),
            row.kernel.clone(),
        ];
        let Some(main_loop) = &row.main_loop else {
            cells.push(names.into_iter().chain(["no loop".to_owned()]).collect());
            continue;
        };
        let views = std::iter::once(("body", &main_loop.body))
            .chain(main_loop.aligned_path.iter().map(|path| ("aligned", path)));
        for (name, view) in views {
            let (m, s) = (&view.mix, &view.simulation);
            cells.push(
                names
                    .iter()
                    .cloned()
                    .chain([name.to_owned()])
                    .chain(
                        [
                            m.instructions,
                            m.mfma,
                            m.vector_memory,
                            m.lds,
                            m.scalar,
                            m.branches,
                            m.waits,
                            m.valu,
                        ]
                        .map(|n| n.to_string()),
                    )
                    .chain([format!("{:.1}", s.cycles), format!("{:.2}", s.matrix_share)])
                    .collect(),
            );
        }
    }
    let mut out = super::aligned_columns(&cells, 4);
    out.push_str(&format!(
        "\nbody: every instruction of the loop, every path at once; aligned: the path of a step\n\
         whose rows are all aligned for the vector copies; no loop: no loop holds the MFMAs.\n\
         cycles: llvm-mca's per iteration ({ITERATIONS} iterations, {}); share: the matrix\n\
         unit's (HWXDL) busy cycles over those.\n",
        report.llvm
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GEMM's main loop as `llvm-objdump -d --mcpu=gfx942` prints it, cut down from
    /// `gemm_a16w16_nt_bf16` (addresses renumbered): the loop is entered in its middle, leaves
    /// at `s_cbranch_scc0`, copies one chunk element by element behind exec-mask branches or
    /// with one 16-byte load, multiplies, and has two latches. After it, an epilogue.
    const GEMM: &str = "
gemm.co:\tfile format elf64-amdgpu

Disassembly of section .text:

0000000000000100 <gemm_demo>:
\ts_mov_b32 s38, 0                                           // 000000000100: BEA60080
\ts_branch 2                                                 // 000000000104: BF820002 <gemm_demo+0x10>
\ts_add_i32 s36, s36, 32                                     // 000000000108: 8124A024
\ts_barrier                                                  // 00000000010C: BF8A0000
\ts_cbranch_scc0 19                                          // 000000000110: BF840013 <gemm_demo+0x60>
\ts_and_saveexec_b64 s[10:11], s[0:1]                        // 000000000114: BE8A2000
\ts_xor_b64 s[10:11], exec, s[10:11]                         // 000000000118: 888A0A7E
\ts_cbranch_execz 5                                          // 00000000011C: BF880005 <gemm_demo+0x34>
\ts_and_saveexec_b64 s[34:35], s[0:1]                        // 000000000120: BEA22000
\ts_cbranch_execz 1                                          // 000000000124: BF880001 <gemm_demo+0x2c>
\tglobal_load_ushort v72, v[68:69], off                      // 000000000128: DC488000 487F0044
\ts_or_b64 exec, exec, s[34:35]                              // 00000000012C: 87FE227E
\tv_perm_b32 v64, v64, v72, s37                              // 000000000130: D1ED0040 00969140
\ts_andn2_saveexec_b64 s[0:1], s[10:11]                      // 000000000134: BE80230A
\ts_cbranch_execz 1                                          // 000000000138: BF880001 <gemm_demo+0x40>
\tglobal_load_dwordx4 v[64:67], v[68:69], off                // 00000000013C: DC5C8000 407F0044
\ts_or_b64 exec, exec, s[0:1]                                // 000000000140: 87FE007E
\tds_read2st64_b64 v[110:113], v97 offset1:2                 // 000000000144: D8F00200 6E000061
\ts_waitcnt lgkmcnt(0)                                       // 000000000148: BF8CC07F
\tv_mfma_f32_16x16x16_bf16 v[60:63], v[110:111], v[114:115], v[60:63]// 00000000014C: D3E1003C 04F2E56E
\tv_mfma_f32_16x16x16_bf16 v[56:59], v[110:111], v[116:117], v[56:59]// 000000000150: D3E10038 04E2E96E
\ts_cbranch_vccnz 65516                                      // 000000000154: BF87FFEC <gemm_demo+0x8>
\tds_write_b128 v96, v[64:67]                                // 000000000158: D9BE0000 00004060
\ts_branch 65514                                             // 00000000015C: BF82FFEA <gemm_demo+0x8>
\tv_mfma_f32_16x16x16_bf16 v[0:3], v[4:5], v[6:7], v[0:3]    // 000000000160: D3E10000 04020D04
\ts_endpgm                                                   // 000000000168: BF810000

0000000000000200 <nested>:
\ts_mov_b32 s0, 0                                            // 000000000200: BE800080
\ts_add_i32 s1, s1, 1                                        // 000000000204: 81018101
\tv_mfma_f32_16x16x16_bf16 v[0:3], v[4:5], v[6:7], v[0:3]    // 000000000208: D3E10000 04020D04
\ts_cbranch_scc1 65534                                       // 000000000210: BF85FFFE <gemm_demo+0x8>
\ts_cbranch_scc1 65533                                       // 000000000214: BF85FFFD <nested+0x8>
\tv_mfma_f32_16x16x16_bf16 v[8:11], v[4:5], v[6:7], v[8:11]  // 000000000218: D3E10008 04220D04
\ts_cbranch_scc1 65530                                       // 000000000220: BF85FFFA <nested+0x4>
\ts_endpgm                                                   // 000000000224: BF810000

0000000000000300 <unrolled>:
\tv_mfma_f32_16x16x16_bf16 v[0:3], v[4:5], v[6:7], v[0:3]    // 000000000300: D3E10000 04020D04
\ts_cbranch_scc1 65535                                       // 000000000308: BF85FFFF <unrolled+0x30c>
\ts_sub_u32 s0, s0, 1                                        // 00000000030C: 80808100
\ts_cbranch_scc1 65534                                       // 000000000310: BF85FFFE <unrolled+0xc>
\ts_endpgm                                                   // 000000000314: BF810000
";

    fn mnemonics<'a>(
        function: &[Instruction<'a>],
        indices: impl Iterator<Item = usize>,
    ) -> Vec<&'a str> {
        indices.map(|i| function[i].mnemonic).collect()
    }

    #[test]
    fn reads_functions_instructions_and_branch_targets() {
        let functions = functions(GEMM);
        assert_eq!(
            functions.keys().copied().collect::<Vec<_>>(),
            ["gemm_demo", "nested", "unrolled"]
        );
        let gemm = &functions["gemm_demo"];
        assert_eq!(gemm.len(), 26);
        assert_eq!(
            gemm[1],
            Instruction {
                address: 0x104,
                mnemonic: "s_branch",
                text: "s_branch 2",
                target: Some(0x110),
            }
        );
        // The comment is not part of what the assembler reads, even when it is glued on.
        assert_eq!(
            gemm[19].text,
            "v_mfma_f32_16x16x16_bf16 v[60:63], v[110:111], v[114:115], v[60:63]"
        );
        assert_eq!(gemm[19].target, None);
        // A branch into another function is no target of this one.
        assert_eq!(functions["nested"][3].target, None);
    }

    #[test]
    fn finds_the_main_loop_and_its_aligned_path() {
        let functions = functions(GEMM);
        let gemm = &functions["gemm_demo"];
        let found = main_loop(gemm).unwrap();
        // From the header to the last of its two latches; the epilogue's MFMA is outside.
        assert_eq!(found.body, 2..24);
        let path = found.aligned_path.unwrap();
        // The element-wise copy (its own exec-mask branch inside) is skipped, the 16-byte
        // load kept, the exit and the first latch fallen through.
        assert_eq!(
            mnemonics(gemm, path.iter().copied()),
            [
                "s_add_i32",
                "s_barrier",
                "s_cbranch_scc0",
                "s_and_saveexec_b64",
                "s_xor_b64",
                "s_cbranch_execz",
                "s_andn2_saveexec_b64",
                "s_cbranch_execz",
                "global_load_dwordx4",
                "s_or_b64",
                "ds_read2st64_b64",
                "s_waitcnt",
                "v_mfma_f32_16x16x16_bf16",
                "v_mfma_f32_16x16x16_bf16",
                "s_cbranch_vccnz",
                "ds_write_b128",
                "s_branch",
            ]
        );
    }

    #[test]
    fn the_innermost_loop_holding_mfmas_is_the_main_one() {
        let functions = functions(GEMM);
        let nested = &functions["nested"];
        let found = main_loop(nested).unwrap();
        assert_eq!(
            mnemonics(nested, found.body.clone()),
            [
                "v_mfma_f32_16x16x16_bf16",
                "s_cbranch_scc1",
                "s_cbranch_scc1"
            ]
        );
        // A straight loop has no second view.
        assert_eq!(found.aligned_path, None);
        // A loop without MFMAs is no main loop.
        assert_eq!(main_loop(&functions["unrolled"]), None);
    }

    #[test]
    fn counts_the_instruction_mix() {
        let functions = functions(GEMM);
        let gemm = &functions["gemm_demo"];
        let found = main_loop(gemm).unwrap();
        let body: Vec<&Instruction<'_>> = gemm[found.body].iter().collect();
        assert_eq!(
            InstructionMix::of(&body),
            InstructionMix {
                instructions: 22,
                mfma: 2,
                vector_memory: 2,
                lds: 2,
                scalar: 8,
                branches: 6,
                waits: 1,
                valu: 1,
                other: 0,
            }
        );
        let path: Vec<&Instruction<'_>> = found
            .aligned_path
            .unwrap()
            .into_iter()
            .map(|i| &gemm[i])
            .collect();
        let mix = InstructionMix::of(&path);
        assert_eq!((mix.instructions, mix.vector_memory, mix.valu), (17, 1, 0));
    }

    /// `llvm-mca -mcpu=gfx942 -iterations=100 --json` of three one-cycle instructions and one
    /// MFMA, as llvm-mca 22 writes it (the instruction info trimmed to what is read).
    const MCA_JSON: &str = r#"{"CodeRegions":[{"InstructionInfoView":{"InstructionList":[
        {"Instruction":0,"Latency":1,"RThroughput":1},{"Instruction":1,"Latency":1,"RThroughput":1},
        {"Instruction":2,"Latency":1,"RThroughput":1},{"Instruction":3,"Latency":8,"RThroughput":4}]},
        "Instructions":["s_add_i32 s36, s36, 32","v_lshl_add_u64 v[86:87], v[86:87], 0, 64",
        "v_lshl_add_u64 v[90:91], v[90:91], 0, 64",
        "v_mfma_f32_16x16x16_bf16 v[60:63], v[110:111], v[114:115], v[60:63]"],"Name":"",
        "ResourcePressureView":{"ResourcePressureInfo":[
        {"InstructionIndex":0,"ResourceIndex":3,"ResourceUsage":1},
        {"InstructionIndex":1,"ResourceIndex":4,"ResourceUsage":1},
        {"InstructionIndex":2,"ResourceIndex":4,"ResourceUsage":1},
        {"InstructionIndex":3,"ResourceIndex":6,"ResourceUsage":4},
        {"InstructionIndex":4,"ResourceIndex":3,"ResourceUsage":1},
        {"InstructionIndex":4,"ResourceIndex":4,"ResourceUsage":2},
        {"InstructionIndex":4,"ResourceIndex":6,"ResourceUsage":4}]},
        "SummaryView":{"BlockRThroughput":4,"DispatchWidth":1,"Instructions":400,"Iterations":100,
        "TotalCycles":404,"TotaluOps":400}}],
        "SimulationParameters":{"-march":"amdgcn","-mcpu":"gfx942","-mtriple":"amdgcn-amd-amdhsa"},
        "TargetInfo":{"CPUName":"gfx942","Resources":["HWBranch","HWExport","HWLGKM","HWSALU",
        "HWVALU","HWVMEM","HWXDL"]}}"#;

    #[test]
    fn reads_the_matrix_units_cycles_from_llvm_mca() {
        assert_eq!(
            simulation(MCA_JSON.as_bytes()).unwrap(),
            Simulation {
                cycles: 4.04,
                matrix_cycles: 4.0,
                mfma_cycles: 4.0,
                matrix_share: 4.0 / 4.04,
            }
        );
        let other_model = MCA_JSON.replace("\"HWXDL\"", "\"HWMatrix\"");
        let error = simulation(other_model.as_bytes()).unwrap_err();
        assert!(error.contains("names no matrix resource HWXDL"), "{error}");
        assert!(simulation(b"error: not json").is_err());
    }

    #[test]
    fn a_missing_tool_says_what_to_install() {
        let empty = tempfile::tempdir().unwrap();
        let error = find_tool("llvm-mca", Some(empty.path()))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("llvm-mca-22 not found") && error.contains("install llvm-22"),
            "{error}"
        );
    }

    /// The real llvm-mca (scripts/setup installs llvm-22) over the demo loop.
    #[test]
    fn simulates_a_loop_with_llvm_mca() {
        let tools = LlvmTools::discover().unwrap();
        let functions = functions(GEMM);
        let gemm = &functions["gemm_demo"];
        let body: Vec<&Instruction<'_>> = gemm[main_loop(gemm).unwrap().body].iter().collect();
        let simulation = simulate(&tools, "gfx942", &body).unwrap();
        assert_eq!(simulation.matrix_cycles, simulation.mfma_cycles);
        assert!(
            simulation.matrix_share > 0.0 && simulation.matrix_share <= 1.0,
            "{simulation:?}"
        );
        let bogus = Instruction {
            text: "v_bogus_op v0",
            ..gemm[2].clone()
        };
        let error = simulate(&tools, "gfx942", &[&bogus]).unwrap_err();
        assert!(error.contains("invalid instruction"), "{error}");
    }
}
