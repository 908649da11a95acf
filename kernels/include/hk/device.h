// hk/device.h: the portable base of every kernel. Maps the few CUDA/HIP keywords and the
// hardware queries a kernel needs onto clang builtins, for AMD gfx9 (wave64) and NVIDIA
// (warp32), with no ROCm or CUDA headers: kernels are compiled with -nogpuinc / -nocudainc.
//
// What lives here: the keywords (__global__, __device__, __shared__; clang knows __restrict__),
// HK_KERNEL / HK_LAUNCH_BOUNDS, thread/block indices and dims, the wave size as a constant,
// lane and wave ids, the block barrier, the 16-bit float types with their f32 conversions,
// packs of elements and 16-byte vector loads and stores. Math is in hk/math.h, shuffles and
// reductions in hk/reduce.h; hk/hk.h includes all three.
//
// A "wave" is AMD's wavefront (64 lanes on gfx9) or NVIDIA's warp (32 lanes).
#pragma once

// HK_AMD and HK_NVIDIA: 1 for the vendor being compiled for, else 0 (so that constant
// expressions may choose too, not only #if).
#if defined(__AMDGCN__)
#define HK_AMD 1
#define HK_NVIDIA 0
#elif defined(__NVPTX__)
#define HK_AMD 0
#define HK_NVIDIA 1
#else
#error "hk/device.h is for device compiles only: AMDGCN (-x hip --cuda-device-only) or NVPTX (-x cuda --cuda-device-only)"
#endif

// HK_SM90A: 1 when compiling for the architecture-specific target sm_90a (wgmma, TMA,
// setmaxnreg: Hopper instructions that no other architecture has), else 0. clang 22 defines
// __CUDA_ARCH_FEAT_SM90_ALL for --cuda-gpu-arch=sm_90a only (sm_90 gets __CUDA_ARCH__ 900
// alone). Such code runs only on compute capability 9.0, and hkload chooses it only there;
// modules opt in with `arch_specific = ["sm_90a"]` in their manifest. sm_100a would define
// __CUDA_ARCH_FEAT_SM100_ALL.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HK_SM90A 1
#else
#define HK_SM90A 0
#endif

// ---- Keywords -------------------------------------------------------------------------------
// Without the vendor headers clang knows only the attributes; these are their usual names.
#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif
#ifndef __forceinline__
#define __forceinline__ __inline__ __attribute__((always_inline))
#endif

// A device helper: always inlined, so kernels pay nothing for the abstraction.
#define HK_DEVICE __device__ __forceinline__

// For lambdas in kernels (`[&](int i) HK_INLINE { ... }`): clang inlines a lambda only when it
// judges it cheap, and a large one called twice (a GEMM's multiply step) otherwise stays a
// call whose captures, accumulators included, live in local memory.
#define HK_INLINE __attribute__((always_inline))

// A kernel entry point with a stable, unmangled symbol name.
#define HK_KERNEL extern "C" __global__

// The largest block a kernel will be launched with; lets the compiler budget registers for it.
// (clang's generic launch_bounds attribute is silently ignored in HIP mode without the HIP
// headers, so AMD gets its own attribute.)
#if HK_AMD
#define HK_LAUNCH_BOUNDS(threads) __attribute__((amdgpu_flat_work_group_size(1, threads)))
#else
#define HK_LAUNCH_BOUNDS(threads) __attribute__((launch_bounds(threads)))
#endif

// The same, plus how many such blocks must fit on one SM / CU at once: that caps registers per
// thread (65536 / (threads * blocks) on NVIDIA; on AMD the blocks' waves share 4 SIMDs of 512
// VGPRs a lane). Memory-bound kernels want the occupancy, and an explicit budget also keeps
// ptxas from picking a smaller register count of its own that spills.
#if HK_AMD
#define HK_LAUNCH_BOUNDS_MIN_BLOCKS(threads, blocks)                    \
  __attribute__((amdgpu_flat_work_group_size(1, threads),               \
                 amdgpu_waves_per_eu((threads * blocks + 255) / 256)))
#else
#define HK_LAUNCH_BOUNDS_MIN_BLOCKS(threads, blocks) __attribute__((launch_bounds(threads, blocks)))
#endif

