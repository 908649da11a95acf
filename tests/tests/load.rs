//! hkload end to end against real bundles built by hkpack: code-object selection for simulated
//! devices, damaged bundles, checked and packed launches for every kernel, lazy loading.

mod common;

use std::sync::Arc;

use sha2::Digest;

use common::*;
use hk_format::abi::{ParamType, ScalarType, ScalarValue};
use hk_format::index::Index;
use hk_format::manifest::{BundleManifest, FORMAT_VERSION, ModuleAbi};
use hk_format::target::TargetId;
use hk_tests::device_case::CaseBuffers;
use hk_tests::kernels::all_planned;
use hkload::driver::{ImageKind, LaunchDims, Recorded, RecordingDriver, StreamHandle};
use hkload::{Arg, Bundle, Device, Error, LaunchError, OpenOptions};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn target(id: &str) -> TargetId {
    id.parse().unwrap()
}

/// A simulated device of `target` and the driver recording what happens to it.
fn simulated(id: &str) -> (Arc<RecordingDriver>, Device) {
    let driver = Arc::new(RecordingDriver::new([target(id)]));
    let device = Device::new(driver.clone(), 0).unwrap();
    (driver, device)
}

#[test]
fn each_device_gets_the_entry_the_rocm_and_cuda_rules_pick() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let cases = [
        (
            "gfx90a:sramecc+:xnack-",
            "hipv4-amdgcn-amd-amdhsa--gfx90a",
            ImageKind::AmdCodeObject,
        ),
        (
            "gfx90a:sramecc+:xnack+",
            "hipv4-amdgcn-amd-amdhsa--gfx90a",
            ImageKind::AmdCodeObject,
        ),
        (
            "gfx942:sramecc+:xnack-",
            "hipv4-amdgcn-amd-amdhsa--gfx942",
            ImageKind::AmdCodeObject,
        ),
        (
            "gfx950:sramecc+:xnack-",
            "hipv4-amdgcn-amd-amdhsa--gfx950",
            ImageKind::AmdCodeObject,
        ),
        ("sm_90", "cuda-nvptx64-nvidia-cuda-sm_90", ImageKind::Cubin),
        ("sm_89", "cuda-nvptx64-nvidia-cuda-sm_80", ImageKind::Cubin),
        (
            "sm_100",
            "cuda-nvptx64-nvidia-cuda-compute_90",
            ImageKind::Ptx,
        ),
    ];
    for (device_id, expected, kind) in cases {
        let (driver, device) = simulated(device_id);
        let loaded = bundle.load(&device).unwrap();
        let explanation = bundle.explain(&target(device_id));
        let (mut built, mut absent) = (0, 0);
        for choice in &explanation.modules {
            let Some((entry, _)) = choice.selection.chosen() else {
                // A module built on purpose for other targets only (one FP8 format per
                // target, int8 not on sm_80): explain says why, and nothing of it loads.
                assert!(
                    choice.not_built.is_some(),
                    "{device_id}, module {}",
                    choice.module
                );
                assert_eq!(loaded.chosen_entry(&choice.module), None);
                absent += 1;
                continue;
            };
            built += 1;
            // On sm_90 the modules built for sm_90a too (the BF16 and int8 GEMMs, attention)
            // run that code first.
            let expected =
                if device_id == "sm_90" && SM_90A_MODULES.contains(&choice.module.as_str()) {
                    "cuda-nvptx64-nvidia-cuda-sm_90a"
                } else {
                    expected
                };
            assert_eq!(
                entry.to_string(),
                expected,
                "{device_id}, module {}",
                choice.module
            );
            assert_eq!(loaded.chosen_entry(&choice.module), Some(entry));
            assert_eq!(choice.selection.needs_jit(), kind == ImageKind::Ptx);
        }
        loaded.preload().unwrap();
        let loads: Vec<_> = driver
            .log()
            .into_iter()
            .filter_map(|r| match r {
                Recorded::Load { kind, image, .. } => Some((kind, image)),
                _ => None,
            })
            .collect();
        assert_eq!(loads.len(), built);
        assert_eq!(built + absent, bundle.manifest().unwrap().modules.len());
        for (loaded_kind, image) in loads {
            assert_eq!(loaded_kind, kind);
            match kind {
                ImageKind::AmdCodeObject => assert_eq!(&image[..4], b"\x7fELF"),
                ImageKind::Cubin => assert_eq!(&image[..4], b"\x7fELF"),
                ImageKind::Ptx => assert!(String::from_utf8_lossy(&image).contains(".version")),
            }
        }
    }
}

#[test]
fn devices_nothing_runs_on_are_refused_with_the_explanation() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    for device_id in ["gfx1100", "sm_75"] {
        let (driver, device) = simulated(device_id);
        let Err(error) = bundle.load(&device) else {
            panic!("{device_id} must be refused");
        };
        let message = error.to_string();
        assert!(matches!(error, Error::NoCodeObject { .. }), "{message}");
        for part in [
            "can run on",
            "hipv4-amdgcn-amd-amdhsa--gfx942",
            "cuda-nvptx64-nvidia-cuda-sm_90",
            "rejected",
        ] {
            assert!(message.contains(part), "`{part}` missing from:\n{message}");
        }
        assert!(!bundle.explain(&target(device_id)).is_servable());
        assert!(
            driver.log().is_empty(),
            "selection happens before any driver call"
        );
    }
}

/// The first test case of every kernel of the bundle: valid arguments for each, which its
/// contract accepts.
fn case_per_kernel(bundle: &Bundle) -> Vec<hk_tests::case::Case> {
    // Only the first plan of each kernel is made: the references of the rest would cost minutes.
    let mut cases = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    for plan in all_planned(&mut StdRng::seed_from_u64(0xca11)) {
        if plan.kernels().iter().all(|k| covered.contains(k)) {
            continue;
        }
        for case in plan.make() {
            if covered.insert(case.kernel.clone()) {
                cases.push(case);
            }
        }
    }
    let symbols: Vec<&str> = bundle.table().kernel_symbols().collect();
    for symbol in &symbols {
        assert!(
            cases.iter().any(|c| c.kernel == *symbol),
            "kernel `{symbol}` has no test case"
        );
    }
    cases
}

