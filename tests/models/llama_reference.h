// SPDX-License-Identifier: Apache-2.0
// The transformers reference for the Llama family (tests/data/llama_tiny_ref
// .safetensors, or the file named by STRATA_LLAMA_REF): its config, its
// parameters imported into a ResidentModel, and a backend's loss and every
// gradient measured against it. Backend-agnostic, so the CUDA test runs the
// same check.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/safetensors.h"
#include "kernels/backend.h"
#include "models/llama.h"
#include "models/resident_model.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/test_util.h"

namespace strata::models::testing {

inline std::string LlamaReferencePath() {
  const char* env = std::getenv("STRATA_LLAMA_REF");
  return env && *env ? env : ::strata::testing::SourcePath("tests/data/llama_tiny_ref.safetensors");
}

struct LlamaReference {
  LlamaConfig config;
  int64_t batch = 0;
  std::vector<int32_t> tokens, targets;
  double loss = 0;
};

// The model make_llama_ref.py describes in the file's `config` metadata.
inline Result<LlamaConfig> LlamaConfigOfReference(const nlohmann::json& j) {
  LlamaConfig c;
  c.n_layer = j.at("n_layer");
  c.n_embd = j.at("n_embd");
  c.n_head = j.at("n_head");
  c.n_kv_head = j.at("n_kv_head");
  c.intermediate_size = j.at("ffn_dim");
  c.vocab_size = j.at("vocab_size");
  c.seq_len = j.at("seq_len");
  c.rms_norm_eps = j.at("rms_norm_eps").get<float>();
  c.rope.theta = j.at("rope_theta").get<float>();
  c.tie_word_embeddings = j.at("tied_lm_head").get<bool>();
  return c;
}

inline Result<LlamaReference> LoadLlamaReference(const SafetensorsFile& f) {
  LlamaReference r;
  auto it = f.metadata().find("config");
  if (it == f.metadata().end()) return NotFound("no config in " + f.path());
  const nlohmann::json j = nlohmann::json::parse(it->second);
  ASSIGN_OR_RETURN(r.config, LlamaConfigOfReference(j));
  r.batch = j.at("batch");
  ASSIGN_OR_RETURN(r.tokens, f.ReadI32("input_ids"));
  ASSIGN_OR_RETURN(r.targets, f.ReadI32("targets"));
  ASSIGN_OR_RETURN(std::vector<double> loss, f.ReadF64("loss"));
  r.loss = loss.at(0);
  return r;
}

inline Status ImportLlamaReference(const SafetensorsFile& f, ResidentModel* m) {
  for (const ParamSpec& t : m->spec().params) {
    ASSIGN_OR_RETURN(std::vector<double> v, f.ReadF64("param." + t.name));
    RETURN_IF_ERROR(m->SetParameter(t.name, v.data(), DType::kF64, static_cast<int64_t>(v.size())));
  }
  return Status::OK();
}

// A parameter's kind: its HF name without the layer,
// "model.layers.1.mlp.up_proj.weight" -> "layers.mlp.up_proj.weight".
inline std::string LlamaTensorKind(const std::string& name) {
  std::string s = name.rfind("model.", 0) == 0 ? name.substr(6) : name;
  if (s.rfind("layers.", 0) == 0) {
    const size_t dot = s.find('.', 7);
    if (dot != std::string::npos) s = "layers" + s.substr(dot);
  }
  return s;
}

struct LlamaErrors {
  double loss = 0;                     // relative
  std::map<std::string, double> grad;  // by LlamaTensorKind: worst ||g - ref|| / ||ref|| over the layers
  int tensors = 0;                     // gradients compared
};

// ResidentModel on `backend` (parameters/activations in `dtype`, gradients
// in `grad_dtype`) on the reference's batch, against the reference.
inline void MeasureLlama(kernels::Backend* backend, DType dtype, DType grad_dtype, LlamaErrors* out) {
  SCOPED_TRACE(::testing::Message() << "dtype " << DTypeName(dtype) << ", file " << LlamaReferencePath());
  ASSERT_OK_AND_ASSIGN(SafetensorsFile f, SafetensorsFile::Open(LlamaReferencePath()));
  ASSERT_OK_AND_ASSIGN(LlamaReference ref, LoadLlamaReference(f));
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(ref.config));
  ResidentModel::Options o;
  o.dtype = dtype;
  o.grad_dtype = grad_dtype;
  o.batch = ref.batch;
  ASSERT_OK_AND_ASSIGN(auto model, ResidentModel::Create(backend, spec, o));
  ASSERT_OK(ImportLlamaReference(f, model.get()));
  ASSERT_OK_AND_ASSIGN(double loss, model->ForwardBackward(ref.tokens.data(), ref.targets.data()));
  out->loss = std::fabs(loss - ref.loss) / ref.loss;
  for (const ParamSpec& t : spec.params) {
    ASSERT_OK_AND_ASSIGN(std::vector<double> want, f.ReadF64("grad." + t.name));
    ASSERT_OK_AND_ASSIGN(std::vector<double> got, model->GetGradient(t.name));
    double& e = out->grad[LlamaTensorKind(t.name)];
    e = std::max(e, kernels::testing::RelError(got, want));
    ++out->tensors;
  }
}

// The loss within loss_tol and every kind's gradient within grad_tol; prints the worst.
inline void CheckLlamaAgainstReference(kernels::Backend* backend, DType dtype, DType grad_dtype, double loss_tol,
                                       double grad_tol) {
  LlamaErrors e;
  ASSERT_NO_FATAL_FAILURE(MeasureLlama(backend, dtype, grad_dtype, &e));
  EXPECT_LE(e.loss, loss_tol) << "loss";
  double worst = 0;
  std::string worst_kind;
  for (const auto& [kind, err] : e.grad) {
    EXPECT_LE(err, grad_tol) << "gradient of " << kind;
    if (err >= worst) worst = err, worst_kind = kind;
  }
  std::printf("[ llama reference ] %s on %s: loss rel %.2e (bound %.1e); worst gradient %s %.2e (bound %.1e), %d tensors\n",
              std::string(DTypeName(dtype)).c_str(), backend->name().c_str(), e.loss, loss_tol, worst_kind.c_str(), worst, grad_tol,
              e.tensors);
}

}  // namespace strata::models::testing
