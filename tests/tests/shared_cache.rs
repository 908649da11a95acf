//! The build cache shared between machines, against real servers started here: Redis, nginx
//! serving WebDAV, moto's S3 and a folder (a shared mount). A warm remote fills an empty local
//! cache without compiling and gives the same bundle byte for byte; damaged entries are found,
//! rebuilt and overwritten; a server that dies mid-build, refuses or never answers costs one
//! warning and no failure; read-only builds write nothing; builds given trusted keys use only
//! entries those keys signed; and sccache, as the compiler launcher, caches every compile.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::servers::{self, Sccache, Server};
use common::*;
use hk_format::signing::{PublicKey, SecretKey};
use hkpack::cache::remote::{Fetched, Remote};
use hkpack::cache::storage::S3Credentials;
use hkpack::cache::{RemoteOptions, Signer};
use hkpack::{BuildOptions, BuildReport};
use sha2::{Digest, Sha256};

const MODULES: [(&str, &str, &str); 2] = [
    ("scale", SCALE_SOURCE, SCALE_MANIFEST),
    ("offset", OFFSET_SOURCE, OFFSET_MANIFEST),
];

/// The folder of the remote's entries: the cache layout's version.
const LAYOUT: &str = "hkpack-cache-3";

/// Two modules for one AMD and one NVIDIA target: four jobs.
fn package() -> TempPackage {
    TempPackage::new(&["gfx942", "sm_90"], &MODULES)
}

fn remote(url: &str) -> RemoteOptions {
    RemoteOptions {
        url: url.to_owned(),
        read_only: false,
        timeout: RemoteOptions::DEFAULT_TIMEOUT,
        s3_credentials: None,
        signer: None,
        trusted_keys: Vec::new(),
    }
}

/// A build of `package` with its own local cache and output folder (`name`), through `remote`.
fn build_in(package: &TempPackage, name: &str, remote: &RemoteOptions) -> BuildReport {
    let mut options: BuildOptions = package.options();
    options.cache_dir = package.path(&format!("{name}/cache"));
    options.out_dir = package.path(&format!("{name}/dist"));
    options.remote_cache = Some(remote.clone());
    build_ok(&options)
}

/// Each file of a bundle folder with the SHA-256 of its bytes.
fn digests(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let bytes = std::fs::read(e.path()).unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                hk_format::manifest::hex(&Sha256::digest(bytes)),
            )
        })
        .collect();
    files.sort();
    files
}

/// A cold build through `url`, then one from an empty local cache: the second compiles
/// nothing, reads everything from the remote and writes the same bundle.
fn warm_remote_round_trip(url: &str, s3_credentials: Option<S3Credentials>) {
    let package = package();
    let remote = RemoteOptions {
        s3_credentials,
        ..remote(url)
    };
    let cold = build_in(&package, "cold", &remote);
    assert_eq!((cold.compiled, cold.remote_hits), (4, 0), "{cold}");
    let written = cold.remote.as_ref().unwrap();
    assert_eq!(written.written_back, 4, "{cold}");
    assert!(written.bytes_written > 0, "{cold}");
    assert!(cold.warnings.is_empty(), "{:?}", cold.warnings);

    let warm = build_in(&package, "warm", &remote);
    assert_eq!(
        (warm.compiled, warm.local_hits, warm.remote_hits),
        (0, 0, 4),
        "{warm}"
    );
    let read = warm.remote.as_ref().unwrap();
    assert_eq!(read.written_back, 0, "{warm}");
    assert!(read.bytes_read > 0, "{warm}");
    assert!(warm.warnings.is_empty(), "{:?}", warm.warnings);
    assert_eq!(digests(&warm.bundle), digests(&cold.bundle));

    // The entries read through are local now.
    let again = build_in(&package, "warm", &remote);
    assert_eq!((again.compiled, again.local_hits), (0, 4), "{again}");
}

#[test]
fn redis_serves_a_second_machine_without_compiling() {
    let server = servers::redis();
    warm_remote_round_trip(&format!("redis://127.0.0.1:{}/3", server.port), None);
}

#[test]
fn webdav_serves_a_second_machine_without_compiling() {
    let server = servers::webdav();
    warm_remote_round_trip(
        &format!("webdav+http://127.0.0.1:{}/hkpack", server.port),
        None,
    );
}

