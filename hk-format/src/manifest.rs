//! The bundle manifest, `bundle.toml`, and the modules' ABI files: what a bundle folder holds
//! and what every kernel in it expects. hkpack writes them, and the same records once more in
//! the index ([`crate::index`]), which is what hkload reads: these TOML files are the bundle's
//! readable record, for people and other tools (`hkpack inspect` reads the index too).
//!
//! ```toml
//! format_version = "1.7"
//! targets = ["gfx90a", "gfx942", "gfx950", "sm_80", "sm_90"]
//!
//! [package]
//! name = "hk-kernels"
//! version = "0.1.0"
//!
//! [toolchain]
//! clang = "Debian clang version 22.1.8 (…)"
//! ptxas = "Cuda compilation tools, release 13.0, V13.0.88"
//! amd_code_object_version = 5
//!
//! [[module]]
//! name = "rmsnorm"
//! file = "rmsnorm.hipfb"
//! size = 9472
//! sha256 = "…"
//! blake3 = "…"
//! compressed = true
//! kernels = ["rmsnorm_bf16", "rmsnorm_f16", "rmsnorm_f32"]
//! abi_file = "rmsnorm.abi.toml"
//! abi_sha256 = "…"
//! [[module.entry]]
//! id = "hipv4-amdgcn-amd-amdhsa--gfx942"
//! size = 5384
//! sha256 = "…"
//! blake3 = "…"
//! ```
//!
//! and per module an ABI file, `rmsnorm.abi.toml`:
//!
//! ```toml
//! [[kernel]]
//! symbol = "rmsnorm_bf16"
//! args = ["out: *mut bf16", "x: *const bf16", "weight: *const bf16", "eps: f32", "rows: u32", "cols: u32"]
//! [[kernel.target]]
//! target = "gfx942"
//! arg_offsets = [0, 8, 16, 24, 28, 32]
//! kernarg_size = 296
//! # … registers, spills, LDS, scratch, wave size, maximum block size
//! ```

use serde::{Deserialize, Serialize};

use crate::abi::Signature;
use crate::contract::Contract;
use crate::target::{EntryId, TargetId};

pub use crate::digest::{Blake3Digest, Digests, Sha256Digest, hex};

/// The file name of the manifest inside a bundle folder.
pub const MANIFEST_FILE: &str = "bundle.toml";

/// The file-name extension of a module's ABI file: `<module>.abi.toml`.
pub const ABI_EXTENSION: &str = "abi.toml";

/// The bundle format this crate writes, and the oldest it reads: before 1.0, a bundle of an
/// older format is rebuilt, not read, so that one reader and no version gates serve every
/// bundle (readers accept later minors of the same major).
///
/// 1.1 added the index, `bundle.msgpack` (see [`crate::index`]), 1.2 its lookup table, and
/// 1.3 kernels' launch contracts ([`crate::contract`]) and the index's version string under its
/// digest, 1.4 the targets a module is not built for ([`ModuleRecord::not_built`]), 1.5 a
/// BLAKE3 digest beside the SHA-256 of every module file and code image ([`crate::digest`]),
/// which hkload checks instead on its load path, and a part of the lookup table that holds
/// each image's, 1.6 a part of the lookup table that holds each module's not-built targets, so
/// that choosing code objects for a device one of them skips reads no manifest, 1.7
/// architecture-specific targets (`sm_90a`) among the targets and entry IDs, and the contract
/// fact `arch_specific` (no layout changed: a 1.6 reader refuses such a bundle when it parses
/// its first `sm_90a` entry or binds such a contract).
/// An older bundle is refused with [`ManifestError::UnsupportedFormat`], which says to rebuild
/// it.
pub const FORMAT_VERSION: FormatVersion = FormatVersion { major: 1, minor: 7 };

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleManifest {
    pub format_version: FormatVersion,
    /// The build targets, in the order they were requested.
    pub targets: Vec<TargetId>,
    pub package: Package,
    pub toolchain: Toolchain,
    #[serde(rename = "module", default)]
    pub modules: Vec<ModuleRecord>,
    /// Where the bundle came from (absent in bundles before 1.3). No timestamps: the same
    /// sources build the same bytes.
    #[serde(default)]
    pub provenance: Option<Provenance>,
}

