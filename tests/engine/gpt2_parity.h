// SPDX-License-Identifier: Apache-2.0
// The whole trainer against the independent transformers reference
// (tests/data/gpt2_tiny_ref.safetensors, or the file named by
// $STRATA_GPT2_REF): start from its parameters, take AdamW steps on its
// batch, and compare the loss, the global gradient norm, every parameter
// after one step and after the file's `adam_steps` steps (updated3.*: the
// moments, both betas and the bias corrections at t > 1), and the losses
// after them. Shared by the CPU test (gpt2_parity_test.cc) and the CUDA one
// (gpt2_parity_gpu_test.cc).
//
// The per-element bound. Adam moves a weight with gradient g by about
// lr g / (|g| + eps) per step, so an error e in an fp32 (or bf16) gradient
// shifts the update by about lr e eps / (|g| + eps)^2: nothing where
// |g| >> eps, up to the whole step where g is within rounding of zero (there
// the sign of the update is the sign of the rounding noise). The honest
// bound therefore scales with eps / (|g| + eps):
//   |got - want| <= lr k (flat + near_zero eps / (|g| + eps)) + 4 ulp(want)
// over k steps, g the reference's first gradient. A flat fraction of lr
// fails on some file of the fixture script; a relative norm alone hides an
// element that moved the wrong way. The updates as a whole are compared too:
// ||(got - p0) - (want - p0)|| / ||want - p0|| per tensor.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "engine/safetensors.h"
#include "engine/trainer.h"
#include "tests/test_util.h"

