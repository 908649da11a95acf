//! Clang offload bundle entry IDs: which code image an entry holds (an AMD code object, an
//! NVIDIA cubin or PTX) and for which target, as in
//! `hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`. A format of its own around a target ID
//! (`id`): a kind, a triple, and for PTX a virtual architecture, with errors of its own.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::id::{AmdTarget, SmArch, TargetId, TargetIdError, Vendor};
use crate::image::ImageKind;

/// The triple of AMD entries, with the empty environment that gives the double dash: CLR
/// expects exactly this spelling.
const AMD_TRIPLE: &str = "amdgcn-amd-amdhsa--";
const NVIDIA_TRIPLE: &str = "nvptx64-nvidia-cuda-";

/// The ID of one code image in a clang offload bundle: the kind of image and the target it is
/// built for. They order by kind, then by target: a stable order for sorting, not a ranking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryId {
    /// An AMDGPU code object (ELF): `hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`.
    AmdCodeObject(AmdTarget),
    /// An NVIDIA cubin for one architecture: `cuda-nvptx64-nvidia-cuda-sm_90`.
    Cubin(SmArch),
    /// NVIDIA PTX for a virtual architecture, compiled by the driver when loaded:
    /// `cuda-nvptx64-nvidia-cuda-compute_90`.
    Ptx(SmArch),
}

impl TargetId {
    /// The entries a build for this target can make: an AMD code object, or an NVIDIA cubin and
    /// PTX. What a target a module skips would have offered a device.
    ///
    /// An arch-specific target (`sm_90a`) is built to PTX too (`compute_90a`), but that PTX
    /// ships only in a build without ptxas: the driver would JIT it for compute capability 9.0
    /// alone, where the cubin already runs without a JIT, and devices newer than any cubin
    /// take the portable PTX (`compute_90`), which is what gives forward compatibility.
    /// hkpack drops it as it drops every PTX that no device would choose.
    pub fn entry_ids(self) -> Vec<EntryId> {
        match self {
            Self::Amd(target) => vec![EntryId::AmdCodeObject(target)],
            Self::Nvidia(arch) => vec![EntryId::Cubin(arch), EntryId::Ptx(arch)],
        }
    }
}

impl EntryId {
    /// The target the image is built for.
    pub fn target(&self) -> TargetId {
        match *self {
            Self::AmdCodeObject(target) => TargetId::Amd(target),
            Self::Cubin(arch) | Self::Ptx(arch) => TargetId::Nvidia(arch),
        }
    }

    /// The same kind of entry for [`TargetId::portable`]: `cuda-nvptx64-nvidia-cuda-sm_90` for
    /// `cuda-nvptx64-nvidia-cuda-sm_90a`; any other entry is its own.
    pub fn portable(&self) -> EntryId {
        match *self {
            Self::AmdCodeObject(target) => Self::AmdCodeObject(target),
            Self::Cubin(arch) => Self::Cubin(arch.portable()),
            Self::Ptx(arch) => Self::Ptx(arch.portable()),
        }
    }

    /// How the image is handed to a driver.
    pub fn image_kind(&self) -> ImageKind {
        match self {
            Self::AmdCodeObject(_) => ImageKind::AmdCodeObject,
            Self::Cubin(_) => ImageKind::Cubin,
            Self::Ptx(_) => ImageKind::Ptx,
        }
    }
}

impl FromStr for EntryId {
    type Err = EntryIdError;

