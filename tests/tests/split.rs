//! Per-target packages: `hkpack split` on a bundle built by the real toolchain, the packages
//! checked with LLVM's bundler and byte for byte against the bundle, and hkload composing them
//! from a search path: what is there serves, what is missing is named, what comes from
//! another build is refused.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::*;
use hk_format::offload::extract_entry;
use hk_format::package_set::TARGET_FILE;
use hkload::driver::{ImageKind, Recorded, RecordingDriver};
use hkload::{Bundle, Device, Error, OpenOptions};

const TARGETS: [&str; 5] = ["gfx90a", "gfx942", "gfx950", "gfx9-4-generic", "sm_80"];

/// `scale` for every target and `offset` for all but the generic one, at `version`, built
/// (compressed when asked) and split beside the bundle; the bundle's folder.
fn split_package(version: &str, compress: bool) -> (TempPackage, PathBuf) {
    let offset = OFFSET_MANIFEST.replace(
        "source = \"../kernels/offset.hip\"\n",
        "source = \"../kernels/offset.hip\"\nskip_targets = { \"gfx9-4-generic\" = \"not tried there\" }\n",
    );
    let package = TempPackage::new(
        &TARGETS,
        &[
            ("scale", SCALE_SOURCE, SCALE_MANIFEST),
            ("offset", OFFSET_SOURCE, &offset),
        ],
    );
    let toml = package.manifests().join("package.toml");
    let text = std::fs::read_to_string(&toml)
        .unwrap()
        .replace("version = \"0.1.0\"", &format!("version = \"{version}\""));
    std::fs::write(
        &toml,
        format!("{text}amd_code_object_versions = {{ \"gfx9-4-generic\" = 6 }}\n"),
    )
    .unwrap();
    let mut options = package.options();
    options.compress = compress;
    let bundle = build_ok(&options).bundle;
    let written = hkpack::split::split(&bundle, &package.path("dist")).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut expected = vec![format!("mini-{version}-index")];
    expected.extend(TARGETS.map(|t| format!("mini-{version}-{t}")));
    assert_eq!(names, expected);
    (package, bundle)
}

fn simulated(id: &str) -> (Arc<RecordingDriver>, Device) {
    let driver = Arc::new(RecordingDriver::new([id.parse().unwrap()]));
    let device = Device::new(driver.clone(), 0).unwrap();
    (driver, device)
}

/// Copies the folder `from` to `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A search path of two folders: the index package in the first, the packages of `targets`
/// in the second.
fn install(from: &Path, root: &Path, version: &str, targets: &[&str]) -> Vec<PathBuf> {
    let dirs = vec![root.join("index"), root.join("targets")];
    let name = format!("mini-{version}-index");
    copy_dir(&from.join(&name), &dirs[0].join(&name));
    for target in targets {
        let name = format!("mini-{version}-{target}");
        copy_dir(&from.join(&name), &dirs[1].join(&name));
    }
    dirs
}

#[test]
fn split_packages_hold_each_targets_code_objects_byte_for_byte() {
    for compress in [false, true] {
        let (package, bundle) = split_package("0.1.0", compress);
        let manifest = Bundle::open(&bundle).unwrap().manifest().unwrap().clone();
        let dist = package.path("dist");
        // The index package is the bundle's records, without module files.
        let index = dist.join("mini-0.1.0-index");
        for file in [
            "bundle.msgpack",
            "bundle.toml",
            "scale.abi.toml",
            "offset.abi.toml",
        ] {
            assert_eq!(
                std::fs::read(index.join(file)).unwrap(),
                std::fs::read(bundle.join(file)).unwrap(),
                "{file}"
            );
        }
        assert!(!index.join("scale.hipfb").exists());
        for target in TARGETS {
            let dir = dist.join(format!("mini-0.1.0-{target}"));
            let description = std::fs::read_to_string(dir.join(TARGET_FILE)).unwrap();
            assert!(
                description.contains(&format!("target = \"{target}\"")),
                "{description}"
            );
            for module in &manifest.modules {
                let file = dir.join(&module.file);
                let ids: Vec<String> = module
                    .entries
                    .iter()
                    .filter(|e| e.id.target().to_string() == target)
                    .map(|e| e.id.to_string())
                    .collect();
                if ids.is_empty() {
                    // offset skips the generic target: no file, nothing to hold.
                    assert_eq!((module.name.as_str(), target), ("offset", "gfx9-4-generic"));
                    assert!(!file.exists());
                    continue;
                }
                let listed = Command::new(llvm_tool("clang-offload-bundler"))
                    .args(["--list", "--type=o"])
                    .arg(format!("--input={}", file.display()))
                    .output()
                    .unwrap();
                assert!(
                    listed.status.success(),
                    "{}",
                    String::from_utf8_lossy(&listed.stderr)
                );
                let mut listed: Vec<String> = String::from_utf8(listed.stdout)
                    .unwrap()
                    .lines()
                    .map(str::to_owned)
                    .collect();
                listed.sort();
                let mut expected = ids.clone();
                expected.sort();
                assert_eq!(listed, expected, "{}", file.display());
                let split = std::fs::read(&file).unwrap();
                let whole = std::fs::read(bundle.join(&module.file)).unwrap();
                for id in &ids {
                    assert_eq!(
                        extract_entry(&split, id).unwrap(),
                        extract_entry(&whole, id).unwrap(),
                        "{id} of {}",
                        file.display()
                    );
                }
            }
        }
        // Splitting again changes nothing.
        let before = std::fs::read(dist.join("mini-0.1.0-gfx942/scale.hipfb")).unwrap();
        hkpack::split::split(&bundle, &dist).unwrap();
        assert_eq!(
            std::fs::read(dist.join("mini-0.1.0-gfx942/scale.hipfb")).unwrap(),
            before
        );
    }
}

