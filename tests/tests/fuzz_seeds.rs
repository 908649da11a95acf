//! The fuzz targets' seed corpus (scripts/fuzz, fuzz/), written from the repository's real
//! bundle into `target/fuzz-seeds/<target>/`: every seed is checked to be accepted by the
//! reader its target exercises, so fuzzing starts from inputs that reach deep into it (the
//! contract target's: every contract expression and binding of the bundle, printed).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use hk_code_object::{apply_ptxas_report, read_amd_code_object, read_ptx_entries};
use hk_format::contract::{Binding, Expr};
use hk_format::index::{INDEX_FILE, Index};
use hk_format::manifest::{BundleManifest, MANIFEST_FILE, ModuleAbi};
use hk_format::offload::{OffloadBundle, decompress, extract_entry};
use hk_format::target::{EntryId, TargetId};
use hkload::select::choose;

fn seeds(target: &str) -> PathBuf {
    let dir = common::repo().join("target/fuzz-seeds").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    std::fs::write(seeds(target).join(name), bytes).unwrap();
}

/// The manifest of `bundle` and its smallest module (the fuzzer runs faster on small inputs).
fn smallest_module(bundle: &Path) -> (BundleManifest, usize) {
    let manifest =
        BundleManifest::from_toml(&std::fs::read_to_string(bundle.join(MANIFEST_FILE)).unwrap())
            .unwrap();
    // Among the modules built for every target: the seeds want a gfx942 code object and sm_90
    // PTX of one module.
    let smallest = (0..manifest.modules.len())
        .filter(|&i| manifest.modules[i].not_built.is_empty())
        .min_by_key(|&i| manifest.modules[i].size)
        .unwrap();
    (manifest, smallest)
}

#[test]
fn seeds_from_the_repository_bundle() {
    let (compressed, plain) = common::repo_bundles();
    let read = |bundle: &Path, name: &str| std::fs::read(bundle.join(name)).unwrap();

    for (kind, bundle) in [("ccob", compressed), ("plain", plain)] {
        let (manifest, smallest) = smallest_module(bundle);
        let module = &manifest.modules[smallest];
        let file = read(bundle, &module.file);
        let unpacked = decompress(&file).unwrap();
        assert_eq!(
            OffloadBundle::parse(&unpacked).unwrap().entries().len(),
            module.entries.len()
        );
        write("offload", &format!("{kind}-{}", module.file), &file);

        let index = read(bundle, INDEX_FILE);
        let opened = Index::open(index.clone(), true).unwrap();
        assert_eq!(opened.manifest().unwrap(), &manifest);
        write("index", &format!("{kind}-{INDEX_FILE}"), &index);
        // Contract trees as deep as an index may hold them, and past that: the reader must
        // refuse the second as damage, never recurse into it.
        for depth in [hk_format::contract::MAX_DEPTH, 20_000] {
            let deep = index_with_contract_depth(&opened, depth);
            let refused = Index::open(deep.clone(), true)
                .unwrap()
                .kernel_record(0)
                .is_err();
            assert_eq!(
                refused,
                depth > hk_format::contract::MAX_DEPTH,
                "depth {depth}"
            );
            write("index", &format!("{kind}-deep-{depth}"), &deep);
        }

        // The index, and the module file it names first, as the `bundle` target reads them.
        let first = read(bundle, &manifest.modules[0].file);
        let size = u32::try_from(index.len()).unwrap().to_le_bytes();
        write("bundle", kind, &[&size[..], &index, &first].concat());
    }

    let (manifest, smallest) = smallest_module(plain);
    let module = &manifest.modules[smallest];
    write("bundle_toml", MANIFEST_FILE, &read(plain, MANIFEST_FILE));
    let abi = read(plain, &module.abi_file);
    ModuleAbi::from_toml(std::str::from_utf8(&abi).unwrap(), module).unwrap();
    write("bundle_toml", &module.abi_file, &abi);

    let file = read(plain, &module.file);
    let image = |id: &str| extract_entry(&file, id).unwrap().into_owned();
    for entry in &module.entries {
        let id = entry.id.to_string();
        match entry.id {
            EntryId::AmdCodeObject(target) if target.to_string() == "gfx942" => {
                let object = image(&id);
                assert_eq!(
                    read_amd_code_object(&object).unwrap().kernels.len(),
                    module.kernels.len()
                );
                write("amd_code_object", &id, &object);
            }
            EntryId::Ptx(arch) if arch.to_string() == "sm_90" => {
                let ptx = image(&id);
                let report = ptxas_report(&ptx);
                let mut kernels = read_ptx_entries(std::str::from_utf8(&ptx).unwrap()).unwrap();
                apply_ptxas_report(&mut kernels, &report).unwrap();
                write("ptx", &id, &[&ptx[..], b"\0", report.as_bytes()].concat());
            }
            _ => {}
        }
    }
    for device in ["gfx942:sramecc+:xnack-", "sm_90"] {
        let ids: Vec<EntryId> = module.entries.iter().map(|e| e.id).collect();
        assert!(choose(&device.parse::<TargetId>().unwrap(), &ids).is_some());
        let lines: Vec<String> = std::iter::once(device.to_owned())
            .chain(ids.iter().map(ToString::to_string))
            .collect();
        write("target_id", device, lines.join("\n").as_bytes());
    }
    for target in ["amd_code_object", "ptx"] {
        let seeds = std::fs::read_dir(seeds(target)).unwrap().count();
        assert_eq!(seeds, 1, "the {target} seed is missing");
    }

    // The contract target: every expression and binding of the bundle's contracts, as text.
    let bundle = hkload::Bundle::open(plain).unwrap();
    let mut texts = BTreeSet::new();
    for record in bundle.kernel_records().unwrap() {
        let Some(contract) = &record.contract else {
            continue;
        };
        texts.extend(
            contract
                .lets
                .iter()
                .chain(&contract.extents)
                .map(ToString::to_string),
        );
        let exprs = contract.block.iter().chain(&contract.grid);
        texts.extend(exprs.chain([&contract.shared]).map(ToString::to_string));
        texts.extend(contract.requires.iter().map(|r| r.check.to_string()));
    }
    assert!(texts.len() > 50, "only {} contract texts", texts.len());
    for (i, text) in texts.iter().enumerate() {
        assert!(
            text.parse::<Expr>().is_ok() || text.parse::<Binding>().is_ok(),
            "{text} does not parse back"
        );
        write("contract", &format!("{i:04}"), text.as_bytes());
    }
}

