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
// Two targets run other programs at d_qk = d_v <= 128: sm_90a a warp-specialised wgmma one,
// CDNA the 8-wave ping-pong (256 queries a block; PingPongForward below).
// Blocks along x stride over a sequence's query blocks, so any grid x is correct; the
// contract's covers the longest sequence once.
//
// Symbols: attn_fwd_d{64,128,256}_{bf16,f16} (d_qk = d_v) and attn_fwd_d192_dv128_{bf16,f16}
// (DeepSeek-V3's prefill). Launch: the contract in manifests/attention.toml.
#include "hk/hk.h"
#include "hk/tile/copy.h"
#include "hk/tile/flash.h"
#include "hk/tile/flash_wgmma.h"
#include "hk/tile/pingpong.h"
#include "hk/tile/pipeline.h"

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

// One query head of one sequence, as both programs see it: where its rows start, which keys its
// queries see, and how a score becomes a base-2 logit.
template <typename T, unsigned kD, unsigned kDv> struct Head {
  hk::tile::SequenceRows qs, ks;
  unsigned h;
  const T *q, *k, *v;  // the head's first query, key and value
  bool vector;         // Q, K and V rows 16-byte aligned (cp.async)
  hk::tile::Visibility vis;
  // Scores to base-2 logits: x · scale · log2(e), or through the soft-cap in natural units.
  bool capped;
  float pre, post;

  HK_DEVICE Head(const T* q_, const T* k_, const T* v_, const Params& p)
      : qs(p.cu_seqlens_q, hk::block_idx_z(), p.total_q),
        ks(p.cu_seqlens_k, hk::block_idx_z(), p.total_k),
        h(hk::block_idx_y()),
        q(q_ + static_cast<unsigned long long>(qs.first) * p.ldq + h * kD),
        k(k_ + static_cast<unsigned long long>(ks.first) * p.ldk + h / (p.heads_q / p.heads_kv) * kD),
        v(v_ + static_cast<unsigned long long>(ks.first) * p.ldv + h / (p.heads_q / p.heads_kv) * kDv),
        vector(hk::aligned16(q, k, v) && p.ldq % 8 == 0 && p.ldk % 8 == 0 && p.ldv % 8 == 0),
        vis{static_cast<int>(qs.count), static_cast<int>(ks.count), p.window_left,
            p.causal ? 0 : p.window_right},
        capped(p.softcap > 0.0f),
        pre(capped ? p.scale / p.softcap : p.scale * hk::kLog2e),
        post(p.softcap * hk::kLog2e) {}

  // The block's query blocks of kQueries, each with the blocks of kKeys keys its queries may
  // see: f(q0, q1, first, last) for queries [q0, q1) and key blocks [first, last) (empty when
  // they see none). Blocks along x stride over the sequence's query blocks.
  template <unsigned kQueries, unsigned kKeys, typename F> HK_DEVICE void for_each_query_block(F f) const {
    for (unsigned qb = hk::block_idx_x(); qb * kQueries < qs.count; qb += hk::grid_dim_x()) {
      const int q0 = qb * kQueries;
      const int q1 = q0 + kQueries < qs.count ? q0 + kQueries : qs.count;
      const int first = vis.first_key(q0), last = vis.last_key(q1);
      const unsigned kb_first = first / kKeys;
      f(q0, q1, kb_first, last > first ? (last + kKeys - 1) / kKeys : kb_first);
    }
  }

  // Scales and masks a block of scores: map(g) calls g(slot, key, x) for each score x of the
  // caller's (key within the block, the block's first key k0) and stores what g returns; keys
  // [lo[slot], hi[slot]) of the block are visible to the slot's query, set from the queries
  // (query(slot), counted from the sequence's start) unless every query of [q0, q1) sees every
  // key of the block.
  template <unsigned kKeys, unsigned kSlots, typename Query, typename Map>
  HK_DEVICE void logits(int q0, int q1, int k0, Query query, Map map) const {
    const bool all = vis.all_visible(q0, q1, k0, k0 + kKeys);
    // Each query's visible keys [lo, hi) of the block: two bounds a query rather than a test
    // of both positions a score (which held a register a score).
    int lo[kSlots], hi[kSlots];
#pragma unroll
    for (unsigned slot = 0; slot < kSlots; ++slot) {
      lo[slot] = all ? 0 : vis.first_key(query(slot)) - k0;
      hi[slot] = all ? kKeys : vis.last_key(query(slot) + 1) - k0;
    }
    const auto masked = [&](auto logit) HK_INLINE {
      map([&](unsigned slot, unsigned kj, float x) HK_INLINE {
        const bool hidden = static_cast<int>(kj) < lo[slot] || static_cast<int>(kj) >= hi[slot];
        return hidden ? -__builtin_inff() : logit(x);
      });
    };
    // Two loops rather than a choice a score, which held both paths' registers at once.
    if (capped)
      masked([&](float x) HK_INLINE { return post * hk::tanh(pre * x); });
    else
      masked([&](float x) HK_INLINE { return pre * x; });
  }
};

