// hk/tile/k_loop.h: the K loop of the mma.sync and MFMA matrix kernels (sm_90a kernels have
// pipeline.h), and the grid roles around it.
//
// A block computes a kTileM x kTileN block of C = A·B (or of kProducts products A·B_p sharing
// A) by walking its K range in steps of kTileK: each step's A block and B blocks are copied into
// a stage of shared tiles (zero-filled past the matrices' edges, so any M, N, K multiplies as if
// padded), and each wave multiplies its kWaveRows x kWaveCols part with hk::tile::mma. A kernel
// is the loop's multiply hook (what a step does with its stage) and its epilogue; the loop owns
// the copies, and chooses their path once, before it starts:
//   NVIDIA, 16-byte aligned rows: cp.async, kStages - 1 steps in flight, one barrier a step.
//   NVIDIA, other rows: element by element straight into shared memory, no overlap, so that
//     nothing staged adds to the registers the multiply needs.
//   AMD (no asynchronous 16-byte copy into LDS before gfx950), and B widened from FP8 on every
//     target: double-buffered through registers, the next step's loads in flight while this one
//     multiplies. On AMD the steps whose blocks the matrices' K edge does not cut take the
//     whole-chunk walk (StagedCopy::fetch_whole: one buffer load a chunk, nothing decided in the
//     loop), the rest (the last step where k cuts it, or every step of unaligned rows) the
//     chunk-by-chunk path.
//
// Grid roles: x counts C's column blocks and y its row blocks (raster.h), z what GridZ says.
#pragma once

#include "../device.h"
#include "copy.h"
#include "mma.h"
#include "raster.h"
#include "shared.h"
#include "widen.h"

namespace hk::tile {

// A block's shape: a kTileM x kTileN block of C, kWavesM x kWavesN waves of kWaveRows x
// kWaveCols each, K in steps of kTileK through kStages shared stages: in static shared memory
// (48 KiB at most on NVIDIA) or, when kDynamic, in the launch's dynamic shared memory, which the
// kernel's contract gives (`shared`). AMD stages through registers, in two static stages always.
template <unsigned kTileM_, unsigned kTileN_, unsigned kTileK_, unsigned kWavesM_,
          unsigned kWavesN_, unsigned kStages_, bool kDynamic_ = false>
struct Tiling {
  static constexpr unsigned kTileM = kTileM_, kTileN = kTileN_, kTileK = kTileK_;
  static constexpr unsigned kWavesM = kWavesM_, kWavesN = kWavesN_;
#if HK_AMD
  static constexpr unsigned kStages = 2;
  static constexpr bool kDynamic = false;
#else
  static constexpr unsigned kStages = kStages_;
  static constexpr bool kDynamic = kDynamic_;
#endif
  static constexpr unsigned kThreads = kWavesM * kWavesN * kWaveSize;
  static constexpr unsigned kWaveRows = kTileM / kWavesM, kWaveCols = kTileN / kWavesN;
};

// What the grid's z blocks do: nothing (z = 1), split K (each adds its share's sums to C), or
// take one product of a batch each.
enum class GridZ { kNone, kSplitK, kBatch };

// Element strides between the matrices of a batch (0 shares one matrix among all products).
struct BatchStrides {
  unsigned long long a, b, c;
};

// The K steps [first, last) of this block; an idle block (a split K share past the last step)
// must return as a whole, so that no barrier is skipped by part of it, and add nothing.
struct KRange {
  unsigned first, last;
  bool idle;
};

// All `steps`, or for split K (kZ) an even share of them in whole granules of `granule` steps
// (block scales fold a group's sums as one); the last splits are idle when z does not divide
// the granules.
template <GridZ kZ> HK_DEVICE KRange k_range(unsigned steps, unsigned granule = 1) {
  if constexpr (kZ == GridZ::kSplitK) {
    const unsigned granules = (steps + granule - 1) / granule;
    const unsigned per_split = (granules + grid_dim_z() - 1) / grid_dim_z() * granule;
    const unsigned first = block_idx_z() * per_split;
    if (first >= steps) return {steps, steps, true};
    return {first, steps - first < per_split ? steps : first + per_split, false};
  } else {
    return {0, steps, false};
  }
}

// One step's blocks in shared memory: A's, and kProducts B blocks as stored (T: the type
// multiplied; a widened B is staged in it).
template <class Tl, typename T, BLayout kB, unsigned kProducts> struct MmaStage {
  using BTile = SharedTile<T, kB == BLayout::kNK ? Tl::kTileN : Tl::kTileK,
                           kB == BLayout::kNK ? Tl::kTileK : Tl::kTileN>;
  SharedTile<T, Tl::kTileM, Tl::kTileK> a;
  BTile b[kProducts];
};

// A block's operands and place: A [M][K] (a GlobalMatrix, or rows gathered by an index:
// AMatrix) and kProducts B matrices (B [N][K] or [K][N] as kB says, of elements TB: T, or an FP8
// type widened to T on the way), the block's corner in C (from block_tile()) and the calling
// wave's corner in the block.
template <class Tl_, typename T, BLayout kB_, unsigned kProducts_ = 1, typename TB = T,
          class AMatrix = GlobalMatrix<T>>
struct MmaBlock {
  using Tl = Tl_;
  static constexpr BLayout kB = kB_;
  static constexpr unsigned kProducts = kProducts_;
  static constexpr bool kWiden = sizeof(TB) != sizeof(T);
  using BElement = TB;
  using Stage = MmaStage<Tl, T, kB, kProducts>;

