// hk/tile/mfma8.h: the matrix instructions of AMD CDNA for 8-bit inputs, behind the same
// MmaAtom API as hk/tile/mfma.h (16x16 blocks, one wave, read from shared tiles that keep k
// contiguous). Included by hk/tile/mma.h on AMD only.
//
//   element        gfx90a                     gfx942                       gfx950
//   i8 (i32 sums)  v_mfma_i32_16x16x16i8  k16 v_mfma_i32_16x16x32_i8  k32  v_mfma_i32_16x16x64_i8 k64
//   FP8 (f32 sums) none                       v_mfma_f32_16x16x32_fp8_fp8 (FNUZ)  the same (OCP)
//
// The FP8 instruction reads its bytes as FNUZ E4M3 on gfx942 and as OCP E4M3 on gfx950 (CDNA3
// and CDNA4 ISA guides), so an atom exists only for the format the target computes on: an
// fp8_e4m3fn kernel for gfx942, or fp8_e4m3fnuz for gfx950, fails to compile rather than
// computing garbage. The 16x16x64 i8 form is used on gfx950 over 32x32 for the reasons
// hk/tile/mfma.h gives.
//
// gfx9-4-generic (clang defines __gfx9_4_generic__, neither __gfx942__ nor __gfx950__) is code
// that runs on gfx942 and gfx950 alike, so it may use only what both execute the same way: the
// i8 atom takes v_mfma_i32_16x16x32_i8, which both have (gfx942 dropped gfx90a's 16x16x16i8),
// and there is no FP8 atom, the one FP8 instruction meaning FNUZ on one and OCP on the other
// (the FP8 GEMM modules skip the target, saying so).
//
// Lane layouts (the same guides): with kPerLane = kK / 4 bytes a lane,
//   A (16 x kK)   lane l holds row l % 16, kPerLane k values of k block l / 16
//   B (kK x 16)   lane l holds column l % 16, the same k values
//   C, D (16x16)  lane l holds C[4 (l / 16) + v][l % 16], v = 0 .. 3 (i32 or f32)
// A and B take the same k values for a lane, so reading kPerLane consecutive bytes of a row
// for both gives the product whatever order the instruction visits them in.
#pragma once

#include "../device.h"
#include "../fp8.h"

namespace hk::tile {

namespace detail {
// The 8-bit atom's instruction facts for element type T on this target.
template <typename T> struct Mfma8;

template <> struct Mfma8<i8> {
#if defined(__gfx950__)
  static constexpr unsigned kK = 64;
  using Operand = int __attribute__((ext_vector_type(4)));
#elif defined(__gfx942__) || defined(__gfx9_4_generic__)
  static constexpr unsigned kK = 32;
  using Operand = long;
#else
  static constexpr unsigned kK = 16;
  using Operand = int;
#endif
  using Acc = int __attribute__((ext_vector_type(4)));
  static HK_DEVICE Acc mma(Operand a, Operand b, Acc c) {
#if defined(__gfx950__)
    return __builtin_amdgcn_mfma_i32_16x16x64_i8(a, b, c, 0, 0, 0);
#elif defined(__gfx942__) || defined(__gfx9_4_generic__)
    return __builtin_amdgcn_mfma_i32_16x16x32_i8(a, b, c, 0, 0, 0);
#else
    return __builtin_amdgcn_mfma_i32_16x16x16i8(a, b, c, 0, 0, 0);
#endif
  }
};

#if defined(__gfx942__) || defined(__gfx950__)
// The E4M3 format the target's FP8 MFMA computes on.
#if defined(__gfx942__)
using MfmaE4m3 = fp8_e4m3fnuz;
#else
using MfmaE4m3 = fp8_e4m3fn;
#endif
template <> struct Mfma8<MfmaE4m3> {
  static constexpr unsigned kK = 32;
  using Operand = long;
  using Acc = float __attribute__((ext_vector_type(4)));
  static HK_DEVICE Acc mma(Operand a, Operand b, Acc c) {
    return __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a, b, c, 0, 0, 0);
  }
};
#endif
}  // namespace detail

template <typename T> struct MmaAtom8 {
  using Mfma = detail::Mfma8<T>;
  static constexpr unsigned kK = Mfma::kK;
  static constexpr unsigned kM = 16, kN = 16;
  static constexpr unsigned kPerLane = kK / 4;  // bytes a lane reads of an operand
  static_assert(sizeof(typename Mfma::Operand) == kPerLane);

  struct A { typename Mfma::Operand v; };
  struct B { typename Mfma::Operand v; };
  struct C {
    typename Mfma::Acc v;
    static constexpr unsigned kSize = 4;
  };

  // A[row0 .. row0+15][k0 .. k0+kK-1] of a tile stored [M][K]: kPerLane bytes within one
  // 16-byte chunk, one LDS read.
  template <class Tile> static HK_DEVICE A load_a(const Tile& s, unsigned row0, unsigned k0) {
    const unsigned l = lane_id();
    return {*reinterpret_cast<const typename Mfma::Operand*>(
        s.at(row0 + l % 16, k0 + kPerLane * (l / 16)))};
  }

  // B[k0 ..][n0 .. n0+15] of a tile stored [N][K] (B transposed): as A. (8-bit B stored [K][N]
  // is not offered: no transposing LDS read of bytes, and weights come as [N][K].)
  template <class Tile> static HK_DEVICE B load_b_nk(const Tile& s, unsigned n0, unsigned k0) {
    const unsigned l = lane_id();
    return {*reinterpret_cast<const typename Mfma::Operand*>(
        s.at(n0 + l % 16, k0 + kPerLane * (l / 16)))};
  }

  static HK_DEVICE void mma(C& c, const A& a, const B& b) { c.v = Mfma::mma(a.v, b.v, c.v); }

  static HK_DEVICE unsigned row(unsigned v) { return 4 * (lane_id() / 16) + v; }
  static HK_DEVICE unsigned col(unsigned) { return lane_id() % 16; }
};

template <> struct MmaAtom<i8> : MmaAtom8<i8> {};
#if defined(__gfx942__) || defined(__gfx950__)
template <> struct MmaAtom<detail::MfmaE4m3> : MmaAtom8<detail::MfmaE4m3> {};
#endif

}  // namespace hk::tile