template <typename T, unsigned kD, unsigned kDv>
HK_DEVICE void attention_forward(T* __restrict__ o, float* __restrict__ lse, const T* __restrict__ q,
                                 const T* __restrict__ k, const T* __restrict__ v, const Params& p) {
  using F = Forward<T, kD, kDv>;
  constexpr unsigned kKeys = F::kKeys, kQueries = F::kQueries;
  typename F::Shared& shared = *hk::tile::stages<typename F::Shared, 1, HK_NVIDIA>();
  const Head<T, kD, kDv> head(q, k, v, p);
  const bool o_vector = hk::aligned16(o) && p.ldo % 8 == 0;

  const unsigned wave = hk::wave_id();
  head.template for_each_query_block<kQueries, kKeys>([&](int q0, int q1, unsigned kb_first,
                                                          unsigned kb_last) HK_INLINE {
    const int wq = q0 + F::Wave::kQueries * wave;
    typename F::Wave w;
    w.start();
    const auto multiply = [&](const typename F::Stage& st, unsigned kb) HK_INLINE {
      w.score(shared.q, st.k, F::Wave::kQueries * wave);
      head.template logits<kKeys, F::Wave::kSlots>(
          q0, q1, kb * kKeys, [&](unsigned slot) HK_INLINE { return wq + static_cast<int>(F::Wave::row(slot)); },
          [&](auto g) HK_INLINE {
            w.s.map([&](unsigned slot, unsigned, unsigned kj, float x) HK_INLINE { return g(slot, kj, x); });
          });
      w.softmax();
      w.accumulate(st.v);
    };

    if (kb_first < kb_last) {
      // Q's block lands with the first block of keys (NVIDIA), or now (AMD).
      hk::tile::copy_panels<F::kThreads>(shared.q, head.q, head.qs.count, p.ldq, q0, head.vector);
      hk::tile::KeyValueCopies<typename F::Stage, F::kThreads, T> copies{
          head.k, head.v, head.ks.count, p.ldk, p.ldv, head.vector};
      hk::tile::walk_blocks(shared.stage, kb_first, kb_last, head.vector, copies, multiply);
    }

    float row_lse[F::Wave::kSlots];
    w.finish(row_lse);
    hk::tile::store_rows(w.o, o + static_cast<unsigned long long>(head.qs.first + wq) * p.ldo + head.h * kDv,
                         p.ldo, q1 - wq, o_vector);
#pragma unroll
    for (unsigned slot = 0; slot < F::Wave::kSlots; ++slot) {
      const unsigned qi = F::Wave::row(slot);
      // One lane of those that share the query writes its log-sum-exp.
      if (F::Wave::first_of_row() && wq + static_cast<int>(qi) < q1)
        lse[static_cast<unsigned long long>(head.h) * p.ld_lse + head.qs.first + wq + qi] = row_lse[slot];
    }
    // The next query block refills the tiles this one read.
    hk::block_sync();
  });
}