/// `index` re-encoded with its first kernel's shared-memory expression nested `depth` levels
/// deep (`-(-(...(size)))`). Encoding walks the tree recursively, so it runs on a thread with
/// room for that; hkpack never writes such a tree.
fn index_with_contract_depth(index: &Index, depth: usize) -> Vec<u8> {
    let manifest = index.manifest().unwrap().clone();
    let mut abis: Vec<ModuleAbi> = (0..manifest.modules.len())
        .map(|module| index.module_abi(module).unwrap())
        .collect();
    std::thread::Builder::new()
        .stack_size(1 << 30)
        .spawn(move || {
            let contract = abis
                .iter_mut()
                .flat_map(|abi| &mut abi.kernels)
                .find_map(|kernel| kernel.contract.as_mut())
                .expect("the bundle's kernels have contracts");
            let mut shared = std::mem::replace(&mut contract.shared, Expr::Int(0));
            for _ in 1..depth {
                shared = Expr::Neg(Box::new(shared));
            }
            contract.shared = shared;
            let bytes = Index::encode(&manifest, &abis);
            // Freeing the tree recurses too: leave it to the big stack.
            drop(abis);
            bytes
        })
        .unwrap()
        .join()
        .unwrap()
}

/// What `ptxas -v` reports on `ptx`, as hkpack reads it when it builds a cubin.
fn ptxas_report(ptx: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("module.ptx");
    std::fs::write(&input, ptx).unwrap();
    let output = Command::new("ptxas")
        .args(["-arch=sm_90", "-O3", "-v"])
        .arg(&input)
        .arg("-o")
        .arg(dir.path().join("module.cubin"))
        .output()
        .expect("ptxas runs (scripts/setup installs it)");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stderr).unwrap()
}
