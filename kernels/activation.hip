// Elementwise activations over n elements: out[i] = act(x[i]), computed in f32 and rounded
// once to the element type. out may be x (in place).
//
//   silu(x)      = x * sigmoid(x)
//   gelu(x)      = x * Phi(x) = 0.5 x erfc(-x / sqrt 2)       (erf form, PyTorch's default)
//   gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   relu(x)      = max(x, 0), NaN stays NaN
//   tanh(x)
//
// Symbols: {silu,gelu,gelu_tanh,relu,tanh}_{bf16,f16,f32}(out, x, n).
// Launch: the contract in manifests/activation.toml. Threads walk the array with a grid
// stride, one 16-byte vector at a time, so any grid is correct.
#include "hk/hk.h"
#include "hk/walk.h"

namespace {

constexpr unsigned kBlock = 256;

struct Silu {
  HK_DEVICE float operator()(float x) const { return x * hk::sigmoid(x); }
};

// erfc keeps Phi(x) accurate where it is tiny (x << 0); 1 + erf(x / sqrt 2) would cancel.
struct Gelu {
  HK_DEVICE float operator()(float x) const {
    return 0.5f * x * hk::erfc(-0.70710678118654752f * x);
  }
};

// 0.5 (1 + tanh(u)) = sigmoid(2u): the same value without cancellation for x << 0.
struct GeluTanh {
  HK_DEVICE float operator()(float x) const {
    const float u = 0.79788456080286536f * hk::fma(0.044715f * x, x * x, x);
    return x * hk::sigmoid(2.0f * u);
  }
};

struct Relu {
  HK_DEVICE float operator()(float x) const { return x < 0.0f ? 0.0f : x; }
};

struct Tanh {
  HK_DEVICE float operator()(float x) const { return hk::tanh(x); }
};

template <typename T, typename Act>
HK_DEVICE void activation(T* out, const T* x, unsigned long long n, Act act) {
  hk::for_each_pack<T>(n, hk::aligned16(out, x), [&](unsigned long long i, auto w) {
    const auto v = hk::load(x + i, w);
    hk::Pack<T, w> y;
#pragma unroll
    for (unsigned e = 0; e < w; ++e) y.elem[e] = hk::from_float<T>(act(hk::to_float(v.elem[e])));
    hk::store(out + i, y);
  });
}

}  // namespace

#define HK_ACTIVATION(act, Act, name, T)                                                      \
  HK_KERNEL HK_LAUNCH_BOUNDS(kBlock) void act##_##name(                                       \
      T* out, const T* x, unsigned long long n) {                                             \
    activation<T>(out, x, n, Act{});                                                          \
  }
#define HK_ACTIVATION_ALL_TYPES(act, Act) \
  HK_ACTIVATION(act, Act, bf16, hk::bf16) \
  HK_ACTIVATION(act, Act, f16, hk::f16)   \
  HK_ACTIVATION(act, Act, f32, float)
HK_ACTIVATION_ALL_TYPES(silu, Silu)
HK_ACTIVATION_ALL_TYPES(gelu, Gelu)
HK_ACTIVATION_ALL_TYPES(gelu_tanh, GeluTanh)
HK_ACTIVATION_ALL_TYPES(relu, Relu)
HK_ACTIVATION_ALL_TYPES(tanh, Tanh)
