// hk/tile/pingpong.h: CDNA's 8-wave ping-pong schedule, for a block of 8 waves (2 a SIMD).
//
// The block's waves form two groups of four, waves 0-3 and 4-7; the hardware deals a block's
// waves to the CU's 4 SIMDs in turn, so each SIMD holds one wave of each group. A wave's work is
// cut into clusters that alternate: a matrix cluster (MFMAs whose operands are already in
// registers) and a memory cluster (global loads, LDS reads and writes, VALU such as the
// softmax). Every cluster ends at a block barrier, and the second group starts one cluster late
// (one extra barrier first), so in every phase between two barriers one group multiplies while
// the other loads: each SIMD's matrix unit is fed by one of its two waves while the other hides
// its latency. The wave in its matrix cluster runs at raised priority (s_setprio), so that its
// MFMAs issue ahead of the other wave's memory and VALU instructions, and scheduling barriers keep
// the compiler from mixing the clusters across the phase boundaries.
//
// The barriers keep the groups in lock-step and are the LDS fences as well: what a wave writes to
// LDS in one phase is visible to every wave from the next phase on. Both groups must pass the
// same number of phases (the same trip counts), and every wave calls start() before its first
// phase and finish() after its last, which balance the offset.
#pragma once

#include "../device.h"

namespace hk::tile {

#if HK_AMD
struct PingPong {
  static constexpr unsigned kGroups = 2;
  static constexpr unsigned kGroupWaves = 4;  // one a SIMD
  static constexpr unsigned kWaves = kGroups * kGroupWaves;
  static constexpr unsigned kThreads = kWaves * kWaveSize;
  static constexpr unsigned kGroupThreads = kGroupWaves * kWaveSize;
  // s_waitcnt lgkmcnt(0) and s_waitcnt vmcnt(0), the other counters left alone (gfx9's
  // encoding: vmcnt 63, expcnt 7, lgkmcnt 15 where not waited for).
  static constexpr unsigned kLdsLanded = 0xC07F, kLoadsLanded = 0x0F70;

  // The calling wave's group (0 leads, 1 trails by a phase), uniform in the wave: the barriers
  // below are taken or not by whole waves.
  static HK_DEVICE unsigned group() { return __builtin_amdgcn_readfirstlane(wave_id()) / kGroupWaves; }
  // The calling thread's index within its group.
  static HK_DEVICE unsigned group_thread() { return thread_idx_x() % kGroupThreads; }

  // Waits for the wave's global loads: for operands loaded before the first phase, whose wait
  // the compiler would otherwise put where they are first used, inside a matrix cluster, and
  // make every trip wait there for the loads of the blocks ahead as well.
  static HK_DEVICE void loads_landed() { __builtin_amdgcn_s_waitcnt(kLoadsLanded); }

  // The trailing group waits out the leading group's first phase.
  static HK_DEVICE void start() {
    if (group() == 1) phase_end();
  }
  // The leading group waits out the trailing group's last phase.
  static HK_DEVICE void finish() {
    if (group() == 0) phase_end();
  }

  // A matrix cluster: f's instructions at raised priority, kept together, then the phase ends.
  template <class F> static HK_DEVICE void matrix(F f) {
    __builtin_amdgcn_sched_barrier(0);
    __builtin_amdgcn_s_setprio(1);
    f();
    __builtin_amdgcn_s_setprio(0);
    __builtin_amdgcn_sched_barrier(0);
    phase_end();
  }
  // A memory cluster: f's instructions kept together, then the phase ends once its LDS reads
  // have landed, so that the matrix cluster after it waits for nothing (left to the compiler,
  // the wait for them opened that cluster). Its global loads stay in flight.
  template <class F> static HK_DEVICE void memory(F f) {
    __builtin_amdgcn_sched_barrier(0);
    f();
    __builtin_amdgcn_s_waitcnt(kLdsLanded);
    __builtin_amdgcn_sched_barrier(0);
    phase_end();
  }

  // The end of a phase: every wave of the block arrives, and the LDS writes before it are
  // visible after it (block_sync, fenced against the scheduler).
  static HK_DEVICE void phase_end() {
    block_sync();
    __builtin_amdgcn_sched_barrier(0);
  }
};
#endif

}  // namespace hk::tile
