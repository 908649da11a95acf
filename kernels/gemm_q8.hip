// GEMM of 8-bit matrices, C = A·Bᵀ with B stored [N][K] (a linear layer's quantized weight),
// row-major with leading dimensions, sums in i32 (int8) or f32 (FP8), scaled and written in
// bf16. One source, several modules, each defining which element type it builds:
//
// HK_GEMM_A8W8 (manifests/gemm_a8w8.toml): int8 x int8, exact i32 sums (SmoothQuant's W8A8)
//   gemm_a8w8_nt[_bias]_bf16(c, a, b, a_scale, b_scale, [bias,] m, n, k, lda, ldb, ldc)
//     C[i][j] = bf16(f32(Σ_k A[i][k] B[j][k]) · a_scale[i] · b_scale[j] (+ bias[j]))
//     a_scale per token [M], b_scale per output channel [N], f32; bias bf16 [N].
//   batched_gemm_a8w8_nt_bf16(c, a, b, a_scale, b_scale, m, n, k, lda, ldb, ldc, batch,
//     stride_a, stride_b, stride_c): batch products C_p = A_p·B_pᵀ scaled per token and
//     channel, matrix p of each starting stride_* elements after matrix p - 1 (0 shares one, a
//     weight say), scales dense per product: a_scale [batch][M], b_scale [batch][N] (a shared
//     weight's scales are repeated, so that each product may requantize its own); the grid's z
//     counts the batch, as gemm.hip's batched GEMMs.
// HK_GEMM_FP8=<format> (manifests/gemm_fp8_<format>.toml, format e4m3fn or e4m3fnuz): FP8
//   E4M3 x E4M3 (element type hk::fp8_<format>), f32 sums
//   gemm_fp8_<format>_nt_{per_tensor,per_token}[_bias]_bf16(the same arguments)
//     per_tensor: a_scale[0] and b_scale[0] scale everything; per_token: as a8w8's scales.
//   gemm_fp8_blockscale_<format>_nt[_bias]_bf16(the same arguments): DeepSeek-V3's scales,
//     a_scale [M][G] per 1 x 128 group of A's row, b_scale [ceil(N/128)][G] per 128 x 128
//     block of B, G = ceil(K/128): C[i][j] = bf16(Σ_g f32(Σ_{k in g} A[i][k] B[j][k])
//     · a_scale[i][g] · b_scale[j/128][g] (+ bias[j])), each group's partial sums in f32.
//   batched_gemm_fp8_<format>_nt_per_token_bf16(batched_gemm_a8w8_nt_bf16's arguments): its
//     batched product, per_token scales per product.
//   <format> is the one the target's instruction computes on (hk/tile/mfma8.h,
//   hk/tile/mma_sync8.h): e4m3fnuz on gfx942, e4m3fn on gfx950 and sm_90, so each
//   format is its own module with the other targets skipped (and gfx90a, sm_80: none at all).
// HK_GEMM_A16W8 (manifests/gemm_a16w8.toml): bf16 activations x FP8 weights (weight-only
//   quantization, for decode), bf16 products in f32 sums, on every target in both formats
//   (the weights are widened to bf16 on the way to shared memory, hk/tile/widen.h, so no FP8
//   instruction is needed):
//   gemm_a16w8_blockscale_<format>_nt[_bias]_bf16(c, a, b, b_scale, [bias,] m, n, k, lda,
//     ldb, ldc): b_scale [ceil(N/128)][G] per 128 x 128 block of B as above, G = ceil(K/128):
//     C[i][j] = bf16(Σ_g f32(Σ_{k in g} A[i][k] B[j][k]) · b_scale[j/128][g] (+ bias[j])),
//     the dequantized weight B[j][k] · b_scale[j/128][g] applied group by group, exactly.
//   gemm_a16w8_blockscale_splitk_<format>_nt[_bias]_f32(the same arguments, C f32): for
//     decode, C[i][j] += the same sum (+ bias[j]), K split over the grid's z in whole groups,
//     each split adding its groups' scaled sums with atomics (the first adds the bias).
//
// Launch: the contracts in the manifests (a block of 128 x 128 of C, or 16 x 64 for split K,
// its waves as Tiling says, grid x over n, y over m, z over a batch's products or K's splits).
// The structure is gemm.hip's (see there): K in steps of 32 to 256 bytes through shared tiles,
// zero-filled past the edges (so any M, N, K), NVIDIA overlapping kStages - 1 steps with
// cp.async when rows are 16-byte aligned (pointers aligned, k and ld multiples of 16), every
// other case staging the next step through registers, rows that are not aligned element by
// element.
#include "hk/fp8.h"
#include "hk/hk.h"
#include "hk/tile/pipeline.h"
#include "hk/tile/tile.h"

