// Softmax over the last dimension of a row-major [rows, cols] tensor, for any cols:
//   out[r, i] = exp(x[r, i] - max_r) / sum_j exp(x[r, j] - max_r)
// in f32, each output rounded once to the element type. The first pass keeps a running
// maximum and a sum rescaled whenever the maximum grows (so the row is read once to get both,
// and one team reduction merges them);
// the second pass writes the outputs, from registers when the row fits there (up to 8192
// bf16/f16 or 4096 f32 elements), else reading the row again. A row of all -inf gives NaN,
// as in PyTorch.
//
// Symbols: softmax_{bf16,f16,f32}(out, x, rows, cols)
// Launch: 256 threads per block, each row taken by a team of L lanes, L the smallest power of
// two from 8 to 256 with L * 64 >= cols * sizeof(T) (each lane holds at most four 16-byte
// vectors of the row); grid = ceil(rows / (256 / L)). Any grid is correct (teams walk the rows
// with a grid stride); another one only costs speed.
#include "hk/hk.h"
#include "hk/walk.h"

namespace {

constexpr unsigned kBlock = 256;
// At least 3 blocks per SM: at most 85 registers a thread (see rmsnorm.hip).
constexpr unsigned kMinBlocks = 3;

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

template <typename T>
HK_DEVICE void softmax(T* __restrict__ out, const T* __restrict__ x, unsigned rows, unsigned cols) {
  hk::for_each_row<T, kBlock>(rows, cols, hk::aligned16(out, x), [&](auto& walk, unsigned r) {
    const T* xr = x + hk::row_offset(r, cols);
    T* outr = out + hk::row_offset(r, cols);
    ExpSum partial = MergeExpSums::identity();
    walk.first_pass([&](unsigned i, auto n) {
      const auto v = hk::load(xr + i, n);
      partial = add(partial, v);
      return v;
    });
    // A row of all -inf gives max = -inf, sum = 0 and so NaN outputs, as PyTorch does.
    const ExpSum row = walk.reduce(partial, MergeExpSums{});
    const float inv_sum = 1.0f / row.sum;
    // exp(v - max) as 2^(v log2(e) - max log2(e)): one fma before the exp2.
    const float shift = row.max * hk::kLog2e;
    walk.pass(xr, [&](unsigned i, auto n, const auto& v) {
      hk::Pack<T, n> y;
#pragma unroll
      for (unsigned e = 0; e < n; ++e)
        y.elem[e] = hk::from_float<T>(hk::exp2(hk::fma(hk::to_float(v.elem[e]), hk::kLog2e, -shift)) * inv_sum);
      hk::store(outr + i, y);
    });
  });
}

}  // namespace

#define HK_SOFTMAX(name, T)                                                                   \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, kMinBlocks) void softmax_##name(T* out, const T* x, unsigned rows,  \
                                                         unsigned cols) {                    \
    softmax<T>(out, x, rows, cols);                                                           \
  }
HK_SOFTMAX(bf16, hk::bf16)
HK_SOFTMAX(f16, hk::f16)
HK_SOFTMAX(f32, float)