#[test]
fn a_search_path_serves_what_it_holds_and_names_what_is_missing() {
    let (package, _) = split_package("0.1.0", false);
    let dist = package.path("dist");

    // Everything but the native gfx942 and gfx950 packages: the generic one serves them.
    let root = tempfile::tempdir().unwrap();
    let dirs = install(
        &dist,
        root.path(),
        "0.1.0",
        &["gfx90a", "gfx9-4-generic", "sm_80"],
    );
    let bundle = Bundle::open_search_path("mini-0.1.0", &dirs, OpenOptions::DEFAULT).unwrap();
    let generic_package = dirs[1].join("mini-0.1.0-gfx9-4-generic");
    for device in ["gfx942:sramecc+:xnack-", "gfx950:sramecc-:xnack+"] {
        let explanation = bundle.explain(&device.parse().unwrap());
        let scale = &explanation
            .modules
            .iter()
            .find(|m| m.module == "scale")
            .unwrap();
        let chosen = scale.selection.chosen().unwrap().0.to_string();
        assert_eq!(
            chosen, "hipv4-amdgcn-amd-amdhsa--gfx9-4-generic",
            "{explanation}"
        );
        let text = explanation.to_string();
        assert!(
            text.contains(&format!("from package {}", generic_package.display())),
            "{text}"
        );
        let native = &device[..6];
        assert!(
            text.contains(&format!(
                "mini-0.1.0-{native}, which is not installed, holds a better code object"
            )),
            "{text}"
        );
        // offset has no generic code: the device has nothing for it, and is told what to
        // install.
        assert!(
            text.contains(&format!(
                "no package for {native}: install mini-0.1.0-{native}"
            )),
            "{text}"
        );
        let (driver, device) = simulated(device);
        let refused = bundle.load(&device).err().unwrap().to_string();
        assert!(
            refused.contains(&format!(
                "no package for {native}: install mini-0.1.0-{native}"
            )),
            "{refused}"
        );
        assert!(driver.log().is_empty());
    }
    // gfx90a never takes the generic code object: it takes its own package's.
    let explanation = bundle.explain(&"gfx90a:sramecc+:xnack-".parse().unwrap());
    for module in &explanation.modules {
        let chosen = module.selection.chosen().unwrap().0.to_string();
        assert_eq!(chosen, "hipv4-amdgcn-amd-amdhsa--gfx90a", "{explanation}");
    }
    // And the code comes from the package, checked against the index's digest.
    let (driver, device) = simulated("sm_80");
    let kernels = bundle.load(&device).unwrap();
    kernels.preload().unwrap();
    let whole = Bundle::open(dist.join("mini-0.1.0")).unwrap();
    let manifest = whole.manifest().unwrap();
    let loaded: Vec<Vec<u8>> = driver
        .log()
        .into_iter()
        .filter_map(|event| match event {
            Recorded::Load { kind, image, .. } => {
                assert_eq!(kind, ImageKind::Cubin);
                Some(image)
            }
            _ => None,
        })
        .collect();
    assert_eq!(loaded.len(), 2);
    for (module, image) in manifest.modules.iter().zip(&loaded) {
        let entry = module
            .entries
            .iter()
            .find(|e| e.id.to_string().ends_with("sm_80"))
            .unwrap();
        assert_eq!(hk_format::manifest::Sha256Digest::of(image), entry.sha256);
    }

    // Without gfx90a's package, gfx90a is told what to install, and the rest still serve.
    let root = tempfile::tempdir().unwrap();
    let dirs = install(&dist, root.path(), "0.1.0", &["gfx942", "sm_80"]);
    let bundle = Bundle::open_search_path("mini-0.1.0", &dirs, OpenOptions::DEFAULT).unwrap();
    let explanation = bundle.explain(&"gfx90a:sramecc+:xnack-".parse().unwrap());
    assert!(!explanation.is_servable());
    assert!(
        explanation
            .to_string()
            .contains("no package for gfx90a: install mini-0.1.0-gfx90a"),
        "{explanation}"
    );
    for device in ["gfx942:sramecc+:xnack-", "sm_80"] {
        let kernels = bundle.load(&simulated(device).1).unwrap();
        kernels.kernel("scale").unwrap();
        kernels.kernel("offset").unwrap();
    }

    // No index package on the path: said so.
    let error = Bundle::open_search_path("mini-0.1.0", &dirs[1..], OpenOptions::DEFAULT)
        .err()
        .unwrap();
    assert!(matches!(error, Error::NotOnSearchPath { .. }), "{error}");
    assert!(error.to_string().contains("mini-0.1.0-index"), "{error}");

    // The full bundle on the path serves whole.
    let bundle = Bundle::open_search_path("mini-0.1.0", &[&dist], OpenOptions::DEFAULT).unwrap();
    assert!(
        bundle
            .explain(&"gfx950:sramecc+:xnack-".parse().unwrap())
            .is_servable()
    );
}

