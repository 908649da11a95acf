//! The package's manifests: `manifests/package.toml` (name, version, targets, code-object
//! version, include folders) and one TOML file per kernel module (source, kernels with their
//! declared signatures, defines, flags, per-target overrides).
//!
//! Every problem is reported as `file:line:column: what is wrong`, so a user can jump to it.

mod contract;
mod plausible;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hk_format::abi::Signature;
use hk_format::contract::Contract;
use hk_format::target::TargetId;
use serde::Deserialize;
use toml::Spanned;

/// The file that describes the package, inside the manifests folder.
pub const PACKAGE_FILE: &str = "package.toml";

/// AMD code-object versions hkpack accepts: v4 loads on the oldest supported ROCm, v5 on ROCm
/// 6.0+, v6 (needed for generic targets) on ROCm 6.3+.
pub const CODE_OBJECT_VERSIONS: [u32; 3] = [4, 5, 6];

/// A package: everything `hkpack build` builds.
#[derive(Debug, Clone)]
pub struct Package {
    /// The manifests folder, absolute; every path in a manifest is relative to it.
    pub dir: PathBuf,
    pub name: String,
    pub version: semver::Version,
    pub targets: Vec<TargetId>,
    /// The AMD code-object version of targets not in `code_object_versions`.
    pub code_object_version: u32,
    /// Where `amd_code_object_version` is written in `package.toml`, for messages:
    /// `(line, column)`.
    pub code_object_version_at: (usize, usize),
    /// AMD targets with a code-object version of their own (generic targets need 6), whether
    /// among `targets` or built on request only (`--arch gfx9-4-generic`).
    pub code_object_versions: BTreeMap<TargetId, u32>,
    pub include_dirs: Vec<PathBuf>,
    pub modules: Vec<Module>,
}

/// One kernel module: one source file compiled once per target.
#[derive(Debug, Clone)]
pub struct Module {
    pub name: String,
    /// Where the name is written in the module's manifest, for messages: `(line, column)`.
    pub name_at: (usize, usize),
    /// The module's manifest file.
    pub manifest: PathBuf,
    pub source: PathBuf,
    pub defines: BTreeMap<String, String>,
    pub flags: Vec<String>,
    /// `no_spills = true`: the build fails when any kernel of the module spills registers or
    /// needs scratch (stack) memory on any target. For kernels whose speed rests on keeping
    /// their working set in registers (matrix tiles), where a spill is a defect, not a cost.
    pub no_spills: bool,
    pub kernels: Vec<KernelDecl>,
    pub overrides: BTreeMap<TargetId, TargetOverride>,
    /// `skip_targets`: the targets the module is not built for, each with the reason the
    /// bundle records and `explain` prints (FP8 kernels have no code before sm_89).
    pub skip_targets: BTreeMap<TargetId, String>,
    /// `arch_specific`: the architecture-specific targets (`sm_90a`) the module is built for
    /// as well, when the build's targets include them; in the manifest's order.
    ///
    /// Why a module opts in rather than out: only code written for such a target (behind
    /// `HK_SM90A`) gains from it. Every other module would build the same code twice, doubling
    /// NVIDIA build time and bundle size, while its portable code (`sm_90`) serves those
    /// devices anyway. So a module that does not list a target here is simply not built for
    /// it, and the bundle records nothing about it: it is no `skip_targets` reason, and
    /// `explain` shows the portable code chosen, as it would without the target.
    pub arch_specific: Vec<TargetId>,
}

/// A kernel the module promises, with its declared signature.
#[derive(Debug, Clone)]
pub struct KernelDecl {
    pub symbol: String,
    pub args: Signature,
    /// The launch contract, checked against `args`; `None` if the manifest declares none.
    pub contract: Option<Contract>,
    /// Where the symbol is declared, for messages: `(line, column)`.
    pub declared_at: (usize, usize),
}

/// What changes for one target: another source, more defines, more flags.
#[derive(Debug, Clone, Default)]
pub struct TargetOverride {
    pub source: Option<PathBuf>,
    pub defines: BTreeMap<String, String>,
    pub flags: Vec<String>,
}

