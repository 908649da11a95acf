// hk/tile/flash.h: a wave's share of flash attention on the mma.sync and MFMA targets.
//
// The building blocks are two products of a wave's own rows (queries in the forward pass and
// in dQ's, keys in dK's and dV's) with a block of other rows staged in shared memory:
//   RowScores  X = Own·Otherᵀ, own rows by the block's other rows: scores, or dO·Vᵀ;
//   RowSums    Y += X·M, own rows by M's columns, with X from registers: O += P·V, dQ += dS·K,
//              dV += Pᵀ·dO, dK += dSᵀ·Q.
// X never leaves registers between the two: its accumulators are laid out so that each lane
// already holds the operand fragment of X that Y's product needs. The orientation that makes
// this work differs per instruction family (stated for the forward pass, own = queries,
// other = keys, M = V):
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
// Either way a lane holds the same own rows ("slots") in X and in Y, so per-row values (the
// softmax's running maximum and sum, a row's log-sum-exp) sit with the lanes that need them and
// rescaling needs no data movement.
//
// FlashWave is the forward pass's wave over them: the online softmax of the scores. The softmax
// works in base 2: scores are scaled by scale · log2(e) once (after the soft-cap,
// which works in natural units), and the log-sum-exp is converted back at the end.
#pragma once

#include "../math.h"
#include "../reduce.h"
#include "copy.h"
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
  // The queries [first, last) that see key j (j < keys), for the passes that walk queries for
  // a block of keys: first_query(j) <= i < last_query(j) is visible(i, j).
  HK_DEVICE int first_query(int key) const {
    const int first = right < 0 ? 0 : key - right - (keys - queries);
    return first > 0 ? first : 0;
  }
  HK_DEVICE int last_query(int key) const {
    const int last = left < 0 ? queries : key + left - (keys - queries) + 1;
    return last < queries ? last : queries;
  }
  // Whether every query of [q0, q1) sees every key of [k0, k1): no score needs a mask.
  HK_DEVICE bool all_visible(int q0, int q1, int k0, int k1) const {
    return k1 <= keys && (left < 0 || k0 >= diagonal(q1 - 1) - left) &&
           (right < 0 || k1 - 1 <= diagonal(q0) + right);
  }
};

// A sequence's rows [first, first + count) of a packed tensor, from cu_seqlens read defensively:
// offsets past the tensor or decreasing give fewer (or no) rows, never rows outside it.
struct SequenceRows {
  unsigned first, count;
  HK_DEVICE SequenceRows(const int* cu_seqlens, unsigned b, unsigned total) {
    const int lo = cu_seqlens[b], hi = cu_seqlens[b + 1];
    const unsigned end = hi < 0 ? 0u : (static_cast<unsigned>(hi) < total ? hi : total);
    first = lo < 0 ? 0u : (static_cast<unsigned>(lo) < end ? lo : end);
    count = end - first;
  }
};

// Copies rows [row0, row0 + Tile::kRows) of a matrix of `rows` rows (data, rows ld apart) into
// the panels of a shared tile, zeros past its last row: cp.async (NVIDIA, 16-byte aligned rows;
// the caller commits and waits), element by element (NVIDIA, other rows), or through registers
// at once (AMD).
template <unsigned kThreads, class Tile, typename T>
HK_DEVICE void copy_panels(Tile& to, const T* data, unsigned rows, unsigned ld, unsigned row0,
                           bool vector) {
#pragma unroll
  for (unsigned p = 0; p < Tile::kPanels; ++p) {
    const GlobalMatrix<T> g{data + Tile::kPanelCols * p, rows, Tile::kPanelCols, ld};
#if HK_NVIDIA
    // The lean walks: one pointer a thread down the rows, not an address a chunk kept across
    // the loop over blocks (16 of them for d = 128, which spilled).
    if (vector)
      copy_async_lean<kThreads>(to.panel[p], g, row0, 0, thread_idx_x());
    else
      copy_elements_lean<kThreads>(to.panel[p], g, row0, 0, thread_idx_x());
#else
    StagedCopy<typename Tile::Panel, kThreads> staged;
    staged.fetch(g, row0, 0, thread_idx_x(), vector);
    staged.store(to.panel[p], thread_idx_x());
#endif
  }
}