#if HK_AMD
// CDNA, d_qk = d_v <= 128: hk/tile/pingpong.h's 8-wave ping-pong. 256 queries a block, 32 a
// wave (their outputs, the queries' operands and a block's keys and values fit the 256
// registers a wave has at two waves a SIMD); blocks of 32 keys through two LDS stages, K's
// copied by the leading group of waves and V's by the trailing one, through registers a block
// ahead. V lands transposed, Vᵀ [d][key], so that P·V's operands are 8-byte LDS reads as the
// scores' are (from V [key][d] they took 2-byte reads and twice the VALU of the softmax in
// addresses, the memory cluster three times the matrix one). Per block of keys a wave runs four
// clusters, each ending at the block barrier:
//   memory  store the next block's K or Vᵀ (its group's) into the other stage, start the loads
//           of the block after it, read this block's key operands;
//   matrix  S = Q·Kᵀ;
//   memory  mask and scale, the online softmax, P's operands, read the value operands;
//   matrix  O += P·V.
// The trailing group runs one cluster behind, so one wave of each SIMD multiplies while the
// other works through memory and the softmax. Why two stages: a block's keys are read a cluster
// ahead of its values and the groups run a cluster apart, so a block's stage is in use over four
// phases; the next block's copies land in the other stage meanwhile. gfx950 takes the same
// 32 KiB (d = 128) of its 160: more stages would pay only with a deeper prefetch, and deeper
// than one block ahead through registers does not fit a wave's 256; loads straight to LDS
// (gfx950's global_load_lds_dwordx4) would, but the CDNA emulator that checks this code cannot
// run them.
template <typename T, unsigned kD> struct PingPongForward {
  using Schedule = hk::tile::PingPong;
  static constexpr unsigned kQueryTiles = 2;
  static constexpr unsigned kQueries = 16 * kQueryTiles * Schedule::kWaves;
  static constexpr unsigned kKeys = 32;
  static constexpr unsigned kStages = 2;
  static constexpr unsigned kThreads = Schedule::kThreads;
  using Wave = hk::tile::RegisterFlashWave<T, kQueryTiles, kKeys, kD, kD>;
  using Tile = SharedPanels<T, kKeys, kD>;              // a block's K, and V as loaded
  using Transposed = hk::tile::SharedTile<T, kD, kKeys>;  // a block's Vᵀ
  struct Shared {
    Tile k[kStages];
    Transposed vt[kStages];
  };
};

template <typename T, unsigned kD>
HK_DEVICE void attention_forward_pingpong(T* __restrict__ o, float* __restrict__ lse,
                                          const T* __restrict__ q, const T* __restrict__ k,
                                          const T* __restrict__ v, const Params& p) {
  using F = PingPongForward<T, kD>;
  using Schedule = typename F::Schedule;
  constexpr unsigned kKeys = F::kKeys, kQueries = F::kQueries;
  typename F::Shared& shared = *hk::tile::stages<typename F::Shared, 1, false>();
  const Head<T, kD, kD> head(q, k, v, p);
  const bool o_vector = hk::aligned16(o) && p.ldo % 8 == 0;

  const unsigned wave = hk::wave_id(), thread = Schedule::group_thread();
  // The group's share of the copies: the leading group K's tiles, the trailing one V's.
  const bool copies_k = Schedule::group() == 0;
  const T* rows = copies_k ? head.k : head.v;
  const unsigned ld = copies_k ? p.ldk : p.ldv;

  head.template for_each_query_block<kQueries, kKeys>([&](int q0, int q1, unsigned kb_first,
                                                          unsigned kb_last) HK_INLINE {
    const int wq = q0 + F::Wave::kQueries * wave;
    typename F::Wave w;
    w.start();
    if (kb_first < kb_last) {
      w.load_queries(hk::tile::GlobalMatrix<T>{head.q, head.qs.count, kD, p.ldq}, wq, head.vector);
      hk::tile::StagedPanels<typename F::Tile, Schedule::kGroupThreads> next;
      const auto fetch = [&](unsigned kb) HK_INLINE {
        next.fetch(rows, head.ks.count, ld, kb * kKeys, head.vector, thread);
      };
      const auto store = [&](unsigned stage) HK_INLINE {
        if (copies_k)
          next.store(shared.k[stage], thread);
        else
          next.store_transposed(shared.vt[stage], thread);
      };
      fetch(kb_first);
      store(0);
      Schedule::loads_landed();  // the queries' operands, before the next block's loads start
      if (kb_first + 1 < kb_last) fetch(kb_first + 1);
      Schedule::phase_end();
      Schedule::start();
      for (unsigned kb = kb_first; kb < kb_last; ++kb) {
        const unsigned now = (kb - kb_first) % F::kStages;
        Schedule::memory([&]() HK_INLINE {
          if (kb + 1 < kb_last) {
            store(1 - now);
            if (kb + 2 < kb_last) fetch(kb + 2);
          }
          w.read_keys(shared.k[now]);
        });
        Schedule::matrix([&]() HK_INLINE { w.score(); });
        Schedule::memory([&]() HK_INLINE {
          head.template logits<kKeys, F::Wave::kSlots>(
              q0, q1, kb * kKeys, [&](unsigned slot) HK_INLINE { return wq + static_cast<int>(F::Wave::row(slot)); },
              [&](auto g) HK_INLINE {
                w.s.map([&](unsigned slot, unsigned, unsigned kj, float x) HK_INLINE { return g(slot, kj, x); });
              });
          w.softmax();
          w.read_values(shared.vt[now]);
        });
        Schedule::matrix([&]() HK_INLINE { w.accumulate(); });
      }
      Schedule::finish();
    }

    float row_lse[F::Wave::kSlots];
    w.finish(row_lse);
    hk::tile::store_rows(w.o, o + static_cast<unsigned long long>(head.qs.first + wq) * p.ldo + head.h * kD,
                         p.ldo, q1 - wq, o_vector);
#pragma unroll
    for (unsigned slot = 0; slot < F::Wave::kSlots; ++slot) {
      const unsigned qi = F::Wave::row(slot);
      if (F::Wave::first_of_row() && wq + static_cast<int>(qi) < q1)
        lse[static_cast<unsigned long long>(head.h) * p.ld_lse + head.qs.first + wq + qi] = row_lse[slot];
    }
  });
}
#endif