namespace {

using hk::tile::BLayout;

// Which scales multiply the sums.
enum class Scales {
  kPerTensor,  // a_scale[0] · b_scale[0]
  kPerToken,   // a_scale[row] · b_scale[column]
  kBlock,      // per 128-deep group g: a_scale[row][g] · b_scale[column / 128][g]
  kWeightBlock,  // weight-only: per 128-deep group g, b_scale[column / 128][g]; A is bf16, B
                 // FP8 widened to bf16 as it is staged
};

// Whether the scheme scales group by group (the partial sums of each 128-deep group folded
// into a second set of accumulators).
constexpr bool grouped(Scales scales) {
  return scales == Scales::kBlock || scales == Scales::kWeightBlock;
}

// What the grid's z blocks do (as in gemm.hip): nothing (z = 1), take one product of a batch
// each, or take a share of K's groups each and add their sums to an f32 C (weight-only decode).
enum class GridZ { kNone, kBatch, kSplitK };

// 128 x 128 blocks of C, 64 elements (bytes) deep a step: the 16-bit Square's shape and bytes.
// NVIDIA copies with cp.async into shared stages. Per-tensor and per-token scales take four
// waves of 64 x 64 (16 atoms of 16 x 16 each) in 4 stages of 16 KiB of dynamic shared memory
// (their contracts' `shared`). Block scales keep a second set of accumulators (the scaled total
// of the finished groups), which at 64 x 64 a wave spills 400 registers and more, so they take
// eight waves of 64 x 32, 32 deep (at 64 deep sm_90 spilled 4 to 10 registers), in 3 static
// stages. AMD takes eight waves of 64 x 32 for every scheme, double-buffered through registers
// (not measured: no AMD GPU here). Weight-only kernels multiply bf16, so 32 elements are the same
// 64 bytes; they stage through registers on every target (the widening happens there), in two
// stages, eight waves.
//
// FP8 on the H100 (per token; M = 2048 and 8192 over scripts/gemm_q8_bench.py's six Llama-3
// shapes; TF/s; torch._scaled_mm 1218-1392 in the same run): four waves of 64 x 64, 64 deep in
// 4 stages, 370-450 (0.29-0.34 of the peer); eight waves of 64 x 32 in 3 stages (the tiling
// before) 280-340; eight of 64 x 64 as 256 x 128 blocks, 128 deep in 2 stages, 357-452, and
// 64 deep in 3, 320-393; four of 64 x 64 128 deep in 3 stages 366-418 (spills 40 bytes), 32
// deep in 4 332-392; eight of 64 x 32 128 deep in 3 stages 307-376; eight of 32 x 64 274-324.
// int8 in the same run of the bench: 550-812 TOP/s with four waves of 64 x 64, 0.65-0.82 of
// torch._int_mm (eight waves of 64 x 32: 388-505). What limits FP8: sm_90 has no FP8 mma.sync
// (hk/tile/mma_sync8.h), so E4M3 is multiplied by the f16 mma.sync, whose peak with register
// operands alone is 582-637 TF/s on that H100 (E4M3 mma.sync as ptxas emulates it: 268-357):
// half of what torch._scaled_mm reaches with wgmma, which needs sm_90a code.
template <Scales kScales, GridZ kZ = GridZ::kNone> struct Tiling {
  static_assert(kZ != GridZ::kSplitK, "split K has its own tiling");
  static constexpr unsigned kTileM = 128, kTileN = 128;
#if HK_AMD
  static constexpr unsigned kWavesM = 2, kWavesN = 4;
  static constexpr unsigned kTileK = kScales == Scales::kWeightBlock ? 32 : 64, kStages = 2;
  static constexpr bool kDynamic = false;
#else
  static constexpr bool kSquare = !grouped(kScales);  // four waves of 64 x 64
  static constexpr unsigned kWavesM = 2, kWavesN = kSquare ? 2 : 4;
  static constexpr unsigned kTileK = kSquare ? 64 : 32;
  static constexpr unsigned kStages = kSquare ? 4 : kScales == Scales::kWeightBlock ? 2 : 3;
  static constexpr bool kDynamic = kSquare;
#endif
  static constexpr unsigned kThreads = kWavesM * kWavesN * hk::kWaveSize;
  static constexpr unsigned kWaveRows = kTileM / kWavesM, kWaveCols = kTileN / kWavesN;
};

// Weight-only decode, K split over the grid's z: gemm.hip's Skinny, four waves of 16 x 16 side
// by side (blocks of 16 x 64, so that little work is wasted on rows past a small m), 128 deep
// (AMD 64, so that two blocks' LDS fit a CU), two stages through registers, where the weights
// are widened.
template <> struct Tiling<Scales::kWeightBlock, GridZ::kSplitK> {
  static constexpr unsigned kTileM = 16, kTileN = 64;
  static constexpr unsigned kWavesM = 1, kWavesN = 4;
#if HK_AMD
  static constexpr unsigned kTileK = 64;
#else
  static constexpr unsigned kTileK = 128;
#endif
  static constexpr unsigned kStages = 2;
  static constexpr bool kDynamic = false;
  static constexpr unsigned kThreads = kWavesM * kWavesN * hk::kWaveSize;
  static constexpr unsigned kWaveRows = kTileM / kWavesM, kWaveCols = kTileN / kWavesN;
};

// The depth and width of a block scale's group (DeepSeek-V3's 1 x 128 and 128 x 128). A block
// of C lies in one group's width, so one b_scale a group multiplies all of it, and a group is
// whole steps deep, so a group's partial sums are complete at the end of a step.
constexpr unsigned kScaleGroup = 128;
template <class Tl> constexpr bool kGroupsFit =
    kScaleGroup % Tl::kTileN == 0 && kScaleGroup % Tl::kTileK == 0;
static_assert(kGroupsFit<Tiling<Scales::kBlock>> && kGroupsFit<Tiling<Scales::kWeightBlock>> &&
                  kGroupsFit<Tiling<Scales::kWeightBlock, GridZ::kSplitK>>,
              "a block of C shares one b_scale a group, and a group is whole steps deep");

// How B is staged through registers: as it is, or widened from FP8 to the tile's bf16.
template <class Tile, unsigned kThreads, typename TB, bool kWiden> struct StagedB {
  using Copy = hk::tile::StagedCopy<Tile, kThreads>;
};
template <class Tile, unsigned kThreads, typename TB> struct StagedB<Tile, kThreads, TB, true> {
  using Copy = hk::tile::WideningCopy<Tile, kThreads, TB>;
};

// Element strides between the matrices of a batch (the scales are dense: m and n apart).
struct BatchStrides {
  unsigned long long a, b, c;
};

template <typename T, class Tl> struct Stage {
  hk::tile::SharedTile<T, Tl::kTileM, Tl::kTileK> a;
  hk::tile::SharedTile<T, Tl::kTileN, Tl::kTileK> b;
};

#if HK_NVIDIA
// The contracts (manifests/gemm_a8w8.toml, gemm_fp8_e4m3fn.toml) give the per-tensor and
// per-token kernels this much dynamic shared memory.
template <typename T, Scales kScales> constexpr bool kSharedAsContracted =
    Tiling<kScales>::kDynamic &&
    Tiling<kScales>::kStages * sizeof(Stage<T, Tiling<kScales>>) == 65536;
static_assert(kSharedAsContracted<hk::i8, Scales::kPerToken> &&
                  kSharedAsContracted<hk::i8, Scales::kPerTensor>,
              "the stages no longer match the `shared` of the 8-bit GEMMs' contracts");
#endif

// kZ: what the grid's z blocks do (a batch's products are strides apart). T is A's element
// type and the one multiplied; TB is B's as stored (T, but for weight-only kernels); Out is C's,
// bf16, or f32 for a split K, whose splits add to C.
template <typename T, Scales kScales, bool kBias, GridZ kZ = GridZ::kNone, typename TB = T,
          typename Out = hk::bf16>
HK_DEVICE void gemm_q8(Out* __restrict__ c, const T* __restrict__ a, const TB* __restrict__ b,
                       const float* __restrict__ a_scale, const float* __restrict__ b_scale,
                       const hk::bf16* __restrict__ bias, unsigned m, unsigned n, unsigned k,
                       unsigned lda, unsigned ldb, unsigned ldc, BatchStrides strides = {}) {
  static_assert(kZ != GridZ::kBatch || kScales == Scales::kPerToken,
                "a batch has per-token scales");
  static_assert((kZ == GridZ::kSplitK) == __is_same(Out, float), "split K adds to an f32 C");
  if constexpr (kZ == GridZ::kBatch) {
    const unsigned long long p = hk::block_idx_z();
    a += p * strides.a;
    b += p * strides.b;
    c += p * strides.c;
    a_scale += p * m;
    b_scale += p * n;
  }
  using Tl = Tiling<kScales, kZ>;
  using Stage = ::Stage<T, Tl>;
  Stage* const stage = hk::tile::stages<Stage, Tl::kStages, Tl::kDynamic>();
  using Acc = hk::tile::Accumulators<T, Tl::kWaveRows / 16, Tl::kWaveCols / 16>;
  using Atom = typename Acc::Atom;
  static_assert(Tl::kTileK % Atom::kK == 0, "a step is whole atoms deep");

  const unsigned steps = (k + Tl::kTileK - 1) / Tl::kTileK;
  const unsigned groups = (k + kScaleGroup - 1) / kScaleGroup;
  constexpr unsigned kStepsPerGroup = kScaleGroup / Tl::kTileK;
  // This block's steps: all of them, or for a split K an even share of whole groups (a group's
  // sums are scaled as one); the last splits may get none when z does not divide the groups.
  unsigned first = 0, last = steps;
  if constexpr (kZ == GridZ::kSplitK) {
    const unsigned groups_per_split = (groups + hk::grid_dim_z() - 1) / hk::grid_dim_z();
    const unsigned per_split = groups_per_split * kStepsPerGroup;
    first = hk::block_idx_z() * per_split;
    if (first >= steps) return;  // the whole block: no barrier is skipped by part of it
    last = steps - first < per_split ? steps : first + per_split;
  }
  const hk::tile::BlockTile tile = hk::tile::block_tile();
  const unsigned row0 = tile.m * Tl::kTileM, col0 = tile.n * Tl::kTileN;
  const unsigned thread = hk::thread_idx_x();
  const unsigned wave = hk::wave_id();
  const unsigned wave_row = wave / Tl::kWavesN * Tl::kWaveRows;
  const unsigned wave_col = wave % Tl::kWavesN * Tl::kWaveCols;
  const hk::tile::GlobalMatrix<T> ga{a, m, k, lda};
  const hk::tile::GlobalMatrix<TB> gb{b, n, k, ldb};
  constexpr bool kWiden = kScales == Scales::kWeightBlock;
  static_assert(kWiden == (sizeof(TB) != sizeof(T)), "only weight-only kernels widen B");
  using BCopy = typename StagedB<decltype(Stage::b), Tl::kThreads, TB, kWiden>::Copy;

  Acc acc;
  acc.zero();
  // With block scales, acc holds the current group's partial sums and total the scaled sum of
  // the groups before it (unused, and so gone, for the other schemes).
  Acc total;
  total.zero();
  const auto fold = [&](unsigned group) HK_INLINE {
    const float b_group = b_scale[col0 / kScaleGroup * groups + group];
#pragma unroll
    for (unsigned i = 0; i < Acc::kTilesM; ++i) {
      // A lane's accumulators of atom row i lie in two rows (Atom::row of v = 0 and v = 2
      // on NVIDIA; more on AMD): one scale each, loaded once.
      float scale[Atom::C::kSize];
#pragma unroll
      for (unsigned v = 0; v < Atom::C::kSize; ++v) {
        // Rows past m sum only the zero fill and are never stored; they read the last
        // row's scale, as theirs are not in a_scale.
        const unsigned at = row0 + wave_row + i * Atom::kM + Atom::row(v);
        if constexpr (kScales == Scales::kWeightBlock)
          scale[v] = b_group;
        else
          scale[v] = a_scale[(at < m ? at : m - 1) * groups + group] * b_group;
      }
#pragma unroll
      for (unsigned j = 0; j < Acc::kTilesN; ++j)
#pragma unroll
        for (unsigned v = 0; v < Atom::C::kSize; ++v) {
          total.tile[i][j].v[v] += acc.tile[i][j].v[v] * scale[v];
          acc.tile[i][j].v[v] = 0;
        }
    }
  };
  const auto multiply = [&](const Stage& s, unsigned step) HK_INLINE {
#pragma unroll
    for (unsigned kk = 0; kk < Tl::kTileK; kk += Atom::kK)
      hk::tile::mma<BLayout::kNK>(acc, s.a, s.b, wave_row, wave_col, kk);
    if constexpr (grouped(kScales)) {
      if (step % kStepsPerGroup == kStepsPerGroup - 1 || step + 1 == steps)
        fold(step / kStepsPerGroup);
    }
  };

  bool vector = ga.vector_rows();
  if constexpr (kWiden)
    vector = vector && BCopy::vector_rows(gb);
  else
    vector = vector && gb.vector_rows();
#if HK_NVIDIA
  if constexpr (!kWiden) {
    if (vector) {
      constexpr unsigned kStages = Tl::kStages;
      const auto copy = [&](unsigned s) HK_INLINE {
        Stage& to = stage[(s - first) % kStages];
        hk::tile::copy_async<Tl::kThreads>(to.a, ga, row0, s * Tl::kTileK, thread);
        hk::tile::copy_async<Tl::kThreads>(to.b, gb, col0, s * Tl::kTileK, thread);
      };
#pragma unroll
      for (unsigned s = first; s + 1 < first + kStages; ++s) {
        if (s < last) copy(s);
        hk::tile::async_commit();
      }
      for (unsigned s = first; s < last; ++s) {
        // Step s's copies are done, and after the barrier every wave has finished step s - 1,
        // whose stage the next copy reuses.
        hk::tile::async_wait<kStages - 2>();
        hk::block_sync();
        if (s + kStages - 1 < last) copy(s + kStages - 1);
        hk::tile::async_commit();
        multiply(stage[(s - first) % kStages], s);
      }
    } else {
      // Unaligned rows, the slow path: element by element, no overlap, so that nothing staged
      // adds to the registers the multiply needs (staging through registers spilled here).
      for (unsigned s = first; s < last; ++s) {
        hk::tile::copy_elements<Tl::kThreads>(stage[0].a, ga, row0, s * Tl::kTileK, thread);
        hk::tile::copy_elements<Tl::kThreads>(stage[0].b, gb, col0, s * Tl::kTileK, thread);
        hk::block_sync();
        multiply(stage[0], s);
        hk::block_sync();
      }
    }
  } else
#endif
  {
    // Through registers: AMD's way, and weight-only kernels' on every target.
    hk::tile::StagedCopy<decltype(Stage::a), Tl::kThreads> next_a;
    BCopy next_b;
    const auto fetch = [&](unsigned s) HK_INLINE {
      next_a.fetch(ga, row0, s * Tl::kTileK, thread, vector);
      next_b.fetch(gb, col0, s * Tl::kTileK, thread, vector);
    };
    const auto store = [&](Stage& to) HK_INLINE {
      next_a.store(to.a, thread);
      next_b.store(to.b, thread);
    };
    fetch(first);
    store(stage[0]);
    hk::block_sync();
    for (unsigned s = first; s < last; ++s) {
      const unsigned now = (s - first) % 2;
      const bool more = s + 1 < last;
      if (more) fetch(s + 1);
      multiply(stage[now], s);
      // The other stage was last read in step s - 1, before the barrier that ended it.
      if (more) store(stage[1 - now]);
      hk::block_sync();
    }
  }

  // The scales apply to the finished sums (an i32 sum converts to f32 once, rounding only
  // past 2^24), in the order the reference states: sum · a_scale · b_scale (+ bias); block
  // scales were applied group by group (fold). A split K adds the bias in its first split.
  const bool add_bias = kBias && (kZ != GridZ::kSplitK || hk::block_idx_z() == 0);
  const float tensor_scale = kScales == Scales::kPerTensor ? a_scale[0] * b_scale[0] : 0.0f;
  const Acc& sums = grouped(kScales) ? total : acc;
  sums.for_each([&](unsigned r, unsigned col, auto sum) HK_INLINE {
    const unsigned row = row0 + wave_row + r, column = col0 + wave_col + col;
    if (row < m && column < n) {
      float x = static_cast<float>(sum);
      if constexpr (kScales == Scales::kPerTensor)
        x *= tensor_scale;
      else if constexpr (kScales == Scales::kPerToken)
        x = x * a_scale[row] * b_scale[column];
      if (add_bias) x += hk::to_float(bias[column]);
      // Addressed from the wave's corner of the row, so that a lane's columns are constant
      // offsets there: addressed from c, ptxas kept every element's address and bounds test
      // live at once and spilled on sm_80.
      Out* const line = c + static_cast<unsigned long long>(row) * ldc + col0 + wave_col;
      if constexpr (kZ == GridZ::kSplitK)
        hk::atomic_add(line + col, x);
      else
        line[col] = hk::from_float<Out>(x);
    }
  });
}

#if HK_SM90A
// sm_90a, int8: a wgmma program over hk/tile/pipeline.h, as gemm.hip's: blocks of 128 x 256 of
// C, K in steps of 128 (one 128-byte swizzled row), 4 stages of 48 KiB, one producer and two
// consumer warpgroups of 64 rows (128 exact i32 sums a thread).
//
// Not FP8 (the module is not built for sm_90a): wgmma on E4M3 does not sum in f32, which these
// kernels promise. Measured on the H100 against the f64 reference and the f32-accumulation bound
// of tests/src/kernels/gemm_q8.rs: one wgmma chain over K was off by up to 8 times the bound;
// taking each instruction's 32-deep product into fresh accumulators and adding those in f32
// still left K = 61 to 1000 cases at 1.2 to 2.6 times it (the error is inside one instruction),
// and ran at 0.33-0.49 of torch._scaled_mm (one chain: 0.45-0.72). So FP8 keeps sm_90's exact
// path (E4M3 widened to f16 for mma.sync, hk/tile/mma_sync8.h).
template <typename T, Scales kScales, bool kBias>
struct WgmmaQ8 : hk::tile::WgmmaNt<T, 128, 256, 4> {
  static_assert(__is_same(T, hk::i8),
                "wgmma's FP8 sums are not f32 (see above): FP8 GEMMs keep the mma.sync path");
  static_assert(kScales == Scales::kPerToken, "int8 GEMMs scale per token and channel");
  hk::bf16* c;
  const float *a_scale, *b_scale;
  const hk::bf16* bias;
  unsigned m, n, ldc;

