// hk/reduce.h: moving values between the lanes of a wave, and sums and maxima over a wave or a
// whole block. Every function here must be reached by all threads of the wave (block for the
// block_* ones) together, outside divergent branches.
#pragma once

#include "device.h"
#include "math.h"

namespace hk {

// ---- Shuffles -------------------------------------------------------------------------------
// For any 4-byte type (float, int, unsigned).

// The value of v in lane (lane_id() ^ mask), the butterfly step; mask < kWaveSize.
template <typename T> HK_DEVICE T wave_shfl_xor(T v, unsigned mask) {
  static_assert(sizeof(T) == 4, "shuffles move 4-byte values");
#if HK_AMD
  const int bits = __builtin_amdgcn_ds_bpermute(static_cast<int>((lane_id() ^ mask) * 4),
                                                __builtin_bit_cast(int, v));
#else
  const int bits = __nvvm_shfl_sync_bfly_i32(~0u, __builtin_bit_cast(int, v), mask, 0x1f);
#endif
  return __builtin_bit_cast(T, bits);
}

// The value of v in lane `lane`, which must be the same for the whole wave.
template <typename T> HK_DEVICE T wave_broadcast(T v, unsigned lane) {
  static_assert(sizeof(T) == 4, "shuffles move 4-byte values");
#if HK_AMD
  const int bits = __builtin_amdgcn_readlane(__builtin_bit_cast(int, v), lane);
#else
  const int bits = __nvvm_shfl_sync_idx_i32(~0u, __builtin_bit_cast(int, v), lane, 0x1f);
#endif
  return __builtin_bit_cast(T, bits);
}

// ---- Reductions -----------------------------------------------------------------------------
// The operations, as types so that each block reduction gets its own shared scratch.
struct Sum {
  HK_DEVICE float operator()(float a, float b) const { return a + b; }
  static constexpr float kIdentity = 0.0f;
};
struct Max {
  HK_DEVICE float operator()(float a, float b) const { return max(a, b); }
  static constexpr float kIdentity = -__builtin_inff();
};
struct Min {
  HK_DEVICE float operator()(float a, float b) const { return min(a, b); }
  static constexpr float kIdentity = __builtin_inff();
};

#if HK_AMD
namespace detail {
// v from another lane of the same row of 16 lanes, by a DPP pattern (no LDS traffic).
template <int Pattern> HK_DEVICE float dpp(float v) {
  return __builtin_bit_cast(
      float, __builtin_amdgcn_update_dpp(0, __builtin_bit_cast(int, v), Pattern, 0xf, 0xf, false));
}
inline constexpr int kDppSwapPairs = 0xb1;     // quad_perm [1,0,3,2]: lane ^ 1
inline constexpr int kDppSwapHalves = 0x4e;    // quad_perm [2,3,0,1]: lane ^ 2
inline constexpr int kDppHalfRowMirror = 0x141;  // lane 7 - i within each 8
inline constexpr int kDppRowMirror = 0x140;      // lane 15 - i within each 16
// ds_swizzle in bit mode: and-mask 0x1f, xor-mask 0x10, i.e. lane ^ 16 within each 32.
inline constexpr int kSwizzleXor16 = 0x1f | (0x10 << 10);
}  // namespace detail
#endif

// op over v of every lane of the wave; every lane gets the result (bit-identical in all lanes).
template <typename Op> HK_DEVICE float wave_reduce(float v, Op op) {
#if HK_AMD
  // After the two quad swaps each group of 4 holds one value; the mirrors then pair groups of 4
  // and 8 (a mirror is not a xor, but it meets the partner group, which is all a reduction
  // needs). Rows of 16 combine through a swizzle, and the two halves of the wave by reading
  // lanes 0 and 32 directly.
  v = op(v, detail::dpp<detail::kDppSwapPairs>(v));
  v = op(v, detail::dpp<detail::kDppSwapHalves>(v));
  v = op(v, detail::dpp<detail::kDppHalfRowMirror>(v));
  v = op(v, detail::dpp<detail::kDppRowMirror>(v));
  v = op(v, __builtin_bit_cast(float, __builtin_amdgcn_ds_swizzle(__builtin_bit_cast(int, v),
                                                                   detail::kSwizzleXor16)));
  return op(wave_broadcast(v, 0), wave_broadcast(v, 32));
#else
  for (unsigned mask = kWaveSize / 2; mask > 0; mask /= 2) v = op(v, wave_shfl_xor(v, mask));
  return v;
#endif
}

HK_DEVICE float wave_sum(float v) { return wave_reduce(v, Sum{}); }
HK_DEVICE float wave_max(float v) { return wave_reduce(v, Max{}); }
HK_DEVICE float wave_min(float v) { return wave_reduce(v, Min{}); }

// op over v of every thread of a one-dimensional block whose size is a multiple of kWaveSize;
// every thread gets the result. Costs two barriers; safe to call again right away.
template <typename Op> HK_DEVICE float block_reduce(float v, Op op) {
  __shared__ float partial[kMaxWaves];
  v = wave_reduce(v, op);
  if (lane_id() == 0) partial[wave_id()] = v;
  block_sync();
  // Every wave reduces the per-wave partials itself, which saves a broadcast round.
  const unsigned waves = block_dim_x() / kWaveSize;
  v = wave_reduce(lane_id() < waves ? partial[lane_id()] : Op::kIdentity, op);
  block_sync();  // the next call may overwrite `partial` only after everyone has read it
  return v;
}

HK_DEVICE float block_sum(float v) { return block_reduce(v, Sum{}); }
HK_DEVICE float block_max(float v) { return block_reduce(v, Max{}); }
HK_DEVICE float block_min(float v) { return block_reduce(v, Min{}); }

}  // namespace hk
