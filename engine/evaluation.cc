// SPDX-License-Identifier: Apache-2.0
#include "engine/evaluation.h"

#include "models/passes.h"

namespace strata {

namespace {

using models::PassTensor;

class EvalEnv final : public models::PassEnv {
 public:
  explicit EvalEnv(const EvalContext& c) : c_(c) {}

  Result<void*> Acquire(const PassTensor& t, Access) override {
    if (t.role == PassTensor::kCheckpoint) return t.layer % 2 == 0 ? c_.buffers->eval_x.data() : c_.buffers->dx[0].data();
    if (c_.gather) return c_.gather->Acquire(static_cast<size_t>(t.unit));
    const Shard& sh = c_.state->shard(static_cast<size_t>(t.unit));
    if (sh.kind == models::UnitKind::kBlock && sh.layer + 1 < c_.model->spec().n_layer)
      (void)c_.store->Prefetch(c_.state->shard(static_cast<size_t>(t.unit) + 1).p, TierKind::kGpu);
    ASSIGN_OR_RETURN(TensorView v, c_.store->Acquire(sh.p, TierKind::kGpu, Access::kRead));
    return v.data;
  }
  Status Release(const PassTensor& t, bool) override {
    if (t.role == PassTensor::kCheckpoint) return Status::OK();
    if (c_.gather) return c_.gather->Release(static_cast<size_t>(t.unit));
    const Shard& sh = c_.state->shard(static_cast<size_t>(t.unit));
    RETURN_IF_ERROR(c_.store->Release(sh.p, TierKind::kGpu, false, c_.backend->native_stream()));
    if (sh.kind == models::UnitKind::kBlock && sh.p_home != TierKind::kGpu && !c_.params_resident)
      return c_.store->Evict(sh.p, TierKind::kGpu).status();
    return Status::OK();
  }
  Result<models::GradTarget> BeginGrads(int, const models::MicroBatches&) override {
    return Internal("evaluation computes no gradients");
  }
  Status EndGrads(int, const models::MicroBatches&, const models::GradTarget&) override {
    return Internal("evaluation computes no gradients");
  }
  const int32_t* tokens(int64_t) override { return c_.buffers->tokens.as<int32_t>(); }
  const int32_t* targets(int64_t) override { return c_.buffers->targets.as<int32_t>(); }
  float* losses(int64_t) override { return c_.buffers->losses.as<float>(); }
  void* residual_grad(int64_t) override { return nullptr; }
  float dloss() const override { return 1.f; }
  models::ScratchSpace block_scratch() override {
    return {c_.buffers->block_scratch.data(), static_cast<size_t>(c_.buffers->block_scratch.bytes())};
  }
  models::ScratchSpace head_scratch() override {
    return {c_.buffers->head_scratch.data(), static_cast<size_t>(c_.buffers->head_scratch.bytes())};
  }
  bool keep_last_block() const override { return false; }

 private:
  const EvalContext& c_;
};

}  // namespace

Result<double> MeanValLoss(const models::ModelProgram& model, models::PassEnv& env, kernels::Backend* backend,
                           const EvalBuffers& buffers, DataLoader* data, int64_t batches) {
  const size_t BT = static_cast<size_t>(model.batch() * model.seq());
  std::vector<int32_t> tok(BT), tgt(BT);
  std::vector<float> losses(BT);
  double total = 0;
  int64_t count = 0;
  for (int64_t bi = 0; bi < batches; ++bi) {
    RETURN_IF_ERROR(data->Val(static_cast<uint64_t>(bi), tok.data(), tgt.data()));
    RETURN_IF_ERROR(backend->CopyToDevice(buffers.tokens, tok.data(), BT * 4));
    RETURN_IF_ERROR(backend->CopyToDevice(buffers.targets, tgt.data(), BT * 4));
    RETURN_IF_ERROR(models::Evaluate(model, env, models::MicroBatches{}));
    RETURN_IF_ERROR(backend->Synchronize());
    RETURN_IF_ERROR(backend->CopyToHost(losses.data(), buffers.losses, BT * 4));
    for (size_t i = 0; i < BT; ++i)
      if (tgt[i] >= 0) total += losses[i], ++count;
  }
  return count ? total / static_cast<double>(count) : 0.0;
}

Result<double> EvaluateLoss(const EvalContext& ctx, DataLoader* data, int64_t batches) {
  EvalEnv env(ctx);
  const EvalBuffers b{ctx.buffers->tokens.data(), ctx.buffers->targets.data(), ctx.buffers->losses.data()};
  return MeanValLoss(*ctx.model, env, ctx.backend, b, data, batches);
}

}  // namespace strata
