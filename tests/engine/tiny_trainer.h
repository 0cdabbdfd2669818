// SPDX-License-Identifier: Apache-2.0
// The small GPT the trainer tests train: n_layer blocks of width n_embd, 4
// heads, byte vocabulary, 32 or 64 tokens, micro-batch 4 x accumulation 2
// over the bundled corpus, AdamW at lr 3e-3, quiet logging. Each test then
// sets what it is about (backend, budgets, offload devices, dtypes).
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "engine/config.h"
#include "engine/trainer.h"
#include "tests/test_util.h"

namespace strata::testing {

inline TrainOptions TinyTrainer(int64_t n_layer, int64_t n_embd = 64, int64_t seq_len = 32) {
  TrainOptions o;
  Config& c = o.config;
  c.model.n_layer = static_cast<int>(n_layer);
  c.model.n_embd = static_cast<int>(n_embd);
  c.model.n_head = 4;
  c.model.vocab_size = 256;
  c.model.seq_len = static_cast<int>(seq_len);
  c.micro_batch = 4;
  c.grad_accum = 2;
  c.train_batch_size = 8;
  c.optimizer.lr = 3e-3;
  c.steps_per_print = 1000;
  c.data.path = SourcePath("data/kjv.txt");
  return o;
}

// The CUDA tests' trainer: 3 blocks of d 128 over 64 tokens, AdamW with
// weight decay, the optimizer state on the host, gradient clipping at `clip`
// (0: none).
inline TrainOptions TinyGpuTrainer(bool bf16, double clip) {
  TrainOptions o = TinyTrainer(3, 128, 64);
  Config& c = o.config;
  c.bf16 = bf16;
  c.optimizer.weight_decay = 0.1;
  c.gradient_clipping = clip;
  c.zero.offload_optimizer.device = "cpu";
  o.backend = "cuda";
  // (The limit covers the CUDA context and libraries too: about 0.6 GiB.)
  o.gpu_memory_limit = 1536 * kMiB;
  o.host_memory_limit = 1 * kGiB;
  return o;
}

// The named parameters of `t` (Trainer::Parameter), in order; an error fails
// the calling test (ADD_FAILURE) and leaves that entry empty.
inline std::vector<std::vector<float>> Parameters(Trainer& t, const std::vector<std::string>& names) {
  std::vector<std::vector<float>> out;
  for (const std::string& n : names) {
    auto p = t.Parameter(n);
    if (!p.ok()) ADD_FAILURE() << "Parameter(" << n << "): " << p.status().ToString();
    out.push_back(p.ok() ? std::move(p).value() : std::vector<float>{});
  }
  return out;
}

inline std::string FileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// What a run gives, for comparing update modes bit for bit (Train).
struct Outcome {
  std::vector<StepReport> reports;
  double val_loss = 0;             // after the last step: uses the parameters the last update wrote
  std::string model, optimizer;    // the checkpoint's files: master weights, moments
  TrainerInfo info;
  std::string plan, log;
  bool grads_on_host = false;  // (and the parameters streamed)
};

// The losses of `steps` more steps of `t`; a failed step fails the
// calling test and is left out.
inline std::vector<double> StepLosses(Trainer& t, int steps) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    auto r = t.Step();
    EXPECT_OK(r.status()) << "step " << i + 1;
    if (r.ok()) losses.push_back(r->loss);
  }
  return losses;
}

// `steps` steps of a new trainer, then a checkpoint (which waits for the
// last update) and a validation loss. Errors fail the calling test and end
// the run early.
inline Outcome Train(const TrainOptions& o, int64_t steps) {
  Outcome out;
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return out;
  out.plan = (*t)->PlanTable();
  out.grads_on_host = (*t)->plan().grads == TierKind::kHost && !(*t)->plan().params_resident;
  for (int64_t i = 0; i < steps; ++i) {
    auto r = (*t)->Step();
    EXPECT_OK(r.status()) << "step " << i + 1;
    if (!r.ok()) return out;
    out.reports.push_back(*r);
  }
  TempDir ck;
  EXPECT_OK((*t)->Save(ck.path()));  // waits for the last update
  const std::string step_dir = ck.path() + "/step-" + [&] {
    char b[16];
    std::snprintf(b, sizeof b, "%06lld", static_cast<long long>(steps));
    return std::string(b);
  }();
  out.model = FileBytes(step_dir + "/master.safetensors");
  out.optimizer = FileBytes(step_dir + "/optimizer.safetensors");
  EXPECT_FALSE(out.model.empty());
  EXPECT_FALSE(out.optimizer.empty());
  auto v = (*t)->Evaluate(1);
  EXPECT_OK(v.status());
  out.val_loss = v.ok() ? *v : 0;
  out.info = (*t)->Info();
  out.log = log.str();
  return out;
}

// The same losses, norms, learning rates, validation loss and checkpoint
// bytes; with `same_bytes` the same PCIe bytes per step too.
inline void ExpectSameBits(const Outcome& a, const Outcome& b, bool same_bytes) {
  ASSERT_EQ(a.reports.size(), b.reports.size());
  for (size_t i = 0; i < a.reports.size(); ++i) {
    const StepReport& x = a.reports[i];
    const StepReport& y = b.reports[i];
    EXPECT_EQ(x.loss, y.loss) << "step " << i + 1;
    EXPECT_EQ(x.grad_norm, y.grad_norm) << "step " << i + 1;
    EXPECT_EQ(x.lr, y.lr) << "step " << i + 1;
    if (same_bytes && i > 0) {
      // The previous update's copies count in each step whenever they ran.
      // (Not the first step's: it counts the prefetches that the trainer's
      // creation starts or not before its counters are read.)
      EXPECT_EQ(x.h2d, y.h2d) << "step " << i + 1;
      EXPECT_EQ(x.d2h, y.d2h) << "step " << i + 1;
    }
  }
  EXPECT_EQ(a.val_loss, b.val_loss);
  EXPECT_TRUE(a.model == b.model) << "master weights differ";
  EXPECT_TRUE(a.optimizer == b.optimizer) << "moments differ";
}

}  // namespace strata::testing