namespace strata::testing {

inline std::string Gpt2RefPath() {
  const char* env = std::getenv("STRATA_GPT2_REF");
  return env && *env ? env : SourcePath("tests/data/gpt2_tiny_ref.safetensors");
}

struct Gpt2Ref {
  SafetensorsFile file;
  nlohmann::json config, adamw;
  int adam_steps = 0;  // the k of updatedK.* / loss_after_K_steps (0: the file has only one step)
  // The parameters the file holds (param.*): every family's reference names each once.
  int n_tensors() const {
    int n = 0;
    for (const auto& e : file.entries()) n += e.name.rfind("param.", 0) == 0;
    return n;
  }
};

inline Result<Gpt2Ref> LoadGpt2Ref(const std::string& path = Gpt2RefPath()) {
  ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
  Gpt2Ref r{std::move(f), {}, {}, 0};
  auto meta = [&](const char* key) -> Result<nlohmann::json> {
    auto it = r.file.metadata().find(key);
    if (it == r.file.metadata().end()) return NotFound(std::string("no '") + key + "' metadata in " + r.file.path());
    return nlohmann::json::parse(it->second);
  };
  ASSIGN_OR_RETURN(r.config, meta("config"));
  ASSIGN_OR_RETURN(r.adamw, meta("adamw"));
  r.adam_steps = r.config.value("adam_steps", 0);
  return r;
}

// The fixture's model and AdamW on `backend` ("cpu", "cuda"), in fp32 or bf16.
// A Llama fixture (make_llama_ref.py: its config has n_kv_head) trains the
// Llama family.
inline TrainOptions Gpt2RefOptions(const Gpt2Ref& ref, const std::string& backend, bool bf16) {
  TrainOptions o;
  Config& c = o.config;
  c.model.n_layer = ref.config.at("n_layer").get<int>();
  c.model.n_embd = ref.config.at("n_embd").get<int>();
  c.model.n_head = ref.config.at("n_head").get<int>();
  c.model.vocab_size = ref.config.at("vocab_size").get<int>();
  c.model.seq_len = ref.config.at("seq_len").get<int>();
  if (ref.config.contains("n_kv_head")) {
    c.model.arch = "llama";
    c.model.n_kv_head = ref.config.at("n_kv_head").get<int>();
    c.model.intermediate_size = ref.config.at("ffn_dim").get<int>();
    c.model.rms_norm_eps = ref.config.at("rms_norm_eps").get<double>();
    c.model.rope_theta = ref.config.at("rope_theta").get<double>();
    c.model.tie_word_embeddings = ref.config.at("tied_lm_head").get<bool>();
  }
  c.micro_batch = ref.config.at("batch").get<int>();
  c.grad_accum = 1;
  c.train_batch_size = c.micro_batch;
  c.bf16 = bf16;
  c.optimizer.type = "AdamW";
  c.optimizer.lr = ref.adamw.at("lr").get<double>();
  c.optimizer.beta1 = ref.adamw.at("betas")[0].get<double>();
  c.optimizer.beta2 = ref.adamw.at("betas")[1].get<double>();
  c.optimizer.eps = ref.adamw.at("eps").get<double>();
  c.optimizer.weight_decay = ref.adamw.at("weight_decay").get<double>();
  c.gradient_clipping = 0;  // torch.optim.AdamW alone, no clipping
  c.data.path = SourcePath("data/kjv.txt");  // unused: the batch is given
  o.backend = backend;
  o.cpu_threads = 2;
  o.init_from = ref.file.path();
  o.init_prefix = "param.";
  // (On CUDA the limit covers the context and libraries too: about 0.6 GiB.)
  o.gpu_memory_limit = backend == "cuda" ? 1536 * kMiB : 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  return o;
}

// What a backend and precision may differ from the float64 reference by.
struct Gpt2ParityTolerance {
  double loss = 0;        // relative, of the loss before and after the steps
  double grad_norm = 0;   // relative, of the global gradient norm
  double flat = 0;        // per element and step, in units of lr (see the header comment)
  double near_zero = 0;   // per element and step, times lr eps / (|g| + eps)
  double update = 0;      // per tensor: ||got update - want update|| / ||want update||, over
                          // the elements whose gradient determines their update:
  double determined = 0;  // |g| >= 100 eps and >= determined * rms(g) of the tensor
};

// The worst figures of one comparison, for the printed line.
struct Gpt2ParityFigures {
  double loss = 0, grad_norm = 0;
  double element = 0;  // worst |got - want| / bound over every element
  double update = 0;   // worst per-tensor update relative error
  std::string element_at, update_at;
};

inline void PrintFigures(const char* what, const Gpt2ParityFigures& f) {
  std::printf("[ parity ] %s: loss rel %.2e, grad norm rel %.2e, worst element %.3f of its bound (%s), "
              "worst update rel %.2e (%s)\n",
              what, f.loss, f.grad_norm, f.element, f.element_at.c_str(), f.update, f.update_at.c_str());
}

// Every parameter of `t` against `prefix` ("updated." after one step,
// "updated3." after three) under the bound of `steps` steps.
inline void ExpectParametersMatch(const Gpt2Ref& ref, Trainer& t, const std::string& prefix, int steps,
                                  const Gpt2ParityTolerance& tol, Gpt2ParityFigures* fig) {
  const double lr = ref.adamw.at("lr").get<double>(), eps = ref.adamw.at("eps").get<double>();
  int checked = 0;
  for (const auto& e : ref.file.entries()) {
    if (e.name.rfind(prefix, 0) != 0) continue;
    const std::string name = e.name.substr(prefix.size());
    SCOPED_TRACE(prefix + name);
    ASSERT_OK_AND_ASSIGN(std::vector<float> want, ref.file.ReadF32(e.name));
    ASSERT_OK_AND_ASSIGN(std::vector<float> p0, ref.file.ReadF32("param." + name));
    ASSERT_OK_AND_ASSIGN(std::vector<float> g, ref.file.ReadF32("grad." + name));
    ASSERT_OK_AND_ASSIGN(std::vector<float> got, t.Parameter(name));
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(p0.size(), want.size());
    ASSERT_EQ(g.size(), want.size());
    double rms = 0;
    for (float x : g) rms += static_cast<double>(x) * x;
    rms = std::sqrt(rms / static_cast<double>(g.size()));
    const double floor = std::max(100 * eps, tol.determined * rms);
    double num = 0, den = 0;
    int bad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double w = want[i], d = static_cast<double>(got[i]) - w;
      const double bound = lr * steps * (tol.flat + tol.near_zero * eps / (std::fabs(g[i]) + eps)) +
                           4 * std::ldexp(std::fabs(w), -23);
      const double ratio = std::isfinite(d) ? std::fabs(d) / bound : INFINITY;
      if (ratio > fig->element) fig->element = ratio, fig->element_at = prefix + name + "[" + std::to_string(i) + "]";
      if (ratio > 1 && ++bad <= 3)
        ADD_FAILURE() << prefix << name << "[" << i << "] = " << got[i] << ", reference " << want[i]
                      << " (from " << p0[i] << ", gradient " << g[i] << "): off by " << d / lr << " lr, bound "
                      << bound / lr << " lr";
      if (std::fabs(g[i]) >= floor) {  // an update the gradient determines
        const double du = w - p0[i];
        num += d * d, den += du * du;
      }
    }
    const double upd = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    EXPECT_LE(upd, tol.update) << "the update of " << name << " as a whole";
    if (!(upd <= fig->update)) fig->update = upd, fig->update_at = name;
    ++checked;
  }
  EXPECT_EQ(checked, ref.n_tensors()) << prefix;
}

