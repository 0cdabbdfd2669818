// The decoder tests' model and reference: a small GPT-2 whose parameters are
// drawn large enough (uniform, +-0.3; LayerNorm weights around 1) for its
// logits to differ by far more than rounding, and the full-recompute
// logits of a whole sequence through the training executors (the embedding,
// BlockProgram::Forward with AttentionForward over all positions) and the
// head's norm and tied GEMM, with no cache anywhere.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "models/model_program.h"
#include "models/resident_model.h"
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

// A resident model of `c` on `be` with the parameters drawn from `seed`.
inline std::unique_ptr<ResidentModel> RandomModel(kernels::Backend* be, const GptConfig& c, DType dtype, uint64_t seed) {
  ResidentModel::Options o;
  o.dtype = dtype;
  o.grad_dtype = DType::kF32;
  auto m = ResidentModel::Create(be, Spec(c), o);
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
  EXPECT_OK(be->LayerNormForward(kernels::LayerNormArgs{T, C, dtype, spec.head.norm_eps}, norm.data(), st,
                                 reinterpret_cast<float*>(reinterpret_cast<char*>(st) + static_cast<size_t>(T) * 8),
                                 x.data(), fin + spec.head.norm_weight_offset * static_cast<int64_t>(es),
                                 fin + spec.head.norm_bias_offset * static_cast<int64_t>(es)));
  kernels::GemmArgs g;
  g.trans_b = true;
  g.m = T, g.n = Vp, g.k = C;
  g.a = norm.data(), g.lda = C;
  g.b = static_cast<const char*>(params[0]) + spec.embedding.token_offset * static_cast<int64_t>(es), g.ldb = C;
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

}  // namespace strata::models::testing
