// SPDX-License-Identifier: Apache-2.0
// NvmeTier on the real file system (TempDir, on disk): files, extents,
// round trips of random data over a matrix of queue depths / block sizes /
// submission modes / rings (liburing test/read-write.c style), several
// directories, concurrent callers, registered buffers, checksums, callbacks,
// capacity, argument checks, and draining at destruction.
#include "tiers/nvme/nvme_tier.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include "base/bytes.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

// A 4096-aligned heap buffer.
class Buf {
 public:
  explicit Buf(size_t n)
      : n_(n), p_(static_cast<uint8_t*>(std::aligned_alloc(4096, AlignUp(n ? n : 1, 4096)))) {}
  Buf(size_t n, uint64_t seed) : Buf(n) {
    auto r = testing::RandomBytes(n, seed);
    std::memcpy(p_, r.data(), n);
  }
  ~Buf() { std::free(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  bool operator==(const Buf& o) const { return n_ == o.n_ && std::memcmp(p_, o.p_, n_) == 0; }

 private:
  size_t n_;
  uint8_t* p_;
};

// Waits for a number of callbacks; records each status.
class Countdown {
 public:
  IoCallback Callback() {
    {
      std::lock_guard<std::mutex> l(mu_);
      ++expected_;
    }
    return [this](Status s) {
      std::lock_guard<std::mutex> l(mu_);
      statuses_.push_back(std::move(s));
      cv_.notify_all();
    };
  }
  std::vector<Status> Wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return statuses_.size() >= expected_; });
    return statuses_;
  }
  size_t done() {
    std::lock_guard<std::mutex> l(mu_);
    return statuses_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t expected_ = 0;
  std::vector<Status> statuses_;
};

NvmeOptions Options(const TempDir& dir) {
  NvmeOptions o;
  o.dirs = {dir.path()};
  return o;
}

