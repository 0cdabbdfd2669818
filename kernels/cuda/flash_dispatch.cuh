// SPDX-License-Identifier: Apache-2.0
// The flash kernels' compile-time shape: the element type and the tile head
// dim (64 or 128) a launch is instantiated for, picked from an
// AttentionShape once, for every flash launcher.
#pragma once

#include <type_traits>

#include "base/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"

namespace strata::kernels::cuda {

// Calls f(T{}, std::integral_constant<int, kD>{}) for the shape's dtype (bf16
// or f16; InvalidArgument otherwise) and tile head dim (64 up to 64, else 128).
template <typename F>
Status DispatchFlash(const AttentionShape& s, F&& f) {
  auto with_dtype = [&](auto dim) -> Status {
    switch (s.dtype) {
      case DType::kBF16: return f(bf16{}, dim);
      case DType::kF16: return f(f16{}, dim);
      default: return InvalidArgument("flash attention: dtype must be f16 or bf16");
    }
  };
  if (s.head_dim <= 64) return with_dtype(std::integral_constant<int, 64>{});
  return with_dtype(std::integral_constant<int, 128>{});
}

}  // namespace strata::kernels::cuda
