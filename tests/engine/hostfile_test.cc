// SPDX-License-Identifier: Apache-2.0
// engine/hostfile.h: DeepSpeed's hostfile, good files and bad ones (each
// error names the file and the line).
#include "engine/hostfile.h"

#include <string>

#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Hostfile, HostsSlotsCommentsAndBlankLines) {
  ASSERT_OK_AND_ASSIGN(std::vector<HostSlots> h, ParseHostfile("# the cluster\n"
                                                                "\n"
                                                                "worker-1 slots=8\n"
                                                                "   worker-2   slots=4   # half a node\n"
                                                                "10.0.0.3 slots=1",
                                                                "hosts.txt"));
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].host, "worker-1");
  EXPECT_EQ(h[0].slots, 8);
  EXPECT_EQ(h[1].host, "worker-2");
  EXPECT_EQ(h[1].slots, 4);
  EXPECT_EQ(h[2].host, "10.0.0.3");
  EXPECT_EQ(h[2].slots, 1);
}

TEST(Hostfile, BadLinesNameTheFileAndLine) {
  struct Case {
    const char* text;
    const char* line;
    const char* what;
  };
  for (const Case& c : {Case{"a slots=2\nb\n", "hosts.txt:2:", "host b has no slots=N"},
                        Case{"a slots=0\n", "hosts.txt:1:", "slots=0 for host a is not an integer from 1"},
                        Case{"a slots=x\n", "hosts.txt:1:", "slots=x"},
                        Case{"a slots=\n", "hosts.txt:1:", "slots= for host a"},
                        Case{"\n\na gpus=2\n", "hosts.txt:3:", "\"gpus=2\" after host a is not slots=N"},
                        Case{"a slots=1 slots=2\n", "hosts.txt:1:", "slots given twice"},
                        Case{"a slots=1\n#\na slots=2\n", "hosts.txt:3:", "host a is listed twice"},
                        Case{"slots=2\n", "hosts.txt:1:", "is not a host name"}}) {
    auto r = ParseHostfile(c.text, "hosts.txt");
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument)) << c.text;
    EXPECT_THAT(r.status().message(), HasSubstr(std::string("hostfile ") + c.line)) << c.text;
    EXPECT_THAT(r.status().message(), HasSubstr(c.what)) << c.text;
  }
  auto empty = ParseHostfile("# nobody\n\n", "empty.txt");
  EXPECT_THAT(empty, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(empty.status().message(), HasSubstr("hostfile empty.txt lists no host"));
}

TEST(Hostfile, MissingFileIsNamed) {
  auto r = ReadHostfile("/nonexistent/hosts.txt");
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().ToString(), HasSubstr("/nonexistent/hosts.txt"));
}

}  // namespace
}  // namespace strata
