// Flash attention backward over packed variable-length sequences (THD): the gradients of the
// forward pass of kernels/attention.hip with respect to Q, K and V, from dO, O and the forward
// pass's log-sum-exp, for the same layouts, masks, soft-cap and head groups. Three kernels,
// no atomics (every gradient is summed in one block's registers, in a fixed order, so a run
// repeats bit for bit):
//   attn_bwd_delta_*   delta[h, t] = sum_c dO[t, h, c] O[t, h, c] (f32), the softmax's
//                      correction term;
//   attn_bwd_dq_*      a block takes 64 queries of one head and walks the keys they see:
//                      S = Q Kᵀ, P = exp(s(S) - LSE), dP = dO Vᵀ, dS = P (dP - delta) s'(S),
//                      dQ = scale dS K;
//   attn_bwd_dkdv_*    a block takes 64 keys of one key head and walks the queries that see
//                      them, of every query head of its group (so GQA's sums over the group
//                      are a loop, not atomics): Sᵀ, Pᵀ and dPᵀ = V dOᵀ as above,
//                      dV = Pᵀ dO, dK = scale dSᵀ Q.
// For d_qk > 128 a block takes half the columns of its gradients (a quarter of dK's and dV's at
// 256; grid y counts the parts of each head), as all of them do not fit one wave's registers;
// on AMD at d_qk = 256 a block has
// 2 waves (32 own rows), as 64 would not fit 64 KiB of LDS.
// s(x) = x scale, or c tanh(x scale / c) with a soft-cap c, whose derivative folds into dS as
// 1 - tanh²; the forward pass's P is recomputed from the LSE, so rows that saw no key (LSE
// -inf) are never read (every score of theirs is masked).
//
// Each wave's products are hk/tile/flash.h's RowScores and RowSums, over blocks walked by
// walk_blocks (cp.async stages on NVIDIA, a register double buffer on AMD). On sm_90a, dQ at
// d = 128 and dK, dV at d = 64 are warp-specialised wgmma programs instead (WgmmaDq and
// WgmmaDkdv, below).
//
// Symbols: attn_bwd_delta_{bf16,f16}; attn_bwd_dq_d{64,128,256}_{bf16,f16} and
// attn_bwd_dq_d192_dv128_*; attn_bwd_dkdv_* likewise. Launch: manifests/attention_backward.toml.
#include "hk/hk.h"
#include "hk/tile/flash.h"
#include "hk/tile/flash_wgmma.h"
#include "hk/tile/pipeline.h"

