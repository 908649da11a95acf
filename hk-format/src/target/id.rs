//! Target IDs, the names of GPUs: `gfx942:sramecc+:xnack-` on AMD, `sm_90` or `sm_90a` on
//! NVIDIA. Their parsing, canonical printing and errors, and the reading of the target an
//! AMDGPU code object's `e_flags` encode, which is the same fact in binary. Entry IDs are built
//! on these (`entry`), and both check names against the processor table (`processor`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::processor::{FeatureName, Processor, known_processors, sm_shared_memory_per_block};

/// How a target ID sets one feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Feature {
    /// Not named. Code built this way runs with the feature on or off; in a device's target ID
    /// it means the setting is unknown.
    Any,
    /// Named with `+`.
    On,
    /// Named with `-`.
    Off,
}

impl Feature {
    /// The sign that follows the feature's name, or `None` for [`Feature::Any`].
    pub const fn sign(self) -> Option<char> {
        match self {
            Self::Any => None,
            Self::On => Some('+'),
            Self::Off => Some('-'),
        }
    }
}

/// The GPU maker, which decides the kind of code a device runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Amd,
    Nvidia,
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Amd => "AMD",
            Self::Nvidia => "NVIDIA",
        })
    }
}

/// An AMD target ID: a processor and how it sets each feature it supports. Features the
/// processor does not support are always [`Feature::Any`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AmdTarget {
    processor: Processor,
    sramecc: Feature,
    xnack: Feature,
}

impl AmdTarget {
    fn any(processor: Processor) -> Self {
        Self {
            processor,
            sramecc: Feature::Any,
            xnack: Feature::Any,
        }
    }

    pub fn processor(&self) -> Processor {
        self.processor
    }

    /// How this target sets `feature`.
    pub fn feature(&self, feature: FeatureName) -> Feature {
        match feature {
            FeatureName::Sramecc => self.sramecc,
            FeatureName::Xnack => self.xnack,
        }
    }

    /// The features the processor supports but this target leaves Any, in canonical order.
    pub fn any_features(&self) -> impl Iterator<Item = FeatureName> {
        let target = *self;
        FeatureName::ALL.into_iter().filter(move |&feature| {
            target.processor.supports(feature) && target.feature(feature) == Feature::Any
        })
    }

    /// How many features this target pins on or off.
    pub fn named_features(&self) -> usize {
        FeatureName::ALL
            .into_iter()
            .filter(|&feature| self.feature(feature) != Feature::Any)
            .count()
    }

    fn set(&mut self, feature: FeatureName, setting: Feature) {
        match feature {
            FeatureName::Sramecc => self.sramecc = setting,
            FeatureName::Xnack => self.xnack = setting,
        }
    }

    /// Parses `<processor>(:<feature>(+|-))*`, in any feature order.
    fn parse(text: &str) -> Result<Self, TargetIdError> {
        let mut parts = text.split(':');
        let name = parts.next().unwrap_or_default();
        let processor = Processor::named(name)
            .ok_or_else(|| TargetIdError::UnknownProcessor(name.to_owned()))?;
        let mut target = Self::any(processor);
        for spelled in parts {
            let (feature, setting) = parse_feature(text, spelled)?;
            if !processor.supports(feature) {
                return Err(TargetIdError::UnsupportedFeature {
                    target: text.to_owned(),
                    processor,
                    feature,
                });
            }
            if target.feature(feature) != Feature::Any {
                return Err(TargetIdError::RepeatedFeature {
                    target: text.to_owned(),
                    feature,
                });
            }
            target.set(feature, setting);
        }
        Ok(target)
    }
}

