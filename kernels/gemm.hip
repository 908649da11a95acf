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
//   C += A·Bᵀ (+ bias[n]) into an f32 C, for decode (m up to about 64, k large): blocks of
//   16 x 64, and K split across the grid's z blocks, which add their parts with f32 atomics
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
// Launch: the contracts in manifests/gemm.toml (four waves a block, grid x over n, y over m).
//
// Each block multiplies its block of C by walking its K range in steps of kTileK: the A and B
// blocks of a step are copied into shared tiles (zero-filled past the matrices' edges, so every
// M, N, K is handled, partial blocks as padded ones), and each wave multiplies its part with
// hk::tile::mma. The copies of later steps run while the current one multiplies: NVIDIA keeps
// kStages - 1 steps in flight with cp.async when rows are 16-byte aligned; other cases (and
// AMD, which has no asynchronous 16-byte copy into LDS before gfx950) stage the next step in
// registers. Unaligned rows (k or ld not a multiple of 8, or an unaligned pointer) are read
// element by element: correct, slower.
#include "hk/hk.h"
#include "hk/tile/tile.h"
#include "hk/tile/pipeline.h"

namespace {

using hk::tile::BLayout;

// A block's shape: a kTileM x kTileN block of C, kWavesM x kWavesN waves of kWaveRows x
// kWaveCols each, K in steps of kTileK, kStages shared stages.
template <unsigned kTileM_, unsigned kTileN_, unsigned kTileK_, unsigned kWavesM_,
          unsigned kWavesN_, unsigned kNvidiaStages, bool kNvidiaDynamic = false>
struct Tiling {
  static constexpr unsigned kTileM = kTileM_, kTileN = kTileN_, kTileK = kTileK_;
  static constexpr unsigned kWavesM = kWavesM_, kWavesN = kWavesN_;
  static constexpr unsigned kThreads = kWavesM * kWavesN * hk::kWaveSize;
  static constexpr unsigned kWaveRows = kTileM / kWavesM, kWaveCols = kTileN / kWavesN;
  // NVIDIA: cp.async stages, in static shared memory (48 KiB at most) or, when kDynamic, in
  // the launch's dynamic shared memory (the contract's `shared` gives its size). AMD
  // double-buffers through registers.
#if HK_AMD
  static constexpr unsigned kStages = 2;
  static constexpr bool kDynamic = false;
#else
  static constexpr unsigned kStages = kNvidiaStages;
  static constexpr bool kDynamic = kNvidiaDynamic;
#endif
};

// Four waves of 64 x 64 (64 f32 accumulators a lane on AMD, 128 on NVIDIA), 32 deep. NVIDIA:
// 4 stages of 16 KiB in dynamic shared memory (manifests/gemm.toml's `shared`). TF/s on the
// H100 (bf16, nt; at 4096^3, 8192^3, 2048x14336x4096, 8192x4096x14336, 2048x28672x8192,
// 8192x6144x4096): 349, 327, 359, 378, 355, 356. In the same runs: 3 static stages (the
// previous choice) 300-364; 5 stages 303-356; 64 deep in 3 stages 329-372 (but 255 registers:
// the bias variants spill); 64 deep in 4 stages, one block an SM, 286-322; eight warps of
// 64 x 64 as 128 x 256 or 256 x 128 blocks, 32 deep in 4 stages or 64 deep in 3, 259-352.
// Every shape lands near 350: the limit is mma.sync itself (register operands only, no
// memory, it peaks at 571-647 TF/s on that H100; cuBLAS's wgmma reaches 747-824). AMD (not
// measured) keeps 2 stages of static LDS, so that two blocks fit a CU's 64 KiB.
#if HK_AMD
using Square = Tiling<128, 128, 32, 2, 2, 2>;
#else
using Square = Tiling<128, 128, 32, 2, 2, 4, true>;
#endif
// Four waves of 16 x 16 side by side, 128 deep: little work is wasted on rows past a small m,
// and each row of B is read 256 bytes at a time. On the H100, against 16 x 128 x 32 in 5
// stages, 16 x 128 x 64 in 2, 16 x 64 x 32 in 8, 16 x 64 x 64 in 4, 32 x 128 x 32 in 4 and
// 32 x 64 x 64 in 3 (eight split-K decode shapes of Llama-3, m = 1 to 64, each at its best
// split): the fastest on seven and within 10% on the eighth; m = 1, n = k = 4096 in 14.6 µs
// against 19.1 for 16 x 128 x 32. AMD (not measured: no AMD GPU
// here) takes it 64 deep, so that two blocks' LDS (2 stages of 10 KiB each) fit a CU's 64 KiB.
#if HK_AMD
using Skinny = Tiling<16, 64, 64, 1, 4, 2>;
#else
using Skinny = Tiling<16, 64, 128, 1, 4, 2>;
#endif
// The gated GEMM's two products: four waves of 64 x 32 each (NVIDIA: 2 x 64 accumulators a
// lane, as many as Square's one product), B blocks of 64 rows for each weight.
using GatedTiling = Tiling<128, 64, 32, 2, 2, 3>;

// One step's A and B blocks in shared memory (B as stored; kProducts of them for a gated
// GEMM, which multiplies A by two matrices).
template <class Tl, typename T, BLayout kB, unsigned kProducts> struct Stage {
  using BTile = hk::tile::SharedTile<T, kB == BLayout::kNK ? Tl::kTileN : Tl::kTileK,
                                     kB == BLayout::kNK ? Tl::kTileK : Tl::kTileN>;
  hk::tile::SharedTile<T, Tl::kTileM, Tl::kTileK> a;
  BTile b[kProducts];
};

#if HK_NVIDIA
// The contract (manifests/gemm.toml) gives Square's kernels this much dynamic shared memory.
static_assert(Square::kDynamic &&
                  Square::kStages * sizeof(Stage<Square, hk::bf16, BLayout::kNK, 1>) == 65536 &&
                  Square::kStages * sizeof(Stage<Square, hk::bf16, BLayout::kKN, 1>) == 65536,
              "Square's stages no longer match the `shared` of manifests/gemm.toml's contract");
#endif

// What the grid's z blocks do: nothing (z = 1), split K, or take one product of a batch each.
enum class GridZ { kNone, kSplitK, kBatch };

// How C receives the block's sums.
enum class Epilogue {
  kStore,      // C = sum (+ bias), rounded to C's type
  kAtomicAdd,  // C += sum (+ bias from the first K split), f32
};

// What C is made of: one product (Plain), or, for the gated GEMM, act(A·W_gateᵀ) ⊙ A·W_upᵀ
// from two products (each activation computed as kernels/activation.hip computes it).
struct Plain {
  static constexpr unsigned kProducts = 1;
};
struct SiluGate {
  static constexpr unsigned kProducts = 2;
  HK_DEVICE float operator()(float x) const { return x * hk::sigmoid(x); }
};
// gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the
// sigmoid form keeps its digits for x << 0, where 1 + tanh(u) cancels (as activation.hip's).
struct GeluTanhGate {
  static constexpr unsigned kProducts = 2;
  HK_DEVICE float operator()(float x) const {
    const float u = 0.79788456080286536f * hk::fma(0.044715f * x, x * x, x);
    return x * hk::sigmoid(2.0f * u);
  }
};

// Element strides between the matrices of a batch.
struct BatchStrides {
  unsigned long long a, b, c;
};

template <class Tl, typename T, typename Out, BLayout kB, bool kBias, GridZ kZ,
          class Combine = Plain>
HK_DEVICE void gemm(Out* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                    const T* __restrict__ bias, unsigned m, unsigned n, unsigned k, unsigned lda,
                    unsigned ldb, unsigned ldc, BatchStrides strides = {},
                    const T* __restrict__ b_up = nullptr) {
  constexpr unsigned kProducts = Combine::kProducts;
  static_assert(kProducts == 1 || (!kBias && kZ == GridZ::kNone), "gated: no bias, no grid z");
  constexpr Epilogue kEpilogue = kZ == GridZ::kSplitK ? Epilogue::kAtomicAdd : Epilogue::kStore;
  if constexpr (kZ == GridZ::kBatch) {
    const unsigned long long i = hk::block_idx_z();
    a += i * strides.a;
    b += i * strides.b;
    c += i * strides.c;
  }
  using StageT = Stage<Tl, T, kB, kProducts>;
  StageT* const stage = hk::tile::stages<StageT, Tl::kStages, Tl::kDynamic>();
  using Acc = hk::tile::Accumulators<T, Tl::kWaveRows / 16, Tl::kWaveCols / 16>;
  using Atom = typename Acc::Atom;

  // This block's K range: all of it, or for split K an even share of the steps (the last
  // splits may get none when z does not divide them).
  const unsigned steps = (k + Tl::kTileK - 1) / Tl::kTileK;
  unsigned first = 0, last = steps;
  if constexpr (kZ == GridZ::kSplitK) {
    const unsigned per_split = (steps + hk::grid_dim_z() - 1) / hk::grid_dim_z();
    first = hk::block_idx_z() * per_split;
    last = steps - first < per_split ? steps : first + per_split;
    if (first >= steps) return;  // the whole block: no barrier is skipped by part of it
  }

  const hk::tile::BlockTile tile = hk::tile::block_tile();
  const unsigned row0 = tile.m * Tl::kTileM, col0 = tile.n * Tl::kTileN;
  const unsigned thread = hk::thread_idx_x();
  const unsigned wave = hk::wave_id();
  const unsigned wave_row = wave / Tl::kWavesN * Tl::kWaveRows;
  const unsigned wave_col = wave % Tl::kWavesN * Tl::kWaveCols;

  const hk::tile::GlobalMatrix<T> ga{a, m, k, lda};
  hk::tile::GlobalMatrix<T> gb[kProducts];
#pragma unroll
  for (unsigned p = 0; p < kProducts; ++p) {
    const T* bp = p == 0 ? b : b_up;
    gb[p] = kB == BLayout::kNK ? hk::tile::GlobalMatrix<T>{bp, n, k, ldb}
                               : hk::tile::GlobalMatrix<T>{bp, k, n, ldb};
  }
  // Where step s's B block starts in gb.
  const auto b_row = [&](unsigned s) HK_INLINE {
    return kB == BLayout::kNK ? col0 : s * Tl::kTileK;
  };
  const auto b_col = [&](unsigned s) HK_INLINE {
    return kB == BLayout::kNK ? s * Tl::kTileK : col0;
  };

  // The sums start from the bias (for split K, in the first split only): loaded here, where
  // few registers are live, rather than next to the stores, where all the accumulators are.
  Acc acc[kProducts];
  const bool add_bias = kBias && (kEpilogue == Epilogue::kStore || hk::block_idx_z() == 0);
  if (add_bias) {
    acc[0].set([&](unsigned, unsigned col) HK_INLINE {
      const unsigned column = col0 + wave_col + col;
      return column < n ? hk::to_float(bias[column]) : 0.0f;
    });
  } else {
    acc[0].zero();
  }
  if constexpr (kProducts == 2) acc[1].zero();
  const auto multiply = [&](const StageT& s) HK_INLINE {
#pragma unroll
    for (unsigned kk = 0; kk < Tl::kTileK; kk += Atom::kK)
#pragma unroll
      for (unsigned p = 0; p < kProducts; ++p)
        hk::tile::mma<kB>(acc[p], s.a, s.b[p], wave_row, wave_col, kk);
  };

  const bool a_vector = ga.vector_rows();
  bool b_vector = true;
#pragma unroll
  for (unsigned p = 0; p < kProducts; ++p) b_vector = b_vector && gb[p].vector_rows();
#if HK_NVIDIA
  if (a_vector && b_vector) {
    constexpr unsigned kStages = Tl::kStages;
    const auto copy = [&](unsigned s) HK_INLINE {
      StageT& to = stage[(s - first) % kStages];
      hk::tile::copy_async<Tl::kThreads>(to.a, ga, row0, s * Tl::kTileK, thread);
#pragma unroll
      for (unsigned p = 0; p < kProducts; ++p)
        hk::tile::copy_async<Tl::kThreads>(to.b[p], gb[p], b_row(s), b_col(s), thread);
    };
#pragma unroll
    for (unsigned s = first; s + 1 < first + kStages; ++s) {
      if (s < last) copy(s);
      hk::tile::async_commit();
    }
    for (unsigned s = first; s < last; ++s) {
      // Step s's copies are done (one group per step, kStages - 2 younger ones may fly), and
      // after the barrier every wave has finished step s - 1, whose stage the copy reuses.
      hk::tile::async_wait<kStages - 2>();
      hk::block_sync();
      if (s + kStages - 1 < last) copy(s + kStages - 1);
      hk::tile::async_commit();
      multiply(stage[(s - first) % kStages]);
    }
  } else
#endif
  {
    hk::tile::StagedCopy<decltype(StageT::a), Tl::kThreads> next_a;
    using BTile = typename StageT::BTile;
    hk::tile::StagedCopy<BTile, Tl::kThreads> next_b[kProducts];
    const auto fetch = [&](unsigned s) HK_INLINE {
      next_a.fetch(ga, row0, s * Tl::kTileK, thread, a_vector);
#pragma unroll
      for (unsigned p = 0; p < kProducts; ++p)
        next_b[p].fetch(gb[p], b_row(s), b_col(s), thread, b_vector);
    };
    const auto store = [&](StageT& to) HK_INLINE {
      next_a.store(to.a, thread);
#pragma unroll
      for (unsigned p = 0; p < kProducts; ++p) next_b[p].store(to.b[p], thread);
    };
#if HK_NVIDIA
    // Unaligned rows, NVIDIA's slow path: no overlap, so that the staged chunks do not add to
    // the registers the multiply needs (the fast path's budget would spill).
    for (unsigned s = first; s < last; ++s) {
      fetch(s);
      store(stage[0]);
      hk::block_sync();
      multiply(stage[0]);
      hk::block_sync();
    }
#else
    // Steps [from, to) double-buffered: step s + 1's loads are in flight while step s
    // multiplies. Instantiated once per way of fetching, so that each K loop holds one copy path.
    const auto run = [&](auto fetch_step, unsigned from, unsigned to) HK_INLINE {
      fetch_step(from);
      store(stage[0]);
      hk::block_sync();
      for (unsigned s = from; s < to; ++s) {
        const unsigned now = (s - from) % 2;
        const bool more = s + 1 < to;
        if (more) fetch_step(s + 1);
        multiply(stage[now]);
        // The other stage was last read in step s - 1, before the barrier that ended it.
        if (more) store(stage[1 - now]);
        hk::block_sync();
      }
    };
    // With 16-byte aligned rows (and B's columns whole chunks where they are n), every chunk
    // of a step whose K range lies inside k is whole or past the M or N edge: those steps take
    // the whole-chunk walk alone (what it reads past the edges reaches only sums that are never
    // stored); the loop that decides chunk by chunk takes what is left: the last step where k
    // cuts it, or every step of other rows.
    const unsigned whole = hk::tile::detail::min_u(last, k / Tl::kTileK);
    bool walk = a_vector && b_vector && (kB == BLayout::kNK || n % BTile::kChunk == 0) &&
                first < whole && next_a.addressable(ga);
#pragma unroll
    for (unsigned p = 0; p < kProducts; ++p) walk = walk && next_b[p].addressable(gb[p]);
    unsigned rest = first;
    if (walk) {
      next_a.aim(ga, row0, first * Tl::kTileK, thread);
#pragma unroll
      for (unsigned p = 0; p < kProducts; ++p)
        next_b[p].aim(gb[p], b_row(first), b_col(first), thread);
      run([&](unsigned s) HK_INLINE {
            next_a.fetch_whole(ga, row0, s * Tl::kTileK, thread);
#pragma unroll
            for (unsigned p = 0; p < kProducts; ++p)
              next_b[p].fetch_whole(gb[p], b_row(s), b_col(s), thread);
          },
          first, whole);
      rest = whole;
    }
    if (rest < last) run(fetch, rest, last);
#endif
  }

  const auto put = [&](unsigned r, unsigned col, float v) HK_INLINE {
    const unsigned row = row0 + wave_row + r, column = col0 + wave_col + col;
    if (row < m && column < n) {
      Out* to = c + static_cast<unsigned long long>(row) * ldc + column;
      if constexpr (kEpilogue == Epilogue::kAtomicAdd)
        hk::atomic_add(to, v);
      else
        *to = hk::from_float<Out>(v);
    }
  };
  if constexpr (kProducts == 1) {
    acc[0].for_each(put);
  } else {
    hk::tile::for_each_pair(acc[0], acc[1], [&](unsigned r, unsigned col, float gate, float up)
                                                HK_INLINE { put(r, col, Combine{}(gate) * up); });
  }
}

#if HK_SM90A
// sm_90a, B stored [N][K]: a wgmma program over hk/tile/pipeline.h. Blocks of 128 x 256 of C
// (wide) or, when those would leave most of the GPU idle (the contract decides, and the kernel
// reads its choice off the grid), 128 x 128 (narrow); K in steps of 64 (a tile row is one
// 128-byte swizzled row). A producer warpgroup copies, two consumer warpgroups multiply 64 rows
// each (128 or 64 f32 sums a thread). On the H100: wide blocks in 4 stages of 48 KiB ran 430-460
// TF/s at M >= 2048 (3 stages of lag: 376-401; narrow blocks there 354-382); at M = 64 and 128,
// N = K = 4096, narrow blocks in 6 stages of 32 KiB ran 47 and 89 TF/s against 29 and 55.
template <typename T, typename Out, bool kBias, unsigned kTileN, unsigned kStages>
struct WgmmaGemm : hk::tile::WgmmaNt<T, 128, kTileN, kStages> {
  Out* c;
  unsigned m, n, ldc;

