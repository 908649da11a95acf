//! Opening a bundle: from its folder, from bytes embedded in the program, or from the packages
//! found on a search path; and, before anything in the index is believed, the checks the
//! options ask for (the index's pinned digest, its signature). Everything that trusts or
//! refuses the bytes at the door is here, apart from what is done with them afterwards.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::{Bundle, Inner, ModuleFile, Source, index_error};
use crate::error::{Error, Result};
use crate::index::{INDEX_FILE, Index};
use crate::manifest::{MANIFEST_FILE, Package, Sha256Digest};
use crate::package_set::{self, FoundPackage, TARGET_FILE, TargetPackage};
#[cfg(feature = "signed")]
use crate::signing::SignatureFile;
use crate::signing::{PublicKey, SIGNATURE_FILE, SignatureError};
use crate::target::TargetId;

/// How [`Bundle::open_with`] treats the files it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOptions {
    /// Check every byte hkload uses against its SHA-256 before using it: the index against
    /// its own digest, and each code image before it is loaded against the index's digest of
    /// that image. On by default; turning it off saves the hashing time at start-up and
    /// trusts the files. Trusted keys or a pinned digest turn it on whatever it says.
    pub verify_hashes: bool,
    /// The keys of which one must have signed the bundle (its `bundle.sig`, see
    /// [`crate::signing`]); empty, signatures are not looked at.
    pub trusted_keys: Vec<PublicKey>,
    /// The SHA-256 the index (`bundle.msgpack`) must have, as a lockfile pins a dependency:
    /// every other byte hkload uses hangs from the index's digests.
    pub expect_digest: Option<Sha256Digest>,
}

impl OpenOptions {
    /// Hashes verified, no signature required, no pin.
    pub const DEFAULT: Self = Self {
        verify_hashes: true,
        trusted_keys: Vec::new(),
        expect_digest: None,
    };

    /// Whether every byte used is checked against a digest.
    pub(super) fn verifies(&self) -> bool {
        self.verify_hashes || !self.trusted_keys.is_empty() || self.expect_digest.is_some()
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Bundle {
    /// Opens the bundle folder `dir` (the one `hkpack build` wrote) with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(dir, OpenOptions::default())
    }

    /// Opens the bundle folder `dir`: reads and checks its index's lookup table
    /// (`bundle.msgpack`), and refuses a folder without an index. Nothing else is
    /// read here: the manifest is decoded from the index when asked for, module files are
    /// mapped, checked and hashed when a module is first used (or at
    /// [`LoadedBundle::preload`]), so opening costs the same however many modules there are.
    ///
    /// [`LoadedBundle::preload`]: super::LoadedBundle::preload
    pub fn open_with(dir: impl AsRef<Path>, options: OpenOptions) -> Result<Self> {
        Self::read(dir.as_ref().to_owned(), Source::Dir, options)
    }

    /// A bundle embedded in the program, e.g. with `include_bytes!`: its index and module
    /// files under their file names (the TOML files are never read).
    ///
    /// ```
    /// /// Opens the bundle whose index and module file the program carries, e.g. as
    /// /// `include_bytes!("…/dist/hk-kernels-0.1.0/bundle.msgpack")`.
    /// fn embedded(index: &'static [u8], rmsnorm: &'static [u8]) -> hkload::Result<hkload::Bundle> {
    ///     let files = [("bundle.msgpack", index), ("rmsnorm.hipfb", rmsnorm)];
    ///     hkload::Bundle::from_bytes(&files, hkload::OpenOptions::default())
    /// }
    /// ```
    pub fn from_bytes(
        files: &[(&'static str, &'static [u8])],
        options: OpenOptions,
    ) -> Result<Self> {
        Self::read(
            PathBuf::from("<embedded>"),
            Source::Embedded(files.to_vec()),
            options,
        )
    }

    /// Opens the bundle `name` (`hk-kernels-0.1.0`) from the first folder of `dirs` that holds
    /// it whole (`<name>/`) or its index package (`<name>-index/`); with an index package, each
    /// target's package (`<name>-gfx942/`) is taken from the first folder that holds it, and
    /// the code objects are chosen from those present, as from one bundle. A target package
    /// split from another build is refused, naming both. See [`crate::package_set`].
    ///
    /// ```no_run
    /// // HKLOAD_PATH=/opt/hk-kernels:/usr/share/hk-kernels
    /// let dirs = hkload::package_set::search_path_from_env();
    /// let bundle = hkload::Bundle::open_search_path("hk-kernels-0.1.0", &dirs, Default::default())?;
    /// print!("{}", bundle.explain(&"gfx942:sramecc+:xnack-".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_search_path(
        name: &str,
        dirs: &[impl AsRef<Path>],
        options: OpenOptions,
    ) -> Result<Self> {
        let dirs: Vec<PathBuf> = dirs.iter().map(|d| d.as_ref().to_owned()).collect();
        let Some((origin, whole)) = package_set::find_index(name, &dirs) else {
            return Err(Error::NotOnSearchPath {
                name: name.to_owned(),
                dirs,
            });
        };
        if whole {
            return Self::open_with(origin, options);
        }
        let bundle = Self::read(origin, Source::Packages(Vec::new()), options)?;
        let (package, version) = bundle.table().package();
        let package = Package {
            name: package.to_owned(),
            version: version.to_owned(),
        };
        let digest = bundle.index_digest();
        let mut found = Vec::new();
        for target in bundle.table().build_targets() {
            if let Some(dir) = package_set::find_target_package(name, &target, &dirs) {
                found.push(check_target_package(
                    &dir,
                    &target,
                    &package,
                    &digest,
                    &bundle.inner.origin,
                )?);
            }
        }
        let Inner {
            origin,
            index,
            options,
            ..
        } = Arc::into_inner(bundle.inner).expect("the bundle was not shared yet");
        Ok(Self::assemble(
            origin,
            Source::Packages(found),
            index,
            options,
        ))
    }