#[test]
fn every_kernel_calls_with_its_contract_and_packs_at_metadata_offsets() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let cases = case_per_kernel(&bundle);
    let mut called = std::collections::BTreeSet::new();
    for device_id in [
        "gfx90a:sramecc+:xnack-",
        "gfx942:sramecc+:xnack-",
        "gfx950:sramecc+:xnack-",
        "sm_90",
    ] {
        let (driver, device) = simulated(device_id);
        let loaded = bundle.load(&device).unwrap();
        for case in &cases {
            let record = bundle.kernel_record(&case.kernel).unwrap();
            let kernel = match loaded.kernel(&case.kernel) {
                // Built on purpose for other targets only; called on those.
                Err(Error::NotBuilt { .. }) => continue,
                found => found.unwrap(),
            };
            called.insert(case.kernel.clone());
            assert!(
                kernel.contract().is_some(),
                "{} has no contract",
                case.kernel
            );
            let buffers = CaseBuffers::upload(&device, case).unwrap();
            let args = buffers.args();
            let shape = kernel.launch_shape(&args).unwrap();
            kernel.call(StreamHandle::DEFAULT, &args).unwrap();
            let Some(Recorded::Launch {
                kernel: name,
                args: packed,
                dims,
                ..
            }) = driver.log().pop()
            else {
                panic!("no launch recorded for {}", case.kernel);
            };
            assert_eq!((name.as_str(), dims), (case.kernel.as_str(), shape));
            let mut end = 0;
            for ((param, &offset), arg) in
                record.args.iter().zip(&kernel.abi().arg_offsets).zip(&args)
            {
                let at = offset as usize;
                let want: Vec<u8> = match arg {
                    Arg::Buffer(b) | Arg::BufferMut(b) => b.ptr().0.to_le_bytes().to_vec(),
                    Arg::Scalar(value) => value.to_le_bytes()[..param.ty.size() as usize].to_vec(),
                    Arg::Raw(_) => unreachable!("cases pass device buffers"),
                };
                assert_eq!(
                    &packed[at..at + want.len()],
                    &want[..],
                    "{} `{param}` on {device_id}",
                    case.kernel
                );
                end = end.max(at + want.len());
            }
            assert_eq!(packed.len(), end, "{} on {device_id}", case.kernel);

            assert_refused(&kernel, &record.args, &args, &device, &driver);
            assert_extents_enforced(&kernel, &record.args, &args, &device, &driver);
        }
    }
    // Every kernel ran on at least one of the devices (the FNUZ FP8 kernels on gfx942 only).
    let all: std::collections::BTreeSet<String> = cases.iter().map(|c| c.kernel.clone()).collect();
    assert_eq!(called, all);
}

/// `args` with argument `i` replaced by `arg`.
fn replaced<'a>(args: &[Arg<'a>], i: usize, arg: Arg<'a>) -> Vec<Arg<'a>> {
    let mut args = args.to_vec();
    args[i] = arg;
    args
}

