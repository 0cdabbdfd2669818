// SPDX-License-Identifier: Apache-2.0
#include "comm/mpi_communicator.h"

#if STRATA_WITH_MPI

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"

namespace strata::comm {

namespace {

constexpr int kPingTag = 1, kPongTag = 2;

// The process's MPI: initialized once, finalized at exit unless a
// communicator broke (its peers may be gone; a finalize would wait for them).
struct MpiProcess {
  bool we_initialized = false;
  std::atomic<bool> broken{false};
  ~MpiProcess() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (we_initialized && !broken.load() && !finalized) MPI_Finalize();
  }
};
MpiProcess& Process() {
  static MpiProcess p;
  return p;
}

std::string MpiErrorText(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len)) + " (MPI error " + std::to_string(rc) + ")";
}

Status InitMpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return Status::OK();
  int provided = 0;
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  if (rc != MPI_SUCCESS) return Unavailable("MPI_Init_thread failed: " + MpiErrorText(rc));
  Process().we_initialized = true;
  if (provided < MPI_THREAD_SERIALIZED)
    return Unavailable("MPI gives thread level " + std::to_string(provided) + ", below MPI_THREAD_SERIALIZED");
  return Status::OK();
}

// MPI's type for `t`; nullopt for the half types, which MPI cannot reduce
// (moved as raw 16-bit words they can be gathered and broadcast).
std::optional<MPI_Datatype> ReduceType(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI64: return MPI_INT64_T;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI16: return MPI_INT16_T;
    case DType::kU16: return MPI_UINT16_T;
    case DType::kI8: return MPI_INT8_T;
    case DType::kU8: return MPI_UINT8_T;
    case DType::kF16:
    case DType::kBF16: return std::nullopt;
  }
  return std::nullopt;
}
MPI_Datatype MoveType(DType t) { return ReduceType(t).value_or(MPI_UINT16_T); }

