// hk/tile/flash.h: one wave's share of flash attention on the mma.sync and MFMA targets: the
// scores of its 16 queries against a block of keys, the online softmax over them in
// registers, and the product of the probabilities with the block's values added to its output.
//
// The probabilities never leave registers: the scores' accumulators are laid out so that each
// lane already holds the operand fragment of P that the P·V product needs. The orientation that
// makes this work differs per instruction family:
//   NVIDIA (mma.sync m16n8k16)  S = Q·Kᵀ [query][key]. The accumulator layout of a 16x16 block
//       (rows g and g + 8, column pairs 2t, 2t + 1 of each 8-column half; hk/tile/mma_sync.h)
//       is exactly the A fragment layout of a 16x16 block, so P's 16-key block j is the A
//       operand of step j of O = P·V, with V read [key][d] by transposing ldmatrix. A lane holds
//       two queries (g, g + 8), shared with the three other lanes of its group of four.
//   AMD (MFMA 16x16)  Sᵀ = K·Qᵀ [key][query]. Lane l holds Sᵀ[4 (l / 16) + v][l % 16], which is
//       the B fragment layout (B[kPerLane (l / 16) + j][l % 16]), so Oᵀ = Vᵀ·Pᵀ takes Pᵀ from
//       registers and Vᵀ as A, read element by element from V's [key][d] tile. A lane holds
//       one query (l % 16), shared with the lanes l ^ 16, l ^ 32, l ^ 48. On gfx950 (k = 32) a
//       B fragment needs 8 keys per lane where one 16x16 block gives 4: it takes 4 from each
//       of two blocks, and Vᵀ is read with the same key order (a sum does not care about the
//       order of its terms, only that A and B agree).
// Either way the per-query statistics (running maximum and sum) sit with the lanes that hold
// the query's scores and outputs, so rescaling needs no data movement.
//
// The softmax works in base 2: scores are scaled by scale · log2(e) once (after the soft-cap,
// which works in natural units), and the log-sum-exp is converted back at the end.
#pragma once

#include "../math.h"
#include "../reduce.h"
#include "mma.h"
#include "shared.h"

namespace hk::tile {

// What masks a score, with query and key positions counted from their sequence's start:
// key j is visible to query i when j < keys and, with the diagonal d = i + keys - queries
// (causal attention aligned bottom-right, as chunked prefill needs), d - left <= j <= d + right
// for the bounds that are set (negative: unbounded). Causal attention is right = 0.
struct Visibility {
  int queries, keys;
  int left, right;  // window bounds, < 0 for none

  HK_DEVICE int diagonal(int query) const { return query + keys - queries; }
  HK_DEVICE bool visible(int query, int key) const {
    const int d = diagonal(query);
    return key < keys && (left < 0 || key >= d - left) && (right < 0 || key <= d + right);
  }
  // The keys [first, last) any of queries [q0, q1) may see (q1 > q0); for one query i,
  // first_key(i) <= j < last_key(i + 1) is visible(i, j).
  HK_DEVICE int first_key(int q0) const {
    const int first = left < 0 ? 0 : diagonal(q0) - left;
    return first > 0 ? first : 0;
  }
  HK_DEVICE int last_key(int q1) const {
    const int last = right < 0 ? keys : diagonal(q1 - 1) + right + 1;
    return last < keys ? last : keys;
  }
  // Whether every query of [q0, q1) sees every key of [k0, k1): no score needs a mask.
  HK_DEVICE bool all_visible(int q0, int q1, int k0, int k1) const {
    return k1 <= keys && (left < 0 || k0 >= diagonal(q1 - 1) - left) &&
           (right < 0 || k1 - 1 <= diagonal(q0) + right);
  }
};

// A wave's 16 kQueryTiles queries against kKeys keys of head dimension kD, with output head
// dimension kDv.
template <typename T, unsigned kQueryTiles, unsigned kKeys, unsigned kD, unsigned kDv>
struct FlashWave {
  using Atom = MmaAtom<T>;
  static constexpr unsigned kQueries = 16 * kQueryTiles;
  static_assert(kKeys % 32 == 0 && kD % 32 == 0 && kDv % 16 == 0,
                "whole atoms of keys (pairs, for gfx950's k = 32) and of head dimensions");
#if HK_NVIDIA
  // Slot 2i + r: query g + 8r of query tile i (g = lane / 4).
  static constexpr unsigned kSlots = 2 * kQueryTiles;
  Accumulators<T, kQueryTiles, kKeys / 16> s;
  Accumulators<T, kQueryTiles, kDv / 16> o;
  static HK_DEVICE unsigned slot(unsigned tile, unsigned v) { return 2 * tile + v / 2 % 2; }
  static HK_DEVICE unsigned query(unsigned slot) {
    return 16 * (slot / 2) + lane_id() / 4 + 8 * (slot % 2);
  }
#else
  // Slot i: query l % 16 of query tile i.
  static constexpr unsigned kSlots = kQueryTiles;
  Accumulators<T, kKeys / 16, kQueryTiles> s;  // transposed: [key][query]
  Accumulators<T, kDv / 16, kQueryTiles> o;    // transposed: [d][query]
  static HK_DEVICE unsigned slot(unsigned tile, unsigned) { return tile; }
  static HK_DEVICE unsigned query(unsigned slot) { return 16 * slot + lane_id() % 16; }
#endif
  float max[kSlots];  // the running maximum of the scaled scores (base 2), -inf before any
  float sum[kSlots];  // this lane's share of the running sum of exps