namespace {

using hk::tile::SharedPanels;

// ---- delta ----------------------------------------------------------------------------------

constexpr unsigned kDeltaThreads = 256;
constexpr unsigned kDeltaLanes = 16;  // lanes a (token, head) row

template <typename T>
HK_DEVICE void attention_delta(float* __restrict__ delta, const T* __restrict__ o,
                               const T* __restrict__ d_o, unsigned total_q, unsigned heads_q,
                               unsigned d_v, unsigned ldo, unsigned lddo, unsigned ld_delta) {
  const unsigned lane = hk::thread_idx_x() % kDeltaLanes;
  const unsigned team = hk::thread_idx_x() / kDeltaLanes;
  constexpr unsigned kTeams = kDeltaThreads / kDeltaLanes;
  const unsigned long long rows = static_cast<unsigned long long>(total_q) * heads_q;
  // Teams stride over the rows; the loop's condition is the same for the whole team (each
  // team's lanes lie in one wave), so the reduction never loses a lane.
  for (unsigned long long r = static_cast<unsigned long long>(hk::block_idx_x()) * kTeams + team;
       r < rows; r += static_cast<unsigned long long>(hk::grid_dim_x()) * kTeams) {
    const unsigned long long t = r / heads_q;
    const unsigned h = static_cast<unsigned>(r % heads_q);
    const T* orow = o + t * ldo + h * d_v;
    const T* grow = d_o + t * lddo + h * d_v;
    float sum = 0.0f;
    for (unsigned c = lane; c < d_v; c += kDeltaLanes) sum += hk::to_float(orow[c]) * hk::to_float(grow[c]);
    sum = hk::lanes_reduce<kDeltaLanes>(sum, hk::Sum{});
    if (lane == 0) delta[static_cast<unsigned long long>(h) * ld_delta + t] = sum;
  }
}

// ---- dQ and dK, dV: shared parameters -------------------------------------------------------

struct Params {
  const float* lse;
  const float* delta;
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  unsigned total_q, total_k, heads_q, heads_kv;
  unsigned ldq, ldk, ldv, lddo, ld_lse;
  float scale, softcap;
  unsigned causal;
  int window_left, window_right;
};

// A block of 4 waves of 16 own rows, walking blocks of 32 other rows; 2 waves for d_qk = 256
// on AMD, whose tiles of 64 own rows would not fit 64 KiB of LDS.
constexpr unsigned waves(unsigned d) { return HK_AMD && d == 256 ? 2 : 4; }
constexpr unsigned threads(unsigned d) { return waves(d) * hk::kWaveSize; }
constexpr unsigned kOthers = 32;

// A call's logits in base 2 and the derivative of s(x) as the backward pass needs them.
struct Logits {
  bool capped;
  float pre, post;  // logit2 = post tanh(pre x), or pre x
  HK_DEVICE explicit Logits(const Params& p)
      : capped(p.softcap > 0.0f),
        pre(capped ? p.scale / p.softcap : p.scale * hk::kLog2e),
        post(p.softcap * hk::kLog2e) {}
  // The probability exp(s(x) - lse) from lse2 = lse log2(e).
  HK_DEVICE float probability(float x, float lse2) const {
    return hk::exp2((capped ? post * hk::tanh(pre * x) : pre * x) - lse2);
  }
  // ds/dx over scale at a probability p of that logit: 1 - tanh² with tanh recovered from p
  // (p = 0 contributes nothing, whatever the factor).
  HK_DEVICE float slope(float p, float lse2) const {
    if (!capped || p == 0.0f) return 1.0f;
    const float u = (hk::log2(p) + lse2) / post;
    return 1.0f - u * u;
  }
};

// ---- dQ -------------------------------------------------------------------------------------

// Column parts of the gradients a block computes (grid y counts heads times parts): for heads
// wider than 128, the sums of all columns did not fit a wave's registers beside the scores
// (dQ at d = 256 spilled 40 bytes on sm_90, dK and dV at 192 4), so each block takes half of
// them and recomputes the scores the other half needs too.
constexpr unsigned parts(unsigned d) { return d > 128 ? 2 : 1; }

template <typename T, unsigned kD, unsigned kDv> struct DqShapes {
  static constexpr unsigned kThreads = threads(kD), kOwn = 16 * waves(kD);
  struct Stage {
    SharedPanels<T, kOthers, kD> k;
    SharedPanels<T, kOthers, kDv> v;
  };
  struct Shared {
    SharedPanels<T, kOwn, kD> q;
    SharedPanels<T, kOwn, kDv> d_o;
    Stage stage[hk::tile::kWalkStages];
  };
};

template <typename T, unsigned kD, unsigned kDv>
HK_DEVICE void attention_dq(T* __restrict__ dq, unsigned lddq, const T* __restrict__ q,
                            const T* __restrict__ k, const T* __restrict__ v,
                            const T* __restrict__ d_o, const Params& p) {
  using S = DqShapes<T, kD, kDv>;
  using Scores = hk::tile::RowScores<T, 1, kOthers>;
  constexpr unsigned kThreads = S::kThreads, kOwn = S::kOwn;
  typename S::Shared& shared = *hk::tile::stages<typename S::Shared, 1, HK_NVIDIA>();

  constexpr unsigned kPartD = kD / parts(kD);
  const unsigned b = hk::block_idx_z();
  const unsigned h = hk::block_idx_y() / parts(kD), part = hk::block_idx_y() % parts(kD);
  const hk::tile::SequenceRows qs(p.cu_seqlens_q, b, p.total_q), ks(p.cu_seqlens_k, b, p.total_k);
  const unsigned hk_ = h / (p.heads_q / p.heads_kv);
  const unsigned long long q_first = qs.first;
  const T* qd = q + q_first * p.ldq + h * kD;
  const T* dod = d_o + q_first * p.lddo + h * kDv;
  const T* kd = k + static_cast<unsigned long long>(ks.first) * p.ldk + hk_ * kD;
  const T* vd = v + static_cast<unsigned long long>(ks.first) * p.ldv + hk_ * kDv;
  const bool vector = hk::aligned16(qd, dod, kd, vd) && p.ldq % 8 == 0 && p.lddo % 8 == 0 &&
                      p.ldk % 8 == 0 && p.ldv % 8 == 0;
  const bool out_vector = hk::aligned16(dq) && lddq % 8 == 0;
  const hk::tile::Visibility vis{static_cast<int>(qs.count), static_cast<int>(ks.count),
                                 p.window_left, p.causal ? 0 : p.window_right};
  const Logits logits(p);
  const unsigned wave = hk::wave_id();

  for (unsigned qb = hk::block_idx_x(); qb * kOwn < qs.count; qb += hk::grid_dim_x()) {
    const int q0 = qb * kOwn;
    const int q1 = q0 + kOwn < qs.count ? q0 + kOwn : qs.count;
    const int wq = q0 + 16 * wave;
    const int first = vis.first_key(q0), last = vis.last_key(q1);
    const unsigned kb_first = first / kOthers;
    const unsigned kb_last = last > first ? (last + kOthers - 1) / kOthers : kb_first;

    // Each own row's LSE (base 2) and delta; rows past the sequence read nothing.
    float lse2[Scores::kSlots], delta[Scores::kSlots];
#pragma unroll
    for (unsigned slot = 0; slot < Scores::kSlots; ++slot) {
      const int row = wq + Scores::row(slot);
      const unsigned long long at = static_cast<unsigned long long>(h) * p.ld_lse + q_first + row;
      lse2[slot] = row < q1 ? p.lse[at] * hk::kLog2e : 0.0f;
      delta[slot] = row < q1 ? p.delta[at] : 0.0f;
    }

    hk::tile::RowSums<T, 1, kPartD> grad;
    grad.zero();
    const auto multiply = [&](const typename S::Stage& st, unsigned kb) HK_INLINE {
      const int k0 = kb * kOthers;
      int lo[Scores::kSlots], hi[Scores::kSlots];
#pragma unroll
      for (unsigned slot = 0; slot < Scores::kSlots; ++slot) {
        const int query = wq + Scores::row(slot);
        lo[slot] = vis.first_key(query) - k0;
        hi[slot] = vis.last_key(query + 1) - k0;
      }
      Scores ps;
      ps.template compute<kD>(shared.q, st.k, 16 * wave);
      ps.map([&](unsigned slot, unsigned, unsigned kj, float x) HK_INLINE {
        const bool hidden = static_cast<int>(kj) < lo[slot] || static_cast<int>(kj) >= hi[slot];
        return hidden ? 0.0f : logits.probability(x, lse2[slot]);
      });
      Scores dp;
      dp.template compute<kDv>(shared.d_o, st.v, 16 * wave);
      ps.map_with(dp, [&](unsigned slot, unsigned, unsigned, float pr, float g) HK_INLINE {
        return pr * (g - delta[slot]) * logits.slope(pr, lse2[slot]);
      });
      grad.add(ps, hk::tile::ColumnSlice<decltype(st.k)>{st.k, part * kPartD});
    };
    if (kb_first < kb_last) {
      hk::tile::copy_panels<kThreads>(shared.q, qd, qs.count, p.ldq, q0, vector);
      hk::tile::copy_panels<kThreads>(shared.d_o, dod, qs.count, p.lddo, q0, vector);
      hk::tile::KeyValueCopies<typename S::Stage, kThreads, T> copies{kd, vd, ks.count, p.ldk, p.ldv, vector};
      hk::tile::walk_blocks(shared.stage, kb_first, kb_last, vector, copies, multiply);
    }
    hk::tile::store_rows(grad, dq + (q_first + wq) * lddq + h * kD + part * kPartD, lddq, q1 - wq,
                         out_vector, p.scale);
    // The next query block refills the tiles this one read.
    hk::block_sync();
  }
}

// ---- dK and dV ------------------------------------------------------------------------------

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kSm80 = true;
#else
constexpr bool kSm80 = false;
#endif

// A block of queries' LSE (base 2) and delta in shared memory, where staged.
template <bool kStaged_> struct QueryStats {
  static constexpr bool kStaged = true;
  float lse2[kOthers], delta[kOthers];
};
template <> struct QueryStats<false> {
  static constexpr bool kStaged = false;
};

template <typename T, unsigned kD, unsigned kDv> struct DkdvShapes {
  // dK and dV at d = 256 in quarters: in halves they spilled 136 bytes on sm_80.
  static constexpr unsigned kParts = kD == 256 ? 4 : parts(kD);
  static constexpr unsigned kThreads = threads(kD), kOwn = 16 * waves(kD);
  // The block's LSE (base 2) and delta staged beside its rows (a score reads them from there:
  // fwd + bwd at d = 128 went from 0.32 to 0.41 of FlashAttention-2 on the H100 against reading
  // them from global memory), except where that does not fit: AMD's LDS at d = 256, and
  // sm_80's registers (20 bytes of spills at d = 128); those read them where a score needs
  // them.
  static constexpr bool kStagedStats = HK_NVIDIA && !kSm80;
  struct Stage : QueryStats<kStagedStats> {
    SharedPanels<T, kOthers, kD> q;
    SharedPanels<T, kOthers, kDv> d_o;
  };
  struct Shared {
    SharedPanels<T, kOwn, kD> k;
    SharedPanels<T, kOwn, kDv> v;
    Stage stage[hk::tile::kWalkStages];
  };
};

// The copies of a block of queries of one head: Q's and dO's rows. Block b is query block
// first_block + b % blocks of query head first_head + b / blocks.
template <class Stage, unsigned kThreads, typename T> struct QueryCopies {
  static constexpr unsigned kD = decltype(Stage::q)::kCols, kDv = decltype(Stage::d_o)::kCols;
  static constexpr unsigned kRows = decltype(Stage::q)::kRows;
  const T *q, *d_o;
  unsigned ldq, lddo, queries, first_head, first_block, blocks;
  bool vector;

  const float *lse, *delta;  // [heads_q][ld_lse], from the sequence's first query
  unsigned ld_lse;

  HK_DEVICE unsigned head(unsigned b) const { return first_head + b / blocks; }
  HK_DEVICE unsigned row0(unsigned b) const { return (first_block + b % blocks) * kRows; }
  // The LSE (base 2) and delta of query i of block b; 0 past the sequence (masked scores).
  HK_DEVICE float lse2_of(unsigned b, unsigned i) const {
    const unsigned row = row0(b) + i;
    return row < queries ? lse[static_cast<unsigned long long>(head(b)) * ld_lse + row] * hk::kLog2e : 0.0f;
  }
  HK_DEVICE float delta_of(unsigned b, unsigned i) const {
    const unsigned row = row0(b) + i;
    return row < queries ? delta[static_cast<unsigned long long>(head(b)) * ld_lse + row] : 0.0f;
  }
#if HK_NVIDIA
  HK_DEVICE void copy(unsigned b, Stage& to) const {
    hk::tile::copy_panels<kThreads>(to.q, q + head(b) * kD, queries, ldq, row0(b), vector);
    hk::tile::copy_panels<kThreads>(to.d_o, d_o + head(b) * kDv, queries, lddo, row0(b), vector);
    if constexpr (Stage::kStaged) {
      // Plain stores: the walk's barrier before this stage is read makes them visible.
      const unsigned i = hk::thread_idx_x();
      if (i < kRows) {
        to.lse2[i] = lse2_of(b, i);
        to.delta[i] = delta_of(b, i);
      }
    }
  }
#else
  hk::tile::StagedPanels<decltype(Stage::q), kThreads> next_q;
  hk::tile::StagedPanels<decltype(Stage::d_o), kThreads> next_do;
  HK_DEVICE void fetch(unsigned b) {
    next_q.fetch(q + head(b) * kD, queries, ldq, row0(b), vector);
    next_do.fetch(d_o + head(b) * kDv, queries, lddo, row0(b), vector);
  }
  HK_DEVICE void store(Stage& to) const {
    next_q.store(to.q);
    next_do.store(to.d_o);
  }
#endif
};

template <typename T, unsigned kD, unsigned kDv>
HK_DEVICE void attention_dkdv(T* __restrict__ dk, T* __restrict__ dv, unsigned lddk,
                              unsigned lddv, const T* __restrict__ q, const T* __restrict__ k,
                              const T* __restrict__ v, const T* __restrict__ d_o,
                              const Params& p) {
  using S = DkdvShapes<T, kD, kDv>;
  using Scores = hk::tile::RowScores<T, 1, kOthers>;
  constexpr unsigned kThreads = S::kThreads, kOwn = S::kOwn;
  constexpr unsigned kPartD = kD / S::kParts, kPartDv = kDv / S::kParts;
  typename S::Shared& shared = *hk::tile::stages<typename S::Shared, 1, HK_NVIDIA>();

  const unsigned b = hk::block_idx_z();
  const unsigned hk_ = hk::block_idx_y() / S::kParts, part = hk::block_idx_y() % S::kParts;
  const unsigned group = p.heads_q / p.heads_kv;
  const hk::tile::SequenceRows qs(p.cu_seqlens_q, b, p.total_q), ks(p.cu_seqlens_k, b, p.total_k);
  const unsigned long long k_first = ks.first;
  const T* kd = k + k_first * p.ldk + hk_ * kD;
  const T* vd = v + k_first * p.ldv + hk_ * kDv;
  const T* qd = q + static_cast<unsigned long long>(qs.first) * p.ldq;
  const T* dod = d_o + static_cast<unsigned long long>(qs.first) * p.lddo;
  const bool vector = hk::aligned16(qd, dod, kd, vd) && p.ldq % 8 == 0 && p.lddo % 8 == 0 &&
                      p.ldk % 8 == 0 && p.ldv % 8 == 0;
  const bool out_vector = hk::aligned16(dk, dv) && lddk % 8 == 0 && lddv % 8 == 0;
  const hk::tile::Visibility vis{static_cast<int>(qs.count), static_cast<int>(ks.count),
                                 p.window_left, p.causal ? 0 : p.window_right};
  const Logits logits(p);
  const unsigned wave = hk::wave_id();

  for (unsigned kb = hk::block_idx_x(); kb * kOwn < ks.count; kb += hk::grid_dim_x()) {
    const int k0 = kb * kOwn;
    const int k1 = k0 + kOwn < ks.count ? k0 + kOwn : ks.count;
    const int wk = k0 + 16 * wave;
    const int first = vis.first_query(k0), last = vis.last_query(k1 - 1);
    const unsigned qb_first = first / kOthers;
    const unsigned blocks = last > first ? (last + kOthers - 1) / kOthers - qb_first : 0;

    // Each own key's visible queries [lo, hi).
    int lo[Scores::kSlots], hi[Scores::kSlots];
#pragma unroll
    for (unsigned slot = 0; slot < Scores::kSlots; ++slot) {
      const int key = wk + Scores::row(slot);
      lo[slot] = key < k1 ? vis.first_query(key) : 0;
      hi[slot] = key < k1 ? vis.last_query(key) : 0;
    }

    hk::tile::RowSums<T, 1, kPartD> grad_k;
    hk::tile::RowSums<T, 1, kPartDv> grad_v;
    grad_k.zero();
    grad_v.zero();
    QueryCopies<typename S::Stage, kThreads, T> copies{
        qd,     dod,         p.ldq,  p.lddo, qs.count, hk_ * group, qb_first, blocks, vector,
        p.lse + qs.first, p.delta + qs.first, p.ld_lse};
    const auto multiply = [&](const typename S::Stage& st, unsigned blk) HK_INLINE {
      const int q0 = copies.row0(blk);
      // Unstaged, the block's statistics are read where a visible score needs them (only
      // queries of the sequence are visible).
      const unsigned long long stats = copies.head(blk) * static_cast<unsigned long long>(p.ld_lse) +
                                       qs.first + q0;
      const auto lse2 = [&](unsigned qi) HK_INLINE {
        if constexpr (S::Stage::kStaged) return st.lse2[qi];
        else return p.lse[stats + qi] * hk::kLog2e;
      };
      const auto delta = [&](unsigned qi) HK_INLINE {
        if constexpr (S::Stage::kStaged) return st.delta[qi];
        else return p.delta[stats + qi];
      };
      Scores ps;
      ps.template compute<kD>(shared.k, st.q, 16 * wave);
      ps.map([&](unsigned slot, unsigned, unsigned qi, float x) HK_INLINE {
        const int query = q0 + static_cast<int>(qi);
        const bool hidden = query < lo[slot] || query >= hi[slot];
        return hidden ? 0.0f : logits.probability(x, lse2(qi));
      });
      grad_v.add(ps, hk::tile::ColumnSlice<decltype(st.d_o)>{st.d_o, part * kPartDv});
      Scores dp;
      dp.template compute<kDv>(shared.v, st.d_o, 16 * wave);
      ps.map_with(dp, [&](unsigned, unsigned, unsigned qi, float pr, float g) HK_INLINE {
        if (pr == 0.0f) return 0.0f;
        return pr * (g - delta(qi)) * logits.slope(pr, lse2(qi));
      });
      grad_k.add(ps, hk::tile::ColumnSlice<decltype(st.q)>{st.q, part * kPartD});
    };
    if (blocks > 0) {
      hk::tile::copy_panels<kThreads>(shared.k, kd, ks.count, p.ldk, k0, vector);
      hk::tile::copy_panels<kThreads>(shared.v, vd, ks.count, p.ldv, k0, vector);
      hk::tile::walk_blocks(shared.stage, 0, group * blocks, vector, copies, multiply);
    }
    const unsigned long long row = k_first + wk;
    hk::tile::store_rows(grad_k, dk + row * lddk + hk_ * kD + part * kPartD, lddk, k1 - wk,
                         out_vector, p.scale);
    hk::tile::store_rows(grad_v, dv + row * lddv + hk_ * kDv + part * kPartDv, lddv, k1 - wk,
                         out_vector);
    // The next key block refills the tiles this one read.
    hk::block_sync();
  }
}

#if HK_SM90A
// sm_90a, d_qk = d_v = 128: dQ on wgmma, warp-specialised on hk/tile/pipeline.h's ring, as the
// forward's program (kernels/attention.hip) with dO beside Q and V beside K. A block takes 128
// queries of one head; warpgroup 0 produces: it copies the block's Q and dO once, then the
// blocks of kKeys keys they see (K's and V's rows) through the ring's stages. Warpgroups 1 and 2
// consume, 64 queries each (hk/tile/flash_wgmma.h's FlashQueryGrads), their LSE and delta in
// registers. A consumer frees a stage once its dQ product over it is done, and Q and dO once its
// last scores are.
template <typename T, unsigned kD> struct WgmmaDq {
  static constexpr unsigned kQueries = 128, kConsumers = 2, kKeys = 64;
  // Three stages of K and V: 32 KiB each at d = 128, beside Q's and dO's 64 KiB.
  static constexpr unsigned kStages = 3;
  // As the forward's producer: at 56 registers dQ at d = 128 spilled (88 leaves the consumers
  // 208).
  static constexpr unsigned kProducerRegisters = 88;
  using Warpgroup = hk::tile::FlashQueryGrads<T, kKeys, kD>;
  struct Stage {
    SharedPanels<T, kKeys, kD> k;
    SharedPanels<T, kKeys, kD> v;
  };
  using Ring = hk::tile::Ring<Stage, kStages, kConsumers, kProducerRegisters>;
  struct Shared {
    SharedPanels<T, kQueries, kD> q, d_o;
    Ring ring;
    hk::tile::Mbarrier own_full, own_empty;
  };
  static constexpr unsigned kThreads = Ring::kThreads;
  static constexpr unsigned kSharedBytes = sizeof(Shared) + 1024;  // + aligning to 1024
  static constexpr unsigned kLag = kStages - 2;  // as the forward's producer
};

// One query head of one sequence, as both roles of the dQ program see it.
template <typename T, unsigned kD> struct QueryHead {
  using F = WgmmaDq<T, kD>;
  hk::tile::SequenceRows qs, ks;
  unsigned h;
  const T *q, *d_o, *k, *v;  // the head's first query, dO, key and value
  bool vector;               // every row 16-byte aligned (cp.async)
  hk::tile::Visibility vis;

  HK_DEVICE QueryHead(const T* q_, const T* k_, const T* v_, const T* d_o_, const Params& p)
      : qs(p.cu_seqlens_q, hk::block_idx_z(), p.total_q),
        ks(p.cu_seqlens_k, hk::block_idx_z(), p.total_k),
        h(hk::block_idx_y()),
        q(q_ + static_cast<unsigned long long>(qs.first) * p.ldq + h * kD),
        d_o(d_o_ + static_cast<unsigned long long>(qs.first) * p.lddo + h * kD),
        k(k_ + static_cast<unsigned long long>(ks.first) * p.ldk + h / (p.heads_q / p.heads_kv) * kD),
        v(v_ + static_cast<unsigned long long>(ks.first) * p.ldv + h / (p.heads_q / p.heads_kv) * kD),
        vector(hk::aligned16(q, d_o, k, v) && p.ldq % 8 == 0 && p.lddo % 8 == 0 && p.ldk % 8 == 0 &&
               p.ldv % 8 == 0),
        vis{static_cast<int>(qs.count), static_cast<int>(ks.count), p.window_left,
            p.causal ? 0 : p.window_right} {}

  // The block's query blocks of kQueries: f(q0, q1, first, last) for queries [q0, q1) and the
  // key blocks [first, last) they see (empty when none). Blocks along x stride over the
  // sequence's query blocks.
  template <typename Fn> HK_DEVICE void for_each_query_block(Fn f) const {
    for (unsigned qb = hk::block_idx_x(); qb * F::kQueries < qs.count; qb += hk::grid_dim_x()) {
      const int q0 = qb * F::kQueries;
      const int q1 = q0 + F::kQueries < qs.count ? q0 + F::kQueries : qs.count;
      const int first = vis.first_key(q0), last = vis.last_key(q1);
      const unsigned kb_first = first / F::kKeys;
      f(q0, q1, kb_first, last > first ? (last + F::kKeys - 1) / F::kKeys : kb_first);
    }
  }
};

template <typename T, unsigned kD>
HK_DEVICE void produce_keys(typename WgmmaDq<T, kD>::Shared& sh, const QueryHead<T, kD>& head,
                            const Params& p) {
  using F = WgmmaDq<T, kD>;
  constexpr unsigned kThreads = hk::tile::kWarpgroupThreads;
  hk::tile::StageCursor<F::kStages> write, done;  // the step being copied, the next to publish
  unsigned steps = 0, blocks = 0;  // stages filled, and query blocks with keys, so far
  head.for_each_query_block([&](int q0, int, unsigned kb_first, unsigned kb_last) HK_INLINE {
    if (kb_first >= kb_last) return;
    // The consumers are done with the previous query block's Q and dO.
    if (blocks > 0) sh.own_empty.wait((blocks - 1) & 1);
    ++blocks;
    hk::tile::copy_panels<kThreads>(sh.q, head.q, head.qs.count, p.ldq, q0, head.vector);
    hk::tile::copy_panels<kThreads>(sh.d_o, head.d_o, head.qs.count, p.lddo, q0, head.vector);
    bool own_copied = false;
    const auto publish = [&]() HK_INLINE {
      // Q's and dO's copies joined the first stage's, so they landed with it.
      if (!own_copied) sh.own_full.arrive();
      own_copied = true;
      sh.ring.full[done.slot].arrive();
      done.advance();
    };
    const hk::tile::KeyValueCopies<typename F::Stage, kThreads, T> copies{
        head.k, head.v, head.ks.count, p.ldk, p.ldv, head.vector};
    unsigned in_flight = 0;
    for (unsigned kb = kb_first; kb < kb_last; ++kb, ++steps, write.advance()) {
      if (steps >= F::kStages) sh.ring.empty[write.slot].wait(write.phase ^ 1);
      copies.copy(kb, sh.ring.stage[write.slot]);
      if (head.vector) {
        hk::tile::async_commit();
        if (++in_flight > F::kLag) {
          hk::tile::async_wait<F::kLag>();
          hk::tile::fence_async_shared();
          publish();
          --in_flight;
        }
      } else {
        hk::tile::fence_async_shared();
        publish();
      }
    }
    hk::tile::async_wait<0>();
    hk::tile::fence_async_shared();
    for (; in_flight > 0; --in_flight) publish();
  });
}

template <typename T, unsigned kD>
HK_DEVICE void consume_keys(typename WgmmaDq<T, kD>::Shared& sh, const QueryHead<T, kD>& head,
                            T* __restrict__ dq, unsigned lddq, const Params& p, unsigned consumer) {
  using F = WgmmaDq<T, kD>;
  using W = typename F::Warpgroup;
  namespace wgmma = hk::tile::wgmma;
  const bool leader = hk::thread_idx_x() % hk::tile::kWarpgroupThreads == 0;
  const bool pairs = reinterpret_cast<unsigned long long>(dq) % 4 == 0 && lddq % 2 == 0;
  const Logits logits(p);
  hk::tile::StageCursor<F::kStages> read;
  unsigned blocks = 0;  // query blocks with keys so far
  head.for_each_query_block([&](int q0, int q1, unsigned kb_first, unsigned kb_last) HK_INLINE {
    const int wq = q0 + W::kRows * consumer;  // the warpgroup's first query
    W w;
    w.start();
    if (kb_first < kb_last) {
      // Each own query's LSE (base 2), delta and visible keys [lo, hi); none past the sequence.
      float lse2[W::kSlots], delta[W::kSlots];
      int lo[W::kSlots], hi[W::kSlots];
#pragma unroll
      for (unsigned slot = 0; slot < W::kSlots; ++slot) {
        const int query = wq + static_cast<int>(W::row(slot));
        const unsigned long long at =
            static_cast<unsigned long long>(head.h) * p.ld_lse + head.qs.first + query;
        const bool own = query < q1;
        lse2[slot] = own ? p.lse[at] * hk::kLog2e : 0.0f;
        delta[slot] = own ? p.delta[at] : 0.0f;
        lo[slot] = own ? head.vis.first_key(query) : 0;
        hi[slot] = own ? head.vis.last_key(query + 1) : 0;
      }
      sh.own_full.wait(blocks++ & 1);
      for (unsigned kb = kb_first; kb < kb_last; ++kb, read.advance()) {
        sh.ring.full[read.slot].wait(read.phase);
        const typename F::Stage& st = sh.ring.stage[read.slot];
        wgmma::fence();
        w.template scores<kD>(sh.q, sh.d_o, W::kRows * consumer, st.k, st.v);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(w.s);
        wgmma::pin(w.dp);
        if (leader && kb + 1 == kb_last) sh.own_empty.arrive();
        const int k0 = kb * F::kKeys;
        w.map([&](unsigned slot, unsigned kj, float x, float g) HK_INLINE {
          const int key = k0 + static_cast<int>(kj);
          const bool hidden = key < lo[slot] || key >= hi[slot];
          const float pr = hidden ? 0.0f : logits.probability(x, lse2[slot]);
          if (pr == 0.0f) return typename W::Gradient{0.0f, 0.0f};
          return typename W::Gradient{pr, pr * (g - delta[slot]) * logits.slope(pr, lse2[slot])};
        });
        w.accumulate(st.k);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(w.dq);
        // The stage's tiles were read by the products alone, which are done for every thread.
        if (leader) sh.ring.empty[read.slot].arrive();
      }
    }
    const unsigned long long row = head.qs.first + wq;
    hk::tile::store_accumulator<T, kD>(w.dq, dq + row * lddq + head.h * kD, lddq, q1 - wq, pairs,
                                       p.scale);
  });
}

template <typename T, unsigned kD>
HK_DEVICE void attention_dq_wgmma(T* __restrict__ dq, unsigned lddq, const T* __restrict__ q,
                                  const T* __restrict__ k, const T* __restrict__ v,
                                  const T* __restrict__ d_o, const Params& p) {
  using F = WgmmaDq<T, kD>;
  auto& sh = hk::tile::aligned_dynamic_shared<typename F::Shared>();
  const unsigned thread = hk::thread_idx_x();
  if (thread == 0) {
#pragma unroll
    for (unsigned s = 0; s < F::kStages; ++s) {
      sh.ring.full[s].init(hk::tile::kWarpgroupThreads);
      sh.ring.empty[s].init(F::kConsumers);
    }
    sh.own_full.init(hk::tile::kWarpgroupThreads);
    sh.own_empty.init(F::kConsumers);
    hk::tile::fence_barrier_init();
  }
  hk::block_sync();
  const QueryHead<T, kD> head(q, k, v, d_o, p);
  const unsigned role = thread / hk::tile::kWarpgroupThreads;
  if (role == 0) {
    hk::tile::as_producer<typename F::Ring>();
    produce_keys<T, kD>(sh, head, p);
  } else {
    hk::tile::as_consumer<typename F::Ring>();
    consume_keys<T, kD>(sh, head, dq, lddq, p, role - 1);
  }
}

// sm_90a, d_qk = d_v = 64: dK and dV on wgmma, warp-specialised on hk/tile/pipeline.h's ring.
// A block takes 128 keys of one key head; warpgroup 0 produces: it copies the block's K and V
// once, then, for each query head of the group in turn, the blocks of kQueries queries that see
// those keys (Q's and dO's rows, with their LSE and delta) through the ring's stages.
// Warpgroups 1 and 2 consume, 64 keys each (hk/tile/flash_wgmma.h's FlashKeyGrads). A
// consumer's threads free a stage once its dK and dV products over it are done, and K and V
// once its last scores are: the producer copies the next key block's then, while the consumers
// finish.
template <typename T, unsigned kD> struct WgmmaDkdv {
  static constexpr unsigned kKeys = 128, kConsumers = 2, kQueries = 64;
  // Three stages of Q and dO, 16 KiB each, beside K's and V's 32 KiB.
  static constexpr unsigned kStages = 3;
  // The producer's share: at 24 registers it spilled (56 leaves the consumers 224).
  static constexpr unsigned kProducerRegisters = 56;
  using Warpgroup = hk::tile::FlashKeyGrads<T, kQueries, kD>;
  struct Stage : QueryStats<false> {
    SharedPanels<T, kQueries, kD> q;
    SharedPanels<T, kQueries, kD> d_o;
  };
  using Ring = hk::tile::Ring<Stage, kStages, kConsumers, kProducerRegisters>;
  struct Shared {
    SharedPanels<T, kKeys, kD> k, v;
    Ring ring;
    // Each stage's queries' LSE (base 2) and delta.
    float lse2[kStages][kQueries], delta[kStages][kQueries];
    hk::tile::Mbarrier kv_full, kv_empty;
  };
  static constexpr unsigned kThreads = Ring::kThreads;
  static constexpr unsigned kSharedBytes = sizeof(Shared) + 1024;  // + aligning to 1024
  // As the forward's producer (kernels/attention.hip): copies stay in flight kStages - 2 blocks.
  static constexpr unsigned kLag = kStages - 2;
};

// One key head of one sequence, as both roles of the wgmma program see it.
template <typename T, unsigned kD> struct KeyHead {
  using F = WgmmaDkdv<T, kD>;
  hk::tile::SequenceRows qs, ks;
  unsigned h, group;  // the key head, and the query heads a key head serves
  const T *k, *v, *q, *d_o;  // the head's first key and value; the sequence's first query and dO
  bool vector;               // every row 16-byte aligned (cp.async)
  hk::tile::Visibility vis;

  HK_DEVICE KeyHead(const T* q_, const T* k_, const T* v_, const T* d_o_, const Params& p)
      : qs(p.cu_seqlens_q, hk::block_idx_z(), p.total_q),
        ks(p.cu_seqlens_k, hk::block_idx_z(), p.total_k),
        h(hk::block_idx_y()),
        group(p.heads_q / p.heads_kv),
        k(k_ + static_cast<unsigned long long>(ks.first) * p.ldk + h * kD),
        v(v_ + static_cast<unsigned long long>(ks.first) * p.ldv + h * kD),
        q(q_ + static_cast<unsigned long long>(qs.first) * p.ldq),
        d_o(d_o_ + static_cast<unsigned long long>(qs.first) * p.lddo),
        vector(hk::aligned16(q, d_o, k, v) && p.ldq % 8 == 0 && p.lddo % 8 == 0 && p.ldk % 8 == 0 &&
               p.ldv % 8 == 0),
        vis{static_cast<int>(qs.count), static_cast<int>(ks.count), p.window_left,
            p.causal ? 0 : p.window_right} {}

  // The block's key blocks of kKeys: f(k0, k1, copies) for keys [k0, k1) and the copies of the
  // query blocks that see them (copies.blocks of kQueries queries a query head of the group;
  // none when no query sees them). Blocks along x stride over the sequence's key blocks.
  template <typename Fn> HK_DEVICE void for_each_key_block(const Params& p, Fn f) const {
    for (unsigned kb = hk::block_idx_x(); kb * F::kKeys < ks.count; kb += hk::grid_dim_x()) {
      const int k0 = kb * F::kKeys;
      const int k1 = k0 + F::kKeys < ks.count ? k0 + F::kKeys : ks.count;
      const int first = vis.first_query(k0), last = vis.last_query(k1 - 1);
      const unsigned qb_first = first / F::kQueries;
      const unsigned blocks = last > first ? (last + F::kQueries - 1) / F::kQueries - qb_first : 0;
      const QueryCopies<typename F::Stage, hk::tile::kWarpgroupThreads, T> copies{
          q, d_o, p.ldq, p.lddo, qs.count, h * group, qb_first, blocks, vector,
          p.lse + qs.first, p.delta + qs.first, p.ld_lse};
      f(k0, k1, copies);
    }
  }
};

template <typename T, unsigned kD>
HK_DEVICE void produce_queries(typename WgmmaDkdv<T, kD>::Shared& sh, const KeyHead<T, kD>& head,
                               const Params& p) {
  using F = WgmmaDkdv<T, kD>;
  constexpr unsigned kThreads = hk::tile::kWarpgroupThreads;
  const unsigned thread = hk::thread_idx_x();
  hk::tile::StageCursor<F::kStages> write, done;  // the step being copied, the next to publish
  unsigned steps = 0, key_blocks = 0;  // stages filled, and key blocks with queries, so far
  head.for_each_key_block(p, [&](int k0, int, const auto& copies) HK_INLINE {
    const unsigned walked = head.group * copies.blocks;
    if (walked == 0) return;
    // The consumers are done with the previous key block's K and V.
    if (key_blocks > 0) sh.kv_empty.wait((key_blocks - 1) & 1);
    ++key_blocks;
    hk::tile::copy_panels<kThreads>(sh.k, head.k, head.ks.count, p.ldk, k0, head.vector);
    hk::tile::copy_panels<kThreads>(sh.v, head.v, head.ks.count, p.ldv, k0, head.vector);
    bool kv_copied = false;
    const auto publish = [&]() HK_INLINE {
      // K's and V's copies joined the first stage's, so they landed with it.
      if (!kv_copied) sh.kv_full.arrive();
      kv_copied = true;
      sh.ring.full[done.slot].arrive();
      done.advance();
    };
    unsigned in_flight = 0;
    for (unsigned b = 0; b < walked; ++b, ++steps, write.advance()) {
      if (steps >= F::kStages) sh.ring.empty[write.slot].wait(write.phase ^ 1);
      copies.copy(b, sh.ring.stage[write.slot]);
      if (thread < F::kQueries) {
        sh.lse2[write.slot][thread] = copies.lse2_of(b, thread);
        sh.delta[write.slot][thread] = copies.delta_of(b, thread);
      }
      if (head.vector) {
        hk::tile::async_commit();
        if (++in_flight > F::kLag) {
          hk::tile::async_wait<F::kLag>();
          hk::tile::fence_async_shared();
          publish();
          --in_flight;
        }
      } else {
        hk::tile::fence_async_shared();
        publish();
      }
    }
    hk::tile::async_wait<0>();
    hk::tile::fence_async_shared();
    for (; in_flight > 0; --in_flight) publish();
  });
}

template <typename T, unsigned kD>
HK_DEVICE void consume_queries(typename WgmmaDkdv<T, kD>::Shared& sh, const KeyHead<T, kD>& head,
                               T* __restrict__ dk, T* __restrict__ dv, unsigned lddk, unsigned lddv,
                               const Params& p, unsigned consumer) {
  using F = WgmmaDkdv<T, kD>;
  using W = typename F::Warpgroup;
  namespace wgmma = hk::tile::wgmma;
  const bool leader = hk::thread_idx_x() % hk::tile::kWarpgroupThreads == 0;
  const bool pairs = reinterpret_cast<unsigned long long>(dk) % 4 == 0 &&
                     reinterpret_cast<unsigned long long>(dv) % 4 == 0 && lddk % 2 == 0 &&
                     lddv % 2 == 0;
  const Logits logits(p);
  hk::tile::StageCursor<F::kStages> read;
  unsigned key_blocks = 0;  // key blocks with queries so far
  head.for_each_key_block(p, [&](int k0, int k1, const auto& copies) HK_INLINE {
    const int wk = k0 + W::kRows * consumer;  // the warpgroup's first key
    const unsigned walked = head.group * copies.blocks;
    W w;
    w.start();
    if (walked > 0) {
      // Each own key's visible queries [lo, hi); none for keys past the sequence.
      int lo[W::kSlots], hi[W::kSlots];
#pragma unroll
      for (unsigned slot = 0; slot < W::kSlots; ++slot) {
        const int key = wk + static_cast<int>(W::row(slot));
        lo[slot] = key < k1 ? head.vis.first_query(key) : 0;
        hi[slot] = key < k1 ? head.vis.last_query(key) : 0;
      }
      sh.kv_full.wait(key_blocks++ & 1);
      for (unsigned b = 0; b < walked; ++b, read.advance()) {
        sh.ring.full[read.slot].wait(read.phase);
        const typename F::Stage& st = sh.ring.stage[read.slot];
        wgmma::fence();
        w.template scores<kD>(sh.k, sh.v, W::kRows * consumer, st.q, st.d_o);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(w.s);
        wgmma::pin(w.dp);
        if (leader && b + 1 == walked) sh.kv_empty.arrive();
        const int q0 = copies.row0(b);
        const float* lse2 = sh.lse2[read.slot];
        const float* delta = sh.delta[read.slot];
        w.map([&](unsigned slot, unsigned qi, float x, float g) HK_INLINE {
          const int query = q0 + static_cast<int>(qi);
          const bool hidden = query < lo[slot] || query >= hi[slot];
          const float pr = hidden ? 0.0f : logits.probability(x, lse2[qi]);
          if (pr == 0.0f) return typename W::Gradient{0.0f, 0.0f};
          return typename W::Gradient{pr, pr * (g - delta[qi]) * logits.slope(pr, lse2[qi])};
        });
        w.accumulate(st.q, st.d_o);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(w.dk);
        wgmma::pin(w.dv);
        // Every thread read the stage's statistics, so every thread frees the stage (a
        // release of its own reads: one lane's arrival would not order the others').
        sh.ring.empty[read.slot].arrive();
      }
    }
    const unsigned long long row = head.ks.first + wk;
    hk::tile::store_accumulator<T, kD>(w.dk, dk + row * lddk + head.h * kD, lddk, k1 - wk, pairs,
                                       p.scale);
    hk::tile::store_accumulator<T, kD>(w.dv, dv + row * lddv + head.h * kD, lddv, k1 - wk, pairs);
  });
}

template <typename T, unsigned kD>
HK_DEVICE void attention_dkdv_wgmma(T* __restrict__ dk, T* __restrict__ dv, unsigned lddk,
                                    unsigned lddv, const T* __restrict__ q, const T* __restrict__ k,
                                    const T* __restrict__ v, const T* __restrict__ d_o,
                                    const Params& p) {
  using F = WgmmaDkdv<T, kD>;
  auto& sh = hk::tile::aligned_dynamic_shared<typename F::Shared>();
  const unsigned thread = hk::thread_idx_x();
  if (thread == 0) {
#pragma unroll
    for (unsigned s = 0; s < F::kStages; ++s) {
      sh.ring.full[s].init(hk::tile::kWarpgroupThreads);
      sh.ring.empty[s].init(F::kConsumers * hk::tile::kWarpgroupThreads);
    }
    sh.kv_full.init(hk::tile::kWarpgroupThreads);
    sh.kv_empty.init(F::kConsumers);
    hk::tile::fence_barrier_init();
  }
  hk::block_sync();
  const KeyHead<T, kD> head(q, k, v, d_o, p);
  const unsigned role = thread / hk::tile::kWarpgroupThreads;
  if (role == 0) {
    hk::tile::as_producer<typename F::Ring>();
    produce_queries<T, kD>(sh, head, p);
  } else {
    hk::tile::as_consumer<typename F::Ring>();
    consume_queries<T, kD>(sh, head, dk, dv, lddk, lddv, p, role - 1);
  }
}
#endif

// Which dQ program a kernel runs, and its block: the wgmma program where it pays (sm_90a,
// d_qk = d_v = 128), DqShapes' elsewhere. (At d = 64 the wgmma program made the H200's forward +
// backward 8 % slower than the 4-wave blocks, several of which share an SM: its products of
// 64 x 64 x 64 are too short to hide its waits with two consumers a block.)
template <typename T, unsigned kD, unsigned kDv> struct DqProgram {
  static constexpr bool kWgmma = HK_SM90A && kD == kDv && kD == 128;
#if HK_SM90A
  using Wgmma = WgmmaDq<T, kD>;
  static constexpr unsigned kThreads = kWgmma ? Wgmma::kThreads : threads(kD);
  static constexpr unsigned kShared = kWgmma ? Wgmma::kSharedBytes : sizeof(typename DqShapes<T, kD, kDv>::Shared);
  static constexpr unsigned kOwn = kWgmma ? Wgmma::kQueries : DqShapes<T, kD, kDv>::kOwn;
#else
  static constexpr unsigned kThreads = threads(kD);
  static constexpr unsigned kShared = sizeof(typename DqShapes<T, kD, kDv>::Shared);
  static constexpr unsigned kOwn = DqShapes<T, kD, kDv>::kOwn;
#endif
};

// Which dK/dV program a kernel runs, and its block: the wgmma program where it exists (sm_90a,
// d_qk = d_v = 64), DkdvShapes' elsewhere. (At d = 128 a consumer's dK, dV, Sᵀ and dPᵀ, 192
// sums a thread, spilled 100 to 190 registers with the producer at 56 or 24 registers.)
template <typename T, unsigned kD, unsigned kDv> struct DkdvProgram {
  static constexpr bool kWgmma = HK_SM90A && kD == kDv && kD <= 64;
#if HK_SM90A
  using Wgmma = WgmmaDkdv<T, kD>;
  static constexpr unsigned kThreads = kWgmma ? Wgmma::kThreads : threads(kD);
  static constexpr unsigned kShared = kWgmma ? Wgmma::kSharedBytes : sizeof(typename DkdvShapes<T, kD, kDv>::Shared);
  static constexpr unsigned kOwn = kWgmma ? Wgmma::kKeys : DkdvShapes<T, kD, kDv>::kOwn;
#else
  static constexpr unsigned kThreads = threads(kD);
  static constexpr unsigned kShared = sizeof(typename DkdvShapes<T, kD, kDv>::Shared);
  static constexpr unsigned kOwn = DkdvShapes<T, kD, kDv>::kOwn;
#endif
};

}  // namespace

