// Flash attention forward over packed variable-length sequences (THD), for prefill:
//   O[t, h, :] = softmax_j(s(Q[t, h, :] · K[j, h / group, :])) · V[j, h / group, :]
// for each query token t of a sequence and the key tokens j of the same sequence that it sees,
// with s(x) = x · scale, or with a soft-cap c > 0, c · tanh(x · scale / c) (Gemma 2), and
// LSE[h, t] = log Σ_j exp(s(...)) in f32. Sequence b's queries are rows cu_seqlens_q[b] ..
// cu_seqlens_q[b + 1] of Q and O, its keys rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] of K and
// V. Which keys a query sees: hk::tile::Visibility (hk/tile/flash.h): causal aligned
// bottom-right when a sequence has fewer queries than keys, and a sliding window (left,
// right; -1 for none); a query that sees no key writes zeros and an LSE of -inf.
//
// Layouts: Q [total_q, heads_q, d_qk], K [total_k, heads_kv, d_qk], V [total_k, heads_kv, d_v],
// O [total_q, heads_q, d_v], each a row a token with its own row stride (ld*, in elements), so
// Q, K and V may be views of one fused QKV projection; LSE [heads_q, total_q] with rows ld_lse
// apart. heads_q is a multiple of heads_kv (MHA, GQA, MQA): query head h reads key head
// h / (heads_q / heads_kv).
//
// The program: a block takes 128 queries of one head of one sequence (4 waves of 32; 64 for
// d_qk = 192 and 256, whose outputs fill the registers at 16 a wave) and walks
// the keys they may see in blocks of kKeys, staged through shared memory: cp.async with two
// stages on NVIDIA (the next block's copies in flight while this one multiplies), registers on
// AMD (the next block's loads in flight, one LDS stage), element by element for rows that are
// not 16-byte aligned. Each wave's scores, online softmax and P·V are hk::tile::FlashWave's.
// Blocks along x stride over a sequence's query blocks, so any grid x is correct; the
// contract's covers the longest sequence once.
//
// Symbols: attn_fwd_d{64,128,256}_{bf16,f16} (d_qk = d_v) and attn_fwd_d192_dv128_{bf16,f16}
// (DeepSeek-V3's prefill). Launch: the contract in manifests/attention.toml.
#include "hk/hk.h"
#include "hk/tile/copy.h"
#include "hk/tile/flash.h"

