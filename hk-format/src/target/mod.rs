//! GPU target IDs and clang offload bundle entry IDs: their text forms, what each AMD processor
//! supports, and how an AMDGPU code object's `e_flags` spell the same facts.
//!
//! A [`TargetId`] names the GPU some code is built for, or the GPU a device is:
//! `gfx942:sramecc+:xnack-` on AMD, `sm_90` on NVIDIA. An [`EntryId`] names one code image in
//! a bundle, its kind plus its target: `hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`.
//! Parsing accepts features in any order; printing is always canonical (alphabetical, so
//! `sramecc` before `xnack`), because older ROCm parsers accept no other order.
//!
//! Which entry runs on which device is decided in hkload's `select`.
//!
//! Each concern has a file of its own: `processor` holds the table of AMD processors and what
//! each supports, `id` the target IDs (and how an AMDGPU code object's `e_flags` spell one),
//! `entry` the bundle entry IDs; the composition rule, which a set of targets must follow to
//! share one bundle, is here.

mod entry;
mod id;
mod processor;

pub use entry::{EntryId, EntryIdError};
pub use id::{
    AmdTarget, EFlagsError, Feature, SmArch, TargetId, TargetIdError, Vendor, generic_version,
};
pub use processor::{FeatureName, Processor};

/// Two targets that one clang offload bundle cannot hold together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "targets {any} and {named} cannot share a bundle: {named} names {feature} and {any} leaves it \
     Any, and clang's rule (which the HIP runtime relies on) is that every entry for a processor \
     names the same features; name {feature} in every {processor} target (e.g. \
     {processor}:{feature}+ and {processor}:{feature}-) or in none"
)]
pub struct CompositionError {
    pub any: TargetId,
    pub named: TargetId,
    pub feature: FeatureName,
    pub processor: Processor,
}

/// Checks that `targets` can share one bundle: for each processor, a feature is named (on or
/// off) by every entry or by none (the composition rule of clang's bundle format).
pub fn check_composition(targets: &[TargetId]) -> Result<(), CompositionError> {
    let amd: Vec<&AmdTarget> = targets
        .iter()
        .filter_map(|t| match t {
            TargetId::Amd(amd) => Some(amd),
            TargetId::Nvidia(_) => None,
        })
        .collect();
    for (i, a) in amd.iter().enumerate() {
        for b in &amd[i + 1..] {
            if a.processor() != b.processor() {
                continue;
            }
            for feature in FeatureName::ALL {
                let (fa, fb) = (a.feature(feature), b.feature(feature));
                if (fa == Feature::Any) != (fb == Feature::Any) {
                    let (any, named) = if fa == Feature::Any { (a, b) } else { (b, a) };
                    return Err(CompositionError {
                        any: TargetId::Amd(**any),
                        named: TargetId::Amd(**named),
                        feature,
                        processor: a.processor(),
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[test]
    fn a_bundle_names_a_feature_in_every_entry_of_a_processor_or_in_none() {
        let targets =
            |ids: &[&str]| -> Vec<TargetId> { ids.iter().map(|t| t.parse().unwrap()).collect() };
        assert!(check_composition(&targets(&["gfx90a", "gfx942", "gfx950", "sm_90"])).is_ok());
        assert!(check_composition(&targets(&["gfx942:xnack-", "gfx942:xnack+", "gfx90a"])).is_ok());
        let error =
            check_composition(&targets(&["gfx942", "gfx90a:xnack-", "gfx942:xnack-"])).unwrap_err();
        assert_eq!(error.any.to_string(), "gfx942");
        assert_eq!(error.named.to_string(), "gfx942:xnack-");
        assert!(
            error
                .to_string()
                .contains("name xnack in every gfx942 target"),
            "{error}"
        );
    }

    pub(super) fn target(text: &str) -> TargetId {
        text.parse()
            .unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    pub(super) fn processor(name: &str) -> Processor {
        Processor::named(name).unwrap_or_else(|| panic!("{name} is not in the table"))
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Doc {
        target: TargetId,
        entry: EntryId,
    }

    #[test]
    fn serde_uses_the_canonical_text() {
        let doc: Doc = toml::from_str(
            "target = \"gfx942:xnack-:sramecc+\"\nentry = \"hip-amdgcn-amd-amdhsa--gfx90a:xnack+\"\n",
        )
        .unwrap();
        assert_eq!(doc.target, target("gfx942:sramecc+:xnack-"));
        assert_eq!(
            toml::to_string(&doc).unwrap(),
            "target = \"gfx942:sramecc+:xnack-\"\nentry = \"hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+\"\n"
        );
        let bad = toml::from_str::<Doc>(
            "target = \"gfx1100:xnack-\"\nentry = \"cuda-nvptx64-nvidia-cuda-sm_90\"\n",
        )
        .unwrap_err();
        assert!(
            bad.to_string().contains("gfx1100 has no xnack setting"),
            "{bad}"
        );
        let bad = toml::from_str::<Doc>(
            "target = \"sm_90\"\nentry = \"host-x86_64-unknown-linux-gnu-\"\n",
        )
        .unwrap_err();
        assert!(bad.to_string().contains("offload kind `host`"), "{bad}");
    }
}
