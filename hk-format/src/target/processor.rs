//! The AMD processors hkload knows, in one table: each one's `EF_AMDGPU_MACH` number, the
//! features (sramecc, xnack) its target IDs may name, and the generic target that covers it.
//! It is data rather than syntax: target IDs, entry IDs and `e_flags` are all read and checked
//! against it, so it sits below them, apart from the parsing.

use std::fmt;

use serde::{Serialize, Serializer};

/// A feature an AMD target ID can pin on or off. No other feature appears in target IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureName {
    /// SRAM error correction.
    Sramecc,
    /// XNACK replay, which demand paging (page faults in unified memory) needs.
    Xnack,
}

impl FeatureName {
    /// Every feature, in canonical (alphabetical) order.
    pub const ALL: [FeatureName; 2] = [Self::Sramecc, Self::Xnack];

    /// The spelling in target IDs.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sramecc => "sramecc",
            Self::Xnack => "xnack",
        }
    }

    pub(super) fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|feature| feature.name() == name)
    }

    /// Where the feature's two bits sit in `e_flags` (code object V4 and later).
    pub(super) const fn e_flags_shift(self) -> u32 {
        match self {
            Self::Sramecc => 10,
            Self::Xnack => 8,
        }
    }
}

impl fmt::Display for FeatureName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What hkload knows about one AMD processor: a row of [`PROCESSORS`]. The derived order
/// compares names first, and names are unique.
#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ProcessorSpec {
    name: &'static str,
    /// `EF_AMDGPU_MACH`, the processor's number in a code object's `e_flags`.
    mach: u8,
    /// The features its target IDs may name.
    features: &'static [FeatureName],
    role: Role,
    /// LDS one workgroup may use, in bytes.
    lds_per_workgroup: u32,
}

#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Role {
    /// A real GPU, and the generic target whose code also runs on it, if any.
    Native { generic: Option<&'static str> },
    /// A generic target: its code runs on every processor that names it.
    Generic,
}

impl ProcessorSpec {
    const fn native(
        name: &'static str,
        mach: u8,
        features: &'static [FeatureName],
        generic: Option<&'static str>,
    ) -> Self {
        Self {
            name,
            mach,
            features,
            role: Role::Native { generic },
            lds_per_workgroup: 64 * 1024,
        }
    }

    const fn generic(name: &'static str, mach: u8, features: &'static [FeatureName]) -> Self {
        Self {
            name,
            mach,
            features,
            role: Role::Generic,
            lds_per_workgroup: 64 * 1024,
        }
    }

    const fn lds(self, bytes: u32) -> Self {
        Self {
            lds_per_workgroup: bytes,
            ..self
        }
    }
}

const SRAMECC_XNACK: &[FeatureName] = &[FeatureName::Sramecc, FeatureName::Xnack];
const XNACK: &[FeatureName] = &[FeatureName::Xnack];
const NO_FEATURES: &[FeatureName] = &[];

/// Every AMD processor hkload knows, the one place these facts live. LDS per workgroup is
/// 64 KiB unless a processor says otherwise (gfx950: 160 KiB). `EF_AMDGPU_MACH` values
/// come from LLVM's `ELF.h`, features from LLVM's AMDGPU target parser, and which generic target
/// covers which processor from CLR's `TargetGenericMap` (gfx908 and gfx90a are in none).
/// gfx940 and gfx941 are left out: LLVM dropped them.
static PROCESSORS: [ProcessorSpec; 15] = [
    ProcessorSpec::native("gfx908", 0x30, SRAMECC_XNACK, None),
    ProcessorSpec::native("gfx90a", 0x3f, SRAMECC_XNACK, None),
    ProcessorSpec::native("gfx942", 0x4c, SRAMECC_XNACK, Some("gfx9-4-generic")),
    ProcessorSpec::native("gfx950", 0x4f, SRAMECC_XNACK, Some("gfx9-4-generic")).lds(160 * 1024),
    ProcessorSpec::native("gfx1100", 0x41, NO_FEATURES, Some("gfx11-generic")),
    ProcessorSpec::native("gfx1101", 0x46, NO_FEATURES, Some("gfx11-generic")),
    ProcessorSpec::native("gfx1151", 0x4a, NO_FEATURES, Some("gfx11-generic")),
    ProcessorSpec::native("gfx1200", 0x48, NO_FEATURES, Some("gfx12-generic")),
    ProcessorSpec::native("gfx1201", 0x4e, NO_FEATURES, Some("gfx12-generic")),
    ProcessorSpec::generic("gfx9-generic", 0x51, XNACK),
    ProcessorSpec::generic("gfx9-4-generic", 0x5f, SRAMECC_XNACK),
    ProcessorSpec::generic("gfx10-1-generic", 0x52, XNACK),
    ProcessorSpec::generic("gfx10-3-generic", 0x53, NO_FEATURES),
    ProcessorSpec::generic("gfx11-generic", 0x54, NO_FEATURES),
    ProcessorSpec::generic("gfx12-generic", 0x59, NO_FEATURES),
];

