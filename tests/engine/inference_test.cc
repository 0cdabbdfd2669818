// SPDX-License-Identifier: Apache-2.0
// The inference commands' library on the CPU backend: a checkpoint the
// trainer saved, loaded (engine/inference_model.h) and evaluated on the
// trainer's validation windows (engine/inference_eval.h), gives the
// trainer's own val loss (GPT-2 and Llama); generation with a seed gives the same tokens run
// to run, another seed others, and greedy generation is the argmax of the
// decoder's logits (engine/generate.h).
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/data.h"
#include "engine/generate.h"
#include "engine/inference_eval.h"
#include "engine/inference_model.h"
#include "engine/trainer.h"
#include "models/decoder.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;

// A tiny model (GPT-2, or a Llama: GQA 4:2, SwiGLU, RMSNorm, RoPE, untied
// head) trained a few steps with `val` as its validation file, saved under
// dir/save; returns its val loss over `batches` batches as the trainer computes it.
double TrainAndSave(const std::string& dir, const std::string& val, int batches, bool llama = false) {
  TrainOptions o = ::strata::testing::TinyTrainer(2, 64, 32);
  if (llama) {
    o.config.model.arch = "llama";
    o.config.model.n_kv_head = 2;
    o.config.model.intermediate_size = 176;
    o.config.model.rms_norm_eps = 1e-5;
  }
  o.backend = "cpu";
  o.config.data.val_path = val;
  o.config.trainer.eval_batches = batches;
  o.steps = 4;
  o.save_dir = dir + "/save";
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_OK(t.status());
  if (!t.ok()) return -1;
  for (int i = 0; i < 4; ++i) EXPECT_OK((*t)->Step().status());
  EXPECT_OK((*t)->Save(o.save_dir));
  auto loss = (*t)->Evaluate(batches);
  EXPECT_OK(loss.status());
  return loss.ok() ? *loss : -1;
}

std::string WriteVal(const TempDir& tmp) {
  const std::string text = ::strata::testing::FileBytes(::strata::testing::SourcePath("data/kjv.txt")).substr(40000, 3000);
  std::ofstream(tmp.File("val.txt"), std::ios::binary) << text;
  return tmp.File("val.txt");
}

TEST(Inference, EvalGivesTheTrainersValLossOnTheSameWindows) {
  TempDir tmp;
  const std::string val = WriteVal(tmp);
  const double trainer = TrainAndSave(tmp.path(), val, 3);
  auto be = kernels::MakeCpuBackend(2);
  ASSERT_OK_AND_ASSIGN(InferenceModel m, LoadInferenceModel(tmp.File("save"), be.get(), DType::kF32, "--model"));
  EXPECT_NE(m.dir.find("step-000004"), std::string::npos) << m.dir;
  DataConfig dc;
  dc.path = dc.val_path = val;
  ASSERT_OK_AND_ASSIGN(auto data, DataLoader::Open(dc, "", 256, 4, 32));
  ASSERT_OK_AND_ASSIGN(const double eval, EvaluateModel(m, be.get(), data.get(), 4, 32, 3));
  EXPECT_EQ(eval, trainer) << "the same parameters, windows, passes and kernels give the same bits";
  // Other windows give another loss: the comparison says something.
  ASSERT_OK_AND_ASSIGN(const double two, EvaluateModel(m, be.get(), data.get(), 4, 32, 2));
  EXPECT_NE(two, trainer);
}

