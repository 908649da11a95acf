// hk/tile/shared.h: matrix tiles of 16-bit or 8-bit elements in shared memory (LDS on AMD).
//
// A SharedTile<T, kRows, kCols> is row-major in rows of 16-byte chunks (8 elements of 16 bits,
// 16 of 8 bits), with the
// chunks of each row permuted by an XOR of the row number. Why: the hot reads of a matrix
// tile take the same chunk column from 8 consecutive rows at once (NVIDIA's ldmatrix reads 8
// rows of 16 bytes per phase; AMD's MFMA operand reads take 16 rows). Unswizzled, rows of 64
// or 256 bytes put those chunks in the same few banks (2- to 8-way conflicts); swizzled, the 8
// rows land on 8 different 16-byte bank groups, which is all 32 banks of 4 bytes once. Writes
// of whole rows (the global -> shared copies) stay conflict-free because the XOR only permutes
// chunks within a row.
//
// The swizzle: rows that share one 128-byte line of banks (kRowsPerLine of them, for rows
// narrower than 128 bytes) share a pattern; the next line's rows XOR the chunk index with the
// line number, modulo the chunks a line holds. For 64-byte rows (32 16-bit or 64 8-bit
// elements): chunk ^ (row / 2 % 4); for rows of 128 bytes or more: chunk ^ (row % 8). The
// pattern is in bytes, so an 8-bit tile's rows behave as a 16-bit tile's of the same bytes.
#pragma once

#include "../device.h"

namespace hk::tile {

template <typename T, unsigned kRows_, unsigned kCols_> struct SharedTile {
  static_assert(sizeof(T) == 2 || sizeof(T) == 1, "shared tiles hold 16-bit or 8-bit elements");
  using Element = T;
  static constexpr unsigned kRows = kRows_;
  static constexpr unsigned kCols = kCols_;
  static constexpr unsigned kChunk = 16 / sizeof(T);  // elements in a 16-byte chunk
  static constexpr unsigned kChunksPerRow = kCols / kChunk;
  static_assert(kChunksPerRow * kChunk == kCols && kChunksPerRow >= 2 &&
                    (kChunksPerRow & (kChunksPerRow - 1)) == 0,
                "rows are a power of two of at least two 16-byte chunks");
  static constexpr unsigned kRowsPerLine = kChunksPerRow >= 8 ? 1 : 8 / kChunksPerRow;
  static constexpr unsigned kSwizzleMask = (kChunksPerRow >= 8 ? 8 : kChunksPerRow) - 1;

  alignas(16) T data[kRows * kCols];

  // The element index of (row, col) in data.
  static HK_DEVICE unsigned index(unsigned row, unsigned col) {
    const unsigned chunk = (col / kChunk) ^ ((row / kRowsPerLine) & kSwizzleMask);
    return row * kCols + chunk * kChunk + col % kChunk;
  }
  HK_DEVICE T* at(unsigned row, unsigned col) { return data + index(row, col); }
  HK_DEVICE const T* at(unsigned row, unsigned col) const { return data + index(row, col); }
};

// A tile of kCols columns cut into panels of 64 (each a SharedTile of 128-byte rows for 16-bit
// elements): for widths that are not a power of two of chunks (attention's head dimension 192),
// and as one layout for every width. A matrix atom's reads (16 or 32 columns from a multiple of
// them) never cross a panel, so mma() reads it through at() like a SharedTile.
template <typename T, unsigned kRows_, unsigned kCols_> struct SharedPanels {
  static constexpr unsigned kRows = kRows_, kCols = kCols_, kPanelCols = 64;
  static_assert(kCols % kPanelCols == 0, "whole panels of 64 columns");
  static constexpr unsigned kPanels = kCols / kPanelCols;
  using Panel = SharedTile<T, kRows, kPanelCols>;
  Panel panel[kPanels];

  HK_DEVICE T* at(unsigned row, unsigned col) {
    return panel[col / kPanelCols].at(row, col % kPanelCols);
  }
  HK_DEVICE const T* at(unsigned row, unsigned col) const {
    return panel[col / kPanelCols].at(row, col % kPanelCols);
  }
};

// Columns [offset, offset + ...) of a tile, read through at() like the tile: a part of its
// columns as a matrix operand.
template <class Tile> struct ColumnSlice {
  const Tile& tile;
  unsigned offset;
  HK_DEVICE const auto* at(unsigned row, unsigned col) const { return tile.at(row, offset + col); }
};

// A block's kStages pipeline stages (each a struct of shared tiles): static shared memory
// (48 KiB at most on NVIDIA), or, when kDynamic, the launch's dynamic shared memory, whose size
// the kernel's contract gives.
template <class StageT, unsigned kStages, bool kDynamic> HK_DEVICE StageT* stages() {
  if constexpr (kDynamic) {
    extern __shared__ __attribute__((aligned(16))) unsigned char dynamic_shared[];
    return reinterpret_cast<StageT*>(dynamic_shared);
  } else {
    __shared__ StageT stage[kStages];
    return stage;
  }
}

// Shared memory a kernel keeps beside its stages (Extra, a struct): static when the stages are,
// else in the launch's dynamic shared memory right after the kStages stages, so that the
// contract's `shared` (the stages' bytes plus sizeof(Extra)) covers the whole block: CUDA counts
// static shared memory against its 48 KiB default too, which the driver lifts per kernel only
// for the dynamic size the launch asks for.
template <class Extra, class StageT, unsigned kStages, bool kDynamic>
HK_DEVICE Extra* beside_stages() {
  if constexpr (kDynamic) {
    return reinterpret_cast<Extra*>(stages<StageT, kStages, true>() + kStages);
  } else {
    __shared__ Extra extra;
    return &extra;
  }
}

}  // namespace hk::tile
