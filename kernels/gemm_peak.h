// SPDX-License-Identifier: Apache-2.0
// The backend's GEMM rate, measured: the physical baseline of MFU (model
// FLOPs per second over this), taken at the start of a run on the same
// backend. CUDA: the mean of 10 back-to-back 8192^3 bf16 GEMMs after a
// warm-up. CPU: the best of 7 timed 512^3 f32 GEMMs (a busy machine slows one
// now and then; the best is the rate the cores can give, so MFU never reads
// above 100% because the baseline was taken during a hiccup).
//
// Thread-safety: uses the backend (one thread at a time).
#pragma once

#include <string>

#include "base/status.h"
#include "kernels/backend.h"

namespace strata::kernels {

struct GemmPeak {
  double flops = 0;  // FLOP/s
  std::string what;  // "8192^3 bf16 GEMM 779.0 TFLOP/s"
};

// Allocates three n x n operands on the backend for the measurement and
// frees them before returning.
Result<GemmPeak> MeasureGemmPeak(Backend& backend);

}  // namespace strata::kernels
