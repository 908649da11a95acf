// hk/vote.h: what selection and compaction kernels (top-k) need beyond hk/reduce.h: wave votes
// as 64-bit lane masks, a lane's rank among the lanes that voted yes, a wave-level barrier for
// shared memory, relaxed shared-memory counters, and an inclusive prefix sum of unsigned
// integers over a wave. Like hk/reduce.h, every wave_* function must be reached by the whole
// wave together, outside divergent branches.
#pragma once

#include "device.h"

namespace hk {

// One bit per lane (bit i for lane i); NVIDIA uses the low 32 bits.
using LaneMask = unsigned long long;

// The lanes whose `vote` is true.
HK_DEVICE LaneMask wave_ballot(bool vote) {
#if HK_AMD
  return __builtin_amdgcn_ballot_w64(vote);
#else
  return __nvvm_vote_ballot_sync(~0u, vote);
#endif
}

// How many lanes below this one are in `lanes`: a voting lane's slot among the yes votes.
HK_DEVICE unsigned lanes_below(LaneMask lanes) {
#if HK_AMD
  return __builtin_amdgcn_mbcnt_hi(static_cast<unsigned>(lanes >> 32),
                                   __builtin_amdgcn_mbcnt_lo(static_cast<unsigned>(lanes), 0u));
#else
  return __builtin_popcount(static_cast<unsigned>(lanes) & __nvvm_read_ptx_sreg_lanemask_lt());
#endif
}

// How many lanes are in `lanes`.
HK_DEVICE unsigned lane_count(LaneMask lanes) { return __builtin_popcountll(lanes); }

// The lowest lane in `lanes`, which must not be empty.
HK_DEVICE unsigned first_lane(LaneMask lanes) { return __builtin_ctzll(lanes); }

// Shared-memory writes any lane of the wave made before are visible to every lane after.
HK_DEVICE void wave_sync() {
#if HK_AMD
  // A wave's LDS accesses complete in order; the fences only keep the compiler from moving
  // loads and stores across this point.
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  __nvvm_bar_warp_sync(~0u);
#endif
}

// Adds `v` to a shared-memory counter and returns its previous value. Relaxed: order it
// with a barrier.
HK_DEVICE unsigned shared_fetch_add(unsigned* counter, unsigned v) {
  return __atomic_fetch_add(counter, v, __ATOMIC_RELAXED);
}

// v of lane (lane_id() - delta); lanes below delta get their own v.
HK_DEVICE unsigned wave_shfl_up(unsigned v, unsigned delta) {
#if HK_AMD
  const unsigned lane = lane_id();
  const unsigned src = lane >= delta ? lane - delta : lane;
  return static_cast<unsigned>(__builtin_amdgcn_ds_bpermute(static_cast<int>(src * 4), static_cast<int>(v)));
#else
  return static_cast<unsigned>(__nvvm_shfl_sync_up_i32(~0u, static_cast<int>(v), delta, 0));
#endif
}

// The sum of v over this lane and every lane below it.
HK_DEVICE unsigned wave_inclusive_sum(unsigned v) {
  const unsigned lane = lane_id();
#pragma unroll
  for (unsigned delta = 1; delta < kWaveSize; delta *= 2) {
    const unsigned below = wave_shfl_up(v, delta);
    if (lane >= delta) v += below;
  }
  return v;
}

}  // namespace hk
