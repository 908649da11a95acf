// hk/tile/copy.h: copies of matrix blocks from global memory into shared tiles, by all the
// threads of a block together. A block is cut into the tile's 16-byte chunks (8 or 16 elements
// of a row); thread t of kThreads copies chunks t, t + kThreads, ..., so each instruction of a wave
// covers whole consecutive rows: coalesced reads, conflict-free shared writes. Elements past
// the matrix's rows or columns arrive as zeros, so a partial block multiplies as if padded.
//
// The source is a matrix view: GlobalMatrix (rows ld apart) or GatheredRows (each row of the
// block picked from another matrix by an index, as a MoE GEMM gathers its tokens). Both give
// row(r), rows, cols, ld and data, and for the whole-chunk walk origin() and row_offset().
//
// Two ways:
//   copy_async (NVIDIA): cp.async of 16 bytes straight into shared memory, no registers, in
//     flight until async_wait; its src-size operand zero-fills the part of a chunk past the
//     matrix's last column. Needs 16-byte aligned rows (data aligned, ld a multiple of a chunk).
//   copy_elements (every target): element by element, global to shared, nothing staged.
//   copy_async_lean, copy_elements_lean (NVIDIA): the same two for a thread with few registers
//     (the producer warpgroup of hk/tile/pipeline.h), each thread walking one chunk column.
//   StagedCopy (every target): fetch() loads into registers, store() writes them to shared
//     memory later, so the loads of the next block overlap the math on this one. Reads 16
//     bytes at once where the rows allow (vector = true and the chunk whole), element by
//     element otherwise (any alignment, any ld). On AMD, aim() and fetch_whole() are its
//     whole-chunk walk: 16-byte buffer loads alone, nothing decided per chunk, for K loops whose
//     blocks the matrix never cuts (see there).
#pragma once

#include "../device.h"

