//! Signed and pinned bundles: `hkpack keygen` and `hkpack sign` on a bundle built by the real
//! toolchain, hkload opening it with trusted keys or a pinned digest, and every single-byte
//! change of a signed bundle refused.

mod common;

use common::*;
use hk_format::index::INDEX_FILE;
use hk_format::manifest::Sha256Digest;
use hk_format::signing::{PublicKey, SIGNATURE_FILE};
use hkload::{Bundle, Error, OpenOptions};

/// A small bundle (compressed, so that every byte of its module file is covered by the code
/// images' digests or the format's own checks), signed; with the key that signed it and
/// another.
fn signed_bundle() -> (TempPackage, std::path::PathBuf, PublicKey, PublicKey) {
    let package = TempPackage::new(
        &["gfx942", "sm_90"],
        &[("scale", SCALE_SOURCE, SCALE_MANIFEST)],
    );
    let mut options = package.options();
    options.compress = true;
    let dir = build_ok(&options).bundle;
    let keys = package.path("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let key = hkpack::sign::keygen(&keys.join("release")).unwrap();
    let other = hkpack::sign::keygen(&keys.join("other")).unwrap();
    assert_eq!(
        hkpack::sign::sign(&dir, &keys.join("release.key")).unwrap(),
        key
    );
    (package, dir, key, other)
}

fn trusting(keys: &[PublicKey]) -> OpenOptions {
    OpenOptions {
        trusted_keys: keys.to_vec(),
        ..OpenOptions::DEFAULT
    }
}

#[test]
fn hkload_opens_a_bundle_signed_by_a_trusted_key_and_no_other() {
    let (package, dir, key, other) = signed_bundle();
    Bundle::open_with(&dir, trusting(&[other, key])).unwrap();
    let error = Bundle::open_with(&dir, trusting(&[other]))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("not among the trusted keys") && error.contains(&other.to_string()),
        "{error}"
    );

    // The keygen command refuses to overwrite a key.
    let again = hkpack::sign::keygen(&package.path("keys/release"))
        .unwrap_err()
        .to_string();
    assert!(again.contains("exists already"), "{again}");

    std::fs::remove_file(dir.join(SIGNATURE_FILE)).unwrap();
    let error = Bundle::open_with(&dir, trusting(&[key]))
        .unwrap_err()
        .to_string();
    assert!(error.contains("the bundle is not signed"), "{error}");
    // Without keys, no signature is asked for.
    Bundle::open(&dir).unwrap();
}

#[test]
fn a_pinned_index_digest_admits_that_build_alone() {
    let (_package, dir, _, _) = signed_bundle();
    let digest = Sha256Digest::of(&std::fs::read(dir.join(INDEX_FILE)).unwrap());
    let pinned = |expect| OpenOptions {
        expect_digest: Some(expect),
        ..OpenOptions::DEFAULT
    };
    Bundle::open_with(&dir, pinned(digest)).unwrap();
    let mut other = digest;
    other.0[0] ^= 1;
    let error = Bundle::open_with(&dir, pinned(other)).unwrap_err();
    assert!(matches!(error, Error::Pinned { .. }), "{error}");
    assert!(error.to_string().contains(&digest.to_string()), "{error}");
}

/// Every single-byte change of every file of a signed bundle is refused: by hkload opening and
/// loading it with the trusted key (the index, the signature, the module file), and by
/// `hkpack verify` with that key (every file, the readable copies included).
#[test]
fn every_single_byte_change_of_a_signed_bundle_is_refused() {
    let (_package, dir, key, _) = signed_bundle();
    let files = [
        "bundle.msgpack",
        "bundle.sig",
        "scale.hipfb",
        "scale.abi.toml",
        "bundle.toml",
    ];
    let intact = hkpack::verify::verify(&dir, &[key]);
    assert!(intact.iter().all(|v| v.intact), "{intact:?}");
    for file in files {
        let path = dir.join(file);
        let original = std::fs::read(&path).unwrap();
        // Every byte of the small files; a spread of 600 of the module file.
        let step = (original.len() / 600).max(1);
        for at in (0..original.len()).step_by(step) {
            let mut damaged = original.clone();
            damaged[at] ^= 0x20;
            std::fs::write(&path, &damaged).unwrap();
            let verdicts = hkpack::verify::verify(&dir, &[key]);
            assert!(
                verdicts.iter().any(|v| !v.intact),
                "`hkpack verify` missed byte {at} of {file}"
            );
            if matches!(file, "bundle.msgpack" | "bundle.sig" | "scale.hipfb") {
                let loaded = Bundle::open_with(&dir, trusting(&[key])).and_then(|bundle| {
                    let (_, device) = simulated_device("gfx942:sramecc+:xnack-");
                    bundle.load(&device)?.preload()
                });
                assert!(loaded.is_err(), "hkload took byte {at} of {file} changed");
            }
        }
        std::fs::write(&path, &original).unwrap();
    }
}

fn simulated_device(id: &str) -> ((), hkload::Device) {
    let driver = std::sync::Arc::new(hkload::driver::RecordingDriver::new([id.parse().unwrap()]));
    ((), hkload::Device::new(driver, 0).unwrap())
}
