//! Writing a bundle folder: one clang offload bundle per module (plain by default, or
//! CCOB-compressed), one ABI file per module, `bundle.toml`, and the index that holds the same
//! records for hkload to read fast (`bundle.msgpack`), assembled in a staging folder beside the
//! destination and moved into place whole, so `dist/` never holds a half-written bundle (and
//! what a killed build left beside it is removed by the next: see [`crate::staging`]).

use std::path::{Path, PathBuf};

use hk_code_object::KernelFacts;
use hk_format::index::{INDEX_FILE, Index};
use hk_format::manifest::{
    ABI_EXTENSION, Blake3Digest, BundleManifest, EntryRecord, FORMAT_VERSION, KernelAbi,
    KernelRecord, MANIFEST_FILE, ModuleAbi, ModuleRecord, NotBuilt, Package as PackageRecord,
    Provenance, Sha256Digest, Toolchain as ToolchainRecord,
};
use hk_format::offload;
use hk_format::target::{EntryId, SmArch, TargetId};
use hkload::select::choose;

use crate::cache::{Cache, CacheError};
use crate::manifest::{Module, Package};
use crate::staging::{Aside, RETIRED, STAGING, clean_leftovers};

/// zstd level for module files: bundles are built once and loaded many times, so spend the
/// build time on a smaller file (level 19 stays in milliseconds for code objects).
pub const ZSTD_LEVEL: i32 = 19;

/// The file-name extension of a module file, as clang names HIP fat binaries.
pub const MODULE_EXTENSION: &str = "hipfb";

/// One module's compiled code for one target.
#[derive(Debug, Clone)]
pub struct TargetCode {
    pub target: TargetId,
    /// The code images, in bundle order (for NVIDIA: cubin first, then PTX).
    pub images: Vec<(EntryId, Vec<u8>)>,
    /// Facts of the module's kernels, in declaration order.
    pub kernels: Vec<KernelFacts>,
}

/// Everything a bundle folder is made from.
#[derive(Debug)]
pub struct BundleContents<'p> {
    pub package: &'p Package,
    pub toolchain: ToolchainRecord,
    pub provenance: Provenance,
    pub targets: Vec<TargetId>,
    /// Per module (in package order), its code per target (in target order).
    pub modules: Vec<(&'p Module, Vec<TargetCode>)>,
    pub compress: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("cannot write {}: {detail}", path.display())]
    Io { path: PathBuf, detail: String },
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("module `{module}`: {source}")]
    Format {
        module: String,
        #[source]
        source: offload::FormatError,
    },
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> PackageError + '_ {
    move |e| PackageError::Io {
        path: path.to_owned(),
        detail: e.to_string(),
    }
}

/// Writes the bundle into `out/<name>-<version>/` and returns that folder and its total size.
/// If the folder already holds exactly these bytes it is left untouched. Compressed module
/// files come from `cache` when the same bundle was compressed before.
pub fn write(
    contents: &BundleContents<'_>,
    out: &Path,
    cache: &Cache,
) -> Result<(PathBuf, u64), PackageError> {
    let mut manifest = BundleManifest {
        format_version: FORMAT_VERSION,
        targets: contents.targets.clone(),
        package: PackageRecord {
            name: contents.package.name.clone(),
            version: contents.package.version.to_string(),
        },
        toolchain: contents.toolchain.clone(),
        modules: Vec::new(),
        provenance: Some(contents.provenance.clone()),
    };
    let mut files = Vec::new();
    let mut abis = Vec::new();
    for (module, code) in &contents.modules {
        let (record, bytes, abi) =
            module_files(module, code, &contents.targets, contents.compress, cache)?;
        files.push((record.file.clone(), bytes));
        files.push((record.abi_file.clone(), abi.to_toml().into_bytes()));
        manifest.modules.push(record);
        abis.push(abi);
    }
    files.push((MANIFEST_FILE.to_owned(), manifest.to_toml().into_bytes()));
    files.push((INDEX_FILE.to_owned(), Index::encode(&manifest, &abis)));

    let total = files.iter().map(|(_, b)| b.len() as u64).sum();
    let dest = write_folder(out, &contents.package.bundle_name(), &files)?;
    Ok((dest, total))
}

