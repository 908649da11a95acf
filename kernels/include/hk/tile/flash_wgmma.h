// hk/tile/flash_wgmma.h: a consumer warpgroup's share of flash attention on sm_90a (wgmma):
// FlashWarpgroup for the forward pass, FlashKeyGrads and FlashQueryGrads for the backward's.
//
// The forward's warpgroup owns 64 query rows (Q's shared tile, K-major) and walks blocks of kKeys
// keys:
//   S = Q·Kᵀ   wgmma m64n{kKeys}k16, both operands from shared memory (K [key][d] is K-major);
//   softmax    online, in registers, per row (FlashWave's rules, hk/tile/flash.h);
//   O += P·V   wgmma m64n{kDv}k16 with P from registers and V [key][d] read N-major.
// P never leaves registers: S's accumulator layout (row 16w + l/4 + 8i, column pairs 8j + 2(l%4)
// of warp w, lane l) holds, for each 16 keys, exactly the A fragment of one k step of P·V (see
// wgmma::mma_rs), so P is S converted to 16-bit pairs in place.
//
// A thread holds two query rows ("slots" 0 and 1: 16w + l/4 and + 8), shared with the three
// other lanes of its group of four, as with mma.sync: row maxima and sums reduce over those
// lanes, and rescaling O needs no data movement.
//
// The caller orders the asynchronous products: fence before score() (its accumulators were
// written since), commit, wait, and pin() the accumulators after the wait (hk/tile/wgmma.h);
// accumulate() fences itself.
#pragma once

#include "../math.h"
#include "../reduce.h"
#include "shared.h"
#include "wgmma.h"

#if HK_SM90A

