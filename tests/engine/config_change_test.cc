// SPDX-License-Identifier: Apache-2.0
// What a resume changes of the checkpoint's config (engine/config_change.h):
// every key that differs, classified by whether the bits stay those of an
// uninterrupted run.
#include "engine/config_change.h"

#include <map>

#include "engine/config.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

TEST(ConfigChange, EveryDifferenceIsNamedAndClassified) {
  Config a = DefaultConfig();
  EXPECT_TRUE(ConfigChanges(ConfigToJson(a), ConfigToJson(a)).empty());
  Config b = a;
  b.optimizer.lr = 2e-3;
  b.micro_batch = b.train_batch_size = 4;
  b.bf16 = true;
  b.steps_per_print = 1;
  b.zero.offload_optimizer.device = "cpu";
  b.trainer.steps = 100;
  const std::vector<ConfigChange> c = ConfigChanges(ConfigToJson(a), ConfigToJson(b));
  std::map<std::string, bool> breaks;
  for (const ConfigChange& x : c) breaks[x.key] = x.breaks_identity;
  EXPECT_EQ(breaks, (std::map<std::string, bool>{{"bf16.enabled", true},
                                                 {"optimizer.params.lr", true},
                                                 {"steps_per_print", false},
                                                 {"train_batch_size", true},
                                                 {"train_micro_batch_size_per_gpu", true},
                                                 {"trainer.steps", false},
                                                 {"zero_optimization.offload_optimizer.device", false}}));
  for (const ConfigChange& x : c) {
    if (x.key == "optimizer.params.lr") {
      EXPECT_EQ(DescribeChange(x), "optimizer.params.lr: 0.001 -> 0.002");
    }
    if (x.key == "steps_per_print") {
      EXPECT_EQ(DescribeChange(x), "steps_per_print: 5 -> 1 (keeps the bits)");
    }
  }
}

TEST(ConfigChange, KeysOnOneSideAndSamePathsSpelledDifferently) {
  nlohmann::json a = {{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}}}}},
                      {"data", {{"path", "data/../data/kjv.txt"}}}};
  nlohmann::json b = {{"data", {{"path", "data/kjv.txt"}}}, {"gradient_clipping", 5e-1}};
  const std::vector<ConfigChange> c = ConfigChanges(a, b);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].key, "gradient_clipping");
  EXPECT_EQ(c[0].before, "(absent)");
  EXPECT_EQ(c[1].key, "scheduler.params.warmup_num_steps");
  EXPECT_EQ(c[1].after, "(absent)");
  EXPECT_EQ(c[2].key, "scheduler.type");
  EXPECT_TRUE(c[2].breaks_identity);
}

// The moments' dtype changes the run; a checkpoint from before the key
// existed had fp32 moments, so its absence is no change from false.
TEST(ConfigChange, Bf16OptimizerStates) {
  Config a = DefaultConfig();
  a.bf16 = true;
  Config b = a;
  b.bf16_optimizer_states = true;
  const std::vector<ConfigChange> c = ConfigChanges(ConfigToJson(a), ConfigToJson(b));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].key, "bf16.bf16_optimizer_states");
  EXPECT_TRUE(c[0].breaks_identity);
  EXPECT_EQ(DescribeChange(c[0]), "bf16.bf16_optimizer_states: false -> true");
  nlohmann::json old = ConfigToJson(a);
  old["bf16"].erase("bf16_optimizer_states");
  EXPECT_TRUE(ConfigChanges(old, ConfigToJson(a)).empty());
  const std::vector<ConfigChange> d = ConfigChanges(old, ConfigToJson(b));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].before, "(absent)");
  EXPECT_TRUE(d[0].breaks_identity);
}

}  // namespace
}  // namespace strata
