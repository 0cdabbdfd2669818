// SPDX-License-Identifier: Apache-2.0
#include "kernels/gemm_peak.h"

#include <algorithm>
#include <iomanip>
#include <random>
#include <sstream>
#include <vector>

#include "base/clock.h"
#include "base/half.h"

namespace strata::kernels {

Result<GemmPeak> MeasureGemmPeak(Backend& backend) {
  const bool cuda = backend.kind() == BackendKind::kCuda;
  const int64_t n = cuda ? 8192 : 512;
  const DType t = cuda ? DType::kBF16 : DType::kF32;
  const size_t bytes = static_cast<size_t>(n * n) * DTypeSize(t);
  ASSIGN_OR_RETURN(DeviceBuffer a, backend.Allocate(bytes));
  ASSIGN_OR_RETURN(DeviceBuffer b, backend.Allocate(bytes));
  ASSIGN_OR_RETURN(DeviceBuffer c, backend.Allocate(bytes));
  {
    std::vector<uint16_t> h(static_cast<size_t>(n * n));
    std::vector<float> f(static_cast<size_t>(n * n));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1, 1);
    for (size_t i = 0; i < h.size(); ++i) f[i] = d(rng), h[i] = FloatToBF16(f[i]);
    const void* src = cuda ? static_cast<const void*>(h.data()) : static_cast<const void*>(f.data());
    RETURN_IF_ERROR(backend.CopyToDevice(a.data(), src, bytes));
    RETURN_IF_ERROR(backend.CopyToDevice(b.data(), src, bytes));
  }
  GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a.data();
  g.b = b.data();
  g.c = c.data();
  g.lda = g.ldb = g.ldc = n;
  g.ab_dtype = g.c_dtype = t;
  RETURN_IF_ERROR(backend.Gemm(g));  // warm-up
  RETURN_IF_ERROR(backend.Synchronize());
  const double flops = 2.0 * static_cast<double>(n) * n * n;
  GemmPeak peak;
  if (cuda) {
    // Back to back on the stream: the mean of 10 (each ~1.4 ms).
    const int reps = 10;
    const double t0 = NowSeconds();
    for (int i = 0; i < reps; ++i) RETURN_IF_ERROR(backend.Gemm(g));
    RETURN_IF_ERROR(backend.Synchronize());
    peak.flops = flops * reps / (NowSeconds() - t0);
  } else {
    double best = 1e30;
    for (int i = 0; i < 7; ++i) {
      const double t0 = NowSeconds();
      RETURN_IF_ERROR(backend.Gemm(g));
      RETURN_IF_ERROR(backend.Synchronize());
      best = std::min(best, NowSeconds() - t0);
    }
    peak.flops = flops / best;
  }
  std::ostringstream os;
  os << n << "^3 " << DTypeName(t) << " GEMM " << std::fixed << std::setprecision(1);
  if (peak.flops >= 1e12) os << peak.flops / 1e12 << " TFLOP/s";
  else os << peak.flops / 1e9 << " GFLOP/s";
  peak.what = os.str();
  return peak;
}

}  // namespace strata::kernels
