// Mixture-of-experts routing: for each token, which experts it goes to (topk_ids, int32
// [tokens, k]) and with what weight (topk_weights, f32 [tokens, k]), from the router's logits
// [tokens, experts] (row `t` at logits + t * ld).
//
// Symbols:
//   topk_softmax_{bf16,f16,f32}(topk_weights, topk_ids, logits, tokens, experts, ld, k,
//                               renormalize)
//     The k experts of the largest logits (softmax is monotone, so these are the k largest
//     probabilities), each weighted by its softmax probability over all experts, or with
//     renormalize = 1 by exp(logit - max) over the sum of the k chosen ones' (the chosen
//     probabilities rescaled to sum 1).
//   grouped_topk_{bf16,f16,f32}(topk_weights, topk_ids, logits, bias, tokens, experts, ld,
//                               n_group, topk_group, k, routed_scaling_factor)
//     DeepSeek-V3's routing: score = sigmoid(logit); choice = score + bias[e] (f32 [experts]),
//     used for choosing only; the experts fall into n_group groups of experts / n_group
//     consecutive ones, a group's value is the sum of its two largest choices, the topk_group
//     groups of largest value are kept, and the k experts of largest choice among them are
//     chosen; each is weighted by its score (without bias) over the sum of the k chosen scores,
//     times routed_scaling_factor.
//   Both write the k experts in descending order of what chose them (logit; choice), and break
//   every tie (equal logits, equal choices, equal group values) towards the lower expert or
//   group index, on every target alike: candidates are compared as one integer made of the
//   value's order-preserving bits and the inverted index. -0 counts as +0. Logits must not be
//   NaN (the choice among NaNs is not specified).
//
// Limits: 1 <= experts <= kMaxExperts (256), 1 <= k <= min(experts, kMaxK = 16); grouped:
// n_group <= kMaxGroups (32) dividing experts into groups of at least 2, topk_group <=
// n_group, k <= topk_group * (experts / n_group). The contract (manifests/moe_routing.toml)
// refuses anything else; a launch outside them writes nothing.
//
// Launch: one wave (warp) per token, kBlock threads a block, blocks striding over the tokens.
// Lane l holds experts l, l + wave, l + 2 wave, ... (coalesced loads); the k winners come from
// k wave-wide maximum reductions over those candidates, each removing its winner. A routing
// call sees few tokens (decode) and few experts, so one wave a token keeps every reduction
// inside a wave, with no block barriers at all.
#include "hk/hk.h"
#include "hk/vote.h"

namespace {

constexpr unsigned kBlock = 256;
constexpr unsigned kWaves = kBlock / hk::kWaveSize;
constexpr unsigned kMaxExperts = 256;
constexpr unsigned kMaxK = 16;
// One group per lane when ranking groups: a warp has 32.
constexpr unsigned kMaxGroups = 32;
// Experts each lane holds.
constexpr unsigned kItems = kMaxExperts / hk::kWaveSize;

// ---- Candidates -----------------------------------------------------------------------------
// An expert and the value that ranks it, as one integer: larger means ranked first (larger
// value, then lower index), no two are equal, and 0 means "not a candidate". The high word maps
// the float's bits so that unsigned order is float order (negative: all bits flipped; else the
// sign bit set); adding +0 first turns -0 into +0, so the two zeros tie.
using Candidate = unsigned long long;

HK_DEVICE Candidate candidate(float value, unsigned expert) {
  const unsigned b = __builtin_bit_cast(unsigned, value + 0.0f);
  const unsigned key = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<Candidate>(key) << 32) | (~0u - expert);
}

HK_DEVICE unsigned expert_of(Candidate c) { return ~0u - static_cast<unsigned>(c); }

struct Best {
  HK_DEVICE Candidate operator()(Candidate a, Candidate b) const { return a > b ? a : b; }
  HK_DEVICE static Candidate identity() { return 0; }
};

