// hk/tile/mma_sync8.h: the matrix instructions of NVIDIA for 8-bit inputs, behind the same
// MmaAtom API as hk/tile/mma_sync.h:
//   i8           mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32      sm_80, sm_90
//   fp8_e4m3fn   widened to f16 in registers, then mma.sync m16n8k16 f16 (hk/tile/mma_sync.h)
//                sm_89+ (there is no FNUZ form, and sm_80 has no FP8 conversion)
// Included by hk/tile/mma.h on NVIDIA only.
//
// Why E4M3 is widened: sm_90 has no FP8 mma.sync instruction (only wgmma reads FP8 there;
// sm_89's QMMA is not in sm_90). ptxas lowers mma.sync m16n8k32 e4m3 to F2FP conversions of
// both operands, two f16 HMMA.16816 on zeroed accumulators and four FADDs into the real ones
// (nvdisasm of sm_90 code). Widening each fragment once where it is loaded, and accumulating
// in the HMMAs, does the same multiply with neither the repeated conversions nor the adds.
// It is exact: every E4M3 value is an f16, and products of two are exact in f32.
//
// One MmaAtom step computes a 16x16 block over k = 32 (two m16n8k32, or four m16n8k16, sharing
// the A fragment). Lane layouts (PTX ISA, "Matrix Fragments for mma.m16n8k32"), g = lane / 4,
// t = lane % 4, each 32-bit register holding four 8-bit elements, the lowest-indexed in the
// low byte:
//   A (16x32, row major)   a[0]: A[g][4t .. 4t+3]      a[1]: A[g+8][4t .. 4t+3]
//                          a[2]: A[g][16+4t .. +3]     a[3]: A[g+8][16+4t .. +3]
//   B (32x8, per half h)   b[2h]: B[4t .. 4t+3][g]     b[2h+1]: B[16+4t .. +3][g]
//   C, D                   as m16n8k16's (hk/tile/mma_sync.h), i32 or f32
// ldmatrix.m8n8.x4.b16 reads 8 rows of 16 bytes per matrix and gives lane l the 4 bytes at
// byte 4 (l % 4) of row l / 4: exactly the fragment above when a matrix is 8 rows of 16 k
// values. So the 16-bit atom's addressing carries over with chunks of 16 k values instead of 8.
//
// The widened E4M3 fragments: a register of four codes, k = 4t .. 4t+3 of one 16-deep half,
// widens to two f16 pairs, lo (4t, 4t+1) and hi (4t+2, 4t+3). An m16n8k16 takes k pairs
// (2t, 2t+1) and (2t+8, 2t+9) of the lane, in A's registers 0-1 and 2-3 and B's 0 and 1 (the
// 16-bit layouts). Giving it lo where it expects (2t, 2t+1) and hi where it expects
// (2t+8, 2t+9), in A and B alike, feeds it the half's 16 k values in another order, the same
// for both operands: the same dot products.
#pragma once

#include "../device.h"
#include "../fp8.h"
#include "mma_sync.h"

namespace hk::tile {

namespace detail {
HK_DEVICE void mma_m16n8k32_s8(int* d, const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
}  // namespace detail

// The ldmatrix addressing of an 8-bit [rows][K] tile, shared by the atoms below.
struct Ldmatrix8 {
  static constexpr unsigned kHalfK = 16;  // k values of one 16-byte ldmatrix row

  // Lane l addresses row l % 16, k half l / 16 (matrices a[0..3] as in the header).
  template <class Tile>
  static HK_DEVICE void a(unsigned (&r)[4], const Tile& s, unsigned row0, unsigned k0) {
    const unsigned l = lane_id();
    detail::ldmatrix_x4(r, s.at(row0 + l % 16, k0 + kHalfK * (l / 16)));
  }

