// SPDX-License-Identifier: Apache-2.0
#include "engine/data_parallel.h"

#include <algorithm>
#include <thread>

#include "base/bytes.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/rank_env.h"
#include "engine/model_config.h"

namespace strata {

Status CheckBatchRule(const Config& c) {
  const int64_t want = c.micro_batch * c.grad_accum * c.world_size;
  if (c.train_batch_size == want) return Status::OK();
  return InvalidArgument("train_batch_size " + std::to_string(c.train_batch_size) +
                         " is not train_micro_batch_size_per_gpu × gradient_accumulation_steps × world size = " +
                         std::to_string(c.micro_batch) + " × " + std::to_string(c.grad_accum) + " × " +
                         std::to_string(c.world_size) + " = " + std::to_string(want));
}

void ShareTheMachine(const comm::RankEnv& env, TrainOptions* o) {
  o->local_ranks = std::max(env.local_world_size, 1);
  if (o->cpu_threads == 0 && o->local_ranks > 1)
    o->cpu_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / o->local_ranks);
}

Result<int> RankDevice(const comm::RankEnv& env, int visible) {
  if (env.local_rank < visible) return env.local_rank;
  if (visible == 1) return 0;
  return InvalidArgument("LOCAL_RANK=" + std::to_string(env.local_rank) + " (" + env.ToString() +
                         ") but this process sees " + std::to_string(visible) +
                         " GPUs: give each local rank its own GPU (CUDA_VISIBLE_DEVICES with all of them, or "
                         "with one per rank)");
}

Result<std::unique_ptr<DataParallel>> DataParallel::Create(const Config& c, kernels::Backend* backend, int device,
                                                           double timeout_s, int64_t largest_unit) {
  RETURN_IF_ERROR(CheckBatchRule(c));
  ASSIGN_OR_RETURN(const comm::RankEnv env, comm::RankEnvFromEnvironment());
  comm::CommOptions o;
  o.timeout_s = timeout_s;
  if (backend->kind() == kernels::BackendKind::kCuda) {
    if (env.world_size != c.world_size)
      return InvalidArgument("the launcher says " + env.ToString() + " but the config's world size is " +
                             std::to_string(c.world_size));
    auto nccl = comm::CreateNcclCommunicator(env, device, o);
    if (!nccl.ok())
      return nccl.status().WithContext("joining the ranks over NCCL (" + env.ToString() + ", GPU " +
                                       std::to_string(device) + ")");
    return Over(std::move(*nccl), c, backend, largest_unit);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> mpi, comm::CreateMpiCommunicator(o));
  if (mpi->world_size() != env.world_size && env.world_size != 1)
    return InvalidArgument("the launcher says " + env.ToString() + " but MPI sees " +
                           std::to_string(mpi->world_size()) + " ranks: the CPU backend's ranks run under mpirun");
  return Over(std::move(mpi), c, nullptr, largest_unit);
}

Result<std::unique_ptr<DataParallel>> DataParallel::Over(std::unique_ptr<comm::Communicator> comm, const Config& c,
                                                         kernels::Backend* backend, int64_t largest_unit) {
  RETURN_IF_ERROR(CheckBatchRule(c));
  if (comm->world_size() != c.world_size)
    return InvalidArgument("the config's world size is " + std::to_string(c.world_size) + " but the " +
                           std::string(comm->backend()) + " communicator has " + std::to_string(comm->world_size()) +
                           " ranks (start as many processes as the config's world size: mpirun -n " +
                           std::to_string(c.world_size) + ")");
  const bool device_memory = comm->backend() == "nccl";
  if (device_memory && (backend == nullptr || backend->kind() != kernels::BackendKind::kCuda))
    return InvalidArgument("the NCCL communicator needs the CUDA backend whose memory and stream it uses");
  std::unique_ptr<DataParallel> dp(new DataParallel(std::move(comm)));
  if (device_memory) dp->backend_ = backend;
  ASSIGN_OR_RETURN(StagedCollectives staged,
                   StagedCollectives::Create(dp->comm_.get(), dp->backend_, RoundsFor(c, largest_unit)));
  dp->staged_.emplace(std::move(staged));
  return dp;
}