// A block of rows in flight through registers (AMD's double buffer): fetch() starts the loads,
// store() writes them to the shared tile once its previous readers are done.
// `thread` is the caller's index among the kThreads threads that copy the block.
template <class Tile, unsigned kThreads> struct StagedPanels {
  StagedCopy<typename Tile::Panel, kThreads> panel[Tile::kPanels];

  template <typename T>
  HK_DEVICE void fetch(const T* data, unsigned rows, unsigned ld, unsigned row0, bool vector,
                       unsigned thread = thread_idx_x()) {
#pragma unroll
    for (unsigned p = 0; p < Tile::kPanels; ++p)
      panel[p].fetch(GlobalMatrix<T>{data + Tile::kPanelCols * p, rows, Tile::kPanelCols, ld},
                     row0, 0, thread, vector);
  }
  HK_DEVICE void store(Tile& to, unsigned thread = thread_idx_x()) const {
#pragma unroll
    for (unsigned p = 0; p < Tile::kPanels; ++p) panel[p].store(to.panel[p], thread);
  }
  // store() transposed: the block's element (row, col) at to.at(col, row).
  template <class Transposed>
  HK_DEVICE void store_transposed(Transposed& to, unsigned thread = thread_idx_x()) const {
#pragma unroll
    for (unsigned p = 0; p < Tile::kPanels; ++p)
      panel[p].store_transposed(to, Tile::kPanelCols * p, thread);
  }
};

// Shared stages of the blocks a wave walks: two on NVIDIA (the next block's cp.async copies in
// flight while this one multiplies), one on AMD (the next block's loads in flight in registers).
inline constexpr unsigned kWalkStages = HK_NVIDIA ? 2 : 1;

// Walks blocks [first, last) of other rows: each block's tiles are copied into a stage, then
// multiply(stage, block) runs on every wave. copies is the kernel's: on NVIDIA
// copy(block, Stage&) (copy_panels into the stage), on AMD fetch(block) and store(Stage&)
// (StagedPanels). Copies the caller issued before (its own rows' tiles) land with the first
// block's. Every thread of the block calls it with the same range and `vector`.
template <class Stage, class Copies, class Multiply>
HK_DEVICE void walk_blocks(Stage* stage, unsigned first, unsigned last, bool vector,
                           Copies& copies, Multiply multiply) {
  if (first >= last) return;
#if HK_NVIDIA
  copies.copy(first, stage[0]);
  if (vector) async_commit();
  for (unsigned b = first; b < last; ++b) {
    const unsigned now = (b - first) % 2;
    if (vector) async_wait<0>();
    // Every wave is done with the previous block, whose stage the next copy refills.
    block_sync();
    if (vector && b + 1 < last) {
      copies.copy(b + 1, stage[1 - now]);
      async_commit();
    }
    multiply(stage[vector ? now : 0], b);
    if (!vector && b + 1 < last) {
      block_sync();
      copies.copy(b + 1, stage[0]);
    }
  }
#else
  copies.fetch(first);
  for (unsigned b = first; b < last; ++b) {
    copies.store(stage[0]);
    block_sync();
    if (b + 1 < last) copies.fetch(b + 1);
    multiply(stage[0], b);
    block_sync();
  }
#endif
}