/// `hkpack verify` over a package set: a file in a target package that the index does not
/// list for its target (another target's module file copied in, or anything else) is a
/// failure naming the file, not passed over.
#[test]
fn verify_names_a_stray_file_in_a_target_package() {
    let (package, _) = split_package("0.1.0", false);
    let dist = package.path("dist");
    let (index, generic) = (
        dist.join("mini-0.1.0-index"),
        dist.join("mini-0.1.0-gfx9-4-generic"),
    );
    let dirs = [index, generic.clone()];
    let damaged = || -> Vec<hkpack::verify::FileVerdict> {
        hkpack::verify::packages::verify_set(&dirs, &[])
            .unwrap()
            .into_iter()
            .filter(|v| !v.intact)
            .collect()
    };
    assert_eq!(damaged(), []);

    // `offset` skips the generic target: its gfx942 package's file has no place there.
    std::fs::copy(
        dist.join("mini-0.1.0-gfx942/offset.hipfb"),
        generic.join("offset.hipfb"),
    )
    .unwrap();
    std::fs::write(generic.join("notes.txt"), "left here").unwrap();
    let bad = damaged();
    let files: Vec<&str> = bad.iter().map(|v| v.file.as_str()).collect();
    assert_eq!(
        files,
        [
            "mini-0.1.0-gfx9-4-generic/notes.txt",
            "mini-0.1.0-gfx9-4-generic/offset.hipfb"
        ],
        "{bad:?}"
    );
    assert!(
        bad[1].detail.contains("module offset") && bad[1].detail.contains("not tried there"),
        "{bad:?}"
    );
    assert!(bad[0].detail.contains("remove it"), "{bad:?}");
}