/// Wrong count, kind, size, element type, writability, device and driver instance are all
/// refused before the driver, as are shapes past the kernel's limits.
fn assert_refused(
    kernel: &hkload::Kernel,
    signature: &[hk_format::abi::Param],
    good: &[Arg<'_>],
    device: &Device,
    driver: &RecordingDriver,
) {
    let launches_before = driver.log().len();
    // For every pointer parameter: a buffer of another element type, one of the right type on
    // another device, and one of another driver instance with the same device ordinal.
    let other_driver = Arc::new(RecordingDriver::new([*device.target(), *device.target()]));
    let other_device = Device::new(other_driver.clone(), 1).unwrap();
    let twin_device = Device::new(other_driver, device.ordinal()).unwrap();
    let misfits: Vec<Option<[hkload::DeviceBuffer; 3]>> = signature
        .iter()
        .map(|param| match param.ty {
            ParamType::Pointer { pointee, .. } => {
                let other = if pointee == ScalarType::I8 {
                    ScalarType::U8
                } else {
                    ScalarType::I8
                };
                Some([
                    device.alloc(other, 16).unwrap(),
                    other_device.alloc(pointee, 16).unwrap(),
                    twin_device.alloc(pointee, 1 << 16).unwrap(),
                ])
            }
            ParamType::Scalar(_) => None,
        })
        .collect();
    let mut attempts: Vec<(Vec<Arg<'_>>, &str)> = vec![
        (good[..good.len() - 1].to_vec(), "ArgCount"),
        (
            [good.to_vec(), vec![Arg::Scalar(ScalarValue::U32(1))]].concat(),
            "ArgCount",
        ),
    ];
    for (i, param) in signature.iter().enumerate() {
        let with = |arg| replaced(good, i, arg);
        match (param.ty, good[i], &misfits[i]) {
            (ParamType::Pointer { .. }, given, Some([wrong_elem, wrong_device, twin])) => {
                attempts.push((with(Arg::Scalar(ScalarValue::U64(0x1000))), "ArgType"));
                if let Arg::BufferMut(buffer) = given {
                    attempts.push((with(Arg::Buffer(buffer)), "ArgType"));
                }
                attempts.push((with(Arg::BufferMut(wrong_elem)), "ArgType"));
                attempts.push((with(Arg::BufferMut(wrong_device)), "ArgDevice"));
                attempts.push((with(Arg::BufferMut(twin)), "ArgDriver"));
            }
            (ParamType::Scalar(t), _, _) => {
                let other = if t == ScalarType::U64 {
                    ScalarValue::U32(1)
                } else {
                    ScalarValue::U64(1)
                };
                attempts.push((with(Arg::Scalar(other)), "ArgType"));
                if let Some(Some([buffer, ..])) = misfits.iter().find(|m| m.is_some()) {
                    attempts.push((with(Arg::Buffer(buffer)), "ArgType"));
                }
            }
            (ParamType::Pointer { .. }, _, None) => unreachable!("every pointer has misfits"),
        }
    }
    // An FP8 buffer of the other family (OCP for FNUZ, FNUZ for OCP) is refused with both
    // formats named, torch's names too: the mix-up that would compute plausible garbage.
    for (i, param) in signature.iter().enumerate() {
        let ParamType::Pointer { pointee, mutable } = param.ty else {
            continue;
        };
        let Some(other) = ScalarType::ALL
            .into_iter()
            .find(|&other| pointee.fp8_mixup(other).is_some())
        else {
            continue;
        };
        let buffer = device.alloc(other, 1 << 16).unwrap();
        let error = kernel
            .call(
                StreamHandle::DEFAULT,
                &replaced(good, i, Arg::BufferMut(&buffer)),
            )
            .unwrap_err()
            .to_string();
        let (want, got) = (pointee.fp8().unwrap(), other.fp8().unwrap());
        let writable = if mutable { "writable " } else { "" };
        for part in [
            format!("expects a {writable}buffer of {want}"),
            format!(
                "{got} ({}, the {} encoding)",
                got.torch_dtype(),
                got.family()
            ),
            format!(
                "{want} ({}, the {} encoding)",
                want.torch_dtype(),
                want.family()
            ),
        ] {
            assert!(error.contains(&part), "`{part}` not in: {error}");
        }
    }
    for (args, expected) in attempts {
        let error = kernel.call(StreamHandle::DEFAULT, &args).unwrap_err();
        let name = match error {
            Error::Launch(LaunchError::ArgCount { .. }) => "ArgCount",
            Error::Launch(LaunchError::ArgType { .. }) => "ArgType",
            Error::Launch(LaunchError::ArgDevice { .. }) => "ArgDevice",
            Error::Launch(LaunchError::ArgDriver { .. }) => "ArgDriver",
            ref other => panic!("unexpected error {other}"),
        };
        assert_eq!(name, expected, "{}: {error}", kernel.name());
        assert!(error.to_string().contains(kernel.name()));
    }
    let shape = kernel.launch_shape(good).unwrap();
    let too_big = LaunchDims {
        block: [kernel.abi().max_flat_workgroup_size + 1, 1, 1],
        ..shape
    };
    let error = unsafe { kernel.launch(&too_big, StreamHandle::DEFAULT, good) }.unwrap_err();
    assert!(
        matches!(error, Error::Launch(LaunchError::Dims { .. })),
        "{error}"
    );
    let mut huge_shared = shape;
    huge_shared.shared_bytes = 1 << 20;
    let error = unsafe { kernel.launch(&huge_shared, StreamHandle::DEFAULT, good) }.unwrap_err();
    assert!(
        matches!(error, Error::Launch(LaunchError::Dims { .. })),
        "{error}"
    );
    // Per-dimension limits: CUDA's block z of 64 and grid y of 65535; HSA's 2^32 - 1
    // work-items a dimension.
    let past_limits = match device.target() {
        TargetId::Nvidia(_) => LaunchDims {
            grid: [1, 65536, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
        },
        TargetId::Amd(_) => LaunchDims {
            grid: [1 << 24, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
        },
    };
    let error = unsafe { kernel.launch(&past_limits, StreamHandle::DEFAULT, good) }.unwrap_err();
    assert!(
        matches!(error, Error::Launch(LaunchError::Dims { .. })),
        "{}: {error}",
        kernel.name()
    );
    assert_eq!(
        driver.log().len(),
        launches_before,
        "refused launches reach no driver"
    );
}

/// Every pointer argument one element shorter than its extent is refused, naming the kernel,
/// the argument and both lengths, before the driver is called; exactly its extent is enough.
fn assert_extents_enforced(
    kernel: &hkload::Kernel,
    signature: &[hk_format::abi::Param],
    good: &[Arg<'_>],
    device: &Device,
    driver: &RecordingDriver,
) {
    for (i, param) in signature.iter().enumerate() {
        let ParamType::Pointer { pointee, mutable } = param.ty else {
            continue;
        };
        let with = |buffer| {
            replaced(
                good,
                i,
                if mutable {
                    Arg::BufferMut(buffer)
                } else {
                    Arg::Buffer(buffer)
                },
            )
        };
        // An empty buffer is too short for any extent but 0, and the error says how long a
        // buffer must be.
        let empty = device.alloc(pointee, 0).unwrap();
        let needed = match kernel.call(StreamHandle::DEFAULT, &with(&empty)) {
            Err(Error::Launch(LaunchError::Extent { needed, .. })) => needed as usize,
            Ok(()) => continue,
            Err(other) => panic!("{}: {other}", kernel.name()),
        };
        let launches_before = driver.log().len();
        let short = device.alloc(pointee, needed - 1).unwrap();
        let error = kernel
            .call(StreamHandle::DEFAULT, &with(&short))
            .unwrap_err();
        let Error::Launch(LaunchError::Extent {
            kernel: ref name,
            index,
            needed: n,
            given,
            ..
        }) = error
        else {
            panic!("{}: `{param}` one short gave {error}", kernel.name());
        };
        assert_eq!(
            (name.as_str(), index, n as usize, given),
            (kernel.name(), i, needed, needed - 1)
        );
        let message = error.to_string();
        for part in [
            kernel.name(),
            param.name.as_str(),
            &needed.to_string(),
            &(needed - 1).to_string(),
        ] {
            assert!(message.contains(part), "`{message}` does not name {part}");
        }
        assert_eq!(
            driver.log().len(),
            launches_before,
            "refused before the driver"
        );
        let exact = device.alloc(pointee, needed).unwrap();
        kernel.call(StreamHandle::DEFAULT, &with(&exact)).unwrap();
    }
}

#[test]
fn modules_load_once_under_concurrent_first_use() {
    let (bundle_dir, _) = repo_bundles();
    let bundle = Bundle::open(bundle_dir).unwrap();
    let (driver, device) = simulated("gfx942:sramecc+:xnack-");
    let loaded = bundle.load(&device).unwrap();
    // The kernels of the modules built for gfx942: not the OCP FP8 module's.
    let symbols: Vec<&str> = bundle
        .table()
        .kernel_symbols()
        .filter(|symbol| !matches!(loaded.kernel(symbol), Err(Error::NotBuilt { .. })))
        .collect();
    let absent = bundle.table().kernel_symbols().len() - symbols.len();
    assert!(
        absent > 0 && absent < symbols.len(),
        "{absent} kernels not built for gfx942"
    );
    let built = bundle
        .explain(device.target())
        .modules
        .iter()
        .filter(|choice| choice.selection.chosen().is_some())
        .count();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for symbol in &symbols {
                    loaded.kernel(symbol).unwrap();
                }
            });
        }
    });
    let loads = driver
        .log()
        .iter()
        .filter(|r| matches!(r, Recorded::Load { .. }))
        .count();
    assert_eq!(loads, built);
    fn send_sync<T: Send + Sync>() {}
    send_sync::<hkload::Kernel>();
    send_sync::<hkload::LoadedBundle>();
    let error = loaded.kernel("no_such_kernel").unwrap_err().to_string();
    assert!(error.contains("no kernel `no_such_kernel`"), "{error}");
}

