//! PTX text, as far as kernel entries go: a lexer that is exact for entry headers, and a
//! reader of each `.entry`'s parameter list (laid out by natural or declared alignment) and
//! its `.maxntid` / `.reqntid`. PTX is NVIDIA's only record of a kernel's argument layout, and
//! a text format unlike the binary ones beside it; the resources come later, from `ptxas`.

use std::iter::Peekable;

use super::{ArgKind, ArgSlot, CodeObjectError, KernelFacts};

/// Every NVIDIA GPU since Fermi caps a block at 1024 threads.
const CUDA_MAX_THREADS_PER_BLOCK: u32 = 1024;
const NVIDIA_WARP_SIZE: u32 = 32;

/// Reads the kernel entries of a PTX module and lays out their parameter slots.
///
/// Each `.entry name( .param ... )` gives one [`KernelFacts`]. A parameter sits at the next
/// multiple of its alignment: the `.align N` written before its type, or else the size of its
/// type (`.align` after `.ptr` is the alignment of the pointee and does not move the slot).
/// `.maxntid` and `.reqntid` lower `max_flat_workgroup_size` from 1024. Registers, spills,
/// shared memory and stack are not in the PTX: [`apply_ptxas_report`] adds them.
///
/// [`apply_ptxas_report`]: super::apply_ptxas_report
pub fn read_ptx_entries(ptx: &str) -> Result<Vec<KernelFacts>, CodeObjectError> {
    let mut tokens = Lexer::new(ptx).peekable();
    // The PTX ISA requires `.version` to be the first directive of a module.
    if tokens.next().is_none_or(|token| token.text != ".version") {
        return Err(CodeObjectError::NotPtx);
    }
    let mut kernels: Vec<KernelFacts> = Vec::new();
    while let Some(token) = tokens.next() {
        if token.text != ".entry" {
            continue;
        }
        let Some(kernel) = read_entry(&mut tokens, token.line)? else {
            continue;
        };
        if kernels.iter().any(|known| known.name == kernel.name) {
            return Err(CodeObjectError::DuplicateKernel {
                kernel: kernel.name,
            });
        }
        kernels.push(kernel);
    }
    Ok(kernels)
}

/// One PTX token and the line it starts on.
#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    text: &'a str,
    line: usize,
}

/// The characters that are tokens on their own in the parts of PTX this module reads.
const PUNCTUATION: &[char] = &['(', ')', ',', '[', ']', '{', '}', ';'];

/// Splits PTX into words, punctuation and string literals, dropping comments. It only has to
/// be exact for entry headers; instruction bodies come out as harmless words.
struct Lexer<'a> {
    rest: &'a str,
    line: usize,
}

impl<'a> Lexer<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            rest: text,
            line: 1,
        }
    }

    fn skip_space_and_comments(&mut self) {
        loop {
            let trimmed = self.rest.trim_start();
            let skipped = self.rest.len() - trimmed.len();
            self.line += self.rest.get(..skipped).map_or(0, newlines);
            self.rest = trimmed;
            if let Some(comment) = self.rest.strip_prefix("//") {
                self.rest = comment.split_once('\n').map_or("", |(_, after)| after);
                self.line += 1;
            } else if let Some(comment) = self.rest.strip_prefix("/*") {
                let (comment, after) = comment.split_once("*/").unwrap_or((comment, ""));
                self.line += newlines(comment);
                self.rest = after;
            } else {
                return;
            }
        }
    }
}

fn newlines(text: &str) -> usize {
    text.bytes().filter(|&b| b == b'\n').count()
}

impl<'a> Iterator for Lexer<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        self.skip_space_and_comments();
        let first = self.rest.chars().next()?;
        let len = if let Some(literal) = self.rest.strip_prefix('"') {
            literal.find('"').map_or(self.rest.len(), |end| end + 2)
        } else if PUNCTUATION.contains(&first) {
            1
        } else {
            word_len(self.rest)
        };
        let (text, rest) = self.rest.split_at(len);
        let token = Token {
            text,
            line: self.line,
        };
        self.line += newlines(text);
        self.rest = rest;
        Some(token)
    }
}

/// Length of the word at the start of `text`, which does not start with space, punctuation,
/// a quote or a comment.
fn word_len(text: &str) -> usize {
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let comment = c == '/' && matches!(chars.peek(), Some((_, '/' | '*')));
        if at > 0 && (c.is_whitespace() || PUNCTUATION.contains(&c) || c == '"' || comment) {
            return at;
        }
    }
    text.len()
}