    /// Parses an entry ID. `hip-` is read as `hipv4-`, as clang's unbundler does.
    fn from_str(id: &str) -> Result<Self, Self::Err> {
        let (kind, rest) = id.split_once('-').unwrap_or((id, ""));
        let triple = match kind {
            "hip" | "hipv4" => AMD_TRIPLE,
            "cuda" => NVIDIA_TRIPLE,
            _ => {
                return Err(EntryIdError::UnsupportedKind {
                    id: id.to_owned(),
                    kind: kind.to_owned(),
                });
            }
        };
        let spelled = rest
            .strip_prefix(triple)
            .ok_or_else(|| EntryIdError::UnexpectedTriple {
                id: id.to_owned(),
                kind: kind.to_owned(),
                expected: triple,
            })?;
        let bad_target = |reason| EntryIdError::Target {
            id: id.to_owned(),
            reason,
        };
        let entry = match spelled.strip_prefix("compute_") {
            Some(digits) if kind == "cuda" => {
                Self::Ptx(SmArch::parse_digits(spelled, digits).map_err(bad_target)?)
            }
            _ => match (kind, spelled.parse().map_err(bad_target)?) {
                ("cuda", TargetId::Nvidia(arch)) => Self::Cubin(arch),
                ("hip" | "hipv4", TargetId::Amd(target)) => Self::AmdCodeObject(target),
                (_, target) => {
                    return Err(EntryIdError::KindTargetMismatch {
                        id: id.to_owned(),
                        kind: kind.to_owned(),
                        vendor: target.vendor(),
                    });
                }
            },
        };
        Ok(entry)
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AmdCodeObject(target) => write!(f, "hipv4-{AMD_TRIPLE}{target}"),
            Self::Cubin(arch) => write!(f, "cuda-{NVIDIA_TRIPLE}{arch}"),
            Self::Ptx(arch) => write!(f, "cuda-{NVIDIA_TRIPLE}{}", arch.compute_name()),
        }
    }
}

impl Serialize for EntryId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::text::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for EntryId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::text::deserialize(deserializer)
    }
}

