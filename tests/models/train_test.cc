// SPDX-License-Identifier: Apache-2.0
// A 20-step training of a tiny GPT on real text (bytes of data/kjv.txt,
// vocabulary 256) on the CPU backend, with a plain AdamW written here: the
// loss on a held-out batch must clearly fall.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "models/gpt2.h"
#include "models/resident_model.h"
#include "tests/models/model_test_util.h"
#include "tests/test_util.h"

namespace strata::models {
namespace {

using kernels::Backend;
using kernels::DeviceBuffer;
using kernels::MakeCpuBackend;
using testing::Spec;

// AdamW on fp32 parameters and gradients (host copies of backend buffers).
class AdamW {
 public:
  AdamW(double lr, double beta1, double beta2, double eps, double wd)
      : lr_(lr), b1_(beta1), b2_(beta2), eps_(eps), wd_(wd) {}
  Status Step(Backend* be, const std::vector<DeviceBuffer*>& params,
              const std::vector<DeviceBuffer*>& grads) {
    ++t_;
    if (m_.empty()) {
      for (DeviceBuffer* p : params) {
        m_.emplace_back(p->bytes() / 4, 0.f);
        v_.emplace_back(p->bytes() / 4, 0.f);
      }
    }
    const double c1 = 1 - std::pow(b1_, t_), c2 = 1 - std::pow(b2_, t_);
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<float> p(params[i]->bytes() / 4), g(p.size());
      RETURN_IF_ERROR(be->CopyToHost(p.data(), params[i]->data(), params[i]->bytes()));
      RETURN_IF_ERROR(be->CopyToHost(g.data(), grads[i]->data(), grads[i]->bytes()));
      for (size_t j = 0; j < p.size(); ++j) {
        m_[i][j] = static_cast<float>(b1_ * m_[i][j] + (1 - b1_) * g[j]);
        v_[i][j] = static_cast<float>(b2_ * v_[i][j] + (1 - b2_) * g[j] * g[j]);
        const double mh = m_[i][j] / c1, vh = v_[i][j] / c2;
        p[j] = static_cast<float>(p[j] * (1 - lr_ * wd_) - lr_ * mh / (std::sqrt(vh) + eps_));
      }
      RETURN_IF_ERROR(be->CopyToDevice(params[i]->data(), p.data(), params[i]->bytes()));
    }
    return Status::OK();
  }

 private:
  double lr_, b1_, b2_, eps_, wd_;
  int t_ = 0;
  std::vector<std::vector<float>> m_, v_;
};

TEST(GptTrainTest, TwentyStepsOnKjvLowerTheLoss) {
  std::ifstream in(::strata::testing::SourcePath("data/kjv.txt"), std::ios::binary);
  ASSERT_TRUE(in) << "data/kjv.txt is missing";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(text.size(), 1u << 20);

  GptConfig cfg;
  cfg.n_layer = 2, cfg.n_embd = 64, cfg.n_head = 4, cfg.vocab_size = 256, cfg.seq_len = 64;
  ResidentModel::Options o;
  o.dtype = DType::kF32, o.grad_dtype = DType::kF32, o.batch = 8;
  auto be = MakeCpuBackend(0);
  ASSERT_OK_AND_ASSIGN(auto model, ResidentModel::Create(be.get(), Spec(cfg), o));
  ASSERT_OK(model->InitRandom(1));

  const int64_t B = o.batch, T = cfg.seq_len;
  const size_t train_end = text.size() * 95 / 100;  // the last 5% is held out
  std::mt19937_64 rng(42);
  auto batch = [&](size_t lo, size_t hi, std::vector<int32_t>* x, std::vector<int32_t>* y) {
    x->resize(B * T), y->resize(B * T);
    for (int64_t b = 0; b < B; ++b) {
      size_t start = lo + rng() % (hi - lo - T - 1);
      for (int64_t t = 0; t < T; ++t) {
        (*x)[b * T + t] = static_cast<unsigned char>(text[start + t]);
        (*y)[b * T + t] = static_cast<unsigned char>(text[start + t + 1]);
      }
    }
  };
  std::vector<int32_t> vx, vy, x, y;
  batch(train_end, text.size(), &vx, &vy);
  ASSERT_OK_AND_ASSIGN(double before, model->Evaluate(vx.data(), vy.data()));
  EXPECT_NEAR(before, std::log(256.0), 0.3);  // untrained: about uniform

  AdamW opt(1e-2, 0.9, 0.95, 1e-8, 0.0);
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    batch(0, train_end, &x, &y);
    ASSERT_OK_AND_ASSIGN(double loss, model->ForwardBackward(x.data(), y.data()));
    ASSERT_TRUE(std::isfinite(loss)) << "step " << step;
    if (step == 0) first = loss;
    last = loss;
    ASSERT_OK(opt.Step(be.get(), model->ParameterBuffers(), model->GradientBuffers()));
  }
  ASSERT_OK_AND_ASSIGN(double after, model->Evaluate(vx.data(), vy.data()));
  std::printf("[ train ] held-out loss %.3f -> %.3f after 20 steps (train %.3f -> %.3f)\n", before,
              after, first, last);
  EXPECT_LT(after, before - 1.5) << "the held-out loss did not clearly fall";
  EXPECT_LT(last, first - 1.0);
}

}  // namespace
}  // namespace strata::models
