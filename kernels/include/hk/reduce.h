// hk/reduce.h: moving values between the lanes of a wave, and reductions (sum, max, min, or
// any associative and commutative operation) over a group of lanes, a wave or a whole block.
// Every function here must be reached by all threads of the wave (block for the block_* ones)
// together, outside divergent branches.
#pragma once

#include "device.h"
#include "math.h"

namespace hk {

// ---- Shuffles -------------------------------------------------------------------------------
// For any type whose size is a multiple of 4 bytes (float, int, a struct of two floats): each
// 4-byte word moves on its own.

namespace detail {
template <typename T> struct Words {
  static_assert(sizeof(T) % 4 == 0, "shuffles move whole 4-byte words");
  int w[sizeof(T) / 4];
};

// Applies move(word) to each 4-byte word of v.
template <typename T, typename Move> HK_DEVICE T move_words(T v, Move move) {
  auto words = __builtin_bit_cast(Words<T>, v);
#pragma unroll
  for (unsigned i = 0; i < sizeof(T) / 4; ++i) words.w[i] = move(words.w[i]);
  return __builtin_bit_cast(T, words);
}
}  // namespace detail

// The value of v in lane (lane_id() ^ mask), the butterfly step; mask < kWaveSize.
template <typename T> HK_DEVICE T wave_shfl_xor(T v, unsigned mask) {
  return detail::move_words(v, [mask](int w) {
#if HK_AMD
    return __builtin_amdgcn_ds_bpermute(static_cast<int>((lane_id() ^ mask) * 4), w);
#else
    return __nvvm_shfl_sync_bfly_i32(~0u, w, mask, 0x1f);
#endif
  });
}

// The value of v in lane `lane`, which must be the same for the whole wave.
template <typename T> HK_DEVICE T wave_broadcast(T v, unsigned lane) {
  return detail::move_words(v, [lane](int w) {
#if HK_AMD
    return __builtin_amdgcn_readlane(w, lane);
#else
    return __nvvm_shfl_sync_idx_i32(~0u, w, lane, 0x1f);
#endif
  });
}

// ---- Operations -----------------------------------------------------------------------------
// A reduction operation is a type with `T operator()(T, T) const` (associative and commutative)
// and `static T identity()`, the value that changes nothing. Each operation type gets its own
// shared scratch in the block reductions.
struct Sum {
  HK_DEVICE float operator()(float a, float b) const { return a + b; }
  HK_DEVICE static float identity() { return 0.0f; }
};
struct Max {
  HK_DEVICE float operator()(float a, float b) const { return max(a, b); }
  HK_DEVICE static float identity() { return -__builtin_inff(); }
};
struct Min {
  HK_DEVICE float operator()(float a, float b) const { return min(a, b); }
  HK_DEVICE static float identity() { return __builtin_inff(); }
};

// ---- Lane groups and waves ------------------------------------------------------------------
#if HK_AMD
namespace detail {
// v from another lane of the same row of 16 lanes, by a DPP pattern (no LDS traffic).
template <int kPattern, typename T> HK_DEVICE T dpp(T v) {
  return move_words(v, [](int w) { return __builtin_amdgcn_update_dpp(0, w, kPattern, 0xf, 0xf, false); });
}
inline constexpr int kDppSwapPairs = 0xb1;       // quad_perm [1,0,3,2]: lane ^ 1
inline constexpr int kDppSwapHalves = 0x4e;      // quad_perm [2,3,0,1]: lane ^ 2
inline constexpr int kDppHalfRowMirror = 0x141;  // lane 7 - i within each 8
inline constexpr int kDppRowMirror = 0x140;      // lane 15 - i within each 16
// ds_swizzle in bit mode: and-mask 0x1f, xor-mask 0x10, i.e. lane ^ 16 within each 32.
inline constexpr int kSwizzleXor16 = 0x1f | (0x10 << 10);
}  // namespace detail
#endif

// op over v of each aligned group of kLanes lanes (a power of two up to kWaveSize: lanes
// 0..kLanes-1, then the next kLanes, ...); every lane gets its group's result, bit-identical
// across the group.
template <unsigned kLanes, typename T, typename Op> HK_DEVICE T lanes_reduce(T v, Op op) {
  static_assert(kLanes >= 1 && kLanes <= kWaveSize && (kLanes & (kLanes - 1)) == 0,
                "a lane group is a power of two no larger than a wave");
#if HK_AMD
  // After the two quad swaps each group of 4 holds one value; the mirrors then meet the
  // partner group of 4 and of 8 (a mirror is not a xor, but it pairs whole groups, which is
  // all a reduction needs). 32-lane groups combine through a swizzle, and the two halves of the
  // wave by reading lanes 0 and 32 directly.
  if constexpr (kLanes >= 2) v = op(v, detail::dpp<detail::kDppSwapPairs>(v));
  if constexpr (kLanes >= 4) v = op(v, detail::dpp<detail::kDppSwapHalves>(v));
  if constexpr (kLanes >= 8) v = op(v, detail::dpp<detail::kDppHalfRowMirror>(v));
  if constexpr (kLanes >= 16) v = op(v, detail::dpp<detail::kDppRowMirror>(v));
  if constexpr (kLanes >= 32)
    v = op(v, detail::move_words(v, [](int w) { return __builtin_amdgcn_ds_swizzle(w, detail::kSwizzleXor16); }));
  if constexpr (kLanes >= 64) v = op(wave_broadcast(v, 0), wave_broadcast(v, 32));
#else
#pragma unroll
  for (unsigned mask = kLanes / 2; mask > 0; mask /= 2) v = op(v, wave_shfl_xor(v, mask));
#endif
  return v;
}

// op over v of every lane of the wave; every lane gets the result.
template <typename T, typename Op> HK_DEVICE T wave_reduce(T v, Op op) {
  return lanes_reduce<kWaveSize>(v, op);
}

HK_DEVICE float wave_sum(float v) { return wave_reduce(v, Sum{}); }
HK_DEVICE float wave_max(float v) { return wave_reduce(v, Max{}); }
HK_DEVICE float wave_min(float v) { return wave_reduce(v, Min{}); }

// ---- Blocks ---------------------------------------------------------------------------------
// For one-dimensional blocks whose size is a multiple of kWaveSize; every thread gets the
// result.

namespace detail {
// A reduction over the waves [first, first + count) of the block, which every wave of the block
// makes at once (each for its own range), through shared slot `slot` (0 or 1) of the scratch of
// (T, Op). One barrier: the caller must not reuse a slot before another barrier has passed.
template <typename T, typename Op>
HK_DEVICE T waves_reduce_in(T v, Op op, unsigned slot, unsigned first, unsigned count) {
  __shared__ T partial[2][kMaxWaves];
  v = wave_reduce(v, op);
  if (lane_id() == 0) partial[slot][wave_id()] = v;
  block_sync();
  // Every wave reduces the partials of its range itself, which saves a broadcast round.
  return wave_reduce(lane_id() < count ? partial[slot][first + lane_id()] : Op::identity(), op);
}
}  // namespace detail

// op over v of every thread of the block. Two barriers; safe to call again right away.
template <typename T, typename Op> HK_DEVICE T block_reduce(T v, Op op) {
  v = detail::waves_reduce_in(v, op, 0, 0, block_dim_x() / kWaveSize);
  block_sync();  // the next call may overwrite the scratch only after everyone has read it
  return v;
}

HK_DEVICE float block_sum(float v) { return block_reduce(v, Sum{}); }
HK_DEVICE float block_max(float v) { return block_reduce(v, Max{}); }
HK_DEVICE float block_min(float v) { return block_reduce(v, Min{}); }

// Block reductions in a sequence at one barrier each (instead of two): consecutive calls
// alternate between two scratch slots, so a slot is written again only after the barrier of
// the call in between, which every thread reaches after reading it. Every thread of the block
// must make the same sequence of calls on its own BlockReducer (one for the whole kernel).
class BlockReducer {
 public:
  // op over v of every thread of the block.
  template <typename T, typename Op> HK_DEVICE T reduce(T v, Op op) {
    return reduce_waves(v, op, 0, block_dim_x() / kWaveSize);
  }
  HK_DEVICE float sum(float v) { return reduce(v, Sum{}); }
  HK_DEVICE float max(float v) { return reduce(v, Max{}); }

  // op over v of the waves [first, first + count) of the block: the block split into teams of
  // whole waves, each reducing over itself (every wave still takes part in the call).
  template <typename T, typename Op>
  HK_DEVICE T reduce_waves(T v, Op op, unsigned first, unsigned count) {
    slot_ ^= 1;
    return detail::waves_reduce_in(v, op, slot_, first, count);
  }

 private:
  unsigned slot_ = 0;
};

}  // namespace hk