/// A bundle entry ID that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryIdError {
    #[error(
        "bundle entry `{id}` has offload kind `{kind}`, which holds no GPU code hkload loads; \
         GPU entries start with hipv4-, hip- or cuda-"
    )]
    UnsupportedKind { id: String, kind: String },
    #[error(
        "bundle entry `{id}` does not continue with the triple every `{kind}` entry uses; \
         write it as {kind}-{expected}<target ID>"
    )]
    UnexpectedTriple {
        id: String,
        kind: String,
        expected: &'static str,
    },
    #[error(
        "bundle entry `{id}` names an {vendor} target under the `{kind}` kind; AMD code objects \
         are hipv4-amdgcn-amd-amdhsa--<target ID>, NVIDIA images \
         cuda-nvptx64-nvidia-cuda-sm_XY (cubin) or cuda-nvptx64-nvidia-cuda-compute_XY (PTX)"
    )]
    KindTargetMismatch {
        id: String,
        kind: String,
        vendor: Vendor,
    },
    #[error("bundle entry `{id}` has a bad target: {reason}")]
    Target { id: String, reason: TargetIdError },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::FeatureName;
    use crate::target::tests::{processor, target};

    fn entry(text: &str) -> EntryId {
        text.parse()
            .unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    #[test]
    fn parses_and_prints_entry_ids() {
        for (text, canonical, kind) in [
            (
                "hipv4-amdgcn-amd-amdhsa--gfx942:xnack-:sramecc+",
                "hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-",
                ImageKind::AmdCodeObject,
            ),
            (
                "hip-amdgcn-amd-amdhsa--gfx90a",
                "hipv4-amdgcn-amd-amdhsa--gfx90a",
                ImageKind::AmdCodeObject,
            ),
            (
                "hipv4-amdgcn-amd-amdhsa--gfx9-4-generic",
                "hipv4-amdgcn-amd-amdhsa--gfx9-4-generic",
                ImageKind::AmdCodeObject,
            ),
            (
                "cuda-nvptx64-nvidia-cuda-sm_90",
                "cuda-nvptx64-nvidia-cuda-sm_90",
                ImageKind::Cubin,
            ),
            (
                "cuda-nvptx64-nvidia-cuda-compute_90",
                "cuda-nvptx64-nvidia-cuda-compute_90",
                ImageKind::Ptx,
            ),
            (
                "cuda-nvptx64-nvidia-cuda-compute_120",
                "cuda-nvptx64-nvidia-cuda-compute_120",
                ImageKind::Ptx,
            ),
            (
                "cuda-nvptx64-nvidia-cuda-sm_90a",
                "cuda-nvptx64-nvidia-cuda-sm_90a",
                ImageKind::Cubin,
            ),
            (
                "cuda-nvptx64-nvidia-cuda-compute_90a",
                "cuda-nvptx64-nvidia-cuda-compute_90a",
                ImageKind::Ptx,
            ),
        ] {
            let parsed = entry(text);
            assert_eq!(parsed.to_string(), canonical);
            assert_eq!(parsed.image_kind(), kind, "{text}");
            assert_eq!(entry(canonical), parsed, "{canonical} does not round-trip");
        }
        assert_eq!(
            entry("cuda-nvptx64-nvidia-cuda-sm_80").target(),
            target("sm_80")
        );
        assert_eq!(
            entry("cuda-nvptx64-nvidia-cuda-compute_80").target(),
            target("sm_80")
        );
        assert_eq!(
            entry("cuda-nvptx64-nvidia-cuda-sm_100a").target(),
            target("sm_100a")
        );
        assert_eq!(
            entry("cuda-nvptx64-nvidia-cuda-compute_90a").target(),
            target("sm_90a")
        );
        assert_eq!(
            entry("hipv4-amdgcn-amd-amdhsa--gfx950").target(),
            target("gfx950")
        );
    }

    #[test]
    fn rejects_bad_entry_ids() {
        let error = |text: &str| text.parse::<EntryId>().unwrap_err();
        for (id, kind) in [
            ("host-x86_64-unknown-linux-gnu-", "host"),
            ("openmp-amdgcn-amd-amdhsa--gfx942", "openmp"),
            ("hipv5-amdgcn-amd-amdhsa--gfx942", "hipv5"),
            ("gfx942", "gfx942"),
            ("", ""),
        ] {
            assert_eq!(
                error(id),
                EntryIdError::UnsupportedKind {
                    id: id.into(),
                    kind: kind.into()
                },
                "{id}"
            );
        }
        for (id, kind, expected) in [
            (
                "hipv4-amdgcn-amd-amdhsa-unknown-gfx942",
                "hipv4",
                AMD_TRIPLE,
            ),
            ("hipv4-gfx942", "hipv4", AMD_TRIPLE),
            ("hipv4", "hipv4", AMD_TRIPLE),
            ("cuda-nvptx-nvidia-cuda-sm_90", "cuda", NVIDIA_TRIPLE),
        ] {
            assert_eq!(
                error(id),
                EntryIdError::UnexpectedTriple {
                    id: id.into(),
                    kind: kind.into(),
                    expected
                },
                "{id}"
            );
        }
        assert_eq!(
            error("hipv4-amdgcn-amd-amdhsa--sm_90"),
            EntryIdError::KindTargetMismatch {
                id: "hipv4-amdgcn-amd-amdhsa--sm_90".into(),
                kind: "hipv4".into(),
                vendor: Vendor::Nvidia,
            }
        );
        assert_eq!(
            error("cuda-nvptx64-nvidia-cuda-gfx942"),
            EntryIdError::KindTargetMismatch {
                id: "cuda-nvptx64-nvidia-cuda-gfx942".into(),
                kind: "cuda".into(),
                vendor: Vendor::Amd,
            }
        );
        assert_eq!(
            error("hipv4-amdgcn-amd-amdhsa--gfx1100:xnack-"),
            EntryIdError::Target {
                id: "hipv4-amdgcn-amd-amdhsa--gfx1100:xnack-".into(),
                reason: TargetIdError::UnsupportedFeature {
                    target: "gfx1100:xnack-".into(),
                    processor: processor("gfx1100"),
                    feature: FeatureName::Xnack,
                },
            }
        );
        // PTX names only exist for NVIDIA entries.
        assert!(matches!(
            error("hipv4-amdgcn-amd-amdhsa--compute_90"),
            EntryIdError::Target {
                reason: TargetIdError::UnknownProcessor(_),
                ..
            }
        ));
        assert_eq!(
            error("cuda-nvptx64-nvidia-cuda-compute_9"),
            EntryIdError::Target {
                id: "cuda-nvptx64-nvidia-cuda-compute_9".into(),
                reason: TargetIdError::BadSmArch("compute_9".into()),
            }
        );
        assert_eq!(
            error("hipv4-amdgcn-amd-amdhsa--"),
            EntryIdError::Target {
                id: "hipv4-amdgcn-amd-amdhsa--".into(),
                reason: TargetIdError::Empty
            }
        );
        let message = error("hipv4-amdgcn-amd-amdhsa--gfx1100:xnack-").to_string();
        assert_eq!(
            message,
            "bundle entry `hipv4-amdgcn-amd-amdhsa--gfx1100:xnack-` has a bad target: \
             `gfx1100:xnack-` sets xnack, but gfx1100 has no xnack setting; remove it"
        );
    }
}
