// Top-k of each row of a row-major [rows, n] tensor: the k largest values in descending order
// and their column indices.
//
// Symbols: topk_{bf16,f16,f32}(values, indices, x, rows, n, k), values [rows, k] in the input's
// type, indices [rows, k] int32. 1 <= k <= min(n, 128); any other k writes nothing.
// NaN ranks above +inf (as in torch.topk) and comes out as a NaN; -0 ranks below +0; equal
// values come out in any order.
//
// Launch: the contract in manifests/topk.toml, which also refuses any other k. Blocks are of
// kBlock threads (other block sizes write nothing). A row of n <= kRowInWave values is done by
// one wave, which holds it in registers; a longer row by one block, streamed from memory once
// per pass. Rows are strided over the grid, so any grid is correct.
//
// How: a radix select on keys, order-preserving unsigned images of the values. Each pass
// counts the keys that match the digits found so far into 256 shared-memory bins by their next
// 8-bit digit, and finds the bin holding the k-th largest key: everything above that bin is in
// the top k, and the search narrows to the bin (at most 2 passes for 16-bit types, 4 for f32;
// fewer when the whole bin belongs to the top k). Then the keys above the final digits, and as
// many equal ones as k still needs, are gathered into shared memory, and each one's output
// place is its rank among the k gathered (an O(k^2) count, cheap for k <= 128).
#include "hk/hk.h"
#include "hk/vote.h"

namespace {

constexpr unsigned kBlock = 256;
constexpr unsigned kWaves = kBlock / hk::kWaveSize;
constexpr unsigned kMaxK = 128;
// The longest row one wave does, and the values each lane holds for it.
constexpr unsigned kRowInWave = 1024;
constexpr unsigned kItems = kRowInWave / hk::kWaveSize;
constexpr unsigned kDigitBits = 8;
constexpr unsigned kBins = 1u << kDigitBits;
constexpr unsigned kBinsPerLane = kBins / hk::kWaveSize;
// Gathered candidates each lane ranks.
constexpr unsigned kRanksPerLane = kMaxK / hk::kWaveSize;

// ---- Keys -----------------------------------------------------------------------------------
// A value's key is its bit pattern with every bit flipped if negative, else the sign bit set,
// which makes unsigned order agree with float order; every NaN becomes the largest key.
template <typename T> struct KeyBits;
template <> struct KeyBits<float> {
  using Raw = unsigned;
  static constexpr unsigned kInf = 0x7f800000u;  // the pattern of +inf
};
template <> struct KeyBits<hk::bf16> {
  using Raw = unsigned short;
  static constexpr unsigned kInf = 0x7f80u;
};
template <> struct KeyBits<hk::f16> {
  using Raw = unsigned short;
  static constexpr unsigned kInf = 0x7c00u;
};

template <typename T> inline constexpr unsigned kKeyBits = 8 * sizeof(T);
template <typename T> inline constexpr unsigned kKeyAll = kKeyBits<T> == 32 ? ~0u : (1u << kKeyBits<T>) - 1;
template <typename T> inline constexpr unsigned kSignBit = 1u << (kKeyBits<T> - 1);

// Never 0 (the only pattern that would map there, all ones, is a NaN), so 0 can mean "no value".
template <typename T> HK_DEVICE unsigned key_of(T v) {
  const unsigned b = __builtin_bit_cast(typename KeyBits<T>::Raw, v);
  if ((b & ~kSignBit<T>) > KeyBits<T>::kInf) return kKeyAll<T>;
  return (b & kSignBit<T>) ? (~b & kKeyAll<T>) : (b | kSignBit<T>);
}

// The value of a key (the NaN key gives back a NaN).
template <typename T> HK_DEVICE T value_of(unsigned key) {
  const unsigned b = (key & kSignBit<T>) ? (key ^ kSignBit<T>) : (~key & kKeyAll<T>);
  return __builtin_bit_cast(T, static_cast<typename KeyBits<T>::Raw>(b));
}

// ---- Radix select ---------------------------------------------------------------------------
// Where the search for the k-th largest key stands: its digits found so far (`prefix`, over
// the bits in `mask`), and how many of the keys that share them still belong to the top k.
struct Selection {
  unsigned prefix;
  unsigned mask;
  unsigned need;