namespace hk {

// ---- Wave size ------------------------------------------------------------------------------
#if HK_AMD
// Every AMD target this project builds (gfx90a, gfx942, gfx950) is gfx9: wave64 only. clang
// defines no wave-size macro for them, so the fact is stated here.
inline constexpr unsigned kWaveSize = 64;
#else
inline constexpr unsigned kWaveSize = 32;
#endif

// The largest block a kernel may use (both vendors) and hence the most waves in one block.
inline constexpr unsigned kMaxBlockThreads = 1024;
inline constexpr unsigned kMaxWaves = kMaxBlockThreads / kWaveSize;

// ---- Indices and dims -----------------------------------------------------------------------
// The CUDA names threadIdx/blockIdx/blockDim/gridDim, one function per axis.
#if HK_AMD
namespace detail {
// Code object v5 keeps the grid size in blocks in the implicit (hidden) kernel arguments,
// hidden_block_count_{x,y,z} at bytes 0, 4, 8; HIP's module launch fills them in. (The block
// size, hidden_group_size_*, is read the same way by clang's workgroup_size builtins.)
HK_DEVICE unsigned block_count(unsigned byte) {
  return *reinterpret_cast<const unsigned*>(
      static_cast<const char*>(__builtin_amdgcn_implicitarg_ptr()) + byte);
}
}  // namespace detail
HK_DEVICE unsigned thread_idx_x() { return __builtin_amdgcn_workitem_id_x(); }
HK_DEVICE unsigned thread_idx_y() { return __builtin_amdgcn_workitem_id_y(); }
HK_DEVICE unsigned thread_idx_z() { return __builtin_amdgcn_workitem_id_z(); }
HK_DEVICE unsigned block_idx_x() { return __builtin_amdgcn_workgroup_id_x(); }
HK_DEVICE unsigned block_idx_y() { return __builtin_amdgcn_workgroup_id_y(); }
HK_DEVICE unsigned block_idx_z() { return __builtin_amdgcn_workgroup_id_z(); }
HK_DEVICE unsigned block_dim_x() { return __builtin_amdgcn_workgroup_size_x(); }
HK_DEVICE unsigned block_dim_y() { return __builtin_amdgcn_workgroup_size_y(); }
HK_DEVICE unsigned block_dim_z() { return __builtin_amdgcn_workgroup_size_z(); }
HK_DEVICE unsigned grid_dim_x() { return detail::block_count(0); }
HK_DEVICE unsigned grid_dim_y() { return detail::block_count(4); }
HK_DEVICE unsigned grid_dim_z() { return detail::block_count(8); }
// The lane's position in its wave, from the hardware (valid for any block shape).
HK_DEVICE unsigned lane_id() { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }
#else
HK_DEVICE unsigned thread_idx_x() { return __nvvm_read_ptx_sreg_tid_x(); }
HK_DEVICE unsigned thread_idx_y() { return __nvvm_read_ptx_sreg_tid_y(); }
HK_DEVICE unsigned thread_idx_z() { return __nvvm_read_ptx_sreg_tid_z(); }
HK_DEVICE unsigned block_idx_x() { return __nvvm_read_ptx_sreg_ctaid_x(); }
HK_DEVICE unsigned block_idx_y() { return __nvvm_read_ptx_sreg_ctaid_y(); }
HK_DEVICE unsigned block_idx_z() { return __nvvm_read_ptx_sreg_ctaid_z(); }
HK_DEVICE unsigned block_dim_x() { return __nvvm_read_ptx_sreg_ntid_x(); }
HK_DEVICE unsigned block_dim_y() { return __nvvm_read_ptx_sreg_ntid_y(); }
HK_DEVICE unsigned block_dim_z() { return __nvvm_read_ptx_sreg_ntid_z(); }
HK_DEVICE unsigned grid_dim_x() { return __nvvm_read_ptx_sreg_nctaid_x(); }
HK_DEVICE unsigned grid_dim_y() { return __nvvm_read_ptx_sreg_nctaid_y(); }
HK_DEVICE unsigned grid_dim_z() { return __nvvm_read_ptx_sreg_nctaid_z(); }
HK_DEVICE unsigned lane_id() { return __nvvm_read_ptx_sreg_laneid(); }
#endif

// The wave's index in a one-dimensional block.
HK_DEVICE unsigned wave_id() { return thread_idx_x() / kWaveSize; }

// ---- Barrier --------------------------------------------------------------------------------
// Waits until every thread of the block arrives; shared-memory writes made before it are
// visible to every thread after it (CUDA's __syncthreads).
HK_DEVICE void block_sync() {
#if HK_AMD
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
#else
  __syncthreads();
#endif
}

// ---- Atomics --------------------------------------------------------------------------------
// *p += v as one atomic read-modify-write at device scope, relaxed: the order of concurrent
// additions is unspecified, so a float sum made this way is not bitwise reproducible.
HK_DEVICE void atomic_add(float* p, float v) {
#if HK_AMD
  __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
  __nvvm_atom_add_gen_f(p, v);
#endif
}

// ---- Element types --------------------------------------------------------------------------
// Storage types; arithmetic is done in f32 after to_float.
using bf16 = __bf16;
using f16 = _Float16;

// The f32 value of an element (exact for every type here).
HK_DEVICE float to_float(float x) { return x; }
HK_DEVICE float to_float(bf16 x) { return static_cast<float>(x); }
HK_DEVICE float to_float(f16 x) { return static_cast<float>(x); }

// An f32 rounded to the element type T (round to nearest even).
template <typename T> HK_DEVICE T from_float(float x) { return static_cast<T>(x); }

// ---- Packs and 16-byte vectors --------------------------------------------------------------
// A width as a type, so code written once for a pack of any width (a generic lambda taking
// `auto n`) can use it as a constant: Pack<T, n>, `for (unsigned e = 0; e < n; ++e)`.
template <unsigned N> struct Width {
  static constexpr unsigned value = N;
  constexpr operator unsigned() const { return N; }
};

// N consecutive elements of T, in registers.
template <typename T, unsigned N> struct Pack {
  static constexpr unsigned kSize = N;
  T elem[N];
};

// Sixteen bytes of T (8 bf16/f16 or 4 f32), the widest load one lane can issue.
template <typename T> using Vec16 = Pack<T, 16 / sizeof(T)>;
template <typename T> inline constexpr unsigned kVec16 = 16 / sizeof(T);

using u32x4 = unsigned __attribute__((ext_vector_type(4)));

// Loads a Vec16 from p, which must be 16-byte aligned.
template <typename T> HK_DEVICE Vec16<T> load16(const T* p) {
  return __builtin_bit_cast(Vec16<T>, *reinterpret_cast<const u32x4*>(p));
}

// Stores v to p, which must be 16-byte aligned.
template <typename T> HK_DEVICE void store16(T* p, const Vec16<T>& v) {
  *reinterpret_cast<u32x4*>(p) = __builtin_bit_cast(u32x4, v);
}

// Loads n elements from p: one 16-byte load when n is kVec16<T> (p must then be 16-byte
// aligned), else element by element.
template <typename T, unsigned N> HK_DEVICE Pack<T, N> load(const T* p, Width<N>) {
  if constexpr (N == kVec16<T>) {
    return load16(p);
  } else {
    Pack<T, N> v;
#pragma unroll
    for (unsigned e = 0; e < N; ++e) v.elem[e] = p[e];
    return v;
  }
}

// Stores a pack to p, as one 16-byte store when it is a Vec16 (p must then be 16-byte aligned).
template <typename T, unsigned N> HK_DEVICE void store(T* p, const Pack<T, N>& v) {
  if constexpr (N == kVec16<T>) {
    store16(p, v);
  } else {
#pragma unroll
    for (unsigned e = 0; e < N; ++e) p[e] = v.elem[e];
  }
}

// Whether every pointer is 16-byte aligned (kernels check theirs before taking a vector path).
template <typename... P> HK_DEVICE bool aligned16(const P*... p) {
  return ((reinterpret_cast<unsigned long long>(p) % 16 == 0) && ...);
}

}  // namespace hk
