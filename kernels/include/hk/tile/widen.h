// hk/tile/widen.h: a block copy through registers that widens 8-bit elements (FP8) to a 16-bit
// tile as it stores them, for weights kept in FP8 and multiplied in bf16 (weight-only
// quantization). StagedCopy's interface (hk/tile/copy.h): fetch() loads the block's bytes into
// registers, store() converts and writes them, so the next block's loads overlap the math.
//
// Each destination chunk (8 elements of 16 bits) takes 8 source bytes, read as one 8-byte load
// where the rows allow (vector = true: rows 8-byte aligned, and the chunk whole), element by
// element otherwise. Elements past the matrix arrive as zeros. The conversion is exact: every
// E4M3 value (either family) is a bf16 value.
#pragma once

#include "../fp8.h"
#include "copy.h"

namespace hk::tile {

template <class Tile, unsigned kThreads, typename S> struct WideningCopy {
  static_assert(sizeof(S) == 1, "widens 8-bit elements");
  static_assert(Tile::kChunk == 8, "into a tile of 16-bit elements");
  using Deal = detail::Deal<Tile, kThreads>;
  using T = typename Tile::Element;
  static constexpr unsigned kPerThread = Deal::kPerThread;
  using Chunk = detail::ChunkAt<Tile>;
  Pack<S, 8> chunk[kPerThread];

  // Whether g's rows start 8-byte aligned, as fetch's vector loads need.
  static HK_DEVICE bool vector_rows(const GlobalMatrix<S>& g) {
    return reinterpret_cast<unsigned long long>(g.data) % 8 == 0 && g.ld % 8 == 0;
  }

  HK_DEVICE void fetch(const GlobalMatrix<S>& g, unsigned row0, unsigned col0, unsigned thread,
                       bool vector) {
    detail::for_each_chunk<Tile, kThreads>(
        g, row0, col0, thread, [&](unsigned i, const Chunk& c, const S* src) HK_INLINE {
          if (vector && c.valid == Tile::kChunk) {
            chunk[i] = __builtin_bit_cast(Pack<S, 8>,
                                          *reinterpret_cast<const unsigned long long*>(src));
          } else {
#pragma unroll
            for (unsigned e = 0; e < Tile::kChunk; ++e)
              chunk[i].elem[e] = e < c.valid ? src[e] : S(0);
          }
        });
  }

  HK_DEVICE void store(Tile& s, unsigned thread) const {
#pragma unroll
    for (unsigned i = 0; i < kPerThread; ++i) {
      const unsigned at = thread + i * kThreads;
      if (Deal::skip(at)) break;
      Vec16<T> wide;
#pragma unroll
      for (unsigned e = 0; e < 8; ++e) wide.elem[e] = from_float<T>(to_float(chunk[i].elem[e]));
      store16(s.at(at / Tile::kChunksPerRow, at % Tile::kChunksPerRow * Tile::kChunk), wide);
    }
  }
};

}  // namespace hk::tile
