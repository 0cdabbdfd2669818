// SPDX-License-Identifier: Apache-2.0
// Tests for the CopyEngine on its stand-in (memcpy on worker threads): the
// same ticket semantics as the CUDA path. The CUDA path (streams, events,
// staging, ordering after a compute stream) is in copy_engine_gpu_test.cu.
#include "tiers/copy_engine.h"

#include <cstring>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::RandomBytes;
using ::strata::testing::StatusIs;

std::unique_ptr<CopyEngine> StandIn(uint64_t chunk = kMiB) {
  CopyEngineOptions o;
  o.stand_in = true;
  o.chunk_bytes = chunk;
  auto r = CopyEngine::Create(o);
  EXPECT_OK(r.status());
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(CopyEngine, StandInWhenNoGpu) {
  CopyEngineOptions o;
  ASSERT_OK_AND_ASSIGN(auto e, CopyEngine::Create(o));
  EXPECT_EQ(e->stand_in(), !testing::HaveGpu());
  if (e->stand_in()) {
    EXPECT_EQ(e->stream(CopyDirection::kHostToDevice), nullptr);
    EXPECT_THAT(e->description(), ::testing::HasSubstr("stand-in"));
  }
}

TEST(CopyEngine, RoundTripKeepsEveryByte) {
  auto e = StandIn(kMiB);
  ASSERT_NE(e, nullptr);
  for (uint64_t n : {uint64_t{1}, uint64_t{4097}, 5 * kMiB + 123}) {
    auto src = RandomBytes(n, n);
    std::vector<uint8_t> dev(n, 0), back(n, 0);
    ASSERT_OK_AND_ASSIGN(CopyTicket up, e->HostToDevice(dev.data(), src.data(), n));
    ASSERT_OK(up.Wait());
    ASSERT_OK_AND_ASSIGN(bool done, up.Poll());
    EXPECT_TRUE(done);
    ASSERT_OK_AND_ASSIGN(CopyTicket down, e->DeviceToHost(back.data(), dev.data(), n));
    ASSERT_OK(down.Wait());
    EXPECT_EQ(back, src) << n;
  }
  CopyEngineStats s = e->stats();
  EXPECT_EQ(s.h2d.copies, 3u);
  EXPECT_EQ(s.d2h.copies, 3u);
  EXPECT_EQ(s.h2d.bytes, 1 + 4097 + 5 * kMiB + 123);
  EXPECT_EQ(s.h2d.chunks, 1u + 1u + 6u);  // 5 MiB + 123 in 1 MiB chunks: 6
  EXPECT_EQ(s.h2d.failures, 0u);
}

TEST(CopyEngine, CopiesOfOneDirectionCompleteInSubmissionOrder) {
  auto e = StandIn(64 * kKiB);
  ASSERT_NE(e, nullptr);
  const int kCopies = 32;
  const uint64_t n = 256 * kKiB;
  std::vector<std::vector<uint8_t>> src, dst;
  std::vector<CopyTicket> tickets;
  for (int i = 0; i < kCopies; ++i) {
    src.push_back(RandomBytes(n, 100 + i));
    dst.emplace_back(n, 0);
  }
  for (int i = 0; i < kCopies; ++i) {
    ASSERT_OK_AND_ASSIGN(CopyTicket t, e->HostToDevice(dst[i].data(), src[i].data(), n));
    tickets.push_back(t);
  }
  ASSERT_OK(tickets.back().Wait());
  for (int i = 0; i < kCopies; ++i) {
    ASSERT_OK_AND_ASSIGN(bool done, tickets[i].Poll());
    EXPECT_TRUE(done) << i;  // earlier copies finished before the last one
    EXPECT_EQ(dst[i], src[i]) << i;
  }
}

TEST(CopyEngine, ZeroBytesAndBadArguments) {
  auto e = StandIn();
  ASSERT_NE(e, nullptr);
  ASSERT_OK_AND_ASSIGN(CopyTicket t, e->HostToDevice(nullptr, nullptr, 0));
  EXPECT_OK(t.Wait());
  uint8_t buf[16] = {};
  EXPECT_THAT(e->HostToDevice(nullptr, buf, 16), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(e->DeviceToHost(buf, nullptr, 16), StatusIs(StatusCode::kInvalidArgument));
  int fake_stream = 0;
  CopyAfter after;
  after.stream = &fake_stream;
  EXPECT_THAT(e->HostToDevice(buf, buf + 8, 8, after), StatusIs(StatusCode::kInvalidArgument));
  void* fake_event = &fake_stream;
  CopyAfter after_event;
  after_event.events = std::span<void* const>(&fake_event, 1);
  EXPECT_THAT(e->DeviceToHost(buf, buf + 8, 8, after_event), StatusIs(StatusCode::kInvalidArgument));
  void* null_event = nullptr;
  CopyAfter after_null;
  after_null.events = std::span<void* const>(&null_event, 1);  // null entries are ignored
  ASSERT_OK_AND_ASSIGN(CopyTicket ok, e->HostToDevice(buf, buf + 8, 8, after_null));
  EXPECT_OK(ok.Wait());
  CopyEngineOptions bad;
  bad.staging_buffers = 1;
  EXPECT_THAT(CopyEngine::Create(bad), StatusIs(StatusCode::kInvalidArgument));
  bad = {};
  bad.chunk_bytes = 0;
  EXPECT_THAT(CopyEngine::Create(bad), StatusIs(StatusCode::kInvalidArgument));
}

TEST(CopyEngine, BothDirectionsFromManyThreads) {
  auto e = StandIn(128 * kKiB);
  ASSERT_NE(e, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        uint64_t n = 1000 + (t * 7919 + i * 104729) % (700 * kKiB);
        auto src = RandomBytes(n, t * 1000 + i);
        std::vector<uint8_t> dev(n), back(n);
        auto up = e->HostToDevice(dev.data(), src.data(), n);
        ASSERT_OK(up.status());
        ASSERT_OK(up->Wait());
        auto down = e->DeviceToHost(back.data(), dev.data(), n);
        ASSERT_OK(down.status());
        ASSERT_OK(down->Wait());
        ASSERT_EQ(back, src);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_OK(e->Drain());
  EXPECT_EQ(e->stats().h2d.copies, 80u);
  EXPECT_EQ(e->stats().d2h.copies, 80u);
}

TEST(CopyEngine, DrainWaitsForEverythingAndTicketsOutliveTheEngine) {
  auto e = StandIn(kMiB);
  ASSERT_NE(e, nullptr);
  const uint64_t n = 8 * kMiB;
  auto src = RandomBytes(n, 9);
  std::vector<uint8_t> a(n), b(n);
  ASSERT_OK_AND_ASSIGN(CopyTicket ta, e->HostToDevice(a.data(), src.data(), n));
  ASSERT_OK_AND_ASSIGN(CopyTicket tb, e->DeviceToHost(b.data(), src.data(), n));
  ASSERT_OK(e->Drain());
  EXPECT_EQ(a, src);
  EXPECT_EQ(b, src);
  e.reset();  // destroying the engine waits for submitted copies; tickets stay valid
  EXPECT_OK(ta.Wait());
  ASSERT_OK_AND_ASSIGN(bool done, tb.Poll());
  EXPECT_TRUE(done);
}

TEST(CopyEngine, DefaultTicketIsComplete) {
  CopyTicket t;
  EXPECT_OK(t.Wait());
  ASSERT_OK_AND_ASSIGN(bool done, t.Poll());
  EXPECT_TRUE(done);
  EXPECT_OK(t.StreamWait(nullptr));
}

}  // namespace
}  // namespace strata
