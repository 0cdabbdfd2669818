// SPDX-License-Identifier: Apache-2.0
// Run-time CPU feature detection and the choice of the Adam path.
#include "optim/cpu_features.h"

#include <fstream>
#include <sstream>
#include <string>

#include "tests/test_util.h"

namespace strata::optim {
namespace {

using ::strata::testing::StatusIs;

// The kernel's view of the CPU flags (Linux), to cross-check cpuid.
std::string ProcCpuFlags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) {
      std::string flags(" ");
      flags.append(line, line.find(':') + 1);
      flags.push_back(' ');
      return flags;
    }
  return "";
}

TEST(CpuFeatures, AgreeWithProcCpuinfo) {
  std::string flags = ProcCpuFlags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line";
  const CpuFeatures& f = DetectCpuFeatures();
  auto has = [&](const char* name) { return flags.find(std::string(" ") + name + " ") != std::string::npos; };
  EXPECT_EQ(f.avx2, has("avx2"));
  EXPECT_EQ(f.fma, has("fma"));
  EXPECT_EQ(f.f16c, has("f16c"));
  EXPECT_EQ(f.avx512f, has("avx512f"));
  EXPECT_EQ(f.avx512bw, has("avx512bw"));
  EXPECT_EQ(f.avx512_bf16, has("avx512_bf16"));
  EXPECT_EQ(f.avx512_fp16, has("avx512_fp16"));
  EXPECT_FALSE(CpuFeatureString(f).empty());
}

TEST(CpuFeatures, PathsAreOrderedAndScalarAlwaysWorks) {
  std::vector<Isa> isas = SupportedIsas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kScalar);
  EXPECT_EQ(isas.back(), BestIsa());
  EXPECT_TRUE(IsaSupported(Isa::kAuto));
  ASSERT_OK_AND_ASSIGN(Isa best, ResolveIsa(Isa::kAuto));
  EXPECT_EQ(best, BestIsa());
  // Each path implies the ones below it.
  EXPECT_TRUE(!IsaSupported(Isa::kAvx512Bf16) || IsaSupported(Isa::kAvx512));
  EXPECT_TRUE(!IsaSupported(Isa::kAvx512) || IsaSupported(Isa::kAvx2));
}

TEST(CpuFeatures, NamesRoundTrip) {
  for (Isa i : {Isa::kAuto, Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    ASSERT_OK_AND_ASSIGN(Isa back, ParseIsa(IsaName(i)));
    EXPECT_EQ(back, i);
  }
  EXPECT_THAT(ParseIsa("sse4"), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace strata::optim
