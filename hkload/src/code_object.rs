//! Facts about compiled kernels, read from the compiler's own output.
//!
//! For every kernel on every target, hkpack records what a launch has to get right and what the
//! kernel costs: where each explicit argument sits in the argument buffer, how large and aligned
//! that buffer is, and the resources the kernel claims (registers, spills, shared memory, stack,
//! wave size, largest workgroup). This module owns reading those facts:
//!
//! * AMD, from a linked AMDGPU code object: its ELF header, its `NT_AMDGPU_METADATA` note (a
//!   MessagePack map) and its symbol table ([`read_amd_code_object`]);
//! * NVIDIA, from the PTX text, whose `.entry` parameter lists give the argument layout
//!   ([`read_ptx_entries`]), and from the resource report that `ptxas -v` prints while turning
//!   that PTX into a cubin ([`apply_ptxas_report`]).
//!
//! Every input is treated as untrusted: the readers check every offset, size and type, never
//! panic, and return a [`CodeObjectError`] that names the kernel and the key at fault.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::iter::Peekable;

use object::LittleEndian;
use object::elf;
use object::read::elf::{FileHeader, SectionHeader, SectionTable, Sym};
use rmpv::Value;
use serde::{Deserialize, Serialize};

/// How a kernel argument is passed, in the words of the AMDGPU metadata's `.value_kind`.
///
/// NVIDIA parameters are all slots in one parameter buffer; the PTX `.ptr` attribute marks the
/// pointers among them, which map to [`ArgKind::GlobalBuffer`] (generic or `.global`),
/// [`ArgKind::DynamicSharedPointer`] (`.shared`) or `Other("const_pointer")` and the like.
///
/// Serialized as the `.value_kind` string itself (`"global_buffer"`, `"image"`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum ArgKind {
    /// A pointer to global memory (`global_buffer`).
    GlobalBuffer,
    /// A value copied into the argument buffer (`by_value`).
    ByValue,
    /// A pointer into dynamically sized LDS / shared memory, which the runtime assigns
    /// (`dynamic_shared_pointer`).
    DynamicSharedPointer,
    /// Any other explicit kind (`image`, `sampler`, `pipe`, `queue`, ...), kept verbatim.
    Other(String),
}

impl ArgKind {
    /// The kind named by an AMDGPU `.value_kind` string.
    pub fn from_value_kind(value_kind: &str) -> Self {
        match value_kind {
            "global_buffer" => Self::GlobalBuffer,
            "by_value" => Self::ByValue,
            "dynamic_shared_pointer" => Self::DynamicSharedPointer,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The AMDGPU `.value_kind` string for this kind.
    pub fn value_kind(&self) -> &str {
        match self {
            Self::GlobalBuffer => "global_buffer",
            Self::ByValue => "by_value",
            Self::DynamicSharedPointer => "dynamic_shared_pointer",
            Self::Other(value_kind) => value_kind,
        }
    }
}

impl fmt::Display for ArgKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.value_kind())
    }
}

impl From<String> for ArgKind {
    fn from(value_kind: String) -> Self {
        match Self::from_value_kind(&value_kind) {
            Self::Other(_) => Self::Other(value_kind),
            known => known,
        }
    }
}

impl From<ArgKind> for String {
    fn from(kind: ArgKind) -> Self {
        match kind {
            ArgKind::Other(value_kind) => value_kind,
            known => known.value_kind().to_owned(),
        }
    }
}

/// Where one explicit kernel argument sits in the argument buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArgSlot {
    /// Byte offset from the start of the argument buffer.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    pub kind: ArgKind,
}

/// Facts about one kernel on one target, as recorded in the bundle manifest.
///
/// Fields that only one vendor reports are `None` for the other and left out when serialized.
/// For NVIDIA, the registers, spills, shared memory and stack come from `ptxas -v`: they stay
/// `None` or 0 until [`apply_ptxas_report`] adds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelFacts {
    /// The kernel's symbol name, as passed to `hipModuleGetFunction` / `cuModuleGetFunction`.
    pub name: String,
    /// The explicit arguments, in declaration order; every slot lies within `kernarg_size`.
    pub args: Vec<ArgSlot>,
    /// AMD: the whole kernarg segment, including the hidden arguments the runtime appends.
    /// NVIDIA: the end of the last parameter.
    pub kernarg_size: u32,
    /// Required alignment of the argument buffer (a power of two).
    pub kernarg_align: u32,
    /// AMD: scalar registers used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sgpr_count: Option<u32>,
    /// AMD: vector registers used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpr_count: Option<u32>,
    /// AMD: accumulation registers (AGPRs) used, which MFMA kernels need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agpr_count: Option<u32>,
    /// NVIDIA: registers per thread, from `ptxas -v`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registers: Option<u32>,
    /// Scalar registers spilled. AMD: `.sgpr_spill_count`, 0 where the metadata leaves it out.
    /// NVIDIA: always 0, as ptxas reports the spills of one register file only.
    pub sgpr_spill_count: u32,
    /// Vector registers spilled. AMD: `.vgpr_spill_count`, 0 where the metadata leaves it out.
    /// NVIDIA: the spill-store bytes `ptxas -v` reports, divided by 4 and rounded up, i.e. how
    /// many 32-bit registers' worth of values spill code writes to local memory.
    pub vgpr_spill_count: u32,
    /// Static LDS / shared memory in bytes (dynamic shared memory comes on top at launch).
    pub group_segment_size: u32,
    /// Scratch / stack bytes per work-item.
    pub private_segment_size: u32,
    /// Threads per wavefront / warp: 64 or 32.
    pub wavefront_size: u32,
    /// Largest workgroup / block, in threads, the kernel was compiled for.
    pub max_flat_workgroup_size: u32,
}

/// The ELF header facts of an AMDGPU code object that decide where it can load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmdElfHeader {
    /// `EI_OSABI`: 64 (HSA) for anything the ROCm runtime loads.
    pub os_abi: u8,
    /// `EI_ABIVERSION`: the code-object version minus two (V5 = 3, V6 = 4).
    pub abi_version: u8,
    /// `ET_DYN` (3) for a linked, loadable code object.
    pub e_type: u16,
    /// Processor (`EF_AMDGPU_MACH`), xnack and sramecc settings, and the V6 generic version.
    pub e_flags: u32,
}

/// What a linked AMDGPU code object says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmdCodeObject {
    pub header: AmdElfHeader,
    /// `amdhsa.target`, e.g. `amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`.
    pub target: String,
    /// `amdhsa.version` as (major, minor); 1.2 for code objects V5 and V6.
    pub metadata_version: (u32, u32),
    /// Every kernel the metadata describes, in metadata order.
    pub kernels: Vec<KernelFacts>,
    /// Names of the kernels the symbol table exports, with both the entry point (`name`, FUNC)
    /// and the kernel descriptor (`name.kd`, OBJECT); sorted. A name here but not in `kernels`
    /// has no metadata, so the HIP runtime cannot launch it.
    pub symbols: Vec<String>,
}

