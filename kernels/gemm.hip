// GEMM of 16-bit matrices (bf16 or f16) with f32 accumulation, row-major with leading
// dimensions, so that views (a block of a larger matrix, a slice of a fused weight) need no
// copy:
//   _nt: C[m][n] = Σ_k A[m][k] · B[n][k]   (B stored [N][K]: torch.nn.Linear's weight, C = A·Bᵀ)
//   _nn: C[m][n] = Σ_k A[m][k] · B[k][n]   (B stored [K][N])
// optionally plus bias[n] (the _bias symbols), C in the input type or f32 (_out_f32), rounded
// once from the f32 sum.
//
// Symbols: gemm_a16w16_{nt,nn}_{bf16,f16}[_bias][_out_f32](c, a, b, [bias,] m, n, k, lda, ldb,
// ldc). Launch: the contract in manifests/gemm.toml (one block of kBlock threads per kTileM x
// kTileN block of C, grid x over n and y over m).
//
// Each block multiplies a kTileM x kTileN block of C by walking K in steps of kTileK: the
// A and B blocks of a step are copied into shared tiles (zero-filled past the matrices' edges,
// so every M, N, K is handled, partial blocks as padded ones), and each wave multiplies its
// part with hk::tile::mma. The copies of later steps run while the current one multiplies:
// NVIDIA keeps kStages steps in flight with cp.async when rows are 16-byte aligned; other
// cases (and AMD, which has no asynchronous copy to LDS for 16-byte chunks before gfx950)
// stage the next step in registers. Unaligned rows (k or ld not a multiple of 8, or an
// unaligned pointer) are read element by element: correct, slower.
#include "hk/hk.h"
#include "hk/tile/tile.h"

namespace {

using hk::tile::BLayout;

constexpr unsigned kBlock = 256;
constexpr unsigned kTileM = 128, kTileN = 128, kTileK = 32;
// cp.async steps in flight on NVIDIA: 3 stages of 16 KiB are the 48 KiB of static shared memory
// a block may have. AMD double-buffers through registers: 2 stages, 32 KiB of its 64 KiB LDS.
#if HK_AMD
constexpr unsigned kStages = 2;
#else
constexpr unsigned kStages = 3;
#endif

// Waves in a grid over the block's C tile: 8 NVIDIA warps as 2 x 4 (64 x 32 each), 4 AMD waves
// as 2 x 2 (64 x 64 each).
constexpr unsigned kWaves = kBlock / hk::kWaveSize;
constexpr unsigned kWavesN = kWaves == 8 ? 4 : 2;
constexpr unsigned kWavesM = kWaves / kWavesN;
constexpr unsigned kWaveRows = kTileM / kWavesM, kWaveCols = kTileN / kWavesN;

// Consecutive blocks walk kGroupM block rows of C column by column, so the B blocks they read
// are shared through L2 by kGroupM blocks at once instead of streaming from memory per row.
constexpr unsigned kGroupM = 8;

template <typename T, BLayout kB> struct BTileOf;
template <typename T> struct BTileOf<T, BLayout::kNK> {
  using Type = hk::tile::SharedTile<T, kTileN, kTileK>;
};
template <typename T> struct BTileOf<T, BLayout::kKN> {
  using Type = hk::tile::SharedTile<T, kTileK, kTileN>;
};

// One step's A and B blocks in shared memory.
template <typename T, BLayout kB> struct Stage {
  hk::tile::SharedTile<T, kTileM, kTileK> a;
  typename BTileOf<T, kB>::Type b;
};

struct BlockTile {
  unsigned m, n;  // block row and column of C
};

// This block's tile of C, grouped as kGroupM says (grid x counts column tiles, y row tiles).
HK_DEVICE BlockTile block_tile() {
  const unsigned tiles_n = hk::grid_dim_x(), tiles_m = hk::grid_dim_y();
  const unsigned long long id =
      static_cast<unsigned long long>(hk::block_idx_y()) * tiles_n + hk::block_idx_x();
  const unsigned long long per_group = static_cast<unsigned long long>(kGroupM) * tiles_n;
  const unsigned first_m = static_cast<unsigned>(id / per_group) * kGroupM;
  const unsigned group_m = tiles_m - first_m < kGroupM ? tiles_m - first_m : kGroupM;
  const unsigned in_group = static_cast<unsigned>(id % per_group);
  return {first_m + in_group % group_m, in_group / group_m};
}

template <typename T, typename Out, BLayout kB, bool kBias>
HK_DEVICE void gemm(Out* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                    const T* __restrict__ bias, unsigned m, unsigned n, unsigned k, unsigned lda,
                    unsigned ldb, unsigned ldc) {
  __shared__ Stage<T, kB> stage[kStages];
  using Acc = hk::tile::Accumulators<T, kWaveRows / 16, kWaveCols / 16>;
  using Atom = typename Acc::Atom;

  const BlockTile tile = block_tile();
  const unsigned row0 = tile.m * kTileM, col0 = tile.n * kTileN;
  const unsigned thread = hk::thread_idx_x();
  const unsigned wave = hk::wave_id();
  const unsigned wave_row = wave / kWavesN * kWaveRows, wave_col = wave % kWavesN * kWaveCols;

  const hk::tile::GlobalMatrix<T> ga{a, m, k, lda};
  const hk::tile::GlobalMatrix<T> gb =
      kB == BLayout::kNK ? hk::tile::GlobalMatrix<T>{b, n, k, ldb}
                         : hk::tile::GlobalMatrix<T>{b, k, n, ldb};
  // Where step s's B block starts in gb.
  const auto b_row = [&](unsigned s) { return kB == BLayout::kNK ? col0 : s * kTileK; };
  const auto b_col = [&](unsigned s) { return kB == BLayout::kNK ? s * kTileK : col0; };
  const unsigned steps = (k + kTileK - 1) / kTileK;

  Acc acc;
  acc.zero();
  const auto multiply = [&](const Stage<T, kB>& s) {
#pragma unroll
    for (unsigned kk = 0; kk < kTileK; kk += Atom::kK)
      hk::tile::mma<kB>(acc, s.a, s.b, wave_row, wave_col, kk);
  };

  const bool a_vector = ga.vector_rows(), b_vector = gb.vector_rows();
#if HK_NVIDIA
  if (a_vector && b_vector) {
    const auto copy = [&](unsigned s) {
      hk::tile::copy_async<kBlock>(stage[s % kStages].a, ga, row0, s * kTileK, thread);
      hk::tile::copy_async<kBlock>(stage[s % kStages].b, gb, b_row(s), b_col(s), thread);
    };
#pragma unroll
    for (unsigned s = 0; s + 1 < kStages; ++s) {
      if (s < steps) copy(s);
      hk::tile::async_commit();
    }
    for (unsigned s = 0; s < steps; ++s) {
      // Step s's copies are done (one group per step, kStages - 2 younger ones may fly), and
      // after the barrier every wave has finished step s - 1, whose stage the copy reuses.
      hk::tile::async_wait<kStages - 2>();
      hk::block_sync();
      if (s + kStages - 1 < steps) copy(s + kStages - 1);
      hk::tile::async_commit();
      multiply(stage[s % kStages]);
    }
  } else
#endif
  {
    hk::tile::StagedCopy<decltype(Stage<T, kB>::a), kBlock> next_a;
    hk::tile::StagedCopy<decltype(Stage<T, kB>::b), kBlock> next_b;
    next_a.fetch(ga, row0, 0, thread, a_vector);
    next_b.fetch(gb, b_row(0), b_col(0), thread, b_vector);
    next_a.store(stage[0].a, thread);
    next_b.store(stage[0].b, thread);
    hk::block_sync();
    for (unsigned s = 0; s < steps; ++s) {
      const bool more = s + 1 < steps;
      if (more) {
        next_a.fetch(ga, row0, (s + 1) * kTileK, thread, a_vector);
        next_b.fetch(gb, b_row(s + 1), b_col(s + 1), thread, b_vector);
      }
      multiply(stage[s % 2]);
      // The other stage was last read in step s - 1, before the barrier that ended it.
      if (more) {
        next_a.store(stage[(s + 1) % 2].a, thread);
        next_b.store(stage[(s + 1) % 2].b, thread);
      }
      hk::block_sync();
    }
  }

  acc.for_each([&](unsigned r, unsigned col, float v) {
    const unsigned row = row0 + wave_row + r, column = col0 + wave_col + col;
    if (row < m && column < n) {
      if constexpr (kBias) v += hk::to_float(bias[column]);
      c[static_cast<unsigned long long>(row) * ldc + column] = hk::from_float<Out>(v);
    }
  });
}

}  // namespace