// Steps the trainer made from `o` through the reference's steps and checks
// each figure; the worst are printed under `what`.
// `one_step`: only the loss, the gradient norm and the first step's
// parameters (for a file whose later steps ran another model: see
// tests/engine/llama_parity_test.cc).
inline void CheckTrainerAgainstGpt2Ref(const Gpt2Ref& ref, const TrainOptions& o, const Gpt2ParityTolerance& tol,
                                       const char* what, bool one_step = false) {
  SCOPED_TRACE(std::string(what) + ", file " + ref.file.path());
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK_AND_ASSIGN(auto tokens, ref.file.ReadI32("input_ids"));
  ASSERT_OK_AND_ASSIGN(auto targets, ref.file.ReadI32("targets"));
  ASSERT_OK_AND_ASSIGN(auto loss, ref.file.ReadF64("loss"));
  ASSERT_OK_AND_ASSIGN(auto loss_after, ref.file.ReadF64("loss_after_step"));
  Gpt2ParityFigures fig;
  auto expect_loss = [&](double got, double want, const char* which) {
    const double rel = std::fabs(got - want) / want;
    EXPECT_LE(rel, tol.loss) << which << ": " << got << " vs " << want;
    fig.loss = std::max(fig.loss, rel);
  };

  ASSERT_OK_AND_ASSIGN(StepReport r1, t->StepWith(tokens.data(), targets.data()));
  expect_loss(r1.loss, loss[0], "loss");
  // The global gradient norm (what gradient_clipping compares) is the L2
  // norm of every reference gradient together: the tied wte counted once,
  // nothing from the vocabulary padding.
  double sum_sq = 0;
  int grads = 0;
  for (const auto& e : ref.file.entries()) {
    if (e.name.rfind("grad.", 0) != 0) continue;
    ASSERT_OK_AND_ASSIGN(auto g, ref.file.ReadF32(e.name));
    for (float x : g) sum_sq += static_cast<double>(x) * x;
    ++grads;
  }
  EXPECT_EQ(grads, ref.n_tensors());
  fig.grad_norm = std::fabs(r1.grad_norm - std::sqrt(sum_sq)) / std::sqrt(sum_sq);
  EXPECT_LE(fig.grad_norm, tol.grad_norm) << r1.grad_norm << " vs " << std::sqrt(sum_sq);
  ExpectParametersMatch(ref, *t, "updated.", 1, tol, &fig);
  if (one_step) {
    PrintFigures(what, fig);
    return;
  }

  // The next step's forward runs on the updated parameters.
  ASSERT_OK_AND_ASSIGN(StepReport r2, t->StepWith(tokens.data(), targets.data()));
  expect_loss(r2.loss, loss_after[0], "loss after one step");
  const int k = ref.adam_steps;
  if (k >= 2) {
    for (int s = 3; s <= k; ++s) ASSERT_OK(t->StepWith(tokens.data(), targets.data()).status());
    const std::string kk = std::to_string(k);
    ExpectParametersMatch(ref, *t, "updated" + kk + ".", k, tol, &fig);
    ASSERT_OK_AND_ASSIGN(auto loss_k, ref.file.ReadF64("loss_after_" + kk + "_steps"));
    ASSERT_OK_AND_ASSIGN(StepReport rk, t->StepWith(tokens.data(), targets.data()));
    expect_loss(rk.loss, loss_k[0], "loss after the steps");
  } else {
    ADD_FAILURE() << ref.file.path() << " has no multi-step state (config adam_steps " << k
                  << "): made by an old make_gpt2_ref.py?";
  }
  PrintFigures(what, fig);
}

}  // namespace strata::testing
