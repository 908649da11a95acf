// hk/walk.h: how threads cover the data of memory-bound kernels, so that kernels only say what
// happens to each pack of elements.
//
// for_each_row: rows of a row-major [rows, cols] tensor, each handled by a team of threads that
// walks it in one or more passes (a norm's statistics pass, then its output pass). Rows of up
// to 2 KiB go to a team of 32 lanes (8 rows at a time in a 256-thread block, no barriers);
// longer rows to the whole block. Lane t of a team of size S handles the 16-byte vectors t,
// t + S, t + 2S, ... of the row (coalesced), or single elements the same way when a vector path
// is impossible (cols not a multiple of the vector width, or a pointer not 16-byte aligned).
// Rows of up to 4 vectors per lane stay in registers between passes (the whole 2 KiB row of a
// lane team; 8192 bf16/f16 or 4096 f32 elements for a 256-thread block); longer rows are read
// again by later passes, a tile at a time, mostly from cache.
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

// ---- Teams ----------------------------------------------------------------------------------
// The threads that handle one row together: rank() within the team, the rows it takes
// (first_row(), then every row_stride()), and reductions over the team.

// A whole one-dimensional block of kBlock threads per row, blocks striding over the rows.
template <unsigned kBlock> class BlockTeam {
 public:
  static constexpr unsigned kSize = kBlock;
  HK_DEVICE unsigned rank() const { return thread_idx_x(); }
  HK_DEVICE unsigned first_row() const { return block_idx_x(); }
  HK_DEVICE unsigned row_stride() const { return grid_dim_x(); }
  template <typename T, typename Op> HK_DEVICE T reduce(T v, Op op) { return reducer_.reduce(v, op); }

 private:
  BlockReducer reducer_;
};

// 32 consecutive lanes per row (a warp, or half an AMD wave), kBlock / 32 rows per block.
template <unsigned kBlock> class LaneTeam {
 public:
  static constexpr unsigned kSize = 32;
  static constexpr unsigned kPerBlock = kBlock / kSize;
  HK_DEVICE unsigned rank() const { return thread_idx_x() % kSize; }
  HK_DEVICE unsigned first_row() const { return block_idx_x() * kPerBlock + thread_idx_x() / kSize; }
  HK_DEVICE unsigned row_stride() const { return grid_dim_x() * kPerBlock; }
  template <typename T, typename Op> HK_DEVICE T reduce(T v, Op op) { return lanes_reduce<kSize>(v, op); }
};

// ---- Rows -----------------------------------------------------------------------------------
// Rows up to this size go to a LaneTeam (32 lanes x 4 vectors x 16 bytes: all in registers).
inline constexpr unsigned kLaneTeamRowBytes = 2048;

// The part of one row a lane keeps in registers between passes. Kept as raw bits: the element
// view is made only where a pass looks at it, which keeps 16-bit elements packed two to a
// register in between.
template <unsigned kTile> struct RowTile {
  u32x4 bits[kTile];
};

// One team's walk over rows of T with `cols` columns; it holds the registers a row is kept in
// between passes.
template <typename T, typename Team, unsigned kTile = 4> class RowWalk {
 public:
  static constexpr unsigned kVec = kVec16<T>;

  // `aligned`: every row pointer the kernel will touch is 16-byte aligned at row 0.
  HK_DEVICE RowWalk(unsigned cols, bool aligned)
      : cols_(cols), vectors_(aligned && cols % kVec == 0), nvec_(cols / kVec) {}

  HK_DEVICE Team& team() { return team_; }

  // op over v of every lane of the team (sum, max, or any hk/reduce.h operation).
  template <typename V, typename Op> HK_DEVICE V reduce(V v, Op op) { return team_.reduce(v, op); }
  HK_DEVICE float sum(float v) { return team_.reduce(v, Sum{}); }
  HK_DEVICE float max(float v) { return team_.reduce(v, Max{}); }

  // The first pass over a row. `produce(i, n)` makes the pack of n elements at column i (loads
  // them, and whatever else the kernel does on first sight, such as accumulating a sum) and
  // returns the values later passes will see there.
  template <typename Produce> HK_DEVICE void first_pass(Produce produce) {
    const unsigned t = team_.rank();
    if (!vectors_) {
      for (unsigned i = t; i < cols_; i += Team::kSize) produce(i, Width<1>{});
      return;
    }
    for (unsigned base = 0; base < nvec_; base += kTile * Team::kSize) {
#pragma unroll
      for (unsigned c = 0; c < kTile; ++c) {
        const unsigned v = base + c * Team::kSize + t;
        if (v < nvec_) tile_.bits[c] = __builtin_bit_cast(u32x4, produce(v * kVec, Width<kVec>{}));
      }
    }
  }

  // A later pass: `visit(i, n, values)` for the pack at column i, the values produced by the
  // first pass, taken from registers when the row fits there and else read again from `reread`
  // (the row holding them: the input, or the buffer the first pass wrote them to).
  template <typename Visit> HK_DEVICE void pass(const T* reread, Visit visit) const {
    const unsigned t = team_.rank();
    if (!vectors_) {
      for (unsigned i = t; i < cols_; i += Team::kSize) visit(i, Width<1>{}, load(reread + i, Width<1>{}));
      return;
    }
    if (nvec_ <= kTile * Team::kSize) {
      visit_tile(tile_, 0, visit);
      return;
    }
    for (unsigned base = 0; base < nvec_; base += kTile * Team::kSize) {
      RowTile<kTile> again;
#pragma unroll
      for (unsigned c = 0; c < kTile; ++c) {
        const unsigned v = base + c * Team::kSize + t;
        if (v < nvec_) again.bits[c] = __builtin_bit_cast(u32x4, load16(reread + v * kVec));
      }
      visit_tile(again, base, visit);
    }
  }

 private:
  template <typename Visit>
  HK_DEVICE void visit_tile(const RowTile<kTile>& tile, unsigned base, Visit visit) const {
#pragma unroll
    for (unsigned c = 0; c < kTile; ++c) {
      const unsigned v = base + c * Team::kSize + team_.rank();
      if (v < nvec_) visit(v * kVec, Width<kVec>{}, __builtin_bit_cast(Vec16<T>, tile.bits[c]));
    }
  }

  Team team_;
  RowTile<kTile> tile_;
  unsigned cols_;
  bool vectors_;
  unsigned nvec_;
};

// Calls `body(walk, row)` for every row of a [rows, cols] tensor of T, in a one-dimensional
// grid of kBlock-thread blocks: `walk` is the RowWalk of the team that owns the row (the same
// object for all the rows of a team, so team reductions keep their state). Intended grid:
// ceil(rows / (kBlock / 32)) blocks when cols * sizeof(T) <= kLaneTeamRowBytes, else rows
// blocks; any grid is correct.
template <typename T, unsigned kBlock, typename Body>
HK_DEVICE void for_each_row(unsigned rows, unsigned cols, bool aligned, Body body) {
  auto walk_rows = [&](auto walk) {
    for (unsigned r = walk.team().first_row(); r < rows; r += walk.team().row_stride()) body(walk, r);
  };
  if (static_cast<unsigned long long>(cols) * sizeof(T) <= kLaneTeamRowBytes) {
    walk_rows(RowWalk<T, LaneTeam<kBlock>>(cols, aligned));
  } else {
    walk_rows(RowWalk<T, BlockTeam<kBlock>>(cols, aligned));
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
