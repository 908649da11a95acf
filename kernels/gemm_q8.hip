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
// its waves as TilingOf says, grid x over n, y over m, z over a batch's products or K's splits).
//
// A program on the tile layer, as gemm.hip: hk/tile/k_loop.h walks K (copies, stages, the
// split-K share; weight-only kernels stage B through registers on every target, widening it
// there) and, for int8 on sm_90a, hk/tile/pipeline.h; this file chooses the blocks, folds block
// scales group by group and scales what C receives. The README's benchmark section says why
// these tilings.
#include "hk/fp8.h"
#include "hk/hk.h"
#include "hk/tile/pipeline.h"
#include "hk/tile/tile.h"

namespace {

using hk::tile::BatchStrides;
using hk::tile::BLayout;
using hk::tile::GridZ;

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

// 128 x 128 blocks of C, 64 bytes deep a step (32 bf16 elements for weight-only kernels).
// NVIDIA: per-tensor and per-token scales take four waves of 64 x 64 in 4 stages of dynamic
// shared memory (their contracts' `shared`); block scales keep a second set of accumulators,
// so eight waves of 64 x 32, 32 deep, in static stages. AMD: eight waves of 64 x 32 for every
// scheme; gfx950's LDS (160 KiB) holds two blocks of 128-byte steps.
#if defined(__gfx950__)
constexpr unsigned kAmdStepBytes = 128;
#else
constexpr unsigned kAmdStepBytes = 64;
#endif
template <Scales kScales, GridZ kZ> struct Blocks {
  static constexpr bool kSquare = !grouped(kScales) && !HK_AMD;  // four waves of 64 x 64
  static constexpr unsigned kTileK = kSquare                                      ? 64
                                     : HK_AMD && kScales != Scales::kWeightBlock ? kAmdStepBytes
                                                                                  : 32;
  using Tiling = hk::tile::Tiling<128, 128, kTileK, 2, kSquare ? 2 : 4,
                                  kSquare ? 4 : kScales == Scales::kWeightBlock ? 2 : 3, kSquare>;
};
// Weight-only decode, K split over the grid's z: gemm.hip's Skinny.
template <> struct Blocks<Scales::kWeightBlock, GridZ::kSplitK> {
  using Tiling = hk::tile::Tiling<16, 64, HK_AMD ? 64 : 128, 1, 4, 2>;
};
template <Scales kScales, GridZ kZ = GridZ::kNone>
using TilingOf = typename Blocks<kScales, kZ>::Tiling;

// The depth and width of a block scale's group (DeepSeek-V3's 1 x 128 and 128 x 128). A block
// of C lies in one group's width, so one b_scale a group multiplies all of it, and a group is
// whole steps deep, so a group's partial sums are complete at the end of a step.
constexpr unsigned kScaleGroup = 128;
template <class Tl> constexpr bool kGroupsFit =
    kScaleGroup % Tl::kTileN == 0 && kScaleGroup % Tl::kTileK == 0;
static_assert(kGroupsFit<TilingOf<Scales::kBlock>> && kGroupsFit<TilingOf<Scales::kWeightBlock>> &&
                  kGroupsFit<TilingOf<Scales::kWeightBlock, GridZ::kSplitK>>,
              "a block of C shares one b_scale a group, and a group is whole steps deep");

#if HK_NVIDIA
// The contracts (manifests/gemm_a8w8.toml, gemm_fp8_e4m3fn.toml) give the per-tensor and
// per-token kernels this much dynamic shared memory.
template <typename T, Scales kScales> constexpr bool kSharedAsContracted =
    TilingOf<kScales>::kDynamic &&
    TilingOf<kScales>::kStages *
            sizeof(hk::tile::MmaStage<TilingOf<kScales>, T, BLayout::kNK, 1>) ==
        65536;
static_assert(kSharedAsContracted<hk::i8, Scales::kPerToken> &&
                  kSharedAsContracted<hk::i8, Scales::kPerTensor>,
              "the stages no longer match the `shared` of the 8-bit GEMMs' contracts");
#endif

// kZ: what the grid's z blocks do (a batch's scales are dense: m and n apart). T is A's element
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
  static_assert((kScales == Scales::kWeightBlock) == (sizeof(TB) != sizeof(T)),
                "only weight-only kernels widen B");
  if constexpr (kZ == GridZ::kBatch) {
    const unsigned long long p = hk::block_idx_z();
    a += p * strides.a;
    b += p * strides.b;
    c += p * strides.c;
    a_scale += p * m;
    b_scale += p * n;
  }
  using Tl = TilingOf<kScales, kZ>;
  using Acc = hk::tile::Accumulators<T, Tl::kWaveRows / 16, Tl::kWaveCols / 16>;
  using Atom = typename Acc::Atom;
  static_assert(Tl::kTileK % Atom::kK == 0, "a step is whole atoms deep");
  const unsigned steps = (k + Tl::kTileK - 1) / Tl::kTileK;
  const unsigned groups = (k + kScaleGroup - 1) / kScaleGroup;
  constexpr unsigned kStepsPerGroup = kScaleGroup / Tl::kTileK;
  // A split K takes whole groups: a group's sums are scaled as one.
  const hk::tile::KRange range = hk::tile::k_range<kZ>(steps, kStepsPerGroup);
  if (range.idle) return;
  const TB* const bs[1] = {b};
  const hk::tile::MmaBlock<Tl, T, BLayout::kNK, 1, TB> block(a, bs, m, n, k, lda, ldb);
  const unsigned row0 = block.row0 + block.wave_row, col0 = block.col0 + block.wave_col;

