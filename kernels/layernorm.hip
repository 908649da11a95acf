// LayerNorm over the last dimension of a row-major [rows, cols] tensor, in f32, each output
// rounded once to the element type:
//
//   layernorm:           out[r, i] = (x[r, i] - mean) * rsqrt(var + eps) * weight[i] + bias[i]
//                        with mean and the biased var (divided by cols) of row r
//   fused_add_layernorm: residual[r, i] <- T(x[r, i] + residual[r, i])   (updated in place)
//                        out[r, i] = layernorm(residual)[r, i], computed from the updated
//                        residual exactly as stored in T (out may be x).
//
// The variance is the mean of (x - mean)^2 taken in a second pass over the row (from registers
// when the row fits there), not E[x^2] - mean^2, which cancels badly when |mean| >> std.
//
// Symbols: layernorm_{bf16,f16,f32}(out, x, weight, bias, eps, rows, cols)
//          fused_add_layernorm_{bf16,f16,f32}(out, residual, x, weight, bias, eps, rows, cols)
// Launch: 256 threads per block, each row taken by a team of L lanes, L the smallest power of
// two from 8 to 256 with L * 64 >= cols * sizeof(T) (each lane holds at most four 16-byte
// vectors of the row); grid = ceil(rows / (256 / L)). Any grid is correct (teams walk the rows
// with a grid stride); another one only costs speed.
#include "hk/hk.h"
#include "hk/walk.h"

namespace {

constexpr unsigned kBlock = 256;
// At least 4 blocks per SM: at most 64 registers a thread (see rmsnorm.hip). sm_80's ptxas
// needs a few more than 64 for the 16-bit forms and would spill, so 3 blocks (85) there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr unsigned kMinBlocks = 3;
#else
constexpr unsigned kMinBlocks = 4;
#endif

template <typename T, unsigned N> HK_DEVICE float sum(const hk::Pack<T, N>& v) {
  float s = 0.0f;
#pragma unroll
  for (unsigned e = 0; e < N; ++e) s += hk::to_float(v.elem[e]);
  return s;
}

// The statistics of a row whose first pass has run (its sum in `row_sum`), and the output
// pass: out = (v - mean) * rstd * weight + bias.
template <typename T, typename Walk>
HK_DEVICE void normalize(Walk& walk, const T* values, float row_sum, T* out, const T* weight,
                         const T* bias, float eps, unsigned cols) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const float mean = walk.sum(row_sum) * inv_cols;
  float sum_sq = 0.0f;
  walk.pass(values, [&](unsigned, auto n, const auto& v) {
#pragma unroll
    for (unsigned e = 0; e < n; ++e) {
      const float d = hk::to_float(v.elem[e]) - mean;
      sum_sq += d * d;
    }
  });
  const float rstd = hk::rsqrt(walk.sum(sum_sq) * inv_cols + eps);
  walk.pass(values, [&](unsigned i, auto n, const auto& v) {
    const auto w = hk::load(weight + i, n);
    const auto b = hk::load(bias + i, n);
    hk::Pack<T, n> y;
#pragma unroll
    for (unsigned e = 0; e < n; ++e) {
      const float normed = (hk::to_float(v.elem[e]) - mean) * rstd;
      y.elem[e] = hk::from_float<T>(hk::fma(normed, hk::to_float(w.elem[e]), hk::to_float(b.elem[e])));
    }
    hk::store(out + i, y);
  });
}

template <typename T>
HK_DEVICE void layernorm(T* __restrict__ out, const T* __restrict__ x,
                         const T* __restrict__ weight, const T* __restrict__ bias, float eps,
                         unsigned rows, unsigned cols) {
  const bool aligned = hk::aligned16(out, x, weight, bias);
  hk::for_each_row<T, kBlock>(rows, cols, aligned, [&](auto& walk, unsigned r) {
    const T* xr = x + hk::row_offset(r, cols);
    float row_sum = 0.0f;
    walk.first_pass([&](unsigned i, auto n) {
      const auto v = hk::load(xr + i, n);
      row_sum += sum(v);
      return v;
    });
    normalize(walk, xr, row_sum, out + hk::row_offset(r, cols), weight, bias, eps, cols);
  });
}

// out and x are not __restrict__: out may be x.
template <typename T>
HK_DEVICE void fused_add_layernorm(T* out, T* __restrict__ residual, const T* x,
                                   const T* __restrict__ weight, const T* __restrict__ bias,
                                   float eps, unsigned rows, unsigned cols) {
  const bool aligned = hk::aligned16(out, residual, x, weight, bias);
  hk::for_each_row<T, kBlock>(rows, cols, aligned, [&](auto& walk, unsigned r) {
    const T* xr = x + hk::row_offset(r, cols);
    T* resr = residual + hk::row_offset(r, cols);
    float row_sum = 0.0f;
    walk.first_pass([&](unsigned i, auto n) {
      const auto a = hk::load(xr + i, n);
      const auto b = hk::load(resr + i, n);
      hk::Pack<T, n> s;
#pragma unroll
      for (unsigned e = 0; e < n; ++e)
        s.elem[e] = hk::from_float<T>(hk::to_float(a.elem[e]) + hk::to_float(b.elem[e]));
      hk::store(resr + i, s);
      row_sum += sum(s);
      return s;
    });
    normalize(walk, resr, row_sum, out + hk::row_offset(r, cols), weight, bias, eps, cols);
  });
}

}  // namespace

#define HK_LAYERNORM(name, T)                                                                 \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kMinBlocks) void layernorm_##name(                                  \
      T* out, const T* x, const T* weight, const T* bias, float eps, unsigned rows,           \
      unsigned cols) {                                                                        \
    layernorm<T>(out, x, weight, bias, eps, rows, cols);                                      \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kMinBlocks) void fused_add_layernorm_##name(                        \
      T* out, T* residual, const T* x, const T* weight, const T* bias, float eps,             \
      unsigned rows, unsigned cols) {                                                         \
    fused_add_layernorm<T>(out, residual, x, weight, bias, eps, rows, cols);                  \
  }
HK_LAYERNORM(bf16, hk::bf16)
HK_LAYERNORM(f16, hk::f16)
HK_LAYERNORM(f32, float)