namespace {

using hk::tile::SharedPanels;

struct Params {
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  unsigned total_q, total_k, heads_q, heads_kv;
  unsigned ldq, ldk, ldv, ldo, ld_lse;
  float scale, softcap;
  unsigned causal;
  int window_left, window_right;
};

// Every forward kernel's block: 4 waves.
constexpr unsigned kForwardThreads = 4 * hk::kWaveSize;

template <typename T, unsigned kD, unsigned kDv> struct Forward {
  static constexpr unsigned kWaves = kForwardThreads / hk::kWaveSize;
  // 32 queries a wave where their outputs fit its registers (d_v <= 128 beside d_qk <= 128):
  // each K and V fragment read from shared memory then serves two matrix instructions, which
  // halves the shared-memory reads per product (at 16 queries a wave, mma.sync waits on
  // ldmatrix).
  // (sm_80's ptxas spills d = 128 at 32, so it takes 16 there; the contract's grid, sized for
  // 128-query blocks, then gives each block two of its 64-query blocks.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static constexpr unsigned kQueryTiles = kD <= 64 ? 2 : 1;
#else
  static constexpr unsigned kQueryTiles = kD <= 128 ? 2 : 1;
#endif
  static constexpr unsigned kQueries = 16 * kQueryTiles * kWaves;
  // Keys a block: 32, so that a wave's scores and outputs fit its registers with no spills
  // (at 64 keys and 32 queries, d = 128 spilled on sm_90 and d = 64 on sm_80).
  static constexpr unsigned kKeys = 32;
  static constexpr unsigned kThreads = kForwardThreads;
  using Wave = hk::tile::FlashWave<T, kQueryTiles, kKeys, kD, kDv>;
  using QTile = SharedPanels<T, kQueries, kD>;
  struct Stage {
    SharedPanels<T, kKeys, kD> k;
    SharedPanels<T, kKeys, kDv> v;
  };
  struct Shared {
    QTile q;
    Stage stage[hk::tile::kWalkStages];
  };
};

template <typename T, unsigned kD, unsigned kDv>
HK_DEVICE void attention_forward(T* __restrict__ o, float* __restrict__ lse, const T* __restrict__ q,
                                 const T* __restrict__ k, const T* __restrict__ v, const Params& p) {
  using F = Forward<T, kD, kDv>;
  constexpr unsigned kKeys = F::kKeys, kQueries = F::kQueries;
  typename F::Shared& shared = *hk::tile::stages<typename F::Shared, 1, HK_NVIDIA>();

  const unsigned b = hk::block_idx_z(), h = hk::block_idx_y();
  const hk::tile::SequenceRows qs(p.cu_seqlens_q, b, p.total_q), ks(p.cu_seqlens_k, b, p.total_k);
  const unsigned hk_ = h / (p.heads_q / p.heads_kv);
  const T* qd = q + static_cast<unsigned long long>(qs.first) * p.ldq + h * kD;
  const T* kd = k + static_cast<unsigned long long>(ks.first) * p.ldk + hk_ * kD;
  const T* vd = v + static_cast<unsigned long long>(ks.first) * p.ldv + hk_ * kDv;
  const bool vector = hk::aligned16(qd, kd, vd) && p.ldq % 8 == 0 && p.ldk % 8 == 0 &&
                      p.ldv % 8 == 0;
  const bool o_vector = hk::aligned16(o) && p.ldo % 8 == 0;
  const hk::tile::Visibility vis{static_cast<int>(qs.count), static_cast<int>(ks.count),
                                 p.window_left, p.causal ? 0 : p.window_right};
  // Scores to base-2 logits: x · scale · log2(e), or through the soft-cap in natural units.
  const bool capped = p.softcap > 0.0f;
  const float pre = capped ? p.scale / p.softcap : p.scale * hk::kLog2e;
  const float post = p.softcap * hk::kLog2e;

  const unsigned wave = hk::wave_id();
  for (unsigned qb = hk::block_idx_x(); qb * kQueries < qs.count; qb += hk::grid_dim_x()) {
    const int q0 = qb * kQueries;
    const int q1 = q0 + kQueries < qs.count ? q0 + kQueries : qs.count;
    const int first = vis.first_key(q0), last = vis.last_key(q1);
    const unsigned kb_first = first / kKeys;
    const unsigned kb_last = last > first ? (last + kKeys - 1) / kKeys : kb_first;

    typename F::Wave w;
    w.start();
    const auto multiply = [&](const typename F::Stage& st, unsigned kb) HK_INLINE {
      w.score(shared.q, st.k, F::Wave::kQueries * wave);
      const int k0 = kb * kKeys;
      const int wq = q0 + F::Wave::kQueries * wave;
      const bool all = vis.all_visible(q0, q1, k0, k0 + kKeys);
      // Each query's visible keys [lo, hi) of the block: two bounds a query rather than a test
      // of both positions a score (which held a register a score).
      int lo[F::Wave::kSlots], hi[F::Wave::kSlots];
#pragma unroll
      for (unsigned slot = 0; slot < F::Wave::kSlots; ++slot) {
        const int query = wq + F::Wave::row(slot);
        lo[slot] = all ? 0 : vis.first_key(query) - k0;
        hi[slot] = all ? kKeys : vis.last_key(query + 1) - k0;
      }
      const auto logits = [&](auto logit) HK_INLINE {
        w.s.map([&](unsigned slot, unsigned, unsigned kj, float x) HK_INLINE {
          const bool hidden = static_cast<int>(kj) < lo[slot] || static_cast<int>(kj) >= hi[slot];
          return hidden ? -__builtin_inff() : logit(x);
        });
      };
      // Two loops rather than a choice a score, which held both paths' registers at once.
      if (capped)
        logits([&](float x) HK_INLINE { return post * hk::tanh(pre * x); });
      else
        logits([&](float x) HK_INLINE { return pre * x; });
      w.softmax();
      w.accumulate(st.v);
    };

    if (kb_first < kb_last) {
      // Q's block lands with the first block of keys (NVIDIA), or now (AMD).
      hk::tile::copy_panels<F::kThreads>(shared.q, qd, qs.count, p.ldq, q0, vector);
      hk::tile::KeyValueCopies<typename F::Stage, F::kThreads, T> copies{kd, vd, ks.count, p.ldk, p.ldv, vector};
      hk::tile::walk_blocks(shared.stage, kb_first, kb_last, vector, copies, multiply);
    }

    float row_lse[F::Wave::kSlots];
    w.finish(row_lse);
    const int wq = q0 + F::Wave::kQueries * wave;
    hk::tile::store_rows(w.o, o + static_cast<unsigned long long>(qs.first + wq) * p.ldo + h * kDv,
                         p.ldo, q1 - wq, o_vector);
#pragma unroll
    for (unsigned slot = 0; slot < F::Wave::kSlots; ++slot) {
      const unsigned qi = F::Wave::row(slot);
      // One lane of those that share the query writes its log-sum-exp.
      const bool writer = F::Wave::first_of_row();
      if (writer && wq + static_cast<int>(qi) < q1)
        lse[static_cast<unsigned long long>(h) * p.ld_lse + qs.first + wq + qi] = row_lse[slot];
    }
    // The next query block refills the tiles this one read.
    hk::block_sync();
  }
}

}  // namespace

