// RMSNorm over the last dimension of a row-major [rows, cols] tensor, in f32, each output
// rounded once to the element type:
//
//   rmsnorm:           out[r, i] = x[r, i] * rsqrt(mean_i(x[r, i]^2) + eps) * weight[i]
//   fused_add_rmsnorm: residual[r, i] <- T(x[r, i] + residual[r, i])   (updated in place)
//                      out[r, i] = rmsnorm(residual)[r, i], computed from the updated
//                      residual exactly as stored in T (as vLLM's fused_add_rms_norm does;
//                      out may be x, its in-place form).
//
// Symbols: rmsnorm_{bf16,f16,f32}(out, x, weight, eps, rows, cols)
//          fused_add_rmsnorm_{bf16,f16,f32}(out, residual, x, weight, eps, rows, cols)
// Launch: the contract in manifests/rmsnorm.toml, the teams of hk::for_each_row (hk/walk.h)
// with kBlock = 256.
#include "hk/hk.h"
#include "hk/residual.h"
#include "hk/walk.h"

namespace {

constexpr unsigned kBlock = 256;
// Blocks that must fit on one SM at once, which caps registers a thread (see
// HK_LAUNCH_BOUNDS_MIN_BLOCKS): 4 (64 registers, 1024 threads an SM) is the most that runs
// without spills on sm_90. Under looser caps ptxas takes 80 to 128 registers and only 2 or 3
// blocks fit, too few loads in flight for a memory-bound kernel.
constexpr unsigned kMinBlocks = 4;
// The residual-add kernels load two inputs for every pack of the lane before the first is
// used, which spills under 64 registers on sm_90; 3 blocks (80 registers) hold it.
constexpr unsigned kFusedMinBlocks = 3;

// Writes out = v * scale * w for the pack of values v and of weights w at column i.
template <typename T, unsigned N>
HK_DEVICE void write_scaled(T* out, unsigned i, float scale, const hk::Pack<T, N>& v,
                            const hk::Pack<T, N>& w) {
  hk::Pack<T, N> y;
#pragma unroll
  for (unsigned e = 0; e < N; ++e)
    y.elem[e] = hk::from_float<T>(hk::to_float(v.elem[e]) * scale * hk::to_float(w.elem[e]));
  hk::store(out + i, y);
}

template <typename T, unsigned N> HK_DEVICE float sum_squares(const hk::Pack<T, N>& v) {
  float s = 0.0f;
#pragma unroll
  for (unsigned e = 0; e < N; ++e) s += hk::to_float(v.elem[e]) * hk::to_float(v.elem[e]);
  return s;
}

template <typename Walk> HK_DEVICE float rms_scale(Walk& walk, float sum_sq, unsigned cols, float eps) {
  return hk::rsqrt(walk.sum(sum_sq) / static_cast<float>(cols) + eps);
}

template <typename T>
HK_DEVICE void rmsnorm(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ weight,
                       float eps, unsigned rows, unsigned cols) {
  hk::for_each_row<T, kBlock, 1>(rows, cols, hk::aligned16(out, x, weight), [&](auto& walk, unsigned r) {
    const T* xr = x + hk::row_offset(r, cols);
    T* outr = out + hk::row_offset(r, cols);
    float sum_sq = 0.0f;
    walk.first_pass([&](unsigned i, auto n) { return hk::load(xr + i, n); },
                    [&](unsigned, auto, const auto& v) {
                      sum_sq += sum_squares(v);
                      return v;
                    },
                    weight);
    const float scale = rms_scale(walk, sum_sq, cols, eps);
    walk.pass(
        xr, [&](unsigned i, auto, const auto& v, const auto& w) { write_scaled(outr, i, scale, v, w); },
        weight);
  });
}

// out and x are not __restrict__: out may be x.
template <typename T>
HK_DEVICE void fused_add_rmsnorm(T* out, T* __restrict__ residual, const T* x,
                                 const T* __restrict__ weight, float eps, unsigned rows,
                                 unsigned cols) {
  const bool aligned = hk::aligned16(out, residual, x, weight);
  hk::for_each_row<T, kBlock, 1>(rows, cols, aligned, [&](auto& walk, unsigned r) {
    const T* xr = x + hk::row_offset(r, cols);
    T* resr = residual + hk::row_offset(r, cols);
    T* outr = out + hk::row_offset(r, cols);
    float sum_sq = 0.0f;
    walk.first_pass([&](unsigned i, auto n) { return hk::residual_add(xr + i, resr + i, n); },
                    [&](unsigned i, auto, const auto& sum) {
                      hk::store(resr + i, sum);
                      sum_sq += sum_squares(sum);
                      return sum;
                    },
                    weight);
    const float scale = rms_scale(walk, sum_sq, cols, eps);
    walk.pass(
        resr, [&](unsigned i, auto, const auto& v, const auto& w) { write_scaled(outr, i, scale, v, w); },
        weight);
  });
}

}  // namespace

#define HK_RMSNORM(name, T)                                                                   \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kMinBlocks)                                   \
  void rmsnorm_##name(                                                                        \
      T* out, const T* x, const T* weight, float eps, unsigned rows, unsigned cols) {         \
    rmsnorm<T>(out, x, weight, eps, rows, cols);                                              \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kFusedMinBlocks)                              \
  void fused_add_rmsnorm_##name(                                                              \
      T* out, T* residual, const T* x, const T* weight, float eps, unsigned rows,             \
      unsigned cols) {                                                                        \
    fused_add_rmsnorm<T>(out, residual, x, weight, eps, rows, cols);                          \
  }
HK_RMSNORM(bf16, hk::bf16)
HK_RMSNORM(f16, hk::f16)
HK_RMSNORM(f32, float)
