// SPDX-License-Identifier: Apache-2.0
// Data parallelism: the trainer's ranks over a communicator (comm/
// communicator.h), one per process: started by mpirun on the CPU backend
// (over MPI), by `strata train --num-gpus N` (engine/launcher.h), torchrun
// or DeepSpeed's launcher on the CUDA backend (over NCCL, one GPU per
// rank: LOCAL_RANK's) — the trainer's one piece that knows there are
// several. A process started by a launcher takes this path even at world
// size 1 (TrainOptions::launched), so that the distributed path can be
// measured against the plain one.
//
// What each rank does, so that W ranks train exactly as one rank with the
// same global batch (up to the order of fp32 sums):
//   batch      train_batch_size = micro × accumulation × W (checked). Each
//              micro-batch step's global batch is micro × W samples of the
//              one sample sequence (engine/data.h: sample k of the
//              stream is a function of k alone); rank r takes samples
//              [r × micro, (r + 1) × micro) of it (DataLoader::SetRanks),
//              so the order of samples does not depend on W.
//   loss       the gradient of the global batch's mean: the step's counted
//              targets are summed over the ranks before the backward
//              (SumCount), and the loss every rank reports is the global
//              mean (SumLoss). Rank 0 alone logs and writes checkpoints.
//   gradients  each unit's fp32 gradient, once final in the backward, is
//              summed over the ranks in place (ReduceGradient) before its
//              statistics are taken (engine/step_env.h): the squared norm
//              and the non-finite counts are then the global batch's on
//              every rank, as are clipping and the loss scale's verdicts.
//   state      zero_optimization.stage 0: every rank updates every shard
//              with the same reduced gradients, so the replicas stay
//              identical without a broadcast (same initialization: the
//              seed, or the same checkpoint).
//   ZeRO       stages 1-3 (PartitionsState): each unit's
//              flat state is split in W equal slices (padded, DeepSpeed's
//              flat partitions; engine/model_state.h) and rank r keeps the
//              fp32 master and Adam moments of slice r alone. The final
//              gradient is reduce-scattered instead (ReduceScatterGradient),
//              the statistics are the slice's and their global sum is one
//              all-reduce each after the backward (SumGradStats); each rank
//              updates its slice, and the new parameters are all-gathered
//              (AllGather): at stages 1 and 2 into every rank's whole
//              parameters once the step's update is done, through one
//              bounded staging buffer in rounds (engine/
//              staged_collectives.h: the slices are host memory and NCCL
//              moves device memory, and a unit's last slice is padded); at
//              stage 3 into a buffer at each use, in place, on a stream of
//              their own and fetched ahead of use (AllGatherInPlace,
//              engine/param_gather.h). At world size 1 the path is taken only with
//              TrainOptions::partition_at_world_one (one slice per unit:
//              the tests and measurements of the path on one GPU).
//              Stage 1 reduce-scatters too, and keeps each unit's whole
//              gradient (only its slice reduced); from stage 2 each rank's
//              gradient tensors hold its slices alone (Shard::grad_slice:
//              the unit's whole fp32 gradient collects on the GPU, in the
//              step's accumulator, and is reduce-scattered once final). In a
//              checkpoint each rank writes its own slices, and a resume at
//              any world size reshards them (engine/checkpoint.h). The
//              plan is per rank (PlanInputs::zero_partitions) and Describe
//              says what moves over the communicator per rank per step.
//   stopping   a stop signal seen by any rank stops every rank after the
//              same step (AnyStop, checked between steps).
//   streams    on NCCL every collective is enqueued on the step's stream
//              (the backend's): a gradient's all-reduce runs after the
//              kernels that finished it and before its statistics; with
//              overlap_comm the gradients' sums run on a stream of their
//              own beside the backward instead (ReducesBesideBackward,
//              engine/grad_reduce.h), and stage 3's gathers on another
//              (engine/param_gather.h). The
//              scalars (SumCount, SumLoss, AnyStop) go through a small
//              staging buffer on that stream and wait for the result.
//
// Thread-safety: the step's thread only (collectives run in one order).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/communicator.h"
#include "comm/rank_env.h"
#include "engine/config.h"
#include "engine/staged_collectives.h"
#include "engine/train_options.h"
#include "kernels/backend.h"

