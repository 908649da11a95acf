// hk/fp8.h: the 8-bit element types of quantized kernels: the four FP8 formats and int8, with
// exact conversions to and from f32 on every target (hkload/src/fp8.rs is the host's twin and
// states the rules; tests compare the two bit for bit over every code).
//
//   fp8_e4m3fn    OCP E4M3 (torch.float8_e4m3fn): bias 7, max 448, NaN S.1111.111, no inf
//   fp8_e5m2      OCP E5M2 (torch.float8_e5m2): bias 15, max 57344, inf and NaN at exponent 31
//   fp8_e4m3fnuz  FNUZ E4M3 (torch.float8_e4m3fnuz): bias 8, max 240, NaN only 0x80, no -0
//   fp8_e5m2fnuz  FNUZ E5M2 (torch.float8_e5m2fnuz): bias 16, max 57344, NaN only 0x80, no -0
//   i8            signed char
//
// The same byte means another value in the other family (half, twice, or NaN), so each format
// is its own type (a scoped enum over the byte: no arithmetic, no implicit conversion), a
// kernel's signature names it, and hkload refuses a buffer of another.
//
// from_float<T>(x) rounds to nearest even into the subnormals and saturates: beyond the largest
// finite value (infinities included) gives that value with x's sign; NaN gives the canonical
// NaN (0x7F in OCP, 0x80 in FNUZ); -0 (and a negative value rounding to 0) stays -0 in OCP and
// is +0 in FNUZ. to_float is exact. Where the hardware converts in the format it is used, with
// the saturation and the canonical NaN made explicit around it (the instructions' own overflow
// and NaN results are not what quantization wants, nor the same across vendors):
//   gfx942   v_cvt_pk_fp8_f32 / v_cvt_pk_bf8_f32 and v_cvt_f32_fp8 / _bf8: the FNUZ formats
//   gfx950   the same instructions: the OCP formats
//   sm_89+   cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 and cvt.rn.f16x2.{e4m3x2,e5m2x2}: OCP
// and everything else (the other family on each AMD target, FNUZ on NVIDIA, all of them on
// gfx90a and sm_80) converts in software, a few integer operations.
#pragma once

#include "device.h"