#if HK_SM90A
// sm_90a, d_qk = d_v <= 128: a warp-specialised wgmma program on hk/tile/pipeline.h's ring.
// Blocks of 128 queries as on the other targets; warpgroup 0 produces, copying each query
// block's Q once and its blocks of kKeys keys through the ring's stages (cp.async, or element
// copies for unaligned rows); warpgroups 1 and 2 consume, 64 queries each
// (hk/tile/flash_wgmma.h): S = Q·Kᵀ, the online softmax, O += P·V. A consumer frees a stage once
// its P·V product is done, and Q once its last scores are: the producer copies the next query
// block's Q then, while the consumers finish.
// The two consumers take turns to issue their scores (hk::tile::ConsumerTurns), so one's softmax
// runs while the other's products occupy the tensor cores.
template <typename T, unsigned kD> struct WgmmaForward {
  static constexpr unsigned kQueries = 128, kConsumers = 2;
  // Keys a block: 128, or 96 at d = 128, whose 64 output sums beside 64 scores a thread spilled
  // (ptxas compiles the consumers within the launch's 168 registers).
  static constexpr unsigned kKeys = kD <= 64 ? 128 : 96;
  // Three stages of K and V: 48 KiB each at d = 128 (beside Q's 32 KiB), 32 KiB at d = 64.
  static constexpr unsigned kStages = 3;
  // The producer walks query blocks and keeps a head's views and three copy walks (Q, K, V):
  // at 40 to 72 registers ptxas spilled (88 leaves the consumers 208).
  static constexpr unsigned kProducerRegisters = 88;
  using Warpgroup = hk::tile::FlashWarpgroup<T, kKeys, kD, kD>;
  struct Stage {
    SharedPanels<T, kKeys, kD> k;
    SharedPanels<T, kKeys, kD> v;
  };
  using Ring = hk::tile::Ring<Stage, kStages, kConsumers, kProducerRegisters>;
  struct Shared {
    SharedPanels<T, kQueries, kD> q;
    Ring ring;
    hk::tile::Mbarrier q_full, q_empty;
  };
  static constexpr unsigned kThreads = Ring::kThreads;
  static constexpr unsigned kSharedBytes = sizeof(Shared) + 1024;  // + aligning to 1024
  // Blocks a producer thread's copies may stay in flight behind before it waits for them and
  // publishes: kStages - 2 at most, or producer and consumers wait for each other (the rule
  // of hk/tile/pipeline.h's producer).
  static constexpr unsigned kLag = kStages - 2;
};

