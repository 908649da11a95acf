// hk/tile/mma.h: one matrix multiply-accumulate over tiles, for every target. A wave keeps a
// block of the result, kTilesM x kTilesN atoms of 16x16 accumulators (f32; i32 for i8 inputs)
// in registers (Accumulators); mma() adds to it the product of an A strip and a B strip read
// from shared tiles, one atom's k depth (MmaAtom<T>::kK) at a time.
//
// The per-target mapping lives in one file per instruction family:
//   hk/tile/mfma.h      AMD CDNA MFMA (gfx90a, gfx942: k = 16; gfx950: k = 32)
//   hk/tile/mma_sync.h  NVIDIA mma.sync m16n8k16 with ldmatrix (sm_80, sm_90)
//   hk/tile/mfma8.h     AMD CDNA MFMA of 8-bit inputs (i8 everywhere; E4M3 on gfx942, gfx950)
//   hk/tile/mma_sync8.h NVIDIA 8-bit: i8 mma.sync m16n8k32 (sm_80, sm_90); E4M3 widened to f16
//                       for m16n8k16 (sm_89+: sm_90 has no FP8 mma.sync)
// each defining MmaAtom<T> (T = bf16 or f16; i8 or an FP8 format in the 8-bit files) with the
// same members: kM = kN = 16, kK, the operand fragments A, B and the accumulator C (kSize f32
// per lane, i32 for i8), load_a / load_b_nk (and for 16-bit load_b_kn) from a SharedTile, mma,
// and row(v) / col(v), where accumulator element v of the calling lane sits in its 16x16
// block.
#pragma once

#include "../device.h"
#include "shared.h"

#if HK_AMD
#include "mfma.h"
#include "mfma8.h"
#else
#include "mma_sync.h"
#include "mma_sync8.h"
#endif

namespace hk::tile {

// How B is stored: [N][K] (the weight of a linear layer, C = A·Bᵀ of the stored matrix) or
// [K][N] (C = A·B).
enum class BLayout { kNK, kKN };

template <typename T, unsigned kTilesM_, unsigned kTilesN_> struct Accumulators {
  using Atom = MmaAtom<T>;
  static constexpr unsigned kTilesM = kTilesM_;
  static constexpr unsigned kTilesN = kTilesN_;
  static constexpr unsigned kRows = kTilesM * Atom::kM;
  static constexpr unsigned kCols = kTilesN * Atom::kN;
  typename Atom::C tile[kTilesM][kTilesN];

  HK_DEVICE void zero() {
#pragma unroll
    for (unsigned i = 0; i < kTilesM; ++i)
#pragma unroll
      for (unsigned j = 0; j < kTilesN; ++j)
#pragma unroll
        for (unsigned v = 0; v < Atom::C::kSize; ++v) tile[i][j].v[v] = 0;
  }

  // Sets every accumulator to f(row, col), with row and col relative to the wave's block.
  template <typename F> HK_DEVICE void set(F f) {
#pragma unroll
    for (unsigned i = 0; i < kTilesM; ++i)
#pragma unroll
      for (unsigned j = 0; j < kTilesN; ++j)
#pragma unroll
        for (unsigned v = 0; v < Atom::C::kSize; ++v)
          tile[i][j].v[v] = f(i * Atom::kM + Atom::row(v), j * Atom::kN + Atom::col(v));
  }

  // Calls f(row, col, value) for every accumulator of the lane, with row and col relative to
  // the wave's block.
  template <typename F> HK_DEVICE void for_each(F f) const {
#pragma unroll
    for (unsigned i = 0; i < kTilesM; ++i)
#pragma unroll
      for (unsigned j = 0; j < kTilesN; ++j)
#pragma unroll
        for (unsigned v = 0; v < Atom::C::kSize; ++v)
          f(i * Atom::kM + Atom::row(v), j * Atom::kN + Atom::col(v), tile[i][j].v[v]);
  }
};

// Calls f(row, col, x, y) for every accumulator of the lane in a and b (the same positions).
template <class Acc, typename F> HK_DEVICE void for_each_pair(const Acc& a, const Acc& b, F f) {
  using Atom = typename Acc::Atom;
#pragma unroll
  for (unsigned i = 0; i < Acc::kTilesM; ++i)
#pragma unroll
    for (unsigned j = 0; j < Acc::kTilesN; ++j)
#pragma unroll
      for (unsigned v = 0; v < Atom::C::kSize; ++v)
        f(i * Atom::kM + Atom::row(v), j * Atom::kN + Atom::col(v), a.tile[i][j].v[v],
          b.tile[i][j].v[v]);
}

// acc += A[row0 .., k0 .. k0 + kK) · B[k0 .. k0 + kK, col0 ..): a is a shared [M][K] tile, b a
// shared tile stored as kB says; row0 and col0 are the wave block's corner in them.
template <BLayout kB, class Acc, class ATile, class BTile>
HK_DEVICE void mma(Acc& acc, const ATile& a, const BTile& b, unsigned row0, unsigned col0,
                   unsigned k0) {
  using Atom = typename Acc::Atom;
  typename Atom::A af[Acc::kTilesM];
  typename Atom::B bf[Acc::kTilesN];
#pragma unroll
  for (unsigned i = 0; i < Acc::kTilesM; ++i) af[i] = Atom::load_a(a, row0 + i * Atom::kM, k0);
#pragma unroll
  for (unsigned j = 0; j < Acc::kTilesN; ++j) {
    if constexpr (kB == BLayout::kNK)
      bf[j] = Atom::load_b_nk(b, col0 + j * Atom::kN, k0);
    else
      bf[j] = Atom::load_b_kn(b, k0, col0 + j * Atom::kN);
  }
#pragma unroll
  for (unsigned i = 0; i < Acc::kTilesM; ++i)
#pragma unroll
    for (unsigned j = 0; j < Acc::kTilesN; ++j) Atom::mma(acc.tile[i][j], af[i], bf[j]);
}

}  // namespace hk::tile
