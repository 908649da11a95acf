// Quantization of bf16 activations to FP8 (F = fp8_e4m3fn, the OCP format of gfx950 and sm_90,
// or fp8_e4m3fnuz, the FNUZ format of gfx942), with f32 scales such that x ≈ q · scale:
//
//   quant_fp8_per_tensor_F_bf16(out, x, scale, n)          q = F(x / scale[0]), a given scale
//   quant_fp8_per_token_F_bf16(out, scales, x, rows, cols)  per row: scale = amax / F_MAX
//   quant_fp8_block_F_bf16(out, scales, x, rows, cols)      per 1 x 128 group of a row (the
//       DeepSeek-V3 activation layout, scales [rows, ceil(cols / 128)]; a last partial group
//       is scaled by its own amax)
//   rmsnorm_quant_fp8_F_bf16(out, scales, x, weight, eps, rows, cols)
//       y = bf16(x · rsqrt(mean(x²) + eps) · weight), as rmsnorm_bf16 writes it, then
//       quantized per token as above: the two kernels in one pass over memory
//
// amax is the largest |x| of the row or group (exact), scale = amax / F_MAX (448 or 240) in
// f32, or 1 for an all-zero row, and q = F(x / scale) with an IEEE division and hk/fp8.h's
// conversion (nearest even, saturating): so the per-token and block kernels are exact, bit for
// bit, against a host doing the same f32 operations.
//
// Launch: the contracts in manifests/quant_fp8.toml: the row kernels walk rows as
// kernels/rmsnorm.hip does (hk::for_each_row); the block kernel gives each group 16 lanes of 8
// elements; the per-tensor kernel walks the array with a grid stride (any grid is correct).
#include "hk/fp8.h"
#include "hk/hk.h"
#include "hk/walk.h"

