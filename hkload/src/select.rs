//! Choosing the bundle entry a device runs, with a verdict on every entry that says why.
//!
//! The rules are the vendor runtimes' own, so hkload accepts exactly what `hipModuleLoadData`
//! or the CUDA driver would, and picks the best of several candidates:
//!
//! * AMD (CLR and comgr): the entry's processor must be the device's, and every feature the
//!   entry names must be set the same way on the device; a feature the entry leaves Any matches
//!   either setting. An exact entry beats a feature-agnostic one, and among those the entry
//!   naming more features wins. An entry for the generic target that covers the device's
//!   processor (gfx9-4-generic for gfx942 and gfx950) is compared with the device's feature
//!   settings too, and is used only when no native entry matches.
//! * NVIDIA (CUDA driver): a cubin runs on devices of its own major version and an equal or
//!   newer minor version; the cubin closest to the device wins. PTX runs on any device at least
//!   as new as its compute capability, compiled by the driver's JIT, and only when no cubin
//!   matches; the newest such PTX wins.
//! * Code for one vendor never runs on the other's GPUs.
//! * Architecture-specific code ([`TargetId::is_arch_specific`], `sm_90a`) runs only on
//!   devices of exactly its architecture (compute capability 9.0 for `sm_90a`: not 8.9, not
//!   10.0, be it a cubin or PTX), and there, among entries that match equally well, it is chosen
//!   first: an `sm_90a` cubin over the `sm_90` cubin, which beats any PTX. Elsewhere the
//!   device takes what it took without it. The rule asks the target, not the vendor or the
//!   suffix, so `sm_100a` follows it unchanged.
//!
//! A device's target ID is normally fully specified (ROCm always reports both xnack and
//! sramecc). If a caller passes one that leaves a feature Any, that setting is taken as
//! unknown: only entries that also leave it Any match. No device is arch-specific (CUDA
//! reports compute capability 9.0 as `sm_90`): one given as `sm_90a` is taken as the device it
//! names, `sm_90`.
//!
//! The choice never depends on the order of the entries: equally good entries (possible only
//! in bundles that break clang's composition rules) are ordered by their canonical IDs.

use std::cmp::Reverse;
use std::fmt;

use serde::Serialize;

use crate::target::{
    AmdTarget, EntryId, Feature, FeatureName, Processor, SmArch, TargetId, Vendor,
};

/// How the chosen entry, or a usable one, matches the device. Variants are declared best
/// first within each vendor, and the derived order ranks them so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Match {
    /// AMD: the entry names every feature the processor has, each set as on the device.
    Exact,
    /// AMD: the entry leaves some features Any and sets the rest as on the device.
    FeatureAgnostic,
    /// AMD: the entry is built for the generic target that covers the device's processor.
    Generic,
    /// NVIDIA: a cubin of the device's major version and an equal or older minor version.
    Cubin,
    /// NVIDIA: PTX no newer than the device, compiled by the driver's JIT when loaded.
    PtxJit,
}

/// Why an entry cannot run on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Rejection {
    /// The entry is code for the other vendor's GPUs.
    DifferentVendor { entry: Vendor, device: Vendor },
    /// The entry is for another AMD processor, and not for a generic target.
    DifferentProcessor { entry: Processor, device: Processor },
    /// The entry is for a generic target that does not cover the device's processor.
    NotCoveredByGeneric {
        generic: Processor,
        device: Processor,
    },
    /// The entry pins a feature to a setting the device does not have (or does not report).
    FeatureMismatch {
        feature: FeatureName,
        entry: Feature,
        device: Feature,
    },
    /// A cubin runs only on its own major version.
    CubinOtherMajor { entry: SmArch, device: SmArch },
    /// A cubin runs only on its own minor version or newer.
    CubinNewerMinor { entry: SmArch, device: SmArch },
    /// PTX for a newer compute capability than the device's.
    PtxNewerThanDevice { entry: SmArch, device: SmArch },
    /// Architecture-specific code (`sm_90a`) for another architecture than the device's.
    ArchSpecific { entry: TargetId, device: TargetId },
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::DifferentVendor { entry, device } => {
                write!(f, "{entry} code cannot run on an {device} GPU")
            }
            Self::DifferentProcessor { entry, device } => {
                write!(f, "processor {entry} is not the device's {device}")
            }
            Self::NotCoveredByGeneric { generic, device } => match device.generic() {
                Some(covering) => {
                    write!(
                        f,
                        "generic target {generic} does not cover {device}; {covering} does"
                    )
                }
                None => write!(
                    f,
                    "{device} is in no generic target, so {generic} code cannot run on it"
                ),
            },
            Self::FeatureMismatch {
                feature,
                entry,
                device,
            } => {
                write!(f, "the entry needs {}, but ", setting(feature, entry))?;
                match device {
                    Feature::Any => write!(f, "the device's {feature} setting is unknown"),
                    _ => write!(f, "the device runs with {}", setting(feature, device)),
                }
            }
            Self::CubinOtherMajor { entry, device } => write!(
                f,
                "a cubin for {entry} runs only on major version {}, not on {device}",
                entry.major()
            ),
            Self::CubinNewerMinor { entry, device } => {
                write!(f, "a cubin for {entry} cannot run on the older {device}")
            }
            Self::PtxNewerThanDevice { entry, device } => {
                write!(
                    f,
                    "PTX for {} is newer than the device's {device}",
                    entry.compute_name()
                )
            }
            Self::ArchSpecific { entry, device } => {
                let runs_on = entry.portable();
                write!(f, "{entry} code runs only on {runs_on}")?;
                if let TargetId::Nvidia(arch) = runs_on {
                    write!(f, " (compute capability {}.{})", arch.major(), arch.minor())?;
                }
                write!(f, " devices; this device is {device}")
            }
        }
    }
}