/// `EI_OSABI` of code objects for the HSA runtime (ROCm), as opposed to PAL (65) or Mesa (66).
const ELFOSABI_AMDGPU_HSA: u8 = 64;
/// Note type of the MessagePack metadata (code object V3 and later).
const NT_AMDGPU_METADATA: u32 = 32;
const AMDGPU_NOTE_OWNER: &[u8] = b"AMDGPU";
/// The deepest real metadata path is map, `amdhsa.kernels`, kernel, `.args`, argument, value;
/// a small bound stops crafted notes from recursing deep into the decoder.
const METADATA_MAX_DEPTH: usize = 16;
/// The kernel descriptor symbol is the kernel name with this suffix.
const KERNEL_DESCRIPTOR_SUFFIX: &str = ".kd";

/// Reads the header, metadata and kernel symbols of a linked AMDGPU code object (a bare ELF,
/// not an offload bundle), and checks that the HSA loader could load it and find each kernel.
///
/// Several `NT_AMDGPU_METADATA` notes are merged, as comgr does, when they agree on version
/// and target. Kernel symbols are looked up in `.dynsym` and `.symtab`: lld writes both, and
/// `strip` keeps only `.dynsym`.
pub fn read_amd_code_object(bytes: &[u8]) -> Result<AmdCodeObject, CodeObjectError> {
    let (file, header) = read_amd_elf_header(bytes)?;
    let sections = file
        .sections(LittleEndian, bytes)
        .map_err(malformed("section headers"))?;

    let mut notes = Vec::new();
    for section in sections.iter() {
        let Some(mut section_notes) = section
            .notes(LittleEndian, bytes)
            .map_err(malformed("note sections"))?
        else {
            continue;
        };
        while let Some(note) = section_notes.next().map_err(malformed("notes"))? {
            if note.name() == AMDGPU_NOTE_OWNER && note.n_type(LittleEndian) == NT_AMDGPU_METADATA {
                notes.push(note.desc());
            }
        }
    }
    let metadata = read_metadata(notes)?;

    let exported = ExportedSymbols::read(&sections, bytes)?;
    for kernel in &metadata.kernels {
        exported.check(kernel)?;
    }

    Ok(AmdCodeObject {
        header,
        target: metadata.target,
        metadata_version: metadata.version,
        kernels: metadata.kernels.into_iter().map(|k| k.facts).collect(),
        symbols: exported.kernel_names(),
    })
}

type AmdElfFile = elf::FileHeader64<LittleEndian>;

/// Checks the ELF identification and the fields that make an object loadable by ROCm, in the
/// order that gives the most useful message first.
fn read_amd_elf_header(bytes: &[u8]) -> Result<(&AmdElfFile, AmdElfHeader), CodeObjectError> {
    if !bytes.starts_with(&elf::ELFMAG) {
        return Err(CodeObjectError::NotElf);
    }
    // `EI_CLASS` and `EI_DATA` follow the magic; a file too short for them fails in `parse`.
    if let Some(&[class, data]) = bytes.get(4..6)
        && (class, data) != (elf::ELFCLASS64, elf::ELFDATA2LSB)
    {
        return Err(CodeObjectError::NotElf64LittleEndian { class, data });
    }
    let file = AmdElfFile::parse(bytes).map_err(malformed("file header"))?;
    let machine = file.e_machine(LittleEndian);
    if machine != elf::EM_AMDGPU {
        return Err(CodeObjectError::NotAmdgpu { machine });
    }
    let ident = file.e_ident();
    if ident.os_abi != ELFOSABI_AMDGPU_HSA {
        return Err(CodeObjectError::NotHsa {
            os_abi: ident.os_abi,
        });
    }
    let e_type = file.e_type(LittleEndian);
    if e_type != elf::ET_DYN {
        return Err(CodeObjectError::NotLinked { e_type });
    }
    let header = AmdElfHeader {
        os_abi: ident.os_abi,
        abi_version: ident.abi_version,
        e_type,
        e_flags: file.e_flags(LittleEndian),
    };
    Ok((file, header))
}

fn malformed(reading: &'static str) -> impl FnOnce(object::read::Error) -> CodeObjectError {
    move |detail| CodeObjectError::Elf { reading, detail }
}

/// The FUNC and OBJECT symbols a loader can find by name: defined, and not local.
struct ExportedSymbols<'data> {
    functions: HashSet<&'data [u8]>,
    objects: HashSet<&'data [u8]>,
}

impl<'data> ExportedSymbols<'data> {
    fn read(
        sections: &SectionTable<'data, AmdElfFile, &'data [u8]>,
        bytes: &'data [u8],
    ) -> Result<Self, CodeObjectError> {
        let mut exported = Self {
            functions: HashSet::new(),
            objects: HashSet::new(),
        };
        for table_type in [elf::SHT_DYNSYM, elf::SHT_SYMTAB] {
            let table = sections
                .symbols(LittleEndian, bytes, table_type)
                .map_err(malformed("symbol table"))?;
            for symbol in table.iter() {
                let set = match symbol.st_type() {
                    elf::STT_FUNC => &mut exported.functions,
                    elf::STT_OBJECT => &mut exported.objects,
                    _ => continue,
                };
                if symbol.is_local() || !symbol.is_definition(LittleEndian) {
                    continue;
                }
                let name = table
                    .symbol_name(LittleEndian, symbol)
                    .map_err(malformed("symbol names"))?;
                set.insert(name);
            }
        }
        Ok(exported)
    }

    /// Checks that the loader can find both the kernel's entry point and its descriptor.
    fn check(&self, kernel: &AmdKernel) -> Result<(), CodeObjectError> {
        let name = &kernel.facts.name;
        for (symbols, symbol, kind) in [
            (&self.functions, name, "FUNC"),
            (&self.objects, &kernel.descriptor, "OBJECT"),
        ] {
            if !symbols.contains(symbol.as_bytes()) {
                return Err(CodeObjectError::MissingSymbol {
                    kernel: name.clone(),
                    symbol: symbol.clone(),
                    kind,
                });
            }
        }
        Ok(())
    }

    fn kernel_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .functions
            .iter()
            .filter_map(|name| std::str::from_utf8(name).ok())
            .filter(|name| {
                let descriptor = format!("{name}{KERNEL_DESCRIPTOR_SUFFIX}");
                self.objects.contains(descriptor.as_bytes())
            })
            .map(str::to_owned)
            .collect();
        names.sort_unstable();
        names
    }
}

/// The merged content of the metadata notes.
#[derive(Debug)]
struct AmdMetadata {
    version: (u32, u32),
    target: String,
    kernels: Vec<AmdKernel>,
}

