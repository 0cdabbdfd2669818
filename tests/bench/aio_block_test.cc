// SPDX-License-Identifier: Apache-2.0
// The tuner's aio block is exactly what strata's config reader accepts:
// formatted directly, and as strata-bench nvme --tune --quick prints it.
#include "bench/aio_block.h"

#include <sstream>

#include "engine/config.h"
#include "tests/bench/cli_util.h"
#include "tests/test_util.h"

namespace strata::bench {
namespace {

using ::strata::testing::StatusIs;

// `"aio": {...}` pasted into a ds_config that has only a batch size (which
// DeepSpeed and strata require).
Result<Config> ParsePasted(const std::string& block) {
  nlohmann::json j = nlohmann::json::parse("{\"train_micro_batch_size_per_gpu\": 1, " + block + "}", nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("not JSON once pasted: " + block);
  std::vector<std::string> warnings;
  return ParseConfig(j, "pasted", 1, &warnings);
}

TEST(AioBlock, ParsesBackThroughTheConfigReader) {
  AioConfig aio;
  aio.block_size = 8 << 20;
  aio.queue_depth = 128;
  aio.intra_op_parallelism = 8;
  aio.single_submit = true;
  aio.overlap_events = false;
  ASSERT_OK_AND_ASSIGN(Config c, ParsePasted(AioBlock(aio)));
  EXPECT_EQ(c.aio.block_size, 8u << 20);
  EXPECT_EQ(c.aio.queue_depth, 128);
  EXPECT_EQ(c.aio.intra_op_parallelism, 8);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
}

TEST(AioBlock, AValueTheReaderRefusesIsRefused) {
  // The reader's checks apply to the printed block too: a block size that is
  // not a multiple of 4096 would be refused, naming the key.
  AioConfig aio;
  aio.block_size = 1000;
  auto c = ParsePasted(AioBlock(aio));
  EXPECT_THAT(c, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(c.status().message()).find("block_size"), std::string::npos) << c.status().ToString();
}

// The block between `"aio": {` and the `}` line after it in the tuner's output.
std::string PrintedBlock(const std::string& out) {
  const size_t start = out.find("\"aio\": {");
  if (start == std::string::npos) return "";
  const size_t end = out.find("\n}", start);
  return end == std::string::npos ? "" : out.substr(start, end + 2 - start);
}

TEST(NvmeTune, PrintedBlockParsesThroughTheConfigReader) {
  ::strata::testing::TempDir dir;
  auto r = ::strata::testing::RunCommand({::strata::testing::BenchBinary(), "nvme", "--tune", "--quick", "--dir", dir.path()});
  if (r.rc != 0 && r.output.find("O_DIRECT") != std::string::npos)
    GTEST_SKIP() << "O_DIRECT is refused in " << dir.path() << ": " << r.output;
  ASSERT_EQ(r.rc, 0) << r.output;
  const std::string block = PrintedBlock(r.output);
  ASSERT_FALSE(block.empty()) << r.output;
  ASSERT_OK_AND_ASSIGN(Config c, ParsePasted(block));
  // One of the quick sweep's settings: block {1M, 8M} x queue depth {32} x threads {1, 2}.
  EXPECT_TRUE(c.aio.block_size == 1u << 20 || c.aio.block_size == 8u << 20) << block;
  EXPECT_EQ(c.aio.queue_depth, 32) << block;
  EXPECT_TRUE(c.aio.intra_op_parallelism == 1 || c.aio.intra_op_parallelism == 2) << block;
  EXPECT_NE(r.output.find("best read:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("best write:"), std::string::npos) << r.output;
  // Its files are gone; the directory it was given is left as it was.
  EXPECT_TRUE(::strata::testing::ListDir(dir.path()).empty());
}

}  // namespace
}  // namespace strata::bench
