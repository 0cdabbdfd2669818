// SPDX-License-Identifier: Apache-2.0
// ModelState: the model's training state in the tier store. One shard per
// unit of the model (models/model_spec.h: the embedding, each block, the
// final unit), each with its parameters (compute dtype), gradients (the
// optimizer's gradient dtype), fp32 master weights and Adam moments (fp32,
// or bf16 with Layout::moment_dtype) — and, for the speculative update, a
// second master/m/v of the same dtypes — homed where the
// plan says; and the activation checkpoints (each layer's input, per
// micro-batch set). It creates them, initializes them (from scratch or from
// a Hugging Face file), and reads and writes a shard's state for
// checkpoints, resume and tests.
//
// ZeRO partitioning across data-parallel ranks (engine/data_parallel.h,
// Layout::world > 1 with zero_stage >= 1): each unit's flat state is split
// in `world` equal slices of slice_pad = ceil(numel / world) (the last one
// padded), DeepSpeed's flat partitions; this rank owns [slice_off, slice_off
// + slice_len) and keeps the fp32 master and Adam moments (and the
// speculative second set) of that slice alone, homed as the plan says. The
// optimizer reads the slice of the (reduce-scattered) gradient and writes
// the slice's new compute-dtype parameters into `ps` (host); GatherParams
// then all-gathers the ranks' `ps` into the full parameters `p` — at stage
// 3 there is no `p`: a unit's parameters are gathered into a transient
// buffer at each use (engine/param_gather.h). Reading a
// shard's whole state (checkpoints, Parameter) all-gathers it from the
// ranks, so every rank must make the same such calls in the same order.
//
// Who may touch a shard's ids (the speculative update swaps the two sets):
// the optimizer worker holding the shard, or, when none does, the step
// thread (under the optimizer pool's lock, or with no job running).
//
// Ownership: borrows the store (which must outlive it) and owns the tensors
// it created there (removed with the store). Thread-safety: see above; the
// state I/O calls are made with no optimizer job running.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "base/tier_kind.h"
#include "engine/checkpoint.h"
#include "engine/planner.h"
#include "models/model_spec.h"
#include "tiers/tier_store.h"

namespace strata {

struct Shard {
  std::string name;  // the unit's: "emb", "blk3", "lnf"
  models::UnitKind kind = models::UnitKind::kBlock;
  int layer = -1;
  int64_t numel = 0;
  TensorId p, g, w, m, v;  // params (dtype), grads (grad dtype), master (f32), exp_avg, exp_avg_sq (moment dtype)
  TensorId w2, m2, v2;     // the speculative update's other set (host, same dtypes; invalid when unused)
  TensorId gacc;           // micro-batch-major blocks whose `g` is not the accumulator: the fp32 one
  TierKind p_home = TierKind::kGpu, g_home = TierKind::kGpu, opt_home = TierKind::kGpu;
  // Partitioned (above): this rank's slice of the flat state, and its new
  // compute-dtype parameters (host, slice_pad). Unpartitioned: the whole
  // unit (slice_off 0, slice_len = slice_pad = numel) and no `ps`.
  bool partitioned = false;
  int64_t slice_off = 0, slice_len = 0, slice_pad = 0;
  TensorId ps;
  // The elements w, m, v (and w2, m2, v2) hold.
  int64_t opt_numel() const { return partitioned ? slice_pad : numel; }
  // ZeRO stage >= 2 (Layout::partitions_grads): `g` holds this rank's slice
  // alone (slice_pad elements, the slice at 0); else the whole unit, the
  // slice at slice_off. A slice-only `g` is never the backward's
  // accumulator: the whole unit's fp32 gradient collects outside it (the
  // step's accumulator, or `gacc`) and its slice is copied in once final.
  bool grad_slice = false;
  int64_t g_numel() const { return grad_slice ? slice_pad : numel; }
  int64_t g_off() const { return grad_slice ? 0 : slice_off; }
};

// All-gathers `count` elements of `dtype` from every rank (`send`: host
// memory) into the first `recv_elems` of `recv` (of the world × count
// gathered, rank r's at r × count), which is the backend's memory when
// `recv_on_backend`, else host memory (engine/data_parallel.h AllGather).
using GatherFn = std::function<Status(const void* send, size_t count, DType dtype, void* recv, size_t recv_elems,
                                      bool recv_on_backend)>;

class ModelState {
 public:
  struct Layout {
    DType dtype = DType::kF32;       // parameters and activations
    DType grad_dtype = DType::kF32;  // gradients the optimizer reads
    int64_t batch = 1, seq = 1, micro_batches = 1;
    bool layer_major = true;  // checkpoints of every micro-batch (else of one)
    // Data parallelism: this rank of `world`; zero_stage >= 1 with world > 1
    // (or `partition_one` at world 1) partitions the state (above).
    int rank = 0, world = 1, zero_stage = 0;
    bool partition_one = false;
    bool partitioned() const { return (world > 1 || partition_one) && zero_stage >= 1; }
    // Stage 3: the parameters are partitioned too (no shard has `p`: each
    // use gathers them, engine/param_gather.h).
    bool gathers_params() const { return partitioned() && zero_stage >= 3; }
    // Stage >= 2: the gradients too (Shard::grad_slice).
    bool partitions_grads() const { return partitioned() && zero_stage >= 2; }
    // The store's fp32 gradient is the backward's accumulator (fp32
    // training, whole gradients); else the accumulator is outside it.
    bool grad_is_accumulator() const { return grad_dtype == DType::kF32 && !partitions_grads(); }
    DType moment_dtype = DType::kF32;  // exp_avg, exp_avg_sq: kF32, or kBF16 (bf16.bf16_optimizer_states)
  };
  // Creates every tensor with its home from the plan: the shards (the first
  // plan.optimizer_gpu_shards keep optimizer state, gradients and parameters
  // on the GPU), the checkpoints (the plan's split: the last
  // checkpoint_gpu_layers sets on the GPU). With `speculative`, the second
  // set of every shard whose state is on the host.
  static Result<std::unique_ptr<ModelState>> Create(TierStore* store, const models::ModelSpec& spec, const Plan& plan,
                                                    const Layout& layout, bool speculative);