fn is_word(text: &str) -> bool {
    !text.starts_with(PUNCTUATION) && !text.starts_with('"')
}

fn ptx_syntax(line: usize, message: String) -> CodeObjectError {
    CodeObjectError::PtxSyntax { line, message }
}

/// Reads an entry header after `.entry`; `None` for a prototype, which ends in `;`.
fn read_entry(
    tokens: &mut Peekable<Lexer<'_>>,
    line: usize,
) -> Result<Option<KernelFacts>, CodeObjectError> {
    let name = match tokens.next() {
        Some(token) if is_word(token.text) => token.text,
        _ => {
            return Err(ptx_syntax(
                line,
                "`.entry` is not followed by a kernel name".into(),
            ));
        }
    };
    let params = if tokens.next_if(|token| token.text == "(").is_some() {
        read_params(tokens, name, line)?
    } else {
        Vec::new()
    };
    let mut max_flat_workgroup_size = CUDA_MAX_THREADS_PER_BLOCK;
    loop {
        let Some(token) = tokens.next() else {
            return Err(ptx_syntax(line, format!("entry `{name}` has no body")));
        };
        match token.text {
            "{" => break,
            // A prototype; the definition comes elsewhere.
            ";" => return Ok(None),
            // `.pragma "...";` may sit between the header and the body; its `;` ends only it.
            ".pragma" => while tokens.next().is_some_and(|token| token.text != ";") {},
            ".entry" | ".func" | "}" => {
                return Err(ptx_syntax(line, format!("entry `{name}` has no body")));
            }
            ".maxntid" | ".reqntid" => {
                let threads = read_thread_count(tokens, token, name)?;
                max_flat_workgroup_size = max_flat_workgroup_size.min(threads);
            }
            _ => {}
        }
    }

    let mut args = Vec::with_capacity(params.len());
    let mut end = 0u32;
    let mut kernarg_align = 1;
    for param in params {
        let offset = end
            .checked_next_multiple_of(param.align)
            .and_then(|offset| Some((offset, offset.checked_add(param.size)?)));
        let Some((offset, param_end)) = offset else {
            return Err(ptx_syntax(
                line,
                format!("the parameters of entry `{name}` take more than 4 GiB"),
            ));
        };
        end = param_end;
        kernarg_align = kernarg_align.max(param.align);
        args.push(ArgSlot {
            offset,
            size: param.size,
            kind: param.kind,
        });
    }
    Ok(Some(KernelFacts {
        name: name.to_owned(),
        args,
        kernarg_size: end,
        kernarg_align,
        sgpr_count: None,
        vgpr_count: None,
        agpr_count: None,
        registers: None,
        sgpr_spill_count: 0,
        vgpr_spill_count: 0,
        group_segment_size: 0,
        private_segment_size: 0,
        wavefront_size: NVIDIA_WARP_SIZE,
        max_flat_workgroup_size,
    }))
}

/// A parameter's slot before layout.
struct PtxParam {
    size: u32,
    align: u32,
    kind: ArgKind,
}

/// Reads the parameter list after its `(`, through the closing `)`.
fn read_params(
    tokens: &mut Peekable<Lexer<'_>>,
    kernel: &str,
    line: usize,
) -> Result<Vec<PtxParam>, CodeObjectError> {
    let mut params = Vec::new();
    let mut current = Vec::new();
    loop {
        let Some(token) = tokens.next() else {
            return Err(ptx_syntax(
                line,
                format!("the parameter list of entry `{kernel}` is not closed"),
            ));
        };
        match token.text {
            ")" if current.is_empty() && params.is_empty() => return Ok(params),
            ")" => {
                params.push(read_param(&current, kernel, params.len(), token.line)?);
                return Ok(params);
            }
            "," => {
                params.push(read_param(&current, kernel, params.len(), token.line)?);
                current.clear();
            }
            "{" | "}" | ";" => {
                return Err(ptx_syntax(
                    token.line,
                    format!(
                        "the parameter list of entry `{kernel}` is not closed before `{}`",
                        token.text
                    ),
                ));
            }
            _ => current.push(token),
        }
    }
}

