// hk/hk.h: the whole portable device header. Kernels include this one file.
//   hk/device.h  keywords, indices, wave size, barrier, bf16/f16, 16-byte vectors
//   hk/math.h    exp2/exp/rcp/rsqrt, sigmoid, tanh, erf/erfc
//   hk/reduce.h  wave shuffles, wave and block sums/maxima/minima
#pragma once

#include "device.h"
#include "math.h"
#include "reduce.h"