/// Parses one `<feature>(+|-)` of `target`.
fn parse_feature(target: &str, spelled: &str) -> Result<(FeatureName, Feature), TargetIdError> {
    if spelled.is_empty() {
        return Err(TargetIdError::EmptyFeature(target.to_owned()));
    }
    let unknown = |name: &str| TargetIdError::UnknownFeature {
        target: target.to_owned(),
        feature: name.to_owned(),
    };
    let (name, setting) = if let Some(name) = spelled.strip_suffix('+') {
        (name, Feature::On)
    } else if let Some(name) = spelled.strip_suffix('-') {
        (name, Feature::Off)
    } else {
        return Err(match FeatureName::named(spelled) {
            Some(feature) => TargetIdError::MissingSign {
                target: target.to_owned(),
                feature,
            },
            None => unknown(spelled),
        });
    };
    let feature = FeatureName::named(name).ok_or_else(|| unknown(name))?;
    Ok((feature, setting))
}

impl fmt::Display for AmdTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.processor.name())?;
        for feature in FeatureName::ALL {
            if let Some(sign) = self.feature(feature).sign() {
                write!(f, ":{feature}{sign}")?;
            }
        }
        Ok(())
    }
}

/// An NVIDIA architecture: compute capability `major.minor`, written `sm_<major><minor>`; or,
/// for code only, its architecture-specific variant `sm_<major><minor>a` (`sm_90a`).
///
/// Code for an arch-specific variant may use instructions that only that one architecture has
/// (Hopper's `wgmma` and TMA for sm_90a), so it runs only on devices of exactly that compute
/// capability, not on later ones as plain code does (see [`TargetId::is_arch_specific`]). A
/// device is never arch-specific: the CUDA driver reports compute capability 9.0 as `sm_90`.
///
/// The derived order compares major, then minor, which is how the CUDA driver compares
/// compute capabilities, then puts an arch-specific variant after its plain architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SmArch {
    major: u32,
    minor: u32,
    arch_specific: bool,
}

impl SmArch {
    /// The first major version with architecture-specific variants (sm_90a).
    const FIRST_ARCH_SPECIFIC_MAJOR: u32 = 9;

    /// The architecture of compute capability `major.minor`, as a CUDA device reports it.
    pub fn new(major: u32, minor: u32) -> Result<Self, TargetIdError> {
        // Names put the minor version in one digit, so a larger one could not be printed
        // unambiguously; no such GPU exists.
        if major == 0 || minor > 9 {
            return Err(TargetIdError::NoSmName { major, minor });
        }
        Ok(Self {
            major,
            minor,
            arch_specific: false,
        })
    }

    pub const fn major(self) -> u32 {
        self.major
    }

    pub const fn minor(self) -> u32 {
        self.minor
    }

    /// Whether this is an architecture-specific variant (`sm_90a`).
    pub const fn is_arch_specific(self) -> bool {
        self.arch_specific
    }

    /// The plain architecture of the same compute capability: `sm_90` for `sm_90a`.
    pub const fn portable(self) -> Self {
        Self {
            arch_specific: false,
            ..self
        }
    }

    /// NVIDIA's virtual-architecture name, the one PTX is built for: `compute_90`,
    /// `compute_90a`.
    pub fn compute_name(self) -> String {
        format!("compute_{}", self.digits())
    }

    /// `90`, `90a`, `120`: what follows `sm_` or `compute_`.
    fn digits(self) -> String {
        let suffix = if self.arch_specific { "a" } else { "" };
        format!("{}{}{suffix}", self.major, self.minor)
    }

