// GEMM of 16-bit matrices (bf16 or f16) with f32 accumulation, row-major with leading
// dimensions, so that views (a block of a larger matrix, a slice of a fused weight) need no
// copy:
//   _nt: C[m][n] = Σ_k A[m][k] · B[n][k]   (B stored [N][K]: torch.nn.Linear's weight, C = A·Bᵀ)
//   _nn: C[m][n] = Σ_k A[m][k] · B[k][n]   (B stored [K][N])
//
// gemm_a16w16_{nt,nn}_{bf16,f16}[_bias][_out_f32](c, a, b, [bias,] m, n, k, lda, ldb, ldc)
//   C = A·B (+ bias[n]) in the input type, or f32 (_out_f32), rounded once from the f32 sum.
//   Blocks of 128 x 128, for m in the hundreds and up.
// gemm_a16w16_splitk_nt_{bf16,f16}[_bias](c, a, b, [bias,] m, n, k, lda, ldb, ldc)
//   C += A·Bᵀ (+ bias[n]) into an f32 C, for decode and small batches (m up to a few
//   hundred, k large): blocks of 16 x 64 (on sm_90a past 16 rows, the wgmma program's 128 x
//   128), and K split across the grid's z blocks, which add their parts with f32 atomics
//   (so C must hold what the product adds to, zeros for a plain product, and the sum's
//   rounding order varies from run to run). Any z is correct; the contract picks one that
//   fills the device.
// gemm_a16w16_gated_{silu,gelu_tanh}_{bf16,f16}(c, a, w_gate, w_up, m, n, k, lda, ldb, ldc)
//   C = act(A·W_gateᵀ) ⊙ (A·W_upᵀ) in the input type (a Llama MLP's gate and up projections
//   and its silu_and_mul in one pass; both weights [N][K] with leading dimension ldb, so the
//   halves of a fused [2N][K] weight are w and w + n·ldb); act silu or gelu (tanh form).
//   Blocks of 128 x 64.
// batched_gemm_a16w16_{nt,nn}_{bf16,f16}(c, a, b, m, n, k, lda, ldb, ldc, batch, stride_a,
//   stride_b, stride_c): batch products C_i = A_i·B_i (as _nt / _nn) in the input type, matrix i
//   of each starting stride_* elements after matrix i - 1 (a stride of 0 shares one matrix, a
//   weight say, among all the products); the grid's z counts the batch.
// Launch: the contracts in manifests/gemm.toml (grid x over n, y over m, z as GridZ says).
//
// A program on the tile layer: hk/tile/k_loop.h walks K (copies, stages, the split-K share)
// and, on sm_90a, hk/tile/pipeline.h (wgmma, producer and consumer warpgroups); this file
// chooses the blocks and writes what C receives. The README's benchmark section says why these
// tilings.
#include "hk/hk.h"
#include "hk/tile/pipeline.h"
#include "hk/tile/tile.h"

