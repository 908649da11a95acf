// hk/tile/tile.h: the matrix tile layer. Matrix kernels include this one file:
//   hk/tile/shared.h    SharedTile: 16- and 8-bit matrix tiles in shared memory, swizzled against
//                       bank conflicts
//   hk/tile/copy.h      GlobalMatrix views and block copies global -> shared (cp.async on
//                       NVIDIA, through registers everywhere)
//   hk/tile/mma.h       Accumulators (a wave's block of f32 results) and mma() over tiles,
//                       mapped per target by
//   hk/tile/mfma.h      AMD CDNA MFMA (gfx90a, gfx942, gfx950)
//   hk/tile/mma_sync.h  NVIDIA mma.sync with ldmatrix (sm_80, sm_90)
//   hk/tile/mfma8.h,    the same for 8-bit inputs (i8, FP8 E4M3)
//   hk/tile/mma_sync8.h
//   hk/tile/raster.h    block_tile(): which block of C a thread block computes, grouped for L2
//   hk/tile/widen.h     WideningCopy: FP8 blocks widened to bf16 tiles on the way (weight-only)
//   hk/tile/k_loop.h    the K loop of a matrix kernel (stages, copy path chosen before the loop,
//                       split-K share and batch roles) around its multiply hook
//   hk/tile/products.h  what C is made of: one product, or a gate's act(A·W_gateᵀ) ⊙ A·W_upᵀ
// and, included by the kernels that use it:
//   hk/tile/flash.h     attention's wave products (RowScores, RowSums), online softmax
//                       (FlashWave), masks, packed sequences and the walk over blocks of rows
//   hk/tile/pingpong.h  CDNA's 8-wave ping-pong: two groups of waves alternating matrix and
//                       memory clusters between block barriers
// and, for sm_90a code only, included by the kernels that use them:
//   hk/tile/wgmma.h     Hopper's warpgroup matrix instruction over swizzled shared tiles
//   hk/tile/pipeline.h  the warp-specialised stage ring (producer and consumer warpgroups,
//                       mbarriers) and WgmmaNt, the load and multiply hooks of C = A·Bᵀ
//   hk/tile/flash_wgmma.h  attention's consumer warpgroup: S = Q·Kᵀ, online softmax and
//                       O += P·V with P in registers
#pragma once

#include "copy.h"
#include "k_loop.h"
#include "mma.h"
#include "products.h"
#include "raster.h"
#include "shared.h"
#include "widen.h"