/// Writes `files` (name, bytes) as the folder `out/<name>`, assembled in a staging folder and
/// moved into place whole, and returns the folder. A folder that already holds exactly these
/// bytes is left untouched.
pub fn write_folder(
    out: &Path,
    name: &str,
    files: &[(String, Vec<u8>)],
) -> Result<PathBuf, PackageError> {
    std::fs::create_dir_all(out).map_err(io_error(out))?;
    clean_leftovers(out, &[STAGING, RETIRED]);
    let dest = out.join(name);
    if holds_exactly(&dest, files) {
        return Ok(dest);
    }
    let staging = Aside::create(out, STAGING).map_err(io_error(out))?;
    for (name, bytes) in files {
        let path = staging.path().join(name);
        std::fs::write(&path, bytes).map_err(io_error(&path))?;
    }
    replace_dir(staging, &dest)?;
    Ok(dest)
}

/// A module's record for the manifest, its bundle file and its ABI.
fn module_files(
    module: &Module,
    code: &[TargetCode],
    targets: &[TargetId],
    compress: bool,
    cache: &Cache,
) -> Result<(ModuleRecord, Vec<u8>, ModuleAbi), PackageError> {
    let images: Vec<(String, &[u8])> = bundle_order(code)
        .map(|(id, bytes)| (id.to_string(), bytes.as_slice()))
        .collect();
    let borrowed: Vec<(&str, &[u8])> = images.iter().map(|(id, b)| (id.as_str(), *b)).collect();
    let format = |source| PackageError::Format {
        module: module.name.clone(),
        source,
    };
    let plain = offload::write_bundle(&borrowed).map_err(format)?;
    let bytes = if compress {
        cache.derived(&format!("ccob-zstd-{ZSTD_LEVEL}"), &plain, |plain| {
            offload::compress(plain, ZSTD_LEVEL).map_err(format)
        })?
    } else {
        plain
    };
    let abi = ModuleAbi {
        kernels: kernel_records(module, code),
    };
    let abi_toml = abi.to_toml();
    let entries = bundle_order(code)
        .map(|(id, image)| EntryRecord {
            id: *id,
            size: image.len() as u64,
            sha256: Sha256Digest::of(image),
            blake3: Blake3Digest::of(image),
        })
        .collect();
    let record = ModuleRecord {
        name: module.name.clone(),
        file: format!("{}.{MODULE_EXTENSION}", module.name),
        size: bytes.len() as u64,
        sha256: Sha256Digest::of(&bytes),
        compressed: compress,
        kernels: module.kernels.iter().map(|k| k.symbol.clone()).collect(),
        abi_file: format!("{}.{ABI_EXTENSION}", module.name),
        abi_sha256: Sha256Digest::of(abi_toml.as_bytes()),
        entries,
        not_built: targets
            .iter()
            .filter_map(|target| {
                let reason = module.skip_targets.get(target)?;
                Some(NotBuilt {
                    target: *target,
                    reason: reason.clone(),
                })
            })
            .collect(),
        blake3: Blake3Digest::of(&bytes),
    };
    Ok((record, bytes, abi))
}

fn kernel_records(module: &Module, code: &[TargetCode]) -> Vec<KernelRecord> {
    module
        .kernels
        .iter()
        .enumerate()
        .map(|(i, decl)| KernelRecord {
            symbol: decl.symbol.clone(),
            args: decl.args.clone(),
            contract: decl.contract.clone(),
            targets: code
                .iter()
                .map(|t| kernel_abi(t.target, &t.kernels[i]))
                .collect(),
        })
        .collect()
}