/// A small real bundle (one module, one AMD and one NVIDIA target), compressed or plain.
fn small_bundle(compress: bool) -> (TempPackage, std::path::PathBuf) {
    let package = TempPackage::new(
        &["gfx942", "sm_90"],
        &[("scale", SCALE_SOURCE, SCALE_MANIFEST)],
    );
    let mut options = package.options();
    options.compress = compress;
    let report = build_ok(&options);
    (package, report.bundle)
}

/// Leaks `bytes` for `Bundle::from_bytes`, which takes `'static` files (tests only).
fn leak(bytes: Vec<u8>) -> &'static [u8] {
    Box::leak(bytes.into_boxed_slice())
}

const UNVERIFIED: OpenOptions = OpenOptions {
    verify_hashes: false,
    trusted_keys: Vec::new(),
    expect_digest: None,
};

/// Opens the embedded bundle made of `files` and loads every kernel on a device of each kind
/// whose entry the small bundle has (gfx942, the sm_90 cubin, and through sm_100 its PTX), so
/// that every code image is extracted, checked and loaded. Returns the images the driver got.
fn load_everywhere(
    files: &[(&'static str, &'static [u8])],
    options: OpenOptions,
) -> Result<Vec<Vec<u8>>, Error> {
    images_everywhere(&Bundle::from_bytes(files, options)?)
}

/// What [`load_everywhere`] does, for an opened bundle.
fn images_everywhere(bundle: &Bundle) -> Result<Vec<Vec<u8>>, Error> {
    let mut images = Vec::new();
    for device in ["gfx942:sramecc+:xnack-", "sm_90", "sm_100"] {
        let (driver, device) = simulated(device);
        let loaded = bundle.load(&device)?;
        loaded.preload()?;
        loaded.kernel("scale")?;
        images.extend(driver.log().into_iter().filter_map(|event| match event {
            Recorded::Load { image, .. } => Some(image),
            _ => None,
        }));
    }
    Ok(images)
}

#[test]
fn a_bundle_folder_gives_the_driver_what_the_embedded_files_give() {
    for compress in [true, false] {
        let (_package, dir) = small_bundle(compress);
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        let files = [
            ("bundle.msgpack", leak(read("bundle.msgpack"))),
            ("scale.hipfb", leak(read("scale.hipfb"))),
        ];
        let embedded = load_everywhere(&files, OpenOptions::default()).unwrap();
        assert_eq!(embedded.len(), 3);
        let from_folder = images_everywhere(&Bundle::open(&dir).unwrap()).unwrap();
        assert_eq!(from_folder, embedded, "compressed: {compress}");
    }

    // The module file's own errors, as a folder reports them: its size and form against the
    // manifest, then, in a plain bundle, its header and the chosen image's hash.
    let (_package, dir) = small_bundle(false);
    let module_path = dir.join("scale.hipfb");
    let module = std::fs::read(&module_path).unwrap();
    let load_error = || {
        images_everywhere(&Bundle::open(&dir).unwrap())
            .unwrap_err()
            .to_string()
    };
    let error_with = |bytes: &[u8]| {
        std::fs::write(&module_path, bytes).unwrap();
        load_error()
    };
    let len = module.len();
    let error = error_with(&module[..len - 1]);
    assert!(
        error.contains(&format!("it is {} bytes, the manifest says {len}", len - 1)),
        "{error}"
    );
    let mut damaged = module.clone();
    damaged[0] ^= 0x5a;
    let error = error_with(&damaged);
    assert!(error.contains("not an offload bundle"), "{error}");
    let mut damaged = module.clone();
    damaged[len - 1] ^= 0x5a;
    let error = error_with(&damaged);
    assert!(error.contains("its BLAKE3 is"), "{error}");
    let (_compressed_package, compressed_dir) = small_bundle(true);
    let mut compressed = std::fs::read(compressed_dir.join("scale.hipfb")).unwrap();
    compressed.resize(len, 0);
    let error = error_with(&compressed);
    assert!(
        error.contains("the manifest says it is not compressed, the file says otherwise"),
        "{error}"
    );
    std::fs::remove_file(&module_path).unwrap();
    std::fs::create_dir(&module_path).unwrap();
    let error = load_error();
    assert!(error.contains("it is not a regular file"), "{error}");
}