/// `xnack+`, `sramecc-`; Any (never asked for in practice) reads as `xnack as Any`.
fn setting(feature: FeatureName, setting: Feature) -> String {
    match setting.sign() {
        Some(sign) => format!("{feature}{sign}"),
        None => format!("{feature} as Any"),
    }
}

/// What became of one entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Outcome {
    /// The entry the device runs.
    Chosen {
        #[serde(rename = "match")]
        matched: Match,
    },
    /// The entry would run, but the chosen entry `by` ranks higher.
    Outranked {
        #[serde(rename = "match")]
        matched: Match,
        by: EntryId,
    },
    /// The entry cannot run on the device.
    Rejected { rejection: Rejection },
}

/// The outcome for one entry, with the reason in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    entry: EntryId,
    #[serde(flatten)]
    outcome: Outcome,
    reason: String,
}

impl Verdict {
    pub fn entry(&self) -> &EntryId {
        &self.entry
    }

    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// Why the entry was chosen, outranked or rejected, as a phrase for people.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            entry,
            outcome,
            reason,
        } = self;
        match outcome {
            Outcome::Chosen { .. } => write!(f, "chosen    {entry} ({reason})"),
            Outcome::Outranked { .. } => write!(f, "outranked {entry} ({reason})"),
            Outcome::Rejected { .. } => write!(f, "rejected  {entry}: {reason}"),
        }
    }
}

/// The entry chosen for one device, and a verdict on every entry in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Selection {
    device: TargetId,
    chosen: Option<usize>,
    verdicts: Vec<Verdict>,
}

impl Selection {
    /// The device's target ID.
    pub fn device(&self) -> &TargetId {
        &self.device
    }

    /// The chosen entry and how it matched, or `None` when no entry can run on the device.
    pub fn chosen(&self) -> Option<(&EntryId, Match)> {
        let verdict = self.verdicts.get(self.chosen?)?;
        match verdict.outcome {
            Outcome::Chosen { matched } => Some((&verdict.entry, matched)),
            _ => None,
        }
    }

    /// The index of the chosen entry in the slice given to [`select`].
    pub fn chosen_index(&self) -> Option<usize> {
        self.chosen
    }

    /// A verdict for each entry given to [`select`], in the same order.
    pub fn verdicts(&self) -> &[Verdict] {
        &self.verdicts
    }

    /// Whether the chosen entry is PTX that the driver must compile before it runs.
    pub fn needs_jit(&self) -> bool {
        matches!(self.chosen(), Some((_, Match::PtxJit)))
    }
}

impl fmt::Display for Selection {
    /// One line per entry; when nothing was chosen, a last line saying so.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, verdict) in self.verdicts.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            verdict.fmt(f)?;
        }
        if self.chosen.is_none() {
            if !self.verdicts.is_empty() {
                f.write_str("\n")?;
            }
            write!(f, "no entry runs on {}", self.device)?;
        }
        Ok(())
    }
}

/// The entry `device` runs from the `entries` of one module (its index) and how it matches,
/// or `None` when none can run there. This is the rule [`select`] explains, without the
/// explanation: it allocates nothing, so loading a bundle pays only for the choice.
pub fn choose(device: &TargetId, entries: &[EntryId]) -> Option<(usize, Match)> {
    let device = &device.portable();
    entries
        .iter()
        .enumerate()
        .filter_map(|(index, entry)| Some((index, assess(device, entry).ok()?)))
        .min_by(|&(a, a_matched), &(b, b_matched)| {
            rank(a_matched, &entries[a])
                .cmp(&rank(b_matched, &entries[b]))
                // Ties (only in bundles that break clang's composition rules) go to the
                // canonical ID, then to the first listed, never to the order alone.
                .then_with(|| entries[a].to_string().cmp(&entries[b].to_string()))
                .then(a.cmp(&b))
        })
}

/// Chooses the entry `device` runs from the `entries` of one module, and judges every entry.
/// A device given as arch-specific (`sm_90a`) is judged, and recorded, as the device it names
/// (`sm_90`).
pub fn select(device: &TargetId, entries: &[EntryId]) -> Selection {
    let device = &device.portable();
    let best = choose(device, entries);
    let verdicts = entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let (outcome, reason) = match (assess(device, entry), best) {
                (Err(rejection), _) => (Outcome::Rejected { rejection }, rejection.to_string()),
                (Ok(matched), Some((best_index, by_matched))) if best_index != index => {
                    let by = &entries[best_index];
                    (
                        Outcome::Outranked { matched, by: *by },
                        outranked(device, entry, matched, by, by_matched),
                    )
                }
                // The best entry itself (there is always one when any entry fits).
                (Ok(matched), _) => (Outcome::Chosen { matched }, how(device, entry, matched)),
            };
            Verdict {
                entry: *entry,
                outcome,
                reason,
            }
        })
        .collect();

    Selection {
        device: *device,
        chosen: best.map(|(index, _)| index),
        verdicts,
    }
}

/// Whether `entry` can run on `device` (never arch-specific), and how it matches.
fn assess(device: &TargetId, entry: &EntryId) -> Result<Match, Rejection> {
    let target = entry.target();
    if target.vendor() == device.vendor() && target.is_arch_specific() {
        if !same_architecture(&target, device) {
            return Err(Rejection::ArchSpecific {
                entry: target,
                device: *device,
            });
        }
        // On its own architecture the code runs as its plain twin would.
        return assess(device, &entry.portable());
    }
    match (device, entry) {
        (TargetId::Amd(device), EntryId::AmdCodeObject(entry)) => assess_amd(device, entry),
        (TargetId::Nvidia(device), EntryId::Cubin(entry)) => assess_cubin(*device, *entry),
        (TargetId::Nvidia(device), EntryId::Ptx(entry)) => assess_ptx(*device, *entry),
        _ => Err(Rejection::DifferentVendor {
            entry: entry.target().vendor(),
            device: device.vendor(),
        }),
    }
}

