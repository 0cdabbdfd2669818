// SPDX-License-Identifier: Apache-2.0
// The Llama family's spec (names, shapes, layout, ops) and the whole model
// on the CPU backend against the float64 transformers reference
// (tests/models/llama_reference.h): the loss and every gradient.
#include <set>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "models/block_program.h"
#include "models/llama.h"
#include "tests/models/llama_reference.h"

namespace strata::models {
namespace {

using testing::LlamaReferencePath;

LlamaConfig Tiny() {
  LlamaConfig c;
  c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.n_kv_head = 2, c.intermediate_size = 176;
  c.vocab_size = 256, c.seq_len = 32, c.rms_norm_eps = 1e-5f;
  return c;
}

TEST(LlamaSpec, NamesAndShapesAreTheReferenceFile) {
  ASSERT_OK_AND_ASSIGN(SafetensorsFile f, SafetensorsFile::Open(LlamaReferencePath()));
  ASSERT_OK_AND_ASSIGN(testing::LlamaReference ref, testing::LoadLlamaReference(f));
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(ref.config));
  std::set<std::string> in_file;
  for (const SafetensorsEntry& e : f.entries())
    if (e.name.rfind("param.", 0) == 0) in_file.insert(e.name.substr(6));
  EXPECT_EQ(spec.params.size(), in_file.size());
  int64_t numel = 0;
  for (const ParamSpec& p : spec.params) {
    const SafetensorsEntry* e = f.Find("param." + p.name);
    ASSERT_NE(e, nullptr) << p.name;
    EXPECT_EQ(e->shape.ToString(), Shape(std::span<const int64_t>(p.shape)).ToString()) << p.name;
    numel += p.numel;
  }
  EXPECT_EQ(spec.NumParameters(), numel);
  EXPECT_EQ(spec.family, "llama");
  EXPECT_EQ(spec.hf_architecture, "LlamaForCausalLM");
  EXPECT_FALSE(spec.head.tied);
  EXPECT_EQ(spec.embedding.position_offset, -1);
}

TEST(LlamaSpec, QkvAndGateUpAreAdjacentSoEachIsOneGemm) {
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(Tiny()));
  const BlockSpec& b = spec.block;
  auto end = [&](const char* n) { return b.Find(n)->offset + b.Find(n)->numel; };
  EXPECT_EQ(b.Find("self_attn.k_proj.weight")->offset, end("self_attn.q_proj.weight"));
  EXPECT_EQ(b.Find("self_attn.v_proj.weight")->offset, end("self_attn.k_proj.weight"));
  EXPECT_EQ(b.Find("mlp.up_proj.weight")->offset, end("mlp.gate_proj.weight"));
  // Every group starts on the slice alignment.
  for (const char* n : {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.o_proj.weight",
                        "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.down_proj.weight"})
    EXPECT_EQ(b.Find(n)->offset % kSliceAlign, 0) << n;
}

TEST(LlamaSpec, QwenBiasesAreParametersOfTheQkvGemm) {
  LlamaConfig c = Tiny();
  c.attention_bias = true;
  c.hf_architecture = "Qwen2ForCausalLM";
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(c));
  ASSERT_OK(spec.Find("model.layers.1.self_attn.k_proj.bias").status());
  EXPECT_EQ(spec.block.ops[1].bias, "self_attn.q_proj.bias");
  EXPECT_EQ(spec.block.Find("self_attn.v_proj.bias")->offset,
            spec.block.Find("self_attn.k_proj.bias")->offset + 2 * 16);
  auto cpu = kernels::MakeCpuBackend(2);
  EXPECT_OK(BlockProgram::Make(cpu.get(), spec.block, BlockShape{64, 4, 1, 8, DType::kF32, 2}, {}).status());
}

