//! The resource report `ptxas -v` prints on stderr while it compiles PTX to a cubin: each
//! entry's registers, spill stores, static shared memory and stack. It is the only source of
//! those facts for NVIDIA, a line-oriented text of its own that is read after the PTX and
//! checked against it, so it has a reader of its own.

use std::collections::BTreeMap;

use super::{CodeObjectError, KernelFacts};

/// Adds the registers, spills, static shared memory and stack that `ptxas -v` reports (on
/// stderr) to the facts read from the PTX it compiled.
///
/// `private_segment_size` becomes the cumulative stack size, which includes called functions,
/// or the entry's own stack frame when ptxas reports no cumulative size (it leaves it out when
/// it is zero). Spills are the entry's own, counted as [`KernelFacts::vgpr_spill_count`] says. Every kernel must be in the report and every
/// entry in the report must be a kernel; on error `kernels` is left unchanged.
pub fn apply_ptxas_report(
    kernels: &mut [KernelFacts],
    report: &str,
) -> Result<(), CodeObjectError> {
    let functions = read_ptxas_report(report)?;
    if let Some((stranger, _)) = functions
        .iter()
        .find(|(name, f)| f.is_entry && !kernels.iter().any(|k| k.name == **name))
    {
        return Err(CodeObjectError::PtxasUnknownKernel {
            kernel: (*stranger).to_owned(),
        });
    }
    let mut updates = Vec::with_capacity(kernels.len());
    for kernel in kernels.iter() {
        let incomplete = |missing| CodeObjectError::PtxasIncomplete {
            kernel: kernel.name.clone(),
            missing,
        };
        let report = functions
            .get(kernel.name.as_str())
            .filter(|f| f.is_entry)
            .ok_or_else(|| incomplete("`Compiling entry function` line"))?;
        let registers = report
            .registers
            .ok_or_else(|| incomplete("register count (`Used N registers`)"))?;
        let frame = report
            .frame
            .ok_or_else(|| incomplete("stack frame and spills (`Function properties`)"))?;
        updates.push((registers, frame, report.shared, report.cumulative_stack));
    }
    for (kernel, (registers, frame, shared, cumulative_stack)) in kernels.iter_mut().zip(updates) {
        kernel.registers = Some(registers);
        kernel.vgpr_spill_count = frame.spill_stores.div_ceil(4);
        kernel.group_segment_size = shared;
        kernel.private_segment_size = cumulative_stack.unwrap_or(frame.stack);
    }
    Ok(())
}

/// What `ptxas -v` says about one function.
#[derive(Debug, Default)]
struct PtxasFunction {
    /// Named by `Compiling entry function`; other functions are callees.
    is_entry: bool,
    registers: Option<u32>,
    shared: u32,
    cumulative_stack: Option<u32>,
    frame: Option<PtxasFrame>,
}

/// The `N bytes stack frame, N bytes spill stores, N bytes spill loads` line; the loads
/// read back what the stores wrote and add nothing hkpack records.
#[derive(Debug, Clone, Copy)]
struct PtxasFrame {
    stack: u32,
    spill_stores: u32,
}

/// The functions of a report by name. The lines of one entry come as `Compiling entry function
/// 'name'`, then `Function properties for name` followed by its frame line, then `Used N
/// registers`; callees get properties and frame lines of their own in between.
fn read_ptxas_report(report: &str) -> Result<BTreeMap<&str, PtxasFunction>, CodeObjectError> {
    let mut functions: BTreeMap<&str, PtxasFunction> = BTreeMap::new();
    let mut entry = None;
    let mut properties_of = None;
    for (index, line) in report.lines().enumerate() {
        let syntax = |message: String| CodeObjectError::PtxasReportSyntax {
            line: index + 1,
            message,
        };
        let text = line.trim();
        if is_ptxas_failure(text) {
            return Err(CodeObjectError::PtxasFailed {
                message: text.to_owned(),
            });
        }
        let info = text
            .strip_prefix("ptxas info")
            .and_then(|rest| rest.trim_start().strip_prefix(':'))
            .map(str::trim);
        if let Some(info) = info {
            if let Some(rest) = info.strip_prefix("Compiling entry function ") {
                let name = rest
                    .strip_prefix('\'')
                    .and_then(|quoted| quoted.split_once('\''))
                    .map(|(name, _)| name)
                    .ok_or_else(|| syntax("the entry name is not in quotes".into()))?;
                let function = functions.entry(name).or_default();
                if function.is_entry {
                    return Err(syntax(format!("entry `{name}` is reported twice")));
                }
                function.is_entry = true;
                entry = Some(name);
            } else if let Some(name) = info.strip_prefix("Function properties for ") {
                properties_of = Some(name.trim());
            } else if info.starts_with("Used ") {
                let name = entry.ok_or_else(|| {
                    syntax("register usage comes before any `Compiling entry function`".into())
                })?;
                read_usage(info, functions.entry(name).or_default()).map_err(syntax)?;
            }
        } else if text.contains("bytes stack frame") {
            let name = properties_of.ok_or_else(|| {
                syntax("a stack frame line comes before any `Function properties for`".into())
            })?;
            functions.entry(name).or_default().frame = Some(read_frame(text).map_err(syntax)?);
        }
    }
    Ok(functions)
}

