// hk/hk.h: the portable device header. Kernels include this one file:
//   hk/device.h    keywords, indices, wave size, barrier, bf16/f16, packs and 16-byte vectors
//   hk/math.h      exp2/exp/rcp/rsqrt, sigmoid, tanh, erf/erfc
//   hk/reduce.h    wave shuffles, reductions over lane groups, waves and blocks
// and, where they need them:
//   hk/walk.h      rows walked by teams of threads, flat arrays walked by a grid (norms,
//                  softmax, activations)
//   hk/residual.h  the residual add of the fused norms
//   hk/vote.h      wave votes, lane ranks, prefix sums (selection kernels such as top-k)
//   hk/tile/tile.h the matrix tile layer: shared tiles, global -> shared copies and one mma
//                  over MFMA (AMD) and mma.sync (NVIDIA) (GEMM)
#pragma once

#include "device.h"
#include "math.h"
#include "reduce.h"
