// The whole trainer against the independent transformers reference
// (tests/data/gpt2_tiny_ref.safetensors, or $STRATA_GPT2_REF): start from its
// parameters, take one AdamW step on its batch, and compare the loss, the
// updated parameters and the loss after the step. CPU backend, fp32; the
// offloaded placement must give exactly the all-resident numbers.
#include <cmath>
#include <cstdlib>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "engine/safetensors.h"
#include "engine/trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

std::string RefPath() {
  const char* env = std::getenv("STRATA_GPT2_REF");
  return env && *env ? env : testing::SourcePath("tests/data/gpt2_tiny_ref.safetensors");
}

struct Reference {
  SafetensorsFile file;
  nlohmann::json config, adamw;
};

Result<TrainOptions> OptionsFor(const Reference& ref) {
  TrainOptions o;
  Config& c = o.config;
  c.model.n_layer = ref.config.at("n_layer").get<int>();
  c.model.n_embd = ref.config.at("n_embd").get<int>();
  c.model.n_head = ref.config.at("n_head").get<int>();
  c.model.vocab_size = ref.config.at("vocab_size").get<int>();
  c.model.seq_len = ref.config.at("seq_len").get<int>();
  c.micro_batch = ref.config.at("batch").get<int>();
  c.grad_accum = 1;
  c.train_batch_size = c.micro_batch;
  c.optimizer.type = "AdamW";
  c.optimizer.lr = ref.adamw.at("lr").get<double>();
  c.optimizer.beta1 = ref.adamw.at("betas")[0].get<double>();
  c.optimizer.beta2 = ref.adamw.at("betas")[1].get<double>();
  c.optimizer.eps = ref.adamw.at("eps").get<double>();
  c.optimizer.weight_decay = ref.adamw.at("weight_decay").get<double>();
  c.gradient_clipping = 0;  // torch.optim.AdamW alone, no clipping
  c.data.path = testing::SourcePath("data/kjv.txt");  // unused: the batch is given
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.init_from = ref.file.path();
  o.init_prefix = "param.";
  o.gpu_memory_limit = 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  return o;
}

class Gpt2Parity : public ::testing::Test {
 protected:
  void SetUp() override {
    auto f = SafetensorsFile::Open(RefPath());
    ASSERT_OK(f.status());
    ref_.emplace(Reference{std::move(*f), {}, {}});
    ref_->config = nlohmann::json::parse(ref_->file.metadata().at("config"));
    ref_->adamw = nlohmann::json::parse(ref_->file.metadata().at("adamw"));
  }
  std::optional<Reference> ref_;
};

// Relative error of `got` against `want`: ||got - want|| / ||want||.
double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