#define HK_ATTN_BWD_DELTA(name, T)                                                            \
  HK_KERNEL HK_LAUNCH_BOUNDS(kDeltaThreads) void name(                                         \
      float* delta, const T* o, const T* d_o, unsigned total_q, unsigned heads_q,             \
      unsigned d_v, unsigned ldo, unsigned lddo, unsigned ld_delta) {                          \
    attention_delta<T>(delta, o, d_o, total_q, heads_q, d_v, ldo, lddo, ld_delta);            \
  }

#define HK_PARAMS                                                                              \
  Params {                                                                                     \
    lse, delta, cu_seqlens_q, cu_seqlens_k, total_q, total_k, heads_q, heads_kv, ldq, ldk,     \
        ldv, lddo, ld_lse, scale, softcap, causal, window_left, window_right                   \
  }
#define HK_COMMON_ARGS                                                                         \
  const float *lse, const float *delta, const int *cu_seqlens_q, const int *cu_seqlens_k,      \
      unsigned batch, unsigned total_q, unsigned total_k, unsigned max_seqlen, unsigned heads_q, \
      unsigned heads_kv, unsigned ldq, unsigned ldk, unsigned ldv, unsigned lddo,              \
      unsigned ld_lse, float scale, float softcap, unsigned causal, int window_left,           \
      int window_right

