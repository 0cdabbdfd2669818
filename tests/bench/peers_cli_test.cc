// SPDX-License-Identifier: Apache-2.0
// strata-bench train --peers as a user runs it, on the CPU backend at a tiny
// shape: after strata's figure, the peers (bench/peers/train_peers.py) run on
// the same shape and each stands beside strata with the ratio, or one line
// says the peers were skipped and why; --peer-list is checked by name.
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/bench/cli_util.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::BenchBinary;
using ::strata::testing::ReadFile;
using ::strata::testing::RunCommand;
using ::strata::testing::TempDir;

// Sets an environment variable for the commands run in one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? ::setenv(name_, old_.c_str(), 1) : ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// Whether strata-bench will find a Python that imports torch (the same rule:
// $STRATA_TORCH_PYTHON alone when set, else python3, else /usr/bin/python3).
bool HaveTorchPython() {
  const char* named = std::getenv("STRATA_TORCH_PYTHON");
  const std::string probe = named && *named ? "\"$STRATA_TORCH_PYTHON\" -c 'import torch'"
                                            : "python3 -c 'import torch' || /usr/bin/python3 -c 'import torch'";
  return RunCommand({"/bin/sh", "-c", probe + " >/dev/null 2>&1"}).rc == 0;
}

const std::vector<std::string> kTinyResident = {"train", "--resident", "--backend", "cpu", "--steps", "2", "--warmup",
                                                "1", "--no-profile", "--peers"};

nlohmann::json RunPeersJson(const std::vector<std::string>& extra, testing::CommandResult* r) {
  TempDir out;
  std::vector<std::string> argv = {BenchBinary()};
  argv.insert(argv.end(), kTinyResident.begin(), kTinyResident.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"--json", out.File("train.json")});
  *r = RunCommand(argv);
  return nlohmann::json::parse(ReadFile(out.File("train.json")), nullptr, false);
}

TEST(BenchPeers, EachPeerStandsBesideStrataOrTheSkipSaysWhy) {
  testing::CommandResult r;
  const nlohmann::json j = RunPeersJson({}, &r);
  ASSERT_EQ(r.rc, 0) << r.output;
  ASSERT_FALSE(j.is_discarded()) << r.output;
  ASSERT_TRUE(j["meta"].contains("peers")) << r.output;
  const nlohmann::json& peers = j["meta"]["peers"];
  if (!HaveTorchPython()) {
    EXPECT_NE(r.output.find("peers: skipped: no Python here imports torch"), std::string::npos) << r.output;
    EXPECT_FALSE(peers["skipped"].get<std::string>().empty());
    return;
  }
  // strata's own figure first, then the peers' table, then strata beside them.
  const size_t strata_at = r.output.find("model FLOPs at the peak (ratio = MFU)");
  const size_t beside_at = r.output.find("strata beside its peers");
  ASSERT_NE(strata_at, std::string::npos) << r.output;
  ASSERT_NE(beside_at, std::string::npos) << r.output;
  EXPECT_LT(strata_at, beside_at);
  ASSERT_EQ(peers["beside"].size(), 1u) << peers.dump();  // the CPU: eager only
  const nlohmann::json& eager = peers["beside"][0];
  EXPECT_EQ(eager["figure"], "tokens/s vs eager");
  const double strata = eager["value"], peer = eager["baseline"];
  EXPECT_GT(peer, 0);
  EXPECT_DOUBLE_EQ(strata, peers["strata_tokens_per_s"].get<double>());
  EXPECT_NEAR(eager["ratio"].get<double>(), strata / peer, 1e-9 * strata / peer);
  // The peer ran strata's shape: the tiny CPU default.
  const nlohmann::json& shape = peers["script_json"]["shape"];
  EXPECT_EQ(shape["layers"], j["meta"]["layers"]);
  EXPECT_EQ(shape["d_model"], j["meta"]["d"]);
  EXPECT_EQ(shape["seq"], j["meta"]["seq"]);
  EXPECT_EQ(shape["micro_batch"], j["meta"]["batch"]);
  EXPECT_EQ(shape["vocab"], j["meta"]["vocab"]);
  EXPECT_EQ(shape["step"], "fwd-bwd");
  EXPECT_EQ(shape["checkpoint"], "all-but-last");
}

TEST(BenchPeers, APythonWithoutTorchIsOneSkipLine) {
  ScopedEnv env("STRATA_TORCH_PYTHON", "/nonexistent/python3");
  testing::CommandResult r;
  const nlohmann::json j = RunPeersJson({}, &r);
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("peers: skipped: no Python here imports torch (STRATA_TORCH_PYTHON=/nonexistent/python3"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("strata beside its peers"), std::string::npos) << r.output;
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_NE(j["meta"]["peers"]["skipped"].get<std::string>().find("/nonexistent/python3"), std::string::npos);
}

TEST(BenchPeers, BadPeerArgumentsAreNamed) {
  struct Case {
    std::vector<std::string> args;
    std::string named;
  } cases[] = {
      {{"train", "--resident", "--backend", "cpu", "--peers", "--peer-list", "eager,megatron"},
       "--peer-list 'megatron': not a peer"},
      {{"train", "--resident", "--backend", "cpu", "--peers", "--peer-list", ","}, "--peer-list ',': names no peer"},
      {{"train", "--resident", "--backend", "cpu", "--peer-list", "eager"}, "--peer-list applies with --peers only"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {BenchBinary()};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = RunCommand(argv);
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_NE(r.output.find(c.named), std::string::npos) << "expected '" << c.named << "' in: " << r.output;
    EXPECT_EQ(r.output.find("measured:"), std::string::npos) << "measured before refusing: " << r.output;
  }
}

}  // namespace
}  // namespace strata