#[test]
fn every_damaged_byte_and_every_truncation_is_an_error() {
    for compress in [true, false] {
        let (_package, dir) = small_bundle(compress);
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        let (index, module) = (read("bundle.msgpack"), read("scale.hipfb"));
        let (index_ok, module_ok) = (leak(index.clone()), leak(module.clone()));
        let try_load = |index, module, options| {
            load_everywhere(
                &[("bundle.msgpack", index), ("scale.hipfb", module)],
                options,
            )
        };
        let images = try_load(index_ok, module_ok, OpenOptions::default()).unwrap();
        assert_eq!(images.len(), 3);

        // The index: any change is caught by its own hash, and never panics without it.
        for at in 0..index.len() {
            let mut damaged = index.clone();
            damaged[at] ^= 0x5a;
            let damaged = leak(damaged);
            assert!(
                try_load(damaged, module_ok, OpenOptions::default()).is_err(),
                "a change at byte {at} of the index went unnoticed"
            );
            let _ = try_load(damaged, module_ok, UNVERIFIED);
        }
        for len in 0..index.len() {
            let truncated = leak(index[..len].to_vec());
            assert!(try_load(truncated, module_ok, UNVERIFIED).is_err());
        }

        // The module file. Compressed, every byte is part of a stream whose whole is checked
        // (against its MD5) when the last image is read: any change is an error. Plain, a
        // change in the header or in a code image (hashed) is an error; the zero padding
        // between images is not read at all, and a change there leaves every image the driver
        // gets intact.
        let step = if compress { 1 } else { 7 };
        let mut padding = 0;
        for at in (0..module.len()).step_by(step) {
            let mut damaged = module.clone();
            damaged[at] ^= 0x5a;
            let damaged = leak(damaged);
            match try_load(index_ok, damaged, OpenOptions::default()) {
                Err(_) => {}
                Ok(loaded) => {
                    assert!(
                        !compress && module[at] == 0,
                        "a change at byte {at} went unnoticed (compressed: {compress})"
                    );
                    assert_eq!(loaded, images, "a change at byte {at} reached the driver");
                    padding += 1;
                }
            }
            // Without hash checks a change may go unnoticed, but must never panic.
            let _ = try_load(index_ok, damaged, UNVERIFIED);
        }
        // The plain file is mostly padding (code images start on 4096-byte boundaries).
        assert_eq!(padding > 0, !compress);
        for len in 0..module.len() {
            let truncated = leak(module[..len].to_vec());
            assert!(
                try_load(index_ok, truncated, OpenOptions::default()).is_err(),
                "truncated to {len}"
            );
            assert!(
                try_load(index_ok, truncated, UNVERIFIED).is_err(),
                "truncated to {len}, unverified"
            );
        }
    }
}

#[test]
fn a_bundle_without_its_index_is_refused() {
    // Nothing vouches for bundle.toml: with the index gone and a cubin's target renamed in
    // it, the bundle once opened and `inspect` printed the altered facts.
    let (_package, dir) = small_bundle(false);
    std::fs::remove_file(dir.join("bundle.msgpack")).unwrap();
    let manifest = std::fs::read_to_string(dir.join("bundle.toml")).unwrap();
    let renamed = manifest.replace(
        "cuda-nvptx64-nvidia-cuda-sm_90",
        "cuda-nvptx64-nvidia-cuda-sm_80",
    );
    assert_ne!(renamed, manifest);
    std::fs::write(dir.join("bundle.toml"), &renamed).unwrap();
    let missing = "the bundle's index is missing";
    for options in [OpenOptions::default(), UNVERIFIED] {
        let error = Bundle::open_with(&dir, options).unwrap_err().to_string();
        assert!(
            error.contains(missing) && error.contains("hkpack build"),
            "{error}"
        );
    }
    let files = [
        ("bundle.toml", leak(renamed.into_bytes())),
        (
            "scale.hipfb",
            leak(std::fs::read(dir.join("scale.hipfb")).unwrap()),
        ),
    ];
    let error = Bundle::from_bytes(&files, OpenOptions::default()).unwrap_err();
    assert!(error.to_string().contains(missing), "{error}");
}

#[test]
fn an_empty_kernel_record_far_outside_the_index_is_refused_even_with_its_digest_redone() {
    // The index's digest is unkeyed: anyone can redo it. A kernel record of no bytes at a huge
    // offset passed the lookup table's check and then panicked when the kernel was used.
    let (_package, dir) = small_bundle(false);
    let mut index = std::fs::read(dir.join("bundle.msgpack")).unwrap();
    let len = index.len();
    // The table's layout (index/lookup.rs): a 40-byte header whose last five numbers count
    // ID rows (8 bytes each), module rows (41), entry rows (44; as many BLAKE3 rows of 32
    // follow them), kernel rows (16) and text, then a 4-byte extension; the footer's first four
    // bytes give the table's size.
    let table = len - u32::from_le_bytes(index[len - 8..len - 4].try_into().unwrap()) as usize;
    let count =
        |at: usize| u32::from_le_bytes(index[table + at..table + at + 4].try_into().unwrap());
    let (ids, modules, entries) = (count(20), count(24), count(28));
    let first_kernel =
        table + 44 + 8 * ids as usize + 41 * modules as usize + (44 + 32) * entries as usize;
    let record = first_kernel + 8;
    index[record..record + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    index[record + 4..record + 8].copy_from_slice(&0u32.to_le_bytes());
    // The digests redone: the version string (4 bytes), the SHA-256 (a bin8 of 32 bytes at
    // 4..38) over it and all that follows the digests, the BLAKE3 (at 38..72) over every other
    // byte.
    let digest = sha2::Sha256::new()
        .chain_update(&index[..4])
        .chain_update(&index[72..])
        .finalize();
    index[6..38].copy_from_slice(&digest);
    let digest = blake3::Hasher::new()
        .update(&index[..38])
        .update(&index[72..])
        .finalize();
    index[40..72].copy_from_slice(digest.as_bytes());

    let index = leak(index);
    for options in [OpenOptions::default(), UNVERIFIED] {
        let error = Bundle::from_bytes(&[("bundle.msgpack", index)], options).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("a kernel's record lies outside the index's records"),
            "{error}"
        );
    }
}

