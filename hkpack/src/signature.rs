//! Checking what the compiler made against what the manifest declared: every declared kernel
//! exists on every target, no undeclared kernel slipped in, and each explicit argument has the
//! declared size, alignment and kind (pointer or value); and, for modules that ask for it
//! (`no_spills`), that no kernel spills registers or needs scratch memory.

use hkload::abi::{Param, ParamType};
use hkload::code_object::{ArgKind, KernelFacts};
use hkload::target::TargetId;

use crate::manifest::Module;

/// A compiled kernel that does not match its declaration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error(
        "kernel `{kernel}` is declared in {manifest} but the code for {target} has no such kernel (it has: {found}); is it `extern \"C\"` and `__global__`?"
    )]
    Missing {
        kernel: String,
        target: TargetId,
        manifest: String,
        found: String,
    },
    #[error(
        "the code for {target} of module `{module}` has kernel `{kernel}`, which {manifest} does not declare; add a [[kernel]] entry for it"
    )]
    Undeclared {
        kernel: String,
        module: String,
        target: TargetId,
        manifest: String,
    },
    #[error(
        "kernel `{kernel}` on {target}: the manifest declares {declared} arguments, the compiled kernel takes {found}"
    )]
    Count {
        kernel: String,
        target: TargetId,
        declared: usize,
        found: usize,
    },
    #[error(
        "kernel `{kernel}` on {target} spills {spills} registers and needs {scratch} bytes of scratch per thread, but module `{module}` says no_spills = true in {manifest}"
    )]
    Spills {
        kernel: String,
        module: String,
        target: TargetId,
        manifest: String,
        spills: u32,
        scratch: u32,
    },
    #[error("kernel `{kernel}` on {target}: argument {index} `{param}` {detail}")]
    Argument {
        kernel: String,
        target: TargetId,
        index: usize,
        param: String,
        detail: String,
    },
}

/// Checks the facts of every kernel compiled for `target` against `module`'s declarations and
/// returns them in declaration order.
pub fn check(
    module: &Module,
    target: &TargetId,
    compiled: Vec<KernelFacts>,
) -> Result<Vec<KernelFacts>, SignatureError> {
    let manifest = module.manifest.display().to_string();
    if let Some(extra) = compiled
        .iter()
        .find(|k| !module.kernels.iter().any(|d| d.symbol == k.name))
    {
        return Err(SignatureError::Undeclared {
            kernel: extra.name.clone(),
            module: module.name.clone(),
            target: *target,
            manifest,
        });
    }
    let mut ordered = Vec::with_capacity(module.kernels.len());
    for decl in &module.kernels {
        let facts = compiled
            .iter()
            .find(|k| k.name == decl.symbol)
            .ok_or_else(|| SignatureError::Missing {
                kernel: decl.symbol.clone(),
                target: *target,
                manifest: manifest.clone(),
                found: compiled
                    .iter()
                    .map(|k| k.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        check_args(&decl.symbol, target, &decl.args, facts)?;
        let spills = facts.sgpr_spill_count + facts.vgpr_spill_count;
        if module.no_spills && (spills > 0 || facts.private_segment_size > 0) {
            return Err(SignatureError::Spills {
                kernel: decl.symbol.clone(),
                module: module.name.clone(),
                target: *target,
                manifest: manifest.clone(),
                spills,
                scratch: facts.private_segment_size,
            });
        }
        ordered.push(facts.clone());
    }
    Ok(ordered)
}

fn check_args(
    kernel: &str,
    target: &TargetId,
    declared: &[Param],
    facts: &KernelFacts,
) -> Result<(), SignatureError> {
    if declared.len() != facts.args.len() {
        return Err(SignatureError::Count {
            kernel: kernel.to_owned(),
            target: *target,
            declared: declared.len(),
            found: facts.args.len(),
        });
    }
    for (index, (param, slot)) in declared.iter().zip(&facts.args).enumerate() {
        let fail = |detail: String| {
            Err(SignatureError::Argument {
                kernel: kernel.to_owned(),
                target: *target,
                index,
                param: param.to_string(),
                detail,
            })
        };
        let kind_ok = matches!(
            (&param.ty, &slot.kind),
            (ParamType::Pointer { .. }, ArgKind::GlobalBuffer)
                | (ParamType::Scalar(_), ArgKind::ByValue)
        );
        if !kind_ok {
            let declared_kind = if param.ty.is_pointer() {
                "a pointer"
            } else {
                "a value"
            };
            return fail(format!(
                "is declared as {declared_kind} but compiled as {}",
                describe(&slot.kind)
            ));
        }
        if slot.size != param.ty.size() {
            return fail(format!(
                "is declared {} bytes but compiled as {} bytes",
                param.ty.size(),
                slot.size
            ));
        }
        if slot.offset % param.ty.align() != 0 {
            return fail(format!(
                "sits at offset {}, not a multiple of its alignment {}",
                slot.offset,
                param.ty.align()
            ));
        }
    }
    Ok(())
}

fn describe(kind: &ArgKind) -> String {
    match kind {
        ArgKind::GlobalBuffer => "a pointer (global buffer)".into(),
        ArgKind::ByValue => "a value".into(),
        ArgKind::DynamicSharedPointer => "a dynamic shared-memory pointer".into(),
        ArgKind::Other(kind) => format!("`{kind}`"),
    }
}
