// SPDX-License-Identifier: Apache-2.0
// Optimizer state homed on NVMe, updated by strata's CPU Adam, from a project
// of its own that found an installed strata with find_package(strata) and
// links strata::tiers and strata::optim.
//
// A tiny "model" of kLayers shards of kN fp32 parameters fits targets t by
// minimizing 0.5 * sum (p - t)^2 (gradient p - t). Each shard's fp32 master
// weights and Adam moments live in a TierStore with their home on NVMe (a
// directory: argv[1], else a fresh one under /var/tmp) and stream through
// host memory every step:
//   1. prefetch the masters, compute each gradient and its statistics;
//      the global norm gives the clip coefficient and the gradient multiplier
//   2. per shard: acquire master/m/v on the host tier, CpuAdam::Step (with an
//      fp16 copy of the new parameters, what a GPU would upload), release
//      them dirty, evict the host copies (written back to NVMe)
// Prints the loss per step; exits 1 unless it fell by more than half.
//
//   offload_adam [DIR]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <strata/base/status.h>
#include <strata/optim/cpu_adam.h>
#include <strata/optim/grad_clip.h>
#include <strata/tiers/tier_store.h>

namespace {

using strata::Access;
using strata::Result;
using strata::Status;
using strata::TensorId;
using strata::TierKind;
using strata::TierStore;

constexpr int kLayers = 4;
constexpr int64_t kN = 5000;  // not a multiple of the SIMD width
constexpr int kSteps = 8;
constexpr double kMaxNorm = 10.0;

struct Shard {
  TensorId master, m, v;
  std::vector<float> target, grad;
  std::vector<uint16_t> param_f16;
};

Result<std::unique_ptr<TierStore>> OpenStore(const std::string& dir) {
  strata::TierStoreOptions o;
  o.gpu = false;
  o.host_tier.budget_bytes = 4 << 20;  // room for all kLayers x 3 x kN x 4 bytes of state; it streams
  // because the loop evicts each shard's host copies after its update (step 2)
  o.host_tier.slab_bytes = 4 << 20;
  o.host_tier.pin = false;
  o.staging_chunk_bytes = 64 << 10;
  o.staging_buffers = 2;
  o.staging_per_move = 2;
  strata::NvmeOptions nvme;
  nvme.dirs = {dir};
  nvme.capacity_bytes = 64 << 20;
  nvme.block_size = 256 << 10;
  nvme.buffered_fallback = true;  // tmpfs refuses O_DIRECT
  o.nvme = nvme;
  return TierStore::Open(std::move(o));
}

// Adam's first step divides by sqrt(v) ~ |g|: every parameter moves by about
// lr, so lr 0.05 from p = 0 to |t| <= 1 needs a few dozen steps; 8 halve the loss.
Status Run(const std::string& dir) {
  ASSIGN_OR_RETURN(auto store, OpenStore(dir));
  ASSIGN_OR_RETURN(auto adam, strata::optim::CpuAdam::Create({.threads = 2}));
  std::printf("cpu adam: %s, %d threads; state on nvme in %s\n",
              std::string(strata::optim::IsaName(adam->isa())).c_str(), adam->threads(), dir.c_str());

  std::vector<Shard> shards(kLayers);
  const std::vector<float> zeros(kN, 0.f);
  for (int l = 0; l < kLayers; ++l) {
    Shard& s = shards[l];
    TensorId* ids[] = {&s.master, &s.m, &s.v};
    const char* kinds[] = {"master", "exp_avg", "exp_avg_sq"};
    for (int k = 0; k < 3; ++k) {
      std::string name = "layer" + std::to_string(l) + "." + kinds[k];
      ASSIGN_OR_RETURN(*ids[k], store->Create(name, strata::DType::kF32, strata::Shape{kN}, TierKind::kNvme));
      RETURN_IF_ERROR(store->Write(*ids[k], zeros.data(), kN * sizeof(float)));
      ASSIGN_OR_RETURN(auto evicted, store->Evict(*ids[k], TierKind::kHost));  // onto the NVMe file
      RETURN_IF_ERROR(evicted.Wait());
    }
    s.target.resize(kN);
    for (int64_t i = 0; i < kN; ++i) s.target[i] = std::sin(0.01f * i + l);
    s.grad.resize(kN);
    s.param_f16.resize(kN);
  }

  double first_loss = -1, loss = 0;
  for (int step = 1; step <= kSteps; ++step) {
    // 1. gradients and their global statistics
    strata::optim::GradStats total;
    loss = 0;
    for (Shard& s : shards) {
      ASSIGN_OR_RETURN(auto prefetched, store->Prefetch(s.master, TierKind::kHost));
      RETURN_IF_ERROR(prefetched.Wait());
      ASSIGN_OR_RETURN(auto view, store->Acquire(s.master, TierKind::kHost, Access::kRead));
      const float* p = static_cast<const float*>(view.data);
      for (int64_t i = 0; i < kN; ++i) {
        s.grad[i] = p[i] - s.target[i];
        loss += 0.5 * s.grad[i] * s.grad[i];
      }
      RETURN_IF_ERROR(store->Release(s.master, TierKind::kHost, /*dirty=*/false));
      ASSIGN_OR_RETURN(auto stats, adam->ComputeGradStats(s.grad.data(), strata::DType::kF32, kN));
      total.Merge(stats);
    }
    if (first_loss < 0) first_loss = loss;
    double norm = strata::optim::GlobalGradNorm(total, /*loss_scale=*/1.0);
    double coef = strata::optim::ClipCoefficient(norm, kMaxNorm);
    std::printf("step %d: loss %.3f, grad norm %.3f, clip coefficient %.4f\n", step, loss, norm, coef);

    // 2. the update, shard by shard, through host memory
    strata::optim::AdamHyper hyper;
    hyper.lr = 0.05;
    hyper.weight_decay = 0.01;
    hyper.step = step;
    for (Shard& s : shards) {
      for (TensorId id : {s.m, s.v}) {
        ASSIGN_OR_RETURN(auto prefetched, store->Prefetch(id, TierKind::kHost));
        RETURN_IF_ERROR(prefetched.Wait());
      }
      ASSIGN_OR_RETURN(auto master, store->Acquire(s.master, TierKind::kHost, Access::kReadWrite));
      ASSIGN_OR_RETURN(auto m, store->Acquire(s.m, TierKind::kHost, Access::kReadWrite));
      ASSIGN_OR_RETURN(auto v, store->Acquire(s.v, TierKind::kHost, Access::kReadWrite));
      strata::optim::AdamShard shard;
      shard.n = kN;
      shard.master = static_cast<float*>(master.data);
      shard.exp_avg = m.data;
      shard.exp_avg_sq = v.data;
      shard.grad = s.grad.data();
      shard.grad_dtype = strata::DType::kF32;
      shard.param_out = s.param_f16.data();
      shard.param_out_dtype = strata::DType::kF16;
      auto stepped = adam->Step(shard, hyper, {.grad_scale = strata::optim::GradMultiplier(1.0, coef)});
      for (TensorId id : {s.master, s.m, s.v}) {
        RETURN_IF_ERROR(store->Release(id, TierKind::kHost, /*dirty=*/stepped.ok()));
      }
      RETURN_IF_ERROR(stepped.status());
      for (TensorId id : {s.master, s.m, s.v}) {
        ASSIGN_OR_RETURN(auto evicted, store->Evict(id, TierKind::kHost));  // written back home
        RETURN_IF_ERROR(evicted.Wait());
      }
    }
  }

  strata::TierStoreStats stats = store->stats();
  std::printf("host->nvme %llu bytes, nvme->host %llu bytes\n",
              static_cast<unsigned long long>(stats.host_to_nvme.bytes),
              static_cast<unsigned long long>(stats.nvme_to_host.bytes));
  if (!(loss < 0.5 * first_loss)) {
    return strata::Internal("the loss did not halve: " + std::to_string(first_loss) + " -> " +
                            std::to_string(loss));
  }
  std::printf("loss %.3f -> %.3f\n", first_loss, loss);
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (argc > 1) {
    dir = argv[1];
  } else {
    char tmpl[] = "/var/tmp/strata-example-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 2;
    }
    dir = tmpl;
  }
  Status s = Run(dir);  // the store is closed (its files removed) when Run returns
  if (argc <= 1) rmdir(dir.c_str());
  if (!s.ok()) {
    std::fprintf(stderr, "offload_adam: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