#define OPEN_OR_SKIP(var, opts)                                             \
  auto var##_r = NvmeTier::Open(opts);                                      \
  if (!var##_r.ok() && var##_r.status().code() == StatusCode::kUnavailable) \
    GTEST_SKIP() << var##_r.status().ToString();                            \
  ASSERT_OK(var##_r.status());                                              \
  std::unique_ptr<NvmeTier> var = std::move(var##_r).value()

TEST(NvmeTier, OpenMakesOneFilePerDirectoryAndRemovesThem) {
  TempDir a, b;
  NvmeOptions o;
  o.dirs = {a.path(), b.path()};
  std::vector<std::string> files;
  {
    OPEN_OR_SKIP(tier, o);
    files = tier->files();
    ASSERT_EQ(files.size(), 2u);
    EXPECT_EQ(std::filesystem::path(files[0]).parent_path(), a.path());
    EXPECT_EQ(std::filesystem::path(files[1]).parent_path(), b.path());
    EXPECT_TRUE(std::filesystem::exists(files[0]));
    EXPECT_TRUE(std::filesystem::exists(files[1]));
    EXPECT_TRUE(tier->direct_io());
  }
  EXPECT_FALSE(std::filesystem::exists(files[0]));
  EXPECT_FALSE(std::filesystem::exists(files[1]));
}

TEST(NvmeTier, RejectsBadOptions) {
  TempDir d;
  NvmeOptions o = Options(d);
  o.dirs.clear();
  EXPECT_THAT(NvmeTier::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o = Options(d);
  o.block_size = 5000;
  EXPECT_THAT(NvmeTier::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o = Options(d);
  o.queue_depth = 0;
  EXPECT_THAT(NvmeTier::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o = Options(d);
  o.rings = 0;
  EXPECT_THAT(NvmeTier::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o = Options(d);
  o.checksum = ChecksumKind::kCrc32c;
  o.checksum_block = 100;
  EXPECT_THAT(NvmeTier::Open(o), StatusIs(StatusCode::kInvalidArgument));
  o = Options(d);
  o.dirs = {d.File("missing")};
  auto r = NvmeTier::Open(o);
  EXPECT_THAT(r, StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(r.status().ToString(), HasSubstr(d.File("missing")));
  // A file is not a directory.
  {
    FILE* f = std::fopen(d.File("plain").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  o.dirs = {d.File("plain")};
  EXPECT_THAT(NvmeTier::Open(o), StatusIs(StatusCode::kInvalidArgument));
}

TEST(NvmeTier, RoundTripsManySizesAndOffsets) {
  TempDir d;
  NvmeOptions o = Options(d);
  o.block_size = 256 * kKiB;
  OPEN_OR_SKIP(tier, o);
  uint64_t seed = 1;
  for (uint64_t bytes : {4 * kKiB, 8 * kKiB, 12 * kKiB, 256 * kKiB, 260 * kKiB, kMiB + 4 * kKiB,
                         3 * kMiB + 8 * kKiB}) {
    ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(bytes));
    EXPECT_EQ(e.bytes, bytes);
    EXPECT_EQ(e.offset % 4096, 0u);
    Buf src(bytes, ++seed), dst(bytes);
    ASSERT_OK(tier->WriteSync(e, 0, src.data(), bytes));
    ASSERT_OK(tier->ReadSync(e, 0, dst.data(), bytes));
    EXPECT_TRUE(src == dst) << bytes;
    // Partial rewrite and partial reads at page offsets inside the extent.
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 4; ++i) {
      uint64_t pages = bytes / 4096;
      uint64_t first = rng() % pages, count = 1 + rng() % (pages - first);
      Buf patch(count * 4096, ++seed);
      ASSERT_OK(tier->WriteSync(e, first * 4096, patch.data(), patch.size()));
      std::memcpy(src.data() + first * 4096, patch.data(), patch.size());
      first = rng() % pages;
      count = 1 + rng() % (pages - first);
      Buf part(count * 4096);
      ASSERT_OK(tier->ReadSync(e, first * 4096, part.data(), part.size()));
      EXPECT_EQ(std::memcmp(part.data(), src.data() + first * 4096, part.size()), 0);
    }
    ASSERT_OK(tier->ReadSync(e, 0, dst.data(), bytes));
    EXPECT_TRUE(src == dst) << bytes;
  }
  NvmeStats s = tier->stats();
  EXPECT_GT(s.bytes_written, 0u);
  EXPECT_GT(s.bytes_read, 0u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.short_requeued, 0u);
}

TEST(NvmeTier, FilesGrowAsExtentsAreHandedOutAndHolesAreReused) {
  TempDir d;
  NvmeOptions o = Options(d);
  OPEN_OR_SKIP(tier, o);
  struct stat st {};
  ASSERT_EQ(::stat(tier->files()[0].c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  ASSERT_OK_AND_ASSIGN(Extent a, tier->Allocate(3 * kMiB));
  ASSERT_OK_AND_ASSIGN(Extent b, tier->Allocate(kMiB));
  ASSERT_EQ(::stat(tier->files()[0].c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 4 * kMiB);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 4 * kMiB);  // reserved, not sparse
  tier->Free(a);
  ASSERT_OK_AND_ASSIGN(Extent c, tier->Allocate(2 * kMiB));
  EXPECT_EQ(c.offset, a.offset);  // the hole is reused; the file does not grow
  ASSERT_EQ(::stat(tier->files()[0].c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 4 * kMiB);
  EXPECT_EQ(tier->stats().used, 3 * kMiB);
  (void)b;
}

TEST(NvmeTier, CapacityIsEnforcedAsOutOfMemory) {
  TempDir d;
  NvmeOptions o = Options(d);
  o.capacity_bytes = kMiB;
  OPEN_OR_SKIP(tier, o);
  ASSERT_OK_AND_ASSIGN(Extent a, tier->Allocate(768 * kKiB - 100));  // rounds to 768 KiB
  auto r = tier->Allocate(512 * kKiB);
  ASSERT_THAT(r, StatusIs(StatusCode::kOutOfMemory));
  EXPECT_EQ(r.status().tier(), TierKind::kNvme);
  EXPECT_EQ(r.status().bytes_requested(), 512 * kKiB);
  EXPECT_EQ(r.status().bytes_available(), 256 * kKiB);
  ASSERT_OK_AND_ASSIGN(Extent b, tier->Allocate(256 * kKiB));
  EXPECT_EQ(tier->stats().used, kMiB);
  EXPECT_EQ(tier->stats().capacity, kMiB);
  tier->Free(a);
  ASSERT_OK(tier->Allocate(512 * kKiB).status());
  (void)b;
  EXPECT_THAT(tier->Allocate(0), StatusIs(StatusCode::kInvalidArgument));
}

TEST(NvmeTier, ExtentsSpreadOverDirectories) {
  TempDir a, b;
  NvmeOptions o;
  o.dirs = {a.path(), b.path()};
  OPEN_OR_SKIP(tier, o);
  int per_file[2] = {0, 0};
  std::vector<std::pair<Extent, std::unique_ptr<Buf>>> data;
  for (int i = 0; i < 8; ++i) {
    ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(kMiB));
    ASSERT_LT(e.file, 2u);
    ++per_file[e.file];
    auto buf = std::make_unique<Buf>(kMiB, 100 + i);
    ASSERT_OK(tier->WriteSync(e, 0, buf->data(), kMiB));
    data.emplace_back(e, std::move(buf));
  }
  EXPECT_EQ(per_file[0], 4);
  EXPECT_EQ(per_file[1], 4);
  for (auto& [e, buf] : data) {
    Buf back(kMiB);
    ASSERT_OK(tier->ReadSync(e, 0, back.data(), kMiB));
    EXPECT_TRUE(back == *buf);
  }
}

TEST(NvmeTier, BadTransfersFailThroughTheCallback) {
  TempDir d;
  OPEN_OR_SKIP(tier, Options(d));
  ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(64 * kKiB));
  Buf buf(128 * kKiB, 3);
  EXPECT_THAT(tier->WriteSync(e, 100, buf.data(), 4096), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(tier->WriteSync(e, 0, buf.data(), 1000), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(tier->WriteSync(e, 0, buf.data() + 8, 4096), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(tier->ReadSync(e, 0, buf.data(), 128 * kKiB), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(tier->ReadSync(e, 64 * kKiB, buf.data(), 4096),
              StatusIs(StatusCode::kInvalidArgument));
  Extent other = e;
  other.file = 7;
  EXPECT_THAT(tier->ReadSync(other, 0, buf.data(), 4096), StatusIs(StatusCode::kInvalidArgument));
  tier->Free(e);
  Status s = tier->ReadSync(e, 0, buf.data(), 4096);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(s.ToString(), HasSubstr("not allocated"));
  // Zero bytes is a valid, empty transfer.
  ASSERT_OK_AND_ASSIGN(Extent f, tier->Allocate(4096));
  EXPECT_OK(tier->WriteSync(f, 0, buf.data(), 0));
  EXPECT_EQ(tier->stats().errors, 7u);
}

// The read-write matrix: every combination runs many extents of awkward sizes
// asynchronously at once, then reads them all back at once.
using MatrixParam = std::tuple<uint32_t /*queue_depth*/, uint32_t /*block_size*/,
                               bool /*single_submit*/, bool /*overlap_events*/, int /*rings*/>;

class NvmeMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(NvmeMatrix, AsyncRoundTrip) {
  auto [qd, block, single, overlap, rings] = GetParam();
  TempDir d;
  NvmeOptions o = Options(d);
  o.queue_depth = qd;
  o.block_size = block;
  o.single_submit = single;
  o.overlap_events = overlap;
  o.rings = rings;
  OPEN_OR_SKIP(tier, o);
  const uint64_t sizes[] = {4 * kKiB,  20 * kKiB,  64 * kKiB,
                            68 * kKiB, 300 * kKiB, kMiB + 12 * kKiB};
  std::vector<Extent> ext;
  std::vector<std::unique_ptr<Buf>> src, dst;
  uint64_t pieces = 0;
  for (int rep = 0; rep < 3; ++rep) {
    for (uint64_t n : sizes) {
      ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(n));
      ext.push_back(e);
      src.push_back(std::make_unique<Buf>(n, 1000 + ext.size()));
      dst.push_back(std::make_unique<Buf>(n));
      pieces += (n + block - 1) / block;
    }
  }
  Countdown writes;
  for (size_t i = 0; i < ext.size(); ++i)
    tier->Write(ext[i], 0, src[i]->data(), src[i]->size(), writes.Callback());
  for (const Status& s : writes.Wait()) ASSERT_OK(s);
  Countdown reads;
  for (size_t i = 0; i < ext.size(); ++i)
    tier->Read(ext[i], 0, dst[i]->data(), dst[i]->size(), reads.Callback());
  for (const Status& s : reads.Wait()) ASSERT_OK(s);
  for (size_t i = 0; i < ext.size(); ++i) EXPECT_TRUE(*src[i] == *dst[i]) << "extent " << i;
  NvmeStats s = tier->stats();
  EXPECT_EQ(s.writes, ext.size());
  EXPECT_EQ(s.reads, ext.size());
  EXPECT_GE(s.ios_submitted, 2 * pieces);  // more when a transfer is split over rings
  EXPECT_LE(s.max_inflight, qd);
  EXPECT_GE(s.max_inflight, 1u);
}

std::string MatrixName(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto& [qd, block, single, overlap, rings] = info.param;
  return "qd" + std::to_string(qd) + "_bs" + std::to_string(block / 1024) + "k" +
         (single ? "_single" : "_batch") + (overlap ? "_overlap" : "_nooverlap") + "_rings" +
         std::to_string(rings);
}

INSTANTIATE_TEST_SUITE_P(Matrix, NvmeMatrix,
                         ::testing::Combine(::testing::Values(1u, 4u, 32u),
                                            ::testing::Values(4096u, 64u * 1024, 1024u * 1024),
                                            ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(1, 3)),
                         MatrixName);

// Several threads, each with its own extents, writing, reading and checking
// with both the blocking and the callback forms, on a tier with two rings.
TEST(NvmeTier, ConcurrentCallers) {
  TempDir a, b;
  NvmeOptions o;
  o.dirs = {a.path(), b.path()};
  o.rings = 2;
  o.queue_depth = 8;
  o.block_size = 128 * kKiB;
  OPEN_OR_SKIP(tier, o);
  constexpr int kThreads = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int iter = 0; iter < 12; ++iter) {
        uint64_t n = (1 + rng() % 96) * 4096;
        auto e = tier->Allocate(n);
        if (!e.ok()) {
          ++failures;
          continue;
        }
        Buf src(n, rng()), dst(n);
        if (iter % 2) {
          if (!tier->WriteSync(*e, 0, src.data(), n).ok()) ++failures;
          if (!tier->ReadSync(*e, 0, dst.data(), n).ok()) ++failures;
        } else {
          Countdown c;
          tier->Write(*e, 0, src.data(), n, c.Callback());
          for (auto& s : c.Wait())
            if (!s.ok()) ++failures;
          Countdown r;
          tier->Read(*e, 0, dst.data(), n, r.Callback());
          for (auto& s : r.Wait())
            if (!s.ok()) ++failures;
        }
        if (!(src == dst)) ++failures;
        tier->Free(*e);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(tier->stats().used, 0u);
}

TEST(NvmeTier, RegisteredBuffersUseFixedIo) {
  TempDir d;
  NvmeOptions o = Options(d);
  o.block_size = 256 * kKiB;
  OPEN_OR_SKIP(tier, o);
  if (!tier->stats().fixed_buffers) GTEST_SKIP() << "the kernel refused a sparse buffer table";
  Buf pool(2 * kMiB, 9), back(2 * kMiB);
  ASSERT_OK(tier->RegisterBuffer(pool.data(), pool.size()));
  if (tier->stats().registered_bytes == 0)
    GTEST_SKIP() << "the kernel refused to register 2 MiB (RLIMIT_MEMLOCK?)";
  EXPECT_EQ(tier->stats().registered_bytes, 2 * kMiB);
  // Overlapping registrations are the caller's bug.
  EXPECT_THAT(tier->RegisterBuffer(pool.data() + kMiB, 2 * kMiB),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(tier->RegisterBuffer(nullptr, 10), StatusIs(StatusCode::kInvalidArgument));

  ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(2 * kMiB));
  ASSERT_OK(tier->WriteSync(e, 0, pool.data(), 2 * kMiB));  // 8 pieces from the registered pool
  EXPECT_EQ(tier->stats().fixed_ios, 8u);
  ASSERT_OK(tier->ReadSync(e, 0, back.data(), 2 * kMiB));  // into an unregistered buffer
  EXPECT_EQ(tier->stats().fixed_ios, 8u);
  EXPECT_TRUE(pool == back);
  std::memset(pool.data(), 0, pool.size());
  ASSERT_OK(tier->ReadSync(e, 0, pool.data(), 2 * kMiB));  // fixed reads
  EXPECT_EQ(tier->stats().fixed_ios, 16u);
  EXPECT_TRUE(pool == back);

  tier->UnregisterBuffer(pool.data());
  EXPECT_EQ(tier->stats().registered_bytes, 0u);
  ASSERT_OK(tier->ReadSync(e, 0, pool.data(), 2 * kMiB));
  EXPECT_EQ(tier->stats().fixed_ios, 16u);
  EXPECT_TRUE(pool == back);
  // The slot is free again.
  ASSERT_OK(tier->RegisterBuffer(pool.data(), kMiB));
  EXPECT_EQ(tier->stats().registered_bytes, kMiB);
}

TEST(NvmeTier, DestructorDrainsInFlightTransfers) {
  TempDir d;
  NvmeOptions o = Options(d);
  o.queue_depth = 4;
  o.block_size = 64 * kKiB;
  o.rings = 2;
  std::atomic<int> ok{0}, calls{0};
  Buf src(256 * kKiB, 4);
  {
    OPEN_OR_SKIP(tier, o);
    std::vector<Extent> ext;
    for (int i = 0; i < 32; ++i) {
      ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(256 * kKiB));
      ext.push_back(e);
    }
    for (const Extent& e : ext)
      tier->Write(e, 0, src.data(), src.size(), [&](Status s) {
        ++calls;
        if (s.ok()) ++ok;
      });
  }  // destroyed with the writes queued
  EXPECT_EQ(calls.load(), 32);
  EXPECT_EQ(ok.load(), 32);
}

// I/O started by a callback while the tier is being destroyed still runs to
// its callback (the rings stop only when no transfer is outstanding).
TEST(NvmeTier, DestructorWaitsForIoStartedByCallbacks) {
  TempDir d;
  NvmeOptions o = Options(d);
  o.rings = 2;  // the last read goes back to ring 0, the first ring to stop
  std::atomic<int> last_ok{0};
  Buf src(kMiB, 21), dst(kMiB);
  {
    OPEN_OR_SKIP(tier, o);
    NvmeTier* t = tier.get();
    ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(kMiB));
    // write -> read -> read, each started from the previous callback.
    tier->Write(e, 0, src.data(), kMiB, [&, t, e](Status s) {
      if (!s.ok()) return;
      t->Read(e, 0, dst.data(), kMiB, [&, t, e](Status s2) {
        if (!s2.ok()) return;
        t->Read(e, 0, dst.data(), kMiB, [&](Status s3) {
          if (s3.ok()) ++last_ok;
        });
      });
    });
  }
  EXPECT_EQ(last_ok.load(), 1);
  EXPECT_TRUE(src == dst);
}

TEST(NvmeTier, CallbacksMayStartIoButNotWaitForIt) {
  TempDir d;
  OPEN_OR_SKIP(tier, Options(d));
  ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(64 * kKiB));
  Buf src(64 * kKiB, 5), dst(64 * kKiB);
  Countdown chain;
  IoCallback read_done = chain.Callback();
  Status sync_in_callback;
  tier->Write(e, 0, src.data(), src.size(), [&](Status s) {
    ASSERT_OK(s);
    sync_in_callback = tier->ReadSync(e, 0, dst.data(), dst.size());
    tier->Read(e, 0, dst.data(), dst.size(), read_done);  // starting I/O is fine
  });
  for (auto& s : chain.Wait()) ASSERT_OK(s);
  EXPECT_THAT(sync_in_callback, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(src == dst);
}

class NvmeChecksum : public ::testing::TestWithParam<ChecksumKind> {};

TEST_P(NvmeChecksum, RoundTripsWithPartialBlocksAndNoFalseAlarms) {
  TempDir d;
  NvmeOptions o = Options(d);
  o.checksum = GetParam();
  o.checksum_block = 64 * kKiB;
  o.block_size = 32 * kKiB;
  o.rings = 2;
  OPEN_OR_SKIP(tier, o);
  const uint64_t n = 4 * 64 * kKiB + 8 * kKiB;  // 4 full blocks and a short last one
  ASSERT_OK_AND_ASSIGN(Extent e, tier->Allocate(n));
  Buf src(n, 6), dst(n);
  ASSERT_OK(tier->WriteSync(e, 0, src.data(), n));
  ASSERT_OK(tier->ReadSync(e, 0, dst.data(), n));
  EXPECT_TRUE(src == dst);
  // A write covering parts of blocks 1 and 2 only; then whole and partial reads.
  Buf patch(64 * kKiB, 7);
  ASSERT_OK(tier->WriteSync(e, 96 * kKiB, patch.data(), patch.size()));
  std::memcpy(src.data() + 96 * kKiB, patch.data(), patch.size());
  ASSERT_OK(tier->ReadSync(e, 0, dst.data(), n));
  EXPECT_TRUE(src == dst);
  Buf part(68 * kKiB);
  ASSERT_OK(tier->ReadSync(e, 192 * kKiB, part.data(), part.size()));
  EXPECT_EQ(std::memcmp(part.data(), src.data() + 192 * kKiB, part.size()), 0);
  EXPECT_EQ(tier->stats().checksum_failures, 0u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, NvmeChecksum,
                         ::testing::Values(ChecksumKind::kCrc32c, ChecksumKind::kXxh64),
                         [](const auto& info) { return std::string(ChecksumName(info.param)); });

// A randomized run: several threads write, rewrite, read and free random
// extents over a small capacity and check every byte against a reference.
TEST(NvmeTier, RandomizedStressAgainstReference) {
  TempDir d;
  NvmeOptions o = Options(d);
  o.capacity_bytes = 8 * kMiB;
  o.rings = 2;
  o.queue_depth = 16;
  o.block_size = 64 * kKiB;
  o.checksum = ChecksumKind::kCrc32c;
  o.checksum_block = 128 * kKiB;
  OPEN_OR_SKIP(tier, o);
  std::atomic<int> bad{0}, oom{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(77 + t);
      struct Live {
        Extent e;
        std::unique_ptr<Buf> ref;
      };
      std::vector<Live> live;
      for (int step = 0; step < 60; ++step) {
        int op = rng() % 4;
        if (op == 0 || live.empty()) {
          uint64_t n = (1 + rng() % 64) * 4096;
          auto e = tier->Allocate(n);
          if (!e.ok()) {
            if (e.status().code() != StatusCode::kOutOfMemory) ++bad;
            ++oom;
            continue;
          }
          auto ref = std::make_unique<Buf>(n, rng());
          if (!tier->WriteSync(*e, 0, ref->data(), n).ok()) ++bad;
          live.push_back({*e, std::move(ref)});
        } else if (op == 1) {  // rewrite a page range
          Live& l = live[rng() % live.size()];
          uint64_t pages = l.e.bytes / 4096, first = rng() % pages,
                   count = 1 + rng() % (pages - first);
          Buf patch(count * 4096, rng());
          if (!tier->WriteSync(l.e, first * 4096, patch.data(), patch.size()).ok()) ++bad;
          std::memcpy(l.ref->data() + first * 4096, patch.data(), patch.size());
        } else if (op == 2) {  // read everything back
          Live& l = live[rng() % live.size()];
          Buf back(l.e.bytes);
          if (!tier->ReadSync(l.e, 0, back.data(), back.size()).ok()) ++bad;
          if (std::memcmp(back.data(), l.ref->data(), back.size()) != 0) ++bad;
        } else {
          size_t i = rng() % live.size();
          tier->Free(live[i].e);
          live.erase(live.begin() + i);
        }
      }
      for (auto& l : live) {
        Buf back(l.e.bytes);
        if (!tier->ReadSync(l.e, 0, back.data(), back.size()).ok()) ++bad;
        if (std::memcmp(back.data(), l.ref->data(), back.size()) != 0) ++bad;
        tier->Free(l.e);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(tier->stats().used, 0u);
  EXPECT_EQ(tier->stats().checksum_failures, 0u);
}

}  // namespace
}  // namespace strata
