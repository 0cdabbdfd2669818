// SPDX-License-Identifier: Apache-2.0
// models::Decoder on Llama-family blocks (CPU backend): RMSNorm, RoPE at the
// cache's positions, nn.Linear-layout Linear with fused q | k | v and
// gate | up, SwiGLU, grouped-query attention, no position table, an RMSNorm
// final norm and a tied or untied LM head. Greedy decoding with the cache
// picks the full recompute's argmax at every position and its logits are
// the full forward's (f32 tight, bf16 loose), on random parameters and on
// transformers' reference parameters (tests/data/llama_tiny_ref.safetensors);
// a prompt in pieces (RoPE offsets of each piece) gives what one pass gives.
#include <string>
#include <vector>

#include "engine/safetensors.h"
#include "kernels/backend.h"
#include "models/decoder.h"
#include "models/llama.h"
#include "tests/kernels/backend_compare.h"
#include "tests/models/decoder_reference.h"
#include "tests/models/llama_reference.h"
#include "tests/test_util.h"

namespace strata::models {
namespace {

using ::strata::models::testing::ExpectGreedyMatchesFullRecompute;
using ::strata::models::testing::RandomModel;
using ::strata::models::testing::UnitParams;
using ::strata::testing::RelErr;
using ::strata::testing::StatusIs;

LlamaConfig TinyLlama(bool tied, const std::string& arch = "LlamaForCausalLM") {
  return testing::DecoderTestLlama(tied, arch);
}

double Tol(DType dt) { return dt == DType::kF32 ? 2e-5 : 2e-2; }

class DecoderLlamaTest : public ::testing::TestWithParam<DType> {};

TEST_P(DecoderLlamaTest, UntiedHeadGreedyWithTheCacheMatchesFullRecompute) {
  const uint64_t seed = ::strata::testing::TestSeed(17);
  SCOPED_TRACE(::strata::testing::SeedNote(seed));
  auto be = kernels::MakeCpuBackend(2);
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(TinyLlama(false)));
  ASSERT_FALSE(spec.head.tied);
  ASSERT_LT(spec.embedding.position_offset, 0);
  auto model = RandomModel(be.get(), spec, GetParam(), seed);
  ASSERT_NE(model, nullptr);
  ExpectGreedyMatchesFullRecompute(be.get(), *model, GetParam(), 6, seed, Tol(GetParam()));
}

TEST_P(DecoderLlamaTest, TiedHeadGreedyWithTheCacheMatchesFullRecompute) {
  const uint64_t seed = ::strata::testing::TestSeed(19);
  SCOPED_TRACE(::strata::testing::SeedNote(seed));
  auto be = kernels::MakeCpuBackend(2);
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(TinyLlama(true)));
  auto model = RandomModel(be.get(), spec, GetParam(), seed);
  ASSERT_NE(model, nullptr);
  ExpectGreedyMatchesFullRecompute(be.get(), *model, GetParam(), 5, seed, Tol(GetParam()));
}

// Qwen2: q, k and v biases in the fused GEMM.
TEST_P(DecoderLlamaTest, QkvBiasesGreedyWithTheCacheMatchesFullRecompute) {
  const uint64_t seed = ::strata::testing::TestSeed(23);
  SCOPED_TRACE(::strata::testing::SeedNote(seed));
  auto be = kernels::MakeCpuBackend(2);
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(TinyLlama(false, "Qwen2ForCausalLM")));
  ASSERT_NE(spec.block.Find("self_attn.q_proj.bias"), nullptr);
  auto model = RandomModel(be.get(), spec, GetParam(), seed);
  ASSERT_NE(model, nullptr);
  ExpectGreedyMatchesFullRecompute(be.get(), *model, GetParam(), 4, seed, Tol(GetParam()));
}