/// Whether `device` is the very architecture arch-specific code for `target` is built for: the
/// same AMD processor, or the same NVIDIA compute capability (not merely the same major).
fn same_architecture(target: &TargetId, device: &TargetId) -> bool {
    match (target.portable(), device) {
        (TargetId::Amd(target), TargetId::Amd(device)) => target.processor() == device.processor(),
        (TargetId::Nvidia(target), TargetId::Nvidia(device)) => target == *device,
        _ => false,
    }
}

fn assess_amd(device: &AmdTarget, entry: &AmdTarget) -> Result<Match, Rejection> {
    let (processor, native) = (entry.processor(), device.processor());
    let generic = processor != native;
    if generic && !processor.is_generic() {
        return Err(Rejection::DifferentProcessor {
            entry: processor,
            device: native,
        });
    }
    if generic && native.generic() != Some(processor) {
        return Err(Rejection::NotCoveredByGeneric {
            generic: processor,
            device: native,
        });
    }
    // CLR compares a generic entry with the device's own settings too.
    for feature in FeatureName::ALL {
        let (wanted, actual) = (entry.feature(feature), device.feature(feature));
        if wanted != Feature::Any && wanted != actual {
            return Err(Rejection::FeatureMismatch {
                feature,
                entry: wanted,
                device: actual,
            });
        }
    }
    Ok(if generic {
        Match::Generic
    } else if entry.any_features().next().is_none() {
        Match::Exact
    } else {
        Match::FeatureAgnostic
    })
}

fn assess_cubin(device: SmArch, entry: SmArch) -> Result<Match, Rejection> {
    if entry.major() != device.major() {
        return Err(Rejection::CubinOtherMajor { entry, device });
    }
    if entry.minor() > device.minor() {
        return Err(Rejection::CubinNewerMinor { entry, device });
    }
    Ok(Match::Cubin)
}

fn assess_ptx(device: SmArch, entry: SmArch) -> Result<Match, Rejection> {
    if entry > device {
        return Err(Rejection::PtxNewerThanDevice { entry, device });
    }
    Ok(Match::PtxJit)
}

/// How a usable entry, which matched as `matched`, runs on `device`, in words.
fn how(device: &TargetId, entry: &EntryId, matched: Match) -> String {
    match entry {
        EntryId::AmdCodeObject(target) => match matched {
            Match::Generic => {
                let native = match device {
                    TargetId::Amd(device) => device.processor().to_string(),
                    TargetId::Nvidia(_) => device.to_string(),
                };
                format!(
                    "through the generic target {}, which covers {native}",
                    target.processor()
                )
            }
            Match::Exact => "exact match".to_owned(),
            _ => {
                let left_any: Vec<&str> = target.any_features().map(FeatureName::name).collect();
                format!("feature-agnostic: {} left as Any", left_any.join(" and "))
            }
        },
        EntryId::Cubin(arch) if arch.is_arch_specific() => format!(
            "arch-specific cubin for {arch}, built for this architecture alone: it may use \
             instructions no other has"
        ),
        EntryId::Cubin(_) if entry.target() == *device => {
            "cubin for this exact architecture".to_owned()
        }
        EntryId::Cubin(arch) => {
            format!("cubin for {arch}, which runs on the newer {device} of the same major version")
        }
        EntryId::Ptx(arch) => format!(
            "{}PTX for {}, compiled for {device} by the driver's JIT",
            if arch.is_arch_specific() {
                "arch-specific "
            } else {
                ""
            },
            arch.compute_name()
        ),
    }
}

/// How [`rank`] orders entries: smaller is better.
type Rank = (
    Match,
    Reverse<bool>,
    Reverse<usize>,
    Reverse<Option<SmArch>>,
);

/// Orders usable entries best first: by how they match, then the more specific first
/// (arch-specific code, which is usable only on its own architecture and there may do what
/// portable code cannot; more features named; the cubin closest to the device; the newest
/// PTX).
fn rank(matched: Match, entry: &EntryId) -> Rank {
    let arch = match entry {
        EntryId::AmdCodeObject(_) => None,
        EntryId::Cubin(arch) | EntryId::Ptx(arch) => Some(*arch),
    };
    (
        matched,
        Reverse(entry.target().is_arch_specific()),
        Reverse(named_features(entry)),
        Reverse(arch),
    )
}

fn named_features(entry: &EntryId) -> usize {
    match entry {
        EntryId::AmdCodeObject(target) => target.named_features(),
        EntryId::Cubin(_) | EntryId::Ptx(_) => 0,
    }
}