  // sum · a_scale[row] · b_scale[column] (+ bias), in the order the reference states (as
  // gemm_q8 does).
  HK_DEVICE void finish(unsigned consumer) {
    hk::tile::wgmma::pin(this->acc);
    hk::tile::store_pairs(
        c, m, n, ldc, *this, consumer, [&](unsigned v, unsigned row, unsigned column) HK_INLINE {
          const float x = static_cast<float>(this->acc[v]) * a_scale[row] * b_scale[column];
          return kBias ? x + hk::to_float(bias[column]) : x;
        });
  }
};

// The contracts (manifests/gemm_a8w8.toml) give these kernels this much dynamic shared memory
// on sm_90a.
static_assert(WgmmaQ8<hk::i8, Scales::kPerToken, false>::Ring::kSharedBytes == 197696,
              "the wgmma ring no longer matches the `shared` of manifests/gemm_a8w8.toml");
constexpr unsigned kWgmmaThreads = WgmmaQ8<hk::i8, Scales::kPerToken, false>::kThreads;

template <typename T, Scales kScales, bool kBias, GridZ kZ>
HK_DEVICE void gemm_q8_wgmma(hk::bf16* __restrict__ c, const T* __restrict__ a,
                             const T* __restrict__ b, const float* __restrict__ a_scale,
                             const float* __restrict__ b_scale, const hk::bf16* __restrict__ bias,
                             unsigned m, unsigned n, unsigned k, unsigned lda, unsigned ldb,
                             unsigned ldc, BatchStrides strides) {
  static_assert(kZ != GridZ::kSplitK, "the wgmma program has no split-K role");
  using Program = WgmmaQ8<T, kScales, kBias>;
  if constexpr (kZ == GridZ::kBatch) {
    const unsigned long long p = hk::block_idx_z();
    a += p * strides.a;
    b += p * strides.b;
    c += p * strides.c;
    a_scale += p * m;
    b_scale += p * n;
  }
  const hk::tile::BlockTile tile = hk::tile::block_tile();
  Program p{{{a, m, k, lda}, {b, n, k, ldb}, tile.m * Program::kTileM, tile.n * Program::kTileN},
            c, a_scale, b_scale, bias, m, n, ldc};
  hk::tile::run_pipeline<typename Program::Ring>(p, Program::steps(k));
}
#endif

// The i8 and FP8 kernels' program: gemm_q8, or on sm_90a (int8 only) the wgmma program.
template <typename T, Scales kScales, bool kBias, GridZ kZ = GridZ::kNone>
HK_DEVICE void q8(hk::bf16* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                  const float* __restrict__ a_scale, const float* __restrict__ b_scale,
                  const hk::bf16* __restrict__ bias, unsigned m, unsigned n, unsigned k,
                  unsigned lda, unsigned ldb, unsigned ldc, BatchStrides strides = {}) {
#if HK_SM90A
  gemm_q8_wgmma<T, kScales, kBias, kZ>(c, a, b, a_scale, b_scale, bias, m, n, k, lda, ldb, ldc,
                                       strides);
#else
  gemm_q8<T, kScales, kBias, kZ>(c, a, b, a_scale, b_scale, bias, m, n, k, lda, ldb, ldc, strides);
#endif
}

}  // namespace

