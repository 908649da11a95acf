// Mixture-of-experts alignment: the (token, choice) pairs of a routing (topk_ids) sorted by the
// expert they go to and padded per expert to the grouped GEMM's block of rows, so that every
// block of block_m rows belongs to one expert.
//
// Symbol:
//   moe_align_block_size(sorted_token_ids, expert_ids, num_tokens_post_pad, topk_ids,
//                        expert_map, tokens, k, experts, local_experts, block_m)
//
// Inputs: topk_ids, int32 [tokens * k], global expert ids (entry t * k + j is token t's j-th
// choice); expert_map, int32 [experts], each global expert's local index on this rank, or -1
// for an expert that is not local (expert parallelism; all local: the identity map). A pair
// whose id is outside [0, experts), or whose expert maps outside [0, local_experts) (-1 or a
// caller's mistake), is dropped: it is not sorted, and nothing is written for it.
//
// Outputs, with N = tokens * k and max_sorted = N + experts * (block_m - 1):
//   sorted_token_ids  int32 [max_sorted]: for each local expert 0, 1, ... local_experts - 1 in
//       turn, the flat indices t * k + j of its pairs in ascending order, then the sentinel N up
//       to the next multiple of block_m rows. An expert without pairs has no rows. Rows from
//       num_tokens_post_pad on are not written.
//   expert_ids        int32 [ceil_div(max_sorted, block_m)]: block b's local expert (its rows
//       b * block_m .. (b + 1) * block_m - 1); -1 for every block from num_tokens_post_pad /
//       block_m on, so a grouped GEMM launched over the largest grid stops at the first -1.
//   num_tokens_post_pad int32 [1]: the rows used, sum over local experts of round_up(count, block_m).
// The result is the same on every target and every run (no atomics decide an order).
//
// Limits: 1 <= experts <= kMaxExperts (1024), 1 <= local_experts <= experts, block_m a power
// of two from 16 to 256, max_sorted < 2^31 (every row and the sentinel fit an int32). The
// contract (manifests/moe_align.toml) refuses anything else; a launch outside them writes
// nothing.
//
// Launch: one block of kBlock (1024) threads for every size, so a decode step is one launch
// with a fixed grid (capturable in a graph). Counters live in shared memory. The pairs are
// taken in tiles of kBlock, one a thread: a counting pass (shared atomics), an exclusive scan
// of the padded counts (one expert a thread), the padding rows (a wave an expert), then a placing
// pass. A pair's row is its
// expert's start + pairs of that expert in earlier tiles + pairs of it in earlier waves of this
// tile (a per-wave count table) + its rank in its wave (lanes holding the same expert, found by
// one ballot per bit of the expert index). Up to kBlock pairs (64 tokens of top-8: decode) the
// pair read for counting stays in registers for placing: topk_ids is read once, and no pass
// is added for small batches.
#include "hk/hk.h"
#include "hk/vote.h"

namespace {

constexpr unsigned kBlock = 1024;
constexpr unsigned kWaves = kBlock / hk::kWaveSize;
constexpr unsigned kMaxExperts = 1024;
static_assert(kMaxExperts <= kBlock, "the scan gives each expert one thread");
constexpr unsigned kMinBlockM = 16;
constexpr unsigned kMaxBlockM = 256;
constexpr unsigned long long kMaxRows = 0x7fffffffull;

struct Shared {
  // expert_map, read once at the start so that a pair's two lookups are not two global
  // latencies in turn.
  int map[kMaxExperts];
  // Pairs per local expert, then (after the scan and the padding) the next free row of each.
  unsigned cursor[kMaxExperts];
  // Each local expert's first row.
  unsigned start[kMaxExperts];
  // Pairs of each local expert in each wave of the current tile (at most a wave's lanes, so a
  // byte each), as words so that clearing is word stores; read byte-wise.
  unsigned wave_count_words[kWaves][kMaxExperts / 4];
  // Each wave's sum in the scan.
  unsigned wave_total[kWaves];
};

HK_DEVICE unsigned char* wave_counts(Shared& s, unsigned wave) {
  return reinterpret_cast<unsigned char*>(s.wave_count_words[wave]);
}

// Pair i's global expert, or -1 past the last pair.
HK_DEVICE int global_expert(const int* topk_ids, unsigned i, unsigned n) { return i < n ? topk_ids[i] : -1; }

// The local expert of a pair's global expert, or -1 when the pair is dropped (no pair, id out
// of range, expert not local).
HK_DEVICE int local_expert(const Shared& s, int global, unsigned experts, unsigned local_experts) {
  if (global < 0 || static_cast<unsigned>(global) >= experts) return -1;
  const int local = s.map[global];
  return local >= 0 && static_cast<unsigned>(local) < local_experts ? local : -1;
}

}  // namespace

HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void moe_align_block_size(
    int* sorted_token_ids, int* expert_ids, int* num_tokens_post_pad, const int* topk_ids,
    const int* expert_map, unsigned tokens, unsigned k, unsigned experts, unsigned local_experts,
    unsigned block_m) {
  __shared__ Shared s;
  const unsigned long long pairs = static_cast<unsigned long long>(tokens) * k;
  const unsigned long long max_sorted = pairs + static_cast<unsigned long long>(experts) * (block_m - 1);
  if (tokens == 0 || k == 0 || experts == 0 || experts > kMaxExperts || local_experts == 0 ||
      local_experts > experts || block_m < kMinBlockM || block_m > kMaxBlockM || (block_m & (block_m - 1)) != 0 ||
      max_sorted > kMaxRows || hk::block_dim_x() != kBlock || hk::block_idx_x() != 0)
    return;
  const unsigned n = static_cast<unsigned>(pairs);
  const unsigned tid = hk::thread_idx_x();
  const unsigned wave = hk::wave_id();
  const unsigned tiles = (n + kBlock - 1) / kBlock;

  // ---- Start: the map in shared memory, counters cleared, this thread's pair of tile 0 read.
  s.map[tid] = tid < experts ? expert_map[tid] : -1;
  s.cursor[tid] = 0;
  for (unsigned w = tid; w < kWaves * kMaxExperts / 4; w += kBlock) (&s.wave_count_words[0][0])[w] = 0;
  const int first_global = global_expert(topk_ids, tid, n);
  hk::block_sync();
  const int first = local_expert(s, first_global, experts, local_experts);

  // ---- Count the pairs of each local expert.
  if (first >= 0) hk::shared_fetch_add(&s.cursor[first], 1);
  for (unsigned t = 1; t < tiles; ++t) {
    const int e = local_expert(s, global_expert(topk_ids, t * kBlock + tid, n), experts, local_experts);
    if (e >= 0) hk::shared_fetch_add(&s.cursor[e], 1);
  }
  hk::block_sync();

  // ---- Scan: thread e's expert starts after the padded counts of the experts before it.
  const unsigned count = tid < local_experts ? s.cursor[tid] : 0;
  const unsigned padded = (count + block_m - 1) & ~(block_m - 1);
  const unsigned within = hk::wave_inclusive_sum(padded);
  if (hk::lane_id() == hk::kWaveSize - 1) s.wave_total[wave] = within;
  hk::block_sync();
  unsigned begin = within - padded;
  unsigned total = 0;
  for (unsigned w = 0; w < kWaves; ++w) {
    const unsigned sum = s.wave_total[w];
    begin += w < wave ? sum : 0;
    total += sum;
  }
  if (tid < local_experts) s.start[tid] = begin;
  hk::block_sync();
  // The experts' padding rows, a wave an expert: a wave's stores cover consecutive rows (one
  // thread walking its own expert's up to block_m - 1 rows made every store of a wave touch as
  // many lines as lanes, and the one SM this runs on spent most of a decode step on them).
  const int sentinel = static_cast<int>(n);
  for (unsigned e = wave; e < local_experts; e += kWaves) {
    const unsigned end = e + 1 < local_experts ? s.start[e + 1] : total;
    for (unsigned row = s.start[e] + s.cursor[e] + hk::lane_id(); row < end; row += hk::kWaveSize)
      sorted_token_ids[row] = sentinel;
  }
  hk::block_sync();  // the counts are read above before they become the next free rows
  if (tid < local_experts) s.cursor[tid] = begin;
  hk::block_sync();

  // ---- Each block's expert: the last expert starting at or before its first row (experts
  // without pairs start where the next one does, so the one with pairs is the last of them).
  // block_m is a power of two: shifts, not a division (which LLVM makes through f32 with
  // gfx90a's v_mac_f32, an instruction the CDNA emulator cannot decode for gfx90a).
  const unsigned shift = __builtin_ctz(block_m);
  const unsigned blocks = static_cast<unsigned>((max_sorted + block_m - 1) >> shift);
  const unsigned used = total >> shift;
  for (unsigned b = tid; b < blocks; b += kBlock) {
    int id = -1;
    if (b < used) {
      const unsigned row = b << shift;
      unsigned lo = 0, hi = local_experts;  // start[lo] <= row < start[hi] (start[L] = total)
      while (hi - lo > 1) {
        const unsigned mid = (lo + hi) / 2;
        if (s.start[mid] <= row)
          lo = mid;
        else
          hi = mid;
      }
      id = static_cast<int>(lo);
    }
    expert_ids[b] = id;
  }
  if (tid == 0) *num_tokens_post_pad = static_cast<int>(total);

  // ---- Place each pair: its expert's next free row before this tile, plus the pairs of its
  // expert in earlier waves of the tile, plus its rank among its wave's lanes of that expert.
  const unsigned bits = local_experts > 1 ? 32 - __builtin_clz(local_experts - 1) : 0;
  for (unsigned t = 0; t < tiles; ++t) {
    const unsigned i = t * kBlock + tid;
    const int e = t == 0 ? first : local_expert(s, global_expert(topk_ids, i, n), experts, local_experts);
    const bool valid = e >= 0;
    // The lanes whose pair has the same expert: agreeing on every bit of the index.
    hk::LaneMask peers = hk::wave_ballot(valid);
    for (unsigned bit = 0; bit < bits; ++bit) {
      const bool set = valid && ((e >> bit) & 1);
      const hk::LaneMask ones = hk::wave_ballot(set);
      peers &= set ? ones : ~ones;
    }
    const unsigned rank = hk::lanes_below(peers);
    const unsigned mates = hk::lane_count(peers);
    if (valid && rank == 0) wave_counts(s, wave)[e] = static_cast<unsigned char>(mates);
    hk::block_sync();
    if (valid) {
      unsigned row = s.cursor[e] + rank;
      for (unsigned w = 0; w < wave; ++w) row += wave_counts(s, w)[e];
      sorted_token_ids[row] = static_cast<int>(i);
    }
    if (t + 1 < tiles) {
      hk::block_sync();  // every row of this tile is computed before the counts move on
      if (valid && rank == 0) {
        hk::shared_fetch_add(&s.cursor[e], mates);
        wave_counts(s, wave)[e] = 0;
      }
      hk::block_sync();
    }
  }
}
