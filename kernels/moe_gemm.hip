// Grouped (mixture-of-experts) GEMMs of 16-bit matrices (bf16 or f16), f32 accumulation, over
// the routing's sorted layout, and the combine that sums each token's choices.
//
// The layout (what moe_align_block_size writes, with block_m = 128 for the plain kernels and 16
// for the _m16 ones): a choice is a flat index f = t * topk + j (token t's j-th expert),
// choices = tokens * topk.
//   sorted_token_ids  i32 [padded_max]: the choices grouped by local expert, each expert's
//                     segment padded to a multiple of block_m with the sentinel `choices`;
//                     padded_max = choices + experts * (block_m - 1).
//   expert_ids        i32 [ceil(padded_max / block_m)]: the local expert of each block of
//                     block_m sorted rows, -1 past the padded count.
//   num_tokens_post_pad  i32 [1]: the padded count (read on the device: no host round trip).
// Every kernel is launched with the grid of padded_max, which the host knows from the sizes
// alone, and its blocks past the padded count (or of expert -1) return at once: one fixed
// launch for any routing, which a CUDA graph can capture (the fixed-shape, "masked", form for
// decode). The kernels never trust the layout's contents with memory: a padded count past
// padded_max counts as padded_max, an expert outside [0, experts) skips its block, and a
// sorted id outside [0, choices) is a sentinel.
//
// moe_gemm_gated_silu_{bf16,f16}(h, x, w13, sorted_token_ids, expert_ids, num_tokens_post_pad,
//                                tokens, topk, experts, n, k, lda, ldc)
//   Stage 1: h[f] = silu(x[t]·W_gate[e]ᵀ) ⊙ (x[t]·W_up[e]ᵀ), for every choice f = t * topk + j
//   of expert e: x [tokens][k] (rows lda apart), w13 [experts][2n][k] (each expert's fused gate
//   rows 0 .. n-1, then its up rows n .. 2n-1), h [choices][n] (rows ldc apart). Blocks of
//   128 x 64 of h, the dense gated GEMM's (kernels/gemm.hip).
// moe_gemm_down_{bf16,f16}(out, h, w2, topk_weights, sorted_token_ids, expert_ids,
//                          num_tokens_post_pad, tokens, topk, experts, n, k, lda, ldc)
//   Stage 2: out[f] = topk_weights[f] · (h[f]·W_down[e]ᵀ), h [choices][k] (rows lda apart),
//   w2 [experts][n][k], topk_weights f32 [choices], out [choices][n] (rows ldc apart); the
//   weight multiplies the f32 sum, which is rounded once. Blocks of 128 x 128, the dense GEMM's.
// moe_gemm_gated_silu_m16_{bf16,f16}, moe_gemm_down_m16_{bf16,f16}: the same two stages, same
//   arguments, over the layout of block_m = 16, for decode and small batches (an expert's few
//   rows fill a block of 16, not 128, so a block multiplies few padding rows): blocks of 16 rows
//   x 128 weight rows a step (16 x 64 of h, of two products; 16 x 128 of out), the four waves
//   side by side along n, as the dense split-K GEMM's Skinny blocks, so that a block streams a
//   wide slab of one expert's weights (decode is bound by reading them).
// moe_sum_{bf16,f16}(y, out, topk_ids, expert_map, tokens, topk, experts, n, ldo, ldy)
//   The combine: y[t] = Σ_j out[t * topk + j] over token t's choices of a local expert, in f32,
//   rounded once; topk_ids i32 [tokens][topk] are the routing's experts (0 .. experts - 1) and
//   expert_map i32 [experts] maps each to its local index, or -1 where this rank does not hold
//   it (expert parallelism; the identity without it). out rows ldo apart, y rows ldy apart.
//
// Rows the GEMMs do not write: a choice of an expert that is not local never reaches the
// sorted layout (the alignment drops it), so neither h nor out gets its row; the combine skips
// those choices by the same expert_map rather than reading their rows, so nothing has to be
// zeroed first, and a token with no local choice gets y = 0 (what an all-reduce over the ranks
// adds). Sentinel rows are computed (a block's shape is fixed) and never stored.
//
// A program on the tile layer: hk/tile/k_loop.h walks K with A's rows gathered through an
// index in shared memory (hk/tile/copy.h's GatheredRows); this file finds each block's expert
// and rows and writes what each choice receives. Launch: manifests/moe_gemm.toml.
#include "hk/hk.h"
#include "hk/tile/tile.h"

