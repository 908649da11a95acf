//! Explaining, for a device, which code object of each module would run and why every other
//! was passed over, on any machine and without a driver; for a bundle opened from packages,
//! also which package a better choice is missing from. The report is data (serializable) and
//! text, and nothing is loaded to make it, so it stands apart from loading.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Bundle, Source};
use crate::manifest::NotBuilt;
use crate::select::{Selection, select};
use crate::target::TargetId;

impl Bundle {
    /// For each module, which entry would run on `device` and why every other was passed over,
    /// and for a module with none, whether it is not built for the device by design (and why).
    /// No driver is involved: this works on any machine.
    ///
    /// The reasons come from the manifest, decoded here; an index whose manifest does not
    /// decode gives an explanation without them (and fails at [`Bundle::load`]).
    ///
    /// No device reports an architecture-specific target: one named so (`sm_90a`) is explained
    /// as the device its code runs on (`sm_90`), and the explanation says so.
    pub fn explain(&self, device: &TargetId) -> Explanation {
        let named = *device;
        let device = &named.portable();
        let modules = self
            .table()
            .modules()
            .enumerate()
            .map(|(index, module)| {
                let selection = select(device, &self.present_entries(&module));
                let missing_package = self.missing_package(&module, device);
                // Not built by design only when the whole bundle has nothing for the device
                // either, not when the package holding its code is missing.
                let not_built = match (selection.chosen(), &missing_package) {
                    (None, None) => self.not_built_for(index, device),
                    _ => None,
                };
                let package = match (&self.inner.source, selection.chosen()) {
                    (Source::Packages(_), Some((entry, _))) => {
                        self.package_of(entry).map(Path::to_owned)
                    }
                    _ => None,
                };
                ModuleChoice {
                    module: module.name().to_owned(),
                    missing_package,
                    selection,
                    not_built,
                    package,
                }
            })
            .collect();
        Explanation {
            device: *device,
            named_as: (named != *device).then_some(named),
            modules,
        }
    }
}

/// A target package a bundle opened from packages lacks: the one holding the code object a
/// whole bundle would give the device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MissingPackage {
    pub target: TargetId,
    /// The package's folder name: `hk-kernels-0.1.0-gfx950`.
    pub name: String,
}

impl std::fmt::Display for MissingPackage {
    /// What to install: `no package for gfx950: install hk-kernels-0.1.0-gfx950`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no package for {}: install {}", self.target, self.name)
    }
}

/// Why each module's entry was or was not chosen for a device.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub device: TargetId,
    /// The architecture-specific target the caller named the device by (`sm_90a`), when it
    /// did: `device` is then the architecture that target's code runs on (`sm_90`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub named_as: Option<TargetId>,
    pub modules: Vec<ModuleChoice>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModuleChoice {
    pub module: String,
    pub selection: Selection,
    /// When no entry runs on the device: the target the module skips on purpose that would
    /// have served it, and the manifest's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_built: Option<NotBuilt>,
    /// For a bundle opened from packages: the package the chosen code object comes from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<PathBuf>,
    /// For a bundle opened from packages: the missing package that holds what a whole bundle
    /// would choose (`hk-kernels-0.1.0-gfx950`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_package: Option<MissingPackage>,
}

impl Explanation {
    /// Whether [`Bundle::load`] would succeed: every module has a code object that runs on the
    /// device, or is not built for it by design.
    pub fn is_servable(&self) -> bool {
        self.modules
            .iter()
            .all(|m| m.selection.chosen().is_some() || m.not_built.is_some())
    }
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}", self.device)?;
        if let Some(named) = &self.named_as {
            write!(
                f,
                " (named as {named}, which is a target of code, not of a device: its code runs \
                 on {} devices alone)",
                self.device
            )?;
        }
        writeln!(f)?;
        for module in &self.modules {
            match &module.not_built {
                Some(not_built) => writeln!(
                    f,
                    "module {} is not built for {}: {}",
                    module.module, not_built.target, not_built.reason
                )?,
                None => writeln!(f, "module {}:", module.module)?,
            }
            for line in module.selection.to_string().lines() {
                writeln!(f, "  {line}")?;
            }
            if let Some(package) = &module.package {
                writeln!(f, "  from package {}", package.display())?;
            }
            match (&module.missing_package, module.selection.chosen()) {
                (Some(missing), None) => writeln!(f, "  {missing}")?,
                (Some(missing), Some(_)) => writeln!(
                    f,
                    "  {}, which is not installed, holds a better code object for {}",
                    missing.name, self.device
                )?,
                (None, _) => {}
            }
        }
        Ok(())
    }
}