#[test]
fn packages_of_another_version_or_build_are_refused_naming_both() {
    let (old, _) = split_package("0.1.0", false);
    let (new, _) = split_package("0.2.0", false);
    let root = tempfile::tempdir().unwrap();
    let dirs = install(&old.path("dist"), root.path(), "0.1.0", &["gfx942"]);
    // 0.2.0's sm_80 package, renamed as if it were 0.1.0's.
    copy_dir(
        &new.path("dist/mini-0.2.0-sm_80"),
        &dirs[1].join("mini-0.1.0-sm_80"),
    );
    let error = Bundle::open_search_path("mini-0.1.0", &dirs, OpenOptions::DEFAULT)
        .err()
        .unwrap();
    assert!(matches!(error, Error::ForeignPackage { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("is mini 0.2.0 for sm_80") && text.contains("is mini 0.1.0 for sm_80"),
        "{text}"
    );

    // Same version, another build (a source edited): the index digests differ.
    std::fs::remove_dir_all(dirs[1].join("mini-0.1.0-sm_80")).unwrap();
    std::fs::write(
        old.path("kernels/scale.hip"),
        SCALE_SOURCE.replace("x[i] * a", "x[i] * a + 1.0f"),
    )
    .unwrap();
    let rebuilt = build_ok(&old.options()).bundle;
    let other = tempfile::tempdir().unwrap();
    hkpack::split::split(&rebuilt, other.path()).unwrap();
    copy_dir(
        &other.path().join("mini-0.1.0-sm_80"),
        &dirs[1].join("mini-0.1.0-sm_80"),
    );
    let text = Bundle::open_search_path("mini-0.1.0", &dirs, OpenOptions::DEFAULT)
        .err()
        .unwrap()
        .to_string();
    let first = Bundle::open(dirs[0].join("mini-0.1.0-index"))
        .unwrap()
        .index_digest();
    let second = Bundle::open(&rebuilt).unwrap().index_digest();
    assert_ne!(first, second);
    assert!(
        text.contains(&format!("index {second}")) && text.contains(&format!("index {first}")),
        "{text}"
    );
}

#[test]
fn a_signed_index_vouches_for_every_package_split_from_it() {
    let (package, bundle) = split_package("0.1.0", true);
    let keys = package.path("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let key = hkpack::sign::keygen(&keys.join("release")).unwrap();
    hkpack::sign::sign(&bundle, &keys.join("release.key")).unwrap();
    // Split after signing: the signature travels with the index.
    let dist = package.path("dist");
    hkpack::split::split(&bundle, &dist).unwrap();
    let trusting = OpenOptions {
        trusted_keys: vec![key],
        ..OpenOptions::DEFAULT
    };
    let root = tempfile::tempdir().unwrap();
    let dirs = install(&dist, root.path(), "0.1.0", &["sm_80"]);
    let bundle = Bundle::open_search_path("mini-0.1.0", &dirs, trusting.clone()).unwrap();
    bundle
        .load(&simulated("sm_80").1)
        .unwrap()
        .preload()
        .unwrap();

    // No single-byte change of a package's module file gets a byte past the signed index:
    // each is refused (by the format's checks, or by the image's digest in the index), or
    // touches no byte of the image (a checksum hkload does not read, an entry it does not
    // decompress), and the driver gets the image the index vouches for.
    let file = dirs[1].join("mini-0.1.0-sm_80/scale.hipfb");
    let signed = bundle
        .manifest()
        .unwrap()
        .module("scale")
        .unwrap()
        .entries
        .iter()
        .find(|e| e.id.to_string().ends_with("sm_80"))
        .unwrap()
        .sha256;
    let original = std::fs::read(&file).unwrap();
    let mut refused = 0;
    for at in 0..original.len() {
        let mut damaged = original.clone();
        damaged[at] ^= 0x01;
        std::fs::write(&file, &damaged).unwrap();
        let (driver, device) = simulated("sm_80");
        let loaded = Bundle::open_search_path("mini-0.1.0", &dirs, trusting.clone())
            .and_then(|bundle| bundle.load(&device)?.kernel("scale"));
        let images: Vec<Vec<u8>> = driver
            .log()
            .into_iter()
            .filter_map(|event| match event {
                Recorded::Load { image, .. } => Some(image),
                _ => None,
            })
            .collect();
        match loaded {
            Err(_) => {
                assert!(images.is_empty(), "byte {at}: refused after a load");
                refused += 1;
            }
            Ok(_) => assert_eq!(
                images
                    .iter()
                    .map(|i| hk_format::manifest::Sha256Digest::of(i))
                    .collect::<Vec<_>>(),
                [signed],
                "byte {at}"
            ),
        }
    }
    // Most changes are refused; what is not lies in the checksum or in the compressed PTX past
    // the cubin, which loading the cubin never decompresses.
    assert!(
        refused > original.len() / 2,
        "{refused} of {}",
        original.len()
    );
    std::fs::write(&file, &original).unwrap();

    // Without the signature, a trusting open is refused.
    std::fs::remove_file(dirs[0].join("mini-0.1.0-index/bundle.sig")).unwrap();
    let error = Bundle::open_search_path("mini-0.1.0", &dirs, trusting)
        .err()
        .unwrap();
    assert!(matches!(error, Error::Signature { .. }), "{error}");
}