#[derive(Debug)]
struct AmdKernel {
    facts: KernelFacts,
    /// `.symbol`: the kernel descriptor's symbol, `name.kd` as LLVM writes it.
    descriptor: String,
}

/// Decodes each metadata note's descriptor and merges them into one.
fn read_metadata<'a>(
    descriptors: impl IntoIterator<Item = &'a [u8]>,
) -> Result<AmdMetadata, CodeObjectError> {
    let mut merged: Option<AmdMetadata> = None;
    for (note, descriptor) in descriptors.into_iter().enumerate() {
        let next = read_metadata_note(note, descriptor)?;
        let Some(merged) = &mut merged else {
            merged = Some(next);
            continue;
        };
        if next.version != merged.version {
            return Err(CodeObjectError::ConflictingNotes {
                key: "amdhsa.version",
                first: format!("{}.{}", merged.version.0, merged.version.1),
                other: format!("{}.{}", next.version.0, next.version.1),
                note,
            });
        }
        if next.target != merged.target {
            return Err(CodeObjectError::ConflictingNotes {
                key: "amdhsa.target",
                first: merged.target.clone(),
                other: next.target,
                note,
            });
        }
        merged.kernels.extend(next.kernels);
    }
    let metadata = merged.ok_or(CodeObjectError::MissingMetadata)?;
    let mut names = HashSet::new();
    for kernel in &metadata.kernels {
        if !names.insert(kernel.facts.name.as_str()) {
            return Err(CodeObjectError::DuplicateKernel {
                kernel: kernel.facts.name.clone(),
            });
        }
    }
    Ok(metadata)
}

fn read_metadata_note(note: usize, descriptor: &[u8]) -> Result<AmdMetadata, CodeObjectError> {
    let mut rest = descriptor;
    let value = rmpv::decode::read_value_with_max_depth(&mut rest, METADATA_MAX_DEPTH).map_err(
        |error| CodeObjectError::MetadataNotMessagePack {
            note,
            reason: error.to_string(),
        },
    )?;
    if !rest.is_empty() {
        return Err(CodeObjectError::TrailingMetadata {
            note,
            extra: rest.len(),
        });
    }
    let top = MetadataMap::new(&value, format!("AMDGPU metadata note {note}"))?;
    let version = top.required("amdhsa.version")?;
    let (major, minor) = match version.as_array().map(Vec::as_slice) {
        Some([major, minor]) => as_u32(major).zip(as_u32(minor)),
        _ => None,
    }
    .ok_or_else(|| {
        top.bad_value(
            "amdhsa.version",
            "an array of two unsigned integers, [major, minor]",
            version,
        )
    })?;
    // Major version 1 is the MessagePack metadata of code objects V3 to V6.
    if major != 1 {
        return Err(CodeObjectError::UnsupportedMetadataVersion { major, minor });
    }
    let target = top.string("amdhsa.target")?.to_owned();
    let kernels = top
        .array("amdhsa.kernels")?
        .iter()
        .enumerate()
        .map(|(index, kernel)| read_kernel(index, kernel))
        .collect::<Result<_, _>>()?;
    Ok(AmdMetadata {
        version: (major, minor),
        target,
        kernels,
    })
}

fn read_kernel(index: usize, value: &Value) -> Result<AmdKernel, CodeObjectError> {
    let unnamed = MetadataMap::new(value, format!("kernel {index} of `amdhsa.kernels`"))?;
    let name = unnamed.string(".name")?;
    let kernel = MetadataMap {
        entries: unnamed.entries,
        place: format!("kernel `{name}`"),
    };
    let kernarg_size = kernel.u32(".kernarg_segment_size")?;
    let kernarg_align = kernel.u32(".kernarg_segment_align")?;
    if !kernarg_align.is_power_of_two() {
        return Err(kernel.bad_value(
            ".kernarg_segment_align",
            "a power of two",
            &Value::from(kernarg_align),
        ));
    }
    let wavefront_size = kernel.u32(".wavefront_size")?;
    if !matches!(wavefront_size, 32 | 64) {
        return Err(kernel.bad_value(".wavefront_size", "32 or 64", &Value::from(wavefront_size)));
    }

    let mut args = Vec::new();
    for (index, arg) in kernel.optional_array(".args")?.iter().enumerate() {
        let arg = MetadataMap::new(arg, format!("argument {index} of kernel `{name}`"))?;
        let offset = arg.u32(".offset")?;
        let size = arg.u32(".size")?;
        let value_kind = arg.string(".value_kind")?;
        // The runtime fills the hidden arguments itself; callers pass only the explicit ones.
        if value_kind.starts_with("hidden_") {
            continue;
        }
        if u64::from(offset) + u64::from(size) > u64::from(kernarg_size) {
            return Err(CodeObjectError::ArgOutOfBounds {
                kernel: name.to_owned(),
                index,
                offset,
                size,
                kernarg_size,
            });
        }
        args.push(ArgSlot {
            offset,
            size,
            kind: ArgKind::from_value_kind(value_kind),
        });
    }

    let facts = KernelFacts {
        name: name.to_owned(),
        args,
        kernarg_size,
        kernarg_align,
        sgpr_count: Some(kernel.u32(".sgpr_count")?),
        vgpr_count: Some(kernel.u32(".vgpr_count")?),
        agpr_count: kernel.optional_u32(".agpr_count")?,
        registers: None,
        sgpr_spill_count: kernel.optional_u32(".sgpr_spill_count")?.unwrap_or(0),
        vgpr_spill_count: kernel.optional_u32(".vgpr_spill_count")?.unwrap_or(0),
        group_segment_size: kernel.u32(".group_segment_fixed_size")?,
        private_segment_size: kernel.u32(".private_segment_fixed_size")?,
        wavefront_size,
        max_flat_workgroup_size: kernel.u32(".max_flat_workgroup_size")?,
    };
    Ok(AmdKernel {
        facts,
        descriptor: kernel.string(".symbol")?.to_owned(),
    })
}

/// One MessagePack map of the metadata, with the words that place it in error messages.
struct MetadataMap<'v> {
    entries: &'v [(Value, Value)],
    place: String,
}

impl<'v> MetadataMap<'v> {
    fn new(value: &'v Value, place: String) -> Result<Self, CodeObjectError> {
        match value {
            Value::Map(entries) => Ok(Self { entries, place }),
            other => Err(CodeObjectError::NotAMap {
                place,
                found: describe(other),
            }),
        }
    }