namespace strata {

class DataParallel {
 public:
  // The ranks of a run started by a launcher: MPI for the CPU backend; for
  // the CUDA backend NCCL on `device` (RankDevice's), its unique id
  // published by rank 0 over the TCP rendezvous at MASTER_ADDR:MASTER_PORT
  // (comm/tcp_rendezvous.h) within `timeout_s`. `backend` (not owned, must
  // outlive the result) is the step's: its stream carries the collectives.
  // InvalidArgument when the batch sizes break the rule or the launcher's
  // ranks differ from the config's world size; Unavailable without MPI
  // (CPU) or NCCL (CUDA), or when the rendezvous does not complete.
  // `largest_unit`: the model's largest unit's elements (the rounds'
  // bound, RoundsFor).
  static Result<std::unique_ptr<DataParallel>> Create(const Config& c, kernels::Backend* backend, int device,
                                                      double timeout_s, int64_t largest_unit);
  // The collectives' rounds and staging buffer (engine/staged_collectives.h):
  // at ZeRO stage >= 1 from zero_optimization's reduce_bucket_size and
  // allgather_bucket_size, capped at what a round of the `largest_unit`
  // needs (0: unknown, the 32 MiB default staging); 1 MiB at stage 0 (its
  // scalars and gradient statistics only; the gradients' all-reduce runs in
  // place).
  static StagedCollectives::Rounds RoundsFor(const Config& c, int64_t largest_unit);
  // For tests and embedders: over a given communicator. A communicator of
  // device memory (NCCL) needs the `backend` whose memory and stream it
  // uses; MPI's takes none.
  static Result<std::unique_ptr<DataParallel>> Over(std::unique_ptr<comm::Communicator> comm, const Config& c,
                                                    kernels::Backend* backend = nullptr, int64_t largest_unit = 0);

  int rank() const { return comm_->rank(); }
  int world() const { return comm_->world_size(); }
  // Rank 0 logs and writes checkpoints.
  bool leads() const { return rank() == 0; }

  // The sum over the ranks of each one's counted targets.
  Result<int64_t> SumCount(int64_t local);
  // The sum over the ranks of each one's loss sum.
  Result<double> SumLoss(double local);
  // The stop signal (engine/signals.h) any rank has seen, or 0: the ranks
  // stop at the same step boundary, as a signal from mpirun reaches each
  // at its own moment.
  Result<int> AnyStop(int signal);
  // `numel` fp32 values (the backend's memory; `stream` its stream) summed
  // over the ranks in place.
  Status ReduceGradient(void* f32, int64_t numel, void* stream);
  // ZeRO stages >= 1: `numel` fp32 values (the backend's memory, as the
  // gradient is) reduce-scattered in DeepSpeed's flat layout (padded with
  // zeros to world × slice_pad): the sum over the ranks of [rank ×
  // slice_pad, ...) lands in place in that range of `f32` (the rest keeps
  // this rank's values).
  Status ReduceScatterGradient(float* f32, int64_t numel, int64_t slice_pad);
  // The same beside the backward (ReducesBesideBackward, engine/
  // grad_reduce.h): `acc` holds world × slice_pad fp32 values (the unit's,
  // then zeros), reduce-scattered in place with no staging: the sum of rank
  // r's block lands at r × slice_pad; the other blocks are undefined after.
  // NCCL: enqueued on `stream`; MPI: complete on return.
  Status ReduceScatterInPlace(float* acc, int64_t slice_pad, void* stream);
  // `count` elements of `dtype` from every rank (`send`: host memory) into
  // `recv`: the first `recv_elems` of the world × count gathered (rank r's
  // at r × count), in the backend's memory when `recv_on_backend`, else in
  // host memory.
  Status AllGather(const void* send, size_t count, DType dtype, void* recv, size_t recv_elems, bool recv_on_backend);
  // ZeRO stage 3's gathers (engine/param_gather.h): `count` elements of
  // `dtype` per rank gathered in place in `buf` (the backend's memory, world
  // × count), this rank's already at rank × count. NCCL: enqueued on
  // `stream` (errors stick and surface at the next call that waits); MPI:
  // complete on return.
  Status AllGatherInPlace(void* buf, size_t count, DType dtype, void* stream);
  // Partitioned: each rank's statistics of its slices (the squared norm,
  // the non-finite count per unit) summed over the ranks in place.
  Status SumGradStats(double* sum_sq, std::vector<int32_t>* nonfinite);

