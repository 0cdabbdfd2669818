// SPDX-License-Identifier: Apache-2.0
// Randomized stress test of the TierStore on the gpu stand-in (see
// store_stress.h); the same test on a real device is in
// store_stress_gpu_test.cc.
#include "tests/tiers/store_stress.h"

namespace strata::stress {
namespace {

class StoreStress : public ::testing::TestWithParam<StressParams> {};

TEST_P(StoreStress, EveryByteMatchesTheReference) { RunStoreStress(GetParam(), StressMemory{}); }

StressParams Lru() { return {}; }
StressParams NextUse() {
  StressParams p;
  p.policy = EvictionPolicy::kNextUse;
  p.workers = 3;
  return p;
}
StressParams Tight() {  // budgets barely above the largest tensor plus pins
  StressParams p;
  p.threads = 3;
  p.gpu_budget = 384 * kKiB;
  p.host_budget = 1280 * kKiB;  // host homes take ~900 KiB of it
  p.max_bytes = 120 * kKiB;
  p.workers = 1;
  return p;
}

INSTANTIATE_TEST_SUITE_P(Policies, StoreStress, ::testing::Values(Lru(), NextUse(), Tight()),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "Lru" : info.index == 1 ? "NextUse" : "Tight");
                         });

}  // namespace
}  // namespace strata::stress