    fn read(origin: PathBuf, source: Source, options: OpenOptions) -> Result<Self> {
        let index_path = origin.join(INDEX_FILE);
        let bytes = source.read(&index_path, INDEX_FILE).map_err(|e| {
            let detail = if e.kind() != std::io::ErrorKind::NotFound {
                e.to_string()
            } else if source
                .read(&origin.join(MANIFEST_FILE), MANIFEST_FILE)
                .is_ok()
            {
                format!(
                    "the bundle's index is missing. hkload reads a bundle through its index \
                     alone, whose digest covers every record; the {MANIFEST_FILE} beside it is a \
                     readable copy that nothing verifies. Rebuild the bundle with `hkpack build`"
                )
            } else {
                format!(
                    "no such file; is {} a bundle folder made by `hkpack build`?",
                    origin.display()
                )
            };
            Error::Io {
                path: index_path.clone(),
                detail,
            }
        })?;
        if let Some(expected) = options.expect_digest {
            let found = Sha256Digest::of(&bytes);
            if found != expected {
                return Err(Error::Pinned {
                    path: index_path,
                    expected: expected.to_string(),
                    found: found.to_string(),
                });
            }
        }
        if !options.trusted_keys.is_empty() {
            let signature_path = origin.join(SIGNATURE_FILE);
            check_signature(&source, &signature_path, &bytes, &options.trusted_keys).map_err(
                |source| Error::Signature {
                    path: signature_path,
                    source,
                },
            )?;
        }
        let index = Index::open(bytes, options.verifies()).map_err(index_error(&origin))?;
        Ok(Self::assemble(origin, source, index, options))
    }

    fn assemble(origin: PathBuf, source: Source, index: Index, options: OpenOptions) -> Self {
        let files = index.table().modules().len() * source.file_sets();
        let modules = std::iter::repeat_with(|| ModuleFile {
            bytes: OnceLock::new(),
        })
        .take(files)
        .collect();
        Self {
            inner: Arc::new(Inner {
                origin,
                source,
                index,
                modules,
                options,
            }),
        }
    }
}

/// Checks that one of `trusted` signed the index `bytes`, by the signature file at `path`.
#[cfg(feature = "signed")]
fn check_signature(
    source: &Source,
    path: &Path,
    bytes: &[u8],
    trusted: &[PublicKey],
) -> Result<(), SignatureError> {
    let file = match source.read(path, SIGNATURE_FILE) {
        Ok(text) => String::from_utf8(text.to_vec())
            .map_err(|_| SignatureError::Malformed("it is not UTF-8 text".into()))
            .and_then(|text| SignatureFile::from_toml(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(SignatureError::Unsigned),
        Err(e) => Err(SignatureError::Malformed(e.to_string())),
    }?;
    file.check(bytes, trusted)
}

/// A build without the `signed` feature cannot check a signature, so trusting keys is an error.
#[cfg(not(feature = "signed"))]
fn check_signature(
    _source: &Source,
    _path: &Path,
    _bytes: &[u8],
    _trusted: &[PublicKey],
) -> Result<(), SignatureError> {
    Err(SignatureError::Unsupported)
}

/// Reads the package at `dir` and checks that it is `target`'s package of the index `index`
/// (at `index_dir`), split from that very index.
pub(crate) fn check_target_package(
    dir: &Path,
    target: &TargetId,
    package: &Package,
    index_digest: &Sha256Digest,
    index_dir: &Path,
) -> crate::Result<FoundPackage> {
    let path = dir.join(TARGET_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| crate::Error::Io {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    let found = read_target_package(&text).map_err(|detail| crate::Error::Io {
        path: path.clone(),
        detail: format!("it is not a target package's description: {detail}"),
    })?;
    let same =
        found.package == *package && found.index_digest == *index_digest && found.target == *target;
    if !same {
        return Err(crate::Error::ForeignPackage {
            package: dir.to_owned(),
            package_is: describe(
                &found.package,
                &found.target.to_string(),
                &found.index_digest,
            ),
            index: index_dir.to_owned(),
            index_is: describe(package, &target.to_string(), index_digest),
        });
    }
    Ok(FoundPackage {
        dir: dir.to_owned(),
        target: *target,
    })
}

#[cfg(feature = "packages")]
fn read_target_package(text: &str) -> Result<TargetPackage, String> {
    TargetPackage::from_toml(text)
}

/// A build without the `packages` feature reads no `target.toml` (TOML), so it finds packages
/// but cannot use them.
#[cfg(not(feature = "packages"))]
fn read_target_package(_text: &str) -> Result<TargetPackage, String> {
    Err(
        "this build of hkload reads no per-target packages: enable its `packages` feature, or \
         open the full bundle"
            .into(),
    )
}

/// `hk-kernels 0.1.0 for gfx942, index 3b1f…`: enough to tell two builds apart.
fn describe(package: &Package, target: &str, index_digest: &Sha256Digest) -> String {
    format!(
        "{} {} for {target}, index {index_digest}",
        package.name, package.version
    )
}
