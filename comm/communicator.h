// SPDX-License-Identifier: Apache-2.0
// The communicator: the collectives that data-parallel ranks run over one
// interface, whatever carries them (NCCL between GPUs, comm/
// nccl_communicator.h; MPI between CPU-backend ranks, comm/
// mpi_communicator.h). strata has no transport of its own.
//
// Buffers are the backend's: device pointers for NCCL, host pointers for
// MPI. `stream` is the caller's CUDA stream (a cudaStream_t as void*) for
// NCCL, where a collective is enqueued after the work already on it and
// returns without waiting; MPI ignores it and returns when the collective
// is complete. Synchronize() waits for every collective issued so far.
//
// Counts are elements of `dtype`. Layout follows NCCL's (and DeepSpeed's
// flat partitions): AllGather's `recv` holds world_size() * count elements,
// rank r's at offset r * count; ReduceScatter's `send` holds world_size() *
// count and rank r receives the reduction of block r.
//
// Errors: every failure is a Status whose message names the collective,
// this rank and, where it is known, the peer (CollectiveError below). Every
// collective is bounded by CommOptions::timeout: a peer that died or hangs
// ends it with kUnavailable instead of a hang. A communicator that failed
// stays failed (the error is sticky): the ranks no longer agree on what
// was exchanged, so every later call returns the first error.
//
// Thread-safety: one thread at a time calls a communicator (the trainer's).
// Every rank must call the same collectives in the same order with the
// same counts, as with NCCL and MPI themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/dtype.h"
#include "base/status.h"

namespace strata::comm {

enum class ReduceOp : uint8_t { kSum, kMax, kMin };

std::string_view ReduceOpName(ReduceOp op);  // "sum", "max", "min"

// What every implementation takes.
struct CommOptions {
  // The longest one collective (or the rendezvous) may take before the
  // communicator gives up on its peers. Generous by default: the first
  // collective after start-up also waits for the slowest rank's setup.
  double timeout_s = 300;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string_view backend() const = 0;  // "mpi", "nccl"

  virtual Status AllGather(const void* send, void* recv, size_t count, DType dtype, void* stream) = 0;
  // `recv` may be `send` + rank() × count (in place); the rest of `send`
  // is then undefined after the collective.
  virtual Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                               void* stream) = 0;
  // `send` may equal `recv` (in place).
  virtual Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                           void* stream) = 0;
  virtual Status Broadcast(void* buf, size_t count, DType dtype, int root, void* stream) = 0;
  // Every rank has reached the barrier (NCCL: once the stream gets there).
  virtual Status Barrier(void* stream) = 0;
  // Every collective issued so far has completed (or failed: its error).
  virtual Status Synchronize() = 0;

 protected:
  Communicator() = default;
};

// The error of `collective` on `rank` of `world`: "<collective> on rank R of
// W (peer P): <what>". `peer` < 0: no single peer is concerned or known.
Status CollectiveError(StatusCode code, std::string_view collective, int rank, int world, int peer,
                       std::string_view what);

// "2.5 s": a duration for messages.
std::string SecondsText(double s);

// "all_reduce 1024 x f32": what a collective moved, for messages.
std::string CollectiveText(std::string_view collective, size_t count, DType dtype);

}  // namespace strata::comm
