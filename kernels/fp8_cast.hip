// Conversions between f32 and the four FP8 formats, element by element (hk/fp8.h states the
// rules: round to nearest even, saturating, canonical NaN; decoding exact):
//
//   cast_f32_to_<fmt>(out, x, n)            out[i] = <fmt>(x[i]), by the target's own path
//   cast_<fmt>_to_f32(out, x, n)            out[i] = f32(x[i]); a NaN code gives the f32 NaN
//                                           0x7FC00000 (whatever NaN the instruction makes)
//   cast_f32_to_<fmt>_software(out, x, n)   the same by the portable path, whatever the target
//   cast_<fmt>_to_f32_software(out, x, n)   has, so that one GPU checks both paths bit for bit
//
// with <fmt> one of fp8_e4m3fn, fp8_e4m3fnuz, fp8_e5m2, fp8_e5m2fnuz. The target's own path is
// an instruction where it has one for the format (gfx942: FNUZ; gfx950 and sm_90: OCP) and the
// portable one elsewhere. Launch: the contract in manifests/fp8_cast.toml; threads walk the
// array with a grid stride, so any grid is correct.
#include "hk/fp8.h"
#include "hk/hk.h"

namespace {

constexpr unsigned kBlock = 256;

// NaN codes decode to one f32 NaN, so that a conversion's output is the same bits everywhere.
HK_DEVICE float canonical_nan(float v) { return v != v ? __builtin_nanf("") : v; }

template <typename Out, typename In, typename Convert>
HK_DEVICE void cast(Out* out, const In* x, unsigned long long n, Convert convert) {
  const unsigned long long stride = static_cast<unsigned long long>(hk::grid_dim_x()) * kBlock;
  for (unsigned long long i = hk::block_idx_x() * kBlock + hk::thread_idx_x(); i < n; i += stride)
    out[i] = convert(x[i]);
}

}  // namespace

#define HK_FP8_CAST(fmt)                                                                      \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void cast_f32_to_##fmt(hk::fmt* out, const float* x,     \
                                                             unsigned long long n) {          \
    cast(out, x, n, [](float v) { return hk::from_float<hk::fmt>(v); });                      \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void cast_##fmt##_to_f32(float* out, const hk::fmt* x,   \
                                                             unsigned long long n) {          \
    cast(out, x, n, [](hk::fmt v) { return canonical_nan(hk::to_float(v)); });                \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void cast_f32_to_##fmt##_software(                       \
      hk::fmt* out, const float* x, unsigned long long n) {                                   \
    cast(out, x, n, [](float v) { return hk::fp8_from_float_software<hk::fmt>(v); });         \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void cast_##fmt##_to_f32_software(                       \
      float* out, const hk::fmt* x, unsigned long long n) {                                   \
    cast(out, x, n, [](hk::fmt v) { return canonical_nan(hk::fp8_to_float_software(v)); });   \
  }
HK_FP8_CAST(fp8_e4m3fn)
HK_FP8_CAST(fp8_e4m3fnuz)
HK_FP8_CAST(fp8_e5m2)
HK_FP8_CAST(fp8_e5m2fnuz)