namespace {

using hk::tile::BatchStrides;
using hk::tile::BLayout;
using hk::tile::GeluTanhGate;
using hk::tile::GridZ;
using hk::tile::Plain;
using hk::tile::SiluGate;
using hk::tile::Tiling;

// 128 x 128 blocks, four waves of 64 x 64, 32 deep: NVIDIA in 4 stages of dynamic shared
// memory (manifests/gemm.toml's `shared`); AMD in 2 of static LDS, so that two blocks fit a CU.
// gfx950's LDS (160 KiB) holds two blocks of 64-deep stages: two of its 32-deep MFMAs a step.
#if defined(__gfx950__)
using Square = Tiling<128, 128, 64, 2, 2, 2>;
#else
using Square = Tiling<128, 128, 32, 2, 2, 4, true>;
#endif
// Decode (split K): four waves of 16 x 16 side by side, 128 deep (AMD 64, for two blocks' LDS).
// On sm_90a its stages are dynamic, as the kernels' wgmma program's are (static ones would add
// to the program's).
using Skinny = Tiling<16, 64, HK_AMD ? 64 : 128, 1, 4, 2, HK_SM90A>;
// The gated GEMM's two products: four waves of 64 x 32 each.
using GatedTiling = Tiling<128, 64, 32, 2, 2, 3>;

#if HK_NVIDIA
static_assert(Square::kStages * sizeof(hk::tile::MmaStage<Square, hk::bf16, BLayout::kNK, 1>) ==
                      65536 &&
                  Square::kStages *
                          sizeof(hk::tile::MmaStage<Square, hk::bf16, BLayout::kKN, 1>) ==
                      65536,
              "Square's stages no longer match the `shared` of manifests/gemm.toml's contract");
#endif

template <class Tl, typename T, typename Out, BLayout kB, bool kBias, GridZ kZ,
          class Combine = Plain>
HK_DEVICE void gemm(Out* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                    const T* __restrict__ bias, unsigned m, unsigned n, unsigned k, unsigned lda,
                    unsigned ldb, unsigned ldc, BatchStrides strides = {},
                    const T* __restrict__ b_up = nullptr) {
  constexpr unsigned kProducts = Combine::kProducts;
  static_assert(kProducts == 1 || (!kBias && kZ == GridZ::kNone), "gated: no bias, no grid z");
  if constexpr (kZ == GridZ::kBatch) {
    const unsigned long long i = hk::block_idx_z();
    a += i * strides.a;
    b += i * strides.b;
    c += i * strides.c;
  }
  const hk::tile::KRange range = hk::tile::k_range<kZ>((k + Tl::kTileK - 1) / Tl::kTileK);
  if (range.idle) return;
  const T* const bs[2] = {b, b_up};
  const hk::tile::MmaBlock<Tl, T, kB, kProducts> block(a, bs, m, n, k, lda, ldb);
  const unsigned row0 = block.row0 + block.wave_row, col0 = block.col0 + block.wave_col;

  // The sums start from the bias (for split K, in the first split only): loaded here, where
  // few registers are live, rather than next to the stores, where all the accumulators are.
  using Acc = hk::tile::Accumulators<T, Tl::kWaveRows / 16, Tl::kWaveCols / 16>;
  Acc acc[kProducts];
  if (kBias && (kZ != GridZ::kSplitK || hk::block_idx_z() == 0)) {
    acc[0].set([&](unsigned, unsigned col) HK_INLINE {
      return col0 + col < n ? hk::to_float(bias[col0 + col]) : 0.0f;
    });
  } else {
    acc[0].zero();
  }
  if constexpr (kProducts == 2) acc[1].zero();

  hk::tile::k_loop(block, range, [&](const auto& stage, unsigned)
                       HK_INLINE { hk::tile::mma_stage(acc, stage, block); });

  // C = the sum (+ bias) in C's type, or for split K C += it with f32 atomics.
  const auto put = [&](unsigned r, unsigned col, float v) HK_INLINE {
    const unsigned row = row0 + r, column = col0 + col;
    if (row < m && column < n) {
      Out* to = c + static_cast<unsigned long long>(row) * ldc + column;
      if constexpr (kZ == GridZ::kSplitK)
        hk::atomic_add(to, v);
      else
        *to = hk::from_float<Out>(v);
    }
  };
  hk::tile::for_each_result<Combine>(acc, put);
}

#if HK_SM90A
// sm_90a, B stored [N][K]: a wgmma program over hk/tile/pipeline.h. Blocks of 128 x 256 of C
// (wide) or, when those would leave most of the GPU idle (the contract decides, and the kernel
// reads its choice off the grid), 128 x 128 (narrow); K in steps of 64 (a tile row is one
// 128-byte swizzled row). A producer warpgroup copies, two consumer warpgroups multiply 64 rows
// each (128 or 64 f32 sums a thread); wide blocks in 4 stages, narrow ones in 6. Split K (the
// grid's z, narrow blocks) adds each split's sums to an f32 C with atomics.
template <typename T, typename Out, bool kBias, unsigned kTileN, unsigned kStages,
          bool kAdd = false>
struct WgmmaGemm : hk::tile::WgmmaNt<T, 128, kTileN, kStages> {
  Out* c;
  unsigned m, n, ldc;