StagedCollectives::Rounds DataParallel::RoundsFor(const Config& c, int64_t largest_unit) {
  if (c.zero.stage < 1) return StagedCollectives::Rounds{size_t{1} << 20};
  if (largest_unit <= 0) return StagedCollectives::Rounds{};
  return StagedCollectives::RoundsFor(c.world_size, c.zero.reduce_bucket_size, c.zero.allgather_bucket_size,
                                      ComputeDType(c), largest_unit);
}

Status DataParallel::ReduceScalar(void* v, DType dtype, comm::ReduceOp op) {
  return staged_->AllReduceHost(v, 1, dtype, op);
}

Result<int64_t> DataParallel::SumCount(int64_t local) {
  int64_t v = local;
  RETURN_IF_ERROR(ReduceScalar(&v, DType::kI64, comm::ReduceOp::kSum)
                      .WithContext("summing the step's counted targets over the ranks"));
  return v;
}

Result<double> DataParallel::SumLoss(double local) {
  double v = local;
  RETURN_IF_ERROR(ReduceScalar(&v, DType::kF64, comm::ReduceOp::kSum)
                      .WithContext("summing the step's loss over the ranks"));
  return v;
}

Result<int> DataParallel::AnyStop(int signal) {
  int32_t v = signal;
  RETURN_IF_ERROR(ReduceScalar(&v, DType::kI32, comm::ReduceOp::kMax)
                      .WithContext("agreeing with the other ranks on whether to stop"));
  return static_cast<int>(v);
}

Status DataParallel::ReduceGradient(void* f32, int64_t numel, void* stream) {
  return comm_->AllReduce(f32, f32, static_cast<size_t>(numel), DType::kF32, comm::ReduceOp::kSum, stream);
}

Status DataParallel::ReduceScatterGradient(float* f32, int64_t numel, int64_t slice_pad) {
  return staged_->ReduceScatterFlat(f32, numel, slice_pad);
}

Status DataParallel::ReduceScatterInPlace(float* acc, int64_t slice_pad, void* stream) {
  return comm_->ReduceScatter(acc, acc + static_cast<size_t>(rank()) * static_cast<size_t>(slice_pad),
                              static_cast<size_t>(slice_pad), DType::kF32, comm::ReduceOp::kSum, stream);
}

Status DataParallel::AllGather(const void* send, size_t count, DType dtype, void* recv, size_t recv_elems,
                               bool recv_on_backend) {
  return staged_->AllGather(send, count, dtype, recv, recv_elems, recv_on_backend);
}

Status DataParallel::AllGatherInPlace(void* buf, size_t count, DType dtype, void* stream) {
  uint8_t* all = static_cast<uint8_t*>(buf);
  const uint8_t* mine = all + static_cast<size_t>(rank()) * count * DTypeSize(dtype);
  return comm_->AllGather(mine, all, count, dtype, stream);
}

Status DataParallel::SumGradStats(double* sum_sq, std::vector<int32_t>* nonfinite) {
  RETURN_IF_ERROR(staged_->AllReduceHost(sum_sq, 1, DType::kF64, comm::ReduceOp::kSum)
                      .WithContext("summing the gradient's squared norm over the ranks' slices"));
  return staged_->AllReduceHost(nonfinite->data(), nonfinite->size(), DType::kI32, comm::ReduceOp::kSum)
      .WithContext("summing the non-finite gradient counts over the ranks' slices");
}

bool PartitionsState(const TrainOptions& o) {
  return o.config.zero.stage >= 1 && (o.config.world_size > 1 || o.partition_at_world_one);
}

bool ReducesBesideBackward(const TrainOptions& o) {
  const Config& c = o.config;
  if (!TakesRanksPath(o) || !c.zero.overlap_comm) return false;
  const bool scratch = GradDType(ComputeDType(c)) != DType::kF32 || (PartitionsRanksState(o) && c.zero.stage >= 2);
  const bool once_per_step = c.trainer.schedule != "micro-batch-major" || c.grad_accum == 1;
  return scratch && once_per_step;
}