/// What built a bundle from what: the builder's version and the sources' revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// The version of hkpack that built the bundle.
    pub hkpack: String,
    /// The git commit the sources were at, when they are in a git repository.
    #[serde(default)]
    pub source_revision: Option<String>,
    /// Whether the sources differed from that commit (uncommitted changes to tracked files).
    #[serde(default)]
    pub source_dirty: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// What built the bundle, so two bundles can be told apart and a build reproduced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toolchain {
    /// `clang --version`, first line.
    pub clang: String,
    /// `ptxas --version`, last line; absent when NVIDIA targets shipped PTX only.
    #[serde(default)]
    pub ptxas: Option<String>,
    /// The package's default AMD code-object version. A target the package gives a version of
    /// its own (`amd_code_object_versions`, as a generic target needs 6) carries that one in its
    /// code objects' ELF header (`EI_ABIVERSION`), which is what loaders read.
    pub amd_code_object_version: u32,
}

/// One module file: a clang offload bundle holding one code image per entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRecord {
    pub name: String,
    /// File name inside the bundle folder.
    pub file: String,
    /// Size of the file in bytes.
    pub size: u64,
    /// SHA-256 of the whole file.
    pub sha256: Sha256Digest,
    /// Whether the file is a compressed (`CCOB`) bundle.
    pub compressed: bool,
    /// The kernels the module holds, in declaration order.
    pub kernels: Vec<String>,
    /// The module's ABI file (`<module>.abi.toml`: each kernel's signature and per-target
    /// ABI), the readable copy of the kernels' records in the index.
    pub abi_file: String,
    /// SHA-256 of the ABI file.
    pub abi_sha256: Sha256Digest,
    #[serde(rename = "entry")]
    pub entries: Vec<EntryRecord>,
    /// The build targets the module opted out of, with the manifest's reason (since 1.4).
    ///
    /// Written even when empty: the index writes records as arrays, where a field left out
    /// would shift `blake3` into its place. (1.4 left it out when empty, so that 1.3 readers
    /// read such bundles; a 1.5 bundle needs a 1.5 reader anyway, for its lookup table.)
    #[serde(default)]
    pub not_built: Vec<NotBuilt>,
    /// BLAKE3 of the whole file: what hkload checks a signed bundle's module file against.
    pub blake3: Blake3Digest,
}

/// A build target a module is not built for, by design: its manifest's `skip_targets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotBuilt {
    pub target: TargetId,
    /// Why, in the manifest author's words ("no FP8 tensor-core instruction before sm_89").
    pub reason: String,
}

/// One code image in a module file, keyed by its full entry ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntryRecord {
    pub id: EntryId,
    /// Size of the (uncompressed) code image in bytes.
    pub size: u64,
    /// SHA-256 of the code image.
    pub sha256: Sha256Digest,
    /// BLAKE3 of the code image: what hkload checks before or while the driver loads it.
    pub blake3: Blake3Digest,
}

impl ModuleRecord {
    /// The digests recorded of the whole module file.
    pub fn digests(&self) -> Digests {
        Digests {
            sha256: self.sha256,
            blake3: self.blake3,
        }
    }
}

impl EntryRecord {
    /// The digests recorded of the code image.
    pub fn digests(&self) -> Digests {
        Digests {
            sha256: self.sha256,
            blake3: self.blake3,
        }
    }
}

/// A module's ABI file: every kernel of the module with its signature and per-target ABI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleAbi {
    #[serde(rename = "kernel", default)]
    pub kernels: Vec<KernelRecord>,
}

impl ModuleAbi {
    /// Reads the ABI file of `module`, which must describe exactly the kernels the bundle
    /// manifest lists for it.
    #[cfg(feature = "toml")]
    pub fn from_toml(text: &str, module: &ModuleRecord) -> Result<Self, ManifestError> {
        let abi: Self = toml::from_str(text).map_err(|e| ManifestError::Syntax(e.to_string()))?;
        abi.check_against(module)?;
        Ok(abi)
    }

