// SPDX-License-Identifier: Apache-2.0
// Global-norm clipping and the combined gradient multiplier.
#include "optim/grad_clip.h"

#include <cmath>
#include <limits>

#include "tests/test_util.h"

namespace strata::optim {
namespace {

using ::strata::testing::StatusIs;

TEST(GradClip, CoefficientIsTorchsMinOneMaxNormOverNorm) {
  EXPECT_DOUBLE_EQ(ClipCoefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  EXPECT_DOUBLE_EQ(ClipCoefficient(0.5, 1.0), 1.0);    // below the threshold: untouched
  EXPECT_DOUBLE_EQ(ClipCoefficient(1.0, 1.0), 1.0 / (1.0 + 1e-6));  // at it: the 1e-6 bites
  EXPECT_DOUBLE_EQ(ClipCoefficient(10.0, 0.0), 1.0);   // gradient_clipping 0: off
  EXPECT_DOUBLE_EQ(ClipCoefficient(10.0, -1.0), 1.0);
  EXPECT_DOUBLE_EQ(ClipCoefficient(std::numeric_limits<double>::infinity(), 1.0), 1.0);
}

TEST(GradClip, MatchesDeepSpeedsCombinedScale) {
  // DeepSpeed: clip = (norm_scaled / scale + 1e-6) / max_norm; divide by
  // clip * scale when clip > 1.
  const double scale = 4096, max_norm = 1.0;
  for (double norm : {0.1, 0.999, 1.0, 3.0, 1e4}) {
    double ds_clip = ((norm * scale / scale) + 1e-6) / max_norm;
    double ds_mult = 1.0 / ((ds_clip > 1 ? ds_clip : 1.0) * scale);
    EXPECT_NEAR(GradMultiplier(scale, ClipCoefficient(norm, max_norm)), ds_mult, 1e-15 * ds_mult) << norm;
  }
}

TEST(GradClip, GlobalNormFromMergedShards) {
  GradStats a{9.0, 0, 3}, b{16.0, 0, 5};
  GradStats total;
  total.Merge(a);
  total.Merge(b);
  EXPECT_EQ(total.count, 8u);
  EXPECT_FALSE(total.overflow());
  EXPECT_DOUBLE_EQ(GlobalGradNorm(total, 1.0), 5.0);
  EXPECT_DOUBLE_EQ(GlobalGradNorm(total, 1024.0), 5.0 / 1024.0);
  total.Merge(GradStats{0.0, 2, 2});
  EXPECT_TRUE(total.overflow());
  EXPECT_TRUE(std::isinf(GlobalGradNorm(total, 1.0)));
  EXPECT_TRUE(std::isinf(GlobalGradNorm(GradStats{std::numeric_limits<double>::infinity(), 0, 1}, 1.0)));
}

TEST(GradClip, Validation) {
  EXPECT_OK(ValidateGradientClipping(0.0));
  EXPECT_OK(ValidateGradientClipping(1.0));
  EXPECT_THAT(ValidateGradientClipping(std::nan("")), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace strata::optim