  const models::ModelSpec& spec() const { return spec_; }
  TierStore* store() const { return store_; }
  const Layout& layout() const { return layout_; }
  size_t size() const { return shards_.size(); }
  Shard& shard(size_t s) { return shards_[s]; }
  const Shard& shard(size_t s) const { return shards_[s]; }
  const std::vector<Shard>& shards() const { return shards_; }
  // With offload_optimizer.ratio < 1 (and the rest offloaded): shards
  // [0, gpu_prefix) keep their optimizer state on the GPU and are updated by
  // the step's thread; 0 when every shard's state is on the GPU or none.
  size_t gpu_prefix() const { return gpu_prefix_; }
  // The checkpoint x_layer of micro-batch `micro` (layer n_layer: the head's input).
  TensorId checkpoint(int layer, int64_t micro) const {
    return checkpoints_[static_cast<size_t>(layer)][layout_.layer_major ? static_cast<size_t>(micro) : 0];
  }
  // The shard whose parameters `id` is, if any.
  std::optional<size_t> ShardOfParams(TensorId id) const;
  // The largest shard a host optimizer updates (0: every shard's state is on
  // the GPU), and whether such shards have gradients / parameters homed on
  // the GPU (they then move through host staging).
  uint64_t MaxOffloadedNumel() const;
  bool OffloadedGradsOnGpu() const;
  bool OffloadedParamsOnGpu() const;
  bool speculative() const { return speculative_; }
  // Partitioned: the collective that gathers a shard's slices (set before
  // any whole-state read or GatherParams).
  void SetGather(GatherFn gather) { gather_ = std::move(gather); }

  // ---- initialization and state I/O ------------------------------------------
  // The family's initialization (models/init.h), shards in parallel.
  Status InitRandom(uint64_t seed);
  // Parameters from Hugging Face weights (engine/hf_weights.h: a safetensors
  // file, or a model directory, sharded or not) under the spec's names (with
  // or without the family's base prefix, after `prefix`), any float dtype,
  // checked whole before anything is written (engine/hf_import.h); m = v = 0.
  // A position table may have more rows than the run uses. Streams a unit at
  // a time into the store (each unit where the plan homes it), one weights
  // file mapped at a time.
  Status InitFromHf(const std::string& path, const std::string& prefix);
  // master/m/v as host fp32 arrays of shard.numel (m/v null: zeros; bf16
  // moments are rounded to nearest even, exact for values read from bf16);
  // the parameters become the master rounded to the compute dtype; the
  // gradients zeros. ReadShardState widens bf16 moments to fp32 (exact).
  // Partitioned: this rank's slice of the arrays is written, and the full
  // parameters (stages 1-2) are the whole master's rounding, which every
  // rank computes alike — or, with `gather_params`, the ranks' slices'
  // roundings all-gathered (a collective, the same bits; `master` is read
  // in this rank's slice alone: a resume reads no other rank's master).
  Status WriteShardState(size_t s, const float* master, const float* m, const float* v, bool gather_params = false);
  // The master rounded to the compute dtype — what the CPU and GPU Adam write
  // beside it, bit for bit — written into the shard's parameters.
  Status WriteParamsFromMaster(size_t s, const float* master);
  // Partitioned, the whole arrays are all-gathered from the ranks (a
  // collective: every rank calls it alike).
  Status ReadShardState(size_t s, float* master, float* m, float* v);
  // Partitioned: this rank's part of the unit's master/m/v (slice_len each,
  // without the padding; null: not read).
  Status ReadOwnSlice(size_t s, float* master, float* m, float* v);
  // This rank's own master/m/v (opt_numel() each; null: not read).
  Status ReadOwnState(size_t s, float* master, float* m, float* v);
  // The parameters rounded again from this rank's master (`p`, or, partitioned,
  // `ps`): a speculative update's parameters undone.
  Status RestoreParams(size_t s);
  // Partitioned: every rank's `ps` all-gathered into the full parameters `p`
  // (a collective; the step thread, with no optimizer job on the shard).
  Status GatherParams(size_t s);
  // The shards as the checkpoint code reads and writes them.
  std::vector<CheckpointShard> CheckpointShards();
  // A parameter's fp32 master weights by its Hugging Face name.
  Result<std::vector<float>> Parameter(const std::string& hf_name);

 private:
  ModelState(TierStore* store, models::ModelSpec spec, Layout layout);
  Status CreateShards(const Plan& plan);
  Status CreateCheckpoints(const Plan& plan);
  Status CreateSpeculativeSets();
  Status WriteThrough(TensorId id, TierKind home);

  TierStore* store_;
  models::ModelSpec spec_;
  Layout layout_;
  std::vector<Shard> shards_;
  size_t gpu_prefix_ = 0;
  bool speculative_ = false;
  GatherFn gather_;
  std::vector<std::vector<TensorId>> checkpoints_;  // [n_layer + 1][sets]
  std::unordered_map<uint64_t, size_t> param_shard_;  // params TensorId -> shard
};

}  // namespace strata
