//! The signature probe: every compiled kernel's parameter types exactly as its source declares
//! them, printed by clang itself, for the signature check ([`crate::signature`]).
//!
//! Why the source and not the compiled code: the code does not say. For HIP kernels clang 22's
//! AMD metadata gives each argument's value kind, size, offset and address space only
//! (`.type_name` and `.access` are written for OpenCL alone, and `.actual_access` for none of
//! our kernels' pointers); LLVM IR has opaque pointers and signless integers, and infers no
//! `readonly` on these kernels' pointers; PTX gives `.u64` for every pointer and no
//! signedness. Only the front end knows that a parameter is `const __bf16 *` and not
//! `_Float16 *` or `unsigned short *`, or `unsigned int` and not `int`. And whether a kernel
//! writes through a pointer is known, short of a cast, from its constness: `const T *` is
//! never written.
//!
//! How: after a job compiles, hkpack writes a probe that includes the kernel source and
//! declares a struct with one member per compiled kernel, of that kernel's function-pointer
//! type, and runs clang on it with the job's own flags and `-fsyntax-only`, asking for the
//! struct's layout with canonical types (`-fdump-record-layouts-canonical`): typedefs and
//! aliases resolved, one spelling per type. It takes about 0.1 s, a few percent of a job, and
//! its result is cached with the job's outputs.

use std::collections::BTreeMap;
use std::path::Path;

use hk_format::abi::{ParamType, ScalarType};

/// The struct the probe declares, whose layout clang prints.
const STRUCT: &str = "hk_kernel_signatures";

/// One kernel parameter as the source declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceParam {
    /// Clang's canonical spelling, e.g. `const __bf16 *`.
    pub spelling: String,
    /// The manifest's type for it, if the manifest has one.
    pub ty: Option<ParamType>,
}

/// The probe's source for `kernels`, compiled from `source` (an absolute path).
pub fn source(kernel_source: &Path, kernels: &[&str]) -> String {
    let members: String = kernels
        .iter()
        .map(|kernel| format!("  decltype(&{kernel}) {kernel};\n"))
        .collect();
    format!(
        "// Written by hkpack: each kernel's type, for clang to print with canonical types.\n\
         #include \"{}\"\n\
         struct {STRUCT} {{\n{members}}};\n\
         // Laying the struct out is what prints it.\n\
         static_assert(sizeof({STRUCT}) != 0, \"\");\n",
        kernel_source.display()
    )
}

/// The probe struct's part of what clang printed, or `None` if it is not there.
pub fn extract(dump: &str) -> Option<String> {
    let mut lines = dump.lines().skip_while(|line| !is_header(line));
    let header = lines.next()?;
    let members = lines.take_while(|line| !line.trim_start().starts_with("| ["));
    let block: Vec<&str> = std::iter::once(header).chain(members).collect();
    Some(block.join("\n") + "\n")
}

fn is_header(line: &str) -> bool {
    line.split_once('|')
        .is_some_and(|(_, rest)| rest.trim() == format!("struct {STRUCT}"))
}

/// Each kernel's parameters, from what [`extract`] kept.
pub fn parse(block: &str) -> Result<BTreeMap<String, Vec<SourceParam>>, String> {
    let mut kernels = BTreeMap::new();
    for line in block.lines().filter(|line| !is_header(line)) {
        let bad = || format!("the signature probe printed a line hkpack cannot read: `{line}`");
        let (_, member) = line.split_once('|').ok_or_else(bad)?;
        let (ty, name) = member.trim().rsplit_once(' ').ok_or_else(bad)?;
        let params = ty
            .strip_prefix("void (*)(")
            .and_then(|rest| rest.strip_suffix(')'))
            .ok_or_else(bad)?;
        let params = split_params(params)
            .map(|spelling| SourceParam {
                ty: manifest_type(spelling),
                spelling: spelling.to_owned(),
            })
            .collect();
        kernels.insert(name.to_owned(), params);
    }
    Ok(kernels)
}

