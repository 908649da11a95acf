// hk/tile/products.h: what a matrix kernel's C is made of: one product (Plain), or, for a gated
// kernel, act(A·W_gateᵀ) ⊙ A·W_upᵀ from two products sharing A (SiluGate, GeluTanhGate: each
// activation computed as kernels/activation.hip computes it). kProducts is how many products
// the K loop accumulates (MmaBlock's kProducts); a gate's operator() is act.
#pragma once

#include "../device.h"
#include "../math.h"
#include "mma.h"

namespace hk::tile {

struct Plain {
  static constexpr unsigned kProducts = 1;
};

struct SiluGate {
  static constexpr unsigned kProducts = 2;
  HK_DEVICE float operator()(float x) const { return x * sigmoid(x); }
};

// gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the
// sigmoid form keeps its digits for x << 0, where 1 + tanh(u) cancels (as activation.hip's).
struct GeluTanhGate {
  static constexpr unsigned kProducts = 2;
  HK_DEVICE float operator()(float x) const {
    const float u = 0.79788456080286536f * fma(0.044715f * x, x * x, x);
    return x * sigmoid(2.0f * u);
  }
};

// Calls put(row, col, value) with the value of C at every accumulator of the lane: acc[0] alone
// (Plain), or act(acc[0]) · acc[1] (a gate); row and col relative to the wave's block.
template <class Combine, class Acc, typename F>
HK_DEVICE void for_each_result(const Acc (&acc)[Combine::kProducts], F put) {
  if constexpr (Combine::kProducts == 1) {
    acc[0].for_each(put);
  } else {
    for_each_pair(acc[0], acc[1], [&](unsigned r, unsigned col, float gate, float up)
                                      HK_INLINE { put(r, col, Combine{}(gate) * up); });
  }
}

}  // namespace hk::tile