TEST(Inference, EvalOfALlamaStepDirectoryGivesTheTrainersValLoss) {
  TempDir tmp;
  const std::string val = WriteVal(tmp);
  const double trainer = TrainAndSave(tmp.path(), val, 3, /*llama=*/true);
  auto be = kernels::MakeCpuBackend(2);
  ASSERT_OK_AND_ASSIGN(InferenceModel m, LoadInferenceModel(tmp.File("save"), be.get(), DType::kF32, "--model"));
  EXPECT_EQ(m.spec.family, "llama");
  EXPECT_FALSE(m.spec.head.tied);
  DataConfig dc;
  dc.path = dc.val_path = val;
  ASSERT_OK_AND_ASSIGN(auto data, DataLoader::Open(dc, "", 256, 4, 32));
  ASSERT_OK_AND_ASSIGN(const double eval, EvaluateModel(m, be.get(), data.get(), 4, 32, 3));
  EXPECT_EQ(eval, trainer) << "the same parameters, windows, passes and kernels give the same bits";
  // The decoder runs the checkpoint (no position table, untied head):
  // greedy generation is the argmax of its logits after each prefix.
  ASSERT_OK_AND_ASSIGN(auto d, models::Decoder::Create(be.get(), m.spec, m.dtype, m.unit_params(), {}));
  GenerateRequest r;
  for (unsigned char c : std::string("And God said")) r.prompt.push_back(c);
  r.max_new_tokens = 10;
  r.sampling = {0, 0, 1, 0};
  std::vector<int32_t> greedy;
  ASSERT_OK(Generate(*d, r, [&](int32_t t) {
    greedy.push_back(t);
    return Status::OK();
  }).status());
  ASSERT_EQ(greedy.size(), 10u);
  std::vector<int32_t> seq = r.prompt;
  std::vector<float> logits;
  d->Reset();
  ASSERT_OK(d->Step(seq.data(), static_cast<int64_t>(seq.size()), models::Decoder::Logits::kLast, &logits));
  for (int32_t t : greedy) {
    EXPECT_EQ(t, std::max_element(logits.begin(), logits.end()) - logits.begin());
    ASSERT_OK(d->Step(&t, 1, models::Decoder::Logits::kLast, &logits));
  }
}

TEST(Inference, GenerationIsDeterministicInTheSeedAndGreedyIsTheArgmax) {
  TempDir tmp;
  TrainAndSave(tmp.path(), WriteVal(tmp), 1);
  auto be = kernels::MakeCpuBackend(2);
  ASSERT_OK_AND_ASSIGN(InferenceModel m, LoadInferenceModel(tmp.File("save"), be.get(), DType::kF32, "--model"));
  ASSERT_OK_AND_ASSIGN(auto d, models::Decoder::Create(be.get(), m.spec, m.dtype, m.unit_params(), {}));
  auto run = [&](const SamplingOptions& s) {
    GenerateRequest r;
    for (unsigned char c : std::string("And God said")) r.prompt.push_back(c);
    r.max_new_tokens = 20;
    r.sampling = s;
    std::vector<int32_t> out;
    auto st = Generate(*d, r, [&](int32_t t) {
      out.push_back(t);
      return Status::OK();
    });
    EXPECT_OK(st.status());
    if (st.ok()) {
      EXPECT_EQ(st->new_tokens, 20);
      EXPECT_EQ(st->prompt_tokens, 12);
    }
    return out;
  };
  const SamplingOptions a{1.0, 0, 1.0, 5};
  const std::vector<int32_t> first = run(a);
  EXPECT_EQ(run(a), first);
  EXPECT_NE(run({1.0, 0, 1.0, 6}), first);
  // Greedy: each token the argmax of the logits after the tokens before it.
  const std::vector<int32_t> greedy = run({0, 0, 1, 0});
  std::vector<int32_t> seq;
  for (unsigned char c : std::string("And God said")) seq.push_back(c);
  std::vector<float> logits;
  d->Reset();
  ASSERT_OK(d->Step(seq.data(), static_cast<int64_t>(seq.size()), models::Decoder::Logits::kLast, &logits));
  for (int32_t t : greedy) {
    EXPECT_EQ(t, std::max_element(logits.begin(), logits.end()) - logits.begin());
    ASSERT_OK(d->Step(&t, 1, models::Decoder::Logits::kLast, &logits));
  }
}

TEST(Inference, LoadingNamesWhatIsMissing) {
  TempDir tmp;
  auto be = kernels::MakeCpuBackend(1);
  auto r = LoadInferenceModel(tmp.path(), be.get(), DType::kF32, "--model");
  EXPECT_THAT(r, StatusIs(StatusCode::kNotFound));
  EXPECT_NE(r.status().message().find("--model " + tmp.path()), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("model.safetensors"), std::string::npos) << r.status();
  r = LoadInferenceModel(tmp.File("nothing"), be.get(), DType::kF32, "--model");
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("--model"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace strata
