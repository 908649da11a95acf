// hk/tile/wgmma.h: Hopper's warpgroup matrix instruction, wgmma.mma_async (sm_90a code only:
// the instruction exists on compute capability 9.0 alone, so only the arch-specific target
// compiles it; plain sm_90 code keeps mma.sync, hk/tile/mma_sync.h).
//
// A warpgroup (four consecutive warps, 128 threads, the first warp's index a multiple of 4)
// multiplies a 64 x kN block of A (from shared memory) by a kN-column block of B (shared
// memory) and adds the product to f32 (i32 for s8) accumulators spread over its registers.
// The instruction is asynchronous: it is issued, committed as a group, and its registers may
// be read only after wgmma.wait_group says the group is done; the shared operands must stay
// unchanged until then too.
//
// Operands are described, not loaded: a 64-bit matrix descriptor gives the shared address, the
// distance between groups of 8 rows and the swizzle (PTX ISA, "Matrix Descriptor Format"):
//   bits 0-13   start address >> 4        bits 16-29  leading byte offset >> 4 (unused here)
//   bits 32-45  stride byte offset >> 4   bits 62-63  swizzle: 1 = 128-byte
// hk/tile/shared.h's SharedTile with rows of exactly 128 bytes (64 16-bit or 128 8-bit
// elements) is the K-major 128-byte-swizzle layout wgmma reads: chunk c of row r sits at chunk
// c ^ (r % 8), and 8 rows (1024 bytes) repeat the pattern, so the stride byte offset is 1024.
// The swizzle is applied by the hardware to the address bits, so the tile must start on a
// 1024-byte boundary and a step of k within the row is a plain offset of the start address.
//
// Accumulator layout (the m64nNk16 "D" fragment): the thread of warp w (of 4) and lane l holds,
// for each 8-column block j, D[16w + l/4 + 8i][8j + 2(l%4) + e] in register 4j + 2i + e.
#pragma once

#include "../device.h"
#include "../fp8.h"
#include "shared.h"

#if HK_SM90A