    /// Parses the digits after `sm_` or `compute_` in `spelled`: the major version, then a
    /// one-digit minor version, then `a` for an architecture-specific variant.
    pub(super) fn parse_digits(spelled: &str, digits: &str) -> Result<Self, TargetIdError> {
        let plain = |digits: &str| {
            digits.len() >= 2
                && !digits.starts_with('0')
                && digits.bytes().all(|byte| byte.is_ascii_digit())
        };
        let (number, arch_specific) = match digits.strip_suffix('a') {
            Some(number) => (number, true),
            None => (digits, false),
        };
        if !plain(number) {
            // `sm_100f` names a family-specific variant: worth a message of its own, since
            // the fix is obvious.
            let family = digits.strip_suffix('f').is_some_and(plain);
            return Err(if family {
                TargetIdError::FamilySpecific(spelled.to_owned())
            } else {
                TargetIdError::BadSmArch(spelled.to_owned())
            });
        }
        let number: u32 = number
            .parse()
            .map_err(|_| TargetIdError::BadSmArch(spelled.to_owned()))?;
        let arch = Self::new(number / 10, number % 10)?;
        if !arch_specific {
            return Ok(arch);
        }
        if arch.major < Self::FIRST_ARCH_SPECIFIC_MAJOR {
            return Err(TargetIdError::NoArchSpecificVariant {
                target: spelled.to_owned(),
                portable: arch,
            });
        }
        Ok(Self {
            arch_specific: true,
            ..arch
        })
    }
}

impl fmt::Display for SmArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.digits())
    }
}

impl Serialize for SmArch {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::text::serialize(self, serializer)
    }
}

/// The full target ID of a GPU, or of the code built for one.
///
/// Target IDs order by vendor (AMD first), then by processor name and feature settings or by
/// compute capability: a stable order for sorted collections, not a ranking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TargetId {
    /// `gfx942`, `gfx942:sramecc+:xnack-`, `gfx9-4-generic`.
    Amd(AmdTarget),
    /// `sm_80`, `sm_90`, `sm_120`; for code, also `sm_90a`.
    Nvidia(SmArch),
}

impl TargetId {
    pub fn vendor(&self) -> Vendor {
        match self {
            Self::Amd(_) => Vendor::Amd,
            Self::Nvidia(_) => Vendor::Nvidia,
        }
    }

    /// Shared memory (LDS) one block may use on a device of this target, static and dynamic
    /// together, as the hardware allows it. The CUDA driver reports this for a real NVIDIA
    /// device (its opt-in maximum); drivers that cannot ask (HIP, the recording driver) use
    /// this.
    pub fn shared_memory_per_block(&self) -> u32 {
        match self {
            Self::Amd(amd) => amd.processor().lds_per_workgroup(),
            Self::Nvidia(sm) => sm_shared_memory_per_block(sm.major(), sm.minor()),
        }
    }

    /// Whether code for this target is architecture-specific: built to use instructions that
    /// one architecture alone has, so that it runs only on devices of exactly
    /// [`TargetId::portable`], and is preferred there over portable code (`sm_90a`: compute
    /// capability 9.0 only, never 10.0 or 8.9). Devices never are.
    ///
    /// hkload's `select` asks only this and [`TargetId::portable`], never which vendor or
    /// suffix, so `sm_100a` and `sm_120a` follow the same rule. AMD has no such targets:
    /// every native AMD code object already runs on its own processor only. Should AMD code
    /// ever need instructions that only some devices of a processor have, a target that says
    /// so here, with its portable target, gets the same choice and explanation unchanged.
    pub fn is_arch_specific(&self) -> bool {
        match self {
            Self::Amd(_) => false,
            Self::Nvidia(arch) => arch.is_arch_specific(),
        }
    }

    /// The target of the devices that run this target's code: `sm_90` for `sm_90a`; any other
    /// target is its own.
    pub fn portable(&self) -> TargetId {
        match *self {
            Self::Amd(target) => Self::Amd(target),
            Self::Nvidia(arch) => Self::Nvidia(arch.portable()),
        }
    }