TEST(LlamaSpec, BadConfigsNameTheField) {
  LlamaConfig c = Tiny();
  c.n_kv_head = 3;
  EXPECT_THAT(LlamaSpec(c).status().message(), ::testing::HasSubstr("n_kv_head = 3"));
  c = Tiny();
  c.n_head = 64;  // head_dim 1
  EXPECT_THAT(LlamaSpec(c).status().message(), ::testing::HasSubstr("even"));
  c = Tiny();
  c.intermediate_size = 0;
  EXPECT_THAT(LlamaSpec(c).status().message(), ::testing::HasSubstr("intermediate_size"));
}

// fp64 arithmetic: what is left is transformers' own fp32 RoPE tables (which
// the CPU backend reproduces) and fp64 rounding.
TEST(LlamaReference, Fp64LossAndEveryGradient) {
  auto cpu = kernels::MakeCpuBackend(2);
  // (The file's gradients are stored as float32; seen: loss 2.8e-9, worst
  // gradient 4.2e-7.)
  testing::CheckLlamaAgainstReference(cpu.get(), DType::kF64, DType::kF64, 1e-8, 1e-6);
}

TEST(LlamaReference, Fp32LossAndEveryGradient) {
  auto cpu = kernels::MakeCpuBackend(2);
  testing::CheckLlamaAgainstReference(cpu.get(), DType::kF32, DType::kF32, 1e-6, 1e-5);  // seen 4.2e-9, 1.2e-6
}

TEST(LlamaReference, Bf16LossAndEveryGradient) {
  auto cpu = kernels::MakeCpuBackend(2);
  testing::CheckLlamaAgainstReference(cpu.get(), DType::kBF16, DType::kF32, 5e-4, 4e-2);  // seen 6.6e-5, 2.1e-2
}

}  // namespace
}  // namespace strata::models

namespace strata::models {
namespace {

// The model's loss on the file's parameters after one AdamW step against
// the file's loss_after_step: exact for a file made by the current
// make_llama_ref.py (buffers_restored); the shipped older one computed it
// with the rotary inv_freq rounded to bf16 (its steps after the first ran
// so), which this checks stays the only difference: with fp32 inv_freq the
// loss is 8e-6 off, more than any rounding here.
TEST(LlamaReference, LossAfterTheFirstStep) {
  auto cpu = kernels::MakeCpuBackend(2);
  ASSERT_OK_AND_ASSIGN(SafetensorsFile f, SafetensorsFile::Open(LlamaReferencePath()));
  ASSERT_OK_AND_ASSIGN(testing::LlamaReference ref, testing::LoadLlamaReference(f));
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(ref.config));
  ResidentModel::Options o;
  o.dtype = DType::kF64;
  o.grad_dtype = DType::kF64;
  o.batch = ref.batch;
  ASSERT_OK_AND_ASSIGN(auto model, ResidentModel::Create(cpu.get(), spec, o));
  for (const ParamSpec& t : spec.params) {
    ASSERT_OK_AND_ASSIGN(std::vector<double> v, f.ReadF64("updated." + t.name));
    ASSERT_OK(model->SetParameter(t.name, v.data(), DType::kF64, static_cast<int64_t>(v.size())));
  }
  ASSERT_OK_AND_ASSIGN(double loss, model->Evaluate(ref.tokens.data(), ref.targets.data()));
  ASSERT_OK_AND_ASSIGN(std::vector<double> want, f.ReadF64("loss_after_step"));
  const nlohmann::json meta = nlohmann::json::parse(f.metadata().at("config"));
  const double rel = std::fabs(loss - want[0]) / want[0];
  std::printf("[ llama reference ] loss after one step %.10f, the file's %.10f (rel %.1e)\n", loss, want[0], rel);
  if (meta.value("buffers_restored", false)) {
    EXPECT_LE(rel, 1e-8);
  } else {
    EXPECT_GT(rel, 2e-6);  // the file's later steps ran another model (bf16 inv_freq)
    EXPECT_LT(rel, 2e-5);
  }
}

}  // namespace
}  // namespace strata::models
