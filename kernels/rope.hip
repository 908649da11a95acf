// Rotary position embedding (RoPE), out of place: each head vector of `dim` elements has its
// first `rot_dim` elements rotated pairwise by the angles of its position p,
//   (a, b) -> (a * cos[p, i] - b * sin[p, i], b * cos[p, i] + a * sin[p, i])   for pair i,
// and its last dim - rot_dim elements copied. The pairs are (i, i + rot_dim / 2) in the NeoX
// ("rotate half") style and (2i, 2i + 1) in the GPT-J (interleaved) style. Computed in f32,
// rounded once to the element type.
//
// Symbols, for T in bf16, f16, f32:
//   rope_{neox,gptj}_bhsd_T(out, x, cos, sin, batch, heads, seq, dim, rot_dim)
//       x, out: [batch, heads, seq, dim]; the position of a vector is its sequence index.
//   rope_{neox,gptj}_thd_T(out, x, cos, sin, positions, table_rows, tokens, heads, dim, rot_dim)
//       x, out: [tokens, heads, dim]; positions: [tokens] int32.
// cos, sin: f32 tables [rows, rot_dim / 2] (row p holds the angles of position p): `seq` rows
// in the bhsd layout, `table_rows` in the thd one, where a position outside [0, table_rows)
// reads no table and makes its vector's rotated elements NaN, so that a bad position is seen
// rather than read out of bounds. rot_dim must be even and at most dim (0 only copies). `out`
// may be `x` itself (each element is read before it is written, by the thread that writes
// it).
//
// Launch: the contract in manifests/rope.toml. Blocks of kBlock threads take kRowsPerBlock
// vectors at a time and stride over the vectors, so any grid is correct.
#include "hk/hk.h"

namespace {

constexpr unsigned kBlock = 256;
constexpr unsigned kRowsPerBlock = 32;

enum class Style { NeoX, GptJ };

// Loads N f32 values (angles) from p: as 16-byte vectors when N is a multiple of 4, which the
// vector path guarantees only with p 16-byte aligned; else one by one.
template <unsigned N> HK_DEVICE hk::Pack<float, N> load_angles(const float* p) {
  hk::Pack<float, N> v;
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (unsigned q = 0; q < N / 4; ++q) {
      const hk::Vec16<float> part = hk::load16(p + 4 * q);
#pragma unroll
      for (unsigned e = 0; e < 4; ++e) v.elem[4 * q + e] = part.elem[e];
    }
  } else {
#pragma unroll
    for (unsigned e = 0; e < N; ++e) v.elem[e] = p[e];
  }
  return v;
}

// The rotation of one pair.
HK_DEVICE void rotate(float a, float b, float c, float s, float& ra, float& rb) {
  ra = hk::fma(a, c, -b * s);
  rb = hk::fma(b, c, a * s);
}

// One head vector's worth of work, split in packs: `kN` elements of x per pack (a 16-byte
// vector, or as few as one pair when the vector path is impossible) for the rotated part,
// `kTail` for the copied part.
template <Style S, typename T, unsigned kN, unsigned kTail> struct Packs {
  // NeoX packs take kN elements from each half (kN pairs); GPT-J packs take kN neighbours.
  static constexpr unsigned kPairs = S == Style::NeoX ? kN : kN / 2;

  HK_DEVICE static unsigned rotated(unsigned rot_dim) { return rot_dim / 2 / kPairs; }
  HK_DEVICE static unsigned copied(unsigned dim, unsigned rot_dim) { return (dim - rot_dim) / kTail; }

  // Rotates pack `p` of the vector `x` (into `out`) by the table rows `cos`, `sin`.
  HK_DEVICE static void rotate_pack(T* out, const T* x, const float* cos, const float* sin,
                                    unsigned p, unsigned half) {
    const unsigned i = p * kPairs;  // first pair
    const auto c = load_angles<kPairs>(cos + i);
    const auto s = load_angles<kPairs>(sin + i);
    if constexpr (S == Style::NeoX) {
      const auto a = hk::load(x + i, hk::Width<kN>{});
      const auto b = hk::load(x + i + half, hk::Width<kN>{});
      hk::Pack<T, kN> ra, rb;
#pragma unroll
      for (unsigned e = 0; e < kN; ++e) {
        float fa, fb;
        rotate(hk::to_float(a.elem[e]), hk::to_float(b.elem[e]), c.elem[e], s.elem[e], fa, fb);
        ra.elem[e] = hk::from_float<T>(fa);
        rb.elem[e] = hk::from_float<T>(fb);
      }
      hk::store(out + i, ra);
      hk::store(out + i + half, rb);
    } else {
      const auto v = hk::load(x + 2 * i, hk::Width<kN>{});
      hk::Pack<T, kN> r;
#pragma unroll
      for (unsigned e = 0; e < kPairs; ++e) {
        float fa, fb;
        rotate(hk::to_float(v.elem[2 * e]), hk::to_float(v.elem[2 * e + 1]), c.elem[e], s.elem[e], fa, fb);
        r.elem[2 * e] = hk::from_float<T>(fa);
        r.elem[2 * e + 1] = hk::from_float<T>(fb);
      }
      hk::store(out + 2 * i, r);
    }
  }

  // Writes NaN where rotate_pack would write pack `p`: the vector's position has no table row.
  HK_DEVICE static void poison_pack(T* out, unsigned p, unsigned half) {
    const unsigned i = p * kPairs;
    hk::Pack<T, kN> nan;
#pragma unroll
    for (unsigned e = 0; e < kN; ++e) nan.elem[e] = hk::from_float<T>(__builtin_nanf(""));
    if constexpr (S == Style::NeoX) {
      hk::store(out + i, nan);
      hk::store(out + i + half, nan);
    } else {
      hk::store(out + 2 * i, nan);
    }
  }

  // Copies pack `p` of the unrotated tail.
  HK_DEVICE static void copy_pack(T* out, const T* x, unsigned p, unsigned rot_dim) {
    const unsigned i = rot_dim + p * kTail;
    hk::store(out + i, hk::load(x + i, hk::Width<kTail>{}));
  }
};

