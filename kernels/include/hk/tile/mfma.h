// hk/tile/mfma.h: the matrix instructions of AMD CDNA (gfx90a, gfx942, gfx950) for 16-bit
// inputs, with their operands read from shared tiles. Included by hk/tile/mma.h on AMD only.
//
// One MmaAtom step computes a 16x16 f32 block over k = kK with one wave (64 lanes):
//   gfx90a, gfx942  v_mfma_f32_16x16x16bf16_1k / v_mfma_f32_16x16x16f16 (gfx942 spells them
//                   v_mfma_f32_16x16x16_bf16 / _f16)          kK = 16, 4 elements per lane
//   gfx950          v_mfma_f32_16x16x32_bf16 / _f16             kK = 32, 8 elements per lane
// The 16x16 forms are used rather than 32x32 (32x32x8 / 32x32x16): same rate per CU, smaller
// register blocks, and the CDNA emulator our tests can use places 32x32 results wrongly.
//
// Lane layouts (AMD CDNA3 and CDNA4 ISA guides, "Matrix fused multiply-add"; the same for both
// 16x16 shapes with kPerLane = kK / 4 consecutive k values per lane):
//   A (16 x kK)   lane l holds A[l % 16][kPerLane (l / 16) + j], j = 0 .. kPerLane-1
//   B (kK x 16)   lane l holds B[kPerLane (l / 16) + j][l % 16]
//   C, D (16x16)  lane l holds C[4 (l / 16) + v][l % 16], v = 0 .. 3 (four f32 registers)
// So A rows and B columns are read as kPerLane consecutive k values: one 8- or 16-byte LDS
// read from a tile that keeps k contiguous.
#pragma once

#include "../device.h"

namespace hk::tile {

template <typename T> struct MmaAtom {
  // The 8-bit atoms are specializations (hk/tile/mfma8.h); an 8-bit type that reaches this one
  // has no instruction here, and above all must not run on the other FP8 format's.
  static_assert(sizeof(T) == 2,
                "no MFMA of this target multiplies this element type: the FP8 MFMA reads "
                "fp8_e4m3fnuz on gfx942 and fp8_e4m3fn on gfx950, gfx90a has none "
                "(hk/tile/mfma8.h)");
#if defined(__gfx950__)
  static constexpr unsigned kK = 32;
#else
  static constexpr unsigned kK = 16;
#endif
  static constexpr unsigned kM = 16, kN = 16;
  static constexpr unsigned kPerLane = kK / 4;  // k values per lane of an operand
  using Operand = T __attribute__((ext_vector_type(kPerLane)));
  using Acc = float __attribute__((ext_vector_type(4)));

  struct A { Operand v; };
  struct B { Operand v; };
  struct C {
    Acc v;
    static constexpr unsigned kSize = 4;
  };

  // A[row0 .. row0+15][k0 .. k0+kK-1] of a tile stored [M][K]: kPerLane consecutive elements,
  // within one 16-byte chunk, so one LDS read.
  template <class Tile> static HK_DEVICE A load_a(const Tile& s, unsigned row0, unsigned k0) {
    const unsigned l = lane_id();
    return {*reinterpret_cast<const Operand*>(s.at(row0 + l % 16, k0 + kPerLane * (l / 16)))};
  }

  // B[k0 ..][n0 .. n0+15] of a tile stored [N][K] (B transposed): as A.
  template <class Tile> static HK_DEVICE B load_b_nk(const Tile& s, unsigned n0, unsigned k0) {
    const unsigned l = lane_id();
    return {*reinterpret_cast<const Operand*>(s.at(n0 + l % 16, k0 + kPerLane * (l / 16)))};
  }

  // The same block of a tile stored [K][N]: a lane's k values are a column, kPerLane 2-byte
  // reads. (CDNA has no transposing LDS read before gfx950's ds_read_b64_tr_b16.)
  template <class Tile> static HK_DEVICE B load_b_kn(const Tile& s, unsigned k0, unsigned n0) {
    const unsigned l = lane_id();
    B b;
#pragma unroll
    for (unsigned j = 0; j < kPerLane; ++j)
      b.v[j] = *s.at(k0 + kPerLane * (l / 16) + j, n0 + l % 16);
    return b;
  }

  static HK_DEVICE void mma(C& c, const A& a, const B& b) {
#if defined(__gfx950__)
    if constexpr (__is_same(T, bf16))
      c.v = __builtin_amdgcn_mfma_f32_16x16x32_bf16(a.v, b.v, c.v, 0, 0, 0);
    else
      c.v = __builtin_amdgcn_mfma_f32_16x16x32_f16(a.v, b.v, c.v, 0, 0, 0);
#else
    if constexpr (__is_same(T, bf16)) {
      using Bits = short __attribute__((ext_vector_type(4)));
      c.v = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(Bits, a.v),
                                                      __builtin_bit_cast(Bits, b.v), c.v, 0, 0, 0);
    } else {
      c.v = __builtin_amdgcn_mfma_f32_16x16x16f16(a.v, b.v, c.v, 0, 0, 0);
    }
#endif
  }

  // Where accumulator element v of this lane sits in the 16x16 block.
  static HK_DEVICE unsigned row(unsigned v) { return 4 * (lane_id() / 16) + v; }
  static HK_DEVICE unsigned col(unsigned) { return lane_id() % 16; }
};

}  // namespace hk::tile
