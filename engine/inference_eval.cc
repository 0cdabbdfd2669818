// SPDX-License-Identifier: Apache-2.0
#include "engine/inference_eval.h"

#include <algorithm>

#include "engine/evaluation.h"
#include "models/model_program.h"
#include "models/pass_env.h"

namespace strata {

namespace {

using kernels::DeviceBuffer;
using models::PassTensor;

// The evaluation pass's environment over resident parameters.
class ResidentEvalEnv final : public models::PassEnv {
 public:
  ResidentEvalEnv(const InferenceModel& m, DeviceBuffer* acts, DeviceBuffer* scratch, DeviceBuffer* tokens,
                  DeviceBuffer* targets, DeviceBuffer* losses)
      : m_(m), acts_(acts), scratch_(scratch), tokens_(tokens), targets_(targets), losses_(losses) {}

  Result<void*> Acquire(const PassTensor& t, Access) override {
    if (t.role == PassTensor::kCheckpoint) return acts_[t.layer % 2].data();
    return const_cast<void*>(m_.units[static_cast<size_t>(t.unit)].data());
  }
  Status Release(const PassTensor&, bool) override { return Status::OK(); }
  Result<models::GradTarget> BeginGrads(int, const models::MicroBatches&) override {
    return Internal("evaluation computes no gradients");
  }
  Status EndGrads(int, const models::MicroBatches&, const models::GradTarget&) override {
    return Internal("evaluation computes no gradients");
  }
  const int32_t* tokens(int64_t) override { return tokens_->as<int32_t>(); }
  const int32_t* targets(int64_t) override { return targets_->as<int32_t>(); }
  float* losses(int64_t) override { return losses_->as<float>(); }
  void* residual_grad(int64_t) override { return nullptr; }
  float dloss() const override { return 1.f; }
  models::ScratchSpace block_scratch() override { return {scratch_->data(), scratch_->bytes()}; }
  models::ScratchSpace head_scratch() override { return {scratch_->data(), scratch_->bytes()}; }
  bool keep_last_block() const override { return false; }

 private:
  const InferenceModel& m_;
  DeviceBuffer* acts_;  // two
  DeviceBuffer *scratch_, *tokens_, *targets_, *losses_;
};

}  // namespace

Result<double> EvaluateModel(const InferenceModel& model, kernels::Backend* backend, DataLoader* data,
                             int64_t batch, int64_t seq, int64_t batches) {
  ASSIGN_OR_RETURN(models::ModelProgram program,
                   models::ModelProgram::Make(backend, model.spec, batch, seq, model.dtype));
  const size_t N = static_cast<size_t>(batch * seq);
  const size_t x_bytes = N * static_cast<size_t>(model.spec.d_model) * DTypeSize(model.dtype);
  DeviceBuffer acts[2], scratch, tokens, targets, losses;
  for (DeviceBuffer& a : acts) {
    ASSIGN_OR_RETURN(a, backend->Allocate(x_bytes));
  }
  ASSIGN_OR_RETURN(scratch, backend->Allocate(std::max(program.block_scratch_bytes(), program.head_scratch_bytes())));
  ASSIGN_OR_RETURN(tokens, backend->Allocate(N * 4));
  ASSIGN_OR_RETURN(targets, backend->Allocate(N * 4));
  ASSIGN_OR_RETURN(losses, backend->Allocate(N * 4));
  ResidentEvalEnv env(model, acts, &scratch, &tokens, &targets, &losses);
  return MeanValLoss(program, env, backend, EvalBuffers{tokens.data(), targets.data(), losses.data()}, data, batches);
}

}  // namespace strata
