// SPDX-License-Identifier: Apache-2.0
// Helpers for the GPU tests that run an op on the CUDA backend and on a
// reference (the CPU backend, or the CUDA backend's simple attention) and
// compare: host <-> dtype conversion, buffers mirrored on two backends,
// poisoning, relative errors, tolerances per dtype.
//
// Tolerances (‖out − ref‖ / ‖ref‖, see ../.library/device/METHOD.md): fp32
// arithmetic lands far under 1e-4; bf16 operands between 1e-3 and 1e-2, f16 a
// few times tighter. NaN never passes (RelErr of a non-finite output is +inf).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/dtype.h"
#include "base/half.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/test_util.h"

namespace strata::testing {

using kernels::Backend;
using kernels::DeviceBuffer;

// A fresh seed per call, or STRATA_TEST_SEED when set: the tests name it in
// their failure messages (SeedNote) so that a failure can be replayed.
inline uint64_t FreshSeed() {
  static std::random_device rd;
  return TestSeed((static_cast<uint64_t>(rd()) << 32) ^ rd());
}

// float values -> bytes of `dt` (f32, f16, bf16), rounding to nearest even.
inline std::vector<uint8_t> ToBytes(const std::vector<float>& v, DType dt) {
  std::vector<uint8_t> out(v.size() * DTypeSize(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      uint16_t h = dt == DType::kBF16 ? FloatToBF16(v[i]) : FloatToHalf(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

inline std::vector<double> ToDoubles(const std::vector<uint8_t>& b, DType dt) {
  const size_t es = DTypeSize(dt);
  std::vector<double> out(b.size() / es);
  for (size_t i = 0; i < out.size(); ++i) {
    if (dt == DType::kF32) {
      float f;
      std::memcpy(&f, b.data() + 4 * i, 4);
      out[i] = f;
    } else if (dt == DType::kI32) {
      int32_t x;
      std::memcpy(&x, b.data() + 4 * i, 4);
      out[i] = x;
    } else {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      out[i] = dt == DType::kBF16 ? BF16ToFloat(h) : HalfToFloat(h);
    }
  }
  return out;
}

// Rounds values to what `dt` can hold (so both backends see the same inputs
// and host-side math can use them).
inline std::vector<float> RoundTo(const std::vector<float>& v, DType dt) {
  std::vector<double> d = ToDoubles(ToBytes(v, dt), dt);
  return std::vector<float>(d.begin(), d.end());
}

// ‖out − ref‖ / ‖ref‖ (or ‖out − ref‖ when ‖ref‖ is 0); +inf when out holds
// a NaN or Inf that ref does not, or the sizes differ.
inline double RelErr(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      if (std::isfinite(ref[i]) || std::isnan(out[i]) != std::isnan(ref[i])) return INFINITY;
      continue;
    }
    if (!std::isfinite(ref[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Count of non-finite values (for messages).
inline size_t CountNonFinite(const std::vector<double>& v) {
  size_t n = 0;
  for (double x : v) n += !std::isfinite(x);
  return n;
}

enum class OpKind {
  kElementwise,  // one rounding of an fp32 value: both backends agree to the last bit or so
  kReduction,    // sums in different orders (GEMMs, LayerNorm, softmax, attention)
};

inline double Tolerance(DType dt, OpKind kind) {
  switch (dt) {
    case DType::kF32: return kind == OpKind::kElementwise ? 1e-6 : 2e-5;
    case DType::kF16: return kind == OpKind::kElementwise ? 1e-3 : 3e-3;
    case DType::kBF16: return kind == OpKind::kElementwise ? 5e-3 : 1e-2;
    default: return 0;
  }
}

// One unit in the last place of |x| in `dt` (f32, f16, bf16): the spacing of
// the representable values at |x|, the smallest normal's below it.
inline double UlpOf(double x, DType dt) {
  const int mant = dt == DType::kF32 ? 23 : dt == DType::kF16 ? 10 : 7;
  const int emin = dt == DType::kF32 ? -126 : dt == DType::kF16 ? -14 : -126;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  return std::ldexp(1.0, std::max(e - 1, emin) - mant);
}

// Elementwise ops, element by element: |out[i] - ref[i]| <= ulps * ulp(ref[i])
// + allow[i] (allow empty: 0), in the output dtype; NaN only where ref has one.
// Reports the first few elements over and the worst, in ulps.
inline ::testing::AssertionResult WithinUlps(const std::vector<double>& out, const std::vector<double>& ref, DType dt,
                                             double ulps, const std::vector<double>& allow = {}) {
  if (out.size() != ref.size()) return ::testing::AssertionFailure() << "sizes differ";
  int bad = 0;
  double worst = 0;
  size_t worst_at = 0;
  ::testing::AssertionResult r = ::testing::AssertionFailure();
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(ref[i]) || std::isnan(out[i])) {
      if (std::isnan(ref[i]) != std::isnan(out[i]) && ++bad <= 5) r << "element " << i << ": " << out[i] << " vs " << ref[i] << "; ";
      continue;
    }
    const double d = std::fabs(out[i] - ref[i]);
    const double in_ulps = d / UlpOf(ref[i], dt);
    if (in_ulps > worst) worst = in_ulps, worst_at = i;
    if (d > ulps * UlpOf(ref[i], dt) + (allow.empty() ? 0.0 : allow[i]) && ++bad <= 5)
      r << "element " << i << ": " << out[i] << " vs " << ref[i] << " (" << in_ulps << " ulp); ";
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return r << bad << " of " << out.size() << " elements over " << ulps << " ulp (worst " << worst << " ulp at "
           << worst_at << ")";
}

// One logical buffer mirrored on the CUDA backend and on the reference.
struct Mirror {
  DeviceBuffer gpu, ref;
  size_t bytes = 0;
};

class Mirrors {
 public:
  Mirrors(Backend* gpu, Backend* ref) : gpu_(gpu), ref_(ref) {}

  // A buffer of `bytes` on both, filled with `data` (when given) or poisoned
  // with 0xFF bytes (NaN in f32/f16/bf16, -1 in int32).
  Mirror Make(size_t bytes, const void* data = nullptr) {
    Mirror m;
    m.bytes = bytes;
    auto g = gpu_->Allocate(bytes);
    auto r = ref_->Allocate(bytes);
    EXPECT_OK(g.status());
    EXPECT_OK(r.status());
    if (!g.ok() || !r.ok()) return m;
    m.gpu = std::move(g).value();
    m.ref = std::move(r).value();
    if (data) {
      EXPECT_OK(gpu_->CopyToDevice(m.gpu.data(), data, bytes));
      EXPECT_OK(ref_->CopyToDevice(m.ref.data(), data, bytes));
    } else {
      Poison(m);
    }
    return m;
  }
  Mirror Make(const std::vector<uint8_t>& data) { return Make(data.size(), data.data()); }
  Mirror MakeFloats(const std::vector<float>& v, DType dt) { return Make(ToBytes(v, dt)); }
  Mirror MakeInts(const std::vector<int32_t>& v) { return Make(v.size() * 4, v.data()); }

  void Poison(Mirror& m) {
    if (m.bytes == 0) return;
    EXPECT_OK(gpu_->Memset(m.gpu.data(), 0xFF, m.bytes));
    EXPECT_OK(ref_->Memset(m.ref.data(), 0xFF, m.bytes));
  }
  // Poisons only the GPU side (before running the GPU op again).
  void PoisonGpu(Mirror& m) {
    if (m.bytes == 0) return;
    EXPECT_OK(gpu_->Memset(m.gpu.data(), 0xFF, m.bytes));
    EXPECT_OK(gpu_->Synchronize());
  }
  void Set(Mirror& m, const std::vector<uint8_t>& data) {
    EXPECT_OK(gpu_->CopyToDevice(m.gpu.data(), data.data(), data.size()));
    EXPECT_OK(ref_->CopyToDevice(m.ref.data(), data.data(), data.size()));
  }

  std::vector<uint8_t> GpuBytes(const Mirror& m) { return Download(gpu_, m.gpu, m.bytes); }
  std::vector<uint8_t> RefBytes(const Mirror& m) { return Download(ref_, m.ref, m.bytes); }
  std::vector<double> Gpu(const Mirror& m, DType dt) { return ToDoubles(GpuBytes(m), dt); }
  std::vector<double> Ref(const Mirror& m, DType dt) { return ToDoubles(RefBytes(m), dt); }

  // Relative error of the GPU's buffer against the reference's.
  double Err(const Mirror& m, DType dt) { return RelErr(Gpu(m, dt), Ref(m, dt)); }

  Backend* gpu() const { return gpu_; }
  Backend* ref() const { return ref_; }

 private:
  static std::vector<uint8_t> Download(Backend* b, const DeviceBuffer& buf, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    EXPECT_OK(b->Synchronize());
    if (bytes) {
      EXPECT_OK(b->CopyToHost(out.data(), buf.data(), bytes));
    }
    return out;
  }
  Backend* gpu_;
  Backend* ref_;
};

// Expect buffer `m` (dtype dt) of the GPU to match the reference within `tol`,
// naming `what` in the message.
#define EXPECT_CLOSE(mirrors, m, dt, tol, what)                                         \
  do {                                                                                  \
    auto strata_gpu_ = (mirrors).Gpu((m), (dt));                                        \
    auto strata_ref_ = (mirrors).Ref((m), (dt));                                        \
    double strata_err_ = ::strata::testing::RelErr(strata_gpu_, strata_ref_);           \
    EXPECT_LE(strata_err_, (tol))                                                       \
        << (what) << ": relative error " << strata_err_ << " over tolerance " << (tol)  \
        << " (" << ::strata::testing::CountNonFinite(strata_gpu_)                       \
        << " non-finite values in the GPU output of " << strata_gpu_.size() << ")";     \
  } while (0)

}  // namespace strata::testing

namespace strata::testing {

// STRATA_GPU_TESTS_ON_CPU=1 runs these tests with a second CPU backend in
// place of the CUDA one: a dry run of the test logic itself (buffer sizes,
// poisoning, comparisons) on a machine without a GPU. It says nothing about
// the CUDA code.
inline bool GpuTestsOnCpu() {
  const char* e = std::getenv("STRATA_GPU_TESTS_ON_CPU");
  return e && *e == '1';
}

// The backend under test: CUDA with `options`, or the CPU in a dry run.
inline Result<std::unique_ptr<Backend>> MakeBackendUnderTest(
    const kernels::CudaBackendOptions& options = {}) {
  if (GpuTestsOnCpu()) return kernels::MakeCpuBackend(0);
  return kernels::MakeCudaBackend(options);
}

// Compute capability major of GPU 0 (8 in a dry run).
inline int GpuCcMajor() {
  if (GpuTestsOnCpu()) return 8;
  auto g = QueryGpu(0);
  return g.ok() ? g->cc_major : 0;
}

// Whether the flash variant `v` runs on GPU 0 with this build.
inline bool FlashVariantRunsHere(const kernels::FlashVariant& v) {
  if (GpuTestsOnCpu()) return false;
  auto g = QueryGpu(0);
  return g.ok() && kernels::FlashVariantRuns(v, g->cc_major, g->cc_minor);
}

// Fixture: a CUDA backend (skips without a GPU) and the CPU backend as the
// reference, plus a fresh seed per test.
class CudaVsCpu {
 protected:
  // Returns false (and the caller returns) when the test was skipped or failed.
  bool SetUpBackends() {
    auto g = MakeBackendUnderTest();
    EXPECT_OK(g.status());
    if (!g.ok()) return false;
    gpu_ = std::move(g).value();
    cpu_ = kernels::MakeCpuBackend(0);
    mirrors_ = std::make_unique<Mirrors>(gpu_.get(), cpu_.get());
    seed_ = FreshSeed();
    return true;
  }
  std::unique_ptr<kernels::Backend> gpu_, cpu_;
  std::unique_ptr<Mirrors> mirrors_;
  uint64_t seed_ = 0;
};

}  // namespace strata::testing

// In SetUp() of a fixture deriving from CudaVsCpu.
#define STRATA_SETUP_CUDA_VS_CPU()                                         \
  do {                                                                     \
    if (!::strata::testing::GpuTestsOnCpu()) STRATA_SKIP_WITHOUT_GPU();    \
    if (!SetUpBackends()) GTEST_FAIL() << "backend setup";                 \
  } while (0)
