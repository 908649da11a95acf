// Softmax over the last dimension of a row-major [rows, cols] tensor, for any cols:
//   out[r, i] = exp(x[r, i] - max_r) / sum_j exp(x[r, j] - max_r)
// in f32, each output rounded once to the element type. A row that fits in registers (up to
// 8192 bf16/f16 or 4096 f32 elements, 16-byte aligned) is loaded once; its maximum, then its
// sum of exps, are taken from registers at one team reduction each, and the outputs written
// from registers. A longer (or unaligned, or odd-sized) row is read twice: the first pass
// keeps a running maximum and a sum rescaled whenever the maximum grows (one team reduction
// merges them), the second writes the outputs. A row of all -inf gives NaN, as in PyTorch.
//
// Symbols: softmax_{bf16,f16,f32}(out, x, rows, cols)
// Launch: the contract in manifests/softmax.toml, the teams of hk::for_each_row (hk/walk.h)
// with kBlock = 256.
#include "hk/hk.h"
#include "hk/walk.h"

namespace {

constexpr unsigned kBlock = 256;
// At least 5 blocks per SM: at most 48 registers a thread (see rmsnorm.hip), which the 16-bit
// forms hold without spills on every target. On the H100, against 4 blocks, this took 65536
// rows of 128 from 15.2 to 14.6 µs; 4096 rows of 8192 went from 49.8-50.4 to 50.2-50.7 µs over
// four runs each, and the other benchmark shapes stayed within run-to-run noise. The f32 form
// spills 8 bytes there on sm_90 and takes 4 blocks (64 registers).
template <typename T> constexpr unsigned kMinBlocks = sizeof(T) == 4 ? 4 : 5;

// The sum of exp(v - max) over some values, with their maximum. (No default member values:
// block reductions keep these in shared memory, which cannot run constructors.)
struct ExpSum {
  float max;
  float sum;
};

constexpr float kNegInf = -__builtin_inff();

// Merges two partial sums by rescaling both to the larger maximum; a team reduction operation.
struct MergeExpSums {
  HK_DEVICE ExpSum operator()(ExpSum a, ExpSum b) const {
    const float max = hk::max(a.max, b.max);
    // Both empty (or all -inf so far): exp(-inf - -inf) would make the sum NaN.
    if (max == kNegInf) return {kNegInf, 0.0f};
    return {max, a.sum * hk::exp(a.max - max) + b.sum * hk::exp(b.max - max)};
  }
  HK_DEVICE static ExpSum identity() { return {kNegInf, 0.0f}; }
};

// Adds a pack of values to a running sum, rescaling it once if the pack raises the maximum.
template <typename T, unsigned N> HK_DEVICE ExpSum add(ExpSum acc, const hk::Pack<T, N>& v) {
  float pack_max = hk::to_float(v.elem[0]);
#pragma unroll
  for (unsigned e = 1; e < N; ++e) pack_max = hk::max(pack_max, hk::to_float(v.elem[e]));
  const float max = hk::max(acc.max, pack_max);
  if (max == kNegInf) return acc;  // a masked stretch: nothing to add yet
  // exp(-inf - finite) is 0, so the first finite pack needs no special case.
  float sum = acc.sum * hk::exp(acc.max - max);
  const float shift = max * hk::kLog2e;
#pragma unroll
  for (unsigned e = 0; e < N; ++e) sum += hk::exp2(hk::fma(hk::to_float(v.elem[e]), hk::kLog2e, -shift));
  return {max, sum};
}

// exp(v - max) as 2^(v log2(e) - max log2(e)), with shift = max log2(e): one fma before the
// exp2.
HK_DEVICE float exp_shifted(float v, float shift) { return hk::exp2(hk::fma(v, hk::kLog2e, -shift)); }

// Writes out = exp(v - max) / sum for the pack of values v at column i.
template <typename T, unsigned N>
HK_DEVICE void write_probabilities(T* out, unsigned i, float shift, float inv_sum,
                                   const hk::Pack<T, N>& v) {
  hk::Pack<T, N> y;
#pragma unroll
  for (unsigned e = 0; e < N; ++e)
    y.elem[e] = hk::from_float<T>(exp_shifted(hk::to_float(v.elem[e]), shift) * inv_sum);
  hk::store(out + i, y);
}

template <typename T>
HK_DEVICE void softmax(T* __restrict__ out, const T* __restrict__ x, unsigned rows, unsigned cols) {
  hk::for_each_row<T, kBlock>(rows, cols, hk::aligned16(out, x), [&](auto& walk, unsigned r) {
    const T* xr = x + hk::row_offset(r, cols);
    T* outr = out + hk::row_offset(r, cols);
    // A row of all -inf gives max = -inf and NaN outputs (the shift is -inf, and -inf - -inf is
    // NaN), as PyTorch does.
    if (walk.resident()) {
      // The row is in registers: its maximum first (no exp), then the sum of exps, at one team
      // reduction each; no rescaling at all.
      float lane_max = kNegInf;
      walk.first_pass([&](unsigned i, auto n) { return hk::load(xr + i, n); },
                      [&](unsigned, auto n, const auto& v) {
#pragma unroll
                        for (unsigned e = 0; e < n; ++e) lane_max = hk::max(lane_max, hk::to_float(v.elem[e]));
                        return v;
                      });
      const float shift = walk.max(lane_max) * hk::kLog2e;
      float lane_sum = 0.0f;
      walk.pass(xr, [&](unsigned, auto n, const auto& v) {
#pragma unroll
        for (unsigned e = 0; e < n; ++e) lane_sum += exp_shifted(hk::to_float(v.elem[e]), shift);
      });
      const float inv_sum = 1.0f / walk.sum(lane_sum);
      walk.pass(xr, [&](unsigned i, auto, const auto& v) { write_probabilities(outr, i, shift, inv_sum, v); });
    } else {
      // The row is read from memory again for the output: one pass gets both the maximum and
      // the sum, rescaling the sum whenever the maximum grows.
      ExpSum partial = MergeExpSums::identity();
      walk.first_pass([&](unsigned i, auto n) { return hk::load(xr + i, n); },
                      [&](unsigned, auto, const auto& v) {
                        partial = add(partial, v);
                        return v;
                      });
      const ExpSum row = walk.reduce(partial, MergeExpSums{});
      const float inv_sum = 1.0f / row.sum;
      const float shift = row.max * hk::kLog2e;
      walk.pass(xr, [&](unsigned i, auto, const auto& v) { write_probabilities(outr, i, shift, inv_sum, v); });
    }
  });
}

}  // namespace

#define HK_SOFTMAX(name, T)                                                                   \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kMinBlocks<T>)                                \
  void softmax_##name(T* out, const T* x, unsigned rows, unsigned cols) {                     \
    softmax<T>(out, x, rows, cols);                                                           \
  }
HK_SOFTMAX(bf16, hk::bf16)
HK_SOFTMAX(f16, hk::f16)
HK_SOFTMAX(f32, float)