template <typename T, unsigned kD>
HK_DEVICE void produce_keys(typename WgmmaForward<T, kD>::Shared& sh, const Head<T, kD, kD>& head,
                            const Params& p) {
  using F = WgmmaForward<T, kD>;
  constexpr unsigned kThreads = hk::tile::kWarpgroupThreads;
  hk::tile::StageCursor<F::kStages> write, done;  // the step being copied, the next to publish
  unsigned steps = 0, blocks = 0;  // stages filled, and query blocks with keys, so far
  head.template for_each_query_block<F::kQueries, F::kKeys>([&](int q0, int, unsigned kb_first,
                                                                unsigned kb_last) HK_INLINE {
    if (kb_first >= kb_last) return;
    // The consumers are done with the previous query block's Q (its copies published: below).
    if (blocks > 0) sh.q_empty.wait((blocks - 1) & 1);
    ++blocks;
    hk::tile::copy_panels<kThreads>(sh.q, head.q, head.qs.count, p.ldq, q0, head.vector);
    bool q_copied = false;
    const auto publish = [&]() HK_INLINE {
      // Q's copies joined the first stage's, so they landed with it.
      if (!q_copied) sh.q_full.arrive();
      q_copied = true;
      sh.ring.full[done.slot].arrive();
      done.advance();
    };
    hk::tile::KeyValueCopies<typename F::Stage, kThreads, T> copies{
        head.k, head.v, head.ks.count, p.ldk, p.ldv, head.vector};
    unsigned in_flight = 0;
    for (unsigned kb = kb_first; kb < kb_last; ++kb, ++steps, write.advance()) {
      // From the second round on, the stage's previous block must have been consumed.
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
    // The query block's last stages, so that the consumers can finish with its Q.
    hk::tile::async_wait<0>();
    hk::tile::fence_async_shared();
    for (; in_flight > 0; --in_flight) publish();
  });
}

template <typename T, unsigned kD>
HK_DEVICE void consume_keys(typename WgmmaForward<T, kD>::Shared& sh, const Head<T, kD, kD>& head,
                            T* __restrict__ o, float* __restrict__ lse, const Params& p,
                            unsigned consumer) {
  using F = WgmmaForward<T, kD>;
  using W = typename F::Warpgroup;
  namespace wgmma = hk::tile::wgmma;
  const bool leader = hk::thread_idx_x() % hk::tile::kWarpgroupThreads == 0;
  const bool pairs = reinterpret_cast<unsigned long long>(o) % 4 == 0 && p.ldo % 2 == 0;
  hk::tile::StageCursor<F::kStages> read;
  unsigned blocks = 0;  // query blocks with keys so far
  // The consumers take turns to issue their scores, so one's softmax runs under the other's.
  const hk::tile::ConsumerTurns turns(consumer);
  head.template for_each_query_block<F::kQueries, F::kKeys>([&](int q0, int q1, unsigned kb_first,
                                                                unsigned kb_last) HK_INLINE {
    const int wq = q0 + W::kRows * consumer;  // the warpgroup's first query
    W w;
    w.start();
    if (kb_first < kb_last) {
      sh.q_full.wait(blocks++ & 1);
      for (unsigned kb = kb_first; kb < kb_last; ++kb, read.advance()) {
        sh.ring.full[read.slot].wait(read.phase);
        const typename F::Stage& st = sh.ring.stage[read.slot];
        turns.wait();
        wgmma::fence();
        w.score(sh.q, W::kRows * consumer, st.k);
        wgmma::commit();
        turns.pass();
        wgmma::wait<0>();
        wgmma::pin(w.s);
        if (leader && kb + 1 == kb_last) sh.q_empty.arrive();
        head.template logits<F::kKeys, W::kSlots>(
            q0, q1, kb * F::kKeys, [&](unsigned slot) HK_INLINE { return wq + static_cast<int>(W::row(slot)); },
            [&](auto g) HK_INLINE { w.map(g); });
        w.softmax();
        w.accumulate(st.v);
        wgmma::commit();
        // Waited for at once: P's registers stay in use until the product is done, and beside
        // the next block's scores and O they would not fit (ptxas spilled).
        wgmma::wait<0>();
        wgmma::pin(w.o);
        if (leader) sh.ring.empty[read.slot].arrive();
      }
    }
    float row_lse[W::kSlots];
    w.finish(row_lse);
    w.store(o + static_cast<unsigned long long>(head.qs.first + wq) * p.ldo + head.h * kD, p.ldo,
            q1 - wq, pairs);
#pragma unroll
    for (unsigned slot = 0; slot < W::kSlots; ++slot) {
      const int qi = wq + static_cast<int>(W::row(slot));
      if (W::first_of_row() && qi < q1)
        lse[static_cast<unsigned long long>(head.h) * p.ld_lse + head.qs.first + qi] = row_lse[slot];
    }
  });
  turns.finish();
}

template <typename T, unsigned kD>
HK_DEVICE void attention_forward_wgmma(T* __restrict__ o, float* __restrict__ lse,
                                       const T* __restrict__ q, const T* __restrict__ k,
                                       const T* __restrict__ v, const Params& p) {
  using F = WgmmaForward<T, kD>;
  auto& sh = hk::tile::aligned_dynamic_shared<typename F::Shared>();
  const unsigned thread = hk::thread_idx_x();
  if (thread == 0) {
#pragma unroll
    for (unsigned s = 0; s < F::kStages; ++s) {
      sh.ring.full[s].init(hk::tile::kWarpgroupThreads);
      sh.ring.empty[s].init(F::kConsumers);
    }
    sh.q_full.init(hk::tile::kWarpgroupThreads);
    sh.q_empty.init(F::kConsumers);
    hk::tile::fence_barrier_init();
  }
  hk::block_sync();
  const Head<T, kD, kD> head(q, k, v, p);
  const unsigned role = thread / hk::tile::kWarpgroupThreads;
  if (role == 0) {
    hk::tile::as_producer<typename F::Ring>();
    produce_keys<T, kD>(sh, head, p);
  } else {
    hk::tile::as_consumer<typename F::Ring>();
    consume_keys<T, kD>(sh, head, o, lse, p, role - 1);
  }
}
#endif

// Which program a kernel runs, and its block: the wgmma program where it exists (sm_90a,
// d_qk = d_v <= 128), the ping-pong on CDNA at d_qk = d_v <= 128, Forward's elsewhere.
// (d = 192 and 256 keep Forward on CDNA: at two waves a SIMD their outputs and operands would
// not fit a wave's 256 registers, nor two stages of their K and V beside nothing else in 64 KiB
// of LDS.)
template <typename T, unsigned kD, unsigned kDv> struct Program {
  static constexpr bool kWgmma = HK_SM90A && kD == kDv && kD <= 128;
  static constexpr bool kPingPong = HK_AMD && kD == kDv && kD <= 128;
#if HK_SM90A
  using Wgmma = WgmmaForward<T, kD>;
  static constexpr unsigned kThreads = kWgmma ? Wgmma::kThreads : kForwardThreads;
  static constexpr unsigned kShared = kWgmma ? Wgmma::kSharedBytes : sizeof(typename Forward<T, kD, kDv>::Shared);
  static constexpr unsigned kQueries = kWgmma ? Wgmma::kQueries : Forward<T, kD, kDv>::kQueries;
#elif HK_AMD
  using PingPong = PingPongForward<T, kD>;
  static constexpr unsigned kThreads = kPingPong ? PingPong::kThreads : kForwardThreads;
  static constexpr unsigned kShared =
      kPingPong ? sizeof(typename PingPong::Shared) : sizeof(typename Forward<T, kD, kDv>::Shared);
  static constexpr unsigned kQueries = kPingPong ? PingPong::kQueries : Forward<T, kD, kDv>::kQueries;
#else
  static constexpr unsigned kThreads = kForwardThreads;
  static constexpr unsigned kShared = sizeof(typename Forward<T, kD, kDv>::Shared);
  static constexpr unsigned kQueries = Forward<T, kD, kDv>::kQueries;
#endif
};

}  // namespace