  HK_DEVICE bool above(unsigned key) const { return key != 0 && (key & mask) > prefix; }
  HK_DEVICE bool tied(unsigned key) const { return key != 0 && (key & mask) == prefix; }
};

// The bin holding the k-th largest key: its digit, how many counted keys lie in higher bins,
// and how many in it.
struct Bin {
  unsigned digit;
  unsigned above;
  unsigned count;
};

// Finds, among the counts in `hist`, the bin where the `need`-th largest counted key falls.
// Run by one whole wave; every lane gets the answer. Lane l owns the bins from the top
// down, kBinsPerLane of them, so a prefix sum over lanes gives the counts above each lane.
HK_DEVICE Bin find_bin(const unsigned* hist, unsigned need) {
  const unsigned lane = hk::lane_id();
  const unsigned top = kBins - 1 - lane * kBinsPerLane;
  unsigned count[kBinsPerLane];
  unsigned sum = 0;
#pragma unroll
  for (unsigned j = 0; j < kBinsPerLane; ++j) {
    count[j] = hist[top - j];
    sum += count[j];
  }
  const unsigned through = hk::wave_inclusive_sum(sum);
  const bool mine = through - sum < need && need <= through;
  Bin bin{0, 0, 0};
  unsigned run = through - sum;
#pragma unroll
  for (unsigned j = 0; j < kBinsPerLane; ++j) {
    if (mine && run < need && need <= run + count[j]) bin = Bin{top - j, run, count[j]};
    run += count[j];
  }
  const unsigned owner = hk::first_lane(hk::wave_ballot(mine));
  return Bin{hk::wave_broadcast(bin.digit, owner), hk::wave_broadcast(bin.above, owner),
             hk::wave_broadcast(bin.count, owner)};
}

// Narrows `sel` to the bin `bin` of the digit at `shift`; true when the search is over (every
// key left in the bin belongs to the top k).
HK_DEVICE bool narrow(Selection& sel, const Bin& bin, unsigned shift) {
  sel.prefix |= bin.digit << shift;
  sel.mask |= (kBins - 1) << shift;
  sel.need -= bin.above;
  return bin.count == sel.need;
}

// A gathered candidate as one number: larger means earlier in the output (larger key, then
// lower column), and no two are equal.
HK_DEVICE unsigned long long candidate(unsigned key, unsigned col) {
  return (static_cast<unsigned long long>(key) << 32) | ~col;
}

// Writes candidate `c`, whose rank among the k gathered ones is `rank`, to its output place.
template <typename T>
HK_DEVICE void emit(T* values, int* indices, unsigned long long c, unsigned rank) {
  values[rank] = value_of<T>(static_cast<unsigned>(c >> 32));
  indices[rank] = static_cast<int>(~static_cast<unsigned>(c));
}

// ---- One wave per row -----------------------------------------------------------------------
// Shared memory of one wave.
struct WaveScratch {
  unsigned hist[kBins];
  unsigned long long cand[kMaxK];
};

// `n`, as a value the compiler cannot see is the same for every row: otherwise it hoists each
// value's bounds check out of the row loop, and on AMD the 16 lane masks that result do not
// fit in scalar registers.
HK_DEVICE unsigned opaque(unsigned n) {
#if HK_AMD
  asm volatile("" : "+s"(n));
#else
  asm volatile("" : "+r"(n));
#endif
  return n;
}

// Lane l holds the values at columns v * (wave * kVec) + l * kVec + e, for its kItems / kVec
// packs v of kVec values e: coalesced 16-byte loads when the row allows them.
template <typename T>
HK_DEVICE void topk_in_wave(T* values, int* indices, const T* row, unsigned n, unsigned k,
                            WaveScratch& s) {
  constexpr unsigned kVec = hk::kVec16<T>;
  constexpr unsigned kPacks = kItems / kVec;
  const unsigned lane = hk::lane_id();
  n = opaque(n);
  const bool vectors = n % kVec == 0 && hk::aligned16(row);
  unsigned key[kItems];
#pragma unroll
  for (unsigned v = 0; v < kPacks; ++v) {
    const unsigned base = v * hk::kWaveSize * kVec + lane * kVec;
    if (vectors) {
      const hk::Vec16<T> p = base < n ? hk::load16(row + base) : hk::Vec16<T>{};
#pragma unroll
      for (unsigned e = 0; e < kVec; ++e) key[v * kVec + e] = base < n ? key_of(p.elem[e]) : 0;
    } else {
#pragma unroll
      for (unsigned e = 0; e < kVec; ++e) key[v * kVec + e] = base + e < n ? key_of(row[base + e]) : 0;
    }
  }
  auto column = [&](unsigned i) { return i / kVec * hk::kWaveSize * kVec + lane * kVec + i % kVec; };

  Selection sel{0, 0, k};
  for (int shift = kKeyBits<T> - kDigitBits; shift >= 0; shift -= kDigitBits) {
#pragma unroll
    for (unsigned j = 0; j < kBinsPerLane; ++j) s.hist[lane + j * hk::kWaveSize] = 0;
    hk::wave_sync();
#pragma unroll
    for (unsigned i = 0; i < kItems; ++i)
      if (sel.tied(key[i])) hk::shared_fetch_add(&s.hist[(key[i] >> shift) & (kBins - 1)], 1);
    hk::wave_sync();
    const Bin bin = find_bin(s.hist, sel.need);
    hk::wave_sync();  // every lane has read the counts before the next pass clears them
    if (narrow(sel, bin, shift)) break;
  }

  // Gather: slots by vote, the keys above first, then the first `need` tied ones.
  const unsigned first_tied = k - sel.need;
  unsigned n_above = 0, n_tied = 0;
#pragma unroll
  for (unsigned i = 0; i < kItems; ++i) {
    const bool above = sel.above(key[i]);
    const bool tied = sel.tied(key[i]);
    const hk::LaneMask above_lanes = hk::wave_ballot(above);
    const hk::LaneMask tied_lanes = hk::wave_ballot(tied);
    if (above) s.cand[n_above + hk::lanes_below(above_lanes)] = candidate(key[i], column(i));
    const unsigned tie = n_tied + hk::lanes_below(tied_lanes);
    if (tied && tie < sel.need) s.cand[first_tied + tie] = candidate(key[i], column(i));
    n_above += hk::lane_count(above_lanes);
    n_tied += hk::lane_count(tied_lanes);
  }
  hk::wave_sync();

  unsigned long long mine[kRanksPerLane];
  unsigned rank[kRanksPerLane];
#pragma unroll
  for (unsigned p = 0; p < kRanksPerLane; ++p) {
    const unsigned c = lane + p * hk::kWaveSize;
    mine[p] = c < k ? s.cand[c] : ~0ull;
    rank[p] = 0;
  }
  for (unsigned j = 0; j < k; ++j) {
    const unsigned long long other = s.cand[j];
#pragma unroll
    for (unsigned p = 0; p < kRanksPerLane; ++p) rank[p] += other > mine[p];
  }
#pragma unroll
  for (unsigned p = 0; p < kRanksPerLane; ++p)
    if (lane + p * hk::kWaveSize < k) emit(values, indices, mine[p], rank[p]);
  hk::wave_sync();  // the ranking has read every candidate before the next row overwrites them
}

// ---- One block per row ----------------------------------------------------------------------
struct BlockScratch {
  unsigned hist[kBins];
  unsigned long long cand[kMaxK];
  Bin bin;
  unsigned n_above;
  unsigned n_tied;
};

// Calls f(key, column) for every value of the row, the block's threads striding over it.
template <typename T, typename F>
HK_DEVICE void for_each_key(const T* row, unsigned n, F f) {
  constexpr unsigned kVec = hk::kVec16<T>;
  const unsigned t = hk::thread_idx_x();
  if (n % kVec == 0 && hk::aligned16(row)) {
#pragma unroll 4
    for (unsigned v = t; v < n / kVec; v += kBlock) {
      const hk::Vec16<T> p = hk::load16(row + v * kVec);
#pragma unroll
      for (unsigned e = 0; e < kVec; ++e) f(key_of(p.elem[e]), v * kVec + e);
    }
  } else {
#pragma unroll 4
    for (unsigned c = t; c < n; c += kBlock) f(key_of(row[c]), c);
  }
}

template <typename T>
HK_DEVICE void topk_in_block(T* values, int* indices, const T* row, unsigned n, unsigned k,
                             BlockScratch& s) {
  const unsigned t = hk::thread_idx_x();
  if (t == 0) s.n_above = s.n_tied = 0;  // read by the gather, after the passes' barriers
  Selection sel{0, 0, k};
  for (int shift = kKeyBits<T> - kDigitBits; shift >= 0; shift -= kDigitBits) {
    for (unsigned b = t; b < kBins; b += kBlock) s.hist[b] = 0;
    hk::block_sync();
    for_each_key(row, n, [&](unsigned key, unsigned) {
      if (sel.tied(key)) hk::shared_fetch_add(&s.hist[(key >> shift) & (kBins - 1)], 1);
    });
    hk::block_sync();
    if (hk::wave_id() == 0) {
      const Bin bin = find_bin(s.hist, sel.need);
      if (hk::lane_id() == 0) s.bin = bin;
    }
    hk::block_sync();
    if (narrow(sel, s.bin, shift)) break;
  }

  const unsigned first_tied = k - sel.need;
  for_each_key(row, n, [&](unsigned key, unsigned col) {
    if (sel.above(key)) s.cand[hk::shared_fetch_add(&s.n_above, 1)] = candidate(key, col);
    if (sel.tied(key)) {
      const unsigned tie = hk::shared_fetch_add(&s.n_tied, 1);
      if (tie < sel.need) s.cand[first_tied + tie] = candidate(key, col);
    }
  });
  hk::block_sync();

  if (t < k) {
    const unsigned long long mine = s.cand[t];
    unsigned rank = 0;
    for (unsigned j = 0; j < k; ++j) rank += s.cand[j] > mine;
    emit(values, indices, mine, rank);
  }
  hk::block_sync();  // the ranking has read every candidate before the next row overwrites them
}

// ---- Entry ----------------------------------------------------------------------------------
union Scratch {
  WaveScratch wave[kWaves];
  BlockScratch block;
};

template <typename T>
HK_DEVICE void topk(T* values, int* indices, const T* x, unsigned rows, unsigned n, unsigned k) {
  __shared__ Scratch scratch;
  if (k == 0 || k > kMaxK || k > n || hk::block_dim_x() != kBlock) return;
  auto at = [](auto* p, unsigned long long row, unsigned len) { return p + row * len; };
  if (n <= kRowInWave) {
    const unsigned stride = hk::grid_dim_x() * kWaves;
    // 64-bit rows: r + stride may pass 2^32 after the last row. (Counting the trips up front,
    // as hk::for_each_row does, crashed LLVM's AMDGPU backend: an illegal VGPR to SGPR copy.)
    for (unsigned long long r = hk::block_idx_x() * kWaves + hk::wave_id(); r < rows; r += stride)
      topk_in_wave(at(values, r, k), at(indices, r, k), at(x, r, n), n, k, scratch.wave[hk::wave_id()]);
  } else {
    for (unsigned long long r = hk::block_idx_x(); r < rows; r += hk::grid_dim_x())
      topk_in_block(at(values, r, k), at(indices, r, k), at(x, r, n), n, k, scratch.block);
  }
}

}  // namespace

// On Hopper, ask for three blocks per SM: that caps registers at 80, which both paths fit
// without spilling (left alone, ptxas takes 128 and only two blocks fit), and the third block
// hides more of the passes' latency (about 20 % faster on an H100 at 16384 x 1024). On sm_80
// the same cap costs a stack slot, so Ampere keeps the default.
#if HK_NVIDIA && __CUDA_ARCH__ >= 900
#define TOPK_LAUNCH_BOUNDS __attribute__((launch_bounds(kBlock, 3)))
#else
#define TOPK_LAUNCH_BOUNDS HK_LAUNCH_BOUNDS(kBlock)
#endif

#define HK_TOPK(name, T)                                                                      \
  HK_KERNEL TOPK_LAUNCH_BOUNDS void topk_##name(                                              \
      T* values, int* indices, const T* x, unsigned rows, unsigned n, unsigned k) {           \
    topk<T>(values, indices, x, rows, n, k);                                                  \
  }
HK_TOPK(bf16, hk::bf16)
HK_TOPK(f16, hk::f16)
HK_TOPK(f32, float)
