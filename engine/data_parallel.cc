#include "engine/data_parallel.h"

#include <algorithm>
#include <thread>

#include "base/bytes.h"
#include "comm/mpi_communicator.h"
#include "comm/rank_env.h"

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

Result<std::unique_ptr<DataParallel>> DataParallel::Create(const Config& c, bool cuda, double timeout_s) {
  RETURN_IF_ERROR(CheckBatchRule(c));
  if (cuda)
    return Unavailable("world size " + std::to_string(c.world_size) +
                       " on the CUDA backend: its data parallelism over NCCL (comm/nccl_communicator.h) is not wired "
                       "into the trainer yet; several ranks run on the CPU backend (--backend cpu, under mpirun)");
  ASSIGN_OR_RETURN(const comm::RankEnv env, comm::RankEnvFromEnvironment());
  comm::CommOptions o;
  o.timeout_s = timeout_s;
  ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> mpi, comm::CreateMpiCommunicator(o));
  if (mpi->world_size() != env.world_size && env.world_size != 1)
    return InvalidArgument("the launcher says " + env.ToString() + " but MPI sees " +
                           std::to_string(mpi->world_size()) + " ranks: the CPU backend's ranks run under mpirun");
  return Over(std::move(mpi), c);
}

Result<std::unique_ptr<DataParallel>> DataParallel::Over(std::unique_ptr<comm::Communicator> comm, const Config& c) {
  RETURN_IF_ERROR(CheckBatchRule(c));
  if (comm->world_size() != c.world_size)
    return InvalidArgument("the config's world size is " + std::to_string(c.world_size) + " but the " +
                           std::string(comm->backend()) + " communicator has " + std::to_string(comm->world_size()) +
                           " ranks (start as many processes as the config's world size: mpirun -n " +
                           std::to_string(c.world_size) + ")");
  return std::unique_ptr<DataParallel>(new DataParallel(std::move(comm)));
}

Result<int64_t> DataParallel::SumCount(int64_t local) {
  int64_t v = local;
  RETURN_IF_ERROR(comm_->AllReduce(&v, &v, 1, DType::kI64, comm::ReduceOp::kSum, nullptr)
                      .WithContext("summing the step's counted targets over the ranks"));
  return v;
}

Result<double> DataParallel::SumLoss(double local) {
  double v = local;
  RETURN_IF_ERROR(comm_->AllReduce(&v, &v, 1, DType::kF64, comm::ReduceOp::kSum, nullptr)
                      .WithContext("summing the step's loss over the ranks"));
  return v;
}

Result<int> DataParallel::AnyStop(int signal) {
  int32_t v = signal;
  RETURN_IF_ERROR(comm_->AllReduce(&v, &v, 1, DType::kI32, comm::ReduceOp::kMax, nullptr)
                      .WithContext("agreeing with the other ranks on whether to stop"));
  return static_cast<int>(v);
}

Status DataParallel::ReduceGradient(void* f32, int64_t numel, void* stream) {
  return comm_->AllReduce(f32, f32, static_cast<size_t>(numel), DType::kF32, comm::ReduceOp::kSum, stream);
}

uint64_t AllReduceBytesPerRank(int world, int64_t params) {
  if (world <= 1) return 0;
  return static_cast<uint64_t>(2.0 * (world - 1) / world * 4.0 * static_cast<double>(params));
}

std::string DataParallelNote(const Config& c, int64_t params) {
  const int w = c.world_size;
  return "data parallel: " + std::to_string(w) + " ranks; each micro-batch step's " +
         std::to_string(c.micro_batch * w) + " samples split " + std::to_string(c.micro_batch) +
         " per rank; every rank holds and updates the whole state, so the plan below is each rank's" +
         (c.zero.stage > 0 ? " (zero_optimization.stage " + std::to_string(c.zero.stage) +
                                 "'s partitioning across ranks is not implemented yet)"
                           : std::string()) +
         "; the gradients are summed over the ranks in the backward: " + FormatBytes(AllReduceBytesPerRank(w, params)) +
         " sent and as much received per rank per step (a ring all-reduce of fp32)";
}

std::string DataParallel::Describe(const Config& c, int64_t params) const {
  return DataParallelNote(c, params) + "; this is rank " + std::to_string(rank()) + " of " +
         std::to_string(world()) + " (" + std::string(comm_->backend()) + ")";
}

}  // namespace strata