  HK_DEVICE void start() {
    o.zero();
#pragma unroll
    for (unsigned q = 0; q < kSlots; ++q) {
      max[q] = -__builtin_inff();
      sum[q] = 0.0f;
    }
  }

  // s = the scores of queries [q_row0, q_row0 + kQueries) of tile q against every key of tile k
  // (both [row][d]), unscaled.
  template <class QTile, class KTile>
  HK_DEVICE void score(const QTile& q, const KTile& k, unsigned q_row0) {
    s.zero();
#pragma unroll
    for (unsigned d = 0; d < kD; d += Atom::kK) {
#if HK_NVIDIA
      mma<BLayout::kNK>(s, q, k, q_row0, 0, d);
#else
      mma<BLayout::kNK>(s, k, q, 0, q_row0, d);
#endif
    }
  }

  // Replaces each of the lane's scores x with f(slot, query, key, x), query relative to the
  // wave's first and key to the block's. (By value: AMD's accumulators are vectors, whose
  // elements bind to no reference.)
  template <typename F> HK_DEVICE void map_scores(F f) {
#pragma unroll
    for (unsigned i = 0; i < decltype(s)::kTilesM; ++i)
#pragma unroll
      for (unsigned j = 0; j < decltype(s)::kTilesN; ++j)
#pragma unroll
        for (unsigned v = 0; v < Atom::C::kSize; ++v) {
          const unsigned row = i * 16 + Atom::row(v), col = j * 16 + Atom::col(v);
#if HK_NVIDIA
          s.tile[i][j].v[v] = f(slot(i, v), row, col, s.tile[i][j].v[v]);
#else
          s.tile[i][j].v[v] = f(slot(j, v), col, row, s.tile[i][j].v[v]);
#endif
        }
  }

  // The reduction of x over the lanes that share the lane's queries.
  template <typename Op> static HK_DEVICE float across_query_lanes(float x, Op op) {
#if HK_NVIDIA
    x = op(x, wave_shfl_xor(x, 1));
    return op(x, wave_shfl_xor(x, 2));
#else
    x = op(x, wave_shfl_xor(x, 16));
    return op(x, wave_shfl_xor(x, 32));
#endif
  }

  // The online softmax step over scores already scaled to base 2 (masked ones -inf): raises
  // the running maxima, rescales the output and sums by what they grew, and turns the scores
  // into probabilities exp2(score - max).
  HK_DEVICE void softmax() {
    float block_max[kSlots];
#pragma unroll
    for (unsigned q = 0; q < kSlots; ++q) block_max[q] = -__builtin_inff();
    map_scores([&](unsigned q, unsigned, unsigned, float x) HK_INLINE {
      block_max[q] = hk::max(block_max[q], x);
      return x;
    });
    float scale[kSlots];
#pragma unroll
    for (unsigned q = 0; q < kSlots; ++q) {
      const float next = hk::max(max[q], across_query_lanes(block_max[q], Max{}));
      // A query that has seen no visible key yet keeps max = -inf; its probabilities must come
      // out 0, not exp2(-inf - -inf) = NaN, so it subtracts 0 instead.
      const float shift = next == -__builtin_inff() ? 0.0f : next;
      scale[q] = exp2(max[q] - shift);
      max[q] = next;
      sum[q] *= scale[q];
      block_max[q] = shift;
    }
    map_scores([&](unsigned q, unsigned, unsigned, float x) HK_INLINE {
      const float p = exp2(x - block_max[q]);
      sum[q] += p;
      return p;
    });
    map_outputs([&](unsigned q, unsigned, unsigned, float x) HK_INLINE { return x * scale[q]; });
  }