namespace hk {

enum class fp8_e4m3fn : unsigned char {};
enum class fp8_e4m3fnuz : unsigned char {};
enum class fp8_e5m2 : unsigned char {};
enum class fp8_e5m2fnuz : unsigned char {};
using i8 = signed char;

// A format's facts, for the software conversions and the kernels' scale arithmetic.
template <typename T> struct Fp8Traits;
template <unsigned kMantissa_, int kBias_, unsigned char kMaxCode_, bool kFnuz_>
struct Fp8Layout {
  static constexpr unsigned kMantissa = kMantissa_;  // fraction bits
  static constexpr int kBias = kBias_;
  static constexpr unsigned char kMaxCode = kMaxCode_;  // the largest finite value, positive
  static constexpr bool kFnuz = kFnuz_;
  static constexpr unsigned char kNaN = kFnuz ? 0x80 : 0x7F;
  // The largest finite value: (2 - 2^-m) 2^(e - bias) of the max code's fields.
  static constexpr float kMax =
      static_cast<float>((1u << kMantissa) + (kMaxCode & ((1u << kMantissa) - 1))) /
      static_cast<float>(1u << kMantissa) *
      static_cast<float>(1ull << ((kMaxCode >> kMantissa) - kBias));
};
template <> struct Fp8Traits<fp8_e4m3fn> : Fp8Layout<3, 7, 0x7E, false> {};
template <> struct Fp8Traits<fp8_e4m3fnuz> : Fp8Layout<3, 8, 0x7F, true> {};
template <> struct Fp8Traits<fp8_e5m2> : Fp8Layout<2, 15, 0x7B, false> {};
template <> struct Fp8Traits<fp8_e5m2fnuz> : Fp8Layout<2, 16, 0x7F, true> {};
static_assert(Fp8Traits<fp8_e4m3fn>::kMax == 448.0f && Fp8Traits<fp8_e4m3fnuz>::kMax == 240.0f &&
              Fp8Traits<fp8_e5m2>::kMax == 57344.0f && Fp8Traits<fp8_e5m2fnuz>::kMax == 57344.0f);

template <typename T> inline constexpr bool kIsFp8 = false;
template <> inline constexpr bool kIsFp8<fp8_e4m3fn> = true;
template <> inline constexpr bool kIsFp8<fp8_e4m3fnuz> = true;
template <> inline constexpr bool kIsFp8<fp8_e5m2> = true;
template <> inline constexpr bool kIsFp8<fp8_e5m2fnuz> = true;

namespace fp8_detail {

HK_DEVICE unsigned bits(float x) { return __builtin_bit_cast(unsigned, x); }
HK_DEVICE float from_bits(unsigned u) { return __builtin_bit_cast(float, u); }

// 2^e as a float, for the exponents FP8 needs.
HK_DEVICE constexpr float pow2(int e) {
  return e >= 0 ? static_cast<float>(1ull << e) : 1.0f / static_cast<float>(1ull << -e);
}

// Round to nearest even, saturating (see the header), in integer and f32 operations only.
template <typename T> HK_DEVICE unsigned char encode_software(float x) {
  using F = Fp8Traits<T>;
  const unsigned u = bits(x);
  const unsigned sign = (u >> 24) & 0x80u;
  const unsigned a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return F::kNaN;
  // At or past the largest value (infinity too) nothing rounds below it.
  if (a >= bits(F::kMax)) return static_cast<unsigned char>(sign | F::kMaxCode);
  const int exponent = static_cast<int>(a >> 23) - 127 + F::kBias;  // the FP8 biased exponent
  unsigned code;
  if (exponent >= 1) {
    // Normal: drop 23 - m fraction bits, rounding half to even; a carry out of the fraction
    // steps the exponent, which is the right result. Below the max, so never past it.
    constexpr unsigned kDrop = 23 - F::kMantissa;
    const unsigned rebased = a - (static_cast<unsigned>(127 - F::kBias) << 23);
    const unsigned lsb = (rebased >> kDrop) & 1u;
    code = (rebased + (1u << (kDrop - 1)) - 1u + lsb) >> kDrop;
  } else {
    // Subnormal (or zero): count quanta of the smallest subnormal, 2^(1 - bias - m), exactly
    // (a power-of-two scale), and round that count half to even; 2^m quanta is the smallest
    // normal, whose code is that count too.
    code = static_cast<unsigned>(__builtin_rintf(from_bits(a) * pow2(F::kBias - 1 + static_cast<int>(F::kMantissa))));
  }
  if (F::kFnuz && code == 0) return 0;
  return static_cast<unsigned char>(sign | code);
}

// Exact.
template <typename T> HK_DEVICE float decode_software(unsigned char c) {
  using F = Fp8Traits<T>;
  constexpr unsigned kExpMask = (0x7Fu >> F::kMantissa);
  const unsigned exponent = (c & 0x7Fu) >> F::kMantissa;
  const unsigned mantissa = c & ((1u << F::kMantissa) - 1u);
  const unsigned sign = static_cast<unsigned>(c & 0x80u) << 24;
  if (F::kFnuz ? c == 0x80 : (F::kMantissa == 3 ? (c & 0x7F) == 0x7F
                                                 : exponent == kExpMask && mantissa != 0))
    return __builtin_nanf("");
  if (!F::kFnuz && F::kMantissa == 2 && exponent == kExpMask) return from_bits(sign | 0x7F800000u);
  if (exponent == 0) {
    const float v = static_cast<float>(mantissa) * pow2(1 - F::kBias - static_cast<int>(F::kMantissa));
    return from_bits(sign | bits(v));
  }
  return from_bits(sign | ((exponent - F::kBias + 127) << 23) | (mantissa << (23 - F::kMantissa)));
}

// Which FP8 family the target's conversion instructions use, if it has them.
#if defined(__gfx942__)
template <typename T> inline constexpr bool kHardware = Fp8Traits<T>::kFnuz;
#elif defined(__gfx950__) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890)
template <typename T> inline constexpr bool kHardware = !Fp8Traits<T>::kFnuz;
#else
// gfx9-4-generic among them: its code runs on gfx942 and gfx950, whose one conversion
// instruction reads FNUZ on the first and OCP on the second.
template <typename T> inline constexpr bool kHardware = false;
#endif

template <typename T> inline constexpr bool kE4m3 = Fp8Traits<T>::kMantissa == 3;

// The hardware's conversion of two values: x's code in the low byte, y's in the high byte.
// Inputs are within ±max or NaN here.
template <typename T> HK_DEVICE unsigned short encode2_hardware(float x, float y) {
#if HK_AMD && (defined(__gfx942__) || defined(__gfx950__))
  const int packed = kE4m3<T> ? __builtin_amdgcn_cvt_pk_fp8_f32(x, y, 0, false)
                              : __builtin_amdgcn_cvt_pk_bf8_f32(x, y, 0, false);
  return static_cast<unsigned short>(packed);
#elif HK_NVIDIA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The first source goes to the upper byte.
  unsigned short packed;
  if constexpr (kE4m3<T>)
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(y), "f"(x));
  else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(y), "f"(x));
  return packed;
#else
  (void)x, (void)y;
  static_assert(!kHardware<T>, "no conversion instruction on this target");
  return 0;
#endif
}