#[test]
fn s3_serves_a_second_machine_without_compiling() {
    let server = servers::s3();
    let credentials = S3Credentials {
        access_key_id: "test".into(),
        secret_access_key: "test".into(),
    };
    warm_remote_round_trip(
        &format!(
            "s3://bucket/ci?endpoint=http://127.0.0.1:{}&region=us-east-1",
            server.port
        ),
        Some(credentials),
    );
}

#[test]
fn a_shared_folder_serves_a_second_machine_without_compiling() {
    let shared = tempfile::tempdir().unwrap();
    warm_remote_round_trip(&format!("file://{}", shared.path().display()), None);
}

/// The remote's entries of one kind, as nginx stores them.
fn entries(server: &Server, kind: &str) -> Vec<std::path::PathBuf> {
    let dir = server.dir.path().join("www/hkpack").join(LAYOUT).join(kind);
    files_in(&dir)
}

/// The files of a folder, sorted.
fn files_in(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn corrupted_and_swapped_entries_are_rebuilt_and_overwritten() {
    let server = servers::webdav();
    let remote = remote(&format!("webdav+http://127.0.0.1:{}/hkpack", server.port));
    let package = package();
    let cold = build_in(&package, "cold", &remote);
    assert_eq!(cold.compiled, 4, "{cold}");

    let objects = entries(&server, "objects");
    assert_eq!(objects.len(), 4);
    // One entry's last byte (inside its contents) flipped; another replaced by a third's
    // bytes, intact but answering another key.
    let mut corrupted = std::fs::read(&objects[0]).unwrap();
    *corrupted.last_mut().unwrap() ^= 0x40;
    std::fs::write(&objects[0], corrupted).unwrap();
    std::fs::copy(&objects[2], &objects[1]).unwrap();

    let second = build_in(&package, "second", &remote);
    assert_eq!((second.compiled, second.remote_hits), (2, 2), "{second}");
    assert_eq!(second.warnings.len(), 2, "{:?}", second.warnings);
    let said = second.warnings.join("\n");
    assert!(
        said.contains(&name(&objects[0])) && said.contains("corrupted"),
        "{said}"
    );
    assert!(
        said.contains(&name(&objects[1]))
            && said.contains(&format!(
                "holds the entry of `{LAYOUT}/objects/{}`",
                name(&objects[2])
            )),
        "{said}"
    );
    assert!(said.contains("overwriting the entry"), "{said}");
    assert_eq!(second.remote.as_ref().unwrap().written_back, 2, "{second}");
    assert_eq!(digests(&second.bundle), digests(&cold.bundle));

    // Both were overwritten with good entries: a third machine compiles nothing.
    let third = build_in(&package, "third", &remote);
    assert_eq!((third.compiled, third.remote_hits), (0, 4), "{third}");
    assert!(third.warnings.is_empty(), "{:?}", third.warnings);
}

/// An entry sealed as the answer to one job but holding another job's outputs, as anyone
/// who may write to the store can make one: its seal holds, the build's check of the outputs
/// does not. It is a miss with one warning naming it, compiled here and overwritten, and it
/// never reaches the local cache, so later builds, with or without the store, succeed.
#[test]
fn a_sealed_entry_holding_another_jobs_outputs_is_a_miss_and_never_stored() {
    let shared = tempfile::tempdir().unwrap();
    let remote = remote(&format!("file://{}", shared.path().display()));
    let package = package();
    let cold = build_in(&package, "cold", &remote);
    assert_eq!(cold.compiled, 4, "{cold}");

    // The second entry now holds the first's outputs, sealed through the store's own API as
    // the answer to the second's key. Any two jobs of the package differ in target or kernels.
    let objects = files_in(&shared.path().join(LAYOUT).join("objects"));
    assert_eq!(objects.len(), 4);
    let [first, second] =
        [&objects[0], &objects[1]].map(|p| format!("{LAYOUT}/objects/{}", name(p)));
    let store = Remote::open(&remote).unwrap();
    let Fetched::Payload(outputs) = store.get(&first) else {
        panic!("{first} cannot be read back: {:?}", store.warnings());
    };
    assert!(store.put(&second, &outputs), "{:?}", store.warnings());
    drop(store);

    let swapped = build_in(&package, "swapped", &remote);
    assert_eq!((swapped.compiled, swapped.remote_hits), (1, 3), "{swapped}");
    assert_eq!(swapped.warnings.len(), 1, "{:?}", swapped.warnings);
    let said = &swapped.warnings[0];
    assert!(
        said.contains(&format!("ignored entry `{second}`"))
            && said.contains("fail this job's checks")
            && said.contains("overwriting the entry"),
        "{said}"
    );
    assert_eq!(
        swapped.remote.as_ref().unwrap().written_back,
        1,
        "{swapped}"
    );
    assert_eq!(digests(&swapped.bundle), digests(&cold.bundle));

    // Only checked outputs reached the local cache: without the store, every job hits.
    let mut local = package.options();
    local.cache_dir = package.path("swapped/cache");
    local.out_dir = package.path("swapped/dist-local");
    let local = build_ok(&local);
    assert_eq!((local.compiled, local.local_hits), (0, 4), "{local}");
    assert!(local.warnings.is_empty(), "{:?}", local.warnings);

    // And the entry was overwritten: a third machine reads all four.
    let third = build_in(&package, "third", &remote);
    assert_eq!((third.compiled, third.remote_hits), (0, 4), "{third}");
    assert!(third.warnings.is_empty(), "{:?}", third.warnings);
}

/// A file's name, as the warnings quote it.
fn name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn a_server_stopped_mid_build_still_gives_a_correct_bundle() {
    let reference = package();
    let expected = build_ok(&reference.options());

    let mut server = servers::redis();
    let remote = remote(&format!("redis://127.0.0.1:{}/0", server.port));
    let package = package();
    let mut options = package.options();
    options.remote_cache = Some(remote);
    options.jobs = 1;
    let objects = package.path("cache/objects");
    let report = std::thread::scope(|scope| {
        let build = scope.spawn(|| hkpack::build(&options));
        // Redis dies as soon as the first job is stored, three jobs before the end.
        let deadline = Instant::now() + Duration::from_secs(120);
        while std::fs::read_dir(&objects).map_or(0, |d| d.count()) == 0 {
            assert!(Instant::now() < deadline, "the build stored no job");
            std::thread::sleep(Duration::from_millis(2));
        }
        server.kill();
        build.join().unwrap()
    });
    let report = report.unwrap_or_else(|e| panic!("the build failed: {e}"));
    assert_eq!(report.compiled, 4, "{report}");
    let remote = report.remote.as_ref().unwrap();
    assert!(remote.unavailable, "{report}");
    assert!(remote.written_back < 4, "{report}");
    assert_eq!(
        report.warnings.len(),
        1,
        "one warning: {:?}",
        report.warnings
    );
    assert!(
        report.warnings[0].contains("is unavailable")
            && report.warnings[0].contains("goes on without it"),
        "{}",
        report.warnings[0]
    );
    assert_eq!(digests(&report.bundle), digests(&expected.bundle));
}

#[test]
fn a_refusing_or_silent_remote_costs_one_warning_and_a_bounded_wait() {
    let package = package();
    // Nothing listens on this port: refused at once.
    let refused = build_in(
        &package,
        "refused",
        &remote(&format!("redis://127.0.0.1:{}/0", servers::free_port())),
    );
    assert_eq!(refused.compiled, 4, "{refused}");
    assert_eq!(refused.warnings.len(), 1, "{:?}", refused.warnings);
    assert!(refused.remote.as_ref().unwrap().unavailable);

    // A server that accepts connections and never answers: the timeout bounds the wait.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let mut remote = remote(&format!("webdav+http://127.0.0.1:{port}/cache"));
    remote.timeout = Duration::from_secs(1);
    let started = Instant::now();
    let stalled = build_in(&package, "silent", &remote);
    assert_eq!(stalled.compiled, 4, "{stalled}");
    assert_eq!(stalled.warnings.len(), 1, "{:?}", stalled.warnings);
    assert!(
        stalled.warnings[0].contains("no answer within 1 s"),
        "{}",
        stalled.warnings[0]
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(digests(&stalled.bundle), digests(&refused.bundle));
}

#[test]
fn read_only_reads_but_never_writes() {
    let server = servers::redis();
    let url = format!("redis://127.0.0.1:{}/0", server.port);
    let package = package();
    let read_only = RemoteOptions {
        read_only: true,
        ..remote(&url)
    };
    let untrusted = build_in(&package, "untrusted", &read_only);
    assert_eq!(untrusted.compiled, 4, "{untrusted}");
    let report = untrusted.remote.as_ref().unwrap();
    assert_eq!((report.written_back, report.bytes_written), (0, 0));
    assert!(report.read_only && untrusted.to_string().contains("(read-only)"));

    // Nothing reached the store: a writing build compiles everything too, and then a
    // read-only one reads it all.
    let trusted = build_in(&package, "trusted", &remote(&url));
    assert_eq!((trusted.compiled, trusted.remote_hits), (4, 0), "{trusted}");
    let reader = build_in(&package, "reader", &read_only);
    assert_eq!((reader.compiled, reader.remote_hits), (0, 4), "{reader}");
    assert_eq!(digests(&reader.bundle), digests(&trusted.bundle));
}

/// The key that signs the store's entries in the signing tests, and another.
fn key() -> SecretKey {
    SecretKey::from_seed([0x5e; 32])
}

fn other_key() -> SecretKey {
    SecretKey::from_seed([0x0f; 32])
}

/// `remote` for a build that signs what it writes with `signer` and uses only entries that
/// `trusted` signed.
fn signing(
    remote: &RemoteOptions,
    signer: Option<SecretKey>,
    trusted: &[PublicKey],
) -> RemoteOptions {
    RemoteOptions {
        signer: signer.map(Signer::new),
        trusted_keys: trusted.to_vec(),
        ..remote.clone()
    }
}

/// The entry `path` (a file of the store's folder) read and written back through the
/// store's own API by a writer holding `key`, or no key: its seal is valid either way.
fn reseal(remote: &RemoteOptions, shared: &Path, path: &Path, key: Option<SecretKey>) {
    let name = path.strip_prefix(shared).unwrap().to_str().unwrap();
    let writer = Remote::open(&signing(remote, key, &[])).unwrap();
    let Fetched::Payload(payload) = writer.get(name) else {
        panic!("{name} cannot be read back: {:?}", writer.warnings());
    };
    assert!(writer.put(name, &payload), "{:?}", writer.warnings());
}

/// A writer without the trusted key reseals one entry (unsigned) and signs another with its
/// own key: both seals hold, so a build without trusted keys uses them as before, but a build
/// that trusts the key refuses both, in one warning, compiles the two jobs (and succeeds), and
/// writes them back signed, so the next trusting build reads all four.
#[test]
fn entries_resealed_without_the_trusted_key_are_refused_in_one_warning_and_compiled() {
    let shared = tempfile::tempdir().unwrap();
    let remote = remote(&format!("file://{}", shared.path().display()));
    let trusted = [key().public_key()];
    let package = package();
    let cold = build_in(&package, "cold", &signing(&remote, Some(key()), &[]));
    assert_eq!(cold.compiled, 4, "{cold}");

    let objects = files_in(&shared.path().join(LAYOUT).join("objects"));
    assert_eq!(objects.len(), 4);
    reseal(&remote, shared.path(), &objects[0], None);
    reseal(&remote, shared.path(), &objects[1], Some(other_key()));

    // Without trusted keys, nothing changes: the seals hold, every job is read.
    let open = build_in(&package, "open", &remote);
    assert_eq!((open.compiled, open.remote_hits), (0, 4), "{open}");
    assert!(open.warnings.is_empty(), "{:?}", open.warnings);

    let trusting = signing(&remote, Some(key()), &trusted);
    let checked = build_in(&package, "checked", &trusting);
    assert_eq!((checked.compiled, checked.remote_hits), (2, 2), "{checked}");
    assert_eq!(checked.warnings.len(), 1, "{:?}", checked.warnings);
    let said = &checked.warnings[0];
    assert!(
        said.contains("refused 2 entries that no trusted key signed")
            && said.contains("1 unsigned")
            && said.contains(&format!(
                "1 signed by {}, which is not a trusted key",
                other_key().public_key()
            ))
            && said.contains(&format!("written back signed by {}", key().public_key())),
        "{said}"
    );
    let report = checked.remote.as_ref().unwrap();
    assert_eq!((report.untrusted, report.written_back), (2, 2), "{checked}");
    assert_eq!(digests(&checked.bundle), digests(&cold.bundle));

    let third = build_in(&package, "third", &trusting);
    assert_eq!((third.compiled, third.remote_hits), (0, 4), "{third}");
    assert!(third.warnings.is_empty(), "{:?}", third.warnings);
}

/// Entries signed by a trusted key, through a real server, are read by a build that trusts
/// it (any of its trusted keys will do) without compiling, and give the same bundle.
#[test]
fn entries_signed_by_a_trusted_key_are_used() {
    let server = servers::redis();
    let remote = remote(&format!("redis://127.0.0.1:{}/4", server.port));
    let package = package();
    let cold = build_in(&package, "cold", &signing(&remote, Some(key()), &[]));
    assert_eq!(
        (cold.compiled, cold.remote.as_ref().unwrap().written_back),
        (4, 4),
        "{cold}"
    );

    // A pull request's build: it trusts the key and holds none, and writes nothing.
    let reader = RemoteOptions {
        read_only: true,
        ..signing(
            &remote,
            None,
            &[other_key().public_key(), key().public_key()],
        )
    };
    let warm = build_in(&package, "warm", &reader);
    assert_eq!(
        (warm.compiled, warm.local_hits, warm.remote_hits),
        (0, 0, 4),
        "{warm}"
    );
    assert!(warm.warnings.is_empty(), "{:?}", warm.warnings);
    assert_eq!(warm.remote.as_ref().unwrap().untrusted, 0, "{warm}");
    assert!(
        warm.to_string().contains("4 from the remote cache"),
        "{warm}"
    );
    assert_eq!(digests(&warm.bundle), digests(&cold.bundle));
}

/// The signature of one job's entry copied onto another's (whose own signature it replaces):
/// the key is trusted, but the signature signs the other entry's name and digest. A trusting
/// build refuses it and compiles the job; the entry the signature came from is still used.
#[test]
fn a_signature_copied_from_another_entry_is_refused() {
    let shared = tempfile::tempdir().unwrap();
    let remote = remote(&format!("file://{}", shared.path().display()));
    let package = package();
    let cold = build_in(&package, "cold", &signing(&remote, Some(key()), &[]));
    assert_eq!(cold.compiled, 4, "{cold}");

    // An entry ends with its signature: 128 hex digits, after the MessagePack of the field
    // name and a string of that length.
    let objects = files_in(&shared.path().join(LAYOUT).join("objects"));
    let [mut target, source] = [&objects[0], &objects[1]].map(|p| std::fs::read(p).unwrap());
    let signature_at = |bytes: &[u8]| {
        let at = bytes.len() - 128;
        assert!(
            bytes[..at].ends_with(b"signature\xd9\x80"),
            "not a signed entry"
        );
        at
    };
    let at = signature_at(&target);
    target.truncate(at);
    target.extend_from_slice(&source[signature_at(&source)..]);
    std::fs::write(&objects[0], &target).unwrap();

    let trusting = signing(&remote, None, &[key().public_key()]);
    let checked = build_in(
        &package,
        "checked",
        &RemoteOptions {
            read_only: true,
            ..trusting
        },
    );
    assert_eq!((checked.compiled, checked.remote_hits), (1, 3), "{checked}");
    assert_eq!(checked.warnings.len(), 1, "{:?}", checked.warnings);
    let said = &checked.warnings[0];
    assert!(
        said.contains("refused 1 entry that no trusted key signed")
            && said.contains(&format!(
                "1 with a signature by {} that does not match the entry",
                key().public_key()
            ))
            && said.contains("the store is left as it is"),
        "{said}"
    );
    assert_eq!(digests(&checked.bundle), digests(&cold.bundle));
}

#[test]
fn sccache_as_the_launcher_caches_every_compile() {
    let sccache = Sccache::start();
    let package = package();
    let mut options = package.options();
    options.tools.launcher = sccache.launcher();
    let first = build_ok(&options);
    assert_eq!(first.compiled, 4, "{first}");

    // A second machine: an empty hkpack cache, the same sccache.
    options.cache_dir = package.path("second/cache");
    options.out_dir = package.path("second/dist");
    let second = build_ok(&options);
    assert_eq!(second.compiled, 4, "{second}");
    assert_eq!(digests(&second.bundle), digests(&first.bundle));

    let stats = &sccache.stats()["stats"];
    let counts = |name: &str| stats[name]["counts"].clone();
    // Per job: clang (HIP or CUDA) and, for NVIDIA, ptxas: 2 + 2 + 2 compiles a build, each
    // missed once and hit once. The signature probes (-fsyntax-only) are not compiles.
    assert_eq!(
        counts("cache_misses"),
        serde_json::json!({"HIP": 2, "CUDA": 2, "CUBIN": 2}),
        "{stats:#}"
    );
    assert_eq!(
        counts("cache_hits"),
        serde_json::json!({"HIP": 2, "CUDA": 2, "CUBIN": 2}),
        "{stats:#}"
    );
    assert_eq!(stats["compile_fails"], 0, "{stats:#}");
}
