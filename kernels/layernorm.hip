// LayerNorm over the last dimension of a row-major [rows, cols] tensor, in f32, each output
// rounded once to the element type:
//
//   layernorm:           out[r, i] = (x[r, i] - mean) * rsqrt(var + eps) * weight[i] + bias[i]
//                        with mean and the biased var (divided by cols) of row r
//   fused_add_layernorm: residual[r, i] <- T(x[r, i] + residual[r, i])   (updated in place)
//                        out[r, i] = layernorm(residual)[r, i], computed from the updated
//                        residual exactly as stored in T (out may be x).
//
// The statistics take two reductions, the mean and then the sum of squared deviations from
// it, never E[x^2] - mean^2, which cancels badly when |mean| >> std. Rows that stay in
// registers (up to 8192 bf16/f16 or 4096 f32 elements) are read from memory once; longer
// ones are read again for the deviations, then for the output, mostly from cache.
//
// Symbols: layernorm_{bf16,f16,f32}(out, x, weight, bias, eps, rows, cols)
//          fused_add_layernorm_{bf16,f16,f32}(out, residual, x, weight, bias, eps, rows, cols)
// Launch: the contract in manifests/layernorm.toml, the teams of hk::for_each_row (hk/walk.h)
// with kBlock = 256.
#include "hk/hk.h"
#include "hk/residual.h"
#include "hk/walk.h"

namespace {

constexpr unsigned kBlock = 256;
// At least 4 blocks per SM: at most 64 registers a thread (see rmsnorm.hip). sm_80's ptxas
// needs a few more than 64 and would spill, and so does sm_90's for the f32 form: 3 blocks
// (80 registers) there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
template <typename T> constexpr unsigned kMinBlocks = 3;
#else
template <typename T> constexpr unsigned kMinBlocks = sizeof(T) == 4 ? 3 : 4;
#endif
// The residual-add kernels need more registers (see rmsnorm.hip): 3 blocks everywhere.
constexpr unsigned kFusedMinBlocks = 3;

// The sum of a pack's values, in f32.
template <typename T, unsigned N> HK_DEVICE float pack_sum(const hk::Pack<T, N>& v) {
  float sum = 0.0f;
#pragma unroll
  for (unsigned e = 0; e < N; ++e) sum += hk::to_float(v.elem[e]);
  return sum;
}

// The row's statistics from each lane's sum of its values, then the output pass:
// out = (v - mean) * rstd * weight + bias. `values` is the row the first pass saw (read again
// where the row does not stay in registers).
template <typename T, typename Walk>
HK_DEVICE void normalize(Walk& walk, const T* values, float lane_sum, T* out, const T* weight,
                         const T* bias, float eps, unsigned cols) {
  const float mean = walk.sum(lane_sum) / static_cast<float>(cols);
  float lane_m2 = 0.0f;
  walk.pass(values, [&](unsigned, auto n, const auto& v) {
#pragma unroll
    for (unsigned e = 0; e < n; ++e) {
      const float d = hk::to_float(v.elem[e]) - mean;
      lane_m2 += d * d;
    }
  });
  const float rstd = hk::rsqrt(walk.sum(lane_m2) / static_cast<float>(cols) + eps);
  walk.pass(values, [&](unsigned i, auto n, const auto& v, const auto& w, const auto& b) {
    hk::Pack<T, n> y;
#pragma unroll
    for (unsigned e = 0; e < n; ++e) {
      const float normed = (hk::to_float(v.elem[e]) - mean) * rstd;
      y.elem[e] = hk::from_float<T>(hk::fma(normed, hk::to_float(w.elem[e]), hk::to_float(b.elem[e])));
    }
    hk::store(out + i, y);
  }, weight, bias);
}

template <typename T>
HK_DEVICE void layernorm(T* __restrict__ out, const T* __restrict__ x,
                         const T* __restrict__ weight, const T* __restrict__ bias, float eps,
                         unsigned rows, unsigned cols) {
  const bool aligned = hk::aligned16(out, x, weight, bias);
  hk::for_each_row<T, kBlock, 2>(rows, cols, aligned, [&](auto& walk, unsigned r) {
    const T* xr = x + hk::row_offset(r, cols);
    float sum = 0.0f;
    walk.first_pass([&](unsigned i, auto n) { return hk::load(xr + i, n); },
                    [&](unsigned, auto, const auto& v) {
                      sum += pack_sum(v);
                      return v;
                    },
                    weight, bias);
    normalize(walk, xr, sum, out + hk::row_offset(r, cols), weight, bias, eps, cols);
  });
}

// out and x are not __restrict__: out may be x. Short rows take the shared walk, with the
// weight and bias read only by the output pass (see hk::ShortRows): with their own walk's code,
// ptxas spills 16 bytes of the f16 form on sm_80 under its 80 registers.
template <typename T>
HK_DEVICE void fused_add_layernorm(T* out, T* __restrict__ residual, const T* x,
                                   const T* __restrict__ weight, const T* __restrict__ bias,
                                   float eps, unsigned rows, unsigned cols) {
  const bool aligned = hk::aligned16(out, residual, x, weight, bias);
  hk::for_each_row<T, kBlock, 0, hk::ShortRows::kShared>(rows, cols, aligned, [&](auto& walk, unsigned r) {
    const T* xr = x + hk::row_offset(r, cols);
    T* resr = residual + hk::row_offset(r, cols);
    float sum = 0.0f;
    walk.first_pass([&](unsigned i, auto n) { return hk::residual_add(xr + i, resr + i, n); },
                    [&](unsigned i, auto, const auto& added) {
                      hk::store(resr + i, added);
                      sum += pack_sum(added);
                      return added;
                    });
    normalize(walk, resr, sum, out + hk::row_offset(r, cols), weight, bias, eps, cols);
  });
}

}  // namespace

#define HK_LAYERNORM(name, T)                                                                 \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kMinBlocks<T>)                                \
  void layernorm_##name(                                                                      \
      T* out, const T* x, const T* weight, const T* bias, float eps, unsigned rows,           \
      unsigned cols) {                                                                        \
    layernorm<T>(out, x, weight, bias, eps, rows, cols);                                      \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kFusedMinBlocks)                              \
  void fused_add_layernorm_##name(                                                            \
      T* out, T* residual, const T* x, const T* weight, const T* bias, float eps,             \
      unsigned rows, unsigned cols) {                                                         \
    fused_add_layernorm<T>(out, residual, x, weight, bias, eps, rows, cols);                  \
  }
HK_LAYERNORM(bf16, hk::bf16)
HK_LAYERNORM(f16, hk::f16)
HK_LAYERNORM(f32, float)
