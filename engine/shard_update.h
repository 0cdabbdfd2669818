// SPDX-License-Identifier: Apache-2.0
// The shard updates the optimizer's workers run (engine/optimizer_pool.h
// ShardUpdater), in place or, speculating, from a shard's current fp32
// master and m/v (fp32 or bf16: ModelState::Layout::moment_dtype) into its
// other set (which a commit then makes current); the new parameters are
// written either way.
//
//   HostShardUpdate    the CPU worker: the CPU Adam on state in host memory
//                      (or streamed from NVMe through it: read ahead,
//                      written behind as DeepSpeed's pipeline_read /
//                      pipeline_write), piece by piece (8 Mi parameters):
//                      gradients homed on the GPU come down through a
//                      staging buffer, every piece's download issued at
//                      once, and each piece is updated as soon as its own
//                      has landed; parameters homed there go up through two
//                      staging buffers, each piece's upload issued once the
//                      piece is updated (the CPU Adam writes the next
//                      shard's into one buffer while the other uploads). So
//                      a shard takes about its CPU Adam time, not the
//                      download, the update and the upload one after the
//                      other. For a shard whose state is on the GPU (the
//                      step thread's prefix of offload_optimizer.ratio < 1),
//                      the fused GPU Adam.
//   AssistShardUpdate  the GPU-assisted worker: a shard whose state lives on
//                      the host and whose parameters live on the GPU, chunk
//                      by chunk: master/m/v (and a host-resident gradient) go
//                      up on the H2D copy stream, the fused Adam runs on the
//                      D2H copy stream once they have landed and writes the
//                      new parameters in place, and master/m/v come back on
//                      the same stream after it. Three chunk buffers rotate
//                      (one going up, one updating, one coming down).
// With the state partitioned across ranks (engine/model_state.h) the CPU
// worker updates the rank's slice alone (its slice of the gradient, its
// master/m/v) and writes the slice's parameters into the shard's `ps`; the
// GPU-assisted worker is not used then.
// Both give the same bits (optim/gpu_adam.h), so which worker takes a shard
// changes nothing but the time. In the CPU backend's stand-in the same
// pipelines run with the CPU Adam on the stand-in's memory.
//
// Ownership: each owns its staging or chunk buffers (from the store's tiers)
// and borrows the store, the model state, the backend, the CPU Adam and the
// copies counter. Thread-safety: each is used by one worker (the step thread
// for the GPU-state prefix, which the workers never see).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "engine/config.h"
#include "engine/link_bytes.h"
#include "engine/model_state.h"
#include "engine/optimizer_pool.h"
#include "kernels/backend.h"
#include "optim/cpu_adam.h"
#include "tiers/tier_store.h"

namespace strata {

// What the shard updates work with.
struct ShardUpdateContext {
  TierStore* store = nullptr;
  ModelState* state = nullptr;
  kernels::Backend* backend = nullptr;
  optim::CpuAdam* adam = nullptr;
  OptimizerCopies* copies = nullptr;
  bool cuda() const { return backend->kind() == kernels::BackendKind::kCuda; }
};

class HostShardUpdate final : public ShardUpdater {
 public:
  // `piece_params` 0: 8 Mi parameters (tests use small ones).
  static Result<std::unique_ptr<HostShardUpdate>> Create(const ShardUpdateContext& ctx,
                                                         const OffloadConfig& offload_optimizer,
                                                         uint64_t piece_params = 0);
  Result<CopyTicket> Update(size_t shard, const OptJob& job, const ShardHow& how,
                            const CopyTicket& last_upload) override;
  void ReadAhead(size_t shard, const OptJob& job) override;

 private:
  static constexpr uint64_t kDefaultPieceParams = 8ull << 20;
  // The shard's gradient on the host: where the update reads it, and, homed
  // on the GPU, each piece's download into the staging buffer (pinned there
  // until they have all landed).
  struct HostGrad {
    const char* data = nullptr;  // the slice's first value
    std::vector<CopyTicket> pieces;
    TierKind pinned = TierKind::kHost;
    bool held = false;
  };
  // Where the new parameters go, and the upload of each updated piece.
  struct ParamsOut {
    char* data = nullptr;  // the host home or a staging buffer
    bool upload = false;   // homed on the GPU: uploaded piece by piece into `gpu`
    char* gpu = nullptr;
    TensorId id{};
    CopyTicket last;  // the latest piece's upload (they land in order; none: nothing went up)
    bool held = false;  // the pin on `id`
  };
  HostShardUpdate(const ShardUpdateContext& ctx, const OffloadConfig& o, uint64_t piece)
      : ctx_(ctx), offload_(o), piece_(piece) {}
  Result<CopyTicket> UpdateOnGpu(Shard& sh, const OptJob& j, const ShardHow& how);
  Status StartGradient(Shard& sh, int64_t job_step, HostGrad* g);
  Status FinishGradient(Shard& sh, HostGrad* g);
  Status StartParams(Shard& sh, ParamsOut* out);
  Status UpdatePieces(Shard& sh, const OptJob& j, const ShardHow& how, const HostGrad& g, float* w, void* m,
                      void* v, float* w2, void* m2, void* v2, ParamsOut* out);
  Result<CopyTicket> FinishParams(Shard& sh, ParamsOut* out, const Status& updated);

  ShardUpdateContext ctx_;
  OffloadConfig offload_;
  uint64_t piece_;
  TierBlock grad_staging_, param_staging_[2];
  CopyTicket param_upload_[2];
  int param_slot_ = 0;
};

class AssistShardUpdate final : public ShardUpdater {
 public:
  // Why the GPU-assisted worker cannot run on this model state ("" when it
  // can): it needs every offloaded shard's state on the host and its
  // parameters on the GPU (so one kind of worker never touches the other's
  // staging), and at least one such shard.
  static std::string Ineligible(const ModelState& state);
  // Allocates three chunk buffers in the GPU tier, if they fit beside
  // `keep_free` bytes (what the step's swap window needs at least); else
  // null, and the reason in *why. `chunk_params` 0: 4 Mi parameters (about
  // a millisecond of PCIe each way, small next to a shard, large next to a
  // copy's fixed cost).
  static Result<std::unique_ptr<AssistShardUpdate>> Create(const ShardUpdateContext& ctx, uint64_t chunk_params,
                                                           uint64_t keep_free, std::string* why);
  Result<CopyTicket> Update(size_t shard, const OptJob& job, const ShardHow& how,
                            const CopyTicket& last_upload) override;
  const char* what() const override { return " (gpu-assisted)"; }
  uint64_t chunk() const { return chunk_; }
  uint64_t buffer_bytes() const { return 3 * slots_[0].buf.bytes(); }

 private:
  explicit AssistShardUpdate(const ShardUpdateContext& ctx) : ctx_(ctx) {}
  struct Slot {
    TierBlock buf;                 // master (f32), m, v (moment dtype) and the gradient, chunk_ each
    std::vector<CopyTicket> down;  // the copies back of the chunk in it
  };
  ShardUpdateContext ctx_;
  uint64_t chunk_ = 0;  // parameters per chunk
  Slot slots_[3];
  int next_ = 0;
};

}  // namespace strata