#define HK_ATTN_FWD(name, T, D, DV, SHARED, QUERIES)                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS(kForwardThreads) void name(                            \
      T* o, float* lse, const T* q, const T* k, const T* v, const int* cu_seqlens_q,              \
      const int* cu_seqlens_k, unsigned batch, unsigned total_q, unsigned total_k,               \
      unsigned max_seqlen_q, unsigned heads_q, unsigned heads_kv, unsigned ldq, unsigned ldk,    \
      unsigned ldv, unsigned ldo, unsigned ld_lse, float scale, float softcap, unsigned causal,   \
      int window_left, int window_right) {                                                        \
    static_assert(HK_AMD || sizeof(Forward<T, D, DV>::Shared) <= SHARED,                          \
                  "manifests/attention.toml gives this kernel less shared memory than it uses");  \
    static_assert((QUERIES) % Forward<T, D, DV>::kQueries == 0,                                    \
                  "manifests/attention.toml's grid counts blocks of other queries");              \
    (void)batch;                                                                                  \
    (void)max_seqlen_q;                                                                           \
    attention_forward<T, D, DV>(o, lse, q, k, v,                                                  \
                                Params{cu_seqlens_q, cu_seqlens_k, total_q, total_k, heads_q,     \
                                       heads_kv, ldq, ldk, ldv, ldo, ld_lse, scale, softcap,      \
                                       causal, window_left, window_right});                       \
  }

HK_ATTN_FWD(attn_fwd_d64_bf16, hk::bf16, 64, 64, 32768, 128)
HK_ATTN_FWD(attn_fwd_d128_bf16, hk::bf16, 128, 128, 65536, 128)
HK_ATTN_FWD(attn_fwd_d256_bf16, hk::bf16, 256, 256, 98304, 64)
HK_ATTN_FWD(attn_fwd_d192_dv128_bf16, hk::bf16, 192, 128, 65536, 64)
HK_ATTN_FWD(attn_fwd_d64_f16, hk::f16, 64, 64, 32768, 128)
HK_ATTN_FWD(attn_fwd_d128_f16, hk::f16, 128, 128, 65536, 128)
HK_ATTN_FWD(attn_fwd_d256_f16, hk::f16, 256, 256, 98304, 64)
HK_ATTN_FWD(attn_fwd_d192_dv128_f16, hk::f16, 192, 128, 65536, 64)