/// Reads one `.param [.align N] .type [.ptr [.space] [.align N]] name[[count]]`.
fn read_param(
    tokens: &[Token<'_>],
    kernel: &str,
    index: usize,
    end_line: usize,
) -> Result<PtxParam, CodeObjectError> {
    let line = tokens.first().map_or(end_line, |token| token.line);
    let error = |what: String| {
        ptx_syntax(
            line,
            format!("parameter {index} of entry `{kernel}` {what}"),
        )
    };
    let mut tokens = tokens.iter();
    if tokens.next().is_none_or(|token| token.text != ".param") {
        return Err(error("does not start with `.param`".into()));
    }
    let mut slot_align = None;
    let mut element_size = None;
    // `Some(space)` once `.ptr` is seen; the space stays `None` for generic pointers.
    let mut pointer: Option<Option<&str>> = None;
    let mut name = None;
    let mut count = 1;
    while let Some(token) = tokens.next() {
        match token.text {
            ".align" => {
                let align = tokens
                    .next()
                    .and_then(|token| ptx_number(token.text))
                    .filter(|align| align.is_power_of_two())
                    .ok_or_else(|| error("has an `.align` that is not a power of two".into()))?;
                match (element_size, pointer) {
                    (None, _) => slot_align = Some(align),
                    // After `.ptr`, `.align` is the pointee's alignment; the slot keeps its own.
                    (Some(_), Some(_)) => {}
                    (Some(_), None) => {
                        return Err(error("has `.align` after its type, outside `.ptr`".into()));
                    }
                }
            }
            ".ptr" if element_size.is_some() && pointer.is_none() => pointer = Some(None),
            space @ (".global" | ".shared" | ".const" | ".local") if pointer == Some(None) => {
                pointer = Some(Some(space));
            }
            "[" => {
                count = tokens
                    .next()
                    .and_then(|token| ptx_number(token.text))
                    .filter(|&count| count > 0)
                    .ok_or_else(|| {
                        error("has an array length that is not a positive number".into())
                    })?;
                if tokens.next().is_none_or(|token| token.text != "]") {
                    return Err(error("has an array length without its closing `]`".into()));
                }
            }
            ty if ty.starts_with('.') && element_size.is_none() => {
                let size = ptx_type_size(ty).ok_or_else(|| {
                    error(format!("has type `{ty}`, which is not a parameter type"))
                })?;
                element_size = Some(size);
            }
            word if name.is_none() && is_word(word) && !word.starts_with('.') => name = Some(word),
            other => return Err(error(format!("has an unexpected `{other}`"))),
        }
    }
    let element_size = element_size.ok_or_else(|| error("has no type".into()))?;
    if name.is_none() {
        return Err(error("has no name".into()));
    }
    let size = element_size
        .checked_mul(count)
        .ok_or_else(|| error("is larger than 4 GiB".into()))?;
    let kind = match pointer {
        None => ArgKind::ByValue,
        Some(None | Some(".global")) => ArgKind::GlobalBuffer,
        // OpenCL's `__local` pointer arguments: the runtime points them into dynamic shared memory.
        Some(Some(".shared")) => ArgKind::DynamicSharedPointer,
        Some(Some(space)) => ArgKind::Other(format!("{}_pointer", space.trim_start_matches('.'))),
    };
    Ok(PtxParam {
        size,
        align: slot_align.unwrap_or(element_size),
        kind,
    })
}

/// Size in bytes of a PTX fundamental type that a kernel parameter may have.
fn ptx_type_size(ty: &str) -> Option<u32> {
    Some(match ty {
        ".b8" | ".u8" | ".s8" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        ".b128" => 16,
        _ => return None,
    })
}

/// A PTX integer literal as used in directives: decimal or `0x` hexadecimal.
fn ptx_number(text: &str) -> Option<u32> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Reads the `x[, y[, z]]` after `.maxntid` or `.reqntid` and returns the thread count.
fn read_thread_count(
    tokens: &mut Peekable<Lexer<'_>>,
    directive: Token<'_>,
    kernel: &str,
) -> Result<u32, CodeObjectError> {
    let error = || {
        ptx_syntax(
            directive.line,
            format!(
                "`{}` of entry `{kernel}` needs one to three positive thread counts",
                directive.text
            ),
        )
    };
    let mut threads = 1u32;
    for dimensions in 1..=3 {
        let extent = tokens
            .next()
            .and_then(|token| ptx_number(token.text))
            .filter(|&n| n > 0)
            .ok_or_else(error)?;
        threads = threads.checked_mul(extent).ok_or_else(error)?;
        if dimensions == 3 || tokens.next_if(|token| token.text == ",").is_none() {
            break;
        }
    }
    if tokens.peek().is_some_and(|token| token.text == ",") {
        return Err(error());
    }
    Ok(threads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{NVIDIA_KERNELS, compile_ptx, kernel, slot};

    #[test]
    fn lays_out_ptx_parameters_by_natural_or_declared_alignment() {
        let kernels = read_ptx_entries(&compile_ptx(NVIDIA_KERNELS)).unwrap();
        let names: Vec<_> = kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["axpy", "mixed", "aligned", "spills", "caller"]);
        use ArgKind::*;

        let axpy = kernel(&kernels, "axpy");
        assert_eq!(
            axpy.args,
            [
                slot(0, 4, ByValue),
                slot(8, 8, GlobalBuffer),
                slot(16, 8, GlobalBuffer),
                slot(24, 4, ByValue)
            ]
        );
        assert_eq!((axpy.kernarg_size, axpy.kernarg_align), (28, 8));

        // u16, then bf16 (`.align 2 .b8 [2]`), f32, two pointers, u64.
        let mixed = kernel(&kernels, "mixed");
        assert_eq!(
            mixed.args,
            [
                slot(0, 2, ByValue),
                slot(2, 2, ByValue),
                slot(4, 4, ByValue),
                slot(8, 8, GlobalBuffer),
                slot(16, 8, GlobalBuffer),
                slot(24, 8, ByValue),
            ]
        );
        assert_eq!(
            (mixed.kernarg_size, mixed.max_flat_workgroup_size),
            (32, 256)
        );

        // A 16-byte-aligned struct after a char skips to offset 16.
        let aligned = kernel(&kernels, "aligned");
        assert_eq!(
            aligned.args,
            [
                slot(0, 1, ByValue),
                slot(16, 16, ByValue),
                slot(32, 8, ByValue),
                slot(40, 8, GlobalBuffer)
            ]
        );
        assert_eq!((aligned.kernarg_size, aligned.kernarg_align), (48, 16));

        for k in &kernels {
            assert_eq!(k.wavefront_size, 32);
            assert_eq!(
                (k.registers, k.sgpr_count, k.agpr_count),
                (None, None, None)
            );
            assert_eq!((k.group_segment_size, k.private_segment_size), (0, 0));
        }
    }

    #[test]
    fn reads_hand_written_ptx_forms() {
        let ptx = r#"
            .version 8.0 /* a comment with .entry fake(
                over lines */
            .target sm_90
            .address_size 64
            // .entry commented( .param .u8 x )
            .visible .entry proto(.param .u32 n);
            .visible .entry none
            .reqntid 16, 16, 1
            .pragma "nounroll; {";
            { ret; }
            .entry empty() { { ret; } }
            .weak .entry pointers(
                .param .u64 .ptr .global .align 16 g,
                .param .u32 .ptr .shared .align 4 s,
                .param .u64 .ptr .const c,
                .param .b8 bytes[0xc],
                .param .align 0x8 .b16 half,
                .param .b128 wide
            )
            .maxntid 2048
            {
                ld.param.u64 %rd1, [g];
                ret;
            }
            .visible .entry proto(.param .u32 n) .maxntid 64 { ret; }
        "#;
        let kernels = read_ptx_entries(ptx).unwrap();
        let names: Vec<_> = kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["none", "empty", "pointers", "proto"]);
        let none = kernel(&kernels, "none");
        assert_eq!(
            (
                none.kernarg_size,
                none.kernarg_align,
                none.max_flat_workgroup_size
            ),
            (0, 1, 256)
        );
        assert!(kernel(&kernels, "empty").args.is_empty());
        let pointers = kernel(&kernels, "pointers");
        use ArgKind::*;
        assert_eq!(
            pointers.args,
            [
                slot(0, 8, GlobalBuffer),
                slot(8, 4, DynamicSharedPointer),
                slot(16, 8, Other("const_pointer".into())),
                slot(24, 12, ByValue),
                slot(40, 2, ByValue),
                slot(48, 16, ByValue),
            ]
        );
        assert_eq!((pointers.kernarg_size, pointers.kernarg_align), (64, 16));
        assert_eq!(pointers.max_flat_workgroup_size, 1024);
        assert_eq!(kernel(&kernels, "proto").max_flat_workgroup_size, 64);
    }

    #[test]
    fn ptx_errors_say_where_and_what() {
        let entry = |text: &str| read_ptx_entries(&format!(".version 8.0\n.target sm_90\n{text}"));
        let syntax = |line: usize, message: &str| {
            Err(CodeObjectError::PtxSyntax {
                line,
                message: message.into(),
            })
        };
        assert_eq!(
            read_ptx_entries(".target sm_90"),
            Err(CodeObjectError::NotPtx)
        );
        assert_eq!(read_ptx_entries(""), Err(CodeObjectError::NotPtx));
        assert_eq!(
            entry(".entry ( {}"),
            syntax(3, "`.entry` is not followed by a kernel name")
        );
        assert_eq!(
            entry(".entry"),
            syntax(3, "`.entry` is not followed by a kernel name")
        );
        assert_eq!(
            entry(".entry k(.param .u32 a"),
            syntax(3, "the parameter list of entry `k` is not closed")
        );
        assert_eq!(
            entry(".entry k(.param .u32 a\n{ ret; }"),
            syntax(
                4,
                "the parameter list of entry `k` is not closed before `{`"
            )
        );
        assert_eq!(
            entry(".entry k(.param .u32 a)"),
            syntax(3, "entry `k` has no body")
        );
        assert_eq!(
            entry(".entry k(.param .u32 a)\n.entry j() {}"),
            syntax(3, "entry `k` has no body")
        );
        let param = |text: &str| entry(&format!(".entry k(.param .u32 a,\n{text}) {{}}"));
        let param_error = |message: &str| syntax(4, &format!("parameter 1 of entry `k` {message}"));
        assert_eq!(
            param(""),
            syntax(4, "parameter 1 of entry `k` does not start with `.param`")
        );
        assert_eq!(
            param(".reg .u32 b"),
            param_error("does not start with `.param`")
        );
        assert_eq!(
            param(".param .align 3 .b8 b[3]"),
            param_error("has an `.align` that is not a power of two")
        );
        assert_eq!(
            param(".param .align"),
            param_error("has an `.align` that is not a power of two")
        );
        assert_eq!(
            param(".param .u32 .align 4 b"),
            param_error("has `.align` after its type, outside `.ptr`")
        );
        assert_eq!(
            param(".param .b8 b[0]"),
            param_error("has an array length that is not a positive number")
        );
        assert_eq!(
            param(".param .b8 b[4"),
            param_error("has an array length without its closing `]`")
        );
        assert_eq!(
            param(".param .pred b"),
            param_error("has type `.pred`, which is not a parameter type")
        );
        assert_eq!(
            param(".param .ptr .u64 b"),
            param_error("has type `.ptr`, which is not a parameter type")
        );
        assert_eq!(
            param(".param .u32 b c"),
            param_error("has an unexpected `c`")
        );
        assert_eq!(
            param(".param .u32 .u32 b"),
            param_error("has an unexpected `.u32`")
        );
        assert_eq!(param(".param b"), param_error("has no type"));
        assert_eq!(param(".param .u32"), param_error("has no name"));
        assert_eq!(
            param(".param .b64 b[0x80000000]"),
            param_error("is larger than 4 GiB")
        );
        assert_eq!(
            param(".param .b8 b[0xffffffff]"),
            syntax(3, "the parameters of entry `k` take more than 4 GiB")
        );
        assert_eq!(
            entry(".entry k() .maxntid 0 {}"),
            syntax(
                3,
                "`.maxntid` of entry `k` needs one to three positive thread counts"
            )
        );
        assert_eq!(
            entry(".entry k()\n.reqntid 65536, 65536 {}"),
            syntax(
                4,
                "`.reqntid` of entry `k` needs one to three positive thread counts"
            )
        );
        assert_eq!(
            entry(".entry k() .maxntid 1, 2, 3, 4 {}"),
            syntax(
                3,
                "`.maxntid` of entry `k` needs one to three positive thread counts"
            )
        );
        assert_eq!(
            entry(".entry k() {}\n.entry k() {}"),
            Err(CodeObjectError::DuplicateKernel { kernel: "k".into() })
        );
    }

    #[test]
    fn never_panics_on_truncated_or_corrupted_ptx() {
        let ptx = ".version 8.0\n.target sm_90 /* c */\n.visible .entry k(\n.param .align 16 .b8 q[16], // c\n.param .u64 .ptr .global .align 4 p\n)\n.maxntid 8, 8\n.pragma \"x\";\n{ ld.param.u64 %rd1, [p]; ret; }\n";
        assert_eq!(read_ptx_entries(ptx).unwrap().len(), 1);
        for len in 0..ptx.len() {
            let _ = read_ptx_entries(&ptx[..len]);
        }
        for at in 0..ptx.len() {
            for replacement in [
                "", " ", "\n", "(", ")", ",", "[", "]", "{", "}", ";", ".", "\"", "/", "*", "0",
                "x", "é",
            ] {
                let _ = read_ptx_entries(&format!("{}{replacement}{}", &ptx[..at], &ptx[at + 1..]));
            }
        }
    }
}