/// The code images of a module in the order they go into its bundle: native code (AMD code
/// objects and cubins) in target order first, then the PTX some device would run. A device's
/// native entry then sits early in the bundle, and loading it decompresses nothing past it.
fn bundle_order(code: &[TargetCode]) -> impl Iterator<Item = &(EntryId, Vec<u8>)> {
    let images = || code.iter().flat_map(|t| &t.images);
    let is_ptx = |(id, _): &&(EntryId, Vec<u8>)| matches!(id, EntryId::Ptx(_));
    let ids: Vec<EntryId> = images().map(|(id, _)| *id).collect();
    images().filter(move |image| !is_ptx(image)).chain(
        images()
            .filter(move |(id, _)| matches!(id, EntryId::Ptx(arch) if ptx_is_chosen(*arch, &ids))),
    )
}

/// Whether some NVIDIA device would choose the PTX for `arch` among `entries`. It is dead
/// weight where cubins and newer PTX serve every device it could: with cubins for sm_80 and
/// sm_90 and PTX for both, sm_8x devices take the sm_80 cubin and newer ones the compute_90
/// PTX, so the compute_80 PTX (a third of a module file) would never load.
///
/// The devices tried are every architecture from `arch`'s major version to one past the
/// newest in `entries`: the choice compares a device only with the entries' versions, so any
/// newer device chooses as the first of the next major does.
fn ptx_is_chosen(arch: SmArch, entries: &[EntryId]) -> bool {
    let newest = entries
        .iter()
        .filter_map(|id| match id {
            EntryId::Cubin(arch) | EntryId::Ptx(arch) => Some(arch.major()),
            EntryId::AmdCodeObject(_) => None,
        })
        .max()
        .unwrap_or(arch.major());
    let this = EntryId::Ptx(arch);
    (arch.major()..=newest + 1)
        .flat_map(|major| (0..=9).filter_map(move |minor| SmArch::new(major, minor).ok()))
        .any(|device| {
            choose(&TargetId::Nvidia(device), entries).is_some_and(|(i, _)| entries[i] == this)
        })
}

/// What the bundle records of a kernel's code for `target`: the code object's facts, with
/// arguments reduced to their offsets (their sizes and kinds are the declared ones, checked).
fn kernel_abi(target: TargetId, facts: &KernelFacts) -> KernelAbi {
    KernelAbi {
        target,
        arg_offsets: facts.args.iter().map(|a| a.offset).collect(),
        kernarg_size: facts.kernarg_size,
        kernarg_align: facts.kernarg_align,
        sgpr_count: facts.sgpr_count,
        vgpr_count: facts.vgpr_count,
        agpr_count: facts.agpr_count,
        registers: facts.registers,
        spills: facts.sgpr_spill_count + facts.vgpr_spill_count,
        group_segment_size: facts.group_segment_size,
        private_segment_size: facts.private_segment_size,
        wavefront_size: facts.wavefront_size,
        max_flat_workgroup_size: facts.max_flat_workgroup_size,
    }
}

/// Whether `dir` holds exactly `files` with exactly these bytes (a no-op rebuild).
fn holds_exactly(dir: &Path, files: &[(String, Vec<u8>)]) -> bool {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return false;
    };
    listing.count() == files.len()
        && files.iter().all(|(name, bytes)| {
            std::fs::read(dir.join(name)).is_ok_and(|on_disk| on_disk == *bytes)
        })
}

/// Moves the finished `staging` folder to `dest`, replacing what was there. Each step is a
/// rename, so `dest` is at every moment either the old bundle whole, absent, or the new one
/// whole.
fn replace_dir(staging: Aside, dest: &Path) -> Result<(), PackageError> {
    let parent = dest.parent().unwrap_or(Path::new("."));
    let retired = Aside::create(parent, RETIRED).map_err(io_error(parent))?;
    let old = retired.path().join("bundle");
    let had_old = match std::fs::rename(dest, &old) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(io_error(dest)(e)),
    };
    if let Err(e) = std::fs::rename(staging.path(), dest) {
        // Put the old bundle back rather than leave nothing.
        if had_old {
            let _ = std::fs::rename(&old, dest);
        }
        return Err(io_error(dest)(e));
    }
    Ok(())
}