// One block per SM / CU at least: asking for two of eight waves (128 registers a thread on
// NVIDIA) spilled 8 to 64 bytes on sm_90 (the FP8 kernels most), which the module's no_spills
// refuses. Tl is the kernel's Tiling.
#define HK_Q8_ENTRY(name, Tl) \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(Tl::kThreads, 1) void name
// The i8 and FP8 kernels' entries: on sm_90a (int8 only) the wgmma program's block.
#if HK_SM90A
#define HK_Q8_WG_ENTRY(name, Tl) \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(kWgmmaThreads, 1) void name
#else
#define HK_Q8_WG_ENTRY(name, Tl) HK_Q8_ENTRY(name, Tl)
#endif
#define HK_Q8_SIZES unsigned m, unsigned n, unsigned k, unsigned lda, unsigned ldb, unsigned ldc
#define HK_Q8_PARAMS(T) \
  hk::bf16 *c, const T *a, const T *b, const float *a_scale, const float *b_scale
// HK_Q8 expands its arguments before HK_Q8_PAIR pastes onto the name.
#define HK_Q8(name, T, kScales) HK_Q8_PAIR(name, T, kScales)
#define HK_Q8_PAIR(name, T, kScales)                                                      \
  HK_Q8_WG_ENTRY(name##_bf16, Tiling<kScales>)(HK_Q8_PARAMS(T), HK_Q8_SIZES) {            \
    q8<T, kScales, false>(c, a, b, a_scale, b_scale, nullptr, m, n, k, lda, ldb, ldc);    \
  }                                                                                       \
  HK_Q8_WG_ENTRY(name##_bias_bf16, Tiling<kScales>)(HK_Q8_PARAMS(T), const hk::bf16* bias, \
                                                    HK_Q8_SIZES) {                        \
    q8<T, kScales, true>(c, a, b, a_scale, b_scale, bias, m, n, k, lda, ldb, ldc);        \
  }

