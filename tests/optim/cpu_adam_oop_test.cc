// SPDX-License-Identifier: Apache-2.0
// The out-of-place CPU Adam (AdamShard::master_out / exp_avg_out /
// exp_avg_sq_out): the same arithmetic as in place, so every path (scalar,
// AVX2, AVX-512, AVX-512+BF16 where the machine has them), every dtype
// combination, odd sizes, outputs aligned alike (non-temporal stores after a
// peeled head), aligned differently (plain stores) and several thread counts
// must give bitwise the in-place results, leaving the inputs untouched.
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "optim/cpu_adam.h"
#include "optim/gpu_adam.h"
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

// One output array: n elements of `es` bytes starting `offset` elements past
// a 64-byte boundary, filled with a sentinel.
struct OutArray {
  std::vector<uint8_t> storage;
  uint8_t* p = nullptr;
  OutArray(size_t n, size_t es, size_t offset) : storage((n + offset) * es + 64, 0x5A) {
    uintptr_t base = reinterpret_cast<uintptr_t>(storage.data());
    p = reinterpret_cast<uint8_t*>((base + 63) & ~uintptr_t{63}) + offset * es;
  }
};

// Where the three new-state arrays start relative to a 64-byte boundary, in
// elements: alike (the pass peels one head and streams all three), or not
// (the ones unlike the new master get plain stores).
struct Offsets {
  const char* name;
  size_t w, m, v;
};
constexpr Offsets kOffsets[] = {
    {"aligned", 0, 0, 0},
    {"alike", 3, 3, 3},
    {"unlike", 1, 2, 0},
};

// Steps `in` out of place into fresh arrays at `off` and checks: the copy and
// the new state equal `want` (the in-place step of the same input), and the
// inputs are unchanged.
void ExpectOutOfPlaceIsInPlace(const CpuAdam& a, const ShardData& orig, const ShardData& want, const Offsets& off,
                               const AdamHyper& h, double gs) {
  const size_t n = orig.n, ss = DTypeSize(orig.cfg.state);
  ShardData in = orig;  // the copy's buffer is written; the state must not be
  OutArray w(n, 4, off.w), m(n, ss, off.m), v(n, ss, off.v);
  AdamShard s = in.Shard();
  s.master_out = reinterpret_cast<float*>(w.p);
  s.exp_avg_out = m.p;
  s.exp_avg_sq_out = v.p;
  auto r = a.Step(s, h, {.grad_scale = gs});
  ASSERT_OK(r.status());
  EXPECT_EQ(r->nonfinite_grads, 0u);
  EXPECT_EQ(std::memcmp(in.master.data(), orig.master.data(), n * 4), 0) << "the input master was written";
  EXPECT_EQ(in.m, orig.m) << "the input exp_avg was written";
  EXPECT_EQ(in.v, orig.v) << "the input exp_avg_sq was written";
  EXPECT_EQ(in.grad, orig.grad);
  // The new state as a shard, to compare with the in-place result.
  ShardData got = in;
  std::memcpy(got.master.data(), w.p, n * 4);
  std::memcpy(got.m.data(), m.p, n * ss);
  std::memcpy(got.v.data(), v.p, n * ss);
  std::string where;
  EXPECT_TRUE(got.SameState(want, &where)) << where;
  // Nothing written past the arrays' ends.
  EXPECT_EQ(w.p[n * 4], 0x5A);
  EXPECT_EQ(m.p[n * ss], 0x5A);
  EXPECT_EQ(v.p[n * ss], 0x5A);
}

TEST(CpuAdamOutOfPlace, EveryPathConfigSizeAndAlignmentIsBitwiseInPlace) {
  const uint64_t rng_seed = ::strata::testing::TestSeed(31);
  SCOPED_TRACE(::strata::testing::SeedNote(rng_seed));
  std::mt19937_64 rng(rng_seed);
  for (Isa isa : SupportedIsas()) {
    for (int threads : {1, 3}) {
      ASSERT_OK_AND_ASSIGN(auto a, CpuAdam::Create({.threads = threads, .isa = isa, .tile_elems = 1024}));
      for (const AdamConfig& c : AllConfigs()) {
        // 1 and 17: no whole vector group; 1023 and 40001: tiles, ragged ends.
        for (size_t n : {size_t{1}, size_t{17}, size_t{1023}, size_t{40001}}) {
          if (threads > 1 && n < 1023) continue;  // one tile: the thread count changes nothing
          const AdamHyper h = RandomHyper(rng);
          const ShardData orig = RandomShard(c, n, n * 13 + 5, /*out_offset=*/n % 3);
          ShardData want = orig;
          auto r = a->Step(want.Shard(), h, {.grad_scale = 0.5});
          ASSERT_OK(r.status());
          for (const Offsets& off : kOffsets) {
            SCOPED_TRACE(std::string(IsaName(isa)) + " threads " + std::to_string(threads) + " " + ConfigName(c) +
                         " n=" + std::to_string(n) + " outputs " + off.name);
            ExpectOutOfPlaceIsInPlace(*a, orig, want, off, h, 0.5);
          }
        }
      }
    }
  }
}

