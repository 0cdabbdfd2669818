// SPDX-License-Identifier: Apache-2.0
// Helpers for the kernels tests: tensors on a backend filled from host
// doubles (rounded to the storage dtype), read back as doubles, poisoned with
// NaN, and error norms.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/half.h"
#include "kernels/backend.h"
#include "kernels/cpu/convert.h"
#include "tests/test_util.h"

namespace strata::kernels::testing {

// `v` rounded to dtype `t`, as bytes.
inline std::vector<uint8_t> Encode(const std::vector<double>& v, DType t) {
  std::vector<uint8_t> out(v.size() * DTypeSize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t) {
      case DType::kF64: std::memcpy(out.data() + 8 * i, &v[i], 8); break;
      case DType::kF32: {
        float f = static_cast<float>(v[i]);
        std::memcpy(out.data() + 4 * i, &f, 4);
        break;
      }
      case DType::kBF16: {
        bf16_t h = cpu::Store1<bf16_t>(v[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
        break;
      }
      case DType::kF16: {
        f16_t h = cpu::Store1<f16_t>(v[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
        break;
      }
      case DType::kI32: {
        int32_t x = static_cast<int32_t>(v[i]);
        std::memcpy(out.data() + 4 * i, &x, 4);
        break;
      }
      default: ADD_FAILURE() << "Encode: unsupported dtype"; break;
    }
  }
  return out;
}

inline std::vector<double> Decode(const void* p, DType t, size_t n) {
  std::vector<double> out(n);
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::kF64: std::memcpy(&out[i], b + 8 * i, 8); break;
      case DType::kF32: {
        float f;
        std::memcpy(&f, b + 4 * i, 4);
        out[i] = f;
        break;
      }
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        out[i] = BF16ToFloat(h);
        break;
      }
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        out[i] = HalfToFloat(h);
        break;
      }
      default: ADD_FAILURE() << "Decode: unsupported dtype"; break;
    }
  }
  return out;
}

// Values as they are after a round trip through dtype t.
inline std::vector<double> Rounded(const std::vector<double>& v, DType t) {
  auto bytes = Encode(v, t);
  return Decode(bytes.data(), t, v.size());
}

// A tensor in backend memory.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Backend* be, DType t, size_t n) : be_(be), dtype_(t), n_(n) {
    auto r = be->Allocate(n * DTypeSize(t));
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return;
    }
    buf_ = std::move(r).value();
  }
  static Tensor From(Backend* be, const std::vector<double>& v, DType t) {
    Tensor x(be, t, v.size());
    x.Set(v);
    return x;
  }
  // NaN everywhere (0xFF bytes are NaN in every float dtype).
  static Tensor Poisoned(Backend* be, DType t, size_t n) {
    Tensor x(be, t, n);
    EXPECT_OK(be->Memset(x.data(), 0xff, x.bytes()));
    return x;
  }
  static Tensor Ints(Backend* be, const std::vector<int32_t>& v) {
    Tensor x(be, DType::kI32, v.size());
    EXPECT_OK(be->CopyToDevice(x.data(), v.data(), v.size() * 4));
    return x;
  }
  void Set(const std::vector<double>& v) {
    auto bytes = Encode(v, dtype_);
    EXPECT_OK(be_->CopyToDevice(data(), bytes.data(), bytes.size()));
  }
  std::vector<double> Get() const {
    std::vector<uint8_t> bytes(bytes_size());
    EXPECT_OK(be_->Synchronize());
    EXPECT_OK(be_->CopyToHost(bytes.data(), buf_.data(), bytes.size()));
    return Decode(bytes.data(), dtype_, n_);
  }
  void* data() const { return buf_.data(); }
  template <class T>
  T* as() const {
    return static_cast<T*>(buf_.data());
  }
  size_t bytes() const { return n_ * DTypeSize(dtype_); }
  size_t bytes_size() const { return bytes(); }
  size_t size() const { return n_; }
  DType dtype() const { return dtype_; }

 private:
  Backend* be_ = nullptr;
  DType dtype_ = DType::kF32;
  size_t n_ = 0;
  DeviceBuffer buf_;
};

inline std::vector<double> RandomVector(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ||a - b|| / ||b|| (NaN anywhere gives infinity).
inline double RelError(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

inline double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

inline bool AllFinite(const std::vector<double>& v) {
  for (double x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// Stat buffers (mean, rstd, lse, losses, sumsq) hold doubles for f64.
inline DType StatDType(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

inline double GeluRef(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

}  // namespace strata::kernels::testing