namespace hk::tile {

// The two products of the flash passes, for a warpgroup's 64 rows.
//
// acc = A[row0 .. row0 + 64) · B[0 .. kN)ᵀ over kDepth columns, wgmma m64n{kN}k16 with both
// operands from shared memory: SharedPanels of 64-column panels, K-major (row0 a multiple of 64).
template <typename T, unsigned kN, unsigned kDepth, class ATile, class BTile>
HK_DEVICE void multiply_nt(float (&acc)[kN / 2], const ATile& a, unsigned row0, const BTile& b) {
#pragma unroll
  for (unsigned d = 0; d < kDepth; d += 16) {
    const unsigned p = d / 64, c = d % 64;
    wgmma::mma<T, kN>(acc, wgmma::descriptor(a.panel[p], row0, c),
                      wgmma::descriptor(b.panel[p], 0, c), d > 0);
  }
}

// A 64 x kK matrix in registers as wgmma's A operand: an accumulator of m64n{kK} (row 16w + l/4
// + 8i, column pairs 8j + 2(l%4) of warp w, lane l) holds, for each 16 columns, exactly the A
// fragment of one k step, so the operand is the accumulator converted to 16-bit pairs in place.
template <typename T, unsigned kK> struct RegisterOperand {
  static_assert(kK % 16 == 0, "whole k steps of 16");
  unsigned a[kK / 16][4];

  HK_DEVICE explicit RegisterOperand(const float (&acc)[kK / 2]) {
#pragma unroll
    for (unsigned k = 0; k < kK / 16; ++k) {
      const float* p = acc + 8 * k;
      a[k][0] = pack(p[0], p[1]);
      a[k][1] = pack(p[2], p[3]);
      a[k][2] = pack(p[4], p[5]);
      a[k][3] = pack(p[6], p[7]);
    }
  }

  // Two f32 values as the 32-bit register of two T, the lower-indexed in the low half.
  static HK_DEVICE unsigned pack(float lo, float hi) {
    struct Two {
      T lo, hi;
    };
    return __builtin_bit_cast(unsigned, Two{static_cast<T>(lo), static_cast<T>(hi)});
  }
};

// acc += A · B over kK, A from registers and B SharedPanels [k][n] read N-major (wgmma
// m64n{kN}k16). The caller fences first (wgmma::fence), after packing every operand it issues:
// packing between products makes ptxas fence before each one (a warpgroup.arrive per step).
template <typename T, unsigned kN, unsigned kK, class BTile>
HK_DEVICE void multiply_rs(float (&acc)[kN / 2], const RegisterOperand<T, kK>& a, const BTile& b) {
#pragma unroll
  for (unsigned k = 0; k < kK / 16; ++k)
    wgmma::mma_rs<T, kN>(acc, a.a[k], wgmma::descriptor_n_major(b, 16 * k), 1);
}

// Stores rows [0, rows) of a warpgroup's 64 x kN accumulator, times `scale`, into out (row r at
// out + r * ld), two neighbouring columns as one 4-byte store where `pairs` (out 4-byte
// aligned, ld even).
template <typename T, unsigned kN>
HK_DEVICE void store_accumulator(const float (&acc)[kN / 2], T* out, unsigned long long ld, int rows,
                                 bool pairs, float scale = 1.0f) {
#pragma unroll
  for (unsigned v = 0; v < kN / 2; v += 2) {
    const int r = wgmma::Layout::row(v);
    if (r >= rows) continue;
    T* to = out + r * ld + wgmma::Layout::col(v);
    if (pairs) {
      *reinterpret_cast<unsigned*>(to) =
          RegisterOperand<T, 16>::pack(acc[v] * scale, acc[v + 1] * scale);
    } else {
      to[0] = static_cast<T>(acc[v] * scale);
      to[1] = static_cast<T>(acc[v + 1] * scale);
    }
  }
}

template <typename T, unsigned kKeys_, unsigned kD, unsigned kDv> struct FlashWarpgroup {
  static constexpr unsigned kRows = 64, kKeys = kKeys_, kSlots = 2;
  static_assert(kKeys % 16 == 0 && kD % 16 == 0, "whole k steps of 16");
  float s[kKeys / 2];  // S, then P: wgmma's accumulator layout of 64 x kKeys
  float o[kDv / 2];    // O, 64 x kDv
  float max[kSlots];   // the running maximum of the scaled scores (base 2), -inf before any
  float sum[kSlots];   // this lane's share of the running sum of exps

  // The slot of accumulator register v, and its row and column in the warpgroup's block.
  static HK_DEVICE unsigned slot(unsigned v) { return v / 2 % 2; }
  static HK_DEVICE unsigned row(unsigned slot) {
    return thread_idx_x() % kWarpgroupThreads / 32 * 16 + lane_id() / 4 + 8 * slot;
  }
  static HK_DEVICE unsigned col(unsigned v) { return wgmma::Layout::col(v); }
  // Whether the lane is the first of the four holding its rows.
  static HK_DEVICE bool first_of_row() { return lane_id() % 4 == 0; }
  template <typename Op> static HK_DEVICE float across_row(float x, Op op) {
    x = op(x, wave_shfl_xor(x, 1));
    return op(x, wave_shfl_xor(x, 2));
  }

  HK_DEVICE void start() {
#pragma unroll
    for (unsigned v = 0; v < kDv / 2; ++v) o[v] = 0.0f;
#pragma unroll
    for (unsigned q = 0; q < kSlots; ++q) {
      max[q] = -__builtin_inff();
      sum[q] = 0.0f;
    }
  }

  // Issues S = Q[row0 .. row0 + 64) · K[0 .. kKeys)ᵀ over kD columns, both SharedPanels of
  // 64-column panels (row0 a multiple of 64).
  template <class QTile, class KTile>
  HK_DEVICE void score(const QTile& q, unsigned row0, const KTile& k) {
    multiply_nt<T, kKeys, kD>(s, q, row0, k);
  }

  // Replaces each score x with f(slot, key, x) (key within the block).
  template <typename F> HK_DEVICE void map(F f) {
#pragma unroll
    for (unsigned v = 0; v < kKeys / 2; ++v) s[v] = f(slot(v), col(v), s[v]);
  }

  // The online softmax step over scores already scaled to base 2 (masked ones -inf): raises
  // the running maxima, rescales O and the sums by what they grew, and turns the scores into
  // probabilities exp2(score - max). O must not be in flight (its product waited for).
  HK_DEVICE void softmax() {
    float block_max[kSlots] = {-__builtin_inff(), -__builtin_inff()};
#pragma unroll
    for (unsigned v = 0; v < kKeys / 2; ++v) block_max[slot(v)] = hk::max(block_max[slot(v)], s[v]);
    float scale[kSlots], shift[kSlots];
#pragma unroll
    for (unsigned q = 0; q < kSlots; ++q) {
      const float next = hk::max(max[q], across_row(block_max[q], Max{}));
      // A query that has seen no visible key yet keeps max = -inf; its probabilities must come
      // out 0, not exp2(-inf - -inf) = NaN, so it subtracts 0 instead.
      shift[q] = next == -__builtin_inff() ? 0.0f : next;
      scale[q] = exp2(max[q] - shift[q]);
      max[q] = next;
      sum[q] *= scale[q];
    }
#pragma unroll
    for (unsigned v = 0; v < kKeys / 2; ++v) {
      s[v] = exp2(s[v] - shift[slot(v)]);
      sum[slot(v)] += s[v];
    }
#pragma unroll
    for (unsigned v = 0; v < kDv / 2; ++v) o[v] *= scale[slot(v)];
  }

  // Issues O += P·V over the block's keys, P from the scores (after softmax()), V SharedPanels
  // [key][d_v].
  template <class VTile> HK_DEVICE void accumulate(const VTile& v) {
    const RegisterOperand<T, kKeys> p(s);
    wgmma::fence();
    multiply_rs<T, kDv>(o, p, v);
  }

  // Ends the walk over the keys: divides O by the sums and gives each slot's log-sum-exp in
  // natural units. A query that saw no key gets outputs 0 and -inf.
  HK_DEVICE void finish(float (&lse)[kSlots]) {
    float inv[kSlots];
#pragma unroll
    for (unsigned q = 0; q < kSlots; ++q) {
      const float total = across_row(sum[q], Sum{});
      inv[q] = total > 0.0f ? rcp(total) : 0.0f;
      lse[q] = total > 0.0f ? (max[q] + log2(total)) * kLn2 : -__builtin_inff();
    }
#pragma unroll
    for (unsigned v = 0; v < kDv / 2; ++v) o[v] *= inv[slot(v)];
  }

  // Stores O's rows [0, rows) of the block into out (row r at out + r * ld), two neighbouring
  // columns as one 4-byte store where `pairs` (out 4-byte aligned, ld even).
  HK_DEVICE void store(T* out, unsigned long long ld, int rows, bool pairs) const {
    store_accumulator<T, kDv>(o, out, ld, rows, pairs);
  }
};

// The backward pass's products for a warpgroup's 64 own rows (keys for dK and dV, queries for
// dQ) against a block of kCols other rows (queries, or keys), both from shared memory, K-major:
//   S, dP   wgmma m64n{kCols}k16, issued together (scores());
//   P, dS   in registers, from the forward pass's statistics (the caller's map());
// then the gradients' products, with P and dS as register operands (RegisterOperand) and the
// other rows' tiles read N-major: FlashKeyGrads (dV += Pᵀ·dO, dK += dSᵀ·Q) and FlashQueryGrads
// (dQ += dS·K). A thread's rows ("slots" 0 and 1) are own rows, its columns other rows. The
// caller orders the products as FlashWarpgroup's does: fence before scores(), commit, wait and
// pin; accumulate() fences itself.
template <typename T, unsigned kCols> struct FlashGrads {
  static constexpr unsigned kRows = 64, kSlots = 2;
  float s[kCols / 2];   // S, then P
  float dp[kCols / 2];  // dP, then dS

  static HK_DEVICE unsigned slot(unsigned v) { return v / 2 % 2; }
  static HK_DEVICE unsigned row(unsigned slot) {
    return thread_idx_x() % kWarpgroupThreads / 32 * 16 + lane_id() / 4 + 8 * slot;
  }
  static HK_DEVICE unsigned col(unsigned v) { return wgmma::Layout::col(v); }

  // Issues S = A·Bᵀ and dP = dA·dBᵀ for own rows [row0, row0 + 64) of a and da (row0 a multiple
  // of 64) against the block's other rows b and db, over kDepth columns.
  template <unsigned kDepth, class OwnTile, class OtherTile>
  HK_DEVICE void scores(const OwnTile& a, const OwnTile& da, unsigned row0, const OtherTile& b,
                        const OtherTile& db) {
    multiply_nt<T, kCols, kDepth>(s, a, row0, b);
    multiply_nt<T, kCols, kDepth>(dp, da, row0, db);
  }

  // A score's probability and the gradient of its logit.
  struct Gradient {
    float p, ds;
  };
  // Replaces each pair (s, dp) with the Gradient f(slot, col, s, dp) (col: the other row within
  // the block).
  template <typename F> HK_DEVICE void map(F f) {
#pragma unroll
    for (unsigned v = 0; v < kCols / 2; ++v) {
      const Gradient g = f(slot(v), col(v), s[v], dp[v]);
      s[v] = g.p;
      dp[v] = g.ds;
    }
  }
};

// dK and dV for 64 keys, walking blocks of kQueries queries.
template <typename T, unsigned kQueries, unsigned kD> struct FlashKeyGrads : FlashGrads<T, kQueries> {
  float dk[kD / 2], dv[kD / 2];

  HK_DEVICE void start() {
#pragma unroll
    for (unsigned v = 0; v < kD / 2; ++v) dk[v] = dv[v] = 0.0f;
  }
  // Issues dV += Pᵀ·dO and dK += dSᵀ·Q over the block's queries.
  template <class QueryTile> HK_DEVICE void accumulate(const QueryTile& q, const QueryTile& d_o) {
    const RegisterOperand<T, kQueries> p(this->s), ds(this->dp);
    wgmma::fence();
    multiply_rs<T, kD>(dv, p, d_o);
    multiply_rs<T, kD>(dk, ds, q);
  }
};

// dQ for 64 queries, walking blocks of kKeys keys.
template <typename T, unsigned kKeys, unsigned kD> struct FlashQueryGrads : FlashGrads<T, kKeys> {
  float dq[kD / 2];

  HK_DEVICE void start() {
#pragma unroll
    for (unsigned v = 0; v < kD / 2; ++v) dq[v] = 0.0f;
  }
  // Issues dQ += dS·K over the block's keys.
  template <class KeyTile> HK_DEVICE void accumulate(const KeyTile& k) {
    const RegisterOperand<T, kKeys> ds(this->dp);
    wgmma::fence();
    multiply_rs<T, kD>(dq, ds, k);
  }
};

}  // namespace hk::tile

#endif  // HK_SM90A
