// LayerNorm over the last dimension of a row-major [rows, cols] tensor, in f32, each output
// rounded once to the element type:
//
//   layernorm:           out[r, i] = (x[r, i] - mean) * rsqrt(var + eps) * weight[i] + bias[i]
//                        with mean and the biased var (divided by cols) of row r
//   fused_add_layernorm: residual[r, i] <- T(x[r, i] + residual[r, i])   (updated in place)
//                        out[r, i] = layernorm(residual)[r, i], computed from the updated
//                        residual exactly as stored in T (out may be x).
//
// Mean and variance come from one pass: each 16-byte pack's own mean and sum of squared
// deviations, merged pack by pack and then across the team in one reduction (Chan's pairwise
// update), never from E[x^2] - mean^2, which cancels badly when |mean| >> std.
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
// The residual-add kernels need more registers (see rmsnorm.hip): 3 blocks everywhere.
constexpr unsigned kFusedMinBlocks = 3;

// The count, mean and sum of squared deviations from the mean (M2) of some values.
// (No default member values: block reductions keep these in shared memory, which cannot run
// constructors.)
struct Moments {
  float count;
  float mean;
  float m2;
};

// Merges the moments of two disjoint sets of values (Chan, Golub and LeVeque's pairwise
// update), a team reduction operation. Deviations are only ever taken from a mean, so rows
// with |mean| >> std keep their digits (E[x^2] - mean^2 would not).
struct MergeMoments {
  HK_DEVICE Moments operator()(Moments a, Moments b) const {
    // Every lane of a team must get the same bits whatever side each operand comes from, so
    // the two are put in one order first: the larger set (then the larger mean) is `a`.
    if (b.count > a.count || (b.count == a.count && b.mean > a.mean)) {
      const Moments t = a;
      a = b;
      b = t;
    }
    // An empty set changes nothing (and its mean, 0, must not enter delta^2 below).
    if (b.count == 0.0f) return a;
    const float count = a.count + b.count;
    const float delta = b.mean - a.mean;
    const float share = b.count * hk::rcp(count);
    return {count, hk::fma(delta, share, a.mean), a.m2 + b.m2 + delta * delta * a.count * share};
  }
  HK_DEVICE static Moments identity() { return {0.0f, 0.0f, 0.0f}; }
};

// T(x + residual) for the pack of n elements at x and residual.
template <typename T, unsigned N>
HK_DEVICE hk::Pack<T, N> residual_add(const T* x, const T* residual, hk::Width<N> n) {
  const auto a = hk::load(x, n);
  const auto b = hk::load(residual, n);
  hk::Pack<T, N> sum;
#pragma unroll
  for (unsigned e = 0; e < N; ++e)
    sum.elem[e] = hk::from_float<T>(hk::to_float(a.elem[e]) + hk::to_float(b.elem[e]));
  return sum;
}

// The moments of one pack, merged into a lane's running moments.
template <typename T, unsigned N> HK_DEVICE Moments add(Moments acc, const hk::Pack<T, N>& v) {
  float sum = 0.0f;
#pragma unroll
  for (unsigned e = 0; e < N; ++e) sum += hk::to_float(v.elem[e]);
  const float mean = sum * (1.0f / N);
  float m2 = 0.0f;
#pragma unroll
  for (unsigned e = 0; e < N; ++e) {
    const float d = hk::to_float(v.elem[e]) - mean;
    m2 += d * d;
  }
  return MergeMoments{}(acc, {static_cast<float>(N), mean, m2});
}

// The statistics of a row from the moments of each lane's part (one team reduction), and the
// output pass: out = (v - mean) * rstd * weight + bias.
template <typename T, typename Walk>
HK_DEVICE void normalize(Walk& walk, const T* values, Moments lane, T* out, const T* weight,
                         const T* bias, float eps, unsigned cols) {
  const Moments row = walk.reduce(lane, MergeMoments{});
  const float mean = row.mean;
  const float rstd = hk::rsqrt(row.m2 / static_cast<float>(cols) + eps);
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
    Moments lane = MergeMoments::identity();
    walk.first_pass([&](unsigned i, auto n) { return hk::load(xr + i, n); },
                    [&](unsigned, auto, const auto& v) {
                      lane = add(lane, v);
                      return v;
                    });
    normalize(walk, xr, lane, out + hk::row_offset(r, cols), weight, bias, eps, cols);
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
    Moments lane = MergeMoments::identity();
    walk.first_pass([&](unsigned i, auto n) { return residual_add(xr + i, resr + i, n); },
                    [&](unsigned i, auto, const auto& sum) {
                      hk::store(resr + i, sum);
                      lane = add(lane, sum);
                      return sum;
                    });
    normalize(walk, resr, lane, out + hk::row_offset(r, cols), weight, bias, eps, cols);
  });
}

}  // namespace

#define HK_LAYERNORM(name, T)                                                                 \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kMinBlocks)                                   \
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