  // The sums start from the bias, or zero.
  HK_DEVICE void start(const T* __restrict__ bias) {
#pragma unroll
    for (unsigned v = 0; v < kTileN / 2; ++v) {
      const unsigned column = this->col0 + hk::tile::wgmma::Layout::col(v);
      this->acc[v] = kBias && column < n ? hk::to_float(bias[column]) : 0.0f;
    }
  }

  HK_DEVICE void finish(unsigned consumer) {
    hk::tile::wgmma::pin(this->acc);
    hk::tile::store_pairs(c, m, n, ldc, *this, consumer,
                          [&](unsigned v, unsigned, unsigned) HK_INLINE { return this->acc[v]; });
  }
};
template <typename T, typename Out, bool kBias> using WideGemm = WgmmaGemm<T, Out, kBias, 256, 4>;
template <typename T, typename Out, bool kBias> using NarrowGemm = WgmmaGemm<T, Out, kBias, 128, 6>;
constexpr unsigned kWgmmaThreads = WideGemm<hk::bf16, hk::bf16, false>::kThreads;

// The contracts (manifests/gemm.toml) give the _nt kernels this much dynamic shared memory on
// sm_90a, enough for either ring.
static_assert(WideGemm<hk::bf16, hk::bf16, false>::Ring::kSharedBytes == 197696 &&
                  NarrowGemm<hk::f16, float, true>::Ring::kSharedBytes == 197728 &&
                  NarrowGemm<hk::bf16, hk::bf16, false>::kThreads == kWgmmaThreads,
              "the wgmma rings no longer match the `shared` of manifests/gemm.toml's contracts");

template <class Program, typename T, typename Out>
HK_DEVICE void run_wgmma(Out* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                         const T* __restrict__ bias, unsigned m, unsigned n, unsigned k,
                         unsigned lda, unsigned ldb, unsigned ldc) {
  const hk::tile::BlockTile tile = hk::tile::block_tile();
  Program p{{{a, m, k, lda}, {b, n, k, ldb}, tile.m * Program::kTileM, tile.n * Program::kTileN},
            c, m, n, ldc};
  if (hk::thread_idx_x() >= hk::tile::kWarpgroupThreads) p.start(bias);
  hk::tile::run_pipeline<typename Program::Ring>(p, Program::steps(k));
}

template <typename T, typename Out, bool kBias, GridZ kZ>
HK_DEVICE void gemm_wgmma(Out* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                          const T* __restrict__ bias, unsigned m, unsigned n, unsigned k,
                          unsigned lda, unsigned ldb, unsigned ldc, BatchStrides strides = {}) {
  static_assert(kZ != GridZ::kSplitK, "the wgmma program has no split-K role");
  if constexpr (kZ == GridZ::kBatch) {
    const unsigned long long i = hk::block_idx_z();
    a += i * strides.a;
    b += i * strides.b;
    c += i * strides.c;
  }
  // More column blocks than 256-wide ones would need: the contract chose narrow blocks.
  if (hk::grid_dim_x() > (n + 255) / 256)
    run_wgmma<NarrowGemm<T, Out, kBias>>(c, a, b, bias, m, n, k, lda, ldb, ldc);
  else
    run_wgmma<WideGemm<T, Out, kBias>>(c, a, b, bias, m, n, k, lda, ldb, ldc);
}
#endif

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
#define HK_GEMM_ENTRY(Tl, name) \
  HK_KERNEL HK_LAUNCH_BOUNDS_MIN_BLOCKS(Tl::kThreads, 2) void gemm_a16w16_##name
#if HK_SM90A
#define HK_SQUARE_BOUNDS(kB)                                                               \
  HK_LAUNCH_BOUNDS_MIN_BLOCKS(kB == BLayout::kNK ? kWgmmaThreads : Square::kThreads, \
                              kB == BLayout::kNK ? 1 : 2)
#else
#define HK_SQUARE_BOUNDS(kB) HK_LAUNCH_BOUNDS_MIN_BLOCKS(Square::kThreads, 2)
#endif
#define HK_GEMM_PARAMS(Out, T) Out *c, const T *a, const T *b
#define HK_GEMM_SIZES unsigned m, unsigned n, unsigned k, unsigned lda, unsigned ldb, unsigned ldc
#define HK_GEMM_CALL(Tl, T, Out, kB, kBias, kZ, bias) \
  gemm<Tl, T, Out, kB, kBias, kZ>(c, a, b, bias, m, n, k, lda, ldb, ldc);

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

#define HK_GEMM_SPLITK(name, T)                                                          \
  HK_GEMM_ENTRY(Skinny, splitk_nt_##name)(HK_GEMM_PARAMS(float, T), HK_GEMM_SIZES) {    \
    HK_GEMM_CALL(Skinny, T, float, BLayout::kNK, false, GridZ::kSplitK, nullptr)   \
  }                                                                                      \
  HK_GEMM_ENTRY(Skinny, splitk_nt_##name##_bias)(HK_GEMM_PARAMS(float, T), const T* bias, \
                                                 HK_GEMM_SIZES) {                        \
    HK_GEMM_CALL(Skinny, T, float, BLayout::kNK, true, GridZ::kSplitK, bias)       \
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
