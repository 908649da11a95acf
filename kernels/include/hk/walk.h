// hk/walk.h: how threads cover the data of memory-bound kernels, so that kernels only say what
// happens to each pack of elements.
//
// for_each_row: rows of a row-major [rows, cols] tensor, each handled by a team of threads that
// walks it in one or more passes (a norm's statistics pass, then its output pass). A team has
// enough lanes (a power of two from 8 to the kernel's kBlock) that each lane holds at most 4
// 16-byte vectors of the row; teams within a wave need no barriers. Lane t of a team of size S
// handles the 16-byte vectors t, t + S, t + 2S, ... of the row (coalesced), or single elements
// the same way when a vector path is impossible (cols not a multiple of the vector width, or a
// pointer not 16-byte aligned).
// Rows of up to 4 vectors per lane stay in registers between passes (up to 8192 bf16/f16 or
// 4096 f32 elements with kBlock = 256); longer rows are read again by later passes, two
// vectors a lane at a time, mostly from cache. A later pass can also hand each pack the packs
// at the same columns of per-column vectors (a norm's weight and bias), read ahead of their use;
// on short rows (at most two vectors a lane), which take a walk of their own unless the kernel
// opts out (ShortRows), the first pass already reads them, with the row.
//
// for_each_pack: a grid walks a flat array of n elements in 16-byte vectors with a grid stride,
// finishing a ragged end element by element.
#pragma once

#include "device.h"
#include "reduce.h"