// Against the scalar path's in-place result: the vector paths out of place
// agree with the reference path, for thread counts and tiles that split the
// shard differently.
TEST(CpuAdamOutOfPlace, ThreadsAndTilesAgreeWithTheScalarPath) {
  const size_t n = 200003;
  const uint64_t rng_seed = ::strata::testing::TestSeed(37);
  SCOPED_TRACE(::strata::testing::SeedNote(rng_seed));
  std::mt19937_64 rng(rng_seed);
  const AdamConfig c{DType::kBF16, DType::kF32, true, DType::kBF16};
  const AdamHyper h = RandomHyper(rng);
  const ShardData orig = RandomShard(c, n, 77);
  ShardData want = orig;
  ASSERT_OK_AND_ASSIGN(auto scalar, CpuAdam::Create({.threads = 1, .isa = Isa::kScalar}));
  ASSERT_OK(scalar->Step(want.Shard(), h, {.grad_scale = 1.0 / 3}).status());
  for (int threads : {1, 2, 4}) {
    for (size_t tile : {size_t{64}, size_t{16 * 1024}}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + " tile " + std::to_string(tile));
      ASSERT_OK_AND_ASSIGN(auto a, CpuAdam::Create({.threads = threads, .tile_elems = tile}));
      for (const Offsets& off : kOffsets) {
        SCOPED_TRACE(off.name);
        ExpectOutOfPlaceIsInPlace(*a, orig, want, off, h, 1.0 / 3);
      }
    }
  }
}

// Two steps ping-ponging between two sets (what the engine's speculative
// update does) equal two steps in place.
TEST(CpuAdamOutOfPlace, PingPongIsTwoStepsInPlace) {
  const size_t n = 5000;
  const uint64_t rng_seed = ::strata::testing::TestSeed(41);
  SCOPED_TRACE(::strata::testing::SeedNote(rng_seed));
  std::mt19937_64 rng(rng_seed);
  const AdamConfig c{DType::kF32, DType::kF32, true, DType::kF16};
  AdamHyper h = RandomHyper(rng);
  ShardData inplace = RandomShard(c, n, 5);
  ShardData a = inplace, b = inplace;  // a: the current set; b: the other
  ASSERT_OK_AND_ASSIGN(auto adam, CpuAdam::Create({.threads = 2, .tile_elems = 1024}));
  for (int step = 0; step < 2; ++step) {
    h.step += step;
    ASSERT_OK(adam->Step(inplace.Shard(), h, {.grad_scale = 1.0}).status());
    AdamShard s = a.Shard();
    s.master_out = b.master.data();
    s.exp_avg_out = b.m.data();
    s.exp_avg_sq_out = b.v.data();
    ASSERT_OK(adam->Step(s, h, {.grad_scale = 1.0}).status());
    std::swap(a.master, b.master);
    std::swap(a.m, b.m);
    std::swap(a.v, b.v);
    std::string where;
    ASSERT_TRUE(a.SameState(inplace, &where)) << "step " << step + 1 << ": " << where;
  }
}

TEST(CpuAdamOutOfPlace, SkipOnNonFiniteWritesNoOutput) {
  const size_t n = 100;
  const AdamConfig c{DType::kF16, DType::kF32, true, DType::kF16};
  ShardData d = RandomShard(c, n, 9);
  testing::Encode(DType::kF16, d.grad.data(), 37, std::numeric_limits<float>::infinity());
  OutArray w(n, 4, 0), m(n, 4, 0), v(n, 4, 0);
  AdamShard s = d.Shard();
  s.master_out = reinterpret_cast<float*>(w.p);
  s.exp_avg_out = m.p;
  s.exp_avg_sq_out = v.p;
  ASSERT_OK_AND_ASSIGN(auto a, CpuAdam::Create());
  ASSERT_OK_AND_ASSIGN(AdamStepResult r, a->Step(s, AdamHyper{}, {.grad_scale = 1.0, .skip_on_nonfinite = true}));
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.nonfinite_grads, 1u);
  for (const OutArray* o : {&w, &m, &v})
    for (size_t i = 0; i < n * 4; ++i) ASSERT_EQ(o->p[i], 0x5A) << "byte " << i;
}

TEST(CpuAdamOutOfPlace, BadOutputsAreRefusedBeforeAnythingIsWritten) {
  const size_t n = 64;
  const AdamConfig c{DType::kF32, DType::kF32, false, DType::kF16};
  ShardData d = RandomShard(c, n, 3);
  OutArray w(n, 4, 0), m(n, 4, 0), v(n + 1, 4, 0);
  ASSERT_OK_AND_ASSIGN(auto a, CpuAdam::Create());
  auto expect = [&](AdamShard s, const char* what) {
    auto r = a->Step(s, AdamHyper{});
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(what));
  };
  AdamShard s = d.Shard();
  s.master_out = reinterpret_cast<float*>(w.p);
  expect(s, "set together");  // one of three
  s.exp_avg_out = m.p;
  expect(s, "set together");  // two of three
  s.exp_avg_sq_out = d.m.data();
  expect(s, "overlap");  // an output over an input
  s.exp_avg_sq_out = m.p + 8;
  expect(s, "overlap");  // two outputs over each other
  s.exp_avg_sq_out = v.p + 1;
  expect(s, "exp_avg_sq_out is not aligned");
  s.exp_avg_sq_out = v.p;
  EXPECT_OK(a->Step(s, AdamHyper{}).status());
  // The GPU Adam updates in place only.
  EXPECT_THAT(GpuAdamStep(s, AdamHyper{}, 1.0, nullptr), StatusIs(StatusCode::kInvalidArgument));
}

TEST(CpuAdamOutOfPlace, BytesPerParamAreTheInPlaceOnes) {
  // fp32 state, bf16 gradient, bf16 copy: 28 B/param either way (the
  // outputs are written non-temporally: no read for ownership).
  EXPECT_EQ(AdamBytesPerParam(DType::kBF16, DType::kF32, true, DType::kBF16), 28u);
}

}  // namespace
}  // namespace strata::optim
