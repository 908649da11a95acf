// hk/walk.h: how threads cover the data of memory-bound kernels, so that kernels only say what
// happens to each pack of elements.
//
// RowWalk: one block walks one row of a row-major [rows, cols] tensor, possibly several times
// (a norm's statistics pass, then its output pass). Thread t handles the 16-byte vectors
// t, t + B, t + 2B, ... of the row (coalesced), or single elements the same way when a vector
// path is impossible (cols not a multiple of the vector width, or a pointer not 16-byte
// aligned). Rows of up to kTile * B vectors stay in registers between passes (8192 bf16/f16 or
// 4096 f32 elements with 256 threads); longer rows are read again by later passes, tile by
// tile, mostly from cache.
//
// for_each_pack: a grid walks a flat array of n elements in 16-byte vectors with a grid stride,
// finishing a ragged end element by element.
#pragma once

#include "device.h"

namespace hk {

// Offset of row `row` in a row-major tensor with `cols` columns (64-bit: rows * cols may not
// fit in 32 bits).
HK_DEVICE unsigned long long row_offset(unsigned row, unsigned cols) {
  return static_cast<unsigned long long>(row) * cols;
}

// The part of one row a thread keeps in registers between passes.
template <typename T, unsigned kTile> struct RowTile {
  Vec16<T> vec[kTile];
};

template <typename T, unsigned kBlock, unsigned kTile = 4> class RowWalk {
 public:
  static constexpr unsigned kVec = kVec16<T>;
  using Tile = RowTile<T, kTile>;

  // `aligned`: every row pointer the kernel will touch is 16-byte aligned at row 0.
  HK_DEVICE RowWalk(unsigned cols, bool aligned)
      : cols_(cols), vectors_(aligned && cols % kVec == 0), nvec_(cols / kVec) {}

  // The first pass over a row. `produce(i, n)` makes the pack of n elements at column i (loads
  // them, and whatever else the kernel does on first sight, such as accumulating a sum) and
  // returns the values later passes will see there.
  template <typename Produce> HK_DEVICE void first_pass(Tile& tile, Produce produce) const {
    const unsigned t = thread_idx_x();
    if (!vectors_) {
      for (unsigned i = t; i < cols_; i += kBlock) produce(i, Width<1>{});
      return;
    }
    for (unsigned base = 0; base < nvec_; base += kTile * kBlock) {
#pragma unroll
      for (unsigned c = 0; c < kTile; ++c) {
        const unsigned v = base + c * kBlock + t;
        if (v < nvec_) tile.vec[c] = produce(v * kVec, Width<kVec>{});
      }
    }
  }

  // A later pass: `visit(i, n, values)` for the pack at column i, the values produced by the
  // first pass, taken from registers when the row fits there and else read again from `reread`
  // (the row holding them: the input, or the buffer the first pass wrote them to).
  template <typename Visit>
  HK_DEVICE void pass(const Tile& tile, const T* reread, Visit visit) const {
    const unsigned t = thread_idx_x();
    if (!vectors_) {
      for (unsigned i = t; i < cols_; i += kBlock) visit(i, Width<1>{}, load(reread + i, Width<1>{}));
      return;
    }
    if (nvec_ <= kTile * kBlock) {
#pragma unroll
      for (unsigned c = 0; c < kTile; ++c) {
        const unsigned v = c * kBlock + t;
        if (v < nvec_) visit(v * kVec, Width<kVec>{}, tile.vec[c]);
      }
      return;
    }
    for (unsigned base = 0; base < nvec_; base += kTile * kBlock) {
      Tile again;
#pragma unroll
      for (unsigned c = 0; c < kTile; ++c) {
        const unsigned v = base + c * kBlock + t;
        if (v < nvec_) again.vec[c] = load16(reread + v * kVec);
      }
#pragma unroll
      for (unsigned c = 0; c < kTile; ++c) {
        const unsigned v = base + c * kBlock + t;
        if (v < nvec_) visit(v * kVec, Width<kVec>{}, again.vec[c]);
      }
    }
  }

 private:
  unsigned cols_;
  bool vectors_;
  unsigned nvec_;
};

// Calls `visit(i, n)` for packs of n elements starting at i that together cover [0, n_total)
// once, spread over every thread of the grid (one-dimensional blocks and grid). With
// `aligned` (every pointer the kernel touches is 16-byte aligned) the packs are 16-byte
// vectors of T and only the last n_total % kVec16<T> elements go one by one.
template <typename T, typename Visit>
HK_DEVICE void for_each_pack(unsigned long long n_total, bool aligned, Visit visit) {
  constexpr unsigned kVec = kVec16<T>;
  const unsigned long long threads = static_cast<unsigned long long>(grid_dim_x()) * block_dim_x();
  const unsigned long long first = static_cast<unsigned long long>(block_idx_x()) * block_dim_x() + thread_idx_x();
  const unsigned long long body = aligned ? n_total / kVec * kVec : 0;
  for (unsigned long long i = first * kVec; i < body; i += threads * kVec) visit(i, Width<kVec>{});
  for (unsigned long long i = body + first; i < n_total; i += threads) visit(i, Width<1>{});
}

}  // namespace hk
