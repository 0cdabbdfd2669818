// SPDX-License-Identifier: Apache-2.0
// CpuAdam's software prefetch (Options::prefetch_bytes / prefetch_hint) and
// RunTiles: a prefetch is a hint, so every distance and hint must give
// results bitwise identical to the pass without it, on every ISA path, for
// awkward sizes (prefetches near the shard's end are clipped), several tile
// sizes and thread counts, and an unaligned parameter copy.
#include <atomic>
#include <random>
#include <vector>

#include "optim/cpu_adam.h"
#include "tests/optim/adam_test_util.h"
#include "tests/test_util.h"

namespace strata::optim {
namespace {

using ::strata::optim::testing::AdamConfig;
using ::strata::optim::testing::AllConfigs;
using ::strata::optim::testing::ConfigName;
using ::strata::optim::testing::RandomHyper;
using ::strata::optim::testing::RandomShard;
using ::strata::optim::testing::ShardData;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<CpuAdam> Make(Isa isa, int threads, size_t tile, size_t prefetch, PrefetchHint hint) {
  CpuAdam::Options o;
  o.isa = isa;
  o.threads = threads;
  o.tile_elems = tile;
  o.prefetch_bytes = prefetch;
  o.prefetch_hint = hint;
  auto r = CpuAdam::Create(o);
  EXPECT_OK(r.status());
  return r.ok() ? std::move(r).value() : nullptr;
}

void StepOnce(const CpuAdam& a, ShardData& d, const AdamHyper& h, double gs) {
  auto r = a.Step(d.Shard(), h, {.grad_scale = gs});
  ASSERT_OK(r.status());
  EXPECT_EQ(r->nonfinite_grads, 0u);
}

TEST(CpuAdamPrefetch, EveryDistanceAndHintIsBitwiseThePassWithout) {
  const uint64_t rng_seed = ::strata::testing::TestSeed(17);
  SCOPED_TRACE(::strata::testing::SeedNote(rng_seed));
  std::mt19937_64 rng(rng_seed);
  const size_t kPrefetch[] = {64, 512, 2048, 64 * 1024};
  for (Isa isa : SupportedIsas()) {
    auto plain = Make(isa, 2, 1024, 0, PrefetchHint::kL2);
    ASSERT_NE(plain, nullptr);
    std::vector<std::unique_ptr<CpuAdam>> variants;
    for (size_t d : kPrefetch)
      for (PrefetchHint h : {PrefetchHint::kL1, PrefetchHint::kL2}) variants.push_back(Make(isa, 2, 1024, d, h));
    for (const AdamConfig& c : AllConfigs()) {
      // 1 and 17: no whole group; 1023 and 40001: groups, tiles, clipped ends.
      for (size_t n : {size_t{1}, size_t{17}, size_t{1023}, size_t{40001}}) {
        const size_t offset = n % 2;  // an unaligned copy on odd sizes: the pass peels a head tile
        AdamHyper h = RandomHyper(rng);
        ShardData orig = RandomShard(c, n, n * 7 + 3, offset);
        ShardData want = orig;
        StepOnce(*plain, want, h, 0.25);
        for (const auto& a : variants) {
          ASSERT_NE(a, nullptr);
          SCOPED_TRACE(std::string(IsaName(isa)) + " " + ConfigName(c) + " n=" + std::to_string(n) +
                       " prefetch=" + std::to_string(a->prefetch_bytes()) + "/" +
                       std::string(PrefetchHintName(a->prefetch_hint())));
          ShardData got = orig;
          StepOnce(*a, got, h, 0.25);
          std::string where;
          EXPECT_TRUE(got.SameState(want, &where)) << where;
        }
      }
    }
  }
}

TEST(CpuAdamPrefetch, ThreadsAndTilesWithPrefetchAgreeBitwise) {
  const size_t n = 300007;
  const uint64_t rng_seed = ::strata::testing::TestSeed(23);
  SCOPED_TRACE(::strata::testing::SeedNote(rng_seed));
  std::mt19937_64 rng(rng_seed);
  AdamConfig c{DType::kF16, DType::kF32, true, DType::kF16};
  AdamHyper h = RandomHyper(rng);
  ShardData orig = RandomShard(c, n, 99);
  ShardData want = orig;
  StepOnce(*Make(Isa::kAuto, 1, 16 * 1024, 0, PrefetchHint::kL2), want, h, 1.0 / 1024);
  for (int threads : {1, 3}) {
    for (size_t tile : {size_t{64}, size_t{4096}, size_t{65536}}) {
      for (size_t d : {size_t{256}, size_t{4096}}) {
        SCOPED_TRACE("threads " + std::to_string(threads) + " tile " + std::to_string(tile) + " prefetch " +
                     std::to_string(d));
        ShardData got = orig;
        StepOnce(*Make(Isa::kAuto, threads, tile, d, PrefetchHint::kL1), got, h, 1.0 / 1024);
        std::string where;
        EXPECT_TRUE(got.SameState(want, &where)) << where;
      }
    }
  }
}

TEST(CpuAdamPrefetch, OptionsAreValidatedAndKept) {
  CpuAdam::Options o;
  EXPECT_EQ(o.prefetch_bytes, 2048u);  // the default the GPU host's sweep chose
  EXPECT_EQ(o.prefetch_hint, PrefetchHint::kL1);
  o.prefetch_bytes = 100;           // not a multiple of 64
  auto r = CpuAdam::Create(o);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("prefetch_bytes"));
  o.prefetch_bytes = 64 * 1024 + 64;  // over the cap
  EXPECT_THAT(CpuAdam::Create(o), StatusIs(StatusCode::kInvalidArgument));
  o.prefetch_bytes = 512;
  o.prefetch_hint = static_cast<PrefetchHint>(7);
  r = CpuAdam::Create(o);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("prefetch_hint"));
  o.prefetch_hint = PrefetchHint::kL1;
  ASSERT_OK_AND_ASSIGN(auto a, CpuAdam::Create(o));
  EXPECT_EQ(a->prefetch_bytes(), 512u);
  EXPECT_EQ(a->prefetch_hint(), PrefetchHint::kL1);
  EXPECT_EQ(PrefetchHintName(PrefetchHint::kL1), "l1");
  EXPECT_EQ(PrefetchHintName(PrefetchHint::kL2), "l2");
}

TEST(CpuAdamRunTiles, VisitsEveryTileOnceOnTheEnginesThreads) {
  for (int threads : {1, 3}) {
    CpuAdam::Options o;
    o.threads = threads;
    ASSERT_OK_AND_ASSIGN(auto a, CpuAdam::Create(o));
    for (size_t ntiles : {size_t{0}, size_t{1}, size_t{1000}}) {
      std::vector<std::atomic<int>> seen(ntiles);
      a->RunTiles(ntiles, [&](size_t t) { seen[t].fetch_add(1, std::memory_order_relaxed); });
      for (size_t t = 0; t < ntiles; ++t) EXPECT_EQ(seen[t].load(), 1) << "tile " << t << ", threads " << threads;
    }
  }
}

}  // namespace
}  // namespace strata::optim
