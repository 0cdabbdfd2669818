// SPDX-License-Identifier: Apache-2.0
// FaultIoEnv's own rules (tests/fault_io_env.h), where the fault tests of the
// tiers, the prefetcher and the trainer do not already pin them down: the
// offset filters, the window over the matching calls when rules overlap,
// exact counts under concurrent hooks, the buffer-update site forwarding
// clean-up, and rules that cannot act being test failures.
#include "tests/fault_io_env.h"

#include <liburing.h>
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <thread>
#include <vector>

#include <gtest/gtest-spi.h>

#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::FaultIo;
using ::strata::testing::FaultIoEnv;
using ::strata::testing::FaultSite;

IoOp Op(bool write, uint64_t offset, uint32_t attempt = 0) {
  IoOp op;
  op.write = write;
  op.offset = offset;
  op.len = 4096;
  op.attempt = attempt;
  return op;
}

constexpr int32_t kRes = 4096;  // what the (real) completion reported

TEST(FaultIoEnv, FiltersSelectTheIoByDirectionOffsetAndAttempt) {
  FaultIoEnv env;
  auto id = env.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kWrite, .from_offset = 8192,
                     .first_attempt = true, .error = EIO});
  EXPECT_EQ(env.CompleteIo(Op(true, 4096), kRes), kRes);        // below from_offset
  EXPECT_EQ(env.CompleteIo(Op(true, 8192), kRes), -EIO);        // at it
  EXPECT_EQ(env.CompleteIo(Op(true, 1 << 20), kRes), -EIO);     // beyond it
  EXPECT_EQ(env.CompleteIo(Op(false, 8192), kRes), kRes);       // a read
  EXPECT_EQ(env.CompleteIo(Op(true, 8192, 1), kRes), kRes);     // a re-queue or retry
  EXPECT_EQ(env.fired(id), 2u);
  EXPECT_EQ(env.calls(FaultSite::kCompleteIo), 5u);
  env.Clear();
  EXPECT_EQ(env.CompleteIo(Op(true, 8192), kRes), kRes);
  EXPECT_EQ(env.fired(id), 2u);
}

// "The Nth write fails": every rule counts each call it matches, even one
// that an earlier rule acted on, and the earlier rule acts.
TEST(FaultIoEnv, WindowsCountEveryMatchingCallAndTheFirstRuleActs) {
  FaultIoEnv env;
  auto first = env.Add({.site = FaultSite::kCompleteIo, .times = 2, .error = EIO});
  auto second = env.Add({.site = FaultSite::kCompleteIo, .skip = 1, .times = 2, .error = ENOSPC});
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(env.CompleteIo(Op(true, 4096 * i), kRes));
  // Call 2 is in both windows (first acts); call 3 only in the second's;
  // call 4 in neither.
  EXPECT_EQ(got, (std::vector<int32_t>{-EIO, -EIO, -ENOSPC, kRes}));
  EXPECT_EQ(env.fired(first), 2u);
  EXPECT_EQ(env.fired(second), 1u);
}

// The per-I/O hooks of several rings run at once: a window of 100 acts
// exactly 100 times over all of them.
TEST(FaultIoEnv, ConcurrentHooksFireExactlyTheWindow) {
  FaultIoEnv env;
  auto id = env.Add({.site = FaultSite::kPrepareIo, .skip = 50, .times = 100, .error = EAGAIN});
  constexpr int kThreads = 8, kCalls = 2000;
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        IoOp op = Op(t % 2 == 0, 4096 * static_cast<uint64_t>(i));
        if (env.PrepareIo(op) == -EAGAIN) failed.fetch_add(1);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failed.load(), 100);
  EXPECT_EQ(env.fired(id), 100u);
  EXPECT_EQ(env.calls(FaultSite::kPrepareIo), uint64_t{kThreads} * kCalls);
}

// A buffer-update rule fails filling a slot, never emptying one (the tier's
// clean-up after a refusal): that goes to the kernel, on a real ring.
TEST(FaultIoEnv, BufferUpdatesFailOnlyWhenTheyFillASlot) {
  FaultIoEnv env;
  io_uring ring{};
  int r = env.RingInit(4, &ring, 0);
  if (r < 0) GTEST_SKIP() << "io_uring_queue_init: " << strerror(-r);
  r = env.RegisterBuffersSparse(&ring, 1);
  if (r < 0) {
    env.RingExit(&ring);
    GTEST_SKIP() << "no sparse buffer table (Linux 5.19+): " << strerror(-r);
  }
  auto id = env.Add({.site = FaultSite::kUpdateBuffers, .error = ENOMEM});
  alignas(4096) static char page[4096];
  iovec fill{page, sizeof page}, empty{nullptr, 0};
  EXPECT_EQ(env.UpdateBuffers(&ring, 0, &fill, 1), -ENOMEM);
  EXPECT_EQ(env.UpdateBuffers(&ring, 0, &empty, 1), 1);  // one slot updated by the kernel
  EXPECT_EQ(env.fired(id), 1u);
  EXPECT_EQ(env.calls(FaultSite::kUpdateBuffers), 2u);
  env.RingExit(&ring);
}

// A rule that cannot act where it watches fails the test that wrote it, and
// is not added.
TEST(FaultIoEnv, RulesThatCannotActAreTestFailures) {
  FaultIoEnv env;
  EXPECT_NONFATAL_FAILURE(env.Add({.site = FaultSite::kCompleteIo}), "exactly one action");
  EXPECT_NONFATAL_FAILURE(env.Add({.site = FaultSite::kCompleteIo, .error = EIO, .len_cap = 4096}),
                          "exactly one action");
  EXPECT_NONFATAL_FAILURE(env.Add({.site = FaultSite::kOpen, .len_cap = 4096}), "cannot shorten");
  EXPECT_NONFATAL_FAILURE(env.Add({.site = FaultSite::kPrepareIo, .len_cap = 1000}),
                          "multiple of 4096");
  EXPECT_NONFATAL_FAILURE(env.Add({.site = FaultSite::kPrepareIo, .result_cap = 8192}),
                          "cannot cap a result");
  EXPECT_NONFATAL_FAILURE(env.Add({.site = FaultSite::kFallocate, .io = FaultIo::kRead,
                                   .error = ENOSPC}),
                          "sees no I/O");
  EXPECT_NONFATAL_FAILURE(env.Add({.site = FaultSite::kCompleteIo, .open_flags = 1,
                                   .error = EIO}),
                          "sees no open flags");
  EXPECT_NONFATAL_FAILURE(env.Add({.site = FaultSite::kCompleteIo, .times = 0, .error = EIO}),
                          "empty window");
  // None of them acts.
  EXPECT_EQ(env.CompleteIo(Op(true, 0), kRes), kRes);
  IoOp op = Op(false, 0);
  EXPECT_EQ(env.PrepareIo(op), 0);
  EXPECT_EQ(op.len, 4096u);
}

}  // namespace
}  // namespace strata