// The copies of a block of key rows into a stage holding tiles `k` and `v` (whose rows are a
// block's), for walk_blocks: K's and V's rows of one key head (k and v at the sequence's first
// key, rows ldk and ldv apart).
template <class Stage, unsigned kThreads, typename T> struct KeyValueCopies {
  static constexpr unsigned kRows = decltype(Stage::k)::kRows;
  const T *k, *v;
  unsigned keys, ldk, ldv;
  bool vector;
#if HK_NVIDIA
  HK_DEVICE void copy(unsigned block, Stage& to) const {
    copy_panels<kThreads>(to.k, k, keys, ldk, block * kRows, vector);
    copy_panels<kThreads>(to.v, v, keys, ldv, block * kRows, vector);
  }
#else
  StagedPanels<decltype(Stage::k), kThreads> next_k;
  StagedPanels<decltype(Stage::v), kThreads> next_v;
  HK_DEVICE void fetch(unsigned block) {
    next_k.fetch(k, keys, ldk, block * kRows, vector);
    next_v.fetch(v, keys, ldv, block * kRows, vector);
  }
  HK_DEVICE void store(Stage& to) const {
    next_k.store(to.k);
    next_v.store(to.v);
  }
#endif
};

// Stores a RowSums' values into rows of a global matrix (own row r at out + r * ld, column c
// at + c), rows at and past `rows` left alone, as T: a 4- or 8-byte store a run where `vector`
// (out 16-byte aligned, ld a multiple of 8), element by element otherwise. scale multiplies
// each value first.
template <typename T, class Sums>
HK_DEVICE void store_rows(const Sums& sums, T* out, unsigned long long ld, int rows, bool vector,
                          float scale = 1.0f) {
  constexpr unsigned kRun = Sums::kRun;
  sums.for_each_run([&](unsigned, unsigned r, unsigned c, const float (&run)[kRun]) HK_INLINE {
    if (static_cast<int>(r) >= rows) return;
    T* to = out + r * ld + c;
    Pack<T, kRun> v;
#pragma unroll
    for (unsigned e = 0; e < kRun; ++e) v.elem[e] = static_cast<T>(run[e] * scale);
    if (vector) {
      // The run's column is a multiple of its length: one 4- or 8-byte store.
      using Word = __attribute__((ext_vector_type(kRun / 2))) unsigned;
      *reinterpret_cast<Word*>(to) = __builtin_bit_cast(Word, v);
    } else {
#pragma unroll
      for (unsigned e = 0; e < kRun; ++e) to[e] = v.elem[e];
    }
  });
}

// The lanes' rows of a wave's own 16 kOwnTiles rows ("slots"), the same in RowScores and RowSums.
template <unsigned kOwnTiles> struct OwnRows {
#if HK_NVIDIA
  // Slot 2i + r: row g + 8r of own tile i (g = lane / 4), shared with the lanes of its group.
  static constexpr unsigned kSlots = 2 * kOwnTiles;
  static HK_DEVICE unsigned slot(unsigned tile, unsigned v) { return 2 * tile + v / 2 % 2; }
  static HK_DEVICE unsigned row(unsigned slot) {
    return 16 * (slot / 2) + lane_id() / 4 + 8 * (slot % 2);
  }
  // Whether the lane is the first of those holding its slots.
  static HK_DEVICE bool first_of_row() { return lane_id() % 4 == 0; }
  // The reduction of x over the lanes that share the lane's slots.
  template <typename Op> static HK_DEVICE float across_row(float x, Op op) {
    x = op(x, wave_shfl_xor(x, 1));
    return op(x, wave_shfl_xor(x, 2));
  }
#else
  // Slot i: row l % 16 of own tile i, shared with the lanes l ^ 16, l ^ 32, l ^ 48.
  static constexpr unsigned kSlots = kOwnTiles;
  static HK_DEVICE unsigned slot(unsigned tile, unsigned) { return tile; }
  static HK_DEVICE unsigned row(unsigned slot) { return 16 * slot + lane_id() % 16; }
  static HK_DEVICE bool first_of_row() { return lane_id() < 16; }
  template <typename Op> static HK_DEVICE float across_row(float x, Op op) {
    x = op(x, wave_shfl_xor(x, 16));
    return op(x, wave_shfl_xor(x, 32));
  }
#endif

  // Calls f(i, j, v, slot, own, other) for accumulator element v of block [i][j] of an
  // Accumulators laid out as RowScores and RowSums keep them ([own][other] on NVIDIA,
  // transposed on AMD), every kStep-th element; own relative to the wave's first row.
  template <class Acc, unsigned kStep = 1, typename F> static HK_DEVICE void each(F f) {
    using Atom = typename Acc::Atom;
#pragma unroll
    for (unsigned i = 0; i < Acc::kTilesM; ++i)
#pragma unroll
      for (unsigned j = 0; j < Acc::kTilesN; ++j)
#pragma unroll
        for (unsigned v = 0; v < Atom::C::kSize; v += kStep) {
          const unsigned row = i * 16 + Atom::row(v), col = j * 16 + Atom::col(v);
#if HK_NVIDIA
          f(i, j, v, slot(i, v), row, col);
#else
          f(i, j, v, slot(j, v), col, row);
#endif
        }
  }
};

