// hk/tile/raster.h: which block of C a thread block computes, for matrix kernels whose grid's x
// counts C's column blocks and y its row blocks.
//
// Consecutive blocks walk kGroupM block rows of C column by column, so that kGroupM blocks read
// each block of B through L2 at about the same time, instead of every row of blocks streaming
// all of B from memory. The last group may have fewer rows.
#pragma once

#include "../device.h"

namespace hk::tile {

constexpr unsigned kGroupM = 8;

struct BlockTile {
  unsigned m, n;  // block row and column of C
};

HK_DEVICE BlockTile block_tile() {
  const unsigned tiles_n = grid_dim_x(), tiles_m = grid_dim_y();
  const unsigned long long id =
      static_cast<unsigned long long>(block_idx_y()) * tiles_n + block_idx_x();
  const unsigned long long per_group = static_cast<unsigned long long>(kGroupM) * tiles_n;
  const unsigned first_m = static_cast<unsigned>(id / per_group) * kGroupM;
  const unsigned group_m = tiles_m - first_m < kGroupM ? tiles_m - first_m : kGroupM;
  const unsigned in_group = static_cast<unsigned>(id % per_group);
  return {first_m + in_group % group_m, in_group / group_m};
}

}  // namespace hk::tile