// What manifests/attention_backward.toml's contracts say of each pair, checked here: SHARED,
// the dynamic shared memory on NVIDIA (*_SHARED_90A that of an sm_90a wgmma program, where it
// runs); ROWS, the block's own rows (its block_rows; a wgmma program's 128); PARTS, the column
// parts grid y counts per head.
#if HK_SM90A
#define HK_ATTN_BWD_BOUNDS(Program, T, D, DV) HK_LAUNCH_BOUNDS_MIN_BLOCKS((Program<T, D, DV>::kThreads), 1)
#define HK_ATTN_DQ_WGMMA(T, D) attention_dq_wgmma<T, D>(dq, lddq, q, k, v, d_o, HK_PARAMS)
#define HK_ATTN_DKDV_WGMMA(T, D) attention_dkdv_wgmma<T, D>(dk, dv, lddk, lddv, q, k, v, d_o, HK_PARAMS)
#else
#define HK_ATTN_BWD_BOUNDS(Program, T, D, DV) HK_LAUNCH_BOUNDS((Program<T, D, DV>::kThreads))
#define HK_ATTN_DQ_WGMMA(T, D) (void)0
#define HK_ATTN_DKDV_WGMMA(T, D) (void)0
#endif
// Whether a Program's shared memory and rows are the manifest's.
#define HK_ATTN_BWD_CHECK(Program, SHARED, SHARED_90A, ROWS)                                     \
  static_assert(HK_AMD || (Program::kWgmma ? Program::kShared == (SHARED_90A)                   \
                                           : Program::kShared <= (SHARED)),                     \
                "manifests/attention_backward.toml gives other shared memory than this uses");  \
  static_assert(Program::kOwn == (Program::kWgmma ? 128 : (ROWS)),                              \
                "manifests/attention_backward.toml's grid counts other rows")
