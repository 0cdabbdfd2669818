// SPDX-License-Identifier: Apache-2.0
#include "comm/nccl_communicator.h"

#if STRATA_WITH_CUDA && STRATA_WITH_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/cuda_check.h"
#include "base/mutex.h"
#include "comm/tcp_rendezvous.h"

namespace strata::comm {

namespace {

std::optional<ncclDataType_t> ReduceType(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF64: return ncclFloat64;
    case DType::kI64: return ncclInt64;
    case DType::kI32: return ncclInt32;
    case DType::kI8: return ncclInt8;
    case DType::kU8: return ncclUint8;
    case DType::kI16:
    case DType::kU16: return std::nullopt;  // NCCL has no 16-bit integers
  }
  return std::nullopt;
}
// For the collectives that only move data: 16-bit integers as f16 words.
ncclDataType_t MoveType(DType t) { return ReduceType(t).value_or(ncclFloat16); }

ncclRedOp_t Op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

std::string NcclText(ncclComm_t comm, ncclResult_t r) {
  std::string t = ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) t += std::string(": ") + last;
  return t;
}

// Polls ncclCommGetAsyncError while `comm` says ncclInProgress (a
// non-blocking communicator's join or enqueue), up to `deadline`.
ncclResult_t AwaitNotInProgress(ncclComm_t comm, ncclResult_t r, double deadline, bool* timed_out) {
  *timed_out = false;
  while (r == ncclInProgress) {
    if (NowSeconds() > deadline) {
      *timed_out = true;
      return r;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
  }
  return r;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int world, int device, const CommOptions& o)
      : comm_(comm), rank_(rank), world_(world), device_(device), opt_(o) {
    watchdog_ = std::thread([this] { Watch(); });
  }
  ~NcclCommunicator() override {
    {
      MutexLock l(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    watchdog_.join();
    cudaSetDevice(device_);
    for (auto& p : pending_) cudaEventDestroy(p.done);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (scratch_) cudaFree(scratch_);
    bool aborted = false, failed = false;
    {
      MutexLock l(&mu_);
      aborted = aborted_;
      failed = !error_.ok();
    }
    if (aborted || failed) {
      if (!aborted) ncclCommAbort(comm_);
      return;
    }
    bool timed_out = false;
    const double deadline = NowSeconds() + opt_.timeout_s;
    const ncclResult_t r = AwaitNotInProgress(comm_, ncclCommFinalize(comm_), deadline, &timed_out);
    if (r == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string_view backend() const override { return "nccl"; }

  Status AllGather(const void* send, void* recv, size_t count, DType dt, void* stream) override {
    return Enqueue(CollectiveText("all_gather", count, dt), stream, [&](cudaStream_t s) {
      return ncclAllGather(send, recv, count, MoveType(dt), comm_, s);
    });
  }
  Status ReduceScatter(const void* send, void* recv, size_t count, DType dt, ReduceOp op, void* stream) override {
    const std::string what = CollectiveText("reduce_scatter", count, dt) + " (" + std::string(ReduceOpName(op)) + ")";
    ASSIGN_OR_RETURN(const ncclDataType_t t, Reducible(what, dt));
    return Enqueue(what, stream, [&](cudaStream_t s) {
      return ncclReduceScatter(send, recv, count, t, Op(op), comm_, s);
    });
  }
  Status AllReduce(const void* send, void* recv, size_t count, DType dt, ReduceOp op, void* stream) override {
    const std::string what = CollectiveText("all_reduce", count, dt) + " (" + std::string(ReduceOpName(op)) + ")";
    ASSIGN_OR_RETURN(const ncclDataType_t t, Reducible(what, dt));
    return Enqueue(what, stream, [&](cudaStream_t s) {
      return ncclAllReduce(send, recv, count, t, Op(op), comm_, s);
    });
  }
  Status Broadcast(void* buf, size_t count, DType dt, int root, void* stream) override {
    const std::string what = CollectiveText("broadcast", count, dt) + " from rank " + std::to_string(root);
    if (root < 0 || root >= world_)
      return CollectiveError(StatusCode::kInvalidArgument, what, rank_, world_, -1, "no such root rank");
    return Enqueue(what, stream, [&](cudaStream_t s) {
      return ncclBroadcast(buf, buf, count, MoveType(dt), root, comm_, s);
    });
  }
  // NCCL has no barrier: an all-reduce of one word.
  Status Barrier(void* stream) override {
    if (!scratch_) {
      CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
      CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, sizeof(int32_t)));
    }
    return Enqueue("barrier", stream, [&](cudaStream_t s) {
      return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, s);
    });
  }

  Status Synchronize() override {
    MutexLock l(&mu_);
    while (error_.ok() && !pending_.empty()) cv_.Wait(&mu_);
    return error_;
  }

 private:
  struct Pending {
    cudaEvent_t done;
    std::string what;
    double started;
  };

  Status sticky() {
    MutexLock l(&mu_);
    return error_;
  }
  Result<ncclDataType_t> Reducible(const std::string& what, DType dt) const {
    if (auto t = ReduceType(dt)) return *t;
    return CollectiveError(StatusCode::kInvalidArgument, what, rank_, world_, -1,
                           "NCCL has no " + std::string(DTypeName(dt)) + " reduction");
  }

  // Enqueues one collective on `stream` and hands its completion to the watchdog.
  Status Enqueue(const std::string& what, void* stream, const std::function<ncclResult_t(cudaStream_t)>& call) {
    RETURN_IF_ERROR(sticky());
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    bool timed_out = false;
    const ncclResult_t r = AwaitNotInProgress(comm_, call(s), NowSeconds() + opt_.timeout_s, &timed_out);
    if (timed_out)
      return Fail(CollectiveError(StatusCode::kUnavailable, what, rank_, world_, -1,
                                  "NCCL did not accept the collective within " + SecondsText(opt_.timeout_s)));
    if (r != ncclSuccess)
      return Fail(CollectiveError(r == ncclInvalidArgument || r == ncclInvalidUsage ? StatusCode::kInvalidArgument
                                                                                    : StatusCode::kUnavailable,
                                  what, rank_, world_, -1, NcclText(comm_, r)));
    ASSIGN_OR_RETURN(cudaEvent_t e, TakeEvent());
    CUDA_RETURN_IF_ERROR(cudaEventRecord(e, s));
    {
      MutexLock l(&mu_);
      pending_.push_back({e, what, NowSeconds()});
    }
    cv_.SignalAll();
    return Status::OK();
  }

  Result<cudaEvent_t> TakeEvent() {
    {
      MutexLock l(&mu_);
      if (!free_events_.empty()) {
        cudaEvent_t e = free_events_.back();
        free_events_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  // Records the first error and aborts NCCL, so that kernels waiting on a
  // peer that is gone return and the stream moves on.
  Status Fail(Status s) {
    bool abort = false;
    {
      MutexLock l(&mu_);
      if (error_.ok()) error_ = s;
      abort = !aborted_;
      aborted_ = true;
    }
    if (abort) ncclCommAbort(comm_);
    cv_.SignalAll();
    return s;
  }

  // The watchdog: retires completed collectives, and fails the
  // communicator on NCCL's asynchronous error or a collective past the timeout.
  void Watch() {
    cudaSetDevice(device_);
    MutexLock l(&mu_);
    while (!stop_ && !aborted_) {
      if (pending_.empty()) {
        cv_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
        continue;
      }
      Pending& p = pending_.front();
      const cudaError_t q = cudaEventQuery(p.done);
      if (q == cudaSuccess) {
        free_events_.push_back(p.done);
        pending_.pop_front();
        cv_.SignalAll();
        continue;
      }
      std::optional<Status> failure;
      ncclResult_t async = ncclSuccess;
      if (q != cudaErrorNotReady) {
        failure = CollectiveError(StatusCode::kCudaError, p.what, rank_, world_, -1,
                                  std::string("the stream failed: ") + cudaGetErrorString(q));
      } else if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
                 async != ncclInProgress) {
        failure = CollectiveError(StatusCode::kUnavailable, p.what, rank_, world_, -1,
                                  "NCCL reports " + NcclText(comm_, async) + " (a peer died or the network failed)");
      } else if (NowSeconds() - p.started > opt_.timeout_s) {
        failure = CollectiveError(StatusCode::kUnavailable, p.what, rank_, world_, -1,
                                  "not complete after " + SecondsText(opt_.timeout_s) +
                                      " (CommOptions::timeout_s): a peer is dead or stuck, or the ranks called "
                                      "different collectives");
      }
      if (failure) {
        if (error_.ok()) error_ = *failure;
        aborted_ = true;
        mu_.Unlock();
        ncclCommAbort(comm_);
        mu_.Lock();
        cv_.SignalAll();
        break;
      }
      cv_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::microseconds(200));
    }
  }

  ncclComm_t comm_;
  const int rank_, world_, device_;
  const CommOptions opt_;
  void* scratch_ = nullptr;  // the barrier's word
  Mutex mu_;
  CondVar cv_;
  Status error_ GUARDED_BY(mu_);
  bool aborted_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  std::deque<Pending> pending_ GUARDED_BY(mu_);
  std::vector<cudaEvent_t> free_events_ GUARDED_BY(mu_);
  std::thread watchdog_;
};

// The unique id: made by rank 0, published over TCP.
Result<ncclUniqueId> ShareUniqueId(const RankEnv& env, double timeout_s) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (env.rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      return Unavailable(std::string("ncclGetUniqueId on rank 0: ") + ncclGetErrorString(r));
  }
  ASSIGN_OR_RETURN(const std::string blob,
                   ShareFromRankZero(env, std::string(reinterpret_cast<const char*>(&id), sizeof id), timeout_s));
  if (blob.size() != sizeof id)
    return Internal("rendezvous gave an NCCL unique id of " + std::to_string(blob.size()) + " bytes, not " +
                    std::to_string(sizeof id));
  std::memcpy(&id, blob.data(), sizeof id);
  return id;
}

}  // namespace