/// ptxas starts the lines about problems with `ptxas fatal :`, `ptxas error :` or
/// `ptxas FILE, line N; error :`; its other lines say `info` or `warning` there.
fn is_ptxas_failure(text: &str) -> bool {
    text.starts_with("ptxas")
        && text.split_once(':').is_some_and(|(severity, _)| {
            let severity = severity.trim_end();
            severity.ends_with("error") || severity.ends_with("fatal")
        })
}

/// Reads `Used N registers, used N barriers, N bytes smem, N bytes cumulative stack size, ...`.
fn read_usage(info: &str, function: &mut PtxasFunction) -> Result<(), String> {
    for item in info.split(',').map(str::trim) {
        if let Some(count) = item
            .strip_prefix("Used ")
            .and_then(|rest| rest.strip_suffix(" registers"))
        {
            function.registers = Some(ptxas_count(count, item)?);
        } else if let Some((count, unit)) = item.split_once(' ') {
            match unit {
                "bytes smem" => function.shared = ptxas_count(count, item)?,
                "bytes cumulative stack size" => {
                    function.cumulative_stack = Some(ptxas_count(count, item)?);
                }
                // Barriers, constant banks and anything newer say nothing hkpack records.
                _ => {}
            }
        }
    }
    if function.registers.is_none() {
        return Err(format!("`{info}` has no `Used N registers`"));
    }
    Ok(())
}

/// Reads `N bytes stack frame, N bytes spill stores, N bytes spill loads`.
fn read_frame(text: &str) -> Result<PtxasFrame, String> {
    let mut stack = None;
    let mut spill_stores = None;
    for item in text.split(',').map(str::trim) {
        match item.split_once(' ') {
            Some((count, "bytes stack frame")) => stack = Some(ptxas_count(count, item)?),
            Some((count, "bytes spill stores")) => spill_stores = Some(ptxas_count(count, item)?),
            _ => {}
        }
    }
    match (stack, spill_stores) {
        (Some(stack), Some(spill_stores)) => Ok(PtxasFrame {
            stack,
            spill_stores,
        }),
        _ => Err(format!(
            "`{text}` does not give both the stack frame and the spill stores"
        )),
    }
}

