//! Facts about compiled kernels, read from the compiler's own output.
//!
//! For every kernel on every target, hkpack records what a launch has to get right and what the
//! kernel costs: where each explicit argument sits in the argument buffer, how large and aligned
//! that buffer is, and the resources the kernel claims (registers, spills, shared memory, stack,
//! wave size, largest workgroup). This crate owns reading those facts:
//!
//! * AMD, from a linked AMDGPU code object: its ELF header, its `NT_AMDGPU_METADATA` note (a
//!   MessagePack map) and its symbol table ([`read_amd_code_object`]);
//! * NVIDIA, from the PTX text, whose `.entry` parameter lists give the argument layout
//!   ([`read_ptx_entries`]), and from the resource report that `ptxas -v` prints while turning
//!   that PTX into a cubin ([`apply_ptxas_report`]).
//!
//! Every input is treated as untrusted: the readers check every offset, size and type, never
//! panic, and return a [`CodeObjectError`] that names the kernel and the key at fault.
//!
//! Each format has a file of its own: the AMDGPU ELF container (`amd_elf`), the MessagePack
//! metadata note inside it (`amd_metadata`), PTX text (`ptx`) and the `ptxas -v` report
//! (`ptxas`). What they all produce, [`KernelFacts`], and the one error type,
//! [`CodeObjectError`], live here.

use std::fmt;

use serde::{Deserialize, Serialize};

mod amd_elf;
mod amd_metadata;
mod ptx;
mod ptxas;

pub use amd_elf::{AmdCodeObject, AmdElfHeader, read_amd_code_object};
pub use ptx::read_ptx_entries;
pub use ptxas::apply_ptxas_report;

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

    use object::LittleEndian;
    use object::read::elf::{FileHeader, SectionHeader};
    use rmpv::Value;

    use super::amd_elf::{AMDGPU_NOTE_OWNER, AmdElfFile};

    /// Debian's LLVM 22: the whole toolchain hkpack builds with, for both vendors.
    const CLANG: &str = "/usr/lib/llvm-22/bin/clang++";

    /// Three kernels that exercise the facts: hidden arguments (axpy reads the workgroup size,
    /// which lives in the hidden block), static LDS (scale) and scratch (gather indexes a
    /// private array at run time).
    pub(super) const AMD_KERNELS: &str = r#"
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

    /// The kernels behind `testdata/ptxas-sm_90.txt`, which is the stderr of ptxas 13.0
    /// (V13.0.88) run as `ptxas -arch=sm_90 -O3 -v` on this source's PTX from clang 22.
    pub(super) const NVIDIA_KERNELS: &str = r#"
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

    pub(super) const PTXAS_REPORT: &str = include_str!("../testdata/ptxas-sm_90.txt");

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

    pub(super) fn compile_amd(source: &str, arch: &str, code_object_version: u32) -> Vec<u8> {
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

    pub(super) fn compile_ptx(source: &str) -> String {
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

    pub(super) fn slot(offset: u32, size: u32, kind: ArgKind) -> ArgSlot {
        ArgSlot { offset, size, kind }
    }

    pub(super) fn kernel<'k>(kernels: &'k [KernelFacts], name: &str) -> &'k KernelFacts {
        kernels.iter().find(|k| k.name == name).unwrap()
    }

    /// The first metadata note of a code object, decoded.
    pub(super) fn metadata_value(object: &[u8]) -> Value {
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
}