#if HK_AMD
// ---- Operands in registers (AMD) ----------------------------------------------------------------
// RowScores and RowSums read their operands from shared tiles as they multiply. Under
// hk/tile/pingpong.h's schedule a wave instead reads them into registers in a memory cluster
// and multiplies them in the next matrix cluster; these hold them, in the layouts of
// hk/tile/mfma.h (A and B of a [row][k] matrix read alike).

// The order of other rows in Y += X·M's operands (RowSums): element e of a lane's operand in
// step `step` is other row other(step, e), held in X's accumulator block block(step, e) as
// element e % 4.
template <typename T> struct TransposedOrder {
  static constexpr unsigned kPerLane = MmaAtom<T>::kPerLane;
  static HK_DEVICE unsigned block(unsigned step, unsigned e) { return step * (kPerLane / 4) + e / 4; }
  static HK_DEVICE unsigned other(unsigned step, unsigned e, unsigned lane) {
    return 16 * block(step, e) + 4 * (lane / 16) + e % 4;
  }
};

// A wave's operands of 16 kTiles rows by kDepth columns of a row-major matrix: its own rows
// (queries) loaded once from global memory, or a block's other rows (keys) read from a stage.
template <typename T, unsigned kTiles, unsigned kDepth> struct RowOperands {
  using Atom = MmaAtom<T>;
  using Operand = typename Atom::Operand;
  static constexpr unsigned kSteps = kDepth / Atom::kK;
  static_assert(kSteps * Atom::kK == kDepth, "whole atoms of depth");
  Operand v[kTiles][kSteps];

  template <class Tile> HK_DEVICE void read(const Tile& t) {
#pragma unroll
    for (unsigned i = 0; i < kTiles; ++i)
#pragma unroll
      for (unsigned d = 0; d < kSteps; ++d) v[i][d] = Atom::load_a(t, 16 * i, Atom::kK * d).v;
  }

  // Rows [row0, row0 + 16 kTiles) of g, zeros past its last row: an 8- or 16-byte load an
  // operand where `vector` (g's rows 16-byte aligned), element by element otherwise.
  HK_DEVICE void load(const GlobalMatrix<T>& g, unsigned row0, bool vector) {
    const unsigned l = lane_id();
#pragma unroll
    for (unsigned i = 0; i < kTiles; ++i) {
      const unsigned r = row0 + 16 * i + l % 16;
#pragma unroll
      for (unsigned d = 0; d < kSteps; ++d) {
        const T* src = g.row(r) + Atom::kK * d + Atom::kPerLane * (l / 16);
        Operand x = {};
        if (r < g.rows) {
          if (vector) {
            x = *reinterpret_cast<const Operand*>(src);
          } else {
#pragma unroll
            for (unsigned e = 0; e < Atom::kPerLane; ++e) x[e] = src[e];
          }
        }
        v[i][d] = x;
      }
    }
  }
};