    /// Checks that these are exactly the kernels the manifest lists for `module`, in order.
    #[cfg(feature = "toml")]
    pub(crate) fn check_against(&self, module: &ModuleRecord) -> Result<(), ManifestError> {
        let symbols: Vec<&str> = self.kernels.iter().map(|k| k.symbol.as_str()).collect();
        if symbols != module.kernels {
            return Err(ManifestError::Invalid(format!(
                "the ABI of module `{}` describes kernels [{}] but the manifest lists [{}]",
                module.name,
                symbols.join(", "),
                module.kernels.join(", ")
            )));
        }
        Ok(())
    }

    /// The ABI file as TOML text; deterministic for the same kernels.
    #[cfg(feature = "toml")]
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("an ABI file always serialises: every key is a string")
    }
}

/// One kernel: its declared signature and, per build target, the ABI of its code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelRecord {
    pub symbol: String,
    pub args: Signature,
    #[serde(rename = "target")]
    pub targets: Vec<KernelAbi>,
    /// The launch contract (since format 1.3): launch shape, preconditions and every pointer's
    /// extent. A kernel without one launches only through hkload's `Kernel::launch`, with
    /// explicit dimensions.
    #[serde(default)]
    pub contract: Option<Contract>,
}

impl KernelRecord {
    /// The ABI recorded for `target`, the build target of a code image.
    pub fn abi_for(&self, target: &TargetId) -> Option<&KernelAbi> {
        self.targets.iter().find(|t| &t.target == target)
    }
}

/// The ABI of one kernel's code for one build target: where its arguments go and what it
/// uses, as read from the code object (AMD metadata note; NVIDIA PTX and ptxas report).
///
/// Argument sizes and kinds are not repeated here: hkpack checked that they are exactly the
/// declared ones, so the signature holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelAbi {
    pub target: TargetId,
    /// Byte offset of each declared argument in the argument buffer.
    pub arg_offsets: Vec<u32>,
    /// AMD: the whole kernarg segment, hidden arguments included; NVIDIA: the parameters.
    pub kernarg_size: u32,
    pub kernarg_align: u32,
    /// AMD register counts: scalar, vector, accumulation.
    #[serde(default)]
    pub sgpr_count: Option<u32>,
    #[serde(default)]
    pub vgpr_count: Option<u32>,
    #[serde(default)]
    pub agpr_count: Option<u32>,
    /// NVIDIA registers per thread (from ptxas; absent for PTX-only builds).
    #[serde(default)]
    pub registers: Option<u32>,
    /// Registers spilled to scratch, scalar and vector together.
    pub spills: u32,
    /// Static shared memory (LDS) in bytes.
    pub group_segment_size: u32,
    /// Scratch (private, stack) bytes per thread.
    pub private_segment_size: u32,
    pub wavefront_size: u32,
    pub max_flat_workgroup_size: u32,
}

/// `major.minor`; a reader refuses a newer major and accepts any minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FormatVersion {
    pub major: u32,
    pub minor: u32,
}

impl FormatVersion {
    /// Whether this crate reads bundles of this format: [`FORMAT_VERSION`] and later minors of
    /// its major.
    pub fn is_read(self) -> bool {
        self.major == FORMAT_VERSION.major && self.minor >= FORMAT_VERSION.minor
    }
}

impl std::fmt::Display for FormatVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl std::str::FromStr for FormatVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("format version `{s}` is not of the form MAJOR.MINOR");
        let (major, minor) = s.split_once('.').ok_or_else(bad)?;
        Ok(Self {
            major: major.parse().map_err(|_| bad())?,
            minor: minor.parse().map_err(|_| bad())?,
        })
    }
}

impl Serialize for FormatVersion {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::text::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for FormatVersion {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::text::deserialize(deserializer)
    }
}