/// The version string is judged before anything else of the index is read: an older format is
/// refused with the advice to rebuild (before 1.0 there is one reader, of the current format),
/// a newer major with the advice to upgrade, and a later minor, whose layout this reader
/// knows, is read, so that any change to a current index's version is damage its BLAKE3 finds.
#[test]
fn an_index_of_another_format_is_refused_saying_what_to_do() {
    let (_package, dir) = small_bundle(false);
    let index = std::fs::read(dir.join("bundle.msgpack")).unwrap();
    // The version string is a MessagePack fixstr at the file's start: 0xa3, then `1.7`.
    let version = [&[0xa3][..], FORMAT_VERSION.to_string().as_bytes()].concat();
    assert_eq!(index[..4], version);
    let with_version = |text: &[u8; 3]| leak([&[0xa3][..], text, &index[4..]].concat());
    let open = |index, options| {
        Bundle::from_bytes(&[("bundle.msgpack", index)], options)
            .map(drop)
            .unwrap_err()
            .to_string()
    };
    for options in [OpenOptions::default(), UNVERIFIED] {
        // Every format before this one, 1.1 (the first with an index) to 1.6.
        for minor in 1..FORMAT_VERSION.minor {
            let text: [u8; 3] = format!("1.{minor}").into_bytes().try_into().unwrap();
            let error = open(with_version(&text), options.clone());
            assert!(
                error.contains(&format!(
                    "bundle format 1.{minor} is older than this hkload reads (1.7 and later 1.x): \
                     rebuild the bundle with hkpack {} or later",
                    env!("CARGO_PKG_VERSION")
                )),
                "{error}"
            );
        }
        let error = open(with_version(b"0.3"), options.clone());
        assert!(error.contains("bundle format 0.3 is older"), "{error}");
        let error = open(with_version(b"9.3"), options.clone());
        assert!(
            error.contains("bundle format 9.3 is newer than this hkload reads"),
            "{error}"
        );
        let error = open(with_version(b"1,5"), options);
        assert!(error.contains("index: "), "{error}");
    }
    // A later minor is read as this one; verified, the changed version is damage.
    let error = open(with_version(b"1.8"), OpenOptions::default());
    assert!(
        error.contains("index's BLAKE3 does not match its contents"),
        "{error}"
    );
}

#[test]
fn the_lookup_table_is_checked_against_the_records() {
    let (_package, dir) = small_bundle(false);
    let index = std::fs::read(dir.join("bundle.msgpack")).unwrap();
    // The module file's name in the table (the records hold it too, earlier in the file).
    let at = index
        .windows(11)
        .rposition(|w| w == b"scale.hipfb")
        .unwrap();
    let mut damaged = index;
    damaged[at + 10] = b'c';
    let damaged = leak(damaged);

    let error = Bundle::from_bytes(&[("bundle.msgpack", damaged)], OpenOptions::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("BLAKE3 does not match"), "{error}");
    // Unverified, the table is trusted until the manifest is asked for.
    let bundle = Bundle::from_bytes(&[("bundle.msgpack", damaged)], UNVERIFIED).unwrap();
    let error = bundle.manifest().unwrap_err().to_string();
    assert!(
        error.contains("lookup table does not agree with its records"),
        "{error}"
    );
}

#[test]
fn a_newer_format_and_a_missing_file_are_clear_errors() {
    let (_package, dir) = small_bundle(true);
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let newer_major =
        format!("bundle format 2.0 is newer than this hkload reads ({FORMAT_VERSION})");

    let manifest = String::from_utf8(read("bundle.toml")).unwrap();
    let newer = manifest.replace(
        &format!("format_version = \"{FORMAT_VERSION}\""),
        "format_version = \"2.0\"",
    );
    assert_ne!(newer, manifest);
    let error = BundleManifest::from_toml(&newer).unwrap_err();
    assert!(error.to_string().contains(&newer_major), "{error}");

    let index = Index::open(read("bundle.msgpack"), true).unwrap();
    let abis: Vec<ModuleAbi> = (0..index.table().modules().len())
        .map(|i| index.module_abi(i).unwrap())
        .collect();
    let mut manifest = index.manifest().unwrap().clone();
    manifest.format_version = "2.0".parse().unwrap();
    let newer = leak(Index::encode(&manifest, &abis));
    let error =
        Bundle::from_bytes(&[("bundle.msgpack", newer)], OpenOptions::default()).unwrap_err();
    assert!(error.to_string().contains(&newer_major), "{error}");

    let error = Bundle::from_bytes(&[], OpenOptions::default()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("is <embedded> a bundle folder made by `hkpack build`?"),
        "{error}"
    );
    let error = Bundle::open(dir.join("missing")).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("a bundle folder made by `hkpack build`?"),
        "{error}"
    );

    // Module files are opened on first use: a missing one is reported then.
    let bundle = Bundle::from_bytes(
        &[("bundle.msgpack", leak(read("bundle.msgpack")))],
        UNVERIFIED,
    )
    .unwrap();
    let (_driver, device) = simulated("sm_90");
    let error = bundle.load(&device).unwrap().preload().unwrap_err();
    assert!(
        error
            .to_string()
            .contains("`scale.hipfb` was not among the embedded files"),
        "{error}"
    );
}

/// The repository bundle's index with every kernel's record passed through `edit`, encoded
/// again (with a correct digest: the digest is no signature, anyone can recompute it).
fn edited_index(edit: impl Fn(&mut hk_format::manifest::KernelRecord)) -> &'static [u8] {
    let (bundle_dir, _) = repo_bundles();
    let index = Index::open(
        std::fs::read(bundle_dir.join("bundle.msgpack")).unwrap(),
        true,
    )
    .unwrap();
    let mut abis: Vec<ModuleAbi> = (0..index.table().modules().len())
        .map(|i| index.module_abi(i).unwrap())
        .collect();
    abis.iter_mut()
        .flat_map(|abi| &mut abi.kernels)
        .for_each(edit);
    leak(Index::encode(index.manifest().unwrap(), &abis))
}