namespace {

using hk::tile::BLayout;
using hk::tile::Plain;
using hk::tile::SiluGate;
using hk::tile::Tiling;

// The block of sorted rows (block_m) is the tiling's kTileM: one program for both forms.
// The dense GEMM's tilings (kernels/gemm.hip: the gated GEMM's for stage 1, Square for stage 2),
// so that a grouped GEMM compares with the dense GEMM of the same total shape. Their stages are
// dynamic on NVIDIA, as the row map beside them is (see RowMap).
using UpTiling = Tiling<128, 64, 32, 2, 2, 3, true>;
#if defined(__gfx950__)
using DownTiling = Tiling<128, 128, 64, 2, 2, 2>;
#else
using DownTiling = Tiling<128, 128, 32, 2, 2, 4, true>;
#endif
// Decode (block_m 16): 16-row blocks, the smallest MMA tile on both vendors, four waves side by
// side along n, each step 128 weight rows (stage 1: 64 columns of two products; stage 2: 128
// columns). Steps 128 deep on NVIDIA (two dynamic stages of 36 KiB: a step's 32 KiB of weights
// in flight while the last one multiplies, as Skinny's deep step, for memory-level
// parallelism); 32 on AMD, whose register-staged copies hold a step's tiles in registers and
// whose 64 KiB of LDS (gfx90a, gfx942) then holds three blocks of two 9 KiB stages.
constexpr unsigned kDecodeK = HK_AMD ? 32 : 128;
using UpTilingM16 = Tiling<16, 64, kDecodeK, 1, 4, 2, true>;
using DownTilingM16 = Tiling<16, 128, kDecodeK, 1, 4, 2, true>;

// A sorted row that is no choice (a sentinel).
constexpr unsigned kNoChoice = ~0u;

// Where each of a block's kBlockM rows comes from and goes: the A row it gathers (a sentinel
// gathers row 0, computed and never stored) and the choice it writes, or kNoChoice.
template <unsigned kBlockM> struct RowMap {
  unsigned a[kBlockM];
  unsigned choice[kBlockM];
};

template <class Tl, typename T, class Combine>
using MoeStage = hk::tile::MmaStage<Tl, T, BLayout::kNK, Combine::kProducts>;

#if HK_NVIDIA
// The contracts' `shared` on NVIDIA (manifests/moe_gemm.toml): the stages and the row map.
template <class Tl, class Combine> constexpr unsigned long long shared_bytes() {
  return Tl::kStages * sizeof(MoeStage<Tl, hk::bf16, Combine>) + sizeof(RowMap<Tl::kTileM>);
}
static_assert(shared_bytes<UpTiling, SiluGate>() == 50176,
              "stage 1's shared memory no longer matches manifests/moe_gemm.toml's contract");
static_assert(shared_bytes<DownTiling, Plain>() == 66560,
              "stage 2's shared memory no longer matches manifests/moe_gemm.toml's contract");
static_assert(shared_bytes<UpTilingM16, SiluGate>() == 73856 &&
                  shared_bytes<DownTilingM16, Plain>() == 73856,
              "the _m16 kernels' shared memory no longer matches manifests/moe_gemm.toml's");
#endif

// One block of a grouped GEMM: C rows are sorted rows, A rows gathered from a (one row a
// token for stage 1, kPerToken; one a choice for stage 2), B = the products of expert e's
// weights (w: [experts][kProducts * n][k]), C as Combine says, times the choice's routing
// weight where kWeighted.
template <class Tl, typename T, class Combine, bool kPerToken, bool kWeighted>
HK_DEVICE void moe_gemm(T* __restrict__ c, const T* __restrict__ a, const T* __restrict__ w,
                        const float* __restrict__ topk_weights,
                        const int* __restrict__ sorted_token_ids,
                        const int* __restrict__ expert_ids,
                        const int* __restrict__ num_tokens_post_pad, unsigned tokens,
                        unsigned topk, unsigned experts, unsigned n, unsigned k, unsigned lda,
                        unsigned ldc) {
  constexpr unsigned kProducts = Combine::kProducts;
  // A block of C is a block of the sorted layout.
  constexpr unsigned kBlockM = Tl::kTileM;
  const unsigned choices = tokens * topk;
  const unsigned padded_max = choices + experts * (kBlockM - 1);
  const hk::tile::BlockTile tile = hk::tile::block_tile();
  const unsigned row0 = tile.m * kBlockM;
  // Uniform over the block, so a block returns whole, before any barrier.
  const unsigned post_pad = static_cast<unsigned>(*num_tokens_post_pad);
  const unsigned padded = post_pad < padded_max ? post_pad : padded_max;
  if (row0 >= padded) return;
  const int expert = expert_ids[tile.m];
  if (expert < 0 || static_cast<unsigned>(expert) >= experts) return;

  using Stage = MoeStage<Tl, T, Combine>;
  RowMap<kBlockM>& map =
      *hk::tile::beside_stages<RowMap<kBlockM>, Stage, Tl::kStages, Tl::kDynamic>();
  for (unsigned r = hk::thread_idx_x(); r < kBlockM; r += Tl::kThreads) {
    const int id = row0 + r < padded ? sorted_token_ids[row0 + r] : -1;
    const bool real = id >= 0 && static_cast<unsigned>(id) < choices;
    const unsigned choice = static_cast<unsigned>(id);
    map.choice[r] = real ? choice : kNoChoice;
    map.a[r] = real ? (kPerToken ? choice / topk : choice) : 0;
  }
  hk::block_sync();

  const unsigned long long expert_size = static_cast<unsigned long long>(kProducts) * n * k;
  const T* const b0 = w + static_cast<unsigned>(expert) * expert_size;
  const T* const bs[2] = {b0, b0 + static_cast<unsigned long long>(n) * k};
  const unsigned a_rows = kPerToken ? tokens : choices;
  const hk::tile::GatheredRows<T> gathered{a, map.a, row0, row0 + kBlockM, k, lda, a_rows};
  const hk::tile::MmaBlock<Tl, T, BLayout::kNK, kProducts, T, hk::tile::GatheredRows<T>> block(
      gathered, bs, n, k, k);

  using Acc = hk::tile::Accumulators<T, Tl::kWaveRows / 16, Tl::kWaveCols / 16>;
  Acc acc[kProducts];
#pragma unroll
  for (unsigned p = 0; p < kProducts; ++p) acc[p].zero();
  hk::tile::k_loop(block, {0, (k + Tl::kTileK - 1) / Tl::kTileK, false},
                   [&](const Stage& stage, unsigned)
                       HK_INLINE { hk::tile::mma_stage(acc, stage, block); });

  // Each choice's row of C; sentinel rows and columns past n are not stored.
  hk::tile::for_each_result<Combine>(acc, [&](unsigned r, unsigned col, float v) HK_INLINE {
    const unsigned choice = map.choice[block.wave_row + r];
    const unsigned column = block.col0 + block.wave_col + col;
    if (choice == kNoChoice || column >= n) return;
    if constexpr (kWeighted) v *= topk_weights[choice];
    c[static_cast<unsigned long long>(choice) * ldc + column] = hk::from_float<T>(v);
  });
}

// The combine's blocks: kSumThreads threads of kSumColumns columns of a token's row each (one
// 16-byte load a choice where the rows allow it: with one 2-byte column a thread, the loads were
// too small and too few in flight to get near the memory's rate), the grid's y over the row's
// columns (so that a decode step's few tokens still fill the GPU), x striding over the tokens.
constexpr unsigned kSumThreads = 256;
constexpr unsigned kSumColumns = 8;

template <typename T>
HK_DEVICE void moe_sum(T* __restrict__ y, const T* __restrict__ out,
                       const int* __restrict__ topk_ids, const int* __restrict__ expert_map,
                       unsigned tokens, unsigned topk, unsigned experts, unsigned n,
                       unsigned ldo, unsigned ldy) {
  static_assert(kSumColumns == hk::kVec16<T>, "a thread's columns are one 16-byte vector");
  const unsigned col = (hk::block_idx_y() * kSumThreads + hk::thread_idx_x()) * kSumColumns;
  if (col >= n) return;
  // Whole vectors: every row starts 16-byte aligned, and the thread's columns lie within n.
  const bool vectors = hk::aligned16(y, out) && ldo % kSumColumns == 0 &&
                       ldy % kSumColumns == 0 && col + kSumColumns <= n;
  const unsigned width = n - col < kSumColumns ? n - col : kSumColumns;
  for (unsigned t = hk::block_idx_x(); t < tokens; t += hk::grid_dim_x()) {
    // Which of the token's choices are local (the contract keeps topk within the mask).
    unsigned long long local = 0;
    for (unsigned j = 0; j < topk; ++j) {
      const int id = topk_ids[static_cast<unsigned long long>(t) * topk + j];
      if (id >= 0 && static_cast<unsigned>(id) < experts && expert_map[id] >= 0)
        local |= 1ull << j;
    }
    const T* rows = out + static_cast<unsigned long long>(t) * topk * ldo + col;
    float sum[kSumColumns] = {};
    for (unsigned j = 0; j < topk; ++j) {
      if (!((local >> j) & 1)) continue;
      const T* row = rows + static_cast<unsigned long long>(j) * ldo;
      if (vectors) {
        const hk::Vec16<T> v = hk::load16(row);
#pragma unroll
        for (unsigned e = 0; e < kSumColumns; ++e) sum[e] += hk::to_float(v.elem[e]);
      } else {
        for (unsigned e = 0; e < width; ++e) sum[e] += hk::to_float(row[e]);
      }
    }
    T* dst = y + static_cast<unsigned long long>(t) * ldy + col;
    if (vectors) {
      hk::Vec16<T> v;
#pragma unroll
      for (unsigned e = 0; e < kSumColumns; ++e) v.elem[e] = hk::from_float<T>(sum[e]);
      hk::store16(dst, v);
    } else {
      for (unsigned e = 0; e < width; ++e) dst[e] = hk::from_float<T>(sum[e]);
    }
  }
}

}  // namespace

