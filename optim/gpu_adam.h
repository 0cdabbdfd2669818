// SPDX-License-Identifier: Apache-2.0
// The Adam step for a shard whose optimizer state lives in GPU memory
// (partial offload): the same semantics and, bit for bit, the same results as
// CpuAdam::Step (optim/cpu_adam.h), computed by the fused kernel of
// optim/cuda/adam.cu.
//
// Thread-safety: a free function; concurrent calls on different shards are
// fine (the CUDA runtime is thread-safe).
#pragma once

#include <cstdint>

#include "base/status.h"
#include "optim/cpu_adam.h"

namespace strata::optim {

// Queues the update of `device_shard` (all pointers device memory; the same
// field rules as for the CPU; in place only: the out-of-place pointers must be
// null) on `stream` (a cudaStream_t; nullptr: the legacy
// default stream). When `device_nonfinite_count` is not null the kernel adds
// the number of non-finite gradient values to that device counter.
//
// There is no skip_on_nonfinite here: on the GPU the engine learns about
// overflow from its gradient-norm pass before it launches any update.
//
// Errors: InvalidArgument (checked before anything is queued; an
// out-of-place shard is one), CudaError for
// a failed launch, Unavailable in a build without CUDA. Asynchronous like any
// kernel: the work is done when the stream is.
Status GpuAdamStep(const AdamShard& device_shard, const AdamHyper& hyper, double grad_scale, void* stream,
                   uint64_t* device_nonfinite_count = nullptr);

}  // namespace strata::optim