bool BuiltWithNccl() { return true; }

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(const RankEnv& env, int device,
                                                              const CommOptions& options) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  ASSIGN_OR_RETURN(const ncclUniqueId id, ShareUniqueId(env, options.timeout_s));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, env.world_size, id, env.rank, &config);
  bool timed_out = false;
  if (comm) r = AwaitNotInProgress(comm, r, NowSeconds() + options.timeout_s, &timed_out);
  const std::string what = "NCCL communicator init";
  if (timed_out || r != ncclSuccess) {
    Status s = CollectiveError(StatusCode::kUnavailable, what, env.rank, env.world_size, -1,
                               timed_out ? "the ranks did not all join within " + SecondsText(options.timeout_s)
                                         : NcclText(comm, r));
    if (comm) ncclCommAbort(comm);
    return s;
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(comm, env.rank, env.world_size, device, options));
}

}  // namespace strata::comm

#else  // no NCCL in this build

namespace strata::comm {

bool BuiltWithNccl() { return false; }

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(const RankEnv&, int, const CommOptions&) {
  return Unavailable(
      "strata was built without NCCL (the CUDA backend's communicator): it needs CUDA and nccl.h/libnccl, "
      "found with the CUDA Toolkit or in the system's paths when CMake configures");
}

}  // namespace strata::comm

#endif