    fn get(&self, key: &str) -> Option<&'v Value> {
        self.entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, value)| value)
    }

    fn required(&self, key: &'static str) -> Result<&'v Value, CodeObjectError> {
        self.get(key).ok_or_else(|| CodeObjectError::MissingKey {
            place: self.place.clone(),
            key,
        })
    }

    fn bad_value(
        &self,
        key: &'static str,
        expected: &'static str,
        found: &Value,
    ) -> CodeObjectError {
        CodeObjectError::BadValue {
            place: self.place.clone(),
            key,
            expected,
            found: describe(found),
        }
    }

    fn string(&self, key: &'static str) -> Result<&'v str, CodeObjectError> {
        let value = self.required(key)?;
        value
            .as_str()
            .ok_or_else(|| self.bad_value(key, "a UTF-8 string", value))
    }

    fn u32(&self, key: &'static str) -> Result<u32, CodeObjectError> {
        self.u32_from(key, self.required(key)?)
    }

    fn optional_u32(&self, key: &'static str) -> Result<Option<u32>, CodeObjectError> {
        self.get(key)
            .map(|value| self.u32_from(key, value))
            .transpose()
    }

    fn u32_from(&self, key: &'static str, value: &Value) -> Result<u32, CodeObjectError> {
        as_u32(value).ok_or_else(|| self.bad_value(key, "an unsigned 32-bit integer", value))
    }

    fn array(&self, key: &'static str) -> Result<&'v [Value], CodeObjectError> {
        self.array_from(key, self.required(key)?)
    }

    /// An array that may be left out, which means empty.
    fn optional_array(&self, key: &'static str) -> Result<&'v [Value], CodeObjectError> {
        self.get(key)
            .map_or(Ok(&[]), |value| self.array_from(key, value))
    }

    fn array_from(
        &self,
        key: &'static str,
        value: &'v Value,
    ) -> Result<&'v [Value], CodeObjectError> {
        value
            .as_array()
            .map(Vec::as_slice)
            .ok_or_else(|| self.bad_value(key, "an array", value))
    }
}

fn as_u32(value: &Value) -> Option<u32> {
    value.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// A short description of a metadata value for error messages; long strings are not echoed.
fn describe(value: &Value) -> String {
    match value {
        Value::Nil => "nil".to_owned(),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Integer(n) => format!("the integer {n}"),
        Value::F32(x) => format!("the float {x}"),
        Value::F64(x) => format!("the float {x}"),
        Value::String(s) => match s.as_str() {
            Some(text) if text.len() <= 40 => format!("the string {text:?}"),
            Some(text) => format!("a string of {} bytes", text.len()),
            None => "a string that is not UTF-8".to_owned(),
        },
        Value::Binary(bytes) => format!("{} bytes of binary data", bytes.len()),
        Value::Array(items) => format!("an array of {} items", items.len()),
        Value::Map(entries) => format!("a map of {} entries", entries.len()),
        Value::Ext(..) => "a MessagePack extension value".to_owned(),
    }
}

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

/// Why a code object, PTX module or ptxas report could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodeObjectError {
    #[error("not an ELF file: it does not start with the bytes 7f 45 4c 46 (\"\\x7fELF\")")]
    NotElf,
    #[error(
        "not an AMDGPU code object: it is not a 64-bit little-endian ELF (EI_CLASS is {class}, \
         EI_DATA is {data}; expected 2 and 1)"
    )]
    NotElf64LittleEndian { class: u8, data: u8 },
    #[error(
        "not an AMDGPU code object: e_machine is {machine}, expected 224 (EM_AMDGPU); \
         190 would be an NVIDIA cubin, 62 an x86-64 host object"
    )]
    NotAmdgpu { machine: u16 },
    #[error(
        "the code object is built for OS ABI {os_abi}, but the ROCm runtime loads only 64 (HSA); \
         65 and 66 are the PAL and Mesa ABIs: compile for the amdgcn-amd-amdhsa triple"
    )]
    NotHsa { os_abi: u8 },
    #[error(
        "not linked: the HSA loader needs a shared object (ET_DYN), but e_type is {e_type} \
         (1 is a relocatable object, as `clang -c` writes); link it with ld.lld -shared"
    )]
    NotLinked { e_type: u16 },
    #[error("malformed ELF while reading the {reading}: {detail}")]
    Elf {
        reading: &'static str,
        detail: object::read::Error,
    },
    #[error(
        "the code object has no NT_AMDGPU_METADATA note (owner \"AMDGPU\", type 32); code objects \
         older than V3 keep YAML metadata, which is not supported: rebuild with \
         -mcode-object-version=5 or later"
    )]
    MissingMetadata,
    #[error("AMDGPU metadata note {note} is not valid MessagePack: {reason}")]
    MetadataNotMessagePack { note: usize, reason: String },
    #[error("AMDGPU metadata note {note} has {extra} stray bytes after its MessagePack map")]
    TrailingMetadata { note: usize, extra: usize },
    #[error("{place} is {found}, but the metadata needs a map there")]
    NotAMap { place: String, found: String },
    #[error("{place} has no `{key}` key, which the code-object metadata requires")]
    MissingKey { place: String, key: &'static str },
    #[error("{place} has `{key}` set to {found}, but it must be {expected}")]
    BadValue {
        place: String,
        key: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error(
        "AMDGPU metadata version {major}.{minor} is not supported: this reader understands 1.x, \
         the metadata of code objects V3 to V6"
    )]
    UnsupportedMetadataVersion { major: u32, minor: u32 },
    #[error(
        "the AMDGPU metadata notes cannot be merged: note {note} says `{key}` is {other}, \
         but an earlier note says {first}"
    )]
    ConflictingNotes {
        key: &'static str,
        first: String,
        other: String,
        note: usize,
    },
    #[error("kernel `{kernel}` is described twice")]
    DuplicateKernel { kernel: String },
    #[error(
        "argument {index} of kernel `{kernel}` takes bytes {offset} to {offset}+{size}, past the \
         end of its {kernarg_size}-byte kernarg segment"
    )]
    ArgOutOfBounds {
        kernel: String,
        index: usize,
        offset: u32,
        size: u32,
        kernarg_size: u32,
    },
    #[error(
        "kernel `{kernel}` is in the metadata, but the symbol tables export no {kind} symbol \
         `{symbol}`, so the loader cannot find it; was the code object stripped or its metadata \
         edited?"
    )]
    MissingSymbol {
        kernel: String,
        symbol: String,
        kind: &'static str,
    },
    #[error("the text is not PTX: it does not start with a `.version` directive")]
    NotPtx,
    #[error("PTX line {line}: {message}")]
    PtxSyntax { line: usize, message: String },
    #[error("ptxas report line {line}: {message}")]
    PtxasReportSyntax { line: usize, message: String },
    #[error("ptxas failed, so its report has no facts; fix the PTX first: `{message}`")]
    PtxasFailed { message: String },
    #[error(
        "the ptxas report describes entry `{kernel}`, which the PTX does not declare; pass the \
         report of compiling this same PTX"
    )]
    PtxasUnknownKernel { kernel: String },
    #[error(
        "the ptxas report has no {missing} for entry `{kernel}`; pass the whole `ptxas -v` \
         output of compiling this same PTX"
    )]
    PtxasIncomplete {
        kernel: String,
        missing: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    /// Debian's LLVM 22: the whole toolchain hkpack builds with, for both vendors.
    const CLANG: &str = "/usr/lib/llvm-22/bin/clang++";

    /// Three kernels that exercise the facts: hidden arguments (axpy reads the workgroup size,
    /// which lives in the hidden block), static LDS (scale) and scratch (gather indexes a
    /// private array at run time).
    const AMD_KERNELS: &str = r#"
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  unsigned i = __builtin_amdgcn_workgroup_id_x() * __builtin_amdgcn_workgroup_size_x()
             + __builtin_amdgcn_workitem_id_x();
  if (i < (unsigned)n) y[i] += a * x[i];
}
extern "C" __global__ void scale(double* p, double s, unsigned long long n) {
  __shared__ double tile[256];
  unsigned i = __builtin_amdgcn_workitem_id_x();
  tile[i] = p[i] * s;
  __builtin_amdgcn_s_barrier();
  if (i < n) p[i] = tile[255 - i];
}
extern "C" __global__ void gather(const int* idx, float* out, int n) {
  float local[256];
  unsigned t = __builtin_amdgcn_workitem_id_x();
  for (int k = 0; k < 256; ++k) local[k] = out[t * 256 + k] * k;
  float acc = 0;
  for (int k = 0; k < n; ++k) acc += local[idx[k] & 255];
  out[t] = acc;
}
"#;

    /// The smallest useful code object, for the corruption test.
    const AMD_TINY: &str = r#"