fn ptxas_count(count: &str, item: &str) -> Result<u32, String> {
    count
        .parse()
        .map_err(|_| format!("`{item}` does not start with a byte or register count"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_ptx_entries;
    use crate::tests::{NVIDIA_KERNELS, PTXAS_REPORT, compile_ptx, kernel};

    fn nvidia_kernels() -> Vec<KernelFacts> {
        read_ptx_entries(&compile_ptx(NVIDIA_KERNELS)).unwrap()
    }

    #[test]
    fn ptxas_report_adds_registers_spills_shared_memory_and_stack() {
        let mut kernels = nvidia_kernels();
        apply_ptxas_report(&mut kernels, PTXAS_REPORT).unwrap();
        let facts = |kernels: &[KernelFacts], name| {
            let k = kernel(kernels, name);
            (
                k.registers,
                k.sgpr_spill_count,
                k.vgpr_spill_count,
                k.group_segment_size,
                k.private_segment_size,
            )
        };
        assert_eq!(facts(&kernels, "axpy"), (Some(10), 0, 0, 0, 0));
        assert_eq!(facts(&kernels, "mixed"), (Some(12), 0, 0, 1024, 0));
        assert_eq!(facts(&kernels, "aligned"), (Some(8), 0, 0, 0, 0));
        // Held to 32 registers, `spills` stores 776 bytes of spills; they make its stack frame.
        assert_eq!(facts(&kernels, "spills"), (Some(32), 0, 194, 0, 416));
        // `caller` got its callee's local array inlined; the cumulative stack size counts it.
        assert_eq!(facts(&kernels, "caller"), (Some(15), 0, 0, 0, 256));
        assert_eq!(kernel(&kernels, "spills").max_flat_workgroup_size, 1024);

        // A partial register's worth of spill stores still counts as one register.
        let mut kernels = nvidia_kernels();
        let report = PTXAS_REPORT.replace("776 bytes spill stores", "777 bytes spill stores");
        apply_ptxas_report(&mut kernels, &report).unwrap();
        assert_eq!(facts(&kernels, "spills"), (Some(32), 0, 195, 0, 416));
    }

    #[test]
    fn ptxas_report_must_match_the_ptx() {
        let kernels = nvidia_kernels();
        let apply = |report: &str| {
            let mut copy = kernels.clone();
            let result = apply_ptxas_report(&mut copy, report);
            assert_eq!(copy, kernels, "a failed report must change nothing");
            result.unwrap_err()
        };
        let syntax = |line: usize, message: &str| CodeObjectError::PtxasReportSyntax {
            line,
            message: message.into(),
        };
        let fatal = "ptxas fatal   : Unresolved extern function 'pick'";
        assert_eq!(
            apply(fatal),
            CodeObjectError::PtxasFailed {
                message: fatal.into()
            }
        );
        let error = "ptxas /tmp/k.ptx, line 12; error   : Unknown symbol 'x'";
        assert_eq!(
            apply(error),
            CodeObjectError::PtxasFailed {
                message: error.into()
            }
        );

        let without = |entry: &str| {
            let start = PTXAS_REPORT.find(&format!("'{entry}'")).unwrap();
            let start = PTXAS_REPORT[..start].rfind("ptxas info").unwrap();
            let end = start + PTXAS_REPORT[start..].find("Compile time").unwrap();
            format!("{}{}", &PTXAS_REPORT[..start], &PTXAS_REPORT[end..])
        };
        assert_eq!(
            apply(&without("mixed")),
            CodeObjectError::PtxasIncomplete {
                kernel: "mixed".into(),
                missing: "`Compiling entry function` line"
            }
        );
        assert_eq!(
            apply(&PTXAS_REPORT.replace("Used 12 registers", "Used 12 regs")),
            syntax(
                22,
                "`Used 12 regs, used 1 barriers, 1024 bytes smem` has no `Used N registers`"
            )
        );
        let no_frame = PTXAS_REPORT.replace(
            "Function properties for mixed",
            "Function properties for gone",
        );
        assert_eq!(
            apply(&no_frame),
            CodeObjectError::PtxasIncomplete {
                kernel: "mixed".into(),
                missing: "stack frame and spills (`Function properties`)",
            }
        );
        let registerless = PTXAS_REPORT
            .lines()
            .filter(|line| !line.contains("Used 8 registers"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            apply(&registerless),
            CodeObjectError::PtxasIncomplete {
                kernel: "aligned".into(),
                missing: "register count (`Used N registers`)"
            }
        );
        assert_eq!(
            apply(&PTXAS_REPORT.replace("'axpy'", "'saxpy'")),
            CodeObjectError::PtxasUnknownKernel {
                kernel: "saxpy".into()
            }
        );
        // A kernel may be called `error` without the report reading as a failure.
        assert_eq!(
            apply(&PTXAS_REPORT.replace("axpy", "error")),
            CodeObjectError::PtxasUnknownKernel {
                kernel: "error".into()
            }
        );
        assert_eq!(
            apply(&PTXAS_REPORT.replace("'axpy'", "axpy")),
            syntax(24, "the entry name is not in quotes")
        );
        assert_eq!(
            apply(&format!(
                "{PTXAS_REPORT}ptxas info    : Compiling entry function 'axpy' for 'sm_90'\n"
            )),
            syntax(29, "entry `axpy` is reported twice")
        );
        assert_eq!(
            apply("ptxas info    : Used 10 registers"),
            syntax(
                1,
                "register usage comes before any `Compiling entry function`"
            )
        );
        assert_eq!(
            apply("    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"),
            syntax(
                1,
                "a stack frame line comes before any `Function properties for`"
            )
        );
        assert_eq!(
            apply(&PTXAS_REPORT.replace("Used 10 registers", "Used ten registers")),
            syntax(
                27,
                "`Used ten registers` does not start with a byte or register count"
            )
        );
        assert_eq!(
            apply(&PTXAS_REPORT.replace("776 bytes spill stores", "many bytes spill stores")),
            syntax(
                11,
                "`many bytes spill stores` does not start with a byte or register count"
            )
        );
        assert_eq!(
            apply(&PTXAS_REPORT.replace("1024 bytes smem", "1k bytes smem")),
            syntax(
                22,
                "`1k bytes smem` does not start with a byte or register count"
            )
        );
        assert_eq!(
            apply(&PTXAS_REPORT.replace("256 bytes cumulative", "-1 bytes cumulative")),
            syntax(
                5,
                "`-1 bytes cumulative stack size` does not start with a byte or register count"
            )
        );
        assert_eq!(
            apply(&PTXAS_REPORT.replace("776 bytes spill stores, ", "")),
            syntax(
                11,
                "`416 bytes stack frame, 800 bytes spill loads` does not give both the stack frame \
                 and the spill stores"
            )
        );
    }
}