/// Argument offsets and sizes are checked against the kernarg segment once, when a kernel is
/// looked up, so that no launch packs (or allocates) past the size the code object declares.
#[test]
fn hand_edited_argument_offsets_are_refused_at_lookup() {
    let (bundle_dir, _) = repo_bundles();
    let files = |index| -> Vec<(&'static str, &'static [u8])> {
        let mut files = vec![("bundle.msgpack", index)];
        files.push((
            "topk.hipfb",
            leak(std::fs::read(bundle_dir.join("topk.hipfb")).unwrap()),
        ));
        files
    };
    /// A damage done to each target's ABI of the kernel.
    type Edit = fn(&mut hk_format::manifest::KernelAbi);
    let cases: [(&str, Edit, &str); 4] = [
        (
            "near 2^32",
            |abi| abi.arg_offsets[1] = u32::MAX - 7,
            "ends past the",
        ),
        (
            "overlapping",
            |abi| abi.arg_offsets[4] = abi.arg_offsets[3],
            "overlaps the argument before it",
        ),
        (
            "past the segment",
            |abi| abi.kernarg_size = abi.arg_offsets[5],
            "ends past the",
        ),
        (
            "a huge segment",
            |abi| abi.kernarg_size = 1 << 31,
            "more than the 32768 any target allows",
        ),
    ];
    let (_, device) = simulated("sm_90");
    for (what, edit, expected) in cases {
        let index = edited_index(|record| {
            if record.symbol.starts_with("topk") {
                record.targets.iter_mut().for_each(edit);
            }
        });
        let bundle = Bundle::from_bytes(&files(index), OpenOptions::default()).unwrap();
        let loaded = bundle.load(&device).unwrap();
        let error = loaded.kernel("topk_f32").unwrap_err().to_string();
        assert!(error.contains(expected), "{what}: {error}");
        assert!(error.contains("topk_f32"), "{what}: {error}");
    }
}

/// A kernel whose record has no contract (as in bundles before format 1.3) cannot be called,
/// only launched with explicit dimensions.
#[test]
fn a_kernel_without_a_contract_launches_only_with_explicit_dims() {
    let (bundle_dir, _) = repo_bundles();
    let index = edited_index(|record| record.contract = None);
    let module = leak(std::fs::read(bundle_dir.join("softmax.hipfb")).unwrap());
    let bundle = Bundle::from_bytes(
        &[("bundle.msgpack", index), ("softmax.hipfb", module)],
        OpenOptions::default(),
    )
    .unwrap();
    let (driver, device) = simulated("gfx942:sramecc+:xnack-");
    let loaded = bundle.load(&device).unwrap();
    let kernel = loaded.kernel("softmax_f32").unwrap();
    assert!(kernel.contract().is_none());
    let x = device.alloc(ScalarType::F32, 8).unwrap();
    let mut out = device.alloc(ScalarType::F32, 8).unwrap();
    let args = [
        Arg::from(&mut out),
        Arg::from(&x),
        Arg::from(2u32),
        Arg::from(4u32),
    ];
    let error = kernel
        .call(StreamHandle::DEFAULT, &args)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("has no launch contract") && error.contains("Kernel::launch"),
        "{error}"
    );
    let dims = LaunchDims::linear(1, 64);
    // SAFETY: the recording driver runs nothing.
    unsafe { kernel.launch(&dims, StreamHandle::DEFAULT, &args) }.unwrap();
    assert!(matches!(driver.log().last(), Some(Recorded::Launch { .. })));
}

/// A block is checked against the device's limit on threads a block, as its driver reports it,
/// and not only against the code object's own maximum (1024 here): each refusal names the limit
/// and where it comes from.
#[test]
fn a_block_beyond_the_devices_thread_limit_is_refused_naming_it() {
    let (_package, dir) = small_bundle(false);
    let bundle = Bundle::open(&dir).unwrap();
    for id in ["gfx942:sramecc+:xnack-", "sm_90"] {
        let driver = Arc::new(RecordingDriver::new([target(id)]).with_max_threads_per_block(256));
        let device = Device::new(driver.clone(), 0).unwrap();
        let loaded = bundle.load(&device).unwrap();
        let kernel = loaded.kernel("scale").unwrap();
        let x = device.alloc(ScalarType::F32, 512).unwrap();
        let mut out = device.alloc(ScalarType::F32, 512).unwrap();
        let args = [
            Arg::from(&mut out),
            Arg::from(&x),
            Arg::from(2.0f32),
            Arg::from(512u32),
        ];
        let launch = |threads| {
            // SAFETY: the recording driver runs nothing.
            unsafe {
                kernel.launch(
                    &LaunchDims::linear(1, threads),
                    StreamHandle::DEFAULT,
                    &args,
                )
            }
        };
        launch(256).unwrap();
        let error = launch(512).unwrap_err().to_string();
        for part in [
            "a block of 512 threads",
            "the device's maximum of 256 threads a block",
            "as its driver reports it",
            "recording driver",
        ] {
            assert!(error.contains(part), "{id}: `{part}` not in: {error}");
        }
        let launches = driver
            .log()
            .iter()
            .filter(|r| matches!(r, Recorded::Launch { .. }))
            .count();
        assert_eq!(launches, 1, "{id}: the refused block reached the driver");
        // The code object's own maximum is named as such.
        let error = launch(2048).unwrap_err().to_string();
        assert!(
            error.contains("the kernel's maximum of 1024")
                && error.contains("max_flat_workgroup_size of its code object"),
            "{id}: {error}"
        );
    }
}