  // The sums start from the bias (split K: in the first split only), or zero.
  HK_DEVICE void start(const T* __restrict__ bias) {
    const bool add_bias = kBias && (!kAdd || hk::block_idx_z() == 0);
#pragma unroll
    for (unsigned v = 0; v < kTileN / 2; ++v) {
      const unsigned column = this->col0 + hk::tile::wgmma::Layout::col(v);
      this->acc[v] = add_bias && column < n ? hk::to_float(bias[column]) : 0.0f;
    }
  }

  HK_DEVICE void finish(unsigned consumer) {
    hk::tile::wgmma::pin(this->acc);
    if constexpr (kAdd) {
      this->for_each_pair(consumer, [&](unsigned row, unsigned column, unsigned v) HK_INLINE {
        if (row >= m) return;
        Out* to = c + static_cast<unsigned long long>(row) * ldc + column;
        if (column < n) hk::atomic_add(to, this->acc[v]);
        if (column + 1 < n) hk::atomic_add(to + 1, this->acc[v + 1]);
      });
    } else {
      hk::tile::store_pairs(c, m, n, ldc, *this, consumer,
                            [&](unsigned v, unsigned, unsigned) HK_INLINE { return this->acc[v]; });
    }
  }
};
template <typename T, typename Out, bool kBias> using WideGemm = WgmmaGemm<T, Out, kBias, 256, 4>;
template <typename T, typename Out, bool kBias, bool kAdd = false>
using NarrowGemm = WgmmaGemm<T, Out, kBias, 128, 6, kAdd>;
constexpr unsigned kWgmmaThreads = WideGemm<hk::bf16, hk::bf16, false>::kThreads;

// The contracts (manifests/gemm.toml) give the _nt kernels this much dynamic shared memory on
// sm_90a, enough for either ring.
static_assert(WideGemm<hk::bf16, hk::bf16, false>::Ring::kSharedBytes == 197696 &&
                  NarrowGemm<hk::f16, float, true>::Ring::kSharedBytes == 197728 &&
                  NarrowGemm<hk::bf16, hk::bf16, false>::kThreads == kWgmmaThreads,
              "the wgmma rings no longer match the `shared` of manifests/gemm.toml's contracts");
static_assert(Skinny::kDynamic && Skinny::kStages * sizeof(hk::tile::MmaStage<Skinny, hk::bf16,
                                                                               BLayout::kNK, 1>) ==
                                      40960,
              "Skinny's stages no longer match the sm_90a `shared` of the split-K contracts");

template <class Program, GridZ kZ, typename T, typename Out>
HK_DEVICE void run_wgmma(Out* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                         const T* __restrict__ bias, unsigned m, unsigned n, unsigned k,
                         unsigned lda, unsigned ldb, unsigned ldc) {
  const hk::tile::KRange range = hk::tile::k_range<kZ>(Program::steps(k));
  if (range.idle) return;
  // The block's K range as views of A and B from its first step on.
  const unsigned k0 = range.first * Program::kTileK;
  const hk::tile::BlockTile tile = hk::tile::block_tile();
  Program p{{{a + k0, m, k - k0, lda},
             {b + k0, n, k - k0, ldb},
             tile.m * Program::kTileM,
             tile.n * Program::kTileN},
            c,
            m,
            n,
            ldc};
  if (hk::thread_idx_x() >= hk::tile::kWarpgroupThreads) p.start(bias);
  hk::tile::run_pipeline<typename Program::Ring>(p, range.last - range.first);
}

template <typename T, typename Out, bool kBias, GridZ kZ>
HK_DEVICE void gemm_wgmma(Out* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                          const T* __restrict__ bias, unsigned m, unsigned n, unsigned k,
                          unsigned lda, unsigned ldb, unsigned ldc, BatchStrides strides = {}) {
  if constexpr (kZ == GridZ::kBatch) {
    const unsigned long long i = hk::block_idx_z();
    a += i * strides.a;
    b += i * strides.b;
    c += i * strides.c;
  }
  // Split K takes narrow blocks; otherwise more column blocks than 256-wide ones would need
  // say the contract chose them.
  constexpr bool kSplit = kZ == GridZ::kSplitK;
  if (kSplit || hk::grid_dim_x() > (n + 255) / 256)
    run_wgmma<NarrowGemm<T, Out, kBias, kSplit>, kZ>(c, a, b, bias, m, n, k, lda, ldb, ldc);
  else if constexpr (!kSplit)
    run_wgmma<WideGemm<T, Out, kBias>, kZ>(c, a, b, bias, m, n, k, lda, ldb, ldc);
}
#endif

// The split-K kernels' program: Skinny's, or on sm_90a, when the contract gives the block the
// wgmma program's threads (m past 16), that program's narrow blocks.
template <typename T, bool kBias>
HK_DEVICE void split_k(float* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                       const T* __restrict__ bias, unsigned m, unsigned n, unsigned k,
                       unsigned lda, unsigned ldb, unsigned ldc) {
#if HK_SM90A
  if (hk::block_dim_x() == kWgmmaThreads) {
    gemm_wgmma<T, float, kBias, GridZ::kSplitK>(c, a, b, bias, m, n, k, lda, ldb, ldc);
    return;
  }
#endif
  gemm<Skinny, T, float, BLayout::kNK, kBias, GridZ::kSplitK>(c, a, b, bias, m, n, k, lda, ldb,
                                                              ldc);
}

// The 128 x 128 kernels' program: Square's, or on sm_90a with B stored [N][K] the wgmma program.
template <typename T, typename Out, BLayout kB, bool kBias, GridZ kZ>
HK_DEVICE void square(Out* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                      const T* __restrict__ bias, unsigned m, unsigned n, unsigned k,
                      unsigned lda, unsigned ldb, unsigned ldc, BatchStrides strides = {}) {
#if HK_SM90A
  if constexpr (kB == BLayout::kNK)
    gemm_wgmma<T, Out, kBias, kZ>(c, a, b, bias, m, n, k, lda, ldb, ldc, strides);
  else
#endif
    gemm<Square, T, Out, kB, kBias, kZ>(c, a, b, bias, m, n, k, lda, ldb, ldc, strides);
}

}  // namespace