namespace {

constexpr unsigned kBlock = 256;
constexpr unsigned kMinBlocks = 4;  // as rmsnorm's: 64 registers a thread on sm_90
// The fused kernel holds the row, its weights and the RMS scale across three passes: under 64
// registers it spilled 26 bytes on sm_90; 2 blocks (128 registers) hold it.
constexpr unsigned kFusedMinBlocks = 2;
constexpr unsigned kGroup = 128;    // a block-scale group's columns
constexpr unsigned kGroupLanes = 16, kGroupPerLane = kGroup / kGroupLanes;

template <typename Q> HK_DEVICE float scale_of(float amax) {
  return amax > 0.0f ? amax / hk::Fp8Traits<Q>::kMax : 1.0f;
}

template <typename Q, typename T, unsigned N>
HK_DEVICE void write_quantized(Q* out, float scale, const hk::Pack<T, N>& v) {
#pragma unroll
  for (unsigned e = 0; e < N; ++e) out[e] = hk::from_float<Q>(hk::to_float(v.elem[e]) / scale);
}

template <typename T, unsigned N> HK_DEVICE float pack_amax(const hk::Pack<T, N>& v) {
  float m = 0.0f;
#pragma unroll
  for (unsigned e = 0; e < N; ++e) m = hk::max(m, hk::abs(hk::to_float(v.elem[e])));
  return m;
}

template <typename Q, typename T>
HK_DEVICE void quant_per_tensor(Q* __restrict__ out, const T* __restrict__ x,
                                const float* __restrict__ scale, unsigned long long n) {
  const float s = *scale;
  hk::for_each_pack<T>(n, hk::aligned16(x), [&](unsigned long long i, auto w) {
    write_quantized(out + i, s, hk::load(x + i, w));
  });
}

template <typename Q, typename T>
HK_DEVICE void quant_per_token(Q* __restrict__ out, float* __restrict__ scales,
                               const T* __restrict__ x, unsigned rows, unsigned cols) {
  hk::for_each_row<T, kBlock>(rows, cols, hk::aligned16(x), [&](auto& walk, unsigned r) {
    const T* xr = x + hk::row_offset(r, cols);
    Q* outr = out + hk::row_offset(r, cols);
    float amax = 0.0f;
    walk.first_pass([&](unsigned i, auto n) { return hk::load(xr + i, n); },
                    [&](unsigned, auto, const auto& v) {
                      amax = hk::max(amax, pack_amax(v));
                      return v;
                    });
    const float scale = scale_of<Q>(walk.max(amax));
    walk.pass(xr, [&](unsigned i, auto, const auto& v) { write_quantized(outr + i, scale, v); });
    if (r < rows && walk.team().rank() == 0) scales[r] = scale;
  });
}

// y = bf16(x · rms · weight) for a pack, as rmsnorm_bf16 computes it.
template <typename T, unsigned N>
HK_DEVICE hk::Pack<T, N> normed(float rms, const hk::Pack<T, N>& v, const hk::Pack<T, N>& w) {
  hk::Pack<T, N> y;
#pragma unroll
  for (unsigned e = 0; e < N; ++e)
    y.elem[e] = hk::from_float<T>(hk::to_float(v.elem[e]) * rms * hk::to_float(w.elem[e]));
  return y;
}

template <typename Q, typename T>
HK_DEVICE void rmsnorm_quant(Q* __restrict__ out, float* __restrict__ scales,
                             const T* __restrict__ x, const T* __restrict__ weight, float eps,
                             unsigned rows, unsigned cols) {
  hk::for_each_row<T, kBlock, 1>(rows, cols, hk::aligned16(x, weight), [&](auto& walk, unsigned r) {
    const T* xr = x + hk::row_offset(r, cols);
    Q* outr = out + hk::row_offset(r, cols);
    float sum_sq = 0.0f;
    walk.first_pass([&](unsigned i, auto n) { return hk::load(xr + i, n); },
                    [&](unsigned, auto n, const auto& v) {
#pragma unroll
                      for (unsigned e = 0; e < n; ++e) sum_sq += hk::to_float(v.elem[e]) * hk::to_float(v.elem[e]);
                      return v;
                    },
                    weight);
    const float rms = hk::rsqrt(walk.sum(sum_sq) / static_cast<float>(cols) + eps);
    float amax = 0.0f;
    walk.pass(xr, [&](unsigned, auto, const auto& v, const auto& w) {
      amax = hk::max(amax, pack_amax(normed(rms, v, w)));
    }, weight);
    const float scale = scale_of<Q>(walk.max(amax));
    walk.pass(xr, [&](unsigned i, auto, const auto& v, const auto& w) {
      write_quantized(outr + i, scale, normed(rms, v, w));
    }, weight);
    if (r < rows && walk.team().rank() == 0) scales[r] = scale;
  });
}

// Each group of 128 columns of a row takes 16 consecutive lanes, 8 columns each; lane groups
// stride over the groups (64-bit: rows x groups a row may pass 2^32), so any grid is correct.
template <typename Q, typename T>
HK_DEVICE void quant_block(Q* __restrict__ out, float* __restrict__ scales,
                           const T* __restrict__ x, unsigned rows, unsigned cols) {
  const unsigned groups_per_row = (cols + kGroup - 1) / kGroup;
  const unsigned long long groups = static_cast<unsigned long long>(rows) * groups_per_row;
  const unsigned long long stride =
      static_cast<unsigned long long>(hk::grid_dim_x()) * (kBlock / kGroupLanes);
  // The block's first group, and how often its lane groups go round: all the same number of
  // times (a lane group past the last group idles), so that every lane of a lane group reduces.
  const unsigned long long block_first =
      static_cast<unsigned long long>(hk::block_idx_x()) * (kBlock / kGroupLanes);
  const unsigned long long rounds = groups > block_first ? (groups - block_first + stride - 1) / stride : 0;
  unsigned long long group = block_first + hk::thread_idx_x() / kGroupLanes;
  for (unsigned long long round = 0; round < rounds; ++round, group += stride) {
    const bool live = group < groups;
    const unsigned row = live ? static_cast<unsigned>(group / groups_per_row) : 0;
    const unsigned col0 = (live ? static_cast<unsigned>(group % groups_per_row) : 0) * kGroup +
                          hk::thread_idx_x() % kGroupLanes * kGroupPerLane;
    const T* xr = x + hk::row_offset(row, cols);
    float v[kGroupPerLane];
    float amax = 0.0f;
#pragma unroll
    for (unsigned e = 0; e < kGroupPerLane; ++e) {
      v[e] = live && col0 + e < cols ? hk::to_float(xr[col0 + e]) : 0.0f;
      amax = hk::max(amax, hk::abs(v[e]));
    }
    const float scale = scale_of<Q>(hk::lanes_reduce<kGroupLanes>(amax, hk::Max{}));
    if (!live) continue;
    Q* outr = out + hk::row_offset(row, cols);
#pragma unroll
    for (unsigned e = 0; e < kGroupPerLane; ++e)
      if (col0 + e < cols) outr[col0 + e] = hk::from_float<Q>(v[e] / scale);
    if (hk::thread_idx_x() % kGroupLanes == 0)
      scales[static_cast<unsigned long long>(row) * groups_per_row + col0 / kGroup] = scale;
  }
}

}  // namespace

#define HK_QUANT_FP8(F)                                                                       \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void quant_fp8_per_tensor_##F##_bf16(                    \
      hk::F* out, const hk::bf16* x, const float* scale, unsigned long long n) {              \
    quant_per_tensor(out, x, scale, n);                                                       \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kMinBlocks) void quant_fp8_per_token_##F##_bf16( \
      hk::F* out, float* scales, const hk::bf16* x, unsigned rows, unsigned cols) {           \
    quant_per_token(out, scales, x, rows, cols);                                              \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void quant_fp8_block_##F##_bf16(                         \
      hk::F* out, float* scales, const hk::bf16* x, unsigned rows, unsigned cols) {           \
    quant_block(out, scales, x, rows, cols);                                                  \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kFusedMinBlocks) void rmsnorm_quant_fp8_##F##_bf16( \
      hk::F* out, float* scales, const hk::bf16* x, const hk::bf16* weight, float eps,        \
      unsigned rows, unsigned cols) {                                                         \
    rmsnorm_quant(out, scales, x, weight, eps, rows, cols);                                   \
  }
HK_QUANT_FP8(fp8_e4m3fn)
HK_QUANT_FP8(fp8_e4m3fnuz)