/// A manifest problem, located in its file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}:{column}: {message}", path.display())]
pub struct ManifestError {
    pub path: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPackageFile {
    package: RawPackage,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPackage {
    name: Spanned<String>,
    version: Spanned<String>,
    targets: Spanned<Vec<Spanned<String>>>,
    amd_code_object_version: Spanned<u32>,
    /// Targets built with another code-object version than the package's.
    #[serde(default)]
    amd_code_object_versions: BTreeMap<Spanned<String>, Spanned<u32>>,
    #[serde(default)]
    include_dirs: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModuleFile {
    module: RawModule,
    #[serde(default, rename = "kernel")]
    kernels: Vec<RawKernel>,
    #[serde(default, rename = "target")]
    targets: BTreeMap<Spanned<String>, RawOverride>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModule {
    name: Spanned<String>,
    source: Spanned<String>,
    #[serde(default)]
    defines: BTreeMap<String, String>,
    #[serde(default)]
    flags: Vec<String>,
    /// The contract every kernel of the module starts from.
    contract: Option<contract::RawContract>,
    #[serde(default)]
    no_spills: bool,
    /// Target name to the reason the module is not built for it.
    #[serde(default)]
    skip_targets: BTreeMap<Spanned<String>, Spanned<String>>,
    /// Architecture-specific targets the module is built for too (`["sm_90a"]`).
    #[serde(default)]
    arch_specific: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKernel {
    symbol: Spanned<String>,
    args: Vec<Spanned<String>>,
    contract: Option<contract::RawContract>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    source: Option<Spanned<String>>,
    #[serde(default)]
    defines: BTreeMap<String, String>,
    #[serde(default)]
    flags: Vec<String>,
}

/// One manifest file's text, for turning byte spans into line and column.
struct SourceFile {
    path: PathBuf,
    text: String,
}

impl SourceFile {
    fn read(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|e| ManifestError {
            path: path.to_owned(),
            line: 0,
            column: 0,
            message: format!("cannot read the manifest: {e}"),
        })?;
        Ok(Self {
            path: path.to_owned(),
            text,
        })
    }

    fn error(&self, span: std::ops::Range<usize>, message: impl Into<String>) -> ManifestError {
        let before = &self.text[..span.start.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        ManifestError {
            path: self.path.clone(),
            line,
            column,
            message: message.into(),
        }
    }

    fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, ManifestError> {
        toml::from_str(&self.text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            self.error(span, e.message().trim_end().to_owned())
        })
    }

    /// A path written in this manifest, which must exist relative to the manifest's folder.
    /// It is returned as written: every manifest lives in the package's manifests folder, and
    /// the compiler runs there, so relative paths keep cache keys the same in every checkout.
    fn existing_path(
        &self,
        written: &Spanned<String>,
        what: &str,
    ) -> Result<PathBuf, ManifestError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let path = dir.join(written.get_ref());
        if path.exists() {
            Ok(PathBuf::from(written.get_ref()))
        } else {
            Err(self.error(
                written.span(),
                format!(
                    "{what} `{}` does not exist (looked for {})",
                    written.get_ref(),
                    path.display()
                ),
            ))
        }
    }

    fn target(&self, written: &Spanned<String>) -> Result<TargetId, ManifestError> {
        written
            .get_ref()
            .parse()
            .map_err(|e| self.error(written.span(), format!("unknown target: {e}")))
    }
}

impl Package {
    /// Reads `package.toml` and every other `*.toml` in `dir` as a module manifest.
    pub fn load(dir: &Path) -> Result<Self, ManifestError> {
        let dir = &std::path::absolute(dir).map_err(|e| ManifestError {
            path: dir.to_owned(),
            line: 0,
            column: 0,
            message: format!("cannot resolve the manifests folder: {e}"),
        })?;
        let file = SourceFile::read(&dir.join(PACKAGE_FILE))?;
        let raw: RawPackageFile = file.parse()?;
        let raw = raw.package;

        let name = raw.name.get_ref();
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return Err(file.error(
                raw.name.span(),
                format!("package name `{name}` must be letters, digits, `-` and `_`"),
            ));
        }
        let version = raw.version.get_ref().parse().map_err(|e| {
            file.error(
                raw.version.span(),
                format!(
                    "version `{}` is not semver (e.g. 1.2.3): {e}",
                    raw.version.get_ref()
                ),
            )
        })?;
        let targets = unique_targets(&file, raw.targets.get_ref())?;
        if targets.is_empty() {
            return Err(file.error(raw.targets.span(), "`targets` lists no target"));
        }
        let check_version = |written: &Spanned<u32>| {
            let version = *written.get_ref();
            if CODE_OBJECT_VERSIONS.contains(&version) {
                Ok(version)
            } else {
                Err(file.error(
                    written.span(),
                    format!(
                        "AMD code object version {version} is not one of 4, 5, 6 (5 loads on ROCm 6.0+, 6 needs ROCm 6.3+)"
                    ),
                ))
            }
        };
        let code_object_version = check_version(&raw.amd_code_object_version)?;
        let mut code_object_versions = BTreeMap::new();
        for (target, version) in &raw.amd_code_object_versions {
            let id = file.target(target)?;
            let TargetId::Amd(amd) = id else {
                return Err(file.error(
                    target.span(),
                    format!("{id} is an NVIDIA target, which has no AMD code-object version; remove it from amd_code_object_versions"),
                ));
            };
            let checked = check_version(version)?;
            if amd.processor().is_generic() && checked < 6 {
                return Err(file.error(
                    version.span(),
                    format!("{id} is a generic target, which needs code object version 6 (ROCm 6.3+); give it 6"),
                ));
            }
            code_object_versions.insert(id, checked);
        }
        let include_dirs = raw
            .include_dirs
            .iter()
            .map(|d| file.existing_path(d, "include folder"))
            .collect::<Result<_, _>>()?;

        // The targets a module may skip: those built by default, and those given a
        // code-object version of their own, which the package is ready to build on request.
        let mut known = targets.clone();
        known.extend(
            code_object_versions
                .keys()
                .filter(|target| !targets.contains(target)),
        );
        let modules = module_files(dir)?
            .iter()
            .map(|path| Module::load(path, &known))
            .collect::<Result<Vec<_>, _>>()?;
        check_unique_names(&modules)?;
        check_unique_symbols(&modules)?;
        let at = file.error(raw.amd_code_object_version.span(), "");
        let package = Self {
            dir: dir.to_owned(),
            name: name.clone(),
            version,
            targets,
            code_object_version,
            code_object_version_at: (at.line, at.column),
            code_object_versions,
            include_dirs,
            modules,
        };
        package.check_code_object_versions(&package.targets)?;
        Ok(package)
    }

    /// Fails, before anything is compiled, when one of `targets` (the build's: the default
    /// ones or `--arch`'s) is a generic target built with a code-object version below 6: clang
    /// would fail in its back end once per module. The error names the setting that fixes it.
    pub fn check_code_object_versions(&self, targets: &[TargetId]) -> Result<(), ManifestError> {
        for target in targets {
            let generic = matches!(target, TargetId::Amd(amd) if amd.processor().is_generic());
            let version = self.code_object_version_for(target);
            if generic && version < 6 {
                let (line, column) = self.code_object_version_at;
                return Err(ManifestError {
                    path: self.dir.join(PACKAGE_FILE),
                    line,
                    column,
                    message: format!(
                        "{target} is a generic target, which needs code object version 6 (ROCm 6.3+), but this package builds it with version {version}; add `amd_code_object_versions = {{ \"{target}\" = 6 }}` to [package] in {PACKAGE_FILE}"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The AMD code-object version `target` is built with.
    pub fn code_object_version_for(&self, target: &TargetId) -> u32 {
        self.code_object_versions
            .get(target)
            .copied()
            .unwrap_or(self.code_object_version)
    }

    /// `<name>-<version>`, the bundle folder's name.
    pub fn bundle_name(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }
}

fn unique_targets(
    file: &SourceFile,
    written: &[Spanned<String>],
) -> Result<Vec<TargetId>, ManifestError> {
    let mut targets = Vec::with_capacity(written.len());
    for item in written {
        let target = file.target(item)?;
        if targets.contains(&target) {
            return Err(file.error(item.span(), format!("target {target} is listed twice")));
        }
        targets.push(target);
    }
    Ok(targets)
}

/// The module manifests in `dir`, sorted by file name so builds do not depend on the order
/// the file system lists them in.
fn module_files(dir: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ManifestError {
        path: dir.to_owned(),
        line: 0,
        column: 0,
        message: format!("cannot list the manifests folder: {e}"),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "toml")
                && p.file_name().is_some_and(|n| n != PACKAGE_FILE)
        })
        .collect();
    files.sort();
    Ok(files)
}

impl Module {
    /// Reads the module manifest at `path`, of a package that can build `targets` (its
    /// default ones and those it gives a code-object version of their own).
    fn load(path: &Path, targets: &[TargetId]) -> Result<Self, ManifestError> {
        let file = SourceFile::read(path)?;
        let raw: RawModuleFile = file.parse()?;
        let name = raw.module.name.get_ref();
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(file.error(
                raw.module.name.span(),
                format!("module name `{name}` must be letters, digits, `-` and `_`"),
            ));
        }
        let source = file.existing_path(&raw.module.source, "source file")?;
        if raw.kernels.is_empty() {
            return Err(file.error(
                raw.module.name.span(),
                "the module declares no kernel: add a [[kernel]] table with `symbol` and `args`",
            ));
        }
        let mut kernels: Vec<KernelDecl> = Vec::with_capacity(raw.kernels.len());
        for kernel in &raw.kernels {
            let symbol = kernel.symbol.get_ref();
            if kernels.iter().any(|k| &k.symbol == symbol) {
                return Err(file.error(
                    kernel.symbol.span(),
                    format!("kernel `{symbol}` is declared twice in this module"),
                ));
            }
            let mut args = Signature::with_capacity(kernel.args.len());
            let mut extents = Vec::new();
            for written in &kernel.args {
                let (param, extent) = contract::param_with_extent(&file, symbol, written)?;
                if args
                    .iter()
                    .any(|p: &hk_format::abi::Param| p.name == param.name)
                {
                    return Err(file.error(
                        written.span(),
                        format!(
                            "kernel `{symbol}`: two arguments are named `{}`",
                            param.name
                        ),
                    ));
                }
                if let Some(extent) = extent {
                    extents.push((param.name.clone(), extent));
                }
                args.push(param);
            }
            let contract = contract::kernel_contract(
                &file,
                symbol,
                &args,
                &extents,
                raw.module.contract.as_ref(),
                kernel.contract.as_ref(),
                kernel.symbol.span().start,
            )?;
            let at = file.error(kernel.symbol.span(), "");
            kernels.push(KernelDecl {
                symbol: symbol.clone(),
                args,
                contract,
                declared_at: (at.line, at.column),
            });
        }
        let mut overrides = BTreeMap::new();
        for (target, raw_override) in &raw.targets {
            let id = file.target(target)?;
            let source = raw_override
                .source
                .as_ref()
                .map(|s| file.existing_path(s, "source file"))
                .transpose()?;
            overrides.insert(
                id,
                TargetOverride {
                    source,
                    defines: raw_override.defines.clone(),
                    flags: raw_override.flags.clone(),
                },
            );
        }
        let mut arch_specific: Vec<TargetId> = Vec::new();
        for target in &raw.module.arch_specific {
            let id = file.target(target)?;
            if !id.is_arch_specific() {
                return Err(file.error(
                    target.span(),
                    format!("{id} is a portable target, which every module is built for; `arch_specific` lists architecture-specific targets such as sm_90a"),
                ));
            }
            if arch_specific.contains(&id) {
                return Err(file.error(
                    target.span(),
                    format!("{id} is listed twice in `arch_specific`"),
                ));
            }
            arch_specific.push(id);
        }
        for target in raw.targets.keys() {
            let id = file.target(target)?;
            if id.is_arch_specific() && !arch_specific.contains(&id) {
                return Err(file.error(
                    target.span(),
                    format!("module `{name}` has a [target.{id}] override, but it is built for {id} only if `arch_specific` lists it; add `arch_specific = [\"{id}\"]` to [module] or remove the override"),
                ));
            }
        }
        let mut skip_targets = BTreeMap::new();
        for (target, reason) in &raw.module.skip_targets {
            let id = file.target(target)?;
            if id.is_arch_specific() {
                return Err(file.error(
                    target.span(),
                    format!("module `{name}` skips {id}, but a module is built for an architecture-specific target only if its `arch_specific` lists it; remove {id} from skip_targets"),
                ));
            }
            // A target the package does not build would skip nothing: most likely a typo or
            // a target since removed, which would leave the module unbuilt nowhere it should be.
            if !targets.contains(&id) {
                let listed: Vec<String> = targets.iter().map(TargetId::to_string).collect();
                return Err(file.error(
                    target.span(),
                    format!(
                        "module `{name}` skips {id}, which is not among the package's targets ({}); remove it from skip_targets, or add it to `targets` in {PACKAGE_FILE} (or, for an AMD target built only with `--arch`, to `amd_code_object_versions` there)",
                        listed.join(", ")
                    ),
                ));
            }
            if reason.get_ref().trim().is_empty() {
                return Err(file.error(
                    reason.span(),
                    format!("say why module `{name}` is not built for {id}: the bundle records the reason and `explain` prints it"),
                ));
            }
            if overrides.contains_key(&id) {
                return Err(file.error(
                    target.span(),
                    format!("module `{name}` skips {id} but also has a [target.{id}] override for it; remove one"),
                ));
            }
            skip_targets.insert(id, reason.get_ref().clone());
        }
        let name_at = file.error(raw.module.name.span(), "");
        Ok(Self {
            name: name.clone(),
            name_at: (name_at.line, name_at.column),
            manifest: path.to_owned(),
            source,
            defines: raw.module.defines,
            flags: raw.module.flags,
            no_spills: raw.module.no_spills,
            kernels,
            overrides,
            skip_targets,
            arch_specific,
        })
    }

    /// Whether the module is built for `target`: one of the build's targets that it neither
    /// skips nor, being architecture-specific, leaves out of `arch_specific`.
    pub fn builds_for(&self, target: &TargetId) -> bool {
        self.not_built_reason(target).is_none()
    }

    /// Why the module is not built for `target`, or `None` when it is: the manifest's
    /// `skip_targets` reason, or the target being architecture-specific and not one the module
    /// lists in `arch_specific`.
    pub fn not_built_reason(&self, target: &TargetId) -> Option<Cow<'_, str>> {
        if let Some(reason) = self.skip_targets.get(target) {
            return Some(Cow::Borrowed(reason));
        }
        (target.is_arch_specific() && !self.arch_specific.contains(target)).then_some(
            Cow::Borrowed(
                "architecture-specific, and the module's `arch_specific` does not list it",
            ),
        )
    }
}

/// A module name may be used once in a package: it names the module's files in the bundle,
/// and a second module of the same name would overwrite the first one's.
fn check_unique_names(modules: &[Module]) -> Result<(), ManifestError> {
    for (i, module) in modules.iter().enumerate() {
        if let Some(first) = modules[..i].iter().find(|m| m.name == module.name) {
            let (line, column) = module.name_at;
            return Err(ManifestError {
                path: module.manifest.clone(),
                line,
                column,
                message: format!(
                    "module `{}` is also named by {}; module names must be unique in a package",
                    module.name,
                    first.manifest.display()
                ),
            });
        }
    }
    Ok(())
}

/// A symbol may exist once in the whole package: hkload finds kernels by name alone.
fn check_unique_symbols(modules: &[Module]) -> Result<(), ManifestError> {
    let mut seen: BTreeMap<&str, &Module> = BTreeMap::new();
    for module in modules {
        for kernel in &module.kernels {
            if let Some(first) = seen.insert(&kernel.symbol, module) {
                let (line, column) = kernel.declared_at;
                return Err(ManifestError {
                    path: module.manifest.clone(),
                    line,
                    column,
                    message: format!(
                        "kernel `{}` is also declared by module `{}` ({}); symbols must be unique in a package",
                        kernel.symbol,
                        first.name,
                        first.manifest.display()
                    ),
                });
            }
        }
    }
    Ok(())
}
