//! What the benchmark programs share. The programs themselves are in `src/bin`: the build and
//! the cache (`build_bench`, `cache_scale`), hkload's cold start and launch overhead
//! (`cpu_cold_start`, `gpu_bench`) and kernel speed (`gpu_kernel_bench`, with
//! `bench/python/kernel_bench.py`); the PyTorch-side scripts are in `bench/python/`.

#[cfg(feature = "cuda")]
pub mod events;
pub mod timing;
pub mod workload;