  // DataParallelNote and "this is rank 0 of 2 (mpi)", for the log.
  std::string Describe(const TrainOptions& o, int64_t params) const;

 private:
  explicit DataParallel(std::unique_ptr<comm::Communicator> comm) : comm_(std::move(comm)) {}
  // One value of `dtype` (host memory) reduced over the ranks in place.
  Status ReduceScalar(void* v, DType dtype, comm::ReduceOp op);

  std::unique_ptr<comm::Communicator> comm_;
  kernels::Backend* backend_ = nullptr;      // NCCL: the step's backend (not owned); MPI: none
  std::optional<StagedCollectives> staged_;  // every collective but the stage-0 all-reduce
};

// The GPU a rank on the CUDA backend takes among the `visible` devices its
// process sees: LOCAL_RANK's (torchrun, DeepSpeed and `strata train
// --num-gpus` leave every GPU visible), or device 0 when the process sees
// one (a launcher that set CUDA_VISIBLE_DEVICES per rank). InvalidArgument
// naming LOCAL_RANK and the count otherwise.
Result<int> RankDevice(const comm::RankEnv& env, int visible);

// The ranks on one machine share its host memory and cores: the default
// host budget (80% of the available memory) and, with cpu_threads 0 (all),
// the CPU threads become each local rank's share (env.local_world_size).
void ShareTheMachine(const comm::RankEnv& env, TrainOptions* o);

// What o.config.world_size ranks do (partitioned at stage >= 1 across
// several, or at one with TrainOptions::partition_at_world_one), and the
// bytes each sends and receives per
// step over the communicator for `params` parameters, for --dry-run and the
// log: stage 0, a ring all-reduce of the fp32 gradients (2 (W - 1) / W × 4
// bytes per parameter each way); stages >= 1, a reduce-scatter of them
// ((W - 1) / W × 4) and an all-gather of the compute-dtype parameters
// ((W - 1) / W × its size).
std::string DataParallelNote(const TrainOptions& o, int64_t params);
// Those bytes.
uint64_t AllReduceBytesPerRank(int world, int64_t params);
uint64_t ReduceScatterBytesPerRank(int world, int64_t params);
uint64_t AllGatherBytesPerRank(int world, int64_t params, DType dtype);
// Whether the ranks of `o` partition the state: zero stage >= 1 across
// several, or at one with TrainOptions::partition_at_world_one (launched or
// not: the dry run's note says what the run would do; PartitionsRanksState
// is the run's own test, which also asks that it was launched).
bool PartitionsState(const TrainOptions& o);

// Whether the ranks' gradient sums run beside the backward, on a stream of
// their own (zero_optimization.overlap_comm; engine/grad_reduce.h): a run on
// the ranks' path whose gradients accumulate in the step's fp32 scratch
// (the store's gradient is narrower than fp32, or a ZeRO stage >= 2 slice;
// engine/step_buffers.h) and are final once per step in one pass
// (layer-major, or one micro-batch). Else each sum runs on the compute
// stream as the gradient is final (ReduceGradient, ReduceScatterGradient).
bool ReducesBesideBackward(const TrainOptions& o);

// train_batch_size = micro × accumulation × world size, as DeepSpeed
// checks it: InvalidArgument naming the four values otherwise.
Status CheckBatchRule(const Config& c);

}  // namespace strata