// The kernels: 4 waves, or on sm_90a the wgmma program's three warpgroups, one block an SM, or
// on CDNA the ping-pong's 8 waves.
#if HK_SM90A
#define HK_ATTN_FWD_BOUNDS(T, D, DV) HK_LAUNCH_BOUNDS_MIN_BLOCKS((Program<T, D, DV>::kThreads), 1)
#elif HK_AMD
#define HK_ATTN_FWD_BOUNDS(T, D, DV) HK_LAUNCH_BOUNDS((Program<T, D, DV>::kThreads))
#else
#define HK_ATTN_FWD_BOUNDS(T, D, DV) HK_LAUNCH_BOUNDS(kForwardThreads)
#endif
#define HK_ATTN_FWD(name, T, D, DV, SHARED, SHARED_90A, QUERIES, AMD_QUERIES, AMD_THREADS)       \
  HK_KERNEL HK_ATTN_FWD_BOUNDS(T, D, DV) void name(                                                  \
      T* o, float* lse, const T* q, const T* k, const T* v, const int* cu_seqlens_q,              \
      const int* cu_seqlens_k, unsigned batch, unsigned total_q, unsigned total_k,               \
      unsigned max_seqlen_q, unsigned heads_q, unsigned heads_kv, unsigned ldq, unsigned ldk,    \
      unsigned ldv, unsigned ldo, unsigned ld_lse, float scale, float softcap, unsigned causal,   \
      int window_left, int window_right) {                                                        \
    static_assert(HK_AMD || (Program<T, D, DV>::kWgmma ? Program<T, D, DV>::kShared == SHARED_90A \
                                                       : Program<T, D, DV>::kShared <= SHARED),   \
                  "manifests/attention.toml gives this kernel other shared memory than it uses"); \
    static_assert((HK_AMD ? (AMD_QUERIES) : (QUERIES)) % Program<T, D, DV>::kQueries == 0,         \
                  "manifests/attention.toml's grid counts blocks of other queries");              \
    static_assert(!HK_AMD || Program<T, D, DV>::kThreads == (AMD_THREADS),                        \
                  "manifests/attention.toml gives this kernel another block on AMD");            \
    (void)batch;                                                                                  \
    (void)max_seqlen_q;                                                                           \
    const Params p{cu_seqlens_q, cu_seqlens_k, total_q, total_k, heads_q, heads_kv, ldq, ldk,     \
                   ldv, ldo, ld_lse, scale, softcap, causal, window_left, window_right};          \
    if constexpr (Program<T, D, DV>::kWgmma)                                                      \
      HK_ATTN_FWD_WGMMA(T, D);                                                                    \
    else if constexpr (Program<T, D, DV>::kPingPong)                                              \
      HK_ATTN_FWD_PINGPONG(T, D);                                                                 \
    else                                                                                          \
      attention_forward<T, D, DV>(o, lse, q, k, v, p);                                            \
  }
