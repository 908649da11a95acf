//! `hkpack keygen` and `hkpack sign`: ed25519 keys in files, and a bundle's signature written
//! beside its index (the format is hkload's, [`hk_format::signing`]). The same key files sign
//! and check remote cache entries (`hkpack build --cache-sign-key`, `--cache-trust`).

use std::io::Write;
use std::path::{Path, PathBuf};

use hk_format::index::INDEX_FILE;
use hk_format::signing::{PublicKey, SIGNATURE_FILE, SecretKey};

use crate::error::Error;

/// The secret key's file for the key pair `name`: `<name>.key`.
pub fn secret_key_file(name: &Path) -> PathBuf {
    name.with_extension("key")
}

/// The public key's file for the key pair `name`: `<name>.pub`.
pub fn public_key_file(name: &Path) -> PathBuf {
    name.with_extension("pub")
}

fn key_error(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::Key {
        path: path.to_owned(),
        detail: detail.to_string(),
    }
}

/// Makes a key pair from the operating system's random generator and writes `<name>.key`
/// (readable by its owner alone) and `<name>.pub`. Refuses to overwrite either.
pub fn keygen(name: &Path) -> Result<PublicKey, Error> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| key_error(name, format!("no randomness: {e}")))?;
    let key = SecretKey::from_seed(seed);
    let (secret, public) = (secret_key_file(name), public_key_file(name));
    for path in [&secret, &public] {
        if path.exists() {
            return Err(key_error(
                path,
                "exists already; choose another name or remove it",
            ));
        }
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(&secret)
        .and_then(|mut file| writeln!(file, "{}", key.to_text()))
        .map_err(|e| key_error(&secret, e))?;
    std::fs::write(&public, format!("{}\n", key.public_key()))
        .map_err(|e| key_error(&public, e))?;
    Ok(key.public_key())
}

/// Reads a public key file (`ed25519:` and 64 hex digits). What a bad one holds is not
/// repeated: it may be the secret key, given by mistake, and errors end up in CI logs.
pub fn read_public_key(path: &Path) -> Result<PublicKey, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| key_error(path, e))?;
    text.trim().parse().map_err(|_| {
        key_error(
            path,
            if text.parse::<SecretKey>().is_ok() {
                "holds a secret key: give the public key, the `.pub` file `hkpack keygen` wrote beside it (and keep this one out of logs and shared folders)"
            } else {
                "is not a public key (`ed25519:` and 64 hex digits, the `.pub` file from `hkpack keygen`)"
            },
        )
    })
}

/// Reads a secret key file (64 hex digits).
pub fn read_secret_key(path: &Path) -> Result<SecretKey, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| key_error(path, e))?;
    text.parse().map_err(|_| {
        key_error(
            path,
            "is not a secret key (64 hex digits, from `hkpack keygen`)",
        )
    })
}

/// Signs the bundle folder `bundle` with the secret key in `key_file`: writes `bundle.sig`.
pub fn sign(bundle: &Path, key_file: &Path) -> Result<PublicKey, Error> {
    let key = read_secret_key(key_file)?;
    let index_path = bundle.join(INDEX_FILE);
    let index = std::fs::read(&index_path).map_err(|e| key_error(&index_path, e))?;
    // The index must be whole before it is vouched for.
    hk_format::index::Index::open(index.clone(), true).map_err(|e| key_error(&index_path, e))?;
    let signature = key.sign(&index).to_toml();
    let path = bundle.join(SIGNATURE_FILE);
    std::fs::write(&path, signature).map_err(|e| key_error(&path, e))?;
    Ok(key.public_key())
}