namespace hk::tile {

// A row-major matrix in global memory: rows x cols elements, rows ld elements apart.
template <typename T> struct GlobalMatrix {
  using Element = T;
  const T* data;
  unsigned rows, cols;
  unsigned long long ld;

  HK_DEVICE const T* row(unsigned r) const { return data + r * ld; }
  // Whether every chunk of every row starts 16-byte aligned.
  HK_DEVICE bool vector_rows() const { return aligned16(data) && ld % kVec16<T> == 0; }

  // The whole-chunk walk's addressing (StagedCopy::aim): a block of rows from row0 is read as
  // element offsets from origin(row0), row r's at row_offset(row0, r), and every offset of a
  // block of block_rows rows fits in 32 bits of bytes when offsets_fit(block_rows).
  HK_DEVICE const T* origin(unsigned row0) const { return row(row0); }
  HK_DEVICE unsigned long long row_offset(unsigned row0, unsigned r) const {
    return (r - row0) * ld;
  }
  HK_DEVICE bool offsets_fit(unsigned block_rows) const {
    return static_cast<unsigned long long>(block_rows) * ld * sizeof(T) <= 0xffffffffull;
  }
};

// Rows picked from a matrix by an index: rows first .. first + count - 1 of the view are rows
// index[0 .. count - 1] of data (source_rows rows of cols elements, ld apart). A MoE GEMM's
// block of tokens, gathered from the activations in the routing's sorted order. The kernel
// fills the index in shared memory once, before its K loop, so that the copies of every step
// read it there; rows = first + count, so that a block at first sees count rows.
template <typename T> struct GatheredRows {
  using Element = T;
  const T* data;
  const unsigned* index;
  unsigned first, rows, cols;
  unsigned long long ld;
  unsigned source_rows;

  HK_DEVICE const T* row(unsigned r) const { return data + index[r - first] * ld; }
  HK_DEVICE bool vector_rows() const { return aligned16(data) && ld % kVec16<T> == 0; }

  // As GlobalMatrix's, from the source matrix's start: a block's rows lie anywhere in it.
  HK_DEVICE const T* origin(unsigned) const { return data; }
  HK_DEVICE unsigned long long row_offset(unsigned, unsigned r) const {
    return index[r - first] * ld;
  }
  HK_DEVICE bool offsets_fit(unsigned) const {
    return static_cast<unsigned long long>(source_rows) * ld * sizeof(T) <= 0xffffffffull;
  }
};

namespace detail {
HK_DEVICE unsigned min_u(unsigned a, unsigned b) { return a < b ? a : b; }

// The elements of a matrix dimension of `size` at and past `start` (0 when start is past it).
HK_DEVICE unsigned left(unsigned size, unsigned start) { return size > start ? size - start : 0; }

// The position of chunk `i` of a tile in the matrix, and how many of its elements exist.
template <class Tile> struct ChunkAt {
  unsigned row, col;  // in the tile
  unsigned valid;     // elements of the chunk inside the matrix, 0 to Tile::kChunk
  HK_DEVICE ChunkAt(unsigned i, unsigned rows_left, unsigned cols_left)
      : row(i / Tile::kChunksPerRow), col(i % Tile::kChunksPerRow * Tile::kChunk) {
    valid = row < rows_left && col < cols_left ? min_u(cols_left - col, Tile::kChunk) : 0;
  }
};

// A tile's chunks dealt to kThreads threads: kPerThread rounds for each; when the chunks do not
// fill the last round, threads past them skip it (kRagged).
template <class Tile, unsigned kThreads> struct Deal {
  static constexpr unsigned kChunks = Tile::kRows * Tile::kChunksPerRow;
  static constexpr unsigned kPerThread = (kChunks + kThreads - 1) / kThreads;
  static constexpr bool kRagged = kChunks % kThreads != 0;
  static HK_DEVICE bool skip(unsigned chunk) { return kRagged && chunk >= kChunks; }
};

// Calls f(i, chunk, src) for the i-th of the tile's chunks that `thread` copies from the block
// of g at (row0, col0): the chunk's place and valid elements, and where it starts in g.
template <class Tile, unsigned kThreads, class Matrix, typename F>
HK_DEVICE void for_each_chunk(const Matrix& g, unsigned row0, unsigned col0, unsigned thread,
                              F f) {
  using Deal = detail::Deal<Tile, kThreads>;
  const unsigned rows_left = left(g.rows, row0);
  const unsigned cols_left = left(g.cols, col0);
#pragma unroll
  for (unsigned i = 0; i < Deal::kPerThread; ++i) {
    if (Deal::skip(thread + i * kThreads)) break;
    const ChunkAt<Tile> c(thread + i * kThreads, rows_left, cols_left);
    f(i, c, g.row(row0 + c.row) + col0 + c.col);
  }
}

}  // namespace detail

#if HK_NVIDIA
// Starts copying the block of g at (row0, col0) into s (see the header); complete once
// async_wait says so. g.vector_rows() must hold.
template <unsigned kThreads, class Tile, class Matrix>
HK_DEVICE void copy_async(Tile& s, const Matrix& g, unsigned row0, unsigned col0,
                          unsigned thread) {
  using Deal = detail::Deal<Tile, kThreads>;
  using T = typename Matrix::Element;
#pragma unroll
  for (unsigned i = 0; i < Deal::kPerThread; ++i) {
    if (Deal::skip(thread + i * kThreads)) break;
    const detail::ChunkAt<Tile> c(thread + i * kThreads, detail::left(g.rows, row0),
                                  detail::left(g.cols, col0));
    // A chunk wholly outside reads nothing (src-size 0) but still needs a valid address. The
    // size goes in as an int: a 64-bit value there crashed clang 22's NVPTX backend ("copy one
    // register into another with a different width").
    const T* src = c.valid ? g.row(row0 + c.row) + col0 + c.col : g.data;
    __nvvm_cp_async_cg_shared_global_16(
        (__attribute__((address_space(3))) void*)s.at(c.row, c.col),
        (__attribute__((address_space(1))) const void*)src,
        static_cast<int>(c.valid * sizeof(T)));
  }
}

namespace detail {
// for_each_chunk for a thread with few registers (the producer warpgroup of
// hk/tile/pipeline.h, which keeps 40): each thread takes one chunk column of the tile, every
// kThreads / kChunksPerRow rows, walking one pointer down the rows, and calls
// f(row, col, src, valid). (for_each_chunk lets the compiler keep every chunk's address across
// a K loop, a register pair each, which spills there.)
template <class Tile, unsigned kThreads, typename T, typename F>
HK_DEVICE void for_each_chunk_lean(const GlobalMatrix<T>& g, unsigned row0, unsigned col0,
                                   unsigned thread, F f) {
  constexpr unsigned kRowStep = kThreads / Tile::kChunksPerRow;
  static_assert(kThreads % Tile::kChunksPerRow == 0 && Tile::kRows % kRowStep == 0,
                "whole rows of chunks per round, whole rounds per tile");
  const unsigned col = thread % Tile::kChunksPerRow * Tile::kChunk;
  const unsigned rows_left = left(g.rows, row0), cols_left = left(g.cols, col0);
  const unsigned valid = col < cols_left ? min_u(cols_left - col, Tile::kChunk) : 0;
  unsigned row = thread / Tile::kChunksPerRow;
  const T* src = g.row(row0 + row) + col0 + col;
  const unsigned long long step = kRowStep * g.ld;
#pragma unroll
  for (unsigned i = 0; i < Tile::kRows / kRowStep; ++i, row += kRowStep, src += step) {
    // Opaque to the optimizer, so that it advances one pointer instead of keeping one a row.
    asm("" : "+l"(src));
    f(row, col, src, row < rows_left ? valid : 0u);
  }
}
}  // namespace detail

// copy_async with the lean walk (detail::for_each_chunk_lean), for a producer warpgroup.
template <unsigned kThreads, class Tile, typename T>
HK_DEVICE void copy_async_lean(Tile& s, const GlobalMatrix<T>& g, unsigned row0, unsigned col0,
                               unsigned thread) {
  detail::for_each_chunk_lean<Tile, kThreads>(
      g, row0, col0, thread,
      [&](unsigned row, unsigned col, const T* src, unsigned valid) HK_INLINE {
        __nvvm_cp_async_cg_shared_global_16(
            (__attribute__((address_space(3))) void*)s.at(row, col),
            (__attribute__((address_space(1))) const void*)(valid ? src : g.data),
            static_cast<int>(valid * sizeof(T)));
      });
}

// copy_elements with the lean walk (detail::for_each_chunk_lean), for a producer warpgroup.
template <unsigned kThreads, class Tile, typename T>
HK_DEVICE void copy_elements_lean(Tile& s, const GlobalMatrix<T>& g, unsigned row0,
                                  unsigned col0, unsigned thread) {
  detail::for_each_chunk_lean<Tile, kThreads>(
      g, row0, col0, thread,
      [&](unsigned row, unsigned col, const T* src, unsigned valid) HK_INLINE {
        T* to = s.at(row, col);
#pragma unroll 1
        for (unsigned e = 0; e < Tile::kChunk; ++e) to[e] = e < valid ? src[e] : T(0);
      });
}

// Closes the group of copies started since the last commit.
HK_DEVICE void async_commit() { __nvvm_cp_async_commit_group(); }

// Waits until at most kPending committed groups are still in flight (the calling thread's own;
// a block barrier after it makes every thread's copies visible).
template <int kPending> HK_DEVICE void async_wait() { __nvvm_cp_async_wait_group(kPending); }
#endif

// Copies the block of g at (row0, col0) into s element by element, each value straight from
// global to shared memory: for rows that are not 16-byte aligned where registers are short
// (a StagedCopy's chunks stay live across the block's loads). Any alignment, any ld.
template <unsigned kThreads, class Tile, class Matrix>
HK_DEVICE void copy_elements(Tile& s, const Matrix& g, unsigned row0, unsigned col0,
                             unsigned thread) {
  using T = typename Matrix::Element;
  detail::for_each_chunk<Tile, kThreads>(
      g, row0, col0, thread, [&](unsigned, const detail::ChunkAt<Tile>& c, const T* src) HK_INLINE {
        T* to = s.at(c.row, c.col);
        // Not unrolled: unrolled, the compiler hoists every load of the block above the
        // stores, a register each, which is what this copy is for avoiding.
#pragma unroll 1
        for (unsigned e = 0; e < Tile::kChunk; ++e) to[e] = e < c.valid ? src[e] : T(0);
      });
}

// A block copy through registers (see the header).
template <class Tile, unsigned kThreads> struct StagedCopy {
  using Deal = detail::Deal<Tile, kThreads>;
  static constexpr unsigned kPerThread = Deal::kPerThread;
  using Chunk = detail::ChunkAt<Tile>;
  u32x4 chunk[kPerThread];

  template <class Matrix>
  HK_DEVICE void fetch(const Matrix& g, unsigned row0, unsigned col0, unsigned thread,
                       bool vector) {
    using T = typename Matrix::Element;
    detail::for_each_chunk<Tile, kThreads>(
        g, row0, col0, thread, [&](unsigned i, const Chunk& c, const T* src) HK_INLINE {
          if (vector && c.valid == Tile::kChunk) {
            chunk[i] = *reinterpret_cast<const u32x4*>(src);
          } else {
            Vec16<T> v;
#pragma unroll
            for (unsigned e = 0; e < Tile::kChunk; ++e) v.elem[e] = e < c.valid ? src[e] : T(0);
            chunk[i] = __builtin_bit_cast(u32x4, v);
          }
        });
  }

#if HK_AMD
  // The whole-chunk walk (AMD): for a K loop whose every block lies whole inside g or wholly
  // past its last row or column (16-byte aligned rows; a chunk past the last column only where
  // cols is a multiple of a chunk), with nothing decided per chunk: aim() fixes this
  // thread's chunks once, as byte offsets from the block's origin (g.origin: its first row, or
  // a gathered view's source matrix), and fetch_whole() then loads each with one 16-byte buffer
  // load from the block's (uniform) origin. A chunk outside g reads g's nearest one (its last
  // row, its last chunk of a row) instead of zeros: for blocks whose outside rows and columns
  // reach only sums that are never stored (a GEMM's M and N edges). The offsets hold for every
  // block that keeps aim()'s clamping, i.e. that moves only along the dimension nothing leaves
  // (K), and they are 32 bits (see addressable()).
  unsigned offset[kPerThread];

  // Whether a block's offsets fit in 32 bits.
  template <class Matrix> static HK_DEVICE bool addressable(const Matrix& g) {
    return g.offsets_fit(Tile::kRows);
  }

  template <class Matrix>
  HK_DEVICE void aim(const Matrix& g, unsigned row0, unsigned col0, unsigned thread) {
    using T = typename Matrix::Element;
#pragma unroll
    for (unsigned i = 0; i < kPerThread; ++i) {
      const unsigned at = thread + i * kThreads;
      if (Deal::skip(at)) break;
      const unsigned row = detail::min_u(row0 + at / Tile::kChunksPerRow, g.rows - 1);
      const unsigned col =
          detail::min_u(col0 + at % Tile::kChunksPerRow * Tile::kChunk, g.cols - Tile::kChunk) -
          col0;
      offset[i] = static_cast<unsigned>((g.row_offset(row0, row) + col) * sizeof(T));
    }
  }

  template <class Matrix>
  HK_DEVICE void fetch_whole(const Matrix& g, unsigned row0, unsigned col0, unsigned thread) {
    // A raw buffer (stride 0) over 4 GiB from the block's origin, so that no load is cut off;
    // the last word is the data format CDNA's buffer loads need (32-bit elements).
    using T = typename Matrix::Element;
    const __amdgpu_buffer_rsrc_t block = __builtin_amdgcn_make_buffer_rsrc(
        const_cast<T*>(g.origin(row0) + col0), 0, -1, 0x00020000);
#pragma unroll
    for (unsigned i = 0; i < kPerThread; ++i) {
      if (Deal::skip(thread + i * kThreads)) break;
      chunk[i] = __builtin_amdgcn_raw_buffer_load_b128(block, offset[i], 0, 0);
    }
  }
#endif

  HK_DEVICE void store(Tile& s, unsigned thread) const {
#pragma unroll
    for (unsigned i = 0; i < kPerThread; ++i) {
      const unsigned at = thread + i * kThreads;
      if (Deal::skip(at)) break;
      const unsigned row = at / Tile::kChunksPerRow;
      const unsigned col = at % Tile::kChunksPerRow * Tile::kChunk;
      *reinterpret_cast<u32x4*>(s.at(row, col)) = chunk[i];
    }
  }

  // store() into a tile that holds the block transposed: element (row, col) of the block at
  // t.at(col0 + col, row), for a block that is columns col0 .. of a wider one.
  template <class Transposed>
  HK_DEVICE void store_transposed(Transposed& t, unsigned col0, unsigned thread) const {
    using T = typename Tile::Element;
#pragma unroll
    for (unsigned i = 0; i < kPerThread; ++i) {
      const unsigned at = thread + i * kThreads;
      if (Deal::skip(at)) break;
      const unsigned row = at / Tile::kChunksPerRow;
      const unsigned col = col0 + at % Tile::kChunksPerRow * Tile::kChunk;
      const auto elements = __builtin_bit_cast(Vec16<T>, chunk[i]);
#pragma unroll
      for (unsigned e = 0; e < Tile::kChunk; ++e) *t.at(col + e, row) = elements.elem[e];
    }
  }
};

}  // namespace hk::tile