uint64_t ReduceScatterBytesPerRank(int world, int64_t params) {
  if (world <= 1) return 0;
  return static_cast<uint64_t>(1.0 * (world - 1) / world * 4.0 * static_cast<double>(params));
}

uint64_t AllGatherBytesPerRank(int world, int64_t params, DType dtype) {
  if (world <= 1) return 0;
  return static_cast<uint64_t>(1.0 * (world - 1) / world * static_cast<double>(DTypeSize(dtype)) *
                               static_cast<double>(params));
}

uint64_t AllReduceBytesPerRank(int world, int64_t params) {
  if (world <= 1) return 0;
  return static_cast<uint64_t>(2.0 * (world - 1) / world * 4.0 * static_cast<double>(params));
}

std::string DataParallelNote(const TrainOptions& o, int64_t params) {
  const Config& c = o.config;
  const int w = c.world_size;
  std::string note = "data parallel: " + std::to_string(w) + " ranks; each micro-batch step's " +
                     std::to_string(c.micro_batch * w) + " samples split " + std::to_string(c.micro_batch) +
                     " per rank";
  if (!PartitionsState(o))
    return note + "; every rank holds and updates the whole state, so the plan below is each rank's" +
           (ReducesBesideBackward(o) ? "; the gradients are summed over the ranks beside the backward (overlap_comm: "
                                       "each unit's under the next unit's backward, on a stream of its own): "
                                     : "; the gradients are summed over the ranks in the backward: ") +
           FormatBytes(AllReduceBytesPerRank(w, params)) +
           " sent and as much received per rank per step (a ring all-reduce of fp32)";
  const int64_t slice = (params + w - 1) / w;  // (per unit in fact: about this many in all)
  const DType dtype = ComputeDType(c);
  note += "; zero_optimization.stage " + std::to_string(c.zero.stage) +
          " partitions each unit's flat state in " + std::to_string(w) +
          " slices: each rank keeps the fp32 master weights and Adam moments of its slice (about " +
          std::to_string(slice) + " of " + std::to_string(params) +
          " parameters), updates it from its slice of the reduce-scattered gradient, and all-gathers the new " +
          std::string(DTypeName(dtype)) + " parameters";
  if (c.zero.stage == 1) note += " (stage 1 reduce-scatters too, as stage 2)";
  if (c.zero.stage == 3)
    note += " into a transient buffer before each unit's forward and backward (stage 3: no rank keeps the whole "
            "parameters)";
  else
    note += " after the update (every rank keeps the whole parameters)";
  const uint64_t gather = AllGatherBytesPerRank(w, params, dtype) * (c.zero.stage == 3 ? 2 : 1);
  note += c.zero.stage >= 2 ? "; each rank keeps the gradients of its slices alone (a unit's whole fp32 gradient "
                              "collects on the GPU in the backward and is reduce-scattered once final)"
                            : "; every rank keeps each unit's whole gradient (only its slice reduced)";
  note += ReducesBesideBackward(o) ? "; each unit's gradient is reduce-scattered in place beside the backward "
                                     "(overlap_comm: under the next unit's backward, on a stream of its own)"
                                   : "; the gradients are reduce-scattered on the compute stream as each is final";
  note += "; the plan below is each rank's; per rank per step: " +
          FormatBytes(ReduceScatterBytesPerRank(w, params)) + " sent and as much received reduce-scattering the fp32 "
          "gradients, " + (c.zero.stage == 3 ? "about " : "") + FormatBytes(gather) +
          " sent and as much received all-gathering the parameters" +
          (c.zero.stage == 3 ? " (forward and backward; a unit still cached is not gathered again)" : "");
  return note;
}

std::string DataParallel::Describe(const TrainOptions& o, int64_t params) const {
  return DataParallelNote(o, params) + "; this is rank " + std::to_string(rank()) + " of " +
         std::to_string(world()) + " (" + std::string(comm_->backend()) + ")";
}

}  // namespace strata