impl BundleManifest {
    /// Reads a manifest from TOML text, refusing a newer major format.
    #[cfg(feature = "toml")]
    pub fn from_toml(text: &str) -> Result<Self, ManifestError> {
        // Read the version alone first, so that a future format with other fields still
        // gets the helpful "too new" error instead of a field-by-field complaint.
        #[derive(Deserialize)]
        struct VersionOnly {
            format_version: FormatVersion,
        }
        let version = toml::from_str::<VersionOnly>(text)
            .map_err(|e| ManifestError::Syntax(e.message().to_owned()))?
            .format_version;
        if !version.is_read() {
            return Err(ManifestError::UnsupportedFormat(version));
        }
        let manifest: Self =
            toml::from_str(text).map_err(|e| ManifestError::Syntax(e.to_string()))?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// The manifest as TOML text; deterministic for the same manifest.
    #[cfg(feature = "toml")]
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a bundle manifest always serialises: every key is a string")
    }

    pub fn module(&self, name: &str) -> Option<&ModuleRecord> {
        self.modules.iter().find(|m| m.name == name)
    }

    /// The module that holds kernel `symbol`.
    pub fn module_of(&self, symbol: &str) -> Option<&ModuleRecord> {
        self.modules
            .iter()
            .find(|m| m.kernels.iter().any(|k| k == symbol))
    }

    /// Every kernel's symbol, modules in order.
    pub fn kernel_symbols(&self) -> impl Iterator<Item = &str> {
        self.modules
            .iter()
            .flat_map(|m| m.kernels.iter().map(String::as_str))
    }

    /// Checks what serde cannot: names unique, references resolve, files stay in the folder.
    pub(crate) fn validate(&self) -> Result<(), ManifestError> {
        if let Some(name) = first_duplicate(self.modules.iter().map(|m| m.name.as_str())) {
            return Err(ManifestError::Invalid(format!(
                "module `{name}` is listed twice"
            )));
        }
        for module in &self.modules {
            for file in [&module.file, &module.abi_file] {
                check_file_name(&module.name, file)?;
            }
            if let Some(id) = first_duplicate(module.entries.iter().map(|e| e.id)) {
                return Err(duplicate_entry(&module.name, &id));
            }
        }
        if let Some(symbol) = first_duplicate(self.kernel_symbols()) {
            return Err(ManifestError::Invalid(format!(
                "kernel `{symbol}` is listed twice"
            )));
        }
        Ok(())
    }
}

/// The error for module `module` listing the code image `id` more than once.
pub(crate) fn duplicate_entry(module: &str, id: &EntryId) -> ManifestError {
    ManifestError::Invalid(format!("module `{module}` lists entry `{id}` twice"))
}

/// Checks that `file`, named by module `module`, is a plain file name in the bundle folder:
/// nothing a bundle names may lie outside it.
pub(crate) fn check_file_name(module: &str, file: &str) -> Result<(), ManifestError> {
    // NUL ends a path in the operating system's calls: no file has one in its name.
    let plain = !file.is_empty() && !file.starts_with('.') && !file.contains(['/', '\\', '\0']);
    if plain {
        return Ok(());
    }
    Err(ManifestError::Invalid(format!(
        "module `{module}` names file `{file}`, which is not a plain file name in the bundle folder"
    )))
}

/// The smallest item that occurs more than once. Sorting a few dozen names is cheaper than
/// hashing them, and this runs at every open.
fn first_duplicate<T: Ord + Copy>(items: impl Iterator<Item = T>) -> Option<T> {
    let mut items: Vec<T> = items.collect();
    items.sort_unstable();
    items
        .windows(2)
        .find(|pair| pair[0] == pair[1])
        .map(|pair| pair[0])
}

/// A `bundle.toml` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("{0}")]
    Syntax(String),
    #[error("{}", unsupported(*.0))]
    UnsupportedFormat(FormatVersion),
    #[error("{0}")]
    Invalid(String),
}

/// Why a bundle of format `version` (another major, or an older minor) cannot be read.
fn unsupported(version: FormatVersion) -> String {
    if version > FORMAT_VERSION {
        format!(
            "bundle format {version} is newer than this hkload reads ({FORMAT_VERSION}); upgrade hkload or rebuild the bundle with a matching hkpack"
        )
    } else {
        format!(
            "bundle format {version} is older than this hkload reads ({FORMAT_VERSION} and later {}.x): rebuild the bundle with hkpack {} or later (`hkpack build`)",
            FORMAT_VERSION.major,
            env!("CARGO_PKG_VERSION")
        )
    }
}
