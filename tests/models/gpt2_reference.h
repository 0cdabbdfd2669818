// The transformers reference for the GPT model (tests/data/gpt2_tiny_ref
// .safetensors, or the file named by STRATA_GPT2_REF): load it, import its
// parameters, and check a backend's loss and every gradient against it.
// Backend-agnostic, so the CUDA tests can run the same check:
//   CheckGptAgainstReference(cuda.get(), DType::kBF16, DType::kF32, 1e-3, 5e-2);
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/safetensors.h"
#include "kernels/backend.h"
#include "models/gpt2.h"
#include "models/resident_model.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/models/model_test_util.h"
#include "tests/test_util.h"

namespace strata::models::testing {

using kernels::Backend;
using kernels::testing::RelError;

inline std::string ReferencePath() {
  const char* env = std::getenv("STRATA_GPT2_REF");
  return env && *env ? env : ::strata::testing::SourcePath("tests/data/gpt2_tiny_ref.safetensors");
}

struct Reference {
  GptConfig config;
  int64_t batch = 0;
  std::vector<int32_t> tokens, targets;
  double loss = 0;
};

inline Result<Reference> LoadReference(const SafetensorsFile& f) {
  Reference r;
  auto it = f.metadata().find("config");
  if (it == f.metadata().end()) return NotFound("no config in " + f.path());
  nlohmann::json j = nlohmann::json::parse(it->second);
  r.config.n_layer = j.at("n_layer");
  r.config.n_embd = j.at("n_embd");
  r.config.n_head = j.at("n_head");
  r.config.vocab_size = j.at("vocab_size");
  r.config.seq_len = j.at("seq_len");
  r.config.ln_eps = j.value("layer_norm_epsilon", 1e-5f);
  r.batch = j.at("batch");
  ASSIGN_OR_RETURN(r.tokens, f.ReadI32("input_ids"));
  ASSIGN_OR_RETURN(r.targets, f.ReadI32("targets"));
  ASSIGN_OR_RETURN(std::vector<double> loss, f.ReadF64("loss"));
  r.loss = loss.at(0);
  return r;
}

inline Status ImportReference(const SafetensorsFile& f, ResidentModel* m) {
  for (const ParamSpec& t : m->spec().params) {
    ASSIGN_OR_RETURN(std::vector<double> v, f.ReadF64("param." + t.name));
    RETURN_IF_ERROR(m->SetParameter(t.name, v.data(), DType::kF64, static_cast<int64_t>(v.size())));
  }
  return Status::OK();
}

// Runs ResidentModel on `backend` (parameters/activations in `dtype`, gradients in
// `grad_dtype`) on the reference's batch: the loss's relative error must be
// below loss_tol and each gradient tensor's ||g - ref|| / ||ref|| below
// grad_tol. Prints the figures.
inline void CheckGptAgainstReference(Backend* backend, DType dtype, DType grad_dtype,
                                     double loss_tol, double grad_tol) {
  SCOPED_TRACE(::testing::Message()
               << "dtype " << DTypeName(dtype) << ", file " << ReferencePath());
  ASSERT_OK_AND_ASSIGN(SafetensorsFile f, SafetensorsFile::Open(ReferencePath()));
  ASSERT_OK_AND_ASSIGN(Reference ref, LoadReference(f));
  ResidentModel::Options o;
  o.dtype = dtype;
  o.grad_dtype = grad_dtype;
  o.batch = ref.batch;
  ASSERT_OK_AND_ASSIGN(auto model, ResidentModel::Create(backend, Spec(ref.config), o));
  ASSERT_OK(ImportReference(f, model.get()));
  ASSERT_OK_AND_ASSIGN(double loss, model->ForwardBackward(ref.tokens.data(), ref.targets.data()));
  EXPECT_LT(std::fabs(loss - ref.loss) / ref.loss, loss_tol) << loss << " vs " << ref.loss;
  double worst = 0;
  std::string worst_name;
  for (const ParamSpec& t : Spec(ref.config).params) {
    ASSERT_OK_AND_ASSIGN(std::vector<double> want, f.ReadF64("grad." + t.name));
    ASSERT_OK_AND_ASSIGN(std::vector<double> got, model->GetGradient(t.name));
    const double err = RelError(got, want);
    EXPECT_LT(err, grad_tol) << t.name;
    if (err > worst) worst = err, worst_name = t.name;
  }
  std::printf(
      "[ reference ] %s on %s: loss %.12f vs %.12f (rel %.2e); worst gradient %s rel %.2e\n",
      std::string(DTypeName(dtype)).c_str(), backend->name().c_str(), loss, ref.loss,
      std::fabs(loss - ref.loss) / ref.loss, worst_name.c_str(), worst);
}

}  // namespace strata::models::testing