namespace hk {

// Offset of row `row` in a row-major tensor with `cols` columns (64-bit: rows * cols may not
// fit in 32 bits).
HK_DEVICE unsigned long long row_offset(unsigned row, unsigned cols) {
  return static_cast<unsigned long long>(row) * cols;
}

// The number of indices first, first + stride, ... below end: a grid-stride walk's trip count,
// counted up front because the index after the last may pass 2^32 and wrap (a walk compared
// against end then never ends). (A test of end - i against the stride each step made ptxas
// spill softmax on sm_90.)
HK_DEVICE unsigned stride_trips(unsigned first, unsigned stride, unsigned end) {
  return first < end ? (end - first - 1) / stride + 1 : 0;
}

// ---- Teams ----------------------------------------------------------------------------------
// The threads that handle one row together: kLanes consecutive threads of a one-dimensional
// block of kBlock (both powers of two, kLanes <= kBlock), kBlock / kLanes teams per block. A
// team within a wave reduces with shuffles alone; a larger one through shared memory, at one
// block barrier per reduction, so all the teams of its block must reduce together (kBarriers).
// (The number of teams in a block is a constant rather than block_dim_x() / kLanes: computed
// at run time, it made ptxas spill softmax and the f16 RMSNorm on sm_90.)
template <unsigned kBlock, unsigned kLanes> class Team {
 public:
  static constexpr unsigned kSize = kLanes;
  static constexpr unsigned kPerBlock = kBlock / kLanes;
  static constexpr bool kBarriers = kLanes > kWaveSize;
  static_assert(kPerBlock * kLanes == kBlock, "teams tile the block");

  HK_DEVICE unsigned rank() const { return thread_idx_x() % kSize; }
  // This team's slot in the block: its rows are block_idx_x() * kPerBlock + index(), then every
  // grid_dim_x() * kPerBlock rows.
  HK_DEVICE unsigned index() const { return thread_idx_x() / kSize; }

  template <typename T, typename Op> HK_DEVICE T reduce(T v, Op op) {
    if constexpr (kBarriers) {
      constexpr unsigned kWaves = kLanes / kWaveSize;
      return reducer_.reduce_waves(v, op, index() * kWaves, kWaves);
    } else {
      return lanes_reduce<kSize>(v, op);
    }
  }

 private:
  BlockReducer reducer_;  // used by teams that span waves only (one register otherwise dropped)
};

// ---- Rows -----------------------------------------------------------------------------------
// The team size for rows of `row_bytes`: enough lanes that each holds at most 4 16-byte
// vectors (64 bytes), a power of two from 8 up to the block. Rows that need more than kBlock
// lanes are walked a tile at a time.
template <unsigned kBlock> HK_DEVICE constexpr unsigned team_lanes(unsigned long long row_bytes) {
  unsigned lanes = 8;
  while (lanes < kBlock && lanes * 64ull < row_bytes) lanes *= 2;
  return lanes;
}

// The part of one row a lane keeps in registers between passes. Kept as raw bits: the element
// view is made only where a pass looks at it, which keeps 16-bit elements packed two to a
// register in between.
template <unsigned kTile> struct RowTile {
  u32x4 bits[kTile];
};

// One team's walk over rows of T with `cols` columns; it holds the registers a row is kept in
// between passes. With kAhead > 0, the number of per-column vectors its passes read, and a tile
// of at most two vectors, it is a short-row walk: the first pass also reads the lane's packs of
// those vectors and holds them, so that their latency overlaps the row's reductions instead of
// following them. On the H100, bf16 RMSNorm of 65536x128 went from 14.5-14.7 to 13.4-13.6 µs
// and LayerNorm from 15.6-15.7 to 14.5-14.6 µs with it (four runs each, rows of any length
// otherwise unchanged).
template <typename T, typename TeamT, unsigned kTile = 4, unsigned kAhead = 0> class RowWalk {
 public:
  static constexpr unsigned kVec = kVec16<T>;
  static constexpr unsigned kLanes = TeamT::kSize;
  // Vectors a lane reads at once when a later pass reads a long row again (mostly from cache):
  // fewer than kTile, as those registers add to what the kernel as a whole needs (with 4,
  // LayerNorm's 16-bit forms spill under 64 registers on sm_90).
  static constexpr unsigned kReread = 2;

  // `aligned`: every row pointer the kernel will touch is 16-byte aligned at row 0.
  HK_DEVICE RowWalk(unsigned cols, bool aligned)
      : cols_(cols),
        vectors_(aligned && cols % kVec == 0),
        nvec_(cols / kVec),
        resident_(vectors_ && nvec_ <= kTile * kLanes) {}

  HK_DEVICE TeamT& team() { return team_; }

  // Whether a row stays in registers between passes (later passes then read no memory).
  HK_DEVICE bool resident() const { return resident_; }

  // An idle team (past the last row, while its block's other teams still work) makes no passes
  // but still takes part in reductions, with nothing to add.
  HK_DEVICE void set_idle(bool idle) { idle_ = idle; }

  // op over v of every lane of the team (sum, max, or any hk/reduce.h operation).
  template <typename V, typename Op> HK_DEVICE V reduce(V v, Op op) { return team_.reduce(v, op); }
  HK_DEVICE float sum(float v) { return team_.reduce(v, Sum{}); }
  HK_DEVICE float max(float v) { return team_.reduce(v, Max{}); }

  // The first pass over a row, in two steps for each lane: `load(i, n)` reads the pack of n
  // elements at column i (memory reads, and arithmetic on them alone) for every pack the lane
  // holds, so that all of its loads are in flight together; then `see(i, n, loaded)` takes the
  // packs in order (accumulates a sum, stores a residual) and returns the values later passes
  // will see there. `columns` are the kAhead per-column vectors that later passes read, the
  // same ones they are given; a short-row walk reads its packs of them here.
  template <typename Load, typename See, typename... C>
  HK_DEVICE void first_pass(Load load, See see, const C*... columns) {
    static_assert(sizeof...(C) == kAhead, "first_pass takes the walk's kAhead column vectors");
    // Written whole on every row, so the previous row's values are dead (not kept in
    // registers across the row loop) whichever path this row takes.
    tile_ = RowTile<kTile>{};
    if (idle_) return;
    const unsigned t = team_.rank();
    if (resident_) {
      // Every load is issued before any is used. Each pack is guarded (the lane may hold fewer
      // than kTile), and a guarded block that loaded and then used its pack would make the
      // lane wait for each load in turn unless the compiler happened to predicate it.
      decltype(load(0u, Width<kVec>{})) loaded[kTile] = {};
#pragma unroll
      for (unsigned c = 0; c < kTile; ++c) {
        const unsigned v = c * kLanes + t;
        if (v < nvec_) loaded[c] = load(v * kVec, Width<kVec>{});
      }
#pragma unroll
      for (unsigned c = 0; c < kTile; ++c) {
        const unsigned v = c * kLanes + t;
        if (v < nvec_) tile_.bits[c] = __builtin_bit_cast(u32x4, see(v * kVec, Width<kVec>{}, loaded[c]));
      }
      // After the row's packs are used, so that their registers are free again; still before
      // the reductions that follow this pass.
      if constexpr (kShort) {
        unsigned k = 0;
        ((ahead_[k++] = read<kTile>(columns, 0)), ...);
      }
    } else if (vectors_) {
      // Rows too long for registers are read again by later passes anyway; holding a whole
      // round of loads here as well would cost registers that the resident path needs.
      for (unsigned v = t; v < nvec_; v += kLanes) see(v * kVec, Width<kVec>{}, load(v * kVec, Width<kVec>{}));
    } else {
      for (unsigned i = t; i < cols_; i += kLanes) see(i, Width<1>{}, load(i, Width<1>{}));
    }
  }

  // A later pass: `visit(i, n, values, column packs...)` for the pack at column i: the values
  // produced by the first pass, taken from registers when the row fits there and else read
  // again from `reread` (the row holding them: the input, or the buffer the first pass wrote
  // them to), then the pack at i of each per-column vector in `columns` (a norm's weight): none,
  // or the kAhead ones given to first_pass, whose packs a short-row walk already holds.
  template <typename Visit, typename... C>
  HK_DEVICE void pass(const T* reread, Visit visit, const C*... columns) const {
    static_assert(kAhead == 0 || sizeof...(C) == 0 || sizeof...(C) == kAhead,
                  "a pass reads no column vectors or the ones given to first_pass");
    if (idle_) return;
    const unsigned t = team_.rank();
    if constexpr (kShort && sizeof...(C) == 1) {
      if (resident_) return visit_resident<kTile>(0, visit, ahead_[0]);
    }
    if constexpr (kShort && sizeof...(C) == 2) {
      if (resident_) return visit_resident<kTile>(0, visit, ahead_[0], ahead_[1]);
    }
    if (resident_) {
      // The column packs of kHeld slots are all read before any is used (the arguments are
      // evaluated before the call); one load after another would each wait in turn.
#pragma unroll
      for (unsigned first = 0; first < kTile; first += kHeld)
        visit_resident<kHeld>(first, visit, read<kHeld>(columns, first * kLanes)...);
    } else if (vectors_) {
      for (unsigned base = 0; base < nvec_; base += kReread * kLanes) {
        const RowTile<kReread> again = read<kReread>(reread, base);
#pragma unroll
        for (unsigned c = 0; c < kReread; ++c) {
          const unsigned v = base + c * kLanes + t;
          if (v < nvec_)
            visit(v * kVec, Width<kVec>{}, __builtin_bit_cast(Vec16<T>, again.bits[c]),
                  load16(columns + v * kVec)...);
        }
      }
    } else {
      for (unsigned i = t; i < cols_; i += kLanes)
        visit(i, Width<1>{}, load(reread + i, Width<1>{}), load(columns + i, Width<1>{})...);
    }
  }

 private:
  // Slots whose column packs a lane reads at once in a later pass over a resident row: all
  // kTile of them would take registers that the row itself needs (ptxas spills under the
  // norms' 64-register budget).
  static constexpr unsigned kHeld = kTile / 2;

  // The lane's vectors base + c * kLanes + rank, c < kCount, of the row at `row` (zero past
  // its end), all read before any is used.
  template <unsigned kCount> HK_DEVICE RowTile<kCount> read(const T* row, unsigned base) const {
    RowTile<kCount> tile;
#pragma unroll
    for (unsigned c = 0; c < kCount; ++c) {
      const unsigned v = base + c * kLanes + team_.rank();
      tile.bits[c] = v < nvec_ ? __builtin_bit_cast(u32x4, load16(row + v * kVec)) : u32x4{};
    }
    return tile;
  }

  // Visits the slots [first, first + kCount) of a resident row with their column packs (held
  // ahead by first_pass on a short-row walk, or just read).
  template <unsigned kCount, typename Visit, typename... Tiles>
  HK_DEVICE void visit_resident(unsigned first, Visit& visit, const Tiles&... columns) const {
#pragma unroll
    for (unsigned c = 0; c < kCount; ++c) {
      const unsigned v = (first + c) * kLanes + team_.rank();
      if (v < nvec_)
        visit(v * kVec, Width<kVec>{}, __builtin_bit_cast(Vec16<T>, tile_.bits[first + c]),
              __builtin_bit_cast(Vec16<T>, columns.bits[c])...);
    }
  }

  // Whether this walk reads column packs ahead (see the class comment); two vectors of each of
  // at most two column vectors fit beside the row's two in registers.
  static constexpr bool kShort = kAhead > 0 && kTile <= 2;
  static_assert(kAhead <= 2, "at most two column vectors are read ahead");

  TeamT team_;
  RowTile<kTile> tile_;
  RowTile<kTile> ahead_[kShort ? kAhead : 1];
  unsigned cols_;
  bool vectors_;
  unsigned nvec_;
  bool resident_;
  bool idle_ = false;
};

// The smallest block intended for rows (see for_each_row): one AMD wave, two NVIDIA warps. Short
// rows' teams share blocks of this size rather than of 256 threads: on the H100 that took bf16
// rows of 128 at 65536 rows from 13.54 to 13.31 µs (RMSNorm), 14.46 to 13.95 µs (LayerNorm) and
// 14.37 to 14.14 µs (softmax), medians of three runs each; the benchmark's other shapes of the
// norms and softmax moved by -1.2% to +1.3%. 32-thread blocks were 10-11% slower.
inline constexpr unsigned kMinBlock = 64;

// How for_each_row walks short rows, those of at most two 16-byte vectors a lane of an 8-lane
// team (256 bytes): with a walk of their own, whose tile is those two vectors and which reads
// the kAhead column vectors with the row (see RowWalk), or with the 4-vector walk that rows of up
// to 512 bytes take. Their own walk is faster: on the H100 it took softmax of bf16 rows of 128
// from 4.80-4.93 to 4.48-4.58 µs at 128 rows, 7.36-7.55 to 7.14-7.30 µs at 16384 rows and
// 14.11-14.30 to 13.38-13.50 µs at 65536 rows (eight runs each, in two device calls); its
// longer rows did not move. Its code adds to the registers a kernel needs, though, which one
// near its budget may not afford (kShared).
enum class ShortRows { kOwnWalk, kShared };

namespace detail {
// Blocks of kMinBlock threads, or of one team where a team is larger (see for_each_row).
template <unsigned kLanes> inline constexpr unsigned kRowBlock = kLanes > kMinBlock ? kLanes : kMinBlock;

template <typename T, unsigned kLanes, unsigned kTile, unsigned kAhead, typename Body>
HK_DEVICE void walk_rows(unsigned rows, unsigned cols, bool aligned, Body& body) {
  using TeamT = Team<kRowBlock<kLanes>, kLanes>;
  RowWalk<T, TeamT, kTile, kAhead> walk(cols, aligned);
  const unsigned stride = grid_dim_x() * TeamT::kPerBlock;
  const unsigned first = block_idx_x() * TeamT::kPerBlock;
  const unsigned index = walk.team().index();
  if constexpr (TeamT::kBarriers) {
    // The block's teams go round together, the ones past the last row idle, so that all of
    // them reach every barrier of every reduction.
    unsigned base = first;
    for (unsigned n = stride_trips(first, stride, rows); n > 0; --n, base += stride) {
      walk.set_idle(base + index >= rows);
      body(walk, base + index);
    }
  } else {
    unsigned r = first + index;
    for (unsigned n = stride_trips(r, stride, rows); n > 0; --n, r += stride) body(walk, r);
  }
}
}  // namespace detail

// Calls `body(walk, row)` for every row of a [rows, cols] tensor of T, in a one-dimensional
// grid of blocks of at most kBlock threads: `walk` is the RowWalk of the team that owns the row
// (the same object for all the rows of a team, so team reductions keep their state). A row of
// B bytes gets a team of L = team_lanes<kBlock>(B) lanes, and the kernel's launch contract (in
// its manifest) must give blocks of exactly max(L, kMinBlock) threads; any grid is correct, but
// teams laid out for one block size cover some rows twice, or none, in blocks of another. (A
// check of the block size here made ptxas spill softmax on sm_90.) `body` may see a row index
// past the last row on an idle team: it must only touch memory through the walk's passes.
// kAhead: how many per-column vectors the passes read (given to first_pass and to the pass that
// reads them). kShortRows: how short rows are walked (see ShortRows).
template <typename T, unsigned kBlock, unsigned kAhead = 0, ShortRows kShortRows = ShortRows::kOwnWalk,
          typename Body>
HK_DEVICE void for_each_row(unsigned rows, unsigned cols, bool aligned, Body body) {
  // A short row: kShortTile 16-byte vectors a lane of an 8-lane team.
  constexpr unsigned kShortTile = 2;
  constexpr unsigned long long kShortRowBytes = 8 * kShortTile * 16;
  const unsigned long long row_bytes = static_cast<unsigned long long>(cols) * sizeof(T);
  if (kShortRows == ShortRows::kOwnWalk && row_bytes <= kShortRowBytes)
    return detail::walk_rows<T, 8, kShortTile, kAhead>(rows, cols, aligned, body);
  switch (team_lanes<kBlock>(row_bytes)) {
    case 8: return detail::walk_rows<T, 8, 4, kAhead>(rows, cols, aligned, body);
    case 16: return detail::walk_rows<T, 16, 4, kAhead>(rows, cols, aligned, body);
    case 32: return detail::walk_rows<T, 32, 4, kAhead>(rows, cols, aligned, body);
    case 64: return detail::walk_rows<T, 64, 4, kAhead>(rows, cols, aligned, body);
    case 128: return detail::walk_rows<T, 128, 4, kAhead>(rows, cols, aligned, body);
    default: return detail::walk_rows<T, kBlock, 4, kAhead>(rows, cols, aligned, body);
  }
}

// ---- Flat arrays ----------------------------------------------------------------------------
// Calls `visit(i, n)` for packs of n elements starting at i that together cover [0, n_total)
// once, spread over every thread of the grid (one-dimensional blocks and grid). With
// `aligned` (every pointer the kernel touches is 16-byte aligned) the packs are 16-byte
// vectors of T and only the last n_total % kVec16<T> elements go one by one.
template <typename T, typename Visit>
HK_DEVICE void for_each_pack(unsigned long long n_total, bool aligned, Visit visit) {
  constexpr unsigned kVec = kVec16<T>;
  const unsigned long long threads = static_cast<unsigned long long>(grid_dim_x()) * block_dim_x();
  const unsigned long long first =
      static_cast<unsigned long long>(block_idx_x()) * block_dim_x() + thread_idx_x();
  const unsigned long long body = aligned ? n_total / kVec * kVec : 0;
  for (unsigned long long i = first * kVec; i < body; i += threads * kVec) visit(i, Width<kVec>{});
  for (unsigned long long i = body + first; i < n_total; i += threads) visit(i, Width<1>{});
}

}  // namespace hk
