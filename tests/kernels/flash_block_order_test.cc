// SPDX-License-Identifier: Apache-2.0
// The sm_90a flash kernels' block order (kernels/flash_block_order.h): every
// (head, tile) exactly once, groups of heads together, and each group's tile
// 0 blocks (a causal head's heaviest) before its tile 1 blocks.
#include "kernels/flash_block_order.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata::kernels {
namespace {

struct Grid {
  int heads, n_tiles, group;
};

std::vector<FlashHeadTile> Order(const Grid& g) {
  std::vector<FlashHeadTile> out;
  const int blocks = g.heads * g.n_tiles;
  for (int lin = 0; lin < blocks; ++lin) out.push_back(FlashBlockOrder(lin, blocks, g.n_tiles, g.group));
  return out;
}

class FlashBlockOrderTest : public ::testing::TestWithParam<Grid> {};

TEST_P(FlashBlockOrderTest, EveryHeadTileExactlyOnce) {
  const Grid g = GetParam();
  std::vector<int> seen(g.heads * g.n_tiles, 0);
  for (const FlashHeadTile& t : Order(g)) {
    ASSERT_GE(t.bh, 0);
    ASSERT_LT(t.bh, g.heads);
    ASSERT_GE(t.tile, 0);
    ASSERT_LT(t.tile, g.n_tiles);
    ++seen[t.bh * g.n_tiles + t.tile];
  }
  for (int i = 0; i < static_cast<int>(seen.size()); ++i) EXPECT_EQ(seen[i], 1) << "head " << i / g.n_tiles
                                                                               << " tile " << i % g.n_tiles;
}

TEST_P(FlashBlockOrderTest, GroupsInOrderAndTilesInOrderWithinAGroup) {
  const Grid g = GetParam();
  const std::vector<FlashHeadTile> order = Order(g);
  for (size_t i = 1; i < order.size(); ++i) {
    const FlashHeadTile a = order[i - 1], b = order[i];
    const int ga = a.bh / g.group, gb = b.bh / g.group;
    ASSERT_LE(ga, gb) << "block " << i << " goes back to an earlier group of heads";
    if (ga == gb) {
      ASSERT_LE(a.tile, b.tile) << "block " << i << " goes back to an earlier tile within its group";
      if (a.tile == b.tile) ASSERT_EQ(a.bh + 1, b.bh) << "block " << i << ": heads of one tile out of order";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashBlockOrderTest,
                         ::testing::Values(Grid{128, 16, 8},  // GPT 1.3B backward: 8 full groups
                                           Grid{128, 16, 1},  // head-major
                                           Grid{13, 5, 4},    // a last group of one head
                                           Grid{10, 3, 8},    // a ragged last group
                                           Grid{3, 7, 16},    // a group larger than the grid
                                           Grid{1, 1, 8}));

TEST(FlashBlockOrder, GroupOneIsHeadMajor) {
  for (int lin = 0; lin < 6 * 4; ++lin) {
    const FlashHeadTile t = FlashBlockOrder(lin, 6 * 4, 4, 1);
    EXPECT_EQ(t.bh, lin / 4);
    EXPECT_EQ(t.tile, lin % 4);
  }
}

TEST(FlashBlockOrder, AGroupStartsWithTheFirstTileOfEachOfItsHeads) {
  // 8 heads per group, 16 tiles: blocks 0..7 are tile 0 of heads 0..7, block
  // 8 is tile 1 of head 0; the second group starts at block 128.
  const int blocks = 20 * 16;
  for (int h = 0; h < 8; ++h) {
    EXPECT_EQ(FlashBlockOrder(h, blocks, 16, 8).bh, h);
    EXPECT_EQ(FlashBlockOrder(h, blocks, 16, 8).tile, 0);
  }
  EXPECT_EQ(FlashBlockOrder(8, blocks, 16, 8).tile, 1);
  EXPECT_EQ(FlashBlockOrder(128, blocks, 16, 8).bh, 8);
  EXPECT_EQ(FlashBlockOrder(128, blocks, 16, 8).tile, 0);
  // The last group holds heads 16..19: four heads per tile.
  EXPECT_EQ(FlashBlockOrder(256 + 4, blocks, 16, 8).bh, 16);
  EXPECT_EQ(FlashBlockOrder(256 + 4, blocks, 16, 8).tile, 1);
}

}  // namespace
}  // namespace strata::kernels