  // With block scales, acc holds the current group's partial sums and total the scaled sum of
  // the groups before it (unused, and so gone, for the other schemes).
  Acc acc, total;
  acc.zero();
  total.zero();
  const auto fold = [&](unsigned group) HK_INLINE {
    const float b_group = b_scale[block.col0 / kScaleGroup * groups + group];
#pragma unroll
    for (unsigned i = 0; i < Acc::kTilesM; ++i) {
      // A lane's accumulators of atom row i lie in two rows (Atom::row of v = 0 and v = 2
      // on NVIDIA; more on AMD): one scale each, loaded once.
      float scale[Atom::C::kSize];
#pragma unroll
      for (unsigned v = 0; v < Atom::C::kSize; ++v) {
        // Rows past m sum only the zero fill and are never stored; they read the last
        // row's scale, as theirs are not in a_scale.
        const unsigned at = row0 + i * Atom::kM + Atom::row(v);
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
  hk::tile::k_loop(block, range, [&](const auto& stage, unsigned step) HK_INLINE {
#pragma unroll
    for (unsigned kk = 0; kk < Tl::kTileK; kk += Atom::kK)
      hk::tile::mma<BLayout::kNK>(acc, stage.a, stage.b[0], block.wave_row, block.wave_col, kk);
    if constexpr (grouped(kScales)) {
      if (step % kStepsPerGroup == kStepsPerGroup - 1 || step + 1 == steps)
        fold(step / kStepsPerGroup);
    }
  });

  // The scales apply to the finished sums (an i32 sum converts to f32 once, rounding only
  // past 2^24), in the order the reference states: sum · a_scale · b_scale (+ bias); block
  // scales were applied group by group (fold). A split K adds the bias in its first split.
  const bool add_bias = kBias && (kZ != GridZ::kSplitK || hk::block_idx_z() == 0);
  const float tensor_scale = kScales == Scales::kPerTensor ? a_scale[0] * b_scale[0] : 0.0f;
  const Acc& sums = grouped(kScales) ? total : acc;
  sums.for_each([&](unsigned r, unsigned col, auto sum) HK_INLINE {
    const unsigned row = row0 + r, column = col0 + col;
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
      Out* const line = c + static_cast<unsigned long long>(row) * ldc + col0;
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
  HK_Q8_WG_ENTRY(name##_bf16, TilingOf<kScales>)(HK_Q8_PARAMS(T), HK_Q8_SIZES) {            \
    q8<T, kScales, false>(c, a, b, a_scale, b_scale, nullptr, m, n, k, lda, ldb, ldc);    \
  }                                                                                       \
  HK_Q8_WG_ENTRY(name##_bias_bf16, TilingOf<kScales>)(HK_Q8_PARAMS(T), const hk::bf16* bias, \
                                                    HK_Q8_SIZES) {                        \
    q8<T, kScales, true>(c, a, b, a_scale, b_scale, bias, m, n, k, lda, ldb, ldc);        \
  }

// The batched per-token GEMM: the batch's size is the grid's z.
#define HK_Q8_BATCHED(name, T)                                                                 \
  HK_Q8_WG_ENTRY(name##_bf16, TilingOf<Scales::kPerToken>)(                                      \
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
using WeightOnly = TilingOf<Scales::kWeightBlock>;
using WeightOnlySplitK = TilingOf<Scales::kWeightBlock, GridZ::kSplitK>;
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