/// Why a usable entry, which matched as `matched`, lost to the chosen entry `by`.
fn outranked(
    device: &TargetId,
    entry: &EntryId,
    matched: Match,
    by: &EntryId,
    by_matched: Match,
) -> String {
    if entry == by {
        return "usable, but the same entry appears earlier".to_owned();
    }
    let how = how(device, entry, matched);
    match (matched, by_matched) {
        (Match::Generic, Match::Exact | Match::FeatureAgnostic) => {
            "usable via the generic target, but a native entry matched".to_owned()
        }
        (Match::PtxJit, Match::Cubin) => format!("usable ({how}), but the cubin {by} needs no JIT"),
        _ if by.target().is_arch_specific() && !entry.target().is_arch_specific() => {
            format!("usable ({how}), but {by} is built for this architecture alone and comes first")
        }
        (Match::Cubin, _) => format!("usable ({how}), but {by} is closer to the device"),
        (Match::PtxJit, _) => format!("usable ({how}), but {by} is newer"),
        _ if named_features(entry) < named_features(by) => {
            format!("usable ({how}), but {by} names more of the device's features")
        }
        _ => format!("usable ({how}), but {by} is as specific and sorts first"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(text: &str) -> TargetId {
        text.parse()
            .unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn id(text: &str) -> EntryId {
        text.parse()
            .unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn amd(target: &str) -> EntryId {
        id(&format!("hipv4-amdgcn-amd-amdhsa--{target}"))
    }

    /// A cubin (`sm_90`) or PTX (`compute_90`) entry.
    fn cuda(arch: &str) -> EntryId {
        id(&format!("cuda-nvptx64-nvidia-cuda-{arch}"))
    }

    fn processor(name: &str) -> Processor {
        match device(name) {
            TargetId::Amd(target) => target.processor(),
            TargetId::Nvidia(_) => panic!("{name} is not an AMD processor"),
        }
    }

    fn sm(text: &str) -> SmArch {
        match device(text) {
            TargetId::Nvidia(arch) => arch,
            TargetId::Amd(_) => panic!("{text} is not an NVIDIA architecture"),
        }
    }

    fn outcome<'a>(selection: &'a Selection, entry: &EntryId) -> &'a Outcome {
        selection
            .verdicts()
            .iter()
            .find(|verdict| verdict.entry() == entry)
            .map(Verdict::outcome)
            .unwrap_or_else(|| panic!("no verdict for {entry}"))
    }

    fn rejection(selection: &Selection, entry: &EntryId) -> Rejection {
        match outcome(selection, entry) {
            Outcome::Rejected { rejection } => *rejection,
            other => panic!("{entry} was not rejected: {other:?}\n{selection}"),
        }
    }

    /// The entries of a bundle built for every target hkpack supports.
    fn mixed_bundle() -> Vec<EntryId> {
        vec![
            amd("gfx90a"),
            amd("gfx942"),
            amd("gfx950"),
            cuda("sm_80"),
            cuda("compute_80"),
            cuda("sm_90"),
            cuda("compute_90"),
        ]
    }

    #[test]
    fn reference_truth_table_for_gfx942_sramecc_on_xnack_off() {
        use FeatureName::{Sramecc, Xnack};
        let gfx942 = device("gfx942:sramecc+:xnack-");
        let cases: [(&str, Result<Match, Rejection>); 9] = [
            ("gfx942", Ok(Match::FeatureAgnostic)),
            ("gfx942:sramecc+", Ok(Match::FeatureAgnostic)),
            ("gfx942:xnack-", Ok(Match::FeatureAgnostic)),
            ("gfx942:sramecc+:xnack-", Ok(Match::Exact)),
            (
                "gfx942:xnack+",
                Err(Rejection::FeatureMismatch {
                    feature: Xnack,
                    entry: Feature::On,
                    device: Feature::Off,
                }),
            ),
            (
                "gfx942:sramecc-",
                Err(Rejection::FeatureMismatch {
                    feature: Sramecc,
                    entry: Feature::Off,
                    device: Feature::On,
                }),
            ),
            ("gfx9-4-generic", Ok(Match::Generic)),
            (
                "gfx90a",
                Err(Rejection::DifferentProcessor {
                    entry: processor("gfx90a"),
                    device: processor("gfx942"),
                }),
            ),
            (
                "gfx950",
                Err(Rejection::DifferentProcessor {
                    entry: processor("gfx950"),
                    device: processor("gfx942"),
                }),
            ),
        ];
        for (target, expected) in &cases {
            let entry = amd(target);
            let selection = select(&gfx942, &[entry]);
            match expected {
                Ok(matched) => assert_eq!(selection.chosen(), Some((&entry, *matched)), "{target}"),
                Err(expected) => {
                    assert_eq!(selection.chosen(), None, "{target}");
                    assert_eq!(rejection(&selection, &entry), *expected, "{target}");
                }
            }
        }

        // All at once: the exact entry wins, and every other usable one is outranked.
        let all: Vec<EntryId> = cases.iter().map(|(target, _)| amd(target)).collect();
        let selection = select(&gfx942, &all);
        assert_eq!(
            selection.chosen(),
            Some((&amd("gfx942:sramecc+:xnack-"), Match::Exact))
        );
        assert_eq!(selection.chosen_index(), Some(3));
        for (target, expected) in &cases {
            let entry = amd(target);
            match (expected, outcome(&selection, &entry)) {
                (Ok(Match::Exact), Outcome::Chosen { .. }) | (Err(_), Outcome::Rejected { .. }) => {
                }
                (Ok(matched), Outcome::Outranked { matched: got, by }) => {
                    assert_eq!(got, matched, "{target}");
                    assert_eq!(*by, amd("gfx942:sramecc+:xnack-"));
                }
                (_, got) => panic!("{target}: {got:?}"),
            }
        }
    }

    #[test]
    fn amd_devices_pick_their_own_processor_from_a_mixed_bundle() {
        let entries = mixed_bundle();
        for (target, expected) in [
            ("gfx90a:sramecc+:xnack-", "gfx90a"),
            ("gfx90a:sramecc+:xnack+", "gfx90a"),
            ("gfx950:sramecc+:xnack-", "gfx950"),
        ] {
            let selection = select(&device(target), &entries);
            assert_eq!(
                selection.chosen(),
                Some((&amd(expected), Match::FeatureAgnostic)),
                "{target}"
            );
            assert!(!selection.needs_jit());
            let own = processor(expected);
            for entry in &entries {
                match entry {
                    EntryId::AmdCodeObject(other) if other.processor() == own => {}
                    EntryId::AmdCodeObject(other) => assert_eq!(
                        rejection(&selection, entry),
                        Rejection::DifferentProcessor {
                            entry: other.processor(),
                            device: own
                        }
                    ),
                    EntryId::Cubin(_) | EntryId::Ptx(_) => assert_eq!(
                        rejection(&selection, entry),
                        Rejection::DifferentVendor {
                            entry: Vendor::Nvidia,
                            device: Vendor::Amd
                        }
                    ),
                }
            }
        }
    }

    #[test]
    fn specific_entries_rank_first_and_generic_last() {
        let gfx942 = device("gfx942:sramecc+:xnack-");
        let entries = [amd("gfx9-4-generic"), amd("gfx942"), amd("gfx942:xnack-")];
        let selection = select(&gfx942, &entries);
        assert_eq!(
            selection.chosen(),
            Some((&amd("gfx942:xnack-"), Match::FeatureAgnostic))
        );
        assert_eq!(
            outcome(&selection, &amd("gfx942")),
            &Outcome::Outranked {
                matched: Match::FeatureAgnostic,
                by: amd("gfx942:xnack-")
            }
        );
        assert_eq!(
            outcome(&selection, &amd("gfx9-4-generic")),
            &Outcome::Outranked {
                matched: Match::Generic,
                by: amd("gfx942:xnack-")
            }
        );

        // Without native entries the generic one is used.
        let selection = select(&gfx942, &[amd("gfx9-4-generic"), amd("gfx90a")]);
        assert_eq!(
            selection.chosen(),
            Some((&amd("gfx9-4-generic"), Match::Generic))
        );
    }

    #[test]
    fn generic_entries_keep_the_devices_feature_settings() {
        let gfx950 = device("gfx950:sramecc+:xnack-");
        let selection = select(&gfx950, &[amd("gfx9-4-generic")]);
        assert_eq!(
            selection.chosen(),
            Some((&amd("gfx9-4-generic"), Match::Generic))
        );

        let pinned = [amd("gfx9-4-generic:xnack+"), amd("gfx9-4-generic:xnack-")];
        let selection = select(&gfx950, &pinned);
        assert_eq!(
            selection.chosen(),
            Some((&amd("gfx9-4-generic:xnack-"), Match::Generic))
        );
        assert_eq!(
            rejection(&selection, &amd("gfx9-4-generic:xnack+")),
            Rejection::FeatureMismatch {
                feature: FeatureName::Xnack,
                entry: Feature::On,
                device: Feature::Off,
            }
        );
    }

    #[test]
    fn generic_entries_never_run_outside_their_family() {
        let selection = select(&device("gfx90a:sramecc+:xnack-"), &[amd("gfx9-4-generic")]);
        assert_eq!(selection.chosen(), None);
        assert_eq!(
            rejection(&selection, &amd("gfx9-4-generic")),
            Rejection::NotCoveredByGeneric {
                generic: processor("gfx9-4-generic"),
                device: processor("gfx90a"),
            }
        );
        assert_eq!(
            selection.to_string(),
            "rejected  hipv4-amdgcn-amd-amdhsa--gfx9-4-generic: gfx90a is in no generic target, \
             so gfx9-4-generic code cannot run on it\n\
             no entry runs on gfx90a:sramecc+:xnack-"
        );

        let selection = select(&device("gfx942:sramecc+:xnack-"), &[amd("gfx11-generic")]);
        assert_eq!(
            selection.verdicts()[0].reason(),
            "generic target gfx11-generic does not cover gfx942; gfx9-4-generic does"
        );
    }

    #[test]
    fn a_device_with_an_unknown_setting_takes_only_entries_that_leave_it_any() {
        let selection = select(
            &device("gfx942:sramecc+"),
            &[amd("gfx942:sramecc+:xnack-"), amd("gfx942")],
        );
        assert_eq!(
            selection.chosen(),
            Some((&amd("gfx942"), Match::FeatureAgnostic))
        );
        let refused = rejection(&selection, &amd("gfx942:sramecc+:xnack-"));
        assert_eq!(
            refused,
            Rejection::FeatureMismatch {
                feature: FeatureName::Xnack,
                entry: Feature::Off,
                device: Feature::Any,
            }
        );
        assert_eq!(
            refused.to_string(),
            "the entry needs xnack-, but the device's xnack setting is unknown"
        );
    }

    #[test]
    fn nvidia_devices_prefer_the_closest_cubin_then_the_newest_ptx() {
        let entries = mixed_bundle();
        for (arch, expected, matched) in [
            ("sm_90", cuda("sm_90"), Match::Cubin),
            ("sm_89", cuda("sm_80"), Match::Cubin),
            ("sm_86", cuda("sm_80"), Match::Cubin),
            ("sm_80", cuda("sm_80"), Match::Cubin),
            ("sm_100", cuda("compute_90"), Match::PtxJit),
            ("sm_120", cuda("compute_90"), Match::PtxJit),
        ] {
            let selection = select(&device(arch), &entries);
            assert_eq!(
                selection.chosen(),
                Some((&expected, matched)),
                "{arch}\n{selection}"
            );
            assert_eq!(selection.needs_jit(), matched == Match::PtxJit, "{arch}");
        }

        let selection = select(&device("sm_89"), &entries);
        assert_eq!(
            rejection(&selection, &cuda("sm_90")),
            Rejection::CubinOtherMajor {
                entry: sm("sm_90"),
                device: sm("sm_89")
            }
        );
        assert_eq!(
            rejection(&selection, &cuda("compute_90")),
            Rejection::PtxNewerThanDevice {
                entry: sm("sm_90"),
                device: sm("sm_89")
            }
        );
        assert_eq!(
            outcome(&selection, &cuda("compute_80")),
            &Outcome::Outranked {
                matched: Match::PtxJit,
                by: cuda("sm_80")
            }
        );
        assert_eq!(
            rejection(&select(&device("sm_86"), &[cuda("sm_89")]), &cuda("sm_89")),
            Rejection::CubinNewerMinor {
                entry: sm("sm_89"),
                device: sm("sm_86")
            }
        );

        let cubins = [cuda("sm_80"), cuda("sm_86"), cuda("sm_89")];
        let selection = select(&device("sm_87"), &cubins);
        assert_eq!(selection.chosen(), Some((&cuda("sm_86"), Match::Cubin)));
        assert_eq!(
            outcome(&selection, &cuda("sm_80")),
            &Outcome::Outranked {
                matched: Match::Cubin,
                by: cuda("sm_86")
            }
        );
    }

    #[test]
    fn a_device_nothing_runs_on_gets_every_entry_explained() {
        let selection = select(&device("sm_75"), &mixed_bundle());
        assert_eq!(selection.chosen(), None);
        assert_eq!(selection.chosen_index(), None);
        assert!(!selection.needs_jit());
        assert_eq!(
            selection.to_string(),
            "rejected  hipv4-amdgcn-amd-amdhsa--gfx90a: AMD code cannot run on an NVIDIA GPU\n\
             rejected  hipv4-amdgcn-amd-amdhsa--gfx942: AMD code cannot run on an NVIDIA GPU\n\
             rejected  hipv4-amdgcn-amd-amdhsa--gfx950: AMD code cannot run on an NVIDIA GPU\n\
             rejected  cuda-nvptx64-nvidia-cuda-sm_80: a cubin for sm_80 runs only on major \
             version 8, not on sm_75\n\
             rejected  cuda-nvptx64-nvidia-cuda-compute_80: PTX for compute_80 is newer than the \
             device's sm_75\n\
             rejected  cuda-nvptx64-nvidia-cuda-sm_90: a cubin for sm_90 runs only on major \
             version 9, not on sm_75\n\
             rejected  cuda-nvptx64-nvidia-cuda-compute_90: PTX for compute_90 is newer than the \
             device's sm_75\n\
             no entry runs on sm_75"
        );

        let selection = select(&device("gfx1100"), &mixed_bundle());
        assert_eq!(selection.chosen(), None);
        assert!(
            selection
                .verdicts()
                .iter()
                .all(|v| matches!(v.outcome(), Outcome::Rejected { .. }))
        );
        assert_eq!(
            select(&device("gfx1100"), &[]).to_string(),
            "no entry runs on gfx1100"
        );
    }

    #[test]
    fn explains_choices_line_by_line() {
        let entries = [
            amd("gfx942"),
            amd("gfx9-4-generic"),
            amd("gfx90a"),
            cuda("sm_90"),
        ];
        let selection = select(&device("gfx942:sramecc+:xnack-"), &entries);
        assert_eq!(
            selection.to_string(),
            "chosen    hipv4-amdgcn-amd-amdhsa--gfx942 (feature-agnostic: sramecc and xnack left \
             as Any)\n\
             outranked hipv4-amdgcn-amd-amdhsa--gfx9-4-generic (usable via the generic target, \
             but a native entry matched)\n\
             rejected  hipv4-amdgcn-amd-amdhsa--gfx90a: processor gfx90a is not the device's \
             gfx942\n\
             rejected  cuda-nvptx64-nvidia-cuda-sm_90: NVIDIA code cannot run on an AMD GPU"
        );

        let reasons = |device_text: &str, entries: &[EntryId]| -> Vec<String> {
            select(&device(device_text), entries)
                .verdicts()
                .iter()
                .map(|verdict| verdict.reason().to_owned())
                .collect()
        };
        assert_eq!(
            reasons(
                "gfx950:sramecc+:xnack-",
                &[
                    amd("gfx9-4-generic"),
                    amd("gfx950:sramecc+:xnack-"),
                    amd("gfx950:sramecc+:xnack-")
                ]
            ),
            [
                "usable via the generic target, but a native entry matched",
                "exact match",
                "usable, but the same entry appears earlier",
            ]
            .map(String::from)
        );
        assert_eq!(
            reasons("gfx950:sramecc+:xnack-", &[amd("gfx9-4-generic")]),
            ["through the generic target gfx9-4-generic, which covers gfx950"].map(String::from)
        );
        assert_eq!(
            reasons(
                "gfx942:sramecc+:xnack-",
                &[amd("gfx942:xnack-"), amd("gfx942:sramecc+"), amd("gfx942")]
            ),
            [
                "usable (feature-agnostic: sramecc left as Any), but \
                 hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+ is as specific and sorts first",
                "feature-agnostic: xnack left as Any",
                "usable (feature-agnostic: sramecc and xnack left as Any), but \
                 hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+ names more of the device's features",
            ]
            .map(String::from)
        );
        assert_eq!(
            reasons(
                "sm_86",
                &[
                    cuda("sm_86"),
                    cuda("sm_80"),
                    cuda("compute_80"),
                    cuda("compute_86")
                ]
            ),
            [
                "cubin for this exact architecture",
                "usable (cubin for sm_80, which runs on the newer sm_86 of the same major \
                 version), but cuda-nvptx64-nvidia-cuda-sm_86 is closer to the device",
                "usable (PTX for compute_80, compiled for sm_86 by the driver's JIT), but the \
                 cubin cuda-nvptx64-nvidia-cuda-sm_86 needs no JIT",
                "usable (PTX for compute_86, compiled for sm_86 by the driver's JIT), but the \
                 cubin cuda-nvptx64-nvidia-cuda-sm_86 needs no JIT",
            ]
            .map(String::from)
        );
        assert_eq!(
            reasons("sm_100", &[cuda("compute_80"), cuda("compute_90")])[0],
            "usable (PTX for compute_80, compiled for sm_100 by the driver's JIT), but \
             cuda-nvptx64-nvidia-cuda-compute_90 is newer"
        );
        assert_eq!(
            reasons("gfx942:sramecc+:xnack-", &[amd("gfx942:sramecc-")]),
            ["the entry needs sramecc-, but the device runs with sramecc+"].map(String::from)
        );
        assert_eq!(
            reasons("gfx1100", &[amd("gfx1100")]),
            ["exact match"].map(String::from)
        );
    }

    /// A module built for sm_80, sm_90 and sm_90a with ptxas, its PTX as a build without
    /// pruning would ship it.
    fn with_sm_90a() -> Vec<EntryId> {
        vec![
            cuda("sm_80"),
            cuda("compute_80"),
            cuda("sm_90"),
            cuda("sm_90a"),
            cuda("compute_90"),
        ]
    }

    #[test]
    fn arch_specific_code_runs_only_on_its_architecture_and_comes_first_there() {
        let entries = with_sm_90a();
        let elsewhere = |device: &str| {
            format!(
                "sm_90a code runs only on sm_90 (compute capability 9.0) devices; this device is \
                 {device}"
            )
        };
        for (device_text, expected, matched) in [
            ("sm_80", cuda("sm_80"), Match::Cubin),
            ("sm_89", cuda("sm_80"), Match::Cubin),
            ("sm_90", cuda("sm_90a"), Match::Cubin),
            ("sm_100", cuda("compute_90"), Match::PtxJit),
            ("sm_120", cuda("compute_90"), Match::PtxJit),
        ] {
            let selection = select(&device(device_text), &entries);
            assert_eq!(
                selection.chosen(),
                Some((&expected, matched)),
                "{device_text}\n{selection}"
            );
            assert_eq!(
                choose(&device(device_text), &entries).map(|(i, m)| (entries[i], m)),
                Some((expected, matched)),
                "{device_text}"
            );
            if device_text != "sm_90" {
                assert_eq!(
                    rejection(&selection, &cuda("sm_90a")),
                    Rejection::ArchSpecific {
                        entry: device("sm_90a"),
                        device: device(device_text),
                    },
                    "{device_text}"
                );
                let reason = selection.verdicts()[3].reason();
                assert_eq!(reason, elsewhere(device_text));
            }
        }

        // The explanation on the one architecture it runs on, and on a newer one.
        assert_eq!(
            select(&device("sm_90"), &entries).to_string(),
            "rejected  cuda-nvptx64-nvidia-cuda-sm_80: a cubin for sm_80 runs only on major \
             version 8, not on sm_90\n\
             outranked cuda-nvptx64-nvidia-cuda-compute_80 (usable (PTX for compute_80, compiled \
             for sm_90 by the driver's JIT), but the cubin cuda-nvptx64-nvidia-cuda-sm_90a needs \
             no JIT)\n\
             outranked cuda-nvptx64-nvidia-cuda-sm_90 (usable (cubin for this exact \
             architecture), but cuda-nvptx64-nvidia-cuda-sm_90a is built for this architecture \
             alone and comes first)\n\
             chosen    cuda-nvptx64-nvidia-cuda-sm_90a (arch-specific cubin for sm_90a, built \
             for this architecture alone: it may use instructions no other has)\n\
             outranked cuda-nvptx64-nvidia-cuda-compute_90 (usable (PTX for compute_90, compiled \
             for sm_90 by the driver's JIT), but the cubin cuda-nvptx64-nvidia-cuda-sm_90a needs \
             no JIT)"
        );
        assert_eq!(
            select(&device("sm_100"), &entries).to_string(),
            "rejected  cuda-nvptx64-nvidia-cuda-sm_80: a cubin for sm_80 runs only on major \
             version 8, not on sm_100\n\
             outranked cuda-nvptx64-nvidia-cuda-compute_80 (usable (PTX for compute_80, compiled \
             for sm_100 by the driver's JIT), but cuda-nvptx64-nvidia-cuda-compute_90 is newer)\n\
             rejected  cuda-nvptx64-nvidia-cuda-sm_90: a cubin for sm_90 runs only on major \
             version 9, not on sm_100\n\
             rejected  cuda-nvptx64-nvidia-cuda-sm_90a: sm_90a code runs only on sm_90 (compute \
             capability 9.0) devices; this device is sm_100\n\
             chosen    cuda-nvptx64-nvidia-cuda-compute_90 (PTX for compute_90, compiled for \
             sm_100 by the driver's JIT)"
        );
        // Alone, it serves no other device, and the reason says which one it needs.
        let selection = select(&device("sm_89"), &[cuda("sm_90a")]);
        assert_eq!(
            selection.to_string(),
            format!(
                "rejected  cuda-nvptx64-nvidia-cuda-sm_90a: {}\nno entry runs on sm_89",
                elsewhere("sm_89")
            )
        );
    }

    #[test]
    fn without_arch_specific_code_every_device_chooses_as_before() {
        let with = with_sm_90a();
        let without: Vec<EntryId> = with
            .iter()
            .copied()
            .filter(|entry| !entry.target().is_arch_specific())
            .collect();
        for device_text in ["sm_75", "sm_80", "sm_86", "sm_89", "sm_100", "sm_120"] {
            let (before, after) = (
                select(&device(device_text), &without),
                select(&device(device_text), &with),
            );
            assert_eq!(
                before.chosen(),
                after.chosen(),
                "{device_text}\n{before}\n{after}"
            );
            // Every other entry's verdict, reason included, is what it was.
            let others: Vec<&Verdict> = after
                .verdicts()
                .iter()
                .filter(|verdict| !verdict.entry().target().is_arch_specific())
                .collect();
            assert_eq!(others, before.verdicts().iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_rule_is_the_same_for_every_arch_specific_target() {
        // sm_100a: exactly compute capability 10.0, not 10.3 of the same major.
        let entries = [cuda("sm_90"), cuda("sm_100a"), cuda("compute_90")];
        let selection = select(&device("sm_100"), &entries);
        assert_eq!(selection.chosen(), Some((&cuda("sm_100a"), Match::Cubin)));
        let selection = select(&device("sm_103"), &entries);
        assert_eq!(
            selection.chosen(),
            Some((&cuda("compute_90"), Match::PtxJit))
        );
        assert_eq!(
            selection.verdicts()[1].reason(),
            "sm_100a code runs only on sm_100 (compute capability 10.0) devices; this device is \
             sm_103"
        );
        let selection = select(&device("sm_90"), &entries);
        assert_eq!(selection.chosen(), Some((&cuda("sm_90"), Match::Cubin)));

        // Arch-specific PTX (a build without ptxas) follows it too: preferred on its own
        // architecture among PTX, refused on any other.
        let ptx = [cuda("compute_90"), cuda("compute_90a")];
        let selection = select(&device("sm_90"), &ptx);
        assert_eq!(
            selection.chosen(),
            Some((&cuda("compute_90a"), Match::PtxJit))
        );
        assert_eq!(
            selection.verdicts()[1].reason(),
            "arch-specific PTX for compute_90a, compiled for sm_90 by the driver's JIT"
        );
        let selection = select(&device("sm_120"), &ptx);
        assert_eq!(
            selection.chosen(),
            Some((&cuda("compute_90"), Match::PtxJit))
        );
        assert_eq!(
            rejection(&selection, &cuda("compute_90a")),
            Rejection::ArchSpecific {
                entry: device("sm_90a"),
                device: device("sm_120"),
            }
        );

        // Never across vendors: the vendor is what an AMD device is told.
        assert_eq!(
            rejection(
                &select(&device("gfx942:sramecc+:xnack-"), &[cuda("sm_90a")]),
                &cuda("sm_90a")
            ),
            Rejection::DifferentVendor {
                entry: Vendor::Nvidia,
                device: Vendor::Amd
            }
        );
    }

    #[test]
    fn a_device_named_as_arch_specific_is_its_architecture() {
        let entries = with_sm_90a();
        let named = select(&device("sm_90a"), &entries);
        assert_eq!(named, select(&device("sm_90"), &entries));
        assert_eq!(named.device(), &device("sm_90"));
        assert_eq!(
            choose(&device("sm_90a"), &entries),
            choose(&device("sm_90"), &entries)
        );
    }

    /// Calls `visit` with every ordering of `items`.
    fn permutations(items: &mut Vec<EntryId>, fixed: usize, visit: &mut dyn FnMut(&[EntryId])) {
        if fixed == items.len() {
            visit(items);
            return;
        }
        for next in fixed..items.len() {
            items.swap(fixed, next);
            permutations(items, fixed + 1, visit);
            items.swap(fixed, next);
        }
    }

    #[test]
    fn entry_order_never_changes_the_choice() {
        let mut bundles = vec![
            mixed_bundle(),
            vec![
                amd("gfx942:sramecc+"),
                amd("gfx942:xnack-"),
                amd("gfx942"),
                amd("gfx9-4-generic"),
                amd("gfx9-4-generic:sramecc+:xnack-"),
                amd("gfx942"),
            ],
            vec![
                cuda("sm_80"),
                cuda("sm_86"),
                cuda("compute_80"),
                cuda("compute_86"),
                cuda("compute_90"),
            ],
            vec![
                cuda("sm_80"),
                cuda("sm_90"),
                cuda("sm_90a"),
                cuda("compute_90a"),
                cuda("compute_90"),
            ],
        ];
        let devices = [
            "gfx90a:sramecc+:xnack-",
            "gfx942:sramecc+:xnack-",
            "gfx950:sramecc+:xnack+",
            "gfx942:sramecc+",
            "sm_80",
            "sm_86",
            "sm_89",
            "sm_90",
            "sm_100",
            "sm_120",
            "sm_75",
        ];
        for entries in &mut bundles {
            for text in devices {
                let target = device(text);
                let expected = select(&target, entries)
                    .chosen()
                    .map(|(entry, matched)| (*entry, matched));
                permutations(entries, 0, &mut |order| {
                    let selection = select(&target, order);
                    let chosen = selection.chosen().map(|(entry, matched)| (*entry, matched));
                    assert_eq!(chosen, expected, "{text} with {order:?}");
                });
            }
        }
    }

    #[test]
    fn serializes_with_readable_fields() {
        let entries = [amd("gfx942"), amd("gfx9-4-generic"), amd("gfx90a:xnack+")];
        let selection = select(&device("gfx942:sramecc+:xnack-"), &entries);
        let text = toml::to_string(&selection).unwrap();
        for expected in [
            "device = \"gfx942:sramecc+:xnack-\"",
            "chosen = 0",
            "entry = \"hipv4-amdgcn-amd-amdhsa--gfx942\"",
            "status = \"chosen\"",
            "match = \"feature-agnostic\"",
            "reason = \"feature-agnostic: sramecc and xnack left as Any\"",
            "status = \"outranked\"",
            "match = \"generic\"",
            "by = \"hipv4-amdgcn-amd-amdhsa--gfx942\"",
            "status = \"rejected\"",
            "kind = \"different-processor\"",
            "entry = \"gfx90a\"",
            "device = \"gfx942\"",
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
    }
}