/// A large image is hashed while the driver loads it: a damaged one is refused all the same,
/// its module unloaded again, and nothing of it launched.
#[test]
fn a_damaged_large_image_is_refused_though_hashed_beside_the_load() {
    let (_, plain) = repo_bundles();
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(plain).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
    }
    let bundle = Bundle::open(copy.path()).unwrap();
    let manifest = bundle.manifest().unwrap().clone();
    let (module, entry) = manifest
        .modules
        .iter()
        .flat_map(|m| m.entries.iter().map(move |e| (m, e)))
        .filter(|(_, e)| e.id.to_string() == "cuda-nvptx64-nvidia-cuda-sm_90")
        .max_by_key(|(_, e)| e.size)
        .unwrap();
    // Hashed beside the load from 256 KiB (`Digests::concurrent_from`).
    assert!(
        entry.size >= 256 * 1024,
        "{} is {} bytes",
        module.name,
        entry.size
    );
    let path = copy.path().join(&module.file);
    let mut bytes = std::fs::read(&path).unwrap();
    let image = hk_format::offload::extract_entry(&bytes, &entry.id.to_string())
        .unwrap()
        .into_owned();
    let at = bytes
        .windows(image.len())
        .position(|w| w == image.as_slice())
        .unwrap()
        + image.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();

    let refused_beside_the_load = |digest: &str| {
        let (driver, device) = simulated("sm_90");
        let kernels = Bundle::open(copy.path()).unwrap().load(&device).unwrap();
        let error = kernels.kernel(&module.kernels[0]).err().unwrap();
        assert!(matches!(error, Error::Mismatch { .. }), "{error}");
        assert!(
            error.to_string().contains(&format!("its {digest} is")),
            "{error}"
        );
        let log = driver.log();
        let loads = log
            .iter()
            .filter(|e| matches!(e, Recorded::Load { .. }))
            .count();
        let unloads = log
            .iter()
            .filter(|e| matches!(e, Recorded::Unload { .. }))
            .count();
        assert_eq!((loads, unloads), (1, 1), "{log:?}");
        assert!(!log.iter().any(|e| matches!(e, Recorded::Launch { .. })));
    };
    refused_beside_the_load("BLAKE3");
}

/// Every module file and code image is recorded with its SHA-256 and its BLAKE3, and loading
/// checks the BLAKE3.
#[test]
fn images_are_recorded_with_both_digests_and_loaded_by_their_blake3() {
    let (_package, dir) = small_bundle(false);
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let (index, module) = (read("bundle.msgpack"), read("scale.hipfb"));
    let now = Bundle::from_bytes(&[("bundle.msgpack", leak(index.clone()))], UNVERIFIED).unwrap();
    for record in &now.manifest().unwrap().modules {
        assert_eq!(
            record.blake3,
            hk_format::manifest::Blake3Digest::of(&module)
        );
        for entry in &record.entries {
            let image = hk_format::offload::extract_entry(&module, &entry.id.to_string()).unwrap();
            assert_eq!(entry.digests(), hk_format::manifest::Digests::of(&image));
        }
    }
    let files = |index: &[u8], module: &[u8]| {
        [
            ("bundle.msgpack", leak(index.to_vec())),
            ("scale.hipfb", leak(module.to_vec())),
        ]
    };
    load_everywhere(&files(&index, &module), OpenOptions::default()).unwrap();
    // The module file's last byte is in its last code image.
    let mut damaged = module.clone();
    *damaged.last_mut().unwrap() ^= 0x5a;
    let error = load_everywhere(&files(&index, &damaged), OpenOptions::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("its BLAKE3 is"), "{error}");
}

/// The digest a bundle reports of its index (what names the build, and what its split packages
/// must record) is the index's true SHA-256, even where the file records a forged one that a
/// verified open, checking the BLAKE3 alone, lets through.
#[test]
fn the_index_digest_reported_is_the_one_of_its_contents() {
    let (_package, dir) = small_bundle(false);
    let index = std::fs::read(dir.join("bundle.msgpack")).unwrap();
    let truth = hk_format::manifest::Sha256Digest::of(&[&index[..4], &index[72..]].concat());
    // Another build's SHA-256 written in, and the BLAKE3, which covers it, redone to match.
    let mut forged = index.clone();
    forged[6..38].copy_from_slice(&[0x5a; 32]);
    let digest = blake3::Hasher::new()
        .update(&forged[..38])
        .update(&forged[72..])
        .finalize();
    forged[40..72].copy_from_slice(digest.as_bytes());
    let opened = Index::open(forged.clone(), true).unwrap();
    assert_eq!(opened.digest(), truth);
    let bundle =
        Bundle::from_bytes(&[("bundle.msgpack", leak(forged))], OpenOptions::default()).unwrap();
    assert_eq!(bundle.index_digest(), truth);
}

/// An index records two digests of itself: a verified open checks the BLAKE3, which covers
/// the SHA-256's value too, and `Index::check_sha256` (what `hkpack verify` adds) the SHA-256.
#[test]
fn both_digests_of_the_index_are_checked() {
    let (_package, dir) = small_bundle(false);
    let index = std::fs::read(dir.join("bundle.msgpack")).unwrap();
    let opened = Index::open(index.clone(), true).unwrap();
    opened.check_sha256().unwrap();
    assert_eq!(
        opened.digest(),
        hk_format::manifest::Sha256Digest::of(&[&index[..4], &index[72..]].concat())
    );
    assert_eq!(
        opened.blake3(),
        hk_format::manifest::Blake3Digest::of(&[&index[..38], &index[72..]].concat())
    );

    // The SHA-256's value changed: the BLAKE3 catches it at open.
    let mut damaged = index.clone();
    damaged[10] ^= 1;
    let error = Index::open(damaged.clone(), true).unwrap_err().to_string();
    assert!(error.contains("index's BLAKE3 does not match"), "{error}");
    // With the BLAKE3 redone to match, the SHA-256 check still finds it.
    let digest = blake3::Hasher::new()
        .update(&damaged[..38])
        .update(&damaged[72..])
        .finalize();
    damaged[40..72].copy_from_slice(digest.as_bytes());
    let reopened = Index::open(damaged, true).unwrap();
    let error = reopened.check_sha256().unwrap_err().to_string();
    assert!(error.contains("index's SHA-256 does not match"), "{error}");
}