/// Shared memory one block of an NVIDIA SM architecture may use, static and dynamic together,
/// with the kernel's opt-in: 227 KiB on sm_90, 163 KiB on sm_80 and sm_87, 99 KiB on the other
/// sm_8x, 96 KiB on sm_70 and sm_72, else the 48 KiB every block gets without opting in.
pub(super) fn sm_shared_memory_per_block(major: u32, minor: u32) -> u32 {
    match (major, minor) {
        (9, _) => 227 * 1024,
        (8, 0 | 7) => 163 * 1024,
        (8, _) => 99 * 1024,
        (7, 0 | 2) => 96 * 1024,
        _ => 48 * 1024,
    }
}

/// The names of all known processors, for error messages.
pub(super) fn known_processors() -> String {
    let names: Vec<&str> = PROCESSORS.iter().map(|spec| spec.name).collect();
    names.join(", ")
}

/// An AMD processor hkload knows (`gfx942`, `gfx9-4-generic`). Processors order by name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Processor(&'static ProcessorSpec);

impl Processor {
    pub(super) fn named(name: &str) -> Option<Self> {
        PROCESSORS.iter().find(|spec| spec.name == name).map(Self)
    }

    pub(super) fn from_mach(mach: u8) -> Option<Self> {
        PROCESSORS.iter().find(|spec| spec.mach == mach).map(Self)
    }

    /// The name used in target IDs.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// Whether target IDs for this processor may name `feature`.
    pub fn supports(self, feature: FeatureName) -> bool {
        self.0.features.contains(&feature)
    }

    /// LDS one workgroup may use, static and dynamic together, in bytes. A generic target's
    /// code must fit its smallest processor.
    pub fn lds_per_workgroup(self) -> u32 {
        self.0.lds_per_workgroup
    }

    /// Whether this is a generic target rather than a real GPU.
    pub fn is_generic(self) -> bool {
        self.0.role == Role::Generic
    }

    /// The generic target whose code also runs on this processor, if any.
    pub fn generic(self) -> Option<Processor> {
        match self.0.role {
            Role::Native { generic } => generic.and_then(Self::named),
            Role::Generic => None,
        }
    }
}

impl fmt::Debug for Processor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Processor").field(&self.name()).finish()
    }
}

/// Lets code ask `processor == "gfx950"`.
impl PartialEq<&str> for Processor {
    fn eq(&self, name: &&str) -> bool {
        self.name() == *name
    }
}

impl fmt::Display for Processor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Processor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::tests::processor;

    #[test]
    fn processor_table_is_consistent() {
        for (index, spec) in PROCESSORS.iter().enumerate() {
            for later in PROCESSORS.iter().skip(index + 1) {
                assert_ne!(spec.name, later.name, "name listed twice");
                assert_ne!(
                    spec.mach, later.mach,
                    "{} and {} share a mach",
                    spec.name, later.name
                );
            }
            if let Role::Native {
                generic: Some(name),
            } = spec.role
            {
                let generic = Processor::named(name).unwrap_or_else(|| {
                    panic!("{}'s generic {name} is not in the table", spec.name)
                });
                assert!(generic.is_generic(), "{name} is not marked generic");
                // Code for the generic target must be able to pin any feature it names on the
                // devices it covers.
                for feature in generic.0.features {
                    assert!(
                        spec.features.contains(feature),
                        "{} lacks {feature}",
                        spec.name
                    );
                }
            }
        }
    }

    #[test]
    fn gfx9_4_generic_covers_gfx942_and_gfx950_only() {
        let generic = processor("gfx9-4-generic");
        let covered: Vec<&str> = PROCESSORS
            .iter()
            .map(Processor)
            .filter(|p| p.generic() == Some(generic))
            .map(Processor::name)
            .collect();
        assert_eq!(covered, ["gfx942", "gfx950"]);
        assert_eq!(processor("gfx90a").generic(), None);
        assert_eq!(processor("gfx908").generic(), None);
        assert_eq!(generic.generic(), None);
        assert_eq!(
            processor("gfx1100").generic(),
            Some(processor("gfx11-generic"))
        );
        assert_eq!(
            processor("gfx1201").generic(),
            Some(processor("gfx12-generic"))
        );
    }

    #[test]
    fn gfx11_and_gfx12_take_no_features() {
        for name in ["gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201"] {
            for feature in FeatureName::ALL {
                assert!(
                    !processor(name).supports(feature),
                    "{name} supports {feature}"
                );
            }
        }
        assert!(processor("gfx90a").supports(FeatureName::Xnack));
        assert!(processor("gfx950").supports(FeatureName::Sramecc));
    }

    #[test]
    fn processors_compare_with_names() {
        assert!(processor("gfx950") == "gfx950");
        assert!(processor("gfx942") != "gfx950");
    }
}
