// Causal depthwise 1-D convolution (Mamba's causal_conv1d) over x [batch, dim, seqlen]:
//   out[b, c, t] = sum_k weight[c, k] * x[b, c, t - (width - 1) + k]   (x = 0 before t = 0)
// and the fused variant out = silu(that + bias[c]). weight is [dim, width], bias [dim], all
// in the element type; sums in f32, rounded once on the way out.
//
// Symbols, for T in bf16, f16, f32:
//   causal_conv1d_T(out, x, weight, batch, dim, seqlen, width)
//   causal_conv1d_bias_silu_T(out, x, weight, bias, batch, dim, seqlen, width)
// Any width >= 1 (width 0 writes nothing); widths 2, 3 and 4 take an unrolled path with the
// filter in registers.
//
// Launch: the contract in manifests/causal_conv1d.toml. Each thread computes 32 bytes of
// consecutive outputs, so a block of kBlock threads covers a tile of kTile<T> time steps of
// one channel of one sequence; blocks stride over the tiles, so any grid is correct.
#include "hk/hk.h"

namespace {

constexpr unsigned kBlock = 128;
// Consecutive outputs per thread: two 16-byte vectors' worth, which keeps enough bytes in
// flight (measured on an H100 with the SiLU: 8 bf16 outputs per thread reach 87 % of copy
// bandwidth, 16 reach 92 %; for f32, 8 reach 98 % and 16 only 81 %).
template <typename T> inline constexpr unsigned kOutputs = 2 * hk::kVec16<T>;
template <typename T> inline constexpr unsigned kTile = kBlock * kOutputs<T>;
// A thread's outputs (or inputs) in f32.
template <typename T> using Outputs = hk::Pack<float, kOutputs<T>>;

// Loads the thread's inputs x[t0..] (zeros past the end), as 16-byte vectors when `vectors`.
template <typename T>
HK_DEVICE Outputs<T> load_window(const T* x, unsigned t0, unsigned seqlen, bool vectors) {
  constexpr unsigned kOut = kOutputs<T>;
  constexpr unsigned kVec = hk::kVec16<T>;
  Outputs<T> w;
  if (vectors) {
#pragma unroll
    for (unsigned q = 0; q < kOut / kVec; ++q) {
      const unsigned t = t0 + q * kVec;
      const hk::Vec16<T> v = t < seqlen ? hk::load16(x + t) : hk::Vec16<T>{};
#pragma unroll
      for (unsigned e = 0; e < kVec; ++e) w.elem[q * kVec + e] = hk::to_float(v.elem[e]);
    }
  } else {
#pragma unroll
    for (unsigned e = 0; e < kOut; ++e) w.elem[e] = t0 + e < seqlen ? hk::to_float(x[t0 + e]) : 0.0f;
  }
  return w;
}

// An output from its sum: as is, or through bias and SiLU.
template <bool kBiasSilu> HK_DEVICE float finish(float acc, float bias) {
  if constexpr (kBiasSilu) {
    const float y = acc + bias;
    return y * hk::sigmoid(y);
  } else {
    return acc;
  }
}

// Writes the n outputs at t0.. that lie before seqlen; with `vectors`, n is a multiple of the
// vector width and t0 is aligned to it.
template <typename T, unsigned N>
HK_DEVICE void store_outputs(T* out, const hk::Pack<float, N>& y, unsigned t0, unsigned seqlen, bool vectors) {
  constexpr unsigned kVec = hk::kVec16<T>;
  if (vectors) {
#pragma unroll
    for (unsigned q = 0; q < N / kVec; ++q) {
      hk::Vec16<T> v;
#pragma unroll
      for (unsigned e = 0; e < kVec; ++e) v.elem[e] = hk::from_float<T>(y.elem[q * kVec + e]);
      if (t0 + q * kVec < seqlen) hk::store16(out + t0 + q * kVec, v);
    }
  } else {
#pragma unroll
    for (unsigned e = 0; e < N; ++e)
      if (t0 + e < seqlen) out[t0 + e] = hk::from_float<T>(y.elem[e]);
  }
}

// The outputs at t0.. for a filter width known at compile time: the thread reads its own
// kOut inputs and the kWidth - 1 before them (which its neighbour reads too, so they come
// from cache), and keeps everything in registers.
template <unsigned kWidth, bool kBiasSilu, typename T>
HK_DEVICE Outputs<T> conv_fixed(const T* x, const T* filter, float bias, unsigned t0,
                                           unsigned seqlen, bool vectors) {
  constexpr unsigned kOut = kOutputs<T>;
  constexpr unsigned kHalo = kWidth - 1;
  float w[kWidth];
#pragma unroll
  for (unsigned k = 0; k < kWidth; ++k) w[k] = hk::to_float(filter[k]);
  // window[j] holds x[t0 - kHalo + j].
  float window[kHalo + kOut];
#pragma unroll
  for (unsigned j = 0; j < kHalo; ++j) window[j] = t0 + j >= kHalo ? hk::to_float(x[t0 + j - kHalo]) : 0.0f;
  const Outputs<T> own = load_window(x, t0, seqlen, vectors);
#pragma unroll
  for (unsigned j = 0; j < kOut; ++j) window[kHalo + j] = own.elem[j];
  Outputs<T> y;
#pragma unroll
  for (unsigned j = 0; j < kOut; ++j) {
    float acc = 0.0f;
#pragma unroll
    for (unsigned k = 0; k < kWidth; ++k) acc = hk::fma(w[k], window[j + k], acc);
    y.elem[j] = finish<kBiasSilu>(acc, bias);
  }
  return y;
}

// The outputs at t0.. for any width, written to `out`, one 16-byte vector's worth at a time
// (which keeps this path's registers below the fixed-width paths', so it costs them no
// occupancy). A window of inputs slides one step per tap, so each tap costs one load: tap k of
// output t reads x[t + k - (width - 1)].
template <bool kBiasSilu, typename T>
HK_DEVICE void conv_any(T* out, const T* x, const T* filter, float bias, unsigned t0, unsigned seqlen,
                        unsigned width, bool vectors) {
  constexpr unsigned kVec = hk::kVec16<T>;
  const unsigned halo = width - 1;
  // x[i - halo], zero outside the sequence.
  auto input = [&](unsigned i) { return i >= halo && i - halo < seqlen ? hk::to_float(x[i - halo]) : 0.0f; };
#pragma unroll 1
  for (unsigned c = t0; c < t0 + kOutputs<T>; c += kVec) {
    float window[kVec];
#pragma unroll
    for (unsigned j = 0; j < kVec; ++j) window[j] = input(c + j);
    float acc[kVec] = {};
    for (unsigned k = 0; k < width; ++k) {
      const float w = hk::to_float(filter[k]);
#pragma unroll
      for (unsigned j = 0; j < kVec; ++j) acc[j] = hk::fma(w, window[j], acc[j]);
#pragma unroll
      for (unsigned j = 0; j + 1 < kVec; ++j) window[j] = window[j + 1];
      window[kVec - 1] = input(c + k + kVec);
    }
    hk::Pack<float, kVec> y;
#pragma unroll
    for (unsigned j = 0; j < kVec; ++j) y.elem[j] = finish<kBiasSilu>(acc[j], bias);
    store_outputs(out, y, c, seqlen, vectors);
  }
}

template <bool kBiasSilu, typename T>
HK_DEVICE void causal_conv1d(T* out, const T* x, const T* weight, const T* bias, unsigned batch,
                             unsigned dim, unsigned seqlen, unsigned width) {
  if (width == 0) return;
  const unsigned tiles = (seqlen + kTile<T> - 1) / kTile<T>;
  const unsigned long long units = static_cast<unsigned long long>(batch) * dim * tiles;
  // Vectors need every row start 16-byte aligned: aligned bases and seqlen a multiple of kVec.
  const bool vectors = seqlen % hk::kVec16<T> == 0 && hk::aligned16(out, x);
  for (unsigned long long u = hk::block_idx_x(); u < units; u += hk::grid_dim_x()) {
    const unsigned long long row = u / tiles;  // b * dim + c
    const unsigned channel = static_cast<unsigned>(row % dim);
    const unsigned t0 = static_cast<unsigned>(u % tiles) * kTile<T> + hk::thread_idx_x() * kOutputs<T>;
    if (t0 >= seqlen) continue;
    const T* xr = x + row * seqlen;
    const T* filter = weight + static_cast<unsigned long long>(channel) * width;
    const float b = kBiasSilu ? hk::to_float(bias[channel]) : 0.0f;
    T* outr = out + row * seqlen;
    auto store = [&](const Outputs<T>& y) { store_outputs(outr, y, t0, seqlen, vectors); };
    switch (width) {
      case 2: store(conv_fixed<2, kBiasSilu>(xr, filter, b, t0, seqlen, vectors)); break;
      case 3: store(conv_fixed<3, kBiasSilu>(xr, filter, b, t0, seqlen, vectors)); break;
      case 4: store(conv_fixed<4, kBiasSilu>(xr, filter, b, t0, seqlen, vectors)); break;
      default: conv_any<kBiasSilu>(outr, xr, filter, b, t0, seqlen, width, vectors); break;
    }
  }
}

}  // namespace

#define HK_CAUSAL_CONV1D(name, T)                                                             \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void causal_conv1d_##name(                               \
      T* out, const T* x, const T* weight, unsigned batch, unsigned dim, unsigned seqlen,     \
      unsigned width) {                                                                       \
    causal_conv1d<false, T>(out, x, weight, nullptr, batch, dim, seqlen, width);              \
  }                                                                                           \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void causal_conv1d_bias_silu_##name(                     \
      T* out, const T* x, const T* weight, const T* bias, unsigned batch, unsigned dim,       \
      unsigned seqlen, unsigned width) {                                                      \
    causal_conv1d<true, T>(out, x, weight, bias, batch, dim, seqlen, width);                  \
  }
HK_CAUSAL_CONV1D(bf16, hk::bf16)
HK_CAUSAL_CONV1D(f16, hk::f16)
HK_CAUSAL_CONV1D(f32, float)
