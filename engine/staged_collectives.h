// SPDX-License-Identifier: Apache-2.0
// The data-parallel collectives ZeRO's partitions need, over buffers that
// are not laid out as the communicator wants them (comm/communicator.h):
// host memory when the communicator moves device memory (NCCL), a unit's
// gradient whose last slice is shorter than the others, a gathered unit
// whose padding must not be written. Each goes through one bounded staging
// buffer in the communicator's memory, in rounds.
//
//   memory   with a backend (NCCL on the CUDA backend) the staging buffer is
//            the backend's memory and every collective runs on its stream;
//            "backend memory" below is then device memory. Without one
//            (MPI, the CPU backend) everything is host memory and the same
//            rounds copy with memcpy. One code path: the CPU ranks in CI run
//            the staging the GPU ranks run.
//   rounds   a round moves at most `chunk` elements per rank, chunk =
//            stage_bytes / ((world + 1) × element size): the staging holds
//            the world's pieces and this rank's separately, so neither the
//            gather nor the reduce-scatter is in place (the host
//            reductions are: comm/ maps that to MPI_IN_PLACE). The
//            gradient's reduce-scatter and the gathers are bounded further
//            by DeepSpeed's bucket sizes (Rounds): a round of either moves
//            at most that many elements over all the ranks.
//   order    on the CUDA backend the copies into and out of the staging are
//            ordered with the collectives on the backend's stream. The
//            gathers and the host reductions return once their result is
//            in place for any reader (with the communicator's errors of the
//            call); the gradient's reduce-scatter returns once enqueued, as
//            its readers are the stream's next kernels: its error sticks in
//            the communicator and surfaces at the next call that waits.
//
// Every rank must make the same calls with the same counts (as with the
// collectives themselves). Thread-safety: one thread (the step's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "comm/communicator.h"
#include "kernels/backend.h"

namespace strata {

class StagedCollectives {
 public:
  // The staging's size; it bounds a round (above).
  static constexpr size_t kStageBytes = 32ull << 20;

  // How the rounds are sized: the staging's bytes, and the elements per rank
  // of a round of ReduceScatterFlat and of AllGather.
  struct Rounds {
    size_t stage_bytes = kStageBytes;
    size_t reduce_len = SIZE_MAX, gather_len = SIZE_MAX;
  };
  // From zero_optimization's reduce_bucket_size and allgather_bucket_size
  // (elements over all `world` ranks; at least one per rank), the staging
  // just large enough for either round (the gathers' of `gather_dtype`) and
  // never larger than the `largest_unit`'s elements need.
  static Rounds RoundsFor(int world, uint64_t reduce_bucket, uint64_t gather_bucket, DType gather_dtype,
                          int64_t largest_unit);

  // `comm` (not owned) carries the collectives; `backend` (not owned, may be
  // null: host memory) is whose memory and stream they use.
  static Result<StagedCollectives> Create(comm::Communicator* comm, kernels::Backend* backend, Rounds rounds);
  static Result<StagedCollectives> Create(comm::Communicator* comm, kernels::Backend* backend,
                                          size_t stage_bytes = kStageBytes) {
    return Create(comm, backend, Rounds{stage_bytes});
  }
  StagedCollectives(StagedCollectives&&) = default;
  StagedCollectives& operator=(StagedCollectives&&) = default;

  // `numel` fp32 values (backend memory) reduce-scattered in DeepSpeed's flat
  // layout (zero-padded to world × slice_pad): the sum over the ranks of
  // [rank × slice_pad, (rank + 1) × slice_pad) ∩ [0, numel) lands in place
  // in that range of `f32`; the rest keeps this rank's values.
  Status ReduceScatterFlat(float* f32, int64_t numel, int64_t slice_pad);

  // `count` elements of `dtype` from every rank (`send`: host memory) into
  // `recv`, whose first `recv_elems` (at most world × count) elements of the
  // world × count gathered (rank r's at r × count) are written; `recv` is
  // backend memory when `recv_on_backend`, else host memory.
  Status AllGather(const void* send, size_t count, DType dtype, void* recv, size_t recv_elems, bool recv_on_backend);

  // `count` elements of `dtype` (host memory) reduced over the ranks in place.
  Status AllReduceHost(void* v, size_t count, DType dtype, comm::ReduceOp op);

  size_t stage_bytes() const { return rounds_.stage_bytes; }
  const Rounds& rounds() const { return rounds_; }

 private:
  StagedCollectives(comm::Communicator* comm, kernels::Backend* backend, Rounds rounds)
      : comm_(comm), backend_(backend), rounds_(rounds) {}
  uint8_t* stage() { return backend_ ? stage_dev_.as<uint8_t>() : stage_host_.data(); }
  // Elements per rank of a round of `element_bytes` each, at most `len`.
  size_t Chunk(size_t element_bytes, size_t len = SIZE_MAX) const;
  void* stream() const { return backend_ ? backend_->native_stream() : nullptr; }
  // Copies between host memory (h) and backend memory (b), and zeros.
  Status HostToBackend(void* b, const void* h, size_t bytes);
  Status BackendToHost(void* h, const void* b, size_t bytes);
  Status BackendToBackend(void* dst, const void* src, size_t bytes);
  Status Zero(void* b, size_t bytes);

  comm::Communicator* comm_;
  kernels::Backend* backend_;
  Rounds rounds_;
  kernels::DeviceBuffer stage_dev_;  // with a backend
  std::vector<uint8_t> stage_host_;  // without
};

}  // namespace strata