// Two blocks per SM / CU: caps NVIDIA at 128 registers a thread, which holds the 64
// accumulators, the operand fragments and the addresses without spilling.
#define HK_GEMM_ENTRY(name) HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kBlock, 2) void gemm_a16w16_##name
#define HK_GEMM(layout, kB, name, T, out_suffix, Out)                                          \
  HK_GEMM_ENTRY(layout##_##name##out_suffix)(Out* c, const T* a, const T* b, unsigned m,       \
                                             unsigned n, unsigned k, unsigned lda,             \
                                             unsigned ldb, unsigned ldc) {                     \
    gemm<T, Out, kB, false>(c, a, b, nullptr, m, n, k, lda, ldb, ldc);                         \
  }                                                                                            \
  HK_GEMM_ENTRY(layout##_##name##_bias##out_suffix)(Out* c, const T* a, const T* b,            \
                                                    const T* bias, unsigned m, unsigned n,     \
                                                    unsigned k, unsigned lda, unsigned ldb,    \
                                                    unsigned ldc) {                            \
    gemm<T, Out, kB, true>(c, a, b, bias, m, n, k, lda, ldb, ldc);                             \
  }
#define HK_GEMM_ALL(layout, kB)                       \
  HK_GEMM(layout, kB, bf16, hk::bf16, , hk::bf16)     \
  HK_GEMM(layout, kB, bf16, hk::bf16, _out_f32, float) \
  HK_GEMM(layout, kB, f16, hk::f16, , hk::f16)        \
  HK_GEMM(layout, kB, f16, hk::f16, _out_f32, float)
HK_GEMM_ALL(nt, BLayout::kNK)
HK_GEMM_ALL(nn, BLayout::kKN)