namespace hk::tile {

inline constexpr unsigned kWarpgroupThreads = 128;

namespace wgmma {

namespace detail {
HK_DEVICE unsigned shared_address(const void* p) {
  return static_cast<unsigned>(reinterpret_cast<unsigned long long>(
      (__attribute__((address_space(3))) const void*)p));
}
}  // namespace detail

// The descriptor of rows row0.. of a 128-byte-row SharedTile, from element k0 of each row on
// (row0 a multiple of 8, k0 a multiple of the instruction's k).
template <class Tile>
HK_DEVICE unsigned long long descriptor(const Tile& t, unsigned row0, unsigned k0) {
  static_assert(Tile::kCols * sizeof(typename Tile::Element) == 128,
                "wgmma reads SharedTiles of 128-byte rows (the 128-byte swizzle)");
  const unsigned address = detail::shared_address(t.data + row0 * Tile::kCols + k0);
  constexpr unsigned long long kStride = 1024 >> 4;  // 8 rows of 128 bytes
  constexpr unsigned long long kSwizzle128 = 1;
  return (address & 0x3FFFF) >> 4 | 1ull << 16 | kStride << 32 | kSwizzle128 << 62;
}

// The descriptor of a [k][n] operand kept N-major ("transposed", imm-trans-b = 1): B of
// D = A·B read from SharedPanels whose rows are k (keys, for attention's P·V) and whose 64-column
// panels of 128-byte swizzled rows hold n. From row k0 on (a multiple of 8). For N-major
// swizzled layouts the stride byte offset is the step between groups of 8 k rows (1024 bytes)
// and the leading byte offset the step between 64-element groups of n, here one panel to the
// next (PTX ISA, "Leading Dimension Byte Offset" and "Stride Dimension Byte Offset").
template <class Panels> HK_DEVICE unsigned long long descriptor_n_major(const Panels& t, unsigned k0) {
  using Panel = typename Panels::Panel;
  static_assert(Panel::kCols * sizeof(typename Panel::Element) == 128,
                "wgmma reads panels of 128-byte rows (the 128-byte swizzle)");
  const unsigned address = detail::shared_address(t.panel[0].data + k0 * Panel::kCols);
  constexpr unsigned long long kLeading = sizeof(Panel) >> 4;
  static_assert(kLeading < (1u << 14), "a panel step the descriptor's 14 bits can hold");
  constexpr unsigned long long kStride = 1024 >> 4;
  constexpr unsigned long long kSwizzle128 = 1;
  return (address & 0x3FFFF) >> 4 | kLeading << 16 | kStride << 32 | kSwizzle128 << 62;
}

// Orders the warpgroup's earlier register and shared-memory accesses before the wgmma that
// follow (required before the first wgmma, and after the accumulators were written otherwise).
HK_DEVICE void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// Closes the group of wgmma issued since the last commit.
HK_DEVICE void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most kPending committed groups are in flight.
template <int kPending> HK_DEVICE void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Ties the accumulators to this point of the program: the compiler may not move their reads or
// writes across it (wgmma's asynchronous writes are invisible to it otherwise).
template <typename V, unsigned kN> HK_DEVICE void pin(V (&d)[kN]) {
#pragma unroll
  for (unsigned i = 0; i < kN; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <unsigned kN> HK_DEVICE void pin(float (&d)[kN]) {
#pragma unroll
  for (unsigned i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// What each input type's instruction takes: k is 32 bytes of it (16 16-bit or 32 8-bit
// elements), and s8 sums in i32, the floats in f32. (mma() names the types it multiplies.)
template <typename T> struct Kind {
  static constexpr unsigned kK = 32 / sizeof(T);
  using Acc = __typeof__(__builtin_choose_expr(__is_same(T, i8), 0, 0.0f));
};

// Register lists "{%0, ..., %(n-1)}" (inline asm wants a string literal, so they are spelled
// out by tens) and the operand lists binding them to d[0..n).
#define HK_WG_TENS(t) \
  "%" #t "0, %" #t "1, %" #t "2, %" #t "3, %" #t "4, %" #t "5, %" #t "6, %" #t "7, %" #t "8, %" #t "9"
#define HK_WG_UNITS "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9"
#define HK_WG_REGS_32 \
  "{" HK_WG_UNITS ", " HK_WG_TENS(1) ", " HK_WG_TENS(2) ", %30, %31}"
#define HK_WG_REGS_48                                                                    \
  "{" HK_WG_UNITS ", " HK_WG_TENS(1) ", " HK_WG_TENS(2) ", " HK_WG_TENS(3) \
  ", %40, %41, %42, %43, %44, %45, %46, %47}"
#define HK_WG_REGS_64                                                                   \
  "{" HK_WG_UNITS ", " HK_WG_TENS(1) ", " HK_WG_TENS(2) ", " HK_WG_TENS(3) ", " HK_WG_TENS(4) \
  ", " HK_WG_TENS(5) ", %60, %61, %62, %63}"
#define HK_WG_REGS_128                                                                  \
  "{" HK_WG_UNITS ", " HK_WG_TENS(1) ", " HK_WG_TENS(2) ", " HK_WG_TENS(3) ", " HK_WG_TENS(4) \
  ", " HK_WG_TENS(5) ", " HK_WG_TENS(6) ", " HK_WG_TENS(7) ", " HK_WG_TENS(8) ", "            \
  HK_WG_TENS(9) ", " HK_WG_TENS(10) ", " HK_WG_TENS(11) ", %120, %121, %122, %123, %124, %125, %126, %127}"
#define HK_WG_D8(c, i) \
  c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3]), c(d[i + 4]), c(d[i + 5]), c(d[i + 6]), c(d[i + 7])
#define HK_WG_D32(c, i) HK_WG_D8(c, i), HK_WG_D8(c, i + 8), HK_WG_D8(c, i + 16), HK_WG_D8(c, i + 24)
#define HK_WG_D48(c, i) HK_WG_D32(c, i), HK_WG_D8(c, i + 32), HK_WG_D8(c, i + 40)
#define HK_WG_D64(c, i) HK_WG_D32(c, i), HK_WG_D32(c, i + 32)
#define HK_WG_D128(c, i) HK_WG_D64(c, i), HK_WG_D64(c, i + 64)

// "wgmma... d, a-desc, b-desc, p<tail>" with p = (accumulate != 0): the descriptors and the
// flag are the operands after the n accumulators.
#define HK_WG_ASM(instr, n, regs, a, b, s, tail, c)                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " s ", 0;\n" instr " " regs ", " a ", " b \
               ", p" tail ";\n}\n"                                                       \
               : HK_WG_D##n(c, 0)                                                        \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))
#define HK_WG_SHAPE(instr, tail, c)                                                          \
  if constexpr (kN == 64)                                                                    \
    HK_WG_ASM(instr, 32, HK_WG_REGS_32, "%32", "%33", "%34", tail, c);                       \
  else if constexpr (kN == 96)                                                               \
    HK_WG_ASM(instr, 48, HK_WG_REGS_48, "%48", "%49", "%50", tail, c);                       \
  else if constexpr (kN == 128)                                                              \
    HK_WG_ASM(instr, 64, HK_WG_REGS_64, "%64", "%65", "%66", tail, c);                       \
  else                                                                                       \
    HK_WG_ASM(instr, 128, HK_WG_REGS_128, "%128", "%129", "%130", tail, c)

// d (+)= A·Bᵀ for one k step: A 64 x kK (desc_a), B kN x kK (desc_b), both K-major; d is the
// warpgroup's 64 x kN accumulator block (kN / 2 registers a thread). kN is 64, 128 or 256, or
// 96 for 16-bit types (attention's scores at d = 128, where 128 keys do not fit the registers). accumulate = 0 overwrites
// d with the product.
template <typename T, unsigned kN>
HK_DEVICE void mma(typename Kind<T>::Acc (&d)[kN / 2], unsigned long long desc_a,
                   unsigned long long desc_b, unsigned accumulate) {
  static_assert(kN == 64 || kN == 128 || kN == 256 || (kN == 96 && sizeof(T) == 2),
                "wgmma blocks of 64, 128 or 256 columns (or 96, of 16-bit types)");
#define HK_WG_F32(shape, types, tail) \
  HK_WG_SHAPE("wgmma.mma_async.sync.aligned." shape ".f32." types, tail, "+f")
  if constexpr (__is_same(T, bf16)) {
    if constexpr (kN == 64) HK_WG_F32("m64n64k16", "bf16.bf16", ", 1, 1, 0, 0");
    else if constexpr (kN == 96) HK_WG_F32("m64n96k16", "bf16.bf16", ", 1, 1, 0, 0");
    else if constexpr (kN == 128) HK_WG_F32("m64n128k16", "bf16.bf16", ", 1, 1, 0, 0");
    else HK_WG_F32("m64n256k16", "bf16.bf16", ", 1, 1, 0, 0");
  } else if constexpr (__is_same(T, f16)) {
    if constexpr (kN == 64) HK_WG_F32("m64n64k16", "f16.f16", ", 1, 1, 0, 0");
    else if constexpr (kN == 96) HK_WG_F32("m64n96k16", "f16.f16", ", 1, 1, 0, 0");
    else if constexpr (kN == 128) HK_WG_F32("m64n128k16", "f16.f16", ", 1, 1, 0, 0");
    else HK_WG_F32("m64n256k16", "f16.f16", ", 1, 1, 0, 0");
  } else if constexpr (__is_same(T, fp8_e4m3fn)) {
    if constexpr (kN == 64) HK_WG_F32("m64n64k32", "e4m3.e4m3", ", 1, 1");
    else if constexpr (kN == 128) HK_WG_F32("m64n128k32", "e4m3.e4m3", ", 1, 1");
    else HK_WG_F32("m64n256k32", "e4m3.e4m3", ", 1, 1");
  } else if constexpr (__is_same(T, fp8_e5m2)) {
    if constexpr (kN == 64) HK_WG_F32("m64n64k32", "e5m2.e5m2", ", 1, 1");
    else if constexpr (kN == 128) HK_WG_F32("m64n128k32", "e5m2.e5m2", ", 1, 1");
    else HK_WG_F32("m64n256k32", "e5m2.e5m2", ", 1, 1");
  } else {
    static_assert(__is_same(T, i8), "wgmma multiplies bf16, f16, E4M3, E5M2 or s8 here");
#define HK_WG_S32(shape) HK_WG_SHAPE("wgmma.mma_async.sync.aligned." shape ".s32.s8.s8", "", "+r")
    if constexpr (kN == 64) HK_WG_S32("m64n64k32");
    else if constexpr (kN == 128) HK_WG_S32("m64n128k32");
    else HK_WG_S32("m64n256k32");
#undef HK_WG_S32
  }
#undef HK_WG_F32
}

// A from registers: the operand lists after the n accumulators are a[0..4), desc_b, accumulate.
#define HK_WG_ASM_RS(instr, n, regs, ra, rb, rs, c)                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " rs ", 0;\n" instr " " regs ", " ra ", " rb \
               ", p, 1, 1, 1;\n}\n"                                                      \
               : HK_WG_D##n(c, 0)                                                        \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

// d (+)= A·B for one k step of 16, A the warpgroup's 64 x 16 block in registers (the
// m64nNk16 A fragment: the thread of warp w and lane l holds rows 16w + l/4 and + 8, columns
// 2(l%4), + 1 and + 8, + 9, as pairs in a[0] (row, low columns), a[1] (row + 8, low), a[2]
// (row, high), a[3] (row + 8, high)), B 16 x kN read N-major (desc_b from
// descriptor_n_major). The accumulator layout of D = X·Yᵀ with 16 columns of X's block is that
// A fragment, which is how attention's P reaches P·V without leaving registers. 16-bit types.
template <typename T, unsigned kN>
HK_DEVICE void mma_rs(float (&d)[kN / 2], const unsigned (&a)[4], unsigned long long desc_b,
                      unsigned accumulate) {
  static_assert(kN == 64 || kN == 128 || kN == 256, "wgmma blocks of 64, 128 or 256 columns");
  static_assert(__is_same(T, bf16) || __is_same(T, f16), "N-major B needs 16-bit types");
#define HK_WG_RS(shape)                                                                       \
  if constexpr (kN == 64)                                                                     \
    HK_WG_ASM_RS(shape, 32, HK_WG_REGS_32, "{%32, %33, %34, %35}", "%36", "%37", "+f");        \
  else if constexpr (kN == 128)                                                               \
    HK_WG_ASM_RS(shape, 64, HK_WG_REGS_64, "{%64, %65, %66, %67}", "%68", "%69", "+f");        \
  else                                                                                        \
    HK_WG_ASM_RS(shape, 128, HK_WG_REGS_128, "{%128, %129, %130, %131}", "%132", "%133", "+f")
  if constexpr (__is_same(T, bf16)) {
    if constexpr (kN == 64) HK_WG_RS("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16");
    else if constexpr (kN == 128) HK_WG_RS("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16");
    else HK_WG_RS("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16");
  } else {
    if constexpr (kN == 64) HK_WG_RS("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16");
    else if constexpr (kN == 128) HK_WG_RS("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16");
    else HK_WG_RS("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16");
  }
#undef HK_WG_RS
}

// Where accumulator register v of the calling thread sits in the warpgroup's 64 x kN block.
struct Layout {
  static HK_DEVICE unsigned row(unsigned v) {
    return thread_idx_x() % kWarpgroupThreads / 32 * 16 + lane_id() / 4 + 8 * (v / 2 % 2);
  }
  static HK_DEVICE unsigned col(unsigned v) { return 8 * (v / 4) + 2 * (lane_id() % 4) + v % 2; }
};

}  // namespace wgmma
}  // namespace hk::tile

#endif  // HK_SM90A