#define HK_ATTN_BWD(suffix, T, D, DV, DQ_SHARED, DQ_SHARED_90A, DKDV_SHARED, DKDV_SHARED_90A, ROWS, DQ_PARTS, \
                    DKDV_PARTS)                                                                 \
  HK_KERNEL HK_ATTN_BWD_BOUNDS(DqProgram, T, D, DV) void attn_bwd_dq_##suffix(                \
      T* dq, const T* q, const T* k, const T* v, const T* d_o, unsigned lddq, HK_COMMON_ARGS) { \
    using Program = DqProgram<T, D, DV>;                                                       \
    HK_ATTN_BWD_CHECK(Program, DQ_SHARED, DQ_SHARED_90A, ROWS);                                \
    static_assert(parts(D) == (DQ_PARTS), "manifests/attention_backward.toml's grid counts other parts"); \
    (void)batch;                                                                               \
    (void)max_seqlen;                                                                          \
    if constexpr (Program::kWgmma)                                                             \
      HK_ATTN_DQ_WGMMA(T, D);                                                                  \
    else                                                                                       \
      attention_dq<T, D, DV>(dq, lddq, q, k, v, d_o, HK_PARAMS);                               \
  }                                                                                            \
  HK_KERNEL HK_ATTN_BWD_BOUNDS(DkdvProgram, T, D, DV) void attn_bwd_dkdv_##suffix(            \
      T* dk, T* dv, const T* q, const T* k, const T* v, const T* d_o, unsigned lddk,           \
      unsigned lddv, HK_COMMON_ARGS) {                                                         \
    using Program = DkdvProgram<T, D, DV>;                                                     \
    HK_ATTN_BWD_CHECK(Program, DKDV_SHARED, DKDV_SHARED_90A, ROWS);                            \
    static_assert(DkdvShapes<T, D, DV>::kParts == (DKDV_PARTS),                                \
                  "manifests/attention_backward.toml's grid counts other parts");              \
    (void)batch;                                                                               \
    (void)max_seqlen;                                                                          \
    if constexpr (Program::kWgmma)                                                             \
      HK_ATTN_DKDV_WGMMA(T, D);                                                                \
    else                                                                                       \
      attention_dkdv<T, D, DV>(dk, dv, lddk, lddv, q, k, v, d_o, HK_PARAMS);                   \
  }