// Mᵀ's operands for Y += X·M, in TransposedOrder, read from a shared tile that holds M
// transposed, Mᵀ [column][other] (kCols rows of kOthers): every four other rows of a lane's
// operand are consecutive there, one 8-byte read. (From M as stored, [other][column], each
// element is a 2-byte read with its own swizzled address, whose VALU outweighed the softmax's:
// CDNA has no transposing LDS read before gfx950.)
template <typename T, unsigned kOthers, unsigned kCols> struct TransposedOperands {
  using Atom = MmaAtom<T>;
  static constexpr unsigned kSteps = kOthers / Atom::kK;
  using Quad = T __attribute__((ext_vector_type(4)));
  typename Atom::Operand v[kSteps][kCols / 16];

  template <class Tile> HK_DEVICE void read(const Tile& mt) {
    static_assert(Tile::kRows == kCols && Tile::kCols == kOthers, "Mᵀ: a row a column of M");
    const unsigned l = lane_id();
#pragma unroll
    for (unsigned step = 0; step < kSteps; ++step)
#pragma unroll
      for (unsigned n = 0; n < kCols / 16; ++n)
#pragma unroll
        for (unsigned e = 0; e < Atom::kPerLane; e += 4) {
          const Quad q = *reinterpret_cast<const Quad*>(
              mt.at(16 * n + l % 16, TransposedOrder<T>::other(step, e, l)));
#pragma unroll
          for (unsigned i = 0; i < 4; ++i) v[step][n][e + i] = q[i];
        }
  }
};
#endif

// X = Own·Otherᵀ for a wave's 16 kOwnTiles own rows and a block of kOthers other rows (see the
// header), f32.
template <typename T, unsigned kOwnTiles, unsigned kOthers> struct RowScores : OwnRows<kOwnTiles> {
  using Atom = MmaAtom<T>;
  using Rows = OwnRows<kOwnTiles>;
  static_assert(kOthers % 32 == 0, "whole pairs of 16-row atoms (gfx950's k = 32)");
#if HK_NVIDIA
  Accumulators<T, kOwnTiles, kOthers / 16> x;  // [own][other]
#else
  Accumulators<T, kOthers / 16, kOwnTiles> x;  // transposed: [other][own]
#endif

  // x = own[row0 .. row0 + 16 kOwnTiles) · other[0 .. kOthers)ᵀ over kDepth columns, both tiles
  // [row][column].
  template <unsigned kDepth, class OwnTile, class OtherTile>
  HK_DEVICE void compute(const OwnTile& own, const OtherTile& other, unsigned row0) {
    static_assert(kDepth % Atom::kK == 0, "whole atoms of depth");
    x.zero();
    // Partly unrolled on NVIDIA: whole, ptxas hoists the operand reads of every step above the
    // first products and the wave's registers run out (the forward pass at d = 128 spilled on
    // sm_90; 2 and 4 steps are what left it without spills). AMD's registers hold it whole.
    constexpr unsigned kUnroll = HK_AMD ? kDepth / Atom::kK : kDepth <= 128 ? 2 : 4;
#pragma unroll kUnroll
    for (unsigned d = 0; d < kDepth; d += Atom::kK) {
#if HK_NVIDIA
      mma<BLayout::kNK>(x, own, other, row0, 0, d);
#else
      mma<BLayout::kNK>(x, other, own, 0, row0, d);
#endif
    }
  }

#if HK_AMD
  // x = own·otherᵀ from operands in registers (AMD): own's rows by other's, kDepth deep.
  template <unsigned kDepth>
  HK_DEVICE void compute(const RowOperands<T, kOwnTiles, kDepth>& own,
                         const RowOperands<T, kOthers / 16, kDepth>& other) {
    x.zero();
#pragma unroll
    for (unsigned d = 0; d < kDepth / Atom::kK; ++d)
#pragma unroll
      for (unsigned j = 0; j < kOthers / 16; ++j)
#pragma unroll
        for (unsigned i = 0; i < kOwnTiles; ++i)
          Atom::mma(x.tile[j][i], typename Atom::A{other.v[j][d]}, typename Atom::B{own.v[i][d]});
  }
#endif

  // Replaces each of the lane's values v with f(slot, own, other, v), own relative to the
  // wave's first row and other to the block's. (By value: AMD's accumulators are vectors, whose
  // elements bind to no reference.)
  template <typename F> HK_DEVICE void map(F f) {
    Rows::template each<decltype(x)>([&](unsigned i, unsigned j, unsigned v, unsigned slot, unsigned own,
                                         unsigned other) HK_INLINE {
      x.tile[i][j].v[v] = f(slot, own, other, x.tile[i][j].v[v]);
    });
  }

  // Replaces each value v with f(slot, own, other, v, w), w the value at the same place of b.
  template <typename F> HK_DEVICE void map_with(const RowScores& b, F f) {
    Rows::template each<decltype(x)>([&](unsigned i, unsigned j, unsigned v, unsigned slot, unsigned own,
                                         unsigned other) HK_INLINE {
      x.tile[i][j].v[v] = f(slot, own, other, x.tile[i][j].v[v], b.x.tile[i][j].v[v]);
    });
  }
};

