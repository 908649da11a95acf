// hk/tile/mma_sync8.h: the matrix instructions of NVIDIA for 8-bit inputs, behind the same
// MmaAtom API as hk/tile/mma_sync.h:
//   i8           mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32      sm_80, sm_90
//   fp8_e4m3fn   mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32  sm_89+, PTX ISA 8.4
//                (a module using it adds --cuda-feature=+ptx84 for sm_90; there is no FNUZ
//                form, and sm_80 has no FP8 instruction)
// Included by hk/tile/mma.h on NVIDIA only.
//
// One MmaAtom step computes a 16x16 block over k = 32: two m16n8k32 sharing the A fragment.
// Lane layouts (PTX ISA, "Matrix Fragments for mma.m16n8k32"), g = lane / 4, t = lane % 4,
// each 32-bit register holding four 8-bit elements, the lowest-indexed in the low byte:
//   A (16x32, row major)   a[0]: A[g][4t .. 4t+3]      a[1]: A[g+8][4t .. 4t+3]
//                          a[2]: A[g][16+4t .. +3]     a[3]: A[g+8][16+4t .. +3]
//   B (32x8, per half h)   b[2h]: B[4t .. 4t+3][g]     b[2h+1]: B[16+4t .. +3][g]
//   C, D                   as m16n8k16's (hk/tile/mma_sync.h), i32 or f32
// ldmatrix.m8n8.x4.b16 reads 8 rows of 16 bytes per matrix and gives lane l the 4 bytes at
// byte 4 (l % 4) of row l / 4: exactly the fragment above when a matrix is 8 rows of 16 k
// values. So the 16-bit atom's addressing carries over with chunks of 16 k values instead of 8.
#pragma once

#include "../device.h"
#include "../fp8.h"

namespace hk::tile {

namespace detail {
template <typename T> struct MmaSync8;
template <> struct MmaSync8<i8> {
  using Acc = int;
  static HK_DEVICE void mma(int* d, const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
template <> struct MmaSync8<fp8_e4m3fn> {
  using Acc = float;
  static HK_DEVICE void mma(float* d, const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
#endif
}  // namespace detail

template <typename T> struct MmaAtom8 {
  using Sync = detail::MmaSync8<T>;
  static constexpr unsigned kM = 16, kN = 16, kK = 32;
  static constexpr unsigned kHalfK = 16;  // k values of one 16-byte ldmatrix row
  struct A { unsigned r[4]; };
  struct B { unsigned r[4]; };  // two 8-column halves, two registers each
  struct C {
    typename Sync::Acc v[8];
    static constexpr unsigned kSize = 8;
  };

  // Lane l addresses row l % 16, k half l / 16 (matrices a[0..3] as in the header).
  template <class Tile> static HK_DEVICE A load_a(const Tile& s, unsigned row0, unsigned k0) {
    const unsigned l = lane_id();
    A a;
    detail::ldmatrix_x4(a.r, s.at(row0 + l % 16, k0 + kHalfK * (l / 16)));
    return a;
  }

  // B stored [N][K]: matrix i is (n half i / 2, k half i % 2). (8-bit B stored [K][N] is not
  // offered: ldmatrix transposes 16-bit elements only, and weights come as [N][K].)
  template <class Tile> static HK_DEVICE B load_b_nk(const Tile& s, unsigned n0, unsigned k0) {
    const unsigned l = lane_id();
    B b;
    detail::ldmatrix_x4(b.r, s.at(n0 + l % 8 + 8 * (l / 16), k0 + kHalfK * (l / 8 % 2)));
    return b;
  }

  static HK_DEVICE void mma(C& c, const A& a, const B& b) {
    Sync::mma(c.v, a.r, b.r[0], b.r[1]);
    Sync::mma(c.v + 4, a.r, b.r[2], b.r[3]);
  }

  static HK_DEVICE unsigned row(unsigned v) { return lane_id() / 4 + 8 * (v / 2 % 2); }
  static HK_DEVICE unsigned col(unsigned v) { return 8 * (v / 4) + 2 * (lane_id() % 4) + v % 2; }
};

template <> struct MmaAtom<i8> : MmaAtom8<i8> {};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
template <> struct MmaAtom<fp8_e4m3fn> : MmaAtom8<fp8_e4m3fn> {};
#endif

}  // namespace hk::tile
