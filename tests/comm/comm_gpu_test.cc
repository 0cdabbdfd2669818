// SPDX-License-Identifier: Apache-2.0
// The NCCL communicator: at world size 1 on one GPU, and 2 ranks (one
// thread each, on GPUs 0 and 1) where two GPUs exist: every collective
// against known values on the caller's stream, the rendezvous's error when
// a rank does not arrive, and the watchdog ending a collective whose peer
// never comes with an error within the timeout.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/device.h"
#include "comm/communicator.h"
#include "comm/nccl_communicator.h"
#include "tests/test_util.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace strata::comm {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::FreeLoopbackPort;
using ::testing::HasSubstr;

#define SKIP_WITHOUT_NCCL()                                                          \
  do {                                                                               \
    STRATA_SKIP_WITHOUT_GPU();                                                       \
    if (!BuiltWithNccl()) GTEST_SKIP() << "built without NCCL (nccl.h/libnccl not found)"; \
  } while (0)

#if STRATA_WITH_CUDA

RankEnv Rank(int rank, int world, int port) {
  RankEnv e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.local_world_size = world;
  e.master_port = port;
  return e;
}

// A device buffer of T, filled from and read back to host vectors.
template <class T>
class DeviceVec {
 public:
  explicit DeviceVec(size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&p_, n * sizeof(T) + 1), cudaSuccess); }
  ~DeviceVec() { cudaFree(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* get() { return static_cast<T*>(p_); }
  void Set(const std::vector<T>& v) {
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Get() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

// Every collective on rank r of w, on its own stream, checked against the
// values it must give.
void CheckCollectives(Communicator& c) {
  const int r = c.rank(), w = c.world_size();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const size_t n = (1 << 20) + 5;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((r + 1) * (i % 512));
  DeviceVec<float> dx(n), dy(n);
  dx.Set(x);
  ASSERT_OK(c.AllReduce(dx.get(), dy.get(), n, DType::kF32, ReduceOp::kSum, s));
  ASSERT_OK(c.AllReduce(dx.get(), dx.get(), n, DType::kF32, ReduceOp::kMax, s));  // in place
  const size_t g = 1001;
  std::vector<int32_t> mine(g);
  for (size_t i = 0; i < g; ++i) mine[i] = r * 100000 + static_cast<int32_t>(i);
  DeviceVec<int32_t> dmine(g), dall(g * w);
  dmine.Set(mine);
  ASSERT_OK(c.AllGather(dmine.get(), dall.get(), g, DType::kI32, s));
  const size_t b = 4099;
  std::vector<uint16_t> send(b * w);  // bf16: 1.0 + a small integer per (rank, block)
  for (int k = 0; k < w; ++k)
    for (size_t i = 0; i < b; ++i) send[k * b + i] = static_cast<uint16_t>(0x3f80 + ((r + k + i) % 4) * 0x80);
  DeviceVec<uint16_t> dsend(b * w), drecv(b);
  dsend.Set(send);
  ASSERT_OK(c.ReduceScatter(dsend.get(), drecv.get(), b, DType::kBF16, ReduceOp::kMax, s));
  // In place (the gradients' reduce-scatter): this rank's block of the buffer receives its sum.
  const size_t ip = 3001;
  std::vector<float> whole(ip * w);
  for (int k = 0; k < w; ++k)
    for (size_t i = 0; i < ip; ++i) whole[k * ip + i] = static_cast<float>(r + 10 * k) + static_cast<float>(i % 16);
  DeviceVec<float> dwhole(ip * w);
  dwhole.Set(whole);
  ASSERT_OK(c.ReduceScatter(dwhole.get(), dwhole.get() + static_cast<size_t>(r) * ip, ip, DType::kF32,
                            ReduceOp::kSum, s));
  std::vector<int64_t> v(3, r == w - 1 ? 0 : -1);
  if (r == w - 1) v = {11, 1LL << 50, -3};
  DeviceVec<int64_t> dv(3);
  dv.Set(v);
  ASSERT_OK(c.Broadcast(dv.get(), 3, DType::kI64, w - 1, s));
  ASSERT_OK(c.Barrier(s));
  ASSERT_OK(c.Synchronize());
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);

  const float tri = static_cast<float>(w * (w + 1) / 2);
  const std::vector<float> y = dy.Get(), m = dx.Get();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(y[i], tri * static_cast<float>(i % 512)) << i;
    ASSERT_EQ(m[i], static_cast<float>(w * (i % 512))) << i;
  }
  const std::vector<int32_t> all = dall.Get();
  for (int k = 0; k < w; ++k)
    for (size_t i = 0; i < g; ++i) ASSERT_EQ(all[k * g + i], k * 100000 + static_cast<int32_t>(i));
  const std::vector<uint16_t> got = drecv.Get();
  for (size_t i = 0; i < b; ++i) {
    uint16_t want = 0;  // the max over the ranks q of block r's (q + r + i) % 4
    for (int q = 0; q < w; ++q)
      want = std::max<uint16_t>(want, static_cast<uint16_t>(0x3f80 + ((q + r + i) % 4) * 0x80));
    ASSERT_EQ(got[i], want) << i;
  }
  EXPECT_EQ(dv.Get(), (std::vector<int64_t>{11, 1LL << 50, -3}));
  const std::vector<float> summed = dwhole.Get();
  for (size_t i = 0; i < ip; ++i)
    ASSERT_EQ(summed[static_cast<size_t>(r) * ip + i],
              static_cast<float>(w * (w - 1) / 2 + w * 10 * r) + w * static_cast<float>(i % 16))
        << i;
  cudaStreamDestroy(s);
}

TEST(NcclCommunicator, WorldOfOne) {
  SKIP_WITHOUT_NCCL();
  ASSERT_OK_AND_ASSIGN(auto c, CreateNcclCommunicator(Rank(0, 1, FreeLoopbackPort()), 0, CommOptions{}));
  EXPECT_EQ(c->backend(), "nccl");
  EXPECT_EQ(c->world_size(), 1);
  CheckCollectives(*c);
  Status bad = c->AllReduce(nullptr, nullptr, 4, DType::kU16, ReduceOp::kSum, nullptr);
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(bad.message(), HasSubstr("all_reduce 4 x u16 (sum) on rank 0 of 1"));
}

// Runs `body(rank)` on two threads, one per GPU.
void TwoRanks(const std::function<void(int)>& body) {
  std::thread a(body, 0), b(body, 1);
  a.join();
  b.join();
}

TEST(NcclCommunicator, TwoRanksOnTwoGpus) {
  SKIP_WITHOUT_NCCL();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs; this machine has " << CudaDeviceCount();
  const int port = FreeLoopbackPort();
  TwoRanks([&](int r) {
    auto c = CreateNcclCommunicator(Rank(r, 2, port), r, CommOptions{});
    ASSERT_OK(c.status()) << "rank " << r;
    CheckCollectives(**c);
  });
}

TEST(NcclCommunicator, RankThatDoesNotArriveIsNamed) {
  SKIP_WITHOUT_NCCL();
  CommOptions o;
  o.timeout_s = 1;
  const double t0 = NowSeconds();
  auto c = CreateNcclCommunicator(Rank(0, 2, FreeLoopbackPort()), 0, o);
  EXPECT_LT(NowSeconds() - t0, 10);
  EXPECT_THAT(c, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(c.status().message(), HasSubstr("rank(s) 1 of 2 did not arrive"));
}

// Rank 1 joins and then never calls the collective: rank 0's watchdog
// ends it within the timeout (aborting NCCL, so the stream moves on), and
// the error sticks.
TEST(NcclCommunicator, CollectiveWhosePeerNeverComesTimesOut) {
  SKIP_WITHOUT_NCCL();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs; this machine has " << CudaDeviceCount();
  const int port = FreeLoopbackPort();
  CommOptions o;
  o.timeout_s = 2;
  TwoRanks([&](int r) {
    auto c = CreateNcclCommunicator(Rank(r, 2, port), r, o);
    ASSERT_OK(c.status()) << "rank " << r;
    if (r == 1) return;  // leaves (its communicator's finalize is bounded by the timeout too)
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    DeviceVec<float> d(1024);
    const double t0 = NowSeconds();
    ASSERT_OK((*c)->AllReduce(d.get(), d.get(), 1024, DType::kF32, ReduceOp::kSum, s));  // enqueued
    Status e = (*c)->Synchronize();
    EXPECT_LT(NowSeconds() - t0, o.timeout_s + 5);
    EXPECT_THAT(e, StatusIs(StatusCode::kUnavailable));
    EXPECT_THAT(e.message(), HasSubstr("all_reduce 1024 x f32 (sum) on rank 0 of 2"));
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess) << "the aborted collective still holds the stream";
    EXPECT_EQ((*c)->Barrier(s).message(), e.message());
    cudaStreamDestroy(s);
  });
}

#else  // !STRATA_WITH_CUDA

TEST(NcclCommunicator, NeedsCuda) { GTEST_SKIP() << "built without CUDA: no NCCL communicator"; }

#endif

}  // namespace
}  // namespace strata::comm
