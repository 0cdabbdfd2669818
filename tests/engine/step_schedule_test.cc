// SPDX-License-Identifier: Apache-2.0
// RecordStepSchedule (engine/step_schedule.h): the step's access schedule is
// what its passes acquire and release, recorded, with each unit's first
// parameters acquire marked as a refresh and an unwanted write as a discard.
#include "engine/step_schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "engine/model_state.h"
#include "engine/step_buffers.h"
#include "kernels/backend.h"
#include "models/gpt2.h"
#include "models/model_program.h"
#include "tests/test_util.h"
#include "tiers/tier_store.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;

struct Recorded {
  std::vector<std::string> events;  // "+name mode[ refresh]" / "-name[ discard]"
  AccessSchedule schedule;
};

// An n-block GPT (d 32) with its parameters homed on the host (every block
// streamed), its checkpoints on the GPU, the optimizer on the host; the
// step's schedule for `micro_batches` x batch 2 x 16 tokens.
Recorded Record(int n_layer, int64_t micro_batches, bool layer_major, DType dtype) {
  Recorded out;
  TierStoreOptions o;
  o.gpu_tier.stand_in = true;
  o.gpu_tier.budget_bytes = 64 * kMiB;
  o.host_tier.budget_bytes = 64 * kMiB;
  o.host_tier.pin = false;
  o.copy.stand_in = true;
  auto store = TierStore::Open(o);
  EXPECT_THAT(store, IsOk());
  if (!store.ok()) return out;
  models::GptConfig g;
  g.n_layer = n_layer, g.n_embd = 32, g.n_head = 4, g.vocab_size = 128, g.seq_len = 16;
  auto spec = models::Gpt2Spec(g);
  EXPECT_THAT(spec, IsOk());
  if (!spec.ok()) return out;
  std::unique_ptr<kernels::Backend> backend = kernels::MakeCpuBackend(1);
  auto program = models::ModelProgram::Make(backend.get(), *spec, 2, 16, dtype);
  EXPECT_THAT(program, IsOk());
  if (!program.ok()) return out;
  Plan plan;
  plan.optimizer = plan.grads = plan.params = TierKind::kHost;
  plan.params_resident = false;
  plan.checkpoints = TierKind::kGpu;
  const DType grad_dtype = dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
  ModelState::Layout lay{dtype, grad_dtype, 2, 16, micro_batches, layer_major};
  auto state = ModelState::Create(store->get(), *spec, plan, lay, false);
  EXPECT_THAT(state, IsOk());
  if (!state.ok()) return out;
  StepBuffers::Sizes z;
  z.block_scratch = program->block_scratch_bytes();
  z.head_scratch = program->head_scratch_bytes();
  z.batch = 2, z.seq = 16, z.micro_batches = micro_batches;
  z.residual_sets = layer_major ? micro_batches : 1;
  z.dtype = dtype;
  z.accumulators = !lay.grad_is_accumulator();
  auto buffers = StepBuffers::Allocate((*store)->gpu_tier(), *spec, z);
  EXPECT_THAT(buffers, IsOk());
  if (!buffers.ok()) return out;
  auto s = RecordStepSchedule(*program, state->get(), &*buffers, backend.get(), StepShape{micro_batches, layer_major},
                              **store);
  EXPECT_THAT(s, IsOk());
  if (!s.ok()) return out;
  out.schedule = std::move(*s);
  for (const ScheduleEvent& e : out.schedule.events()) {
    const std::string& name = out.schedule.tensors()[e.tensor].name;
    if (e.type == ScheduleEvent::kAcquire) {
      out.events.push_back("+" + name + " " + std::string(AccessName(e.access)) + (e.refresh ? " refresh" : ""));
    } else {
      out.events.push_back("-" + name + (e.discard ? " discard" : ""));
    }
  }
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& e : v) s += e + "\n";
  return s;
}

