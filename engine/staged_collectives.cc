// SPDX-License-Identifier: Apache-2.0
#include "engine/staged_collectives.h"

#include <algorithm>
#include <cstring>

namespace strata {

namespace {

// How many of `len` elements starting at `begin` lie below `limit`.
size_t Within(size_t begin, size_t len, size_t limit) { return begin >= limit ? 0 : std::min(len, limit - begin); }

}  // namespace

StagedCollectives::Rounds StagedCollectives::RoundsFor(int world, uint64_t reduce_bucket, uint64_t gather_bucket,
                                                       DType gather_dtype, int64_t largest_unit) {
  const size_t W = static_cast<size_t>(std::max(world, 1));
  const size_t slice = std::max<size_t>(1, (static_cast<size_t>(std::max<int64_t>(largest_unit, 1)) + W - 1) / W);
  auto per_rank = [&](uint64_t bucket) { return std::clamp<size_t>(static_cast<size_t>(bucket) / W, 1, slice); };
  Rounds r;
  r.reduce_len = per_rank(reduce_bucket);
  r.gather_len = per_rank(gather_bucket);
  r.stage_bytes = (W + 1) * std::max({r.reduce_len * 4, r.gather_len * DTypeSize(gather_dtype), size_t{8}});
  return r;
}

Result<StagedCollectives> StagedCollectives::Create(comm::Communicator* comm, kernels::Backend* backend,
                                                    Rounds rounds) {
  const size_t W = static_cast<size_t>(comm->world_size());
  if (rounds.stage_bytes < (W + 1) * 8)
    return InvalidArgument("StagedCollectives: a staging buffer of " + std::to_string(rounds.stage_bytes) +
                           " bytes cannot hold one 8-byte element per rank and this rank's own (" +
                           std::to_string(W + 1) + " elements)");
  if (rounds.reduce_len == 0 || rounds.gather_len == 0)
    return InvalidArgument("StagedCollectives: a round of no elements");
  StagedCollectives s(comm, backend, rounds);
  if (backend) {
    ASSIGN_OR_RETURN(s.stage_dev_, backend->Allocate(rounds.stage_bytes));
  } else {
    s.stage_host_.resize(rounds.stage_bytes);
  }
  return s;
}

size_t StagedCollectives::Chunk(size_t element_bytes, size_t len) const {
  return std::min(len, rounds_.stage_bytes / ((static_cast<size_t>(comm_->world_size()) + 1) * element_bytes));
}

Status StagedCollectives::HostToBackend(void* b, const void* h, size_t bytes) {
  if (backend_) return backend_->CopyToDevice(b, h, bytes);
  std::memcpy(b, h, bytes);
  return Status::OK();
}
Status StagedCollectives::BackendToHost(void* h, const void* b, size_t bytes) {
  if (backend_) return backend_->CopyToHost(h, b, bytes);
  std::memcpy(h, b, bytes);
  return Status::OK();
}
Status StagedCollectives::BackendToBackend(void* dst, const void* src, size_t bytes) {
  if (backend_) return backend_->CopyDeviceToDevice(dst, src, bytes);
  std::memcpy(dst, src, bytes);
  return Status::OK();
}
Status StagedCollectives::Zero(void* b, size_t bytes) {
  if (backend_) return backend_->Memset(b, 0, bytes);
  std::memset(b, 0, bytes);
  return Status::OK();
}

Status StagedCollectives::ReduceScatterFlat(float* f32, int64_t numel, int64_t slice_pad) {
  const size_t W = static_cast<size_t>(comm_->world_size()), r = static_cast<size_t>(comm_->rank());
  const size_t n = static_cast<size_t>(numel), pad = static_cast<size_t>(slice_pad), b = Chunk(4, rounds_.reduce_len);
  for (size_t c = 0; c < pad; c += b) {
    const size_t len = std::min(b, pad - c);
    float* all = reinterpret_cast<float*>(stage());  // every rank's piece of this round, W × len
    float* mine = all + W * len;                       // the reduction of this rank's piece
    for (size_t q = 0; q < W; ++q) {
      const size_t begin = q * pad + c, have = Within(begin, len, n);
      if (have) RETURN_IF_ERROR(BackendToBackend(all + q * len, f32 + begin, have * 4));
      if (have < len) RETURN_IF_ERROR(Zero(all + q * len + have, (len - have) * 4));  // the padding
    }
    RETURN_IF_ERROR(comm_->ReduceScatter(all, mine, len, DType::kF32, comm::ReduceOp::kSum, stream()));
    // (Only this rank's range is written, and later rounds read it no more.)
    const size_t begin = r * pad + c, have = Within(begin, len, n);
    if (have) RETURN_IF_ERROR(BackendToBackend(f32 + begin, mine, have * 4));
  }
  return Status::OK();
}

Status StagedCollectives::AllGather(const void* send, size_t count, DType dtype, void* recv, size_t recv_elems,
                                    bool recv_on_backend) {
  const size_t W = static_cast<size_t>(comm_->world_size()), es = DTypeSize(dtype), b = Chunk(es, rounds_.gather_len);
  if (recv_elems > W * count)
    return InvalidArgument("StagedCollectives::AllGather: " + std::to_string(recv_elems) +
                           " elements asked of a gather of " + std::to_string(W) + " × " + std::to_string(count));
  const uint8_t* in = static_cast<const uint8_t*>(send);
  uint8_t* out = static_cast<uint8_t*>(recv);
  for (size_t c = 0; c < count; c += b) {
    const size_t len = std::min(b, count - c);
    uint8_t* all = stage();                // every rank's piece, W × len
    uint8_t* mine = all + W * len * es;    // this rank's, sent
    RETURN_IF_ERROR(HostToBackend(mine, in + c * es, len * es));
    RETURN_IF_ERROR(comm_->AllGather(mine, all, len, dtype, stream()));
    for (size_t q = 0; q < W; ++q) {
      const size_t begin = q * count + c, have = Within(begin, len, recv_elems);
      if (!have) continue;
      if (recv_on_backend) {
        RETURN_IF_ERROR(BackendToBackend(out + begin * es, all + q * len * es, have * es));
      } else {
        RETURN_IF_ERROR(BackendToHost(out + begin * es, all + q * len * es, have * es));
      }
    }
  }
  // There for any reader (another stream, the host): the copies done, the
  // collectives' errors with them.
  if (backend_) RETURN_IF_ERROR(backend_->Synchronize());
  return comm_->Synchronize();
}

Status StagedCollectives::AllReduceHost(void* v, size_t count, DType dtype, comm::ReduceOp op) {
  const size_t es = DTypeSize(dtype), b = Chunk(es);
  uint8_t* io = static_cast<uint8_t*>(v);
  for (size_t c = 0; c < count; c += b) {
    const size_t len = std::min(b, count - c);
    RETURN_IF_ERROR(HostToBackend(stage(), io + c * es, len * es));
    RETURN_IF_ERROR(comm_->AllReduce(stage(), stage(), len, dtype, op, stream()));
    RETURN_IF_ERROR(BackendToHost(io + c * es, stage(), len * es));
  }
  // A collective that failed on the stream: its error, not the buffer's bytes.
  return comm_->Synchronize();
}

}  // namespace strata