#if HK_NVIDIA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// Two codes widened to f16 at once, exactly (every FP8 value is an f16): the low byte's value
// in the low half.
template <typename T> HK_DEVICE unsigned widen2_f16(unsigned short codes) {
  unsigned halves;
  if constexpr (kE4m3<T>)
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(codes));
  else
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(halves) : "h"(codes));
  return halves;
}
#endif

template <typename T> HK_DEVICE float decode_hardware(unsigned char c) {
#if HK_AMD && (defined(__gfx942__) || defined(__gfx950__))
  return kE4m3<T> ? __builtin_amdgcn_cvt_f32_fp8(c, 0) : __builtin_amdgcn_cvt_f32_bf8(c, 0);
#elif HK_NVIDIA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const unsigned halves = widen2_f16<T>(c);
  return static_cast<float>(__builtin_bit_cast(f16, static_cast<unsigned short>(halves)));
#else
  static_assert(!kHardware<T>, "no conversion instruction on this target");
  return decode_software<T>(c);
#endif
}

// x clamped to ±max, NaN kept: the hardware then never sees an overflow or an infinity.
template <typename T> HK_DEVICE float saturate(float x) {
  constexpr float kMax = Fp8Traits<T>::kMax;
  return __builtin_fabsf(x) > kMax ? __builtin_copysignf(kMax, x) : x;
}

// The canonical NaN wherever the input was NaN (the instructions' NaN may carry the sign).
template <typename T> HK_DEVICE unsigned char canonical(unsigned char code, float x) {
  return x != x ? Fp8Traits<T>::kNaN : code;
}

}  // namespace fp8_detail

// Two values converted at once (x in the low byte): one instruction where the hardware has
// the format.
template <typename T> HK_DEVICE unsigned short fp8_pack2(float x, float y) {
  using namespace fp8_detail;
  if constexpr (kHardware<T>) {
    const unsigned short p = encode2_hardware<T>(saturate<T>(x), saturate<T>(y));
    return static_cast<unsigned short>(canonical<T>(p & 0xFF, x) | canonical<T>(p >> 8, y) << 8);
  } else {
    return static_cast<unsigned short>(encode_software<T>(x) | encode_software<T>(y) << 8);
  }
}

// The portable conversions, whatever the target has (for tests of the hardware paths).
template <typename T> HK_DEVICE T fp8_from_float_software(float x) {
  return static_cast<T>(fp8_detail::encode_software<T>(x));
}
template <typename T> HK_DEVICE float fp8_to_float_software(T x) {
  return fp8_detail::decode_software<T>(static_cast<unsigned char>(x));
}

#define HK_FP8_CONVERSIONS(T)                                                                \
  HK_DEVICE float to_float(T x) {                                                            \
    if constexpr (fp8_detail::kHardware<T>)                                                  \
      return fp8_detail::decode_hardware<T>(static_cast<unsigned char>(x));                  \
    else                                                                                     \
      return fp8_detail::decode_software<T>(static_cast<unsigned char>(x));                  \
  }                                                                                          \
  template <> HK_DEVICE T from_float<T>(float x) {                                           \
    return static_cast<T>(static_cast<unsigned char>(fp8_pack2<T>(x, 0.0f) & 0xFF));         \
  }
HK_FP8_CONVERSIONS(fp8_e4m3fn)
HK_FP8_CONVERSIONS(fp8_e4m3fnuz)
HK_FP8_CONVERSIONS(fp8_e5m2)
HK_FP8_CONVERSIONS(fp8_e5m2fnuz)
#undef HK_FP8_CONVERSIONS

// int8: exact to f32; from f32 rounded to nearest even and saturated to [-128, 127], NaN to 0.
HK_DEVICE float to_float(i8 x) { return static_cast<float>(x); }
template <> HK_DEVICE i8 from_float<i8>(float x) {
  const float r = __builtin_rintf(__builtin_fminf(__builtin_fmaxf(x, -128.0f), 127.0f));
  return x != x ? i8(0) : static_cast<i8>(r);
}

}  // namespace hk