void CheckOneStep(const Reference& ref, const TrainOptions& o) {
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK_AND_ASSIGN(auto tokens, ref.file.ReadI32("input_ids"));
  ASSERT_OK_AND_ASSIGN(auto targets, ref.file.ReadI32("targets"));
  ASSERT_OK_AND_ASSIGN(auto loss, ref.file.ReadF64("loss"));
  ASSERT_OK_AND_ASSIGN(auto loss_after, ref.file.ReadF64("loss_after_step"));

  ASSERT_OK_AND_ASSIGN(StepReport r1, t->StepWith(tokens.data(), targets.data()));
  EXPECT_NEAR(r1.loss, loss[0], 1e-5 * loss[0]);

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
  EXPECT_EQ(grads, 4 + 12 * ref.config.at("n_layer").get<int>());
  EXPECT_NEAR(r1.grad_norm, std::sqrt(sum_sq), 1e-5 * std::sqrt(sum_sq));

  // Every parameter after one AdamW step. Adam's first step moves each
  // weight by about lr * sign(g), so the fp32 gradients must have the
  // reference's signs; an element whose gradient is within rounding of zero
  // could flip, which the relative norm absorbs.
  int checked = 0;
  for (const auto& e : ref.file.entries()) {
    if (e.name.rfind("updated.", 0) != 0) continue;
    std::string name = e.name.substr(8);
    ASSERT_OK_AND_ASSIGN(auto want, ref.file.ReadF32(e.name));
    ASSERT_OK_AND_ASSIGN(auto got, t->Parameter(name));
    ASSERT_EQ(got.size(), want.size()) << name;
    if (name.find("attn.c_attn.bias") != std::string::npos) {
      // The key bias [C, 2C) has a gradient of exactly zero (it adds q.b_k
      // to every score of a softmax row); the reference's is 3e-20 and ours
      // fp32 rounding noise, which Adam's g / (|g| + eps) turns into
      // different updates of up to 0.1 lr. Compare the query and value parts.
      const size_t C = got.size() / 3;
      std::vector<float> g2, w2;
      for (size_t i = 0; i < got.size(); ++i)
        if (i < C || i >= 2 * C) g2.push_back(got[i]), w2.push_back(want[i]);
      got.swap(g2);
      want.swap(w2);
    }
    // Per element: the update of a weight with gradient g is lr g/(|g|+eps);
    // an fp32 gradient error e shifts it by about lr e/(|g|+eps), which only
    // matters where |g| is a few eps: the worst element seen is 0.33% of lr
    // (one of h.1.mlp.c_fc.weight). A wrong gradient or optimizer step would
    // be off by the order of lr.
    const double lr = ref.adamw.at("lr").get<double>();
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]) - 1e-6 * std::fabs(want[i]));
    EXPECT_LT(worst, 1e-2 * lr) << name << " (relative norm error " << RelErr(got, want) << ")";
    ++checked;
  }
  EXPECT_EQ(checked, 4 + 12 * ref.config.at("n_layer").get<int>());

  // The next step's forward runs on the updated parameters.
  ASSERT_OK_AND_ASSIGN(StepReport r2, t->StepWith(tokens.data(), targets.data()));
  EXPECT_NEAR(r2.loss, loss_after[0], 1e-5 * loss_after[0]);
}

TEST_F(Gpt2Parity, OneAdamWStepMatchesTransformers) {
  ASSERT_OK_AND_ASSIGN(TrainOptions o, OptionsFor(*ref_));
  CheckOneStep(*ref_, o);
}

TEST_F(Gpt2Parity, OffloadedPlacementMatchesToo) {
  testing::TempDir nvme;
  ASSERT_OK_AND_ASSIGN(TrainOptions o, OptionsFor(*ref_));
  o.config.zero.offload_param.device = "cpu";
  o.config.zero.offload_optimizer.device = "nvme";
  o.config.zero.offload_optimizer.nvme_path = nvme.path();
  o.config.activation_checkpointing.cpu_checkpointing = true;
  CheckOneStep(*ref_, o);
}

TEST_F(Gpt2Parity, InitFromChecksNamesAndShapes) {
  ASSERT_OK_AND_ASSIGN(TrainOptions o, OptionsFor(*ref_));
  std::ostringstream log;
  o.init_prefix = "nope.";
  auto t = Trainer::Create(o, log);
  EXPECT_THAT(t, testing::StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(t.status().ToString(), HasSubstr("nope.transformer.wte.weight"));
  ASSERT_OK_AND_ASSIGN(TrainOptions o2, OptionsFor(*ref_));
  o2.config.model.n_embd = 96;
  o2.config.model.n_head = 4;
  auto t2 = Trainer::Create(o2, log);
  EXPECT_THAT(t2, testing::StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(t2.status().ToString(), HasSubstr("shape"));
}

TEST_F(Gpt2Parity, StepWithRejectsTokensOutsideTheVocabulary) {
  ASSERT_OK_AND_ASSIGN(TrainOptions o, OptionsFor(*ref_));
  std::ostringstream log;
  ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
  ASSERT_OK_AND_ASSIGN(auto tokens, ref_->file.ReadI32("input_ids"));
  ASSERT_OK_AND_ASSIGN(auto targets, ref_->file.ReadI32("targets"));
  tokens[5] = 256;
  auto r = t->StepWith(tokens.data(), targets.data());
  EXPECT_THAT(r, testing::StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().ToString(), HasSubstr("position 5"));
}

}  // namespace
}  // namespace strata
