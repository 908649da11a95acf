// RMSNorm over the last dimension of a row-major [rows, cols] tensor:
//   out[r, i] = x[r, i] * rsqrt(mean_i(x[r, i]^2) + eps) * weight[i]
// in f32, rounded once to the element type on the way out.
//
// Symbols: rmsnorm_{bf16,f16,f32}(out, x, weight, eps, rows, cols).
// Launch: 256 threads per block, one block per row (grid = rows). Any grid is correct, blocks
// walk the rows with a grid stride, so a smaller grid only costs speed.
#include "hk/hk.h"
#include "hk/walk.h"

namespace {

constexpr unsigned kBlock = 256;

template <typename T>
HK_DEVICE void rmsnorm(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ weight,
                       float eps, unsigned rows, unsigned cols) {
  const hk::RowWalk<T, kBlock> walk(cols, hk::aligned16(out, x, weight));
  for (unsigned r = hk::block_idx_x(); r < rows; r += hk::grid_dim_x()) {
    const T* xr = x + hk::row_offset(r, cols);
    T* outr = out + hk::row_offset(r, cols);
    typename hk::RowWalk<T, kBlock>::Tile tile;
    float sum_sq = 0.0f;
    walk.first_pass(tile, [&](unsigned i, auto n) {
      const auto v = hk::load(xr + i, n);
#pragma unroll
      for (unsigned e = 0; e < n; ++e) sum_sq += hk::to_float(v.elem[e]) * hk::to_float(v.elem[e]);
      return v;
    });
    const float scale = hk::rsqrt(hk::block_sum(sum_sq) / static_cast<float>(cols) + eps);
    walk.pass(tile, xr, [&](unsigned i, auto n, const auto& v) {
      const auto w = hk::load(weight + i, n);
      hk::Pack<T, n> y;
#pragma unroll
      for (unsigned e = 0; e < n; ++e)
        y.elem[e] = hk::from_float<T>(hk::to_float(v.elem[e]) * scale * hk::to_float(w.elem[e]));
      hk::store(outr + i, y);
    });
  }
}

}  // namespace

#define HK_RMSNORM(name, T)                                                                  \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void rmsnorm_##name(                                   \
      T* out, const T* x, const T* weight, float eps, unsigned rows, unsigned cols) {        \
    rmsnorm<T>(out, x, weight, eps, rows, cols);                                             \
  }
HK_RMSNORM(bf16, hk::bf16)
HK_RMSNORM(f16, hk::f16)
HK_RMSNORM(f32, float)