#define HK_MOE_SORTED \
  const int *sorted_token_ids, const int *expert_ids, const int *num_tokens_post_pad
#define HK_MOE_SIZES                                                                         \
  unsigned tokens, unsigned topk, unsigned experts, unsigned n, unsigned k, unsigned lda, \
      unsigned ldc

// Stage 1 and stage 2 in tiling Up and Down, as kernels named with `form` (empty, or _m16).
#define HK_MOE_STAGES(form, name, T, Up, Down)                                                \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(Up::kThreads, 2) void                                 \
      moe_gemm_gated_silu##form##_##name(T* h, const T* x, const T* w13, HK_MOE_SORTED,      \
                                         HK_MOE_SIZES) {                                     \
    moe_gemm<Up, T, SiluGate, true, false>(h, x, w13, nullptr, sorted_token_ids, expert_ids, \
                                           num_tokens_post_pad, tokens, topk, experts, n, k, \
                                           lda, ldc);                                        \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(Down::kThreads, 2) void moe_gemm_down##form##_##name( \
      T* out, const T* h, const T* w2, const float* topk_weights, HK_MOE_SORTED,             \
      HK_MOE_SIZES) {                                                                        \
    moe_gemm<Down, T, Plain, false, true>(out, h, w2, topk_weights, sorted_token_ids,        \
                                          expert_ids, num_tokens_post_pad, tokens, topk,     \
                                          experts, n, k, lda, ldc);                          \
  }
#define HK_MOE_GEMM(name, T)                                                                  \
  HK_MOE_STAGES(, name, T, UpTiling, DownTiling)                                              \
  HK_MOE_STAGES(_m16, name, T, UpTilingM16, DownTilingM16)                                    \
  HK_KERNEL HK_LAUNCH_BOUNDS(kSumThreads) void moe_sum_##name(                                \
      T* y, const T* out, const int* topk_ids, const int* expert_map, unsigned tokens,       \
      unsigned topk, unsigned experts, unsigned n, unsigned ldo, unsigned ldy) {             \
    moe_sum(y, out, topk_ids, expert_map, tokens, topk, experts, n, ldo, ldy);               \
  }
HK_MOE_GEMM(bf16, hk::bf16)
HK_MOE_GEMM(f16, hk::f16)