// Two blocks per SM / CU at least: on NVIDIA that caps a Square thread at 255 registers, enough
// for its 128 accumulators and the operand fragments without spilling. sm_90a's wgmma program
// takes a whole SM (its consumers need 232 registers a thread, and its ring 193 KiB).
#if HK_SM90A
#define HK_SQUARE_BOUNDS(kB)                                                               \
  HK_LAUNCH_BOUNDS_MIN_BLOCKS(kB == BLayout::kNK ? kWgmmaThreads : Square::kThreads, \
                              kB == BLayout::kNK ? 1 : 2)
#define HK_SPLITK_BOUNDS HK_LAUNCH_BOUNDS_MIN_BLOCKS(kWgmmaThreads, 1)
#else
#define HK_SQUARE_BOUNDS(kB) HK_LAUNCH_BOUNDS_MIN_BLOCKS(Square::kThreads, 2)
#define HK_SPLITK_BOUNDS HK_LAUNCH_BOUNDS_MIN_BLOCKS(Skinny::kThreads, 2)
#endif
#define HK_GEMM_PARAMS(Out, T) Out *c, const T *a, const T *b
#define HK_GEMM_SIZES unsigned m, unsigned n, unsigned k, unsigned lda, unsigned ldb, unsigned ldc

#define HK_GEMM(layout, kB, name, T, out_suffix, Out)                                      \
  HK_KERNEL HK_SQUARE_BOUNDS(kB) void gemm_a16w16_##layout##_##name##out_suffix(            \
      HK_GEMM_PARAMS(Out, T), HK_GEMM_SIZES) {                                             \
    square<T, Out, kB, false, GridZ::kNone>(c, a, b, nullptr, m, n, k, lda, ldb, ldc);     \
  }                                                                                        \
  HK_KERNEL HK_SQUARE_BOUNDS(kB) void gemm_a16w16_##layout##_##name##_bias##out_suffix(     \
      HK_GEMM_PARAMS(Out, T), const T* bias, HK_GEMM_SIZES) {                              \
    square<T, Out, kB, true, GridZ::kNone>(c, a, b, bias, m, n, k, lda, ldb, ldc);         \
  }