extern "C" __attribute__((global)) void axpy(float a, const float* x, float* y, int n) {
  unsigned i = __builtin_amdgcn_workitem_id_x();
  if (i < (unsigned)n) y[i] += a * x[i];
}
"#;

    /// The kernels behind `testdata/ptxas-sm_90.txt`, which is the stderr of ptxas 13.0
    /// (V13.0.88) run as `ptxas -arch=sm_90 -O3 -v` on this source's PTX from clang 22.
    const NVIDIA_KERNELS: &str = r#"
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  unsigned i = __nvvm_read_ptx_sreg_tid_x();
  if (i < (unsigned)n) y[i] += a * x[i];
}
extern "C" __global__ __attribute__((launch_bounds(256))) void mixed(
    unsigned short h, __bf16 b, float f, const float* in, float* out, unsigned long long n) {
  __shared__ float tile[256];
  unsigned i = __nvvm_read_ptx_sreg_tid_x();
  tile[i] = in[i] * f + (float)b + h;
  __syncthreads();
  if (i < n) out[i] = tile[255 - i];
}
struct __attribute__((aligned(16))) Quad { float x, y, z, w; };
extern "C" __global__ void aligned(char c, Quad q, double d, float* out) {
  out[0] = c + q.x + q.w + d;
}
// 96 live values against a 32-register budget (1024 threads, 2 blocks per SM) must spill.
extern "C" __global__ __attribute__((launch_bounds(1024, 2))) void spills(
    const float* in, float* out, int n) {
  float v[96];
  unsigned t = __nvvm_read_ptx_sreg_tid_x();
#pragma unroll
  for (int k = 0; k < 96; ++k) v[k] = in[t + k * 1024];
  float acc = 0;
  for (int j = 0; j < n; ++j) {
#pragma unroll
    for (int k = 0; k < 96; ++k) { v[k] = v[k] * v[(k + 7) % 96] + acc; acc += v[k]; }
  }
#pragma unroll
  for (int k = 0; k < 96; ++k) out[t + k * 1024] = v[k];
}
// A large local array indexed at run time lives on the stack, in a callee.
__attribute__((noinline)) __device__ float pick(const float* p, int i) {
  volatile float local[64];
  for (int k = 0; k < 64; ++k) local[k] = p[k];
  return local[i & 63];
}
extern "C" __global__ void caller(const float* p, float* out, int i) { out[0] = pick(p, i); }
"#;

    const PTXAS_REPORT: &str = include_str!("../testdata/ptxas-sm_90.txt");

    /// Runs clang on `source` and returns its single output file.
    fn clang(source: &str, extension: &str, args: &[&str]) -> Vec<u8> {
        assert!(
            Path::new(CLANG).exists(),
            "these tests compile real kernels and need {CLANG}: install Debian's clang-22 and lld-22"
        );
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join(format!("kernels.{extension}"));
        let output = dir.path().join("out");
        std::fs::write(&input, source).unwrap();
        let run = Command::new(CLANG)
            .args(args)
            .arg("-o")
            .arg(&output)
            .arg(&input)
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{CLANG} failed: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        std::fs::read(output).unwrap()
    }

    fn compile_amd(source: &str, arch: &str, code_object_version: u32) -> Vec<u8> {
        let arch = format!("--offload-arch={arch}");
        let version = format!("-mcode-object-version={code_object_version}");
        let args = [
            "-x",
            "hip",
            "--cuda-device-only",
            "-nogpuinc",
            "-nogpulib",
            "-O3",
            "--no-gpu-bundle-output",
            &arch,
            &version,
        ];
        clang(source, "hip", &args)
    }

    fn compile_ptx(source: &str) -> String {
        let args = [
            "-x",
            "cuda",
            "--cuda-device-only",
            "-nocudainc",
            "-nocudalib",
            "--cuda-gpu-arch=sm_90",
            "--cuda-feature=+ptx80",
            "-O3",
            "-S",
        ];
        String::from_utf8(clang(source, "cu", &args)).unwrap()
    }

    fn slot(offset: u32, size: u32, kind: ArgKind) -> ArgSlot {
        ArgSlot { offset, size, kind }
    }

    fn kernel<'k>(kernels: &'k [KernelFacts], name: &str) -> &'k KernelFacts {
        kernels.iter().find(|k| k.name == name).unwrap()
    }

    #[test]
    fn reads_multi_kernel_objects_for_every_instinct_target() {
        for (arch, mach) in [("gfx90a", 0x3f), ("gfx942", 0x4c), ("gfx950", 0x4f)] {
            for version in [5, 6] {
                let object =
                    read_amd_code_object(&compile_amd(AMD_KERNELS, arch, version)).unwrap();
                let header = object.header;
                assert_eq!((header.os_abi, header.e_type), (64, 3));
                assert_eq!(u32::from(header.abi_version), version - 2);
                assert_eq!(header.e_flags & 0xff, mach, "{arch}");
                assert_eq!(object.target, format!("amdgcn-amd-amdhsa--{arch}"));
                assert_eq!(object.metadata_version, (1, 2));
                assert_eq!(object.symbols, ["axpy", "gather", "scale"]);
                let names: Vec<_> = object.kernels.iter().map(|k| k.name.as_str()).collect();
                assert_eq!(names, ["axpy", "scale", "gather"]);

                let axpy = kernel(&object.kernels, "axpy");
                use ArgKind::*;
                assert_eq!(
                    axpy.args,
                    [
                        slot(0, 4, ByValue),
                        slot(8, 8, GlobalBuffer),
                        slot(16, 8, GlobalBuffer),
                        slot(24, 4, ByValue)
                    ]
                );
                // 28 bytes of explicit arguments, padded to 32, then the 256-byte hidden block.
                assert_eq!((axpy.kernarg_size, axpy.kernarg_align), (288, 8));
                let scale = kernel(&object.kernels, "scale");
                assert_eq!(
                    scale.args,
                    [
                        slot(0, 8, GlobalBuffer),
                        slot(8, 8, ByValue),
                        slot(16, 8, ByValue)
                    ]
                );
                // No hidden argument is read, so LLVM drops the whole hidden block.
                assert_eq!(scale.kernarg_size, 24);
                assert_eq!(scale.group_segment_size, 2048);
                let gather = kernel(&object.kernels, "gather");
                assert!(gather.private_segment_size >= 1024, "{gather:?}");
                for k in &object.kernels {
                    assert_eq!((k.wavefront_size, k.max_flat_workgroup_size), (64, 1024));
                    assert!(k.sgpr_count.unwrap() > 0 && k.vgpr_count.unwrap() > 0);
                    assert_eq!(k.agpr_count, Some(0));
                    assert_eq!((k.sgpr_spill_count, k.vgpr_spill_count), (0, 0));
                    assert_eq!(k.registers, None);
                }
            }
        }
    }

    #[test]
    fn facts_round_trip_through_toml_without_the_other_vendors_fields() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Manifest {
            kernels: Vec<KernelFacts>,
        }
        let amd = read_amd_code_object(&compile_amd(AMD_KERNELS, "gfx942", 5)).unwrap();
        let mut nvidia = read_ptx_entries(&compile_ptx(NVIDIA_KERNELS)).unwrap();
        apply_ptxas_report(&mut nvidia, PTXAS_REPORT).unwrap();
        for (kernels, absent, present) in [
            (amd.kernels, "registers", "vgpr_spill_count = 0"),
            (nvidia, "sgpr_count", "vgpr_spill_count = 194"),
        ] {
            let manifest = Manifest { kernels };
            let text = toml::to_string(&manifest).unwrap();
            assert!(!text.contains(absent) && text.contains(present), "{text}");
            assert!(text.contains("kind = \"global_buffer\""), "{text}");
            assert_eq!(toml::from_str::<Manifest>(&text).unwrap(), manifest);
        }
    }

    #[test]
    fn arg_kinds_are_their_value_kind_strings() {
        for value_kind in [
            "global_buffer",
            "by_value",
            "dynamic_shared_pointer",
            "image",
        ] {
            let kind = ArgKind::from_value_kind(value_kind);
            assert_eq!(kind.to_string(), value_kind);
            assert_eq!(ArgKind::from(value_kind.to_owned()), kind);
            assert_eq!(String::from(kind), value_kind);
        }
        assert_eq!(
            ArgKind::from_value_kind("pipe"),
            ArgKind::Other("pipe".into())
        );
    }

    /// Writes `value` at `offset` of a copy of `bytes`.
    fn patched(bytes: &[u8], offset: usize, value: &[u8]) -> Vec<u8> {
        let mut copy = bytes.to_vec();
        copy[offset..offset + value.len()].copy_from_slice(value);
        copy
    }

    /// Replaces every occurrence of `from` with `to` (of the same length).
    fn replaced(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
        let mut copy = bytes.to_vec();
        let mut at = 0;
        while let Some(found) = copy[at..].windows(from.len()).position(|w| w == from) {
            copy[at + found..at + found + to.len()].copy_from_slice(to);
            at += found + to.len();
        }
        assert_ne!(copy, bytes, "{} not found", String::from_utf8_lossy(from));
        copy
    }

    #[test]
    fn rejects_what_the_hsa_loader_would_reject() {
        let good = compile_amd(AMD_TINY, "gfx942", 5);
        let read = |bytes: &[u8]| read_amd_code_object(bytes).unwrap_err();
        assert_eq!(read(b"#!/bin/sh\n"), CodeObjectError::NotElf);
        assert_eq!(
            read(&patched(&good, 4, &[1])),
            CodeObjectError::NotElf64LittleEndian { class: 1, data: 1 }
        );
        assert_eq!(
            read(&patched(&good, 5, &[2])),
            CodeObjectError::NotElf64LittleEndian { class: 2, data: 2 }
        );
        assert_eq!(
            read(&patched(&good, 18, &190u16.to_le_bytes())),
            CodeObjectError::NotAmdgpu { machine: 190 }
        );
        assert_eq!(
            read(&patched(&good, 7, &[65])),
            CodeObjectError::NotHsa { os_abi: 65 }
        );
        let relocatable = read(&patched(&good, 16, &1u16.to_le_bytes()));
        assert_eq!(relocatable, CodeObjectError::NotLinked { e_type: 1 });
        assert!(
            relocatable
                .to_string()
                .starts_with("not linked: the HSA loader needs a shared object (ET_DYN)")
        );
        assert!(matches!(
            read(&good[..40]),
            CodeObjectError::Elf {
                reading: "file header",
                ..
            }
        ));
        assert!(matches!(
            read(&good[..64]),
            CodeObjectError::Elf {
                reading: "section headers",
                ..
            }
        ));
    }

    #[test]
    fn needs_the_metadata_note_and_both_symbols_of_each_kernel() {
        let good = compile_amd(AMD_KERNELS, "gfx942", 5);
        let read = |bytes: &[u8]| read_amd_code_object(bytes).unwrap_err();
        // The note header: namesz 7, then descsz, then the type.
        let type_at = good.windows(8).position(|w| w == b"AMDGPU\0\0").unwrap() - 4;
        assert_eq!(good[type_at..type_at + 4], 32u32.to_le_bytes());
        assert_eq!(
            read(&patched(&good, type_at, &[33])),
            CodeObjectError::MissingMetadata
        );

        // The string tables end symbol names with NUL; the metadata's strings do not.
        let missing = read(&replaced(&good, b"scale.kd\0", b"scale.kX\0"));
        assert_eq!(
            missing,
            CodeObjectError::MissingSymbol {
                kernel: "scale".into(),
                symbol: "scale.kd".into(),
                kind: "OBJECT"
            }
        );
        let missing = read(&replaced(&good, b"\0gather\0", b"\0gathex\0"));
        assert_eq!(
            missing,
            CodeObjectError::MissingSymbol {
                kernel: "gather".into(),
                symbol: "gather".into(),
                kind: "FUNC"
            }
        );
    }

    /// The first metadata note of a code object, decoded.
    fn metadata_value(object: &[u8]) -> Value {
        let file = AmdElfFile::parse(object).unwrap();
        let sections = file.sections(LittleEndian, object).unwrap();
        for section in sections.iter() {
            if let Some(mut notes) = section.notes(LittleEndian, object).unwrap() {
                while let Some(note) = notes.next().unwrap() {
                    if note.name() == AMDGPU_NOTE_OWNER {
                        return rmpv::decode::read_value(&mut note.desc()).unwrap();
                    }
                }
            }
        }
        panic!("no metadata note");
    }

    fn encode(value: &Value) -> Vec<u8> {
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, value).unwrap();
        bytes
    }

    fn read_one(value: &Value) -> Result<AmdMetadata, CodeObjectError> {
        read_metadata([encode(value).as_slice()])
    }

    fn map_mut(value: &mut Value) -> &mut Vec<(Value, Value)> {
        match value {
            Value::Map(entries) => entries,
            other => panic!("not a map: {other}"),
        }
    }

    /// Sets (or with `None` removes) `key` in a map.
    fn set(map: &mut Value, key: &str, new: Option<Value>) {
        let entries = map_mut(map);
        entries.retain(|(k, _)| k.as_str() != Some(key));
        entries.extend(new.map(|v| (Value::from(key), v)));
    }

    fn get<'v>(map: &'v mut Value, key: &str) -> &'v mut Value {
        map_mut(map)
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
            .unwrap()
    }

    /// Kernel `index` of the metadata.
    fn kernel_at(metadata: &mut Value, index: usize) -> &mut Value {
        match get(metadata, "amdhsa.kernels") {
            Value::Array(kernels) => &mut kernels[index],
            other => panic!("not an array: {other}"),
        }
    }

    fn arg_at(metadata: &mut Value, kernel: usize, index: usize) -> &mut Value {
        match get(kernel_at(metadata, kernel), ".args") {
            Value::Array(args) => &mut args[index],
            other => panic!("not an array: {other}"),
        }
    }

    fn bad_value(
        place: &str,
        key: &'static str,
        expected: &'static str,
        found: &str,
    ) -> CodeObjectError {
        CodeObjectError::BadValue {
            place: place.into(),
            key,
            expected,
            found: found.into(),
        }
    }

    #[test]
    fn metadata_errors_name_the_place_and_the_key() {
        let real = metadata_value(&compile_amd(AMD_KERNELS, "gfx942", 5));
        let fails = |edit: &dyn Fn(&mut Value)| {
            let mut metadata = real.clone();
            edit(&mut metadata);
            read_one(&metadata).unwrap_err()
        };
        let top = "AMDGPU metadata note 0";
        let axpy = "kernel `axpy`";
        let u32_expected = "an unsigned 32-bit integer";

        assert_eq!(
            fails(&|m| *m = Value::from(3)),
            CodeObjectError::NotAMap {
                place: top.into(),
                found: "the integer 3".into()
            }
        );
        for key in ["amdhsa.version", "amdhsa.target", "amdhsa.kernels"] {
            assert_eq!(
                fails(&|m| set(m, key, None)),
                CodeObjectError::MissingKey {
                    place: top.into(),
                    key
                }
            );
        }
        let version_expected = "an array of two unsigned integers, [major, minor]";
        assert_eq!(
            fails(&|m| set(m, "amdhsa.version", Some(Value::Array(vec![1.into()])))),
            bad_value(
                top,
                "amdhsa.version",
                version_expected,
                "an array of 1 items"
            )
        );
        assert_eq!(
            fails(&|m| set(
                m,
                "amdhsa.version",
                Some(Value::Array(vec![1.into(), (-2).into()]))
            )),
            bad_value(
                top,
                "amdhsa.version",
                version_expected,
                "an array of 2 items"
            )
        );
        assert_eq!(
            fails(&|m| set(
                m,
                "amdhsa.version",
                Some(Value::Array(vec![2.into(), 0.into()]))
            )),
            CodeObjectError::UnsupportedMetadataVersion { major: 2, minor: 0 }
        );
        assert_eq!(
            fails(&|m| set(m, "amdhsa.target", Some(Value::Binary(vec![0xff])))),
            bad_value(
                top,
                "amdhsa.target",
                "a UTF-8 string",
                "1 bytes of binary data"
            )
        );
        assert_eq!(
            fails(&|m| set(m, "amdhsa.kernels", Some(Value::Map(vec![])))),
            bad_value(top, "amdhsa.kernels", "an array", "a map of 0 entries")
        );
        assert_eq!(
            fails(&|m| *kernel_at(m, 1) = Value::Nil),
            CodeObjectError::NotAMap {
                place: "kernel 1 of `amdhsa.kernels`".into(),
                found: "nil".into()
            }
        );
        assert_eq!(
            fails(&|m| set(kernel_at(m, 0), ".name", None)),
            CodeObjectError::MissingKey {
                place: "kernel 0 of `amdhsa.kernels`".into(),
                key: ".name"
            }
        );
        for key in [
            ".symbol",
            ".kernarg_segment_size",
            ".group_segment_fixed_size",
            ".private_segment_fixed_size",
            ".kernarg_segment_align",
            ".wavefront_size",
            ".sgpr_count",
            ".vgpr_count",
            ".max_flat_workgroup_size",
        ] {
            assert_eq!(
                fails(&|m| set(kernel_at(m, 0), key, None)),
                CodeObjectError::MissingKey {
                    place: axpy.into(),
                    key
                }
            );
        }
        for (value, found) in [
            (Value::from(-1), "the integer -1"),
            (Value::from(1u64 << 32), "the integer 4294967296"),
            (Value::from("14"), "the string \"14\""),
            (Value::from("x".repeat(41)), "a string of 41 bytes"),
            (Value::F64(14.0), "the float 14"),
            (Value::Boolean(true), "the boolean true"),
            (Value::Ext(1, vec![]), "a MessagePack extension value"),
        ] {
            assert_eq!(
                fails(&|m| set(kernel_at(m, 0), ".sgpr_count", Some(value.clone()))),
                bad_value(axpy, ".sgpr_count", u32_expected, found)
            );
        }
        assert_eq!(
            fails(&|m| set(kernel_at(m, 0), ".agpr_count", Some(Value::F32(0.5)))),
            bad_value(axpy, ".agpr_count", u32_expected, "the float 0.5")
        );
        assert_eq!(
            fails(&|m| set(kernel_at(m, 0), ".kernarg_segment_align", Some(6.into()))),
            bad_value(
                axpy,
                ".kernarg_segment_align",
                "a power of two",
                "the integer 6"
            )
        );
        assert_eq!(
            fails(&|m| set(kernel_at(m, 0), ".wavefront_size", Some(48.into()))),
            bad_value(axpy, ".wavefront_size", "32 or 64", "the integer 48")
        );
        assert_eq!(
            fails(&|m| set(kernel_at(m, 0), ".args", Some(Value::from("none")))),
            bad_value(axpy, ".args", "an array", "the string \"none\"")
        );
        assert_eq!(
            fails(&|m| *arg_at(m, 0, 1) = Value::Array(vec![])),
            CodeObjectError::NotAMap {
                place: "argument 1 of kernel `axpy`".into(),
                found: "an array of 0 items".into()
            }
        );
        for key in [".offset", ".size", ".value_kind"] {
            assert_eq!(
                fails(&|m| set(arg_at(m, 0, 1), key, None)),
                CodeObjectError::MissingKey {
                    place: "argument 1 of kernel `axpy`".into(),
                    key
                }
            );
        }
        assert_eq!(
            fails(&|m| set(arg_at(m, 0, 3), ".offset", Some(286.into()))),
            CodeObjectError::ArgOutOfBounds {
                kernel: "axpy".into(),
                index: 3,
                offset: 286,
                size: 4,
                kernarg_size: 288
            }
        );
        assert_eq!(
            fails(&|m| set(arg_at(m, 0, 3), ".size", Some(u32::MAX.into()))),
            CodeObjectError::ArgOutOfBounds {
                kernel: "axpy".into(),
                index: 3,
                offset: 24,
                size: u32::MAX,
                kernarg_size: 288
            }
        );
        assert_eq!(
            fails(&|m| set(kernel_at(m, 2), ".name", Some("axpy".into()))),
            CodeObjectError::DuplicateKernel {
                kernel: "axpy".into()
            }
        );
    }

    #[test]
    fn optional_metadata_may_be_left_out_and_other_kinds_are_kept() {
        let mut metadata = metadata_value(&compile_amd(AMD_KERNELS, "gfx942", 5));
        for key in [".agpr_count", ".sgpr_spill_count", ".vgpr_spill_count"] {
            set(kernel_at(&mut metadata, 0), key, None);
        }
        set(kernel_at(&mut metadata, 1), ".args", None);
        set(
            arg_at(&mut metadata, 2, 0),
            ".value_kind",
            Some("dynamic_shared_pointer".into()),
        );
        set(
            arg_at(&mut metadata, 2, 1),
            ".value_kind",
            Some("image".into()),
        );
        let kernels = read_one(&metadata).unwrap().kernels;
        let axpy = &kernels[0].facts;
        assert_eq!(
            (
                axpy.agpr_count,
                axpy.sgpr_spill_count,
                axpy.vgpr_spill_count
            ),
            (None, 0, 0)
        );
        assert!(kernels[1].facts.args.is_empty());
        assert_eq!(kernels[2].facts.args[0].kind, ArgKind::DynamicSharedPointer);
        assert_eq!(
            kernels[2].facts.args[1].kind,
            ArgKind::Other("image".into())
        );
        assert_eq!(kernels[2].descriptor, "gather.kd");
    }

    #[test]
    fn notes_must_decode_completely_and_merge_only_when_they_agree() {
        let real = metadata_value(&compile_amd(AMD_KERNELS, "gfx942", 5));
        assert_eq!(
            read_metadata([]).unwrap_err(),
            CodeObjectError::MissingMetadata
        );
        assert!(matches!(
            read_metadata([&[0x92, 0x01][..]]).unwrap_err(),
            CodeObjectError::MetadataNotMessagePack { note: 0, .. }
        ));
        let mut trailing = encode(&real);
        trailing.push(0);
        assert_eq!(
            read_metadata([trailing.as_slice()]).unwrap_err(),
            CodeObjectError::TrailingMetadata { note: 0, extra: 1 }
        );
        // Nesting deeper than any real metadata is refused before it can exhaust the stack.
        let deep = [&[0x91; 10_000][..], &[0xc0]].concat();
        assert!(matches!(
            read_metadata([deep.as_slice()]).unwrap_err(),
            CodeObjectError::MetadataNotMessagePack { note: 0, .. }
        ));

        // Split the three kernels over two notes.
        let mut first = real.clone();
        let mut second = real.clone();
        if let (Value::Array(a), Value::Array(b)) = (
            get(&mut first, "amdhsa.kernels"),
            get(&mut second, "amdhsa.kernels"),
        ) {
            a.truncate(1);
            b.remove(0);
        }
        let merged = read_metadata([encode(&first).as_slice(), &encode(&second)]).unwrap();
        let names: Vec<_> = merged
            .kernels
            .iter()
            .map(|k| k.facts.name.as_str())
            .collect();
        assert_eq!(names, ["axpy", "scale", "gather"]);

        let duplicate = read_metadata([encode(&first).as_slice(), &encode(&first)]);
        assert_eq!(
            duplicate.unwrap_err(),
            CodeObjectError::DuplicateKernel {
                kernel: "axpy".into()
            }
        );
        let mut other = second.clone();
        set(
            &mut other,
            "amdhsa.version",
            Some(Value::Array(vec![1.into(), 1.into()])),
        );
        assert_eq!(
            read_metadata([encode(&first).as_slice(), &encode(&other)]).unwrap_err(),
            CodeObjectError::ConflictingNotes {
                key: "amdhsa.version",
                first: "1.2".into(),
                other: "1.1".into(),
                note: 1
            }
        );
        let mut other = second.clone();
        set(
            &mut other,
            "amdhsa.target",
            Some("amdgcn-amd-amdhsa--gfx90a".into()),
        );
        assert_eq!(
            read_metadata([encode(&first).as_slice(), &encode(&other)]).unwrap_err(),
            CodeObjectError::ConflictingNotes {
                key: "amdhsa.target",
                first: "amdgcn-amd-amdhsa--gfx942".into(),
                other: "amdgcn-amd-amdhsa--gfx90a".into(),
                note: 1,
            }
        );
    }

    #[test]
    fn never_panics_on_truncated_or_corrupted_code_objects() {
        let good = compile_amd(AMD_TINY, "gfx942", 5);
        assert!(read_amd_code_object(&good).is_ok());
        for len in 0..good.len() {
            let _ = read_amd_code_object(&good[..len]);
        }
        // All 255 other values at every position: about 1.5 million reads, so share them out.
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        let positions: Vec<usize> = (0..good.len()).collect();
        std::thread::scope(|scope| {
            for chunk in positions.chunks(good.len().div_ceil(threads)) {
                let good = &good;
                scope.spawn(move || {
                    let mut corrupted = good.clone();
                    for &at in chunk {
                        for value in (0..=u8::MAX).filter(|&value| value != good[at]) {
                            corrupted[at] = value;
                            let _ = read_amd_code_object(&corrupted);
                        }
                        corrupted[at] = good[at];
                    }
                });
            }
        });
    }

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