/// The parameters in a C++ parameter list, split at the commas outside brackets (a parameter
/// of a template or function type has commas of its own).
fn split_params(list: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0i32;
    let mut start = 0;
    let mut params = Vec::new();
    for (at, c) in list.char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => {
                params.push(&list[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    params.push(&list[start..]);
    params
        .into_iter()
        .map(str::trim)
        .filter(|param| !param.is_empty())
}

/// The manifest's type for a parameter of canonical C++ type `spelling`: a scalar, or a
/// pointer to one, mutable unless it points to `const`. `None` for anything else (`char`,
/// whose signedness depends on the target; `bool`; `volatile`; pointers to pointers; ...).
fn manifest_type(spelling: &str) -> Option<ParamType> {
    // `__restrict` promises no aliasing; it does not change what is passed.
    let unrestricted = spelling.trim_end_matches("__restrict").trim_end();
    let Some(pointee) = unrestricted.strip_suffix('*') else {
        return scalar(unrestricted).map(ParamType::Scalar);
    };
    let pointee = pointee.trim_end();
    let (pointee, mutable) = match pointee.strip_prefix("const ") {
        Some(rest) => (rest, false),
        None => (pointee, true),
    };
    scalar(pointee).map(|pointee| ParamType::Pointer { pointee, mutable })
}

fn scalar(spelling: &str) -> Option<ScalarType> {
    // Both device targets are LP64: `long` and `long long` are 64 bits.
    Some(match spelling {
        "__bf16" => ScalarType::Bf16,
        "_Float16" => ScalarType::F16,
        "float" => ScalarType::F32,
        "double" => ScalarType::F64,
        "signed char" => ScalarType::I8,
        "unsigned char" => ScalarType::U8,
        "short" => ScalarType::I16,
        "unsigned short" => ScalarType::U16,
        "int" => ScalarType::I32,
        "unsigned int" => ScalarType::U32,
        "long" | "long long" => ScalarType::I64,
        "unsigned long" | "unsigned long long" => ScalarType::U64,
        // hk/fp8.h's scoped enums, one per format.
        "enum hk::fp8_e4m3fn" => ScalarType::Fp8E4m3fn,
        "enum hk::fp8_e4m3fnuz" => ScalarType::Fp8E4m3fnuz,
        "enum hk::fp8_e5m2" => ScalarType::Fp8E5m2,
        "enum hk::fp8_e5m2fnuz" => ScalarType::Fp8E5m2fnuz,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_clang_prints() {
        let dump = "\
*** Dumping AST Record Layout
         0 | struct other
         0 |   int x
*** Dumping AST Record Layout
         0 | struct hk_kernel_signatures
         0 |   void (*)(__bf16 *, const _Float16 *__restrict, float, unsigned long, char) a
         8 |   void (*)() b
           | [sizeof=16, dsize=16, align=8,
           |  nvsize=16, nvalign=8]
";
        let block = extract(dump).unwrap();
        let kernels = parse(&block).unwrap();
        let types = |name: &str| -> Vec<Option<String>> {
            kernels[name]
                .iter()
                .map(|p| p.ty.map(|t| t.to_string()))
                .collect()
        };
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(
            types("a"),
            [
                some("*mut bf16"),
                some("*const f16"),
                some("f32"),
                some("u64"),
                None
            ]
        );
        let fp8 = manifest_type("const enum hk::fp8_e4m3fnuz *__restrict").map(|t| t.to_string());
        assert_eq!(fp8.as_deref(), Some("*const fp8_e4m3fnuz"));
        assert_eq!(kernels["a"][1].spelling, "const _Float16 *__restrict");
        assert!(types("b").is_empty());
        assert_eq!(kernels.len(), 2);
        assert_eq!(extract("no probe here"), None);
        assert!(parse("   0 |   int (*)(int) c").is_err());
    }
}
