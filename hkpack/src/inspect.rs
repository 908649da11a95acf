//! `hkpack inspect`: what a bundle holds, one row per (module, target, kernel), from its
//! manifest: code size, registers, shared memory (LDS), scratch, spills, wave size, and each
//! kernel's launch contract (`--kernel NAME` shows one kernel whole); and the check of its
//! module files that `inspect` and `explain` make, since what they print is about those files
//! but comes from the index alone. [`main_loop`]: what the AMD matrix kernels' main loops
//! do, statically (`--main-loops`).

pub mod main_loop;

use std::fmt;
use std::path::Path;

use serde::Serialize;

use hk_format::abi::Param;
use hk_format::contract::Contract;
use hk_format::target::TargetId;
use hkload::Bundle;

/// One row of the inspection table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub module: String,
    pub target: TargetId,
    pub kernel: String,
    /// Bytes of the code image the target runs (code object or cubin; PTX if that is all).
    pub code_bytes: u64,
    /// AMD: scalar, vector and accumulation registers; NVIDIA: registers per thread.
    pub registers: String,
    pub lds_bytes: u32,
    pub scratch_bytes: u32,
    pub spills: u32,
    pub wave_size: u32,
    /// The kernel's launch contract (the same on every target), if it has one.
    pub contract: Option<Contract>,
}

/// The rows for `bundle`, modules and kernels in manifest order, targets in build order.
pub fn rows(bundle: &Bundle) -> Result<Vec<Row>, hkload::Error> {
    let manifest = bundle.manifest()?;
    let mut rows = Vec::new();
    for module in &manifest.modules {
        for target in &manifest.targets {
            // The first entry for a target is the one it runs natively: the code object,
            // or the cubin ahead of the PTX.
            let code_bytes = module
                .entries
                .iter()
                .find(|e| e.id.target() == *target)
                .map_or(0, |e| e.size);
            for symbol in &module.kernels {
                let kernel = bundle.kernel_record(symbol)?;
                let Some(abi) = kernel.abi_for(target) else {
                    continue;
                };
                let registers = match (abi.sgpr_count, abi.vgpr_count, abi.registers) {
                    (_, _, Some(r)) => r.to_string(),
                    (Some(s), Some(v), None) => {
                        format!("s{s} v{v} a{}", abi.agpr_count.unwrap_or(0))
                    }
                    _ => "-".into(),
                };
                rows.push(Row {
                    module: module.name.clone(),
                    target: *target,
                    kernel: kernel.symbol.clone(),
                    code_bytes,
                    registers,
                    lds_bytes: abi.group_segment_size,
                    scratch_bytes: abi.private_segment_size,
                    spills: abi.spills,
                    wave_size: abi.wavefront_size,
                    contract: kernel.contract.clone(),
                });
            }
        }
    }
    Ok(rows)
}

/// The rows as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let header = [
        "module",
        "target",
        "kernel",
        "code",
        "registers",
        "lds",
        "scratch",
        "spills",
        "wave",
    ]
    .map(String::from);
    let cells: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            [
                r.module.clone(),
                r.target.to_string(),
                r.kernel.clone(),
                r.code_bytes.to_string(),
                r.registers.clone(),
                r.lds_bytes.to_string(),
                r.scratch_bytes.to_string(),
                r.spills.to_string(),
                r.wave_size.to_string(),
            ]
        })
        .collect();
    aligned_columns(std::iter::once(&header.map(String::from)).chain(&cells), 3)
}

/// What `inspect --json` prints: the table's rows, and the targets modules skip on purpose.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub rows: Vec<Row>,
    pub not_built: Vec<NotBuiltRow>,
}

/// A target a module skips on purpose, with the manifest's reason.
#[derive(Debug, Clone, Serialize)]
pub struct NotBuiltRow {
    pub module: String,
    pub target: TargetId,
    pub reason: String,
}

impl fmt::Display for NotBuiltRow {
    /// `module fp8_gemm is not built for sm_80: no FP8 tensor-core instruction before sm_89`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "module {} is not built for {}: {}",
            self.module, self.target, self.reason
        )
    }
}

