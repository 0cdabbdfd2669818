// SPDX-License-Identifier: Apache-2.0
// The planner with bf16 Adam moments (PlanInputs::moment_bytes 2,
// bf16.bf16_optimizer_states): 8 bytes of optimizer state per parameter
// wherever it lives, the speculative second set and the NVMe traffic
// likewise, and the plan's row saying which dtype the moments have.
#include <gtest/gtest.h>

#include "base/bytes.h"
#include "engine/planner.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

// A small GPT (block = 12C^2 + 13C, embedding = (V + T) C, ln_f = 2C).
PlanInputs Small(uint64_t moment_bytes) {
  const uint64_t L = 4, C = 128, T = 128, V = 256, B = 8;
  PlanInputs in;
  in.n_layer = L;
  in.layer_params = 12 * C * C + 13 * C;
  in.embedding_params = (V + T) * C;
  in.final_params = 2 * C;
  in.param_bytes = 2;
  in.grad_host_bytes = 2;
  in.moment_bytes = moment_bytes;
  in.checkpoint_bytes = B * T * C * 2;
  in.layer_workspace = B * T * C * 2 * 16;
  in.head_workspace = B * T * 8192 * 4;
  in.fixed_gpu = 1 << 20;
  in.gpu_budget = 8 * kGiB;
  in.host_budget = 8 * kGiB;
  return in;
}

uint64_t Params(const PlanInputs& in) {
  return static_cast<uint64_t>(in.n_layer) * in.layer_params + in.embedding_params + in.final_params;
}

const Plan::Row* Row(const Plan& p, const std::string& prefix) {
  for (const Plan::Row& r : p.rows)
    if (r.kind.rfind(prefix, 0) == 0) return &r;
  return nullptr;
}

// The status's code, and its message containing `text`.
template <typename T>
void ExpectStatus(const T& r, StatusCode code, const std::string& text) {
  const Status s = ::strata::testing::GetStatus(r);
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_THAT(std::string(s.message()), HasSubstr(text)) << s.ToString();
}

TEST(PlannerMoments, OptimizerStateIsEightBytesAParameterWithBf16Moments) {
  for (uint64_t mb : {uint64_t{4}, uint64_t{2}}) {
    SCOPED_TRACE(mb == 4 ? "fp32 moments" : "bf16 moments");
    const uint64_t per = 4 + 2 * mb;  // fp32 master + m + v
    PlanInputs in = Small(mb);
    const uint64_t n = Params(in);
    // On the GPU.
    ASSERT_OK_AND_ASSIGN(Plan g, MakePlan(in));
    ASSERT_NE(Row(g, "optimizer ("), nullptr);
    EXPECT_EQ(Row(g, "optimizer (")->gpu, n * per);
    EXPECT_EQ(Row(g, "optimizer (")->kind,
              mb == 2 ? "optimizer (fp32 master, bf16 m, v)" : "optimizer (fp32 master, m, v)");
    // On the host, with the speculative update's second set.
    in.offload_optimizer = "cpu";
    in.speculative_state = true;
    ASSERT_OK_AND_ASSIGN(Plan h, MakePlan(in));
    EXPECT_EQ(Row(h, "optimizer (")->host, n * per);
    EXPECT_EQ(h.speculative_bytes, n * per);
    EXPECT_TRUE(h.speculative_fits);
    ASSERT_NE(Row(h, "optimizer, second set"), nullptr);
    EXPECT_EQ(Row(h, "optimizer, second set")->host, n * per);
    EXPECT_THAT(h.Table(in.gpu_budget, in.host_budget), HasSubstr(Row(h, "optimizer (")->kind));
    // On NVMe: read and written once per step.
    in.offload_optimizer = "nvme";
    in.have_nvme = true;
    in.speculative_state = false;
    ASSERT_OK_AND_ASSIGN(Plan v, MakePlan(in));
    EXPECT_EQ(Row(v, "optimizer (")->nvme, n * per);
    EXPECT_EQ(v.nvme_read, n * per);
    EXPECT_EQ(v.nvme_write, n * per);
  }
}

// A host budget between the two plans' needs fits only with bf16 moments.
TEST(PlannerMoments, Bf16MomentsFitWhereFp32OnesDoNot) {
  PlanInputs in = Small(4);
  in.offload_optimizer = "cpu";
  ASSERT_OK_AND_ASSIGN(Plan f, MakePlan(in));
  in.moment_bytes = 2;
  ASSERT_OK_AND_ASSIGN(Plan b, MakePlan(in));
  EXPECT_EQ(f.host_total - b.host_total, Params(in) * 4);
  in.host_budget = b.host_total;
  EXPECT_OK(MakePlan(in).status());
  in.moment_bytes = 4;
  ExpectStatus(MakePlan(in).status(), StatusCode::kOutOfMemory, "host budget");
}

TEST(PlannerMoments, OtherMomentSizesAreAnError) {
  PlanInputs in = Small(3);
  ExpectStatus(MakePlan(in).status(), StatusCode::kInvalidArgument, "3 bytes per Adam moment is not allowed");
}

}  // namespace
}  // namespace strata