// The block's share of the vectors: groups of kRowsPerBlock vectors, their packs spread over
// the threads. `position(v)` gives the table row of vector v, which must be below table_rows.
template <Style S, typename T, unsigned kN, unsigned kTail, typename Position>
HK_DEVICE void rope_rows(T* out, const T* x, const float* cos, const float* sin, unsigned vectors,
                         unsigned table_rows, unsigned dim, unsigned rot_dim, Position position) {
  using P = Packs<S, T, kN, kTail>;
  const unsigned half = rot_dim / 2;
  const unsigned rotated = P::rotated(rot_dim);
  const unsigned per_vector = rotated + P::copied(dim, rot_dim);
  for (unsigned first = hk::block_idx_x() * kRowsPerBlock; first < vectors;
       first += hk::grid_dim_x() * kRowsPerBlock) {
    const unsigned count = vectors - first < kRowsPerBlock ? vectors - first : kRowsPerBlock;
    for (unsigned item = hk::thread_idx_x(); item < count * per_vector; item += kBlock) {
      const unsigned v = first + item / per_vector;
      const unsigned p = item % per_vector;
      const unsigned long long at = static_cast<unsigned long long>(v) * dim;
      if (p < rotated) {
        const unsigned position_v = position(v);
        if (position_v < table_rows) {
          const unsigned long long row = static_cast<unsigned long long>(position_v) * half;
          P::rotate_pack(out + at, x + at, cos + row, sin + row, p, half);
        } else {
          P::poison_pack(out + at, p, half);
        }
      } else {
        P::copy_pack(out + at, x + at, p - rotated, rot_dim);
      }
    }
  }
}

template <Style S, typename T, typename Position>
HK_DEVICE void rope(T* out, const T* x, const float* cos, const float* sin, unsigned long long vectors,
                    unsigned table_rows, unsigned dim, unsigned rot_dim, Position position) {
  if (rot_dim % 2 != 0 || rot_dim > dim || vectors > 0xffffffffull) return;
  constexpr unsigned kVec = hk::kVec16<T>;
  // A 16-byte pack must start 16-byte aligned everywhere: in x and out (so dim, and the tail's
  // start rot_dim, are multiples of kVec, and NeoX's second half too) and in the tables.
  const unsigned rot_unit = S == Style::NeoX ? 2 * kVec : kVec;
  if (dim % kVec == 0 && rot_dim % rot_unit == 0 && hk::aligned16(out, x, cos, sin)) {
    rope_rows<S, T, kVec, kVec>(out, x, cos, sin, vectors, table_rows, dim, rot_dim, position);
  } else {
    rope_rows<S, T, S == Style::NeoX ? 1 : 2, 1>(out, x, cos, sin, vectors, table_rows, dim, rot_dim,
                                                 position);
  }
}

}  // namespace

#define HK_ROPE(style, S, name, T)                                                            \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void rope_##style##_bhsd_##name(                         \
      T* out, const T* x, const float* cos, const float* sin, unsigned batch, unsigned heads, \
      unsigned seq, unsigned dim, unsigned rot_dim) {                                         \
    const unsigned long long vectors = static_cast<unsigned long long>(batch) * heads * seq;  \
    rope<S>(out, x, cos, sin, vectors, seq, dim, rot_dim, [=](unsigned v) { return v % seq; }); \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void rope_##style##_thd_##name(                          \
      T* out, const T* x, const float* cos, const float* sin, const int* positions,           \
      unsigned table_rows, unsigned tokens, unsigned heads, unsigned dim, unsigned rot_dim) { \
    const unsigned long long vectors = static_cast<unsigned long long>(tokens) * heads;       \
    rope<S>(out, x, cos, sin, vectors, table_rows, dim, rot_dim,                              \
            [=](unsigned v) { return static_cast<unsigned>(positions[v / heads]); });         \
  }
HK_ROPE(neox, Style::NeoX, bf16, hk::bf16)
HK_ROPE(neox, Style::NeoX, f16, hk::f16)
HK_ROPE(neox, Style::NeoX, f32, float)
HK_ROPE(gptj, Style::GptJ, bf16, hk::bf16)
HK_ROPE(gptj, Style::GptJ, f16, hk::f16)
HK_ROPE(gptj, Style::GptJ, f32, float)