#if HK_SM90A
#define HK_ATTN_FWD_WGMMA(T, D) attention_forward_wgmma<T, D>(o, lse, q, k, v, p)
#else
#define HK_ATTN_FWD_WGMMA(T, D) (void)0
#endif
#if HK_AMD
#define HK_ATTN_FWD_PINGPONG(T, D) attention_forward_pingpong<T, D>(o, lse, q, k, v, p)
#else
#define HK_ATTN_FWD_PINGPONG(T, D) (void)0
#endif

// The manifest's dimensions (shared memory on NVIDIA, queries a block, and on AMD queries and
// threads a block) are checked at compile time against each program's.
HK_ATTN_FWD(attn_fwd_d64_bf16, hk::bf16, 64, 64, 32768, 115776, 128, 256, 512)
HK_ATTN_FWD(attn_fwd_d128_bf16, hk::bf16, 128, 128, 65536, 181312, 128, 256, 512)
HK_ATTN_FWD(attn_fwd_d256_bf16, hk::bf16, 256, 256, 98304, 98304, 64, 64, 256)
HK_ATTN_FWD(attn_fwd_d192_dv128_bf16, hk::bf16, 192, 128, 65536, 65536, 64, 64, 256)
HK_ATTN_FWD(attn_fwd_d64_f16, hk::f16, 64, 64, 32768, 115776, 128, 256, 512)
HK_ATTN_FWD(attn_fwd_d128_f16, hk::f16, 128, 128, 65536, 181312, 128, 256, 512)
HK_ATTN_FWD(attn_fwd_d256_f16, hk::f16, 256, 256, 98304, 98304, 64, 64, 256)
HK_ATTN_FWD(attn_fwd_d192_dv128_f16, hk::f16, 192, 128, 65536, 65536, 64, 64, 256)