HK_ATTN_BWD_DELTA(attn_bwd_delta_bf16, hk::bf16)
HK_ATTN_BWD_DELTA(attn_bwd_delta_f16, hk::f16)
HK_ATTN_BWD(d64_bf16, hk::bf16, 64, 64, 32768, 0, 33280, 84544, 64, 1, 1)
HK_ATTN_BWD(d128_bf16, hk::bf16, 128, 128, 65536, 164928, 66048, 0, 64, 1, 1)
HK_ATTN_BWD(d256_bf16, hk::bf16, 256, 256, 131072, 0, 131584, 0, HK_AMD ? 32 : 64, 2, 4)
HK_ATTN_BWD(d192_dv128_bf16, hk::bf16, 192, 128, 81920, 0, 82432, 0, 64, 2, 2)
HK_ATTN_BWD(d64_f16, hk::f16, 64, 64, 32768, 0, 33280, 84544, 64, 1, 1)
HK_ATTN_BWD(d128_f16, hk::f16, 128, 128, 65536, 164928, 66048, 0, 64, 1, 1)
HK_ATTN_BWD(d256_f16, hk::f16, 256, 256, 131072, 0, 131584, 0, HK_AMD ? 32 : 64, 2, 4)
HK_ATTN_BWD(d192_dv128_f16, hk::f16, 192, 128, 81920, 0, 82432, 0, 64, 2, 2)