  // B stored [N][K]: matrix i is (n half i / 2, k half i % 2). (8-bit B stored [K][N] is not
  // offered: ldmatrix transposes 16-bit elements only, and weights come as [N][K].)
  template <class Tile>
  static HK_DEVICE void b_nk(unsigned (&r)[4], const Tile& s, unsigned n0, unsigned k0) {
    const unsigned l = lane_id();
    detail::ldmatrix_x4(r, s.at(n0 + l % 8 + 8 * (l / 16), k0 + kHalfK * (l / 8 % 2)));
  }
};

template <> struct MmaAtom<i8> : AccumulatorLayout {
  static constexpr unsigned kM = 16, kN = 16, kK = 32;
  struct A { unsigned r[4]; };
  struct B { unsigned r[4]; };  // two 8-column halves, two registers each
  struct C {
    int v[8];
    static constexpr unsigned kSize = 8;
  };

  template <class Tile> static HK_DEVICE A load_a(const Tile& s, unsigned row0, unsigned k0) {
    A a;
    Ldmatrix8::a(a.r, s, row0, k0);
    return a;
  }
  template <class Tile> static HK_DEVICE B load_b_nk(const Tile& s, unsigned n0, unsigned k0) {
    B b;
    Ldmatrix8::b_nk(b.r, s, n0, k0);
    return b;
  }

  static HK_DEVICE void mma(C& c, const A& a, const B& b) {
    detail::mma_m16n8k32_s8(c.v, a.r, b.r[0], b.r[1]);
    detail::mma_m16n8k32_s8(c.v + 4, a.r, b.r[2], b.r[3]);
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
namespace detail {
// Four codes (k = 4t .. 4t+3 of a lane) as f16 pairs: lo (4t, 4t+1), hi (4t+2, 4t+3).
template <typename T> struct Widened {
  unsigned lo, hi;
  HK_DEVICE explicit Widened(unsigned codes)
      : lo(fp8_detail::widen2_f16<T>(static_cast<unsigned short>(codes))),
        hi(fp8_detail::widen2_f16<T>(static_cast<unsigned short>(codes >> 16))) {}
};
}  // namespace detail

template <> struct MmaAtom<fp8_e4m3fn> : AccumulatorLayout {
  static constexpr unsigned kM = 16, kN = 16, kK = 32;
  // The m16n8k16 operands of each 16-deep half h (see the header for the order of k).
  struct A { unsigned r[2][4]; };
  struct B { unsigned r[2][2][2]; };  // [8-column half][h]
  using C = MmaAtom<f16>::C;          // the f16 instruction's accumulators

  template <class Tile> static HK_DEVICE A load_a(const Tile& s, unsigned row0, unsigned k0) {
    unsigned codes[4];
    Ldmatrix8::a(codes, s, row0, k0);
    A a;
#pragma unroll
    for (unsigned h = 0; h < 2; ++h) {
      const detail::Widened<fp8_e4m3fn> top(codes[2 * h]), bottom(codes[2 * h + 1]);
      a.r[h][0] = top.lo;
      a.r[h][1] = bottom.lo;
      a.r[h][2] = top.hi;
      a.r[h][3] = bottom.hi;
    }
    return a;
  }

  template <class Tile> static HK_DEVICE B load_b_nk(const Tile& s, unsigned n0, unsigned k0) {
    unsigned codes[4];
    Ldmatrix8::b_nk(codes, s, n0, k0);
    B b;
#pragma unroll
    for (unsigned half = 0; half < 2; ++half)
#pragma unroll
      for (unsigned h = 0; h < 2; ++h) {
        const detail::Widened<fp8_e4m3fn> w(codes[2 * half + h]);
        b.r[half][h][0] = w.lo;
        b.r[half][h][1] = w.hi;
      }
    return b;
  }

  static HK_DEVICE void mma(C& c, const A& a, const B& b) {
#pragma unroll
    for (unsigned h = 0; h < 2; ++h)
#pragma unroll
      for (unsigned half = 0; half < 2; ++half)
        detail::mma_m16n8k16<f16>(c.v + 4 * half, a.r[h], b.r[half][h][0], b.r[half][h][1]);
  }
};
#endif

}  // namespace hk::tile
