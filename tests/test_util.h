// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the tests: Status matchers, temporary directories, GPU
// skips, random data, test data paths.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/device.h"
#include "base/status.h"

namespace strata::testing {

inline Status GetStatus(const Status& s) { return s; }
template <typename T>
Status GetStatus(const Result<T>& r) {
  return r.status();
}

// EXPECT_THAT(s, StatusIs(StatusCode::kIoError)); works on Status and Result<T>.
MATCHER_P(StatusIs, code, "has status code " + std::string(StatusCodeName(code))) {
  ::strata::Status s = ::strata::testing::GetStatus(arg);
  *result_listener << "whose status is " << s.ToString();
  return s.code() == code;
}
MATCHER(IsOk, "is OK") {
  ::strata::Status s = ::strata::testing::GetStatus(arg);
  *result_listener << "whose status is " << s.ToString();
  return s.ok();
}

// A fresh directory under $TMPDIR or /var/tmp (on disk: O_DIRECT works there,
// unlike tmpfs), removed with everything in it at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Deterministic pseudo-random bytes / floats for checks (never zeros).
std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed);
std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f);

// The seed of a randomized test: STRATA_TEST_SEED when it is set (to replay
// a failure), else `fallback`. SeedNote(seed) is what a test puts in its
// failure messages (SCOPED_TRACE): the seed and how to rerun with it.
uint64_t TestSeed(uint64_t fallback);
std::string SeedNote(uint64_t seed);

// Path of a file in the source tree (tests/data/..., data/...).
std::string SourcePath(const std::string& rel);

// True when a CUDA device is usable; otherwise *why says why.
bool HaveGpu(std::string* why = nullptr);

// A loopback TCP port nobody listens on now (the kernel's pick), for
// rendezvous tests.
int FreeLoopbackPort();

}  // namespace strata::testing

#define ASSERT_OK(expr) ASSERT_THAT((expr), ::strata::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::strata::testing::IsOk())

// ASSERT_OK_AND_ASSIGN(auto x, MakeX());
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(STRATA_CONCAT_(strata_test_result_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  ASSERT_OK(tmp.status());                         \
  lhs = std::move(tmp).value()

// Skips the current test, with the reason, when no GPU is usable.
#define STRATA_SKIP_WITHOUT_GPU()                                   \
  do {                                                              \
    std::string strata_why_;                                        \
    if (!::strata::testing::HaveGpu(&strata_why_)) GTEST_SKIP() << strata_why_; \
  } while (0)