/// Every target a module of `bundle` skips on purpose, modules in manifest order.
pub fn not_built(bundle: &Bundle) -> Result<Vec<NotBuiltRow>, hkload::Error> {
    Ok(bundle
        .manifest()?
        .modules
        .iter()
        .flat_map(|module| {
            module.not_built.iter().map(|skipped| NotBuiltRow {
                module: module.name.clone(),
                target: skipped.target,
                reason: skipped.reason.clone(),
            })
        })
        .collect())
}

/// One kernel whole: its signature, its contract, and its rows of the table.
#[derive(Debug, Clone, Serialize)]
pub struct KernelView {
    pub symbol: String,
    pub module: String,
    pub args: Vec<Param>,
    pub contract: Option<Contract>,
    pub targets: Vec<Row>,
}

/// The kernel `symbol` of `bundle`.
pub fn kernel(bundle: &Bundle, symbol: &str) -> Result<KernelView, hkload::Error> {
    let record = bundle.kernel_record(symbol)?;
    let targets: Vec<Row> = rows(bundle)?
        .into_iter()
        .filter(|row| row.kernel == symbol)
        .map(|row| Row {
            contract: None,
            ..row
        })
        .collect();
    Ok(KernelView {
        symbol: symbol.to_owned(),
        module: targets
            .first()
            .map_or_else(String::new, |r| r.module.clone()),
        args: record.args.clone(),
        contract: record.contract.clone(),
        targets,
    })
}

impl fmt::Display for KernelView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args: Vec<String> = self.args.iter().map(Param::to_string).collect();
        writeln!(f, "kernel {} (module {})", self.symbol, self.module)?;
        writeln!(f, "  signature: ({})", args.join(", "))?;
        match &self.contract {
            None => writeln!(
                f,
                "  no launch contract: it launches only with explicit dimensions"
            )?,
            Some(contract) => {
                writeln!(f, "  contract:")?;
                for binding in &contract.lets {
                    writeln!(f, "    let {binding}")?;
                }
                for requirement in &contract.requires {
                    writeln!(
                        f,
                        "    requires {}  ({})",
                        requirement.check, requirement.message
                    )?;
                }
                let axes = |e: &[hk_format::contract::Expr; 3]| {
                    e.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                writeln!(f, "    block [{}]", axes(&contract.block))?;
                writeln!(f, "    grid [{}]", axes(&contract.grid))?;
                writeln!(f, "    shared {} bytes", contract.shared)?;
                for extent in &contract.extents {
                    writeln!(
                        f,
                        "    {} holds at least {} elements",
                        extent.name, extent.value
                    )?;
                }
            }
        }
        writeln!(f)?;
        f.write_str(&table(&self.targets))
    }
}

/// What is wrong with the module files of `bundle` (the folder `dir`), one sentence per
/// damaged file: each must have the size and SHA-256 the manifest records for it. Empty when
/// every file is intact.
pub fn damaged_module_files(bundle: &Bundle, dir: &Path) -> Result<Vec<String>, hkload::Error> {
    Ok(bundle
        .manifest()?
        .modules
        .iter()
        .filter_map(|module| {
            crate::verify::module_bytes(dir, module)
                .err()
                .map(|problem| {
                    format!("module file {} {problem}", dir.join(&module.file).display())
                })
        })
        .collect())
}

/// Rows of cells as text, each column as wide as its widest cell: the first `names` columns
/// left-aligned, the numbers after them right-aligned.
pub(crate) fn aligned_columns<'a, R>(
    rows: impl IntoIterator<Item = &'a R> + Clone,
    names: usize,
) -> String
where
    R: AsRef<[String]> + 'a + ?Sized,
{
    let mut widths: Vec<usize> = Vec::new();
    for row in rows.clone() {
        for (i, cell) in row.as_ref().iter().enumerate() {
            if i == widths.len() {
                widths.push(0);
            }
            widths[i] = widths[i].max(cell.len());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .as_ref()
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &w))| {
                if i < names {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
