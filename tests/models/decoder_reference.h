// SPDX-License-Identifier: Apache-2.0
// The decoder tests' model and reference: a small GPT-2 whose parameters are
// drawn large enough (uniform, +-0.3; LayerNorm weights around 1) for its
// logits to differ by far more than rounding, and the full-recompute
// logits of a whole sequence through the training executors (the embedding,
// BlockProgram::Forward with AttentionForward over all positions) and the
// head's norm (LayerNorm or RMSNorm) and LM head GEMM (tied or untied), with
// no cache anywhere; and the check that greedy decoding with the cache is
// the full recompute's argmax at every position, its logits the full
// forward's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "models/decoder.h"
#include "models/llama.h"
#include "models/model_program.h"
#include "models/resident_model.h"
#include "tests/kernels/backend_compare.h"
#include "tests/models/model_test_util.h"
#include "tests/test_util.h"

namespace strata::models::testing {

inline GptConfig DecoderTestConfig() {
  GptConfig c;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.vocab_size = 300;  // padded to 384: the padding rows never reach the logits
  c.seq_len = 40;
  return c;
}

// A tiny Llama for the decoder tests: 4 query heads sharing 2 key/value
// heads, a padded vocabulary, tied or untied; Qwen2's q/k/v biases for that arch.
inline LlamaConfig DecoderTestLlama(bool tied, const std::string& arch = "LlamaForCausalLM") {
  LlamaConfig c;
  c.hf_architecture = arch;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.intermediate_size = 88;
  c.vocab_size = 300;  // padded to 384
  c.seq_len = 40;
  c.rms_norm_eps = 1e-5f;
  c.tie_word_embeddings = tied;
  c.attention_bias = arch == "Qwen2ForCausalLM";
  return c;
}

// A resident model of `spec` on `be` with the parameters drawn from `seed`
// (norm weights 1 +- 0.3, others +- 0.3).
inline std::unique_ptr<ResidentModel> RandomModel(kernels::Backend* be, const ModelSpec& spec, DType dtype,
                                                  uint64_t seed) {
  ResidentModel::Options o;
  o.dtype = dtype;
  o.grad_dtype = DType::kF32;
  auto m = ResidentModel::Create(be, spec, o);
  EXPECT_OK(m.status());
  if (!m.ok()) return nullptr;
  uint64_t k = seed;
  for (const ParamSpec& p : (*m)->spec().params) {
    std::vector<float> v = ::strata::testing::RandomFloats(static_cast<size_t>(p.numel), ++k, -0.3f, 0.3f);
    if (p.init.kind == ParamInit::kOnes)
      for (float& x : v) x += 1.f;
    EXPECT_OK((*m)->SetParameter(p.name, v.data(), DType::kF32, p.numel));
  }
  return std::move(m).value();
}

inline std::unique_ptr<ResidentModel> RandomModel(kernels::Backend* be, const GptConfig& c, DType dtype, uint64_t seed) {
  return RandomModel(be, Spec(c), dtype, seed);
}

inline std::vector<const void*> UnitParams(ResidentModel& m) {
  std::vector<const void*> p;
  for (int u = 0; u < m.spec().num_units(); ++u) p.push_back(m.unit_params(u).data());
  return p;
}

// Logits [T, V] of `tokens` (T of them), recomputed whole.
inline std::vector<float> FullLogits(kernels::Backend* be, const ModelSpec& spec, DType dtype,
                                     const std::vector<const void*>& params, const std::vector<int32_t>& tokens) {
  const int64_t T = static_cast<int64_t>(tokens.size()), C = spec.d_model, V = spec.vocab_size, Vp = spec.padded_vocab;
  const size_t es = DTypeSize(dtype);
  auto prog = ModelProgram::Make(be, spec, 1, T, dtype, ModelProgram::Options{false, false});
  EXPECT_OK(prog.status());
  if (!prog.ok()) return {};
  auto alloc = [&](size_t bytes) {
    auto b = be->Allocate(std::max<size_t>(bytes, 64));
    EXPECT_OK(b.status());
    return b.ok() ? std::move(b).value() : kernels::DeviceBuffer();
  };
  kernels::DeviceBuffer x = alloc(static_cast<size_t>(T * C) * es), y = alloc(static_cast<size_t>(T * C) * es);
  kernels::DeviceBuffer scratch = alloc(prog->block_scratch_bytes()), tok = alloc(static_cast<size_t>(T) * 4);
  kernels::DeviceBuffer norm = alloc(static_cast<size_t>(T * C) * es), stats = alloc(static_cast<size_t>(2 * T) * 8);
  kernels::DeviceBuffer logits = alloc(static_cast<size_t>(T * Vp) * es), f32 = alloc(static_cast<size_t>(T * Vp) * 4);
  EXPECT_OK(be->CopyToDevice(tok.data(), tokens.data(), tokens.size() * 4));
  EXPECT_OK(prog->embedding().Forward(params[0], tok.as<int32_t>(), x.data()));
  for (int64_t l = 0; l < spec.n_layer; ++l) {
    EXPECT_OK(prog->block().Forward(params[static_cast<size_t>(ModelSpec::block_unit(l))], x.data(), y.data(),
                                    scratch.data(), scratch.bytes()));
    std::swap(x, y);
  }
  const char* fin = static_cast<const char*>(params[static_cast<size_t>(spec.final_unit())]);
  float* st = stats.as<float>();
  const int64_t ies = static_cast<int64_t>(es);
  if (spec.head.norm == HeadSpec::Norm::kRmsNorm) {
    EXPECT_OK(be->RmsNormForward(kernels::RmsNormArgs{T, C, dtype, spec.head.norm_eps}, norm.data(), st, x.data(),
                                 fin + spec.head.norm_weight_offset * ies));
  } else {
    EXPECT_OK(be->LayerNormForward(kernels::LayerNormArgs{T, C, dtype, spec.head.norm_eps}, norm.data(), st,
                                   reinterpret_cast<float*>(reinterpret_cast<char*>(st) + static_cast<size_t>(T) * 8),
                                   x.data(), fin + spec.head.norm_weight_offset * ies,
                                   fin + spec.head.norm_bias_offset * ies));
  }
  kernels::GemmArgs g;
  g.trans_b = true;
  g.m = T, g.n = Vp, g.k = C;
  g.a = norm.data(), g.lda = C;
  g.b = spec.head.tied ? static_cast<const char*>(params[0]) + spec.embedding.token_offset * ies
                       : fin + spec.head.lm_head_offset * ies;
  g.ldb = C;
  g.c = logits.data(), g.ldc = Vp, g.ab_dtype = g.c_dtype = dtype;
  EXPECT_OK(be->Gemm(g));
  EXPECT_OK(be->Cast(f32.data(), DType::kF32, logits.data(), dtype, T * Vp));
  std::vector<float> all(static_cast<size_t>(T * Vp)), out(static_cast<size_t>(T * V));
  EXPECT_OK(be->Synchronize());
  EXPECT_OK(be->CopyToHost(all.data(), f32.data(), all.size() * 4));
  for (int64_t t = 0; t < T; ++t) std::copy(all.begin() + t * Vp, all.begin() + t * Vp + V, out.begin() + t * V);
  return out;
}

inline int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// The gap between the largest and the second largest of `row`.
inline double TopGap(const float* row, int64_t n) {
  std::vector<float> v(row, row + n);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return static_cast<double>(v[0]) - v[1];
}

// Greedy decoding of `model` with the cache from a prompt of P tokens
// (`prompt`, or drawn from `seed` when empty) to the model's max_seq:
// the logits of every position (the prompt's from the prefill, the others
// from one-token steps) are the full recompute's within `tol` (relative),
// and every chosen token is the full recompute's argmax unless its two
// largest logits are within 10 tol.
inline void ExpectGreedyMatchesFullRecompute(kernels::Backend* be, ResidentModel& model, DType dt, int64_t P,
                                             uint64_t seed, double tol, std::vector<int32_t> prompt = {}) {
  const ModelSpec& spec = model.spec();
  const int64_t V = spec.vocab_size, T = spec.max_seq;
  auto d = Decoder::Create(be, spec, dt, UnitParams(model), Decoder::Options{T, P});
  ASSERT_OK(d.status());
  std::vector<int32_t> seq = prompt;
  for (int64_t i = static_cast<int64_t>(seq.size()); i < P; ++i)
    seq.push_back(static_cast<int32_t>((seed * 7919 + static_cast<uint64_t>(i) * 104729) % static_cast<uint64_t>(V)));
  seq.resize(static_cast<size_t>(P));
  std::vector<float> cached, logits;
  ASSERT_OK((*d)->Step(seq.data(), P, Decoder::Logits::kAll, &logits));
  cached = logits;
  while (static_cast<int64_t>(seq.size()) < T) {
    const int32_t next = Argmax(logits.data() + logits.size() - V, V);
    seq.push_back(next);
    if (static_cast<int64_t>(seq.size()) == T) break;
    ASSERT_OK((*d)->Step(&next, 1, Decoder::Logits::kLast, &logits));
    cached.insert(cached.end(), logits.begin(), logits.end());
  }
  ASSERT_EQ((*d)->position(), T - 1);
  const std::vector<float> full = FullLogits(be, spec, dt, UnitParams(model), seq);
  ASSERT_EQ(full.size(), static_cast<size_t>(T * V));
  auto row = [&](const std::vector<float>& v, int64_t r) {
    return std::vector<double>(v.begin() + r * V, v.begin() + (r + 1) * V);
  };
  for (int64_t t = 0; t + 1 < T; ++t) {
    EXPECT_LE(::strata::testing::RelErr(row(cached, t), row(full, t)), tol) << "logits of position " << t;
    if (t + 1 < P) continue;
    const int32_t want = Argmax(full.data() + t * V, V);
    if (seq[static_cast<size_t>(t + 1)] != want) {
      EXPECT_LT(TopGap(full.data() + t * V, V), tol * 10) << "position " << t << ": chose " << seq[t + 1]
                                                          << ", full " << want;
    }
  }
  // The logits are far from uniform: the check above is not vacuous.
  EXPECT_GT(TopGap(full.data() + (T - 2) * V, V) + TopGap(full.data(), V), 0.0);
}

}  // namespace strata::models::testing