    /// Reads the target an AMDGPU code object is built for from its ELF `e_flags`, so that
    /// a code object can be checked against the bundle entry that claims it.
    ///
    /// Only code objects V4 and later can be read: earlier versions encode the features
    /// differently and cannot say "any".
    pub fn from_amd_e_flags(e_flags: u32) -> Result<Self, EFlagsError> {
        const MACH_MASK: u32 = 0xff;
        let mach = (e_flags & MACH_MASK) as u8;
        let processor =
            Processor::from_mach(mach).ok_or(EFlagsError::UnknownMach { e_flags, mach })?;
        let mut target = AmdTarget::any(processor);
        for feature in FeatureName::ALL {
            let setting = match (e_flags >> feature.e_flags_shift()) & 0b11 {
                0 => None,
                1 => Some(Feature::Any),
                2 => Some(Feature::Off),
                _ => Some(Feature::On),
            };
            match (processor.supports(feature), setting) {
                (true, Some(setting)) => target.set(feature, setting),
                (false, None) => {}
                (true, None) => {
                    return Err(EFlagsError::FeatureNotEncoded {
                        e_flags,
                        processor,
                        feature,
                    });
                }
                (false, Some(_)) => {
                    return Err(EFlagsError::UnsupportedFeatureEncoded {
                        e_flags,
                        processor,
                        feature,
                    });
                }
            }
        }
        Ok(Self::Amd(target))
    }
}

/// The generic version in a code object's `e_flags` (its top byte): 0 for a native processor,
/// 1 to 255 for a generic one. Only code object V6 and later set it.
pub fn generic_version(e_flags: u32) -> u8 {
    (e_flags >> 24) as u8
}

impl FromStr for TargetId {
    type Err = TargetIdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Err(TargetIdError::Empty);
        }
        match text.strip_prefix("sm_") {
            Some(digits) => SmArch::parse_digits(text, digits).map(Self::Nvidia),
            None => AmdTarget::parse(text).map(Self::Amd),
        }
    }
}

impl fmt::Display for TargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Amd(target) => target.fmt(f),
            Self::Nvidia(arch) => arch.fmt(f),
        }
    }
}

impl Serialize for TargetId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::text::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for TargetId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::text::deserialize(deserializer)
    }
}

/// A target ID that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetIdError {
    #[error("the target ID is empty; name a GPU such as gfx942 or sm_90")]
    Empty,
    #[error(
        "`{0}` is not a GPU target hkload knows: AMD processors are {known}, and NVIDIA \
         architectures are written sm_<major><minor>, e.g. sm_90 (sm_90a for code that uses \
         instructions of that architecture alone)",
        known = known_processors()
    )]
    UnknownProcessor(String),
    #[error("`{target}` sets {feature}, but {processor} has no {feature} setting; remove it")]
    UnsupportedFeature {
        target: String,
        processor: Processor,
        feature: FeatureName,
    },
    #[error(
        "`{target}` names the unknown feature `{feature}`; target IDs can set only sramecc and \
         xnack"
    )]
    UnknownFeature { target: String, feature: String },
    #[error("`{target}` sets {feature} more than once; set each feature at most once")]
    RepeatedFeature {
        target: String,
        feature: FeatureName,
    },
    #[error(
        "`{target}` names {feature} without a sign; write {feature}+ for on or {feature}- for \
         off, or leave it out to accept both"
    )]
    MissingSign {
        target: String,
        feature: FeatureName,
    },
    #[error("`{0}` has an empty feature after a `:`; remove the extra colon")]
    EmptyFeature(String),
    #[error(
        "`{0}` is not an NVIDIA architecture: write the major version and a one-digit minor \
         version, e.g. sm_80, sm_90 or sm_120, and `a` after them for architecture-specific \
         code (sm_90a)"
    )]
    BadSmArch(String),
    #[error(
        "`{0}` names a family-specific NVIDIA variant, which hkload does not support; build \
         for the architecture-specific variant (e.g. sm_100a), whose code runs on that \
         architecture alone, or drop the suffix for portable code"
    )]
    FamilySpecific(String),
    #[error(
        "`{target}` names an architecture-specific variant of {portable}, which has none: \
         NVIDIA defines them from sm_90a on; build for {portable}"
    )]
    NoArchSpecificVariant { target: String, portable: SmArch },
    #[error(
        "compute capability {major}.{minor} has no sm_XY name: the major version must be at \
         least 1 and the minor version a single digit"
    )]
    NoSmName { major: u32, minor: u32 },
}