// The k best of the wave's candidates, best first: lane j < k gets the expert of place j (other
// lanes get 0). Each round a wave maximum finds the best left, and its owner removes it.
HK_DEVICE unsigned take_best(Candidate (&cand)[kItems], unsigned k) {
  unsigned mine = 0;
  for (unsigned j = 0; j < k; ++j) {
    Candidate best = 0;
#pragma unroll
    for (unsigned i = 0; i < kItems; ++i) best = Best{}(best, cand[i]);
    best = hk::wave_reduce(best, Best{});
#pragma unroll
    for (unsigned i = 0; i < kItems; ++i)
      if (cand[i] == best) cand[i] = 0;
    if (hk::lane_id() == j) mine = expert_of(best);
  }
  return mine;
}

// The expert lane l holds at slot i.
HK_DEVICE unsigned expert_at(unsigned i) { return i * hk::kWaveSize + hk::lane_id(); }

// Calls f(row index) for the tokens of this wave: one wave a token, waves striding over them.
// 64-bit rows: r + stride may pass 2^32 after the last token.
template <typename F> HK_DEVICE void for_each_token(unsigned tokens, F f) {
  const unsigned long long stride = static_cast<unsigned long long>(hk::grid_dim_x()) * kWaves;
  for (unsigned long long r = hk::block_idx_x() * kWaves + hk::wave_id(); r < tokens; r += stride) f(r);
}

constexpr float kNegInf = -__builtin_inff();

// `n`, as a value whose range the compiler cannot see. Knowing from the argument checks that
// experts <= 256, LLVM divides it by n_group through f32 with gfx90a's v_mad_f32, an instruction
// the CDNA emulator our AMD tests run on cannot decode (it reads every target with gfx942's
// opcodes), so gfx90a's grouped routing could not be tested there. The full 32-bit division
// costs a few instructions once a launch (and a few per expert for its group).
HK_DEVICE unsigned opaque(unsigned n) {
#if HK_AMD
  asm volatile("" : "+s"(n));
#else
  asm volatile("" : "+r"(n));
#endif
  return n;
}

// ---- Softmax routing ------------------------------------------------------------------------
template <typename T>
HK_DEVICE void topk_softmax(float* weights, int* ids, const T* logits, unsigned tokens,
                            unsigned experts, unsigned ld, unsigned k, unsigned renormalize) {
  if (experts == 0 || experts > kMaxExperts || k == 0 || k > kMaxK || k > experts || ld < experts ||
      hk::block_dim_x() != kBlock)
    return;
  const unsigned lane = hk::lane_id();
  for_each_token(tokens, [&](unsigned long long r) {
    const T* row = logits + r * ld;
    float x[kItems];
    Candidate cand[kItems];
    float lane_max = kNegInf;
#pragma unroll
    for (unsigned i = 0; i < kItems; ++i) {
      const unsigned e = expert_at(i);
      x[i] = e < experts ? hk::to_float(row[e]) : kNegInf;
      cand[i] = e < experts ? candidate(x[i], e) : 0;
      lane_max = hk::max(lane_max, x[i]);
    }
    // exp(v - max) as 2^(v log2(e) - shift): one fma before the exp2.
    const float shift = hk::wave_max(lane_max) * hk::kLog2e;
    const unsigned id = take_best(cand, k);
    const bool holds = lane < k;
    // The chosen logit is read again (from cache) rather than picked out of another lane's
    // registers.
    const float p = holds ? hk::exp2(hk::fma(hk::to_float(row[id]), hk::kLog2e, -shift)) : 0.0f;
    float lane_sum = p;
    if (!renormalize) {
      lane_sum = 0.0f;
#pragma unroll
      for (unsigned i = 0; i < kItems; ++i) lane_sum += hk::exp2(hk::fma(x[i], hk::kLog2e, -shift));
    }
    const float sum = hk::wave_sum(lane_sum);
    if (holds) {
      weights[r * k + lane] = p / sum;
      ids[r * k + lane] = static_cast<int>(id);
    }
  });
}

// ---- Grouped routing (DeepSeek-V3) ----------------------------------------------------------
// Shared memory of one wave: the token's choices, then its groups' values, which lanes other
// than their owners read.
struct GroupScratch {
  float choice[kMaxExperts];
  float group_value[kMaxGroups];
};