// The batched per-token GEMM: the batch's size is the grid's z.
#define HK_Q8_BATCHED(name, T)                                                                 \
  HK_Q8_WG_ENTRY(name##_bf16, Tiling<Scales::kPerToken>)(                                      \
      HK_Q8_PARAMS(T), HK_Q8_SIZES, unsigned batch, unsigned long long stride_a,               \
      unsigned long long stride_b, unsigned long long stride_c) {                              \
    (void)batch; /* the grid's z */                                                            \
    q8<T, Scales::kPerToken, false, GridZ::kBatch>(c, a, b, a_scale, b_scale, nullptr, m, n, k, \
                                                   lda, ldb, ldc, {stride_a, stride_b, stride_c}); \
  }

// The weight-only GEMMs of one FP8 format: A bf16, B FP8, block scales for B alone; C in bf16,
// and for the split-K kernels (decode) added to in f32. HK_A16W8 pastes the format into the
// names before HK_A16W8_KERNEL pastes onto them.
// (The tilings go in by name: a template's comma would split a macro argument.)
using WeightOnly = Tiling<Scales::kWeightBlock>;
using WeightOnlySplitK = Tiling<Scales::kWeightBlock, GridZ::kSplitK>;
#define HK_A16W8(format)                                                                     \
  HK_A16W8_KERNEL(gemm_a16w8_blockscale_##format##_nt, hk::fp8_##format, GridZ::kNone,       \
                  WeightOnly, hk::bf16, _bf16)                                               \
  HK_A16W8_KERNEL(gemm_a16w8_blockscale_splitk_##format##_nt, hk::fp8_##format,              \
                  GridZ::kSplitK, WeightOnlySplitK, float, _f32)
