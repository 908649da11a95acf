// hk/residual.h: the residual add of the fused norms (fused_add_rmsnorm, fused_add_layernorm).
// The sum is taken in f32 and rounded once to T: that rounded value is what the kernels store
// back into the residual and then normalize, as vLLM's fused-add kernels define it.
#pragma once

#include "device.h"

namespace hk {

// T(x + residual) for the pack of n elements at x and residual.
template <typename T, unsigned N>
HK_DEVICE Pack<T, N> residual_add(const T* x, const T* residual, Width<N> n) {
  const auto a = load(x, n);
  const auto b = load(residual, n);
  Pack<T, N> sum;
#pragma unroll
  for (unsigned e = 0; e < N; ++e)
    sum.elem[e] = from_float<T>(to_float(a.elem[e]) + to_float(b.elem[e]));
  return sum;
}

}  // namespace hk
