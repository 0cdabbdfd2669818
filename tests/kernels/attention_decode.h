// SPDX-License-Identifier: Apache-2.0
// Shared by the AttentionDecode tests (CPU and CUDA): a sequence's rows run
// through Backend::AttentionDecode as a generator runs them (a prefill of
// `prefill` rows, then one row per call) and the reference, AttentionForward
// over the whole sequence with every key/value head repeated for the query
// heads of its group.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/backend_compare.h"
#include "tests/test_util.h"

namespace strata::kernels::testing {

struct DecodeCase {
  int64_t T = 0, H = 0, Hkv = 0, D = 0;  // Hkv: key/value heads
  int64_t prefill = 0;                   // rows of the first call
  DType dt = DType::kF32;
};

inline int64_t QkvWidth(const DecodeCase& c) { return (c.H + 2 * c.Hkv) * c.D; }

// out [T, H D] of AttentionDecode over `qkv` [T, (H + 2 Hkv) D] (already in dt's bytes).
inline std::vector<double> DecodeRows(Backend* be, const DecodeCase& c, const std::vector<uint8_t>& qkv) {
  const size_t es = DTypeSize(c.dt);
  const int64_t W = QkvWidth(c), Ckv = c.Hkv * c.D, C = c.H * c.D;
  auto alloc = [&](size_t bytes) {
    auto r = be->Allocate(bytes);
    EXPECT_OK(r.status());
    DeviceBuffer b = r.ok() ? std::move(r).value() : DeviceBuffer();
    EXPECT_OK(be->Memset(b.data(), 0xff, bytes));  // NaN: a row read before it is written shows
    return b;
  };
  DeviceBuffer q = alloc(qkv.size()), out = alloc(static_cast<size_t>(c.T * C) * es);
  DeviceBuffer k = alloc(static_cast<size_t>(c.T * Ckv) * es), v = alloc(static_cast<size_t>(c.T * Ckv) * es);
  EXPECT_OK(be->CopyToDevice(q.data(), qkv.data(), qkv.size()));
  for (int64_t p = 0; p < c.T;) {
    const int64_t rows = p == 0 ? std::max<int64_t>(c.prefill, 1) : 1;
    DecodeAttentionShape s{1, rows, p, c.T, c.H, c.Hkv, c.D, c.dt, 0.f};
    EXPECT_OK(be->AttentionDecode(s, static_cast<char*>(out.data()) + static_cast<size_t>(p * C) * es,
                                  static_cast<const char*>(q.data()) + static_cast<size_t>(p * W) * es, k.data(),
                                  v.data()));
    p += rows;
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(c.T * C) * es);
  EXPECT_OK(be->Synchronize());
  EXPECT_OK(be->CopyToHost(bytes.data(), out.data(), bytes.size()));
  return ::strata::testing::ToDoubles(bytes, c.dt);
}

// qkv [T, 3 H D] with head h's k and v those of key/value head h / (H / Hkv).
inline std::vector<uint8_t> RepeatKvHeads(const DecodeCase& c, const std::vector<uint8_t>& qkv) {
  const size_t es = DTypeSize(c.dt);
  const int64_t W = QkvWidth(c), C = c.H * c.D, group = c.H / c.Hkv;
  std::vector<uint8_t> full(static_cast<size_t>(c.T * 3 * C) * es);
  for (int64_t t = 0; t < c.T; ++t) {
    const uint8_t* row = qkv.data() + static_cast<size_t>(t * W) * es;
    uint8_t* dst = full.data() + static_cast<size_t>(t * 3 * C) * es;
    std::memcpy(dst, row, static_cast<size_t>(C) * es);
    for (int64_t h = 0; h < c.H; ++h)
      for (int part = 1; part <= 2; ++part)
        std::memcpy(dst + static_cast<size_t>(part * C + h * c.D) * es,
                    row + static_cast<size_t>(C + (part - 1) * c.Hkv * c.D + (h / group) * c.D) * es,
                    static_cast<size_t>(c.D) * es);
  }
  return full;
}

}  // namespace strata::kernels::testing
