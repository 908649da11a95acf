// hk/tile/mma_sync.h: the matrix instruction of NVIDIA sm_80 and sm_90 for 16-bit inputs,
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (D = A·B + C, A 16x16 row
// major, B 16x8 column major, C and D f32), with its operands read from shared tiles by
// ldmatrix. Included by hk/tile/mma.h on NVIDIA only. (sm_90's faster wgmma needs sm_90a code:
// hk/tile/wgmma.h.)
//
// One MmaAtom step computes a 16x16 block of the result over k = 16: two m16n8k16 instructions
// sharing the A fragment. Lane layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
// floating point type"), with g = lane / 4 (the group) and t = lane % 4 (the thread in group),
// each 32-bit register holding two 16-bit elements, the lower-indexed one in the low half:
//   A (16x16, row major)   a[0]: A[g][2t, 2t+1]      a[1]: A[g+8][2t, 2t+1]
//                          a[2]: A[g][2t+8, 2t+9]    a[3]: A[g+8][2t+8, 2t+9]
//   B (16x8, per half h)   b[2h]: B[2t, 2t+1][g]     b[2h+1]: B[2t+8, 2t+9][g]  (k pairs, column g)
//   C, D (16x8, half h)    c[4h]: C[g][2t]      c[4h+1]: C[g][2t+1]
//                          c[4h+2]: C[g+8][2t]  c[4h+3]: C[g+8][2t+1]   (columns 8h + those)
//
// ldmatrix.m8n8.x4 reads four 8x8 matrices of 16-bit elements: lanes 8i..8i+7 give the
// addresses of matrix i's 8 rows (16 bytes each), and register i of lane l receives matrix i's
// row l / 4, elements 2(l % 4) and 2(l % 4) + 1 (with .trans, column l / 4, rows 2(l % 4) and
// 2(l % 4) + 1). So a row-major 16x16 A block read as matrices (rows 0-7, k 0-7), (rows 8-15,
// k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) lands exactly as a[0..3]; B stored [n][k]
// (B transposed, K contiguous) reads without .trans, B stored [k][n] with .trans.
#pragma once

#include "../device.h"

namespace hk::tile {

namespace detail {
// The 32-bit shared-window address of a generic pointer into shared memory, as ldmatrix takes.
HK_DEVICE unsigned shared_address(const void* p) {
  return static_cast<unsigned>(reinterpret_cast<unsigned long long>(
      (__attribute__((address_space(3))) const void*)p));
}

HK_DEVICE void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

HK_DEVICE void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

// d += a·b for one m16n8k16 block; b is the two registers of one 8-column half.
template <typename T>
HK_DEVICE void mma_m16n8k16(float* d, const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (__is_same(T, bf16)) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(__is_same(T, f16), "mma.sync takes bf16 or f16 here");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
}  // namespace detail

// Where accumulator element v of the calling lane sits in a 16x16 block (two 8-column halves
// of four each): m16n8k16's C layout, and m16n8k32's (hk/tile/mma_sync8.h). Elements 2i and
// 2i + 1 are neighbours in one row.
struct AccumulatorLayout {
  static HK_DEVICE unsigned row(unsigned v) { return lane_id() / 4 + 8 * (v / 2 % 2); }
  static HK_DEVICE unsigned col(unsigned v) { return 8 * (v / 4) + 2 * (lane_id() % 4) + v % 2; }
};

template <typename T> struct MmaAtom : AccumulatorLayout {
  // The 8-bit atoms are specializations (hk/tile/mma_sync8.h); an 8-bit type that reaches this
  // one has no instruction here.
  static_assert(sizeof(T) == 2,
                "no mma.sync of this target multiplies this element type: the FP8 atom takes "
                "fp8_e4m3fn only, on sm_89 and later (hk/tile/mma_sync8.h)");
  static constexpr unsigned kM = 16, kN = 16, kK = 16;
  struct A { unsigned r[4]; };
  struct B { unsigned r[4]; };  // two 8-column halves, two registers each
  struct C {
    float v[8];
    static constexpr unsigned kSize = 8;
  };

  // A[row0 .. row0+15][k0 .. k0+15] of a row-major [M][K] tile: lane l addresses row l % 16,
  // chunk l / 16 (matrices 0-3 as in the header).
  template <class Tile> static HK_DEVICE A load_a(const Tile& s, unsigned row0, unsigned k0) {
    const unsigned l = lane_id();
    A a;
    detail::ldmatrix_x4(a.r, s.at(row0 + l % 16, k0 + 8 * (l / 16)));
    return a;
  }

  // B[k0 .. k0+15][n0 .. n0+15] of a tile stored [N][K] (B transposed): matrix i is
  // (n half i / 2, k half i % 2), so lane l addresses n = l % 8 + 8 (l / 16), k chunk l / 8 % 2.
  template <class Tile> static HK_DEVICE B load_b_nk(const Tile& s, unsigned n0, unsigned k0) {
    const unsigned l = lane_id();
    B b;
    detail::ldmatrix_x4(b.r, s.at(n0 + l % 8 + 8 * (l / 16), k0 + 8 * (l / 8 % 2)));
    return b;
  }

  // The same block of a tile stored [K][N]: transposed reads, matrix i is (k half i % 2,
  // n half i / 2), so lane l addresses k = l % 8 + 8 (l / 8 % 2), n chunk l / 16.
  template <class Tile> static HK_DEVICE B load_b_kn(const Tile& s, unsigned k0, unsigned n0) {
    const unsigned l = lane_id();
    B b;
    detail::ldmatrix_x4_trans(b.r, s.at(k0 + l % 8 + 8 * (l / 8 % 2), n0 + 8 * (l / 16)));
    return b;
  }

  static HK_DEVICE void mma(C& c, const A& a, const B& b) {
    detail::mma_m16n8k16<T>(c.v, a.r, b.r[0], b.r[1]);
    detail::mma_m16n8k16<T>(c.v + 4, a.r, b.r[2], b.r[3]);
  }
};

}  // namespace hk::tile