/// AMDGPU `e_flags` that do not describe a known target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EFlagsError {
    #[error(
        "e_flags {e_flags:#010x} name processor number {mach:#04x} (EF_AMDGPU_MACH), which \
         hkload does not know; known processors: {known}",
        known = known_processors()
    )]
    UnknownMach { e_flags: u32, mach: u8 },
    #[error(
        "e_flags {e_flags:#010x} leave {feature} unencoded although {processor} has a {feature} \
         setting; code objects older than V4 cannot be checked, so build with \
         -mcode-object-version=5 or later"
    )]
    FeatureNotEncoded {
        e_flags: u32,
        processor: Processor,
        feature: FeatureName,
    },
    #[error(
        "e_flags {e_flags:#010x} encode a {feature} setting, but {processor} has none; the code \
         object is malformed"
    )]
    UnsupportedFeatureEncoded {
        e_flags: u32,
        processor: Processor,
        feature: FeatureName,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::tests::{processor, target};

    fn amd(text: &str) -> AmdTarget {
        match target(text) {
            TargetId::Amd(target) => target,
            other => panic!("{text} parsed as {other:?}"),
        }
    }

    #[test]
    fn parses_and_prints_canonical_target_ids() {
        for (text, canonical) in [
            ("gfx942", "gfx942"),
            ("gfx942:sramecc+:xnack-", "gfx942:sramecc+:xnack-"),
            ("gfx942:xnack-:sramecc+", "gfx942:sramecc+:xnack-"),
            ("gfx942:xnack+", "gfx942:xnack+"),
            ("gfx90a", "gfx90a"),
            ("gfx90a:sramecc-", "gfx90a:sramecc-"),
            ("gfx9-4-generic", "gfx9-4-generic"),
            ("gfx9-4-generic:xnack-", "gfx9-4-generic:xnack-"),
            ("gfx1100", "gfx1100"),
            ("sm_90", "sm_90"),
            ("sm_89", "sm_89"),
            ("sm_100", "sm_100"),
            ("sm_120", "sm_120"),
            ("sm_90a", "sm_90a"),
            ("sm_100a", "sm_100a"),
            ("sm_120a", "sm_120a"),
        ] {
            let parsed = target(text);
            assert_eq!(parsed.to_string(), canonical);
            assert_eq!(target(canonical), parsed, "{canonical} does not round-trip");
        }
    }

    #[test]
    fn reads_features_and_architectures() {
        let gfx942 = amd("gfx942:xnack-:sramecc+");
        assert_eq!(gfx942.processor(), processor("gfx942"));
        assert_eq!(gfx942.feature(FeatureName::Sramecc), Feature::On);
        assert_eq!(gfx942.feature(FeatureName::Xnack), Feature::Off);
        assert_eq!(gfx942.named_features(), 2);
        assert_eq!(gfx942.any_features().count(), 0);

        let agnostic = amd("gfx90a:xnack+");
        assert_eq!(
            agnostic.any_features().collect::<Vec<_>>(),
            [FeatureName::Sramecc]
        );
        assert_eq!(
            amd("gfx1100").any_features().count(),
            0,
            "gfx1100 has no features at all"
        );

        assert_eq!(
            target("sm_120"),
            TargetId::Nvidia(SmArch::new(12, 0).unwrap())
        );
        assert_eq!(
            target("sm_89"),
            TargetId::Nvidia(SmArch::new(8, 9).unwrap())
        );
        assert_eq!(target("sm_90").vendor(), Vendor::Nvidia);
        assert_eq!(target("gfx950").vendor(), Vendor::Amd);
    }

    #[test]
    fn arch_specific_targets_name_the_architecture_they_run_on() {
        for (specific, portable) in [
            ("sm_90a", "sm_90"),
            ("sm_100a", "sm_100"),
            ("sm_120a", "sm_120"),
        ] {
            let specific = target(specific);
            assert!(specific.is_arch_specific(), "{specific}");
            assert_eq!(specific.portable(), target(portable));
            assert!(!target(portable).is_arch_specific(), "{portable}");
            assert_eq!(target(portable).portable(), target(portable));
        }
        let gfx942 = target("gfx942:sramecc+:xnack-");
        assert!(!gfx942.is_arch_specific());
        assert_eq!(gfx942.portable(), gfx942);
        // A device's architecture is never arch-specific.
        assert!(!SmArch::new(9, 0).unwrap().is_arch_specific());
        let sm_90a = match target("sm_90a") {
            TargetId::Nvidia(arch) => arch,
            other => panic!("{other:?}"),
        };
        assert_eq!((sm_90a.major(), sm_90a.minor()), (9, 0));
        assert_eq!(sm_90a.compute_name(), "compute_90a");
        assert_eq!(sm_90a.portable().compute_name(), "compute_90");
    }

    #[test]
    fn target_ids_sort_stably() {
        let mut targets = [
            "sm_100",
            "sm_90a",
            "sm_90",
            "gfx942:xnack-",
            "sm_80",
            "gfx90a",
            "gfx942",
        ]
        .map(target);
        targets.sort();
        let sorted = targets.map(|target| target.to_string());
        assert_eq!(
            sorted,
            [
                "gfx90a",
                "gfx942",
                "gfx942:xnack-",
                "sm_80",
                "sm_90",
                "sm_90a",
                "sm_100"
            ]
        );
    }

    #[test]
    fn sm_arch_orders_by_compute_capability() {
        let arch = |major, minor| SmArch::new(major, minor).unwrap();
        assert!(arch(8, 9) < arch(9, 0));
        assert!(arch(9, 0) < arch(10, 0));
        assert!(arch(8, 0) < arch(8, 6));
        assert_eq!(arch(10, 0).to_string(), "sm_100");
        assert_eq!(
            SmArch::new(8, 10),
            Err(TargetIdError::NoSmName {
                major: 8,
                minor: 10
            })
        );
        assert_eq!(
            SmArch::new(0, 5),
            Err(TargetIdError::NoSmName { major: 0, minor: 5 })
        );
    }

    #[test]
    fn rejects_bad_target_ids() {
        let error = |text: &str| text.parse::<TargetId>().unwrap_err();
        assert_eq!(error(""), TargetIdError::Empty);
        for garbage in ["gfx9999", "GFX942", " gfx942", "hello", "sm90", ":xnack+"] {
            assert!(
                matches!(error(garbage), TargetIdError::UnknownProcessor(_)),
                "{garbage}: {:?}",
                error(garbage)
            );
        }
        assert_eq!(
            error("gfx1100:xnack-"),
            TargetIdError::UnsupportedFeature {
                target: "gfx1100:xnack-".into(),
                processor: processor("gfx1100"),
                feature: FeatureName::Xnack,
            }
        );
        assert_eq!(
            error("gfx942:tgsplit+"),
            TargetIdError::UnknownFeature {
                target: "gfx942:tgsplit+".into(),
                feature: "tgsplit".into()
            }
        );
        assert_eq!(
            error("gfx942:ecc"),
            TargetIdError::UnknownFeature {
                target: "gfx942:ecc".into(),
                feature: "ecc".into()
            }
        );
        assert_eq!(
            error("gfx942:xnack+:xnack-"),
            TargetIdError::RepeatedFeature {
                target: "gfx942:xnack+:xnack-".into(),
                feature: FeatureName::Xnack,
            }
        );
        assert_eq!(
            error("gfx942:xnack"),
            TargetIdError::MissingSign {
                target: "gfx942:xnack".into(),
                feature: FeatureName::Xnack
            }
        );
        assert_eq!(
            error("gfx942:"),
            TargetIdError::EmptyFeature("gfx942:".into())
        );
        assert_eq!(
            error("gfx942::xnack+"),
            TargetIdError::EmptyFeature("gfx942::xnack+".into())
        );
        for bad in [
            "sm_",
            "sm_9",
            "sm_090",
            "sm_x0",
            "sm_+90",
            "sm_9.0",
            "sm_99999999999",
            "sm_9a",
            "sm_90aa",
            "sm_90A",
            "sm_a",
            "sm_90af",
        ] {
            assert_eq!(error(bad), TargetIdError::BadSmArch(bad.into()), "{bad}");
        }
        // Family-specific variants are not supported; architecture-specific ones start at 9.0.
        for family in ["sm_100f", "sm_120f"] {
            assert_eq!(error(family), TargetIdError::FamilySpecific(family.into()));
        }
        assert_eq!(
            error("sm_80a"),
            TargetIdError::NoArchSpecificVariant {
                target: "sm_80a".into(),
                portable: SmArch::new(8, 0).unwrap(),
            }
        );
    }

    #[test]
    fn errors_read_as_advice() {
        let message = |text: &str| text.parse::<TargetId>().unwrap_err().to_string();
        let unknown = message("gfx9999");
        assert!(unknown.contains("`gfx9999`"), "{unknown}");
        assert!(unknown.contains("gfx90a, gfx942, gfx950"), "{unknown}");
        assert!(unknown.contains("sm_90"), "{unknown}");
        assert_eq!(
            message("gfx1100:xnack-"),
            "`gfx1100:xnack-` sets xnack, but gfx1100 has no xnack setting; remove it"
        );
        assert!(message("gfx942:xnack").contains("write xnack+ for on or xnack- for off"));
        assert!(message("sm_100f").contains("sm_100a"));
        assert_eq!(
            message("sm_89a"),
            "`sm_89a` names an architecture-specific variant of sm_89, which has none: NVIDIA \
             defines them from sm_90a on; build for sm_89"
        );
    }

    #[test]
    fn decodes_verified_e_flags() {
        for (e_flags, canonical) in [
            (0x54c, "gfx942"),
            (0xe4c, "gfx942:sramecc+:xnack-"),
            (0x53f, "gfx90a"),
            (0x54f, "gfx950"),
            (0x0100_055f, "gfx9-4-generic"),
        ] {
            let decoded = TargetId::from_amd_e_flags(e_flags)
                .unwrap_or_else(|error| panic!("{e_flags:#x}: {error}"));
            assert_eq!(decoded, target(canonical), "{e_flags:#x}");
        }
        assert_eq!(generic_version(0x0100_055f), 1);
        assert_eq!(generic_version(0x54c), 0);
        assert_eq!(generic_version(0xff00_055f), 255);
    }

    #[test]
    fn decodes_every_feature_encoding() {
        // xnack on (0x300) with sramecc off (0x800), and a gfx11 part with neither.
        assert_eq!(
            TargetId::from_amd_e_flags(0xb3f).unwrap(),
            target("gfx90a:sramecc-:xnack+")
        );
        assert_eq!(
            TargetId::from_amd_e_flags(0x041).unwrap(),
            target("gfx1100")
        );
    }

    #[test]
    fn rejects_inconsistent_e_flags() {
        assert_eq!(
            TargetId::from_amd_e_flags(0x540),
            Err(EFlagsError::UnknownMach {
                e_flags: 0x540,
                mach: 0x40
            })
        );
        // A gfx942 code object whose xnack field says "unsupported": older than V4.
        assert_eq!(
            TargetId::from_amd_e_flags(0x44c),
            Err(EFlagsError::FeatureNotEncoded {
                e_flags: 0x44c,
                processor: processor("gfx942"),
                feature: FeatureName::Xnack,
            })
        );
        assert_eq!(
            TargetId::from_amd_e_flags(0x141),
            Err(EFlagsError::UnsupportedFeatureEncoded {
                e_flags: 0x141,
                processor: processor("gfx1100"),
                feature: FeatureName::Xnack,
            })
        );
        let message = TargetId::from_amd_e_flags(0x540).unwrap_err().to_string();
        assert!(
            message.starts_with("e_flags 0x00000540 name processor number 0x40"),
            "{message}"
        );
    }
}