MPI_Op Op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm data, MPI_Comm ctl, const CommOptions& o) : data_(data), ctl_(ctl), opt_(o) {
    MPI_Comm_rank(data_, &rank_);
    MPI_Comm_size(data_, &world_);
  }
  ~MpiCommunicator() override {
    DropPongs();
    if (!sticky_.ok()) return;  // freeing is collective; the peers may be gone
    MPI_Comm_free(&ctl_);
    MPI_Comm_free(&data_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string_view backend() const override { return "mpi"; }

  Status AllGather(const void* send, void* recv, size_t count, DType dt, void*) override {
    const std::string what = CollectiveText("all_gather", count, dt);
    RETURN_IF_ERROR(CheckCount(what, count));
    const int n = static_cast<int>(count);
    const MPI_Datatype t = MoveType(dt);
    const void* in = send == static_cast<const char*>(recv) + count * DTypeSize(dt) * rank_ ? MPI_IN_PLACE : send;
    return Run(what, [&](MPI_Request* q) { return MPI_Iallgather(in, n, t, recv, n, t, data_, q); });
  }

  Status ReduceScatter(const void* send, void* recv, size_t count, DType dt, ReduceOp op, void*) override {
    const std::string what = CollectiveText("reduce_scatter", count, dt) + " (" + std::string(ReduceOpName(op)) + ")";
    RETURN_IF_ERROR(CheckCount(what, count));
    ASSIGN_OR_RETURN(const MPI_Datatype t, Reducible(what, dt));
    const int n = static_cast<int>(count);
    const size_t bytes = count * DTypeSize(dt);
    const bool in_place =
        reinterpret_cast<uintptr_t>(send) + bytes * static_cast<size_t>(rank_) == reinterpret_cast<uintptr_t>(recv);
    if (!in_place)
      return Run(what, [&](MPI_Request* q) { return MPI_Ireduce_scatter_block(send, recv, n, t, Op(op), data_, q); });
    // In place: MPI's in-place form reads the whole of `send` and leaves
    // the result at its start, from where it moves to this rank's block.
    void* all = const_cast<void*>(send);
    RETURN_IF_ERROR(
        Run(what, [&](MPI_Request* q) { return MPI_Ireduce_scatter_block(MPI_IN_PLACE, all, n, t, Op(op), data_, q); }));
    if (rank_ > 0) std::memmove(recv, all, bytes);
    return Status::OK();
  }

  Status AllReduce(const void* send, void* recv, size_t count, DType dt, ReduceOp op, void*) override {
    const std::string what = CollectiveText("all_reduce", count, dt) + " (" + std::string(ReduceOpName(op)) + ")";
    RETURN_IF_ERROR(CheckCount(what, count));
    ASSIGN_OR_RETURN(const MPI_Datatype t, Reducible(what, dt));
    const int n = static_cast<int>(count);
    const void* in = send == recv ? MPI_IN_PLACE : send;
    return Run(what, [&](MPI_Request* q) { return MPI_Iallreduce(in, recv, n, t, Op(op), data_, q); });
  }

  Status Broadcast(void* buf, size_t count, DType dt, int root, void*) override {
    const std::string what = CollectiveText("broadcast", count, dt) + " from rank " + std::to_string(root);
    RETURN_IF_ERROR(CheckCount(what, count));
    if (root < 0 || root >= world_)
      return CollectiveError(StatusCode::kInvalidArgument, what, rank_, world_, -1, "no such root rank");
    const int n = static_cast<int>(count);
    return Run(what, [&](MPI_Request* q) { return MPI_Ibcast(buf, n, MoveType(dt), root, data_, q); });
  }

  Status Barrier(void*) override {
    return Run("barrier", [&](MPI_Request* q) { return MPI_Ibarrier(data_, q); });
  }

  Status Synchronize() override { return sticky_; }  // every collective completed before it returned

 private:
  Status CheckCount(const std::string& what, size_t count) const {
    if (count <= static_cast<size_t>(INT_MAX)) return Status::OK();
    return CollectiveError(StatusCode::kInvalidArgument, what, rank_, world_, -1,
                           "more elements than MPI's int count holds; split it");
  }
  Result<MPI_Datatype> Reducible(const std::string& what, DType dt) const {
    if (auto t = ReduceType(dt)) return *t;
    return CollectiveError(StatusCode::kInvalidArgument, what, rank_, world_, -1,
                           "MPI has no " + std::string(DTypeName(dt)) + " reduction; reduce in f32");
  }

  // Starts the collective and polls it to the end, the timeout, or an error.
  Status Run(const std::string& what, const std::function<int(MPI_Request*)>& start) {
    if (!sticky_.ok()) return sticky_;
    MPI_Request q = MPI_REQUEST_NULL;
    int rc = start(&q);
    if (rc != MPI_SUCCESS)
      return Break(CollectiveError(StatusCode::kInternal, what, rank_, world_, -1, MpiErrorText(rc)));
    const double t0 = NowSeconds();
    for (int spins = 0;; ++spins) {
      int done = 0;
      rc = MPI_Test(&q, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        return Break(CollectiveError(StatusCode::kUnavailable, what, rank_, world_, -1, MpiErrorText(rc)));
      if (done) return Status::OK();
      if (spins < 1000) continue;  // a short collective: spin
      AnswerPings();
      if (NowSeconds() - t0 > opt_.timeout_s) return Break(TimedOut(what));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  Status Break(Status s) {
    sticky_ = s;
    Process().broken = true;
    return s;
  }

  // The error of a collective that did not complete in time, naming the
  // peers that do not answer a ping.
  Status TimedOut(const std::string& what) {
    // (Generous: a loaded machine may take a while to schedule a peer that is alive.)
    const std::vector<int> silent = SilentPeers(std::clamp(opt_.timeout_s / 2, 1.0, 5.0));
    std::string m = "not complete after " + SecondsText(opt_.timeout_s) + " (CommOptions::timeout_s); ";
    if (silent.empty()) {
      m += "every peer answers, so the ranks are waiting in different collectives (or with different counts)";
      return CollectiveError(StatusCode::kUnavailable, what, rank_, world_, -1, m);
    }
    std::string list;
    for (int p : silent) list += (list.empty() ? "" : ", ") + std::to_string(p);
    m += "rank(s) " + list + " do not answer (dead, or stuck outside any collective)";
    return CollectiveError(StatusCode::kUnavailable, what, rank_, world_, silent.front(), m);
  }

  // Answers the pings of peers that timed out and ask who is alive.
  void AnswerPings() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, ctl_, &flag, &st) != MPI_SUCCESS || !flag) break;
      int v = 0;
      if (MPI_Recv(&v, 1, MPI_INT, st.MPI_SOURCE, kPingTag, ctl_, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      MPI_Request r;
      if (MPI_Isend(&kPong, 1, MPI_INT, st.MPI_SOURCE, kPongTag, ctl_, &r) == MPI_SUCCESS) pongs_.push_back(r);
    }
    std::erase_if(pongs_, [](MPI_Request& r) {
      int done = 0;
      return MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done;
    });
  }
  void DropPongs() {
    for (MPI_Request& r : pongs_) MPI_Request_free(&r);
    pongs_.clear();
  }

  // Pings every peer and waits up to `window_s` for the answers: the ranks
  // that gave none.
  std::vector<int> SilentPeers(double window_s) {
    std::vector<MPI_Request> sends, recvs;
    std::vector<int> got(world_, 0), peers;
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      MPI_Request s, r;
      if (MPI_Isend(&kPing, 1, MPI_INT, p, kPingTag, ctl_, &s) != MPI_SUCCESS) continue;
      if (MPI_Irecv(&got[p], 1, MPI_INT, p, kPongTag, ctl_, &r) != MPI_SUCCESS) continue;
      sends.push_back(s);
      recvs.push_back(r);
      peers.push_back(p);
    }
    std::vector<bool> answered(peers.size(), false);
    const double end = NowSeconds() + window_s;
    size_t left = peers.size();
    while (left > 0 && NowSeconds() < end) {
      AnswerPings();
      for (size_t i = 0; i < peers.size(); ++i) {
        int done = 0;
        if (!answered[i] && MPI_Test(&recvs[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
          answered[i] = true;
          --left;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<int> silent;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (!answered[i]) {
        silent.push_back(peers[i]);
        MPI_Cancel(&recvs[i]);
        MPI_Request_free(&recvs[i]);
      }
      MPI_Request_free(&sends[i]);
    }
    return silent;
  }

  static constexpr int kPing = 1, kPong = 2;
  MPI_Comm data_, ctl_;
  CommOptions opt_;
  int rank_ = 0, world_ = 1;
  Status sticky_;
  std::vector<MPI_Request> pongs_;  // answers on their way
};

}  // namespace

bool BuiltWithMpi() { return true; }

Result<std::unique_ptr<Communicator>> CreateMpiCommunicator(const CommOptions& options) {
  RETURN_IF_ERROR(InitMpi());
  MPI_Comm data = MPI_COMM_NULL, ctl = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &data);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &ctl);
  if (rc != MPI_SUCCESS) return Unavailable("MPI_Comm_dup of MPI_COMM_WORLD failed: " + MpiErrorText(rc));
  MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(ctl, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(data, ctl, options));
}

}  // namespace strata::comm

#else  // !STRATA_WITH_MPI

namespace strata::comm {

bool BuiltWithMpi() { return false; }

Result<std::unique_ptr<Communicator>> CreateMpiCommunicator(const CommOptions&) {
  return Unavailable("strata was built without MPI, which the CPU backend's ranks communicate over: "
                     "scripts/install-deps.sh installs libopenmpi-dev and openmpi-bin; then configure again");
}

}  // namespace strata::comm

#endif