#define HK_A16W8_PARAMS(Out, TB) Out *c, const hk::bf16 *a, const TB *b, const float *b_scale
#define HK_A16W8_CALL(TB, kZ, Out, kBias, bias)                                              \
  gemm_q8<hk::bf16, Scales::kWeightBlock, kBias, kZ, TB, Out>(c, a, b, nullptr, b_scale,     \
                                                               bias, m, n, k, lda, ldb, ldc);
#define HK_A16W8_KERNEL(name, TB, kZ, Tl, Out, out_suffix)                                   \
  HK_Q8_ENTRY(name##out_suffix, Tl)(HK_A16W8_PARAMS(Out, TB), HK_Q8_SIZES) {                 \
    HK_A16W8_CALL(TB, kZ, Out, false, nullptr)                                               \
  }                                                                                          \
  HK_Q8_ENTRY(name##_bias##out_suffix, Tl)(                                                  \
      HK_A16W8_PARAMS(Out, TB), const hk::bf16* bias, HK_Q8_SIZES) {                         \
    HK_A16W8_CALL(TB, kZ, Out, true, bias)                                                   \
  }

#if defined(HK_GEMM_A16W8)
HK_A16W8(e4m3fn)
HK_A16W8(e4m3fnuz)
#elif defined(HK_GEMM_A8W8)
HK_Q8(gemm_a8w8_nt, hk::i8, Scales::kPerToken)
HK_Q8_BATCHED(batched_gemm_a8w8_nt, hk::i8)
#elif defined(HK_GEMM_FP8)
#define HK_Q8_FP8_NAME(format, scheme) gemm_fp8_##format##_nt_##scheme
#define HK_Q8_FP8(format)                                                         \
  HK_Q8(HK_Q8_FP8_NAME(format, per_tensor), hk::fp8_##format, Scales::kPerTensor) \
  HK_Q8(HK_Q8_FP8_NAME(format, per_token), hk::fp8_##format, Scales::kPerToken)   \
  HK_Q8(gemm_fp8_blockscale_##format##_nt, hk::fp8_##format, Scales::kBlock)      \
  HK_Q8_BATCHED(batched_gemm_fp8_##format##_nt_per_token, hk::fp8_##format)
#define HK_Q8_FP8_EXPAND(format) HK_Q8_FP8(format)
HK_Q8_FP8_EXPAND(HK_GEMM_FP8)
#else
#error "define HK_GEMM_A8W8, HK_GEMM_A16W8, or HK_GEMM_FP8 as the FP8 format to build (the manifest does)"
#endif