// transformers' parameters (random init, 3 Adam steps), from the reference's prompt.
TEST_P(DecoderLlamaTest, ReferenceParametersGreedyWithTheCacheMatchesFullRecompute) {
  auto be = kernels::MakeCpuBackend(2);
  ASSERT_OK_AND_ASSIGN(SafetensorsFile f, SafetensorsFile::Open(testing::LlamaReferencePath()));
  ASSERT_OK_AND_ASSIGN(testing::LlamaReference ref, testing::LoadLlamaReference(f));
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(ref.config));
  ResidentModel::Options o;
  o.dtype = GetParam();
  o.grad_dtype = DType::kF32;
  ASSERT_OK_AND_ASSIGN(auto model, ResidentModel::Create(be.get(), spec, o));
  ASSERT_OK(testing::ImportLlamaReference(f, model.get()));
  const std::vector<int32_t> prompt(ref.tokens.begin(), ref.tokens.begin() + 8);
  ExpectGreedyMatchesFullRecompute(be.get(), *model, GetParam(), 8, 0, Tol(GetParam()), prompt);
}

INSTANTIATE_TEST_SUITE_P(DTypes, DecoderLlamaTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// RoPE rotates each piece at its own positions: pieces give one pass's logits.
TEST(DecoderLlamaSteps, APromptInPiecesGivesWhatOnePassGives) {
  auto be = kernels::MakeCpuBackend(2);
  ASSERT_OK_AND_ASSIGN(ModelSpec spec, LlamaSpec(TinyLlama(false)));
  auto model = RandomModel(be.get(), spec, DType::kF32, 29);
  ASSERT_NE(model, nullptr);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 12; ++i) prompt.push_back((i * 37 + 5) % 300);
  ASSERT_OK_AND_ASSIGN(auto one, Decoder::Create(be.get(), spec, DType::kF32, UnitParams(*model), {}));
  std::vector<float> a, b, got;
  ASSERT_OK(one->Step(prompt.data(), 12, Decoder::Logits::kAll, &a));
  ASSERT_OK_AND_ASSIGN(auto pieces, Decoder::Create(be.get(), spec, DType::kF32, UnitParams(*model), {}));
  for (auto [at, n] : {std::pair{0, 3}, std::pair{3, 1}, std::pair{4, 8}}) {
    ASSERT_OK(pieces->Step(prompt.data() + at, n, Decoder::Logits::kAll, &b));
    got.insert(got.end(), b.begin(), b.end());
  }
  EXPECT_LE(RelErr(std::vector<double>(got.begin(), got.end()), std::vector<double>(a.begin(), a.end())), 1e-5);
}

TEST(DecoderLlamaSteps, ABlockItCannotRunIsAnErrorNamingTheOp) {
  auto be = kernels::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(ModelSpec good, LlamaSpec(TinyLlama(false)));
  auto model = RandomModel(be.get(), good, DType::kF32, 3);
  ASSERT_NE(model, nullptr);
  auto expect = [&](const ModelSpec& spec, const std::string& words) {
    auto r = Decoder::Create(be.get(), spec, DType::kF32, UnitParams(*model), {});
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status();
  };
  ModelSpec spec = good;
  spec.n_kv_head = 4;  // the qkv GEMM makes 2 key/value heads
  expect(spec, "op 2 (RoPE qkv -> qr)");
  spec.block.ops.erase(spec.block.ops.begin() + 2);
  spec.block.ops[2].in = "qkv";
  expect(spec, "op 2 (Attention qkv -> att)");
  spec = good;
  spec.block.ops[1].concat = {"self_attn.k_proj.weight"};  // q | k: no v
  expect(spec, "op 2 (RoPE qkv -> qr)");
  spec = good;
  spec.block.ops[1].concat = {"self_attn.k_proj.weight", "self_attn.missing"};
  expect(spec, "self_attn.missing");
  spec = good;
  spec.block.ops[0].weight = "post_attention_layernorm.nope";
  expect(spec, "op 0 (RMSNorm x -> h1)");
  spec = good;
  spec.block.ops[1].transposed = false;  // q_proj read as [k, n]
  expect(spec, "op 1 (Linear h1 -> qkv)");
}

}  // namespace
}  // namespace strata::models
