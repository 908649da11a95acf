// hk/math.h: fast f32 math without a device library. Every function maps to one hardware
// instruction (AMD v_exp/v_rcp/v_rsq, NVIDIA ex2/rcp/rsqrt.approx) or to a short polynomial
// fitted for this header by least squares; the accuracy of each is stated next to it, measured
// as relative error against a double reference over the whole f32 input range.
#pragma once

#include "device.h"

namespace hk {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.693147180559945309f;

// 2^x, about 1 ulp. Results below the smallest normal may flush to 0 (and denormal x counts
// as 0). On NVIDIA the flushing form is one instruction; the other wraps it in a scaling
// check for denormal results, which took softmax of bf16 rows of 128 on the H100 from 7.17 to
// 6.98 µs at 16384 rows and from 13.41 to 13.09 µs at 65536 rows (medians of six rounds).
HK_DEVICE float exp2(float x) {
#if HK_AMD
  return __builtin_amdgcn_exp2f(x);
#else
  return __nvvm_ex2_approx_ftz_f(x);
#endif
}

// e^x, about 2 ulp plus |x| * 2^-24 from rounding x * log2(e) (so 4e-6 at |x| = 80).
HK_DEVICE float exp(float x) { return exp2(x * kLog2e); }

// log2(x), within 2^-22 absolute for x in [0.5, 2] and about 1 ulp relative elsewhere;
// log2(0) = -inf. (NVIDIA's lg2.approx flushes denormal inputs, so they give -inf there.)
HK_DEVICE float log2(float x) {
#if HK_AMD
  return __builtin_amdgcn_logf(x);
#else
  return __nvvm_lg2_approx_f(x);
#endif
}

// 1 / x, about 1 ulp (denormal inputs and outputs flush on NVIDIA).
HK_DEVICE float rcp(float x) {
#if HK_AMD
  return __builtin_amdgcn_rcpf(x);
#else
  return __nvvm_rcp_approx_ftz_f(x);
#endif
}

// 1 / sqrt(x), about 1 ulp on AMD, 2^-22.9 on NVIDIA.
HK_DEVICE float rsqrt(float x) {
#if HK_AMD
  return __builtin_amdgcn_rsqf(x);
#else
  return __nvvm_rsqrt_approx_f(x);
#endif
}

HK_DEVICE float abs(float x) { return __builtin_fabsf(x); }
HK_DEVICE float max(float a, float b) { return __builtin_fmaxf(a, b); }
HK_DEVICE float min(float a, float b) { return __builtin_fminf(a, b); }
HK_DEVICE float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
// x with the sign of s.
HK_DEVICE float copysign(float x, float s) { return __builtin_copysignf(x, s); }

// 1 / (1 + e^-x): exact 0 and 1 at the ends, 3e-7 relative in between.
HK_DEVICE float sigmoid(float x) { return rcp(1.0f + exp(-x)); }

// tanh(x), 2e-7 relative everywhere. Near 0 an odd polynomial (1 - 2/(e^2x + 1) would lose
// all its digits to cancellation); beyond 0.625 the exponential form, which saturates to
// exactly ±1.
HK_DEVICE float tanh(float x) {
  const float a = abs(x);
  if (a < 0.625f) {
    // tanh(x) = x + x^3 * R(x^2), R fitted on [0, 0.625^2]: 8e-8.
    const float s = x * x;
    float r = 0.00229585450142622f;
    r = fma(r, s, -0.008346994407474995f);
    r = fma(r, s, 0.021769966930150986f);
    r = fma(r, s, -0.05395940691232681f);
    r = fma(r, s, 0.13333304226398468f);
    r = fma(r, s, -0.3333333432674408f);
    return fma(x * s, r, x);
  }
  return copysign(1.0f - 2.0f * rcp(exp2(2.0f * kLog2e * a) + 1.0f), x);
}

namespace detail {
// erf(x) / x for |x| <= 1 as a polynomial in x^2, fitted on [0, 1]: 2e-7.
HK_DEVICE float erf_small(float x) {
  const float s = x * x;
  float p = -0.0005625396152026951f;
  p = fma(p, s, 0.004916023463010788f);
  p = fma(p, s, -0.02670994959771633f);
  p = fma(p, s, 0.11280130594968796f);
  p = fma(p, s, -0.37612318992614746f);
  p = fma(p, s, 1.1283791065216064f);
  return x * p;
}

// erfc(t) for t >= 1 as e^(-t^2) * Q(u) / (1 + 2t) with u = (t - 2) / (t + 2): the factor
// e^(t^2) (1 + 2t) erfc(t) is smooth and bounded on [1, inf) and u maps that onto [-1/3, 1),
// where a degree-8 Q (fitted on t in [1, 10]) is good to 7e-8. e^(-t^2) is taken as
// e^(-hi) * (1 - lo) with t^2 = hi + lo exactly, so rounding t^2 costs nothing; what is left
// is exp's own error, up to 5e-6 relative deep in the tail (erfc(9) = 4e-37).
HK_DEVICE float erfc_tail(float t) {
  t = min(t, 10.5f);  // erfc(10.5) underflows f32; keeps u (and Q) finite for t = inf
  const float u = (t - 2.0f) * rcp(t + 2.0f);
  float q = -0.0015312257455661893f;
  q = fma(q, u, 0.0011305153602734208f);
  q = fma(q, u, 0.00875923503190279f);
  q = fma(q, u, -0.008017442189157009f);
  q = fma(q, u, -0.05422399193048477f);
  q = fma(q, u, 0.16405044496059418f);
  q = fma(q, u, -0.16603027284145355f);
  q = fma(q, u, -0.09276381134986877f);
  q = fma(q, u, 1.2769783735275269f);
  const float hi = t * t;
  const float lo = fma(t, t, -hi);
  const float gauss = exp(-hi) * (1.0f - lo);
  return gauss * q * rcp(fma(2.0f, t, 1.0f));
}
}  // namespace detail

// The error function, 3e-7 relative (erf(x) = ±1 exactly for |x| >= 4).
HK_DEVICE float erf(float x) {
  const float a = abs(x);
  if (a <= 1.0f) return detail::erf_small(x);
  return copysign(1.0f - detail::erfc_tail(a), x);
}

// The complementary error function 1 - erf(x), 5e-7 relative where erfc(x) > 1e-30 (so for
// x < 8.1), which 1 - erf(x) cannot give for large x.
HK_DEVICE float erfc(float x) {
  if (x >= 1.0f) return detail::erfc_tail(x);
  if (x > -1.0f) return 1.0f - detail::erf_small(x);
  return 2.0f - detail::erfc_tail(-x);
}

}  // namespace hk