template <typename T>
HK_DEVICE void grouped_topk(float* weights, int* ids, const T* logits, const float* bias,
                            unsigned tokens, unsigned experts, unsigned ld, unsigned n_group,
                            unsigned topk_group, unsigned k, float scaling) {
  __shared__ GroupScratch scratch[kWaves];
  if (experts == 0 || experts > kMaxExperts || ld < experts || n_group == 0 || n_group > kMaxGroups ||
      topk_group == 0 || topk_group > n_group || k == 0 || k > kMaxK || hk::block_dim_x() != kBlock)
    return;
  const unsigned group_size = opaque(experts) / n_group;
  if (group_size * n_group != experts || group_size < 2 || k > topk_group * group_size) return;
  GroupScratch& s = scratch[hk::wave_id()];
  const unsigned lane = hk::lane_id();
  float b[kItems];
#pragma unroll
  for (unsigned i = 0; i < kItems; ++i) b[i] = expert_at(i) < experts ? bias[expert_at(i)] : 0.0f;

  for_each_token(tokens, [&](unsigned long long r) {
    const T* row = logits + r * ld;
    float choice[kItems];
#pragma unroll
    for (unsigned i = 0; i < kItems; ++i) {
      const unsigned e = expert_at(i);
      choice[i] = e < experts ? hk::sigmoid(hk::to_float(row[e])) + b[i] : kNegInf;
      if (e < experts) s.choice[e] = choice[i];
    }
    hk::wave_sync();
    // Lane g < n_group: the sum of its group's two largest choices (equal ones count twice).
    float value = kNegInf;
    if (lane < n_group) {
      float first = kNegInf, second = kNegInf;
      for (unsigned j = lane * group_size; j < (lane + 1) * group_size; ++j) {
        const float v = s.choice[j];
        if (v > first) {
          second = first;
          first = v;
        } else if (v > second) {
          second = v;
        }
      }
      value = first + second;
      s.group_value[lane] = value;
    }
    hk::wave_sync();
    // A group's rank: the groups of larger value, or of equal value and lower index.
    unsigned rank = 0;
    if (lane < n_group)
      for (unsigned h = 0; h < n_group; ++h) {
        const float other = s.group_value[h];
        rank += other > value || (other == value && h < lane);
      }
    const hk::LaneMask kept = hk::wave_ballot(lane < n_group && rank < topk_group);
    Candidate cand[kItems];
#pragma unroll
    for (unsigned i = 0; i < kItems; ++i) {
      const unsigned e = expert_at(i);
      cand[i] = e < experts && (kept >> (e / group_size) & 1) ? candidate(choice[i], e) : 0;
    }
    const unsigned id = take_best(cand, k);
    const bool holds = lane < k;
    const float score = holds ? hk::sigmoid(hk::to_float(row[id])) : 0.0f;
    const float sum = hk::wave_sum(score);
    if (holds) {
      weights[r * k + lane] = score / sum * scaling;
      ids[r * k + lane] = static_cast<int>(id);
    }
    hk::wave_sync();  // every lane has read the scratch before the next token overwrites it
  });
}

}  // namespace

#define HK_MOE_ROUTING(name, T)                                                               \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void topk_softmax_##name(                                \
      float* topk_weights, int* topk_ids, const T* logits, unsigned tokens, unsigned experts,  \
      unsigned ld, unsigned k, unsigned renormalize) {                                         \
    topk_softmax<T>(topk_weights, topk_ids, logits, tokens, experts, ld, k, renormalize);      \
  }                                                                                            \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void grouped_topk_##name(                                \
      float* topk_weights, int* topk_ids, const T* logits, const float* bias, unsigned tokens, \
      unsigned experts, unsigned ld, unsigned n_group, unsigned topk_group, unsigned k,        \
      float routed_scaling_factor) {                                                           \
    grouped_topk<T>(topk_weights, topk_ids, logits, bias, tokens, experts, ld, n_group,       \
                    topk_group, k, routed_scaling_factor);                                     \
  }
HK_MOE_ROUTING(bf16, hk::bf16)
HK_MOE_ROUTING(f16, hk::f16)
HK_MOE_ROUTING(f32, float)
