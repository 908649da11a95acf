//! `gpu_kernel_bench` sizes every buffer from the kernel's contract: on the repository's
//! kernels built for sm_90 and a simulated device, every workload is sized, and at small sizes
//! each buffer comes out as long as the parity tests' case of the same call holds.
//!
//! The kernels build through the build cache the end-to-end tests share (`HK_TEST_CACHE`, else
//! one in the target folder), so a checkout that ran them compiles nothing here.

use std::path::{Path, PathBuf};

use hk_bench::workload::{self, WORKLOADS, Workload};
use hk_tests::case::CaseArg;
use hk_tests::kernels::norm::NormKind;
use hkload::Bundle;
use hkpack::BuildOptions;
use hkpack::toolchain::ToolPaths;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// The modules of the benchmarked kernels.
const MODULES: [&str; 6] = [
    "rmsnorm.toml",
    "layernorm.toml",
    "softmax.toml",
    "gated_activation.toml",
    "rope.toml",
    "topk.toml",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("hk-bench lives in a folder of the workspace")
        .to_owned()
}

/// The benchmarked kernels' modules built for sm_90 into `dir`; the bundle folder.
fn build(dir: &Path) -> PathBuf {
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    for file in ["package.toml"].iter().chain(&MODULES) {
        std::fs::copy(repo().join("manifests").join(file), manifests.join(file)).unwrap();
    }
    std::os::unix::fs::symlink(repo().join("kernels"), dir.join("kernels")).unwrap();
    let cache = std::env::var_os("HK_TEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("hkpack-cache"));
    let options = BuildOptions {
        manifests,
        targets: Some(vec!["sm_90".parse().unwrap()]),
        jobs: 2,
        out_dir: dir.join("dist"),
        cache_dir: cache,
        remote_cache: None,
        compress: false,
        tools: ToolPaths::default(),
        progress: false,
    };
    match hkpack::build(&options) {
        Ok(report) => report.bundle,
        Err(e) => panic!("hkpack build failed:\n{e}"),
    }
}

#[test]
fn every_workload_is_sized_by_its_contract_as_its_test_case_is() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = Bundle::open(build(dir.path())).unwrap();
    let device = workload::simulated_device(&bundle).unwrap();
    assert_eq!(device.target().to_string(), "sm_90");
    let loaded = bundle.load(&device).unwrap();

    for workload in WORKLOADS {
        let (_, tensors) = workload::sized(&loaded, workload)
            .unwrap_or_else(|e| panic!("{} {}: {e}", workload.kernel(), workload.shape()));
        let main = tensors
            .iter()
            .flatten()
            .find(|t| t.name == "x")
            .expect("every benchmarked kernel reads x");
        assert_eq!(main.len, workload.elements(), "{}", workload.shape());
    }

    let mut rng = StdRng::seed_from_u64(3);
    for workload in [
        Workload::norm(NormKind::FusedAddRmsNorm, 5, 24),
        Workload::norm(NormKind::LayerNorm, 3, 40),
        Workload::softmax(7, 33),
        Workload::silu_and_mul(3, 34),
        Workload::rope(2, 3, 5, 16),
        Workload::topk(3, 40, 7),
    ] {
        let (_, tensors) = workload::sized(&loaded, workload).unwrap();
        let case = workload.case(&mut rng);
        for (arg, tensor) in case.args.iter().zip(&tensors) {
            let want = match arg {
                CaseArg::Input { data, .. } | CaseArg::InOut { data, .. } => data.len(),
                CaseArg::Output { len, .. } => *len,
                CaseArg::Scalar(_) => {
                    assert!(tensor.is_none(), "{}", case.kernel);
                    continue;
                }
            };
            let tensor = tensor.as_ref().expect("a buffer where the case has one");
            assert_eq!(tensor.len, want, "{} `{}`", case.kernel, tensor.name);
        }
    }
}