// One block, one micro-batch, fp32 (the gradients are the store's own
// tensors, accumulated in place): the whole step, event by event.
TEST(StepSchedule, IsWhatThePassesAccessInOrder) {
  const Recorded r = Record(1, 1, true, DType::kF32);
  const std::vector<std::string> want = {
      // forward: the embedding writes x0, block 0 reads it and writes x1
      "+emb.p read refresh", "+x0.0 write-discard", "-x0.0", "-emb.p",
      "+blk0.p read refresh", "+x0.0 read", "+x1.0 write-discard", "-x0.0", "-x1.0", "-blk0.p",
      // head: the tied embedding and ln_f over x1; their gradients
      "+emb.p read", "+lnf.p read refresh", "+emb.g write-discard", "+lnf.g write-discard", "+x1.0 read",
      "-x1.0", "-lnf.p", "-emb.p", "-lnf.g",
      // backward of block 0 from its checkpoint x0
      "+blk0.p read", "+blk0.g write-discard", "+x0.0 read", "-x0.0", "-blk0.g", "-blk0.p",
      // the embedding's gradient completes with the token scatter
      "-emb.g"};
  EXPECT_EQ(Join(r.events), Join(want));
}

// Whatever the shape: each acquire is released in the same step, each
// unit's parameters are refreshed exactly once (at their first use), the
// gradients are written, and the counts match the passes (layer-major: each
// checkpoint once per micro-batch both ways).
TEST(StepSchedule, RefreshesEachUnitsParametersOnceAndBalancesEveryAcquire) {
  struct Shape {
    int layers;
    int64_t micro;
    bool layer_major;
    DType dtype;
  };
  for (const Shape& sh : {Shape{2, 1, true, DType::kF32}, Shape{3, 2, true, DType::kF32},
                          Shape{2, 3, false, DType::kF32}, Shape{2, 2, true, DType::kBF16},
                          Shape{3, 2, false, DType::kBF16}}) {
    SCOPED_TRACE("layers " + std::to_string(sh.layers) + ", micro-batches " + std::to_string(sh.micro) +
                 (sh.layer_major ? ", layer-major, " : ", micro-batch-major, ") + std::string(DTypeName(sh.dtype)));
    const Recorded r = Record(sh.layers, sh.micro, sh.layer_major, sh.dtype);
    ASSERT_FALSE(r.events.empty());
    std::map<uint32_t, int> held, refreshes, acquires;
    for (const ScheduleEvent& e : r.schedule.events()) {
      const std::string& name = r.schedule.tensors()[e.tensor].name;
      if (e.type == ScheduleEvent::kAcquire) {
        ++held[e.tensor];
        ++acquires[e.tensor];
        if (e.refresh) {
          ++refreshes[e.tensor];
          EXPECT_EQ(acquires[e.tensor], 1) << name << ": a refresh after its first use";
        }
      } else {
        EXPECT_GT(held[e.tensor]--, 0) << name << " released while not held";
      }
    }
    for (const auto& [t, n] : held) EXPECT_EQ(n, 0) << r.schedule.tensors()[t].name << " still held";
    int param_tensors = 0;
    for (uint32_t t = 0; t < r.schedule.tensors().size(); ++t) {
      const std::string& name = r.schedule.tensors()[t].name;
      const bool params = name.size() > 2 && name.substr(name.size() - 2) == ".p";
      EXPECT_EQ(refreshes[t], params ? 1 : 0) << name;
      param_tensors += params;
    }
    EXPECT_EQ(param_tensors, sh.layers + 2);  // the embedding, the blocks, ln_f
    // Each block's parameters: layer-major once forward and once backward;
    // micro-batch-major once each way per micro-batch.
    const int per_pass = sh.layer_major ? 1 : static_cast<int>(sh.micro);
    for (uint32_t t = 0; t < r.schedule.tensors().size(); ++t) {
      const std::string& name = r.schedule.tensors()[t].name;
      if (name.rfind("blk", 0) == 0 && name.substr(name.size() - 2) == ".p") {
        EXPECT_EQ(acquires[t], 2 * per_pass) << name;
      }
    }
  }
}

}  // namespace
}  // namespace strata