  AMatrix a;
  GlobalMatrix<TB> b[kProducts];
  unsigned row0, col0, wave_row, wave_col;

  // b[p] points at product p's B, each with leading dimension ldb.
  HK_DEVICE MmaBlock(const T* a_data, const TB* const* b_data, unsigned m, unsigned n, unsigned k,
                     unsigned lda, unsigned ldb)
      : MmaBlock(AMatrix{a_data, m, k, lda}, b_data, n, k, ldb) {}

  // A given as a view whose K is k.
  HK_DEVICE MmaBlock(const AMatrix& a_view, const TB* const* b_data, unsigned n, unsigned k,
                     unsigned ldb)
      : a(a_view) {
#pragma unroll
    for (unsigned p = 0; p < kProducts; ++p)
      b[p] = kB == BLayout::kNK ? GlobalMatrix<TB>{b_data[p], n, k, ldb}
                                : GlobalMatrix<TB>{b_data[p], k, n, ldb};
    const BlockTile tile = block_tile();
    row0 = tile.m * Tl::kTileM;
    col0 = tile.n * Tl::kTileN;
    const unsigned wave = wave_id();
    wave_row = wave / Tl::kWavesN * Tl::kWaveRows;
    wave_col = wave % Tl::kWavesN * Tl::kWaveCols;
  }