#if HK_AMD
// X's values as the operands of Y += X·M (AMD), converted to T in TransposedOrder.
template <typename T, unsigned kOwnTiles, unsigned kOthers> struct ScoreOperands {
  using Atom = MmaAtom<T>;
  static constexpr unsigned kSteps = kOthers / Atom::kK;
  typename Atom::Operand v[kSteps][kOwnTiles];

  HK_DEVICE void convert(const RowScores<T, kOwnTiles, kOthers>& xs) {
#pragma unroll
    for (unsigned step = 0; step < kSteps; ++step)
#pragma unroll
      for (unsigned e = 0; e < Atom::kPerLane; ++e)
#pragma unroll
        for (unsigned i = 0; i < kOwnTiles; ++i)
          v[step][i][e] = static_cast<T>(xs.x.tile[TransposedOrder<T>::block(step, e)][i].v[e % 4]);
  }
};
#endif

// Y += X·M for a wave's 16 kOwnTiles own rows and kCols columns, f32, with X a RowScores in
// registers and M a shared tile [other][column] (see the header).
template <typename T, unsigned kOwnTiles, unsigned kCols> struct RowSums : OwnRows<kOwnTiles> {
  using Atom = MmaAtom<T>;
  using Rows = OwnRows<kOwnTiles>;
  static_assert(kCols % 16 == 0, "whole atoms of columns");
#if HK_NVIDIA
  Accumulators<T, kOwnTiles, kCols / 16> y;  // [own][column]
#else
  Accumulators<T, kCols / 16, kOwnTiles> y;  // transposed: [column][own]
#endif

  HK_DEVICE void zero() { y.zero(); }

  template <unsigned kOthers, class MTile>
  HK_DEVICE void add(const RowScores<T, kOwnTiles, kOthers>& xs, const MTile& m) {
    const auto& x = xs.x;
#if HK_NVIDIA
#pragma unroll
    for (unsigned j = 0; j < kOthers / 16; ++j) {
      // The 16x16 accumulator block j is the A fragment of step j (hk/tile/mma_sync.h).
      typename Atom::A a[kOwnTiles];
#pragma unroll
      for (unsigned i = 0; i < kOwnTiles; ++i) {
        const auto& c = x.tile[i][j].v;
        a[i] = {{pack(c[0], c[1]), pack(c[2], c[3]), pack(c[4], c[5]), pack(c[6], c[7])}};
      }
#pragma unroll
      for (unsigned n = 0; n < kCols / 16; ++n) {
        const typename Atom::B b = Atom::load_b_kn(m, 16 * j, 16 * n);
#pragma unroll
        for (unsigned i = 0; i < kOwnTiles; ++i) Atom::mma(y.tile[i][n], a[i], b);
      }
    }
#else
    constexpr unsigned kPer = Atom::kPerLane;  // other rows per lane of one step
    const unsigned l = lane_id();
#pragma unroll
    for (unsigned step = 0; step < kOthers / Atom::kK; ++step) {
      // Xᵀ's accumulator blocks are B fragments; a step of k = 32 takes 4 rows of each of two.
      typename Atom::B b[kOwnTiles];
      unsigned other[kPer];  // the step's other rows in this lane's operand order
#pragma unroll
      for (unsigned e = 0; e < kPer; ++e) {
        const unsigned block = TransposedOrder<T>::block(step, e);
#pragma unroll
        for (unsigned i = 0; i < kOwnTiles; ++i)
          b[i].v[e] = static_cast<T>(x.tile[block][i].v[e % 4]);
        other[e] = TransposedOrder<T>::other(step, e, l);
      }
#pragma unroll
      for (unsigned n = 0; n < kCols / 16; ++n) {
        typename Atom::A mt;  // Mᵀ, read in the same order of other rows
#pragma unroll
        for (unsigned e = 0; e < kPer; ++e) mt.v[e] = *m.at(other[e], 16 * n + l % 16);
#pragma unroll
        for (unsigned i = 0; i < kOwnTiles; ++i) Atom::mma(y.tile[n][i], mt, b[i]);
      }
    }
#endif
  }

#if HK_AMD
  // Y += X·M from operands in registers (AMD).
  template <unsigned kOthers>
  HK_DEVICE void add(const ScoreOperands<T, kOwnTiles, kOthers>& x,
                     const TransposedOperands<T, kOthers, kCols>& mt) {
#pragma unroll
    for (unsigned step = 0; step < kOthers / Atom::kK; ++step)
#pragma unroll
      for (unsigned n = 0; n < kCols / 16; ++n)
#pragma unroll
        for (unsigned i = 0; i < kOwnTiles; ++i)
          Atom::mma(y.tile[n][i], typename Atom::A{mt.v[step][n]}, typename Atom::B{x.v[step][i]});
  }
#endif

  // Replaces each of the lane's values v with f(slot, own, column, v).
  template <typename F> HK_DEVICE void map(F f) {
    Rows::template each<decltype(y)>([&](unsigned i, unsigned j, unsigned v, unsigned slot, unsigned own,
                                         unsigned column) HK_INLINE {
      y.tile[i][j].v[v] = f(slot, own, column, y.tile[i][j].v[v]);
    });
  }

  // Calls f(slot, own, column, run) for each run of kRun values of the lane that are neighbours
  // in one own row (columns column .. column + kRun - 1), for wider stores: NVIDIA's
  // accumulator pairs, AMD's four rows of a transposed block.
  static constexpr unsigned kRun = HK_NVIDIA ? 2 : 4;
  template <typename F> HK_DEVICE void for_each_run(F f) const {
    Rows::template each<decltype(y), kRun>([&](unsigned i, unsigned j, unsigned v, unsigned slot,
                                               unsigned own, unsigned column) HK_INLINE {
      float run[kRun];
#pragma unroll
      for (unsigned e = 0; e < kRun; ++e) run[e] = y.tile[i][j].v[v + e];
      f(slot, own, column, run);
    });
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

// The forward pass's wave: its 16 kQueryTiles queries against blocks of kKeys keys of head
// dimension kD, with output head dimension kDv, and the online softmax between.
template <typename T, unsigned kQueryTiles, unsigned kKeys, unsigned kD, unsigned kDv>
struct FlashWave : OwnRows<kQueryTiles> {
  using Rows = OwnRows<kQueryTiles>;
  using Rows::kSlots;
  static constexpr unsigned kQueries = 16 * kQueryTiles;
  static constexpr unsigned kRun = RowSums<T, kQueryTiles, kDv>::kRun;
  RowScores<T, kQueryTiles, kKeys> s;
  RowSums<T, kQueryTiles, kDv> o;
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
    s.template compute<kD>(q, k, q_row0);
  }

  // The online softmax step over scores already scaled to base 2 (masked ones -inf): raises
  // the running maxima, rescales the output and sums by what they grew, and turns the scores
  // into probabilities exp2(score - max).
  HK_DEVICE void softmax() {
    float block_max[kSlots];
#pragma unroll
    for (unsigned q = 0; q < kSlots; ++q) block_max[q] = -__builtin_inff();
    s.map([&](unsigned q, unsigned, unsigned, float x) HK_INLINE {
      block_max[q] = hk::max(block_max[q], x);
      return x;
    });
    float scale[kSlots];
#pragma unroll
    for (unsigned q = 0; q < kSlots; ++q) {
      const float next = hk::max(max[q], Rows::across_row(block_max[q], Max{}));
      // A query that has seen no visible key yet keeps max = -inf; its probabilities must come
      // out 0, not exp2(-inf - -inf) = NaN, so it subtracts 0 instead.
      const float shift = next == -__builtin_inff() ? 0.0f : next;
      scale[q] = exp2(max[q] - shift);
      max[q] = next;
      sum[q] *= scale[q];
      block_max[q] = shift;
    }
    s.map([&](unsigned q, unsigned, unsigned, float x) HK_INLINE {
      const float p = exp2(x - block_max[q]);
      sum[q] += p;
      return p;
    });
    o.map([&](unsigned q, unsigned, unsigned, float x) HK_INLINE { return x * scale[q]; });
  }

  // o += P·V over the block's keys, with P from the scores (after softmax()) and V the tile
  // [key][d].
  template <class VTile> HK_DEVICE void accumulate(const VTile& v) { o.add(s, v); }

  // Ends the walk over the keys: divides the outputs by their sums and gives each slot's
  // log-sum-exp of the unscaled-to-base-2 scores, in natural units. A query that saw no key
  // gets outputs 0 and -inf.
  HK_DEVICE void finish(float (&lse)[kSlots]) {
    float inv[kSlots];
#pragma unroll
    for (unsigned q = 0; q < kSlots; ++q) {
      const float total = Rows::across_row(sum[q], Sum{});
      inv[q] = total > 0.0f ? rcp(total) : 0.0f;
      lse[q] = total > 0.0f ? (max[q] + log2(total)) * kLn2 : -__builtin_inff();
    }
    o.map([&](unsigned q, unsigned, unsigned, float x) HK_INLINE { return x * inv[q]; });
  }
};

#if HK_AMD
// FlashWave for hk/tile/pingpong.h's schedule (AMD): every product's operands are in registers
// before the matrix cluster that multiplies them, read in the memory cluster before it. The
// queries' operands are loaded once a query block straight from global memory (Q takes no LDS),
// the keys' (read_keys, from K [key][d]) and values' (read_values, from Vᵀ [d][key]) from a
// stage, and softmax() leaves P as the operands of O += P·V.
template <typename T, unsigned kQueryTiles, unsigned kKeys, unsigned kD, unsigned kDv>
struct RegisterFlashWave : FlashWave<T, kQueryTiles, kKeys, kD, kDv> {
  using Base = FlashWave<T, kQueryTiles, kKeys, kD, kDv>;
  RowOperands<T, kQueryTiles, kD> q;
  RowOperands<T, kKeys / 16, kD> k;
  TransposedOperands<T, kKeys, kDv> v;
  ScoreOperands<T, kQueryTiles, kKeys> p;

  // The queries of rows [row0, row0 + kQueries) of g ([query][d]).
  HK_DEVICE void load_queries(const GlobalMatrix<T>& g, unsigned row0, bool vector) {
    q.load(g, row0, vector);
  }
  template <class KTile> HK_DEVICE void read_keys(const KTile& t) { k.read(t); }
  template <class VtTile> HK_DEVICE void read_values(const VtTile& t) { v.read(t); }

  // The matrix clusters: s = the scores of the queries against the keys read, and o += P·V.
  HK_DEVICE void score() { this->s.template compute<kD>(q, k); }
  HK_DEVICE void accumulate() { this->o.add(p, v); }

  HK_DEVICE void softmax() {
    Base::softmax();
    p.convert(this->s);
  }
};
#endif

}  // namespace hk::tile