#define HK_GEMM_ALL(layout, kB)                        \
  HK_GEMM(layout, kB, bf16, hk::bf16, , hk::bf16)      \
  HK_GEMM(layout, kB, bf16, hk::bf16, _out_f32, float) \
  HK_GEMM(layout, kB, f16, hk::f16, , hk::f16)         \
  HK_GEMM(layout, kB, f16, hk::f16, _out_f32, float)
HK_GEMM_ALL(nt, BLayout::kNK)
HK_GEMM_ALL(nn, BLayout::kKN)

#define HK_GEMM_SPLITK(name, T)                                                              \
  HK_KERNEL HK_SPLITK_BOUNDS void gemm_a16w16_splitk_nt_##name(HK_GEMM_PARAMS(float, T),      \
                                                               HK_GEMM_SIZES) {               \
    split_k<T, false>(c, a, b, nullptr, m, n, k, lda, ldb, ldc);                              \
  }                                                                                           \
  HK_KERNEL HK_SPLITK_BOUNDS void gemm_a16w16_splitk_nt_##name##_bias(                        \
      HK_GEMM_PARAMS(float, T), const T* bias, HK_GEMM_SIZES) {                               \
    split_k<T, true>(c, a, b, bias, m, n, k, lda, ldb, ldc);                                  \
  }
HK_GEMM_SPLITK(bf16, hk::bf16)
HK_GEMM_SPLITK(f16, hk::f16)

#define HK_BATCHED_GEMM(layout, kB, name, T)                                                 \
  HK_KERNEL HK_SQUARE_BOUNDS(kB) void                                                        \
      batched_gemm_a16w16_##layout##_##name(HK_GEMM_PARAMS(T, T), HK_GEMM_SIZES,             \
                                            unsigned batch, unsigned long long stride_a,     \
                                            unsigned long long stride_b,                     \
                                            unsigned long long stride_c) {                   \
    (void)batch; /* the grid's z */                                                          \
    square<T, T, kB, false, GridZ::kBatch>(c, a, b, nullptr, m, n, k, lda, ldb, ldc,         \
                                           {stride_a, stride_b, stride_c});                  \
  }
HK_BATCHED_GEMM(nt, BLayout::kNK, bf16, hk::bf16)
HK_BATCHED_GEMM(nt, BLayout::kNK, f16, hk::f16)
HK_BATCHED_GEMM(nn, BLayout::kKN, bf16, hk::bf16)
HK_BATCHED_GEMM(nn, BLayout::kKN, f16, hk::f16)

#define HK_GATED_GEMM(act, Combine, name, T)                                                 \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(GatedTiling::kThreads, 2) void                       \
      gemm_a16w16_gated_##act##_##name(T* c, const T* a, const T* w_gate, const T* w_up,     \
                                       HK_GEMM_SIZES) {                                      \
    gemm<GatedTiling, T, T, BLayout::kNK, false, GridZ::kNone, Combine>(                     \
        c, a, w_gate, nullptr, m, n, k, lda, ldb, ldc, {}, w_up);                            \
  }
HK_GATED_GEMM(silu, SiluGate, bf16, hk::bf16)
HK_GATED_GEMM(silu, SiluGate, f16, hk::f16)
HK_GATED_GEMM(gelu_tanh, GeluTanhGate, bf16, hk::bf16)
HK_GATED_GEMM(gelu_tanh, GeluTanhGate, f16, hk::f16)
