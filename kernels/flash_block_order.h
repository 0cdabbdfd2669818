// SPDX-License-Identifier: Apache-2.0
// The order in which the sm_90a flash-attention kernels hand out their
// blocks: which (batch * head, tile) block `lin` of a one-dimensional grid of
// n_tiles * (B * H) blocks works on. Host and device code, so the order is
// tested without a GPU.
//
// Heads go in groups of `group`: a group's blocks are launched next to each
// other, tile 0 of each of its heads, then tile 1, and so on. The blocks
// resident at once then share a few heads' K/V (Q and dO in the backward)
// through L2, instead of each streaming a different head from memory: with
// all heads of one tile launched together, the wgmma backward ran at 0.84 of
// head-major order's rate on an H100. And since each kernel maps tile 0 to a
// causal head's heaviest block (the first key block, or the last query
// block), the long blocks of a group start first and its short ones fill the
// end; head-major order (group 1) leaves the last heads' long blocks running
// alone at the end of the grid.
//
// Thread-safety: a pure function.
#pragma once

#if defined(__CUDACC__)
#define STRATA_FLASH_HOST_DEVICE __host__ __device__
#else
#define STRATA_FLASH_HOST_DEVICE
#endif

namespace strata::kernels {

struct FlashHeadTile {
  int bh, tile;
};

// Needs blocks a multiple of n_tiles, 0 <= lin < blocks, group >= 1.
STRATA_FLASH_HOST_DEVICE inline FlashHeadTile FlashBlockOrder(int lin, int blocks, int n_tiles, int group) {
  const int heads = blocks / n_tiles;
  const int first = lin / (group * n_tiles) * group;  // the group's first head
  const int in_group = group < heads - first ? group : heads - first;
  const int r = lin - first * n_tiles;
  return {first + r % in_group, r / in_group};
}

}  // namespace strata::kernels

#undef STRATA_FLASH_HOST_DEVICE