  // Where step s's B block starts in b[p].
  HK_DEVICE unsigned b_row(unsigned s) const {
    return kB == BLayout::kNK ? col0 : s * Tl::kTileK;
  }
  HK_DEVICE unsigned b_col(unsigned s) const {
    return kB == BLayout::kNK ? s * Tl::kTileK : col0;
  }
};

// The multiply hook of a 16-bit kernel: acc[p] += the step's A·B_p, for each of the block's
// products, over the calling wave's part of the block.
template <class Block, class Acc>
HK_DEVICE void mma_stage(Acc (&acc)[Block::kProducts], const typename Block::Stage& stage,
                         const Block& block) {
  using Tl = typename Block::Tl;
#pragma unroll
  for (unsigned kk = 0; kk < Tl::kTileK; kk += Acc::Atom::kK)
#pragma unroll
    for (unsigned p = 0; p < Block::kProducts; ++p)
      mma<Block::kB>(acc[p], stage.a, stage.b[p], block.wave_row, block.wave_col, kk);
}

namespace detail {

// The register-staged copies of a step: A's, and each B's (widened or as stored).
template <class Block> struct StagedStep {
  using Tl = typename Block::Tl;
  using Stage = typename Block::Stage;
  using BTile = typename Stage::BTile;
  using ACopy = StagedCopy<decltype(Stage::a), Tl::kThreads>;
  template <typename TB, bool kWiden> struct BCopyOf {
    using Type = StagedCopy<BTile, Tl::kThreads>;
  };
  template <typename TB> struct BCopyOf<TB, true> {
    using Type = WideningCopy<BTile, Tl::kThreads, TB>;
  };
  using BCopy = typename BCopyOf<typename Block::BElement, Block::kWiden>::Type;
};

}  // namespace detail

// Runs `multiply(const Stage&, unsigned step)` over steps [range.first, range.last) of the
// block's K, each stage holding that step's blocks (see the header). Every thread of the block
// calls it with the same range.
template <class Block, class Multiply>
HK_DEVICE void k_loop(const Block& block, KRange range, Multiply multiply) {
  using Tl = typename Block::Tl;
  using Stage = typename Block::Stage;
  using BTile = typename Stage::BTile;
  constexpr unsigned kProducts = Block::kProducts;
  Stage* const stage = stages<Stage, Tl::kStages, Tl::kDynamic>();
  const unsigned thread = thread_idx_x();
  const unsigned first = range.first, last = range.last;
  const auto k0 = [](unsigned s) HK_INLINE { return s * Tl::kTileK; };

  const bool a_vector = block.a.vector_rows();
  bool b_vector = true;
#pragma unroll
  for (unsigned p = 0; p < kProducts; ++p) {
    if constexpr (Block::kWiden)
      b_vector = b_vector && detail::StagedStep<Block>::BCopy::vector_rows(block.b[p]);
    else
      b_vector = b_vector && block.b[p].vector_rows();
  }
  const bool vector = a_vector && b_vector;

#if HK_NVIDIA
  if constexpr (!Block::kWiden) {
    if (vector) {
      constexpr unsigned kStages = Tl::kStages;
      const auto copy = [&](unsigned s) HK_INLINE {
        Stage& to = stage[(s - first) % kStages];
        copy_async<Tl::kThreads>(to.a, block.a, block.row0, k0(s), thread);
#pragma unroll
        for (unsigned p = 0; p < kProducts; ++p)
          copy_async<Tl::kThreads>(to.b[p], block.b[p], block.b_row(s), block.b_col(s), thread);
      };
#pragma unroll
      for (unsigned s = first; s + 1 < first + kStages; ++s) {
        if (s < last) copy(s);
        async_commit();
      }
      for (unsigned s = first; s < last; ++s) {
        // Step s's copies are done (one group per step, kStages - 2 younger ones may fly), and
        // after the barrier every wave has finished step s - 1, whose stage the copy reuses.
        async_wait<kStages - 2>();
        block_sync();
        if (s + kStages - 1 < last) copy(s + kStages - 1);
        async_commit();
        multiply(stage[(s - first) % kStages], s);
      }
    } else {
      for (unsigned s = first; s < last; ++s) {
        copy_elements<Tl::kThreads>(stage[0].a, block.a, block.row0, k0(s), thread);
#pragma unroll
        for (unsigned p = 0; p < kProducts; ++p)
          copy_elements<Tl::kThreads>(stage[0].b[p], block.b[p], block.b_row(s), block.b_col(s),
                                      thread);
        block_sync();
        multiply(stage[0], s);
        block_sync();
      }
    }
    return;
  }
#endif
  typename detail::StagedStep<Block>::ACopy next_a;
  typename detail::StagedStep<Block>::BCopy next_b[kProducts];
  const auto fetch = [&](unsigned s) HK_INLINE {
    next_a.fetch(block.a, block.row0, k0(s), thread, a_vector);
#pragma unroll
    for (unsigned p = 0; p < kProducts; ++p)
      next_b[p].fetch(block.b[p], block.b_row(s), block.b_col(s), thread, b_vector);
  };
  const auto store = [&](Stage& to) HK_INLINE {
    next_a.store(to.a, thread);
#pragma unroll
    for (unsigned p = 0; p < kProducts; ++p) next_b[p].store(to.b[p], thread);
  };
  // Steps [from, to) double-buffered: step s + 1's loads are in flight while step s multiplies.
  // Instantiated once per way of fetching, so that each loop holds one copy path.
  const auto run = [&](auto fetch_step, unsigned from, unsigned to) HK_INLINE {
    fetch_step(from);
    store(stage[0]);
    block_sync();
    for (unsigned s = from; s < to; ++s) {
      const unsigned now = (s - from) % 2;
      const bool more = s + 1 < to;
      if (more) fetch_step(s + 1);
      multiply(stage[now], s);
      // The other stage was last read in step s - 1, before the barrier that ended it.
      if (more) store(stage[1 - now]);
      block_sync();
    }
  };
  unsigned rest = first;
#if HK_AMD
  if constexpr (!Block::kWiden) {
    // With 16-byte aligned rows (and B's columns whole chunks where they are n), every chunk of
    // a step whose K range lies inside k is whole or past the M or N edge: those steps take the
    // whole-chunk walk alone (what it reads past the edges reaches only sums that are never
    // stored).
    const unsigned whole = detail::min_u(last, block.a.cols / Tl::kTileK);
    bool walk = vector && (Block::kB == BLayout::kNK || block.b[0].cols % BTile::kChunk == 0) &&
                first < whole && next_a.addressable(block.a);
#pragma unroll
    for (unsigned p = 0; p < kProducts; ++p) walk = walk && next_b[p].addressable(block.b[p]);
    if (walk) {
      next_a.aim(block.a, block.row0, k0(first), thread);
#pragma unroll
      for (unsigned p = 0; p < kProducts; ++p)
        next_b[p].aim(block.b[p], block.b_row(first), block.b_col(first), thread);
      run([&](unsigned s) HK_INLINE {
            next_a.fetch_whole(block.a, block.row0, k0(s), thread);
#pragma unroll
            for (unsigned p = 0; p < kProducts; ++p)
              next_b[p].fetch_whole(block.b[p], block.b_row(s), block.b_col(s), thread);
          },
          first, whole);
      rest = whole;
    }
  }
#endif
  if (rest < last) run(fetch, rest, last);
}

}  // namespace hk::tile