  // o += P·V over the block's keys, with P from the scores (after softmax()) and V the tile
  // [key][d].
  template <class VTile> HK_DEVICE void accumulate(const VTile& v) {
#if HK_NVIDIA
#pragma unroll
    for (unsigned j = 0; j < kKeys / 16; ++j) {
      typename Atom::A p[kQueryTiles];
#pragma unroll
      for (unsigned i = 0; i < kQueryTiles; ++i) {
        const auto& c = s.tile[i][j].v;
        p[i] = {{pack(c[0], c[1]), pack(c[2], c[3]), pack(c[4], c[5]), pack(c[6], c[7])}};
      }
#pragma unroll
      for (unsigned n = 0; n < kDv / 16; ++n) {
        const typename Atom::B b = Atom::load_b_kn(v, 16 * j, 16 * n);
#pragma unroll
        for (unsigned i = 0; i < kQueryTiles; ++i) Atom::mma(o.tile[i][n], p[i], b);
      }
    }
#else
    constexpr unsigned kPer = Atom::kPerLane;  // keys per lane of one step
    const unsigned l = lane_id();
#pragma unroll
    for (unsigned step = 0; step < kKeys / Atom::kK; ++step) {
      typename Atom::B p[kQueryTiles];
      unsigned key[kPer];  // the step's keys in this lane's operand order
#pragma unroll
      for (unsigned e = 0; e < kPer; ++e) {
        const unsigned block = step * (kPer / 4) + e / 4;
#pragma unroll
        for (unsigned i = 0; i < kQueryTiles; ++i)
          p[i].v[e] = static_cast<T>(s.tile[block][i].v[e % 4]);
        key[e] = 16 * block + 4 * (l / 16) + e % 4;
      }
#pragma unroll
      for (unsigned n = 0; n < kDv / 16; ++n) {
        typename Atom::A vt;
#pragma unroll
        for (unsigned e = 0; e < kPer; ++e) vt.v[e] = *v.at(key[e], 16 * n + l % 16);
#pragma unroll
        for (unsigned i = 0; i < kQueryTiles; ++i) Atom::mma(o.tile[n][i], vt, p[i]);
      }
    }
#endif
  }

  // Replaces each of the lane's outputs x with f(slot, query, d, x).
  template <typename F> HK_DEVICE void map_outputs(F f) {
#pragma unroll
    for (unsigned i = 0; i < decltype(o)::kTilesM; ++i)
#pragma unroll
      for (unsigned j = 0; j < decltype(o)::kTilesN; ++j)
#pragma unroll
        for (unsigned v = 0; v < Atom::C::kSize; ++v) {
          const unsigned row = i * 16 + Atom::row(v), col = j * 16 + Atom::col(v);
#if HK_NVIDIA
          o.tile[i][j].v[v] = f(slot(i, v), row, col, o.tile[i][j].v[v]);
#else
          o.tile[i][j].v[v] = f(slot(j, v), col, row, o.tile[i][j].v[v]);
#endif
        }
  }

  // Calls f(slot, query, d, run) for each run of kRun outputs of the lane that are neighbours in
  // one query's row (d .. d + kRun - 1), for wider stores: NVIDIA's accumulator pairs, AMD's
  // four rows of a transposed block.
  static constexpr unsigned kRun = HK_NVIDIA ? 2 : 4;
  template <typename F> HK_DEVICE void for_each_output_run(F f) const {
#pragma unroll
    for (unsigned i = 0; i < decltype(o)::kTilesM; ++i)
#pragma unroll
      for (unsigned j = 0; j < decltype(o)::kTilesN; ++j)
#pragma unroll
        for (unsigned v = 0; v < Atom::C::kSize; v += kRun) {
          float run[kRun];
#pragma unroll
          for (unsigned e = 0; e < kRun; ++e) run[e] = o.tile[i][j].v[v + e];
#if HK_NVIDIA
          f(slot(i, v), i * 16 + Atom::row(v), j * 16 + Atom::col(v), run);
#else
          f(slot(j, v), j * 16 + Atom::col(v), i * 16 + Atom::row(v), run);
#endif
        }
  }

  // Ends the walk over the keys: divides the outputs by their sums and gives each slot's
  // log-sum-exp of the unscaled-to-base-2 scores, in natural units. A query that saw no key
  // gets outputs 0 and -inf.
  HK_DEVICE void finish(float (&lse)[kSlots]) {
    float inv[kSlots];
#pragma unroll
    for (unsigned q = 0; q < kSlots; ++q) {
      const float total = across_query_lanes(sum[q], Sum{});
      inv[q] = total > 0.0f ? rcp(total) : 0.0f;
      lse[q] = total > 0.0f ? (max[q] + log2(total)) * kLn2 : -__builtin_inff();
    }
    map_outputs([&](unsigned q, unsigned, unsigned, float x) HK_INLINE { return x * inv[q]; });
  }

 private:
#if HK_NVIDIA
  // Two f32 values as the 32-bit register of two T, the lower-indexed in the low half.
  static HK_DEVICE unsigned pack(float lo, float hi) {
    struct Two {
      T lo, hi;
    };
    return __builtin_bit_cast(unsigned, Two{static_cast<T>(lo), static_cast<T>(hi)});
  }
#endif
};

}  // namespace hk::tile
