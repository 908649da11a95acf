//! The AMDGPU code object as an ELF file: the header fields that decide where it can load
//! (`EI_OSABI`, `EI_ABIVERSION`, `e_type`, and `e_flags`, which spell its processor and
//! features), the notes that carry its metadata, and the symbol tables the HSA loader finds
//! kernels in. The metadata note's content is MessagePack, not ELF, and is read in
//! `amd_metadata`; this file owns the container and what the loader itself checks.

use std::collections::HashSet;

use object::LittleEndian;
use object::elf;
use object::read::elf::{FileHeader, SectionHeader, SectionTable, Sym};

use super::amd_metadata::{AmdKernel, read_metadata};
use super::{CodeObjectError, KernelFacts};

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
pub(super) const AMDGPU_NOTE_OWNER: &[u8] = b"AMDGPU";
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

pub(super) type AmdElfFile = elf::FileHeader64<LittleEndian>;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ArgKind;
    use crate::tests::{AMD_KERNELS, compile_amd, kernel, slot};

    /// The smallest useful code object, for the corruption test.
    const AMD_TINY: &str = r#"
extern "C" __attribute__((global)) void axpy(float a, const float* x, float* y, int n) {
  unsigned i = __builtin_amdgcn_workitem_id_x();
  if (i < (unsigned)n) y[i] += a * x[i];
}
"#;

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
}
