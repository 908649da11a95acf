//! Checking what the compiler made against what the manifest declared: every declared kernel
//! exists on every target, no undeclared kernel slipped in, each explicit argument has exactly
//! the declared type in the kernel's source (element type, signedness, and constness: a
//! `*const` pointer must be `const` in the source, which the compiler then keeps from being
//! written; see [`crate::probe`] for how the types are read), and the compiled code passes it
//! with the declared size, alignment and kind (pointer or value); and, for modules that ask
//! for it (`no_spills`), that no kernel spills registers or needs scratch memory.

use std::collections::BTreeMap;

use hk_code_object::{ArgKind, KernelFacts};
use hk_format::abi::{Param, ParamType};
use hk_format::target::TargetId;

use crate::manifest::Module;
use crate::probe::SourceParam;

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
        "kernel `{kernel}` on {target}: the signature probe found no type for it; a bug in hkpack: please report it"
    )]
    NoSourceTypes { kernel: String, target: TargetId },
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

/// The kernels of one module compiled for one target, checked: their facts in declaration
/// order, and what is allowed but probably wrong.
#[derive(Debug, Clone)]
pub struct Checked {
    pub kernels: Vec<KernelFacts>,
    /// One sentence each: a `*mut` argument the kernel never writes.
    pub warnings: Vec<String>,
}

/// Checks the facts of every kernel compiled for `target`, and their parameters as the source
/// declares them (`sources`, by kernel), against `module`'s declarations.
pub fn check(
    module: &Module,
    target: &TargetId,
    compiled: Vec<KernelFacts>,
    sources: &BTreeMap<String, Vec<SourceParam>>,
) -> Result<Checked, SignatureError> {
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
    let mut warnings = Vec::new();
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
        let source = sources
            .get(&decl.symbol)
            .ok_or_else(|| SignatureError::NoSourceTypes {
                kernel: decl.symbol.clone(),
                target: *target,
            })?;
        check_args(
            &decl.symbol,
            target,
            &decl.args,
            facts,
            source,
            &mut warnings,
        )?;
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
    Ok(Checked {
        kernels: ordered,
        warnings,
    })
}

fn check_args(
    kernel: &str,
    target: &TargetId,
    declared: &[Param],
    facts: &KernelFacts,
    source: &[SourceParam],
    warnings: &mut Vec<String>,
) -> Result<(), SignatureError> {
    for found in [facts.args.len(), source.len()] {
        if declared.len() != found {
            return Err(SignatureError::Count {
                kernel: kernel.to_owned(),
                target: *target,
                declared: declared.len(),
                found,
            });
        }
    }
    for (index, ((param, slot), source)) in declared.iter().zip(&facts.args).zip(source).enumerate()
    {
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
        // The compiled layout agrees; now the exact type, which it cannot tell.
        match check_source_type(param.ty, source) {
            SourceVerdict::Same => {}
            SourceVerdict::NeverWritten(found) => warnings.push(format!(
                "kernel `{kernel}` on {target}: argument {index} `{param}` is never written: the \
                 kernel's parameter is `{}`; declare it `{found}`",
                source.spelling,
            )),
            SourceVerdict::Mismatch(detail) => return fail(detail),
        }
    }
    Ok(())
}

/// How a declared type compares with the source's.
enum SourceVerdict {
    Same,
    /// Declared `*mut`, but the kernel takes a pointer to `const`: allowed, but a caller then
    /// hands over a writable buffer for nothing. Holds the type to declare.
    NeverWritten(ParamType),
    Mismatch(String),
}

fn check_source_type(declared: ParamType, source: &SourceParam) -> SourceVerdict {
    let spelling = &source.spelling;
    let Some(found) = source.ty else {
        return SourceVerdict::Mismatch(format!(
            "is declared `{declared}` but the kernel's parameter is `{spelling}`, which no \
             manifest type describes (use the types of the manifest's `args`)"
        ));
    };
    match (declared, found) {
        _ if declared == found => SourceVerdict::Same,
        (
            ParamType::Pointer {
                pointee,
                mutable: true,
            },
            ParamType::Pointer {
                pointee: source_pointee,
                mutable: false,
            },
        ) if pointee == source_pointee => SourceVerdict::NeverWritten(found),
        (
            ParamType::Pointer {
                pointee,
                mutable: false,
            },
            ParamType::Pointer {
                pointee: source_pointee,
                mutable: true,
            },
        ) if pointee == source_pointee => SourceVerdict::Mismatch(format!(
            "is declared `{declared}` but the kernel's parameter is `{spelling}`, which it may \
             write through: declare it `{found}`, or make the parameter `const`"
        )),
        _ => SourceVerdict::Mismatch(format!(
            "is declared `{declared}` but the kernel's parameter is `{spelling}` (`{found}`)"
        )),
    }
}

fn describe(kind: &ArgKind) -> String {
    match kind {
        ArgKind::GlobalBuffer => "a pointer (global buffer)".into(),
        ArgKind::ByValue => "a value".into(),
        ArgKind::DynamicSharedPointer => "a dynamic shared-memory pointer".into(),
        ArgKind::Other(kind) => format!("`{kind}`"),
    }
}
