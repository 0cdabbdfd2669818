// SPDX-License-Identifier: Apache-2.0
// The input boundary under malformed input: a corpus of configs and token
// files, generated here (deterministic seeds) beside hand-written nasty
// cases, each run through the config reader or the data loader in-process
// and a few through the `strata` binary with a time limit. Every input must
// end in OK or a clean error (a Status with a message; the binary: exit 2 or
// 1 with a message naming the file), never an exception, a signal or a hang.
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/config.h"
#include "engine/config_json.h"
#include "engine/data.h"
#include "tests/engine/strata_cli.h"
#include "tests/test_util.h"

namespace strata {
namespace {

using ::strata::testing::RunStrata;
using ::strata::testing::StrataRun;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace std::string_literals;
using Clock = std::chrono::steady_clock;

// A config with most keys present, as ConfigToJson writes them.
json FullConfig() {
  Config c = DefaultConfig();
  c.scheduler.type = "WarmupDecayLR";
  c.scheduler.params = {{"total_num_steps", int64_t{100}}, {"warmup_num_steps", int64_t{10}}};
  c.zero.offload_optimizer.device = "nvme";
  c.zero.offload_optimizer.nvme_path = "/tmp/nvme";
  c.data.path = "train.bin";
  return ConfigToJson(c);
}

// Leaves of `j` by JSON pointer and dotted path.
void Leaves(const json& j, const std::string& ptr, const std::string& path,
            std::vector<std::pair<std::string, std::string>>* out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      Leaves(it.value(), ptr + "/" + it.key(), path.empty() ? it.key() : path + "." + it.key(), out);
    return;
  }
  out->push_back({ptr, path});
}

// `ascii` as UTF-16 with its byte-order mark.
std::string Utf16(const std::string& ascii, bool little_endian) {
  std::string s = little_endian ? "\xFF\xFE" : "\xFE\xFF";
  for (char c : ascii) {
    if (little_endian) s += c, s += '\0';
    else s += '\0', s += c;
  }
  return s;
}

// The hand-written cases: text that must not parse, or must not be a config.
std::vector<std::pair<std::string, std::string>> NastyConfigs() {
  std::vector<std::pair<std::string, std::string>> v = {
      {"lr-1e999", R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e999}}})"},
      {"neg-1e999", R"({"gradient_clipping": -1e999})"},
      {"int-huge", R"({"train_micro_batch_size_per_gpu": 100000000000000000000000000000000000})"},
      {"neg-zero", R"({"train_micro_batch_size_per_gpu": -0, "steps_per_print": -0.0})"},
      {"nan-literal", R"({"gradient_clipping": NaN})"},
      {"nan-string", R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": "NaN"})"},
      {"inf-string", R"({"train_micro_batch_size_per_gpu": "Infinity"})"},
      {"deep-arrays", "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}"},
      {"deep-objects", [] {
         std::string s;
         for (int i = 0; i < 50000; ++i) s += "{\"a\":";
         s += "1";
         s += std::string(50000, '}');
         return s;
       }()},
      {"deep-unclosed", std::string(200000, '[')},
      {"huge", "{\"x\": \"" + std::string(5 << 20, 'a') + "\"}"},
      {"large-valid", "{\"train_micro_batch_size_per_gpu\": 1, \"x\": \"" + std::string(3 << 20, 'b') + "\"}"},
      {"many-keys", [] {
         std::string s = "{\"train_micro_batch_size_per_gpu\": 1";
         for (int i = 0; i < 100000; ++i) s += ", \"k" + std::to_string(i) + "\": 1";
         return s + "}";
       }()},
      {"long-key", "{\"" + std::string(1 << 20, 'k') + "\": 1}"},
      {"bom-utf8", "\xEF\xBB\xBF{\"train_micro_batch_size_per_gpu\": 1, \"bogus\": 1}"},
      {"bom-utf16le", Utf16("{\"train_micro_batch_size_per_gpu\": 1}", true)},
      {"bom-utf16be", Utf16("{\"train_micro_batch_size_per_gpu\": 1}", false)},
      {"invalid-utf8", "{\"data\": {\"path\": \"\xC3\x28\xFF\"}}"},
      {"overlong-utf8", "{\"data\": {\"path\": \"\xC0\xAF\"}}"},
      {"lone-surrogate", R"({"data": {"path": "\ud800"}})"},
      {"nul-in-string", "{\"data\": {\"path\": \"a\0b\"}}"s},
      {"control-in-string", "{\"data\": {\"path\": \"a\x01\x1f\"}}"},
      {"dup-top", R"({"train_micro_batch_size_per_gpu": 1, "train_micro_batch_size_per_gpu": 2})"},
      {"dup-nested", R"({"optimizer": {"params": {"lr": 1, "lr": 1}}})"},
      {"empty", ""},
      {"spaces", "   \n\t  "},
      {"null", "null"},
      {"array", "[1, 2, 3]"},
      {"string", "\"ds_config\""},
      {"number", "8"},
      {"trailing", R"({"train_micro_batch_size_per_gpu": 1} {"again": 1})"},
      {"unterminated-string", R"({"a": "abc)"},
      {"unterminated-comment", "{\"train_micro_batch_size_per_gpu\": 1} /* no end"},
      {"only-comment", "// nothing else"},
      {"trailing-comma", R"({"train_micro_batch_size_per_gpu": 1,})"},
      {"single-quotes", R"({'train_micro_batch_size_per_gpu': 1})"},
      {"auto-everywhere", R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
         "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": "auto",
         "fp16": {"enabled": "auto", "loss_scale": "auto"}, "model": {"n_layer": "auto"}})"},
      {"type-mix", R"({"train_micro_batch_size_per_gpu": [1], "optimizer": "AdamW", "zero_optimization": 3,
         "scheduler": [], "model": true, "data": "x.bin", "trainer": null})"},
  };
  return v;
}

// Each result: OK, or an error with a message; never an exception.
struct Outcome {
  bool ok = false;
  std::string message;
};

Outcome LoadCatching(const std::string& path) {
  try {
    auto r = LoadConfig(path, 1, nullptr);
    return {r.ok(), r.ok() ? "" : r.status().ToString()};
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << ": exception " << e.what();
  } catch (...) {
    ADD_FAILURE() << path << ": unknown exception";
  }
  return {false, "exception"};
}

std::string WriteFile(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string p = dir.File(name);
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p;
}

TEST(ConfigFuzz, HandWrittenNastyConfigsAreCleanErrors) {
  TempDir dir;
  for (const auto& [name, text] : NastyConfigs()) {
    SCOPED_TRACE(name);
    const std::string p = WriteFile(dir, name + ".json", text);
    const auto t0 = Clock::now();
    Outcome o = LoadCatching(p);
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
    EXPECT_FALSE(o.ok) << "accepted";
    EXPECT_THAT(o.message, HasSubstr("InvalidArgument"));
    EXPECT_THAT(o.message, HasSubstr(p));
    EXPECT_LT(o.message.size(), 4000u) << o.message.substr(0, 400);
    EXPECT_TRUE(IsUtf8(o.message)) << name;
  }
}

// Every field of a full config replaced with each wrong value: an error
// naming the field's path, or OK where the value is one the field takes.
TEST(ConfigFuzz, WrongTypesInEveryField) {
  const json full = FullConfig();
  ASSERT_OK(ParseConfig(full, "full", 1, nullptr).status());
  std::vector<std::pair<std::string, std::string>> leaves;
  Leaves(full, "", "", &leaves);
  const std::vector<json> wrong = {nullptr, true,  "x",     "auto", -1, 0,        -0.0, 0.5,
                                   1e300,   1e-300, json::array(), json::object(), "NaN", std::string(500, 'z')};
  size_t errors = 0;
  for (const auto& [ptr, path] : leaves) {
    for (const json& w : wrong) {
      json j = full;
      j[json::json_pointer(ptr)] = w;
      try {
        auto r = ParseConfig(j, "ds.json", 1, nullptr);
        if (r.ok()) continue;
        ++errors;
        const std::string m(r.status().message());
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << path;
        // The message names the field, or (for a value another rule refuses)
        // the keys that rule is about; never a whole large value.
        const std::string last = path.substr(path.rfind('.') + 1);
        EXPECT_TRUE(m.find(last) != std::string::npos || m.find("train_batch_size") != std::string::npos)
            << path << " = " << w.dump().substr(0, 40) << ": " << m;
        EXPECT_LT(m.size(), 2000u) << path;
      } catch (const std::exception& e) {
        ADD_FAILURE() << path << " = " << w.dump().substr(0, 40) << ": exception " << e.what();
      }
    }
  }
  EXPECT_GT(errors, leaves.size() * 5);  // most replacements are wrong
}

// Random byte mutations of a valid config (fixed seeds): OK or a clean error.
TEST(ConfigFuzz, RandomMutationsOfAValidConfig) {
  const std::string base = FullConfig().dump(2);
  TempDir dir;
  const auto t0 = Clock::now();
  for (uint64_t seed = 1; seed <= 1500; ++seed) {
    std::mt19937_64 rng(seed);
    std::string s = base;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 5) {
        case 0: s[at] = static_cast<char>(rng() & 0xFF); break;        // flip a byte
        case 1: s.erase(at, 1 + rng() % 16); break;                   // cut
        case 2: s.insert(at, 1, "{}[]\",:0e-.\\"[rng() % 12]); break;  // a JSON character
        case 3: s.insert(at, s.substr(rng() % s.size(), rng() % 64)); break;  // duplicate a piece
        case 4: s.insert(at, "1e999"); break;
      }
    }
    const std::string p = WriteFile(dir, "m.json", s);
    Outcome o = LoadCatching(p);
    if (!o.ok) {
      EXPECT_THAT(o.message, HasSubstr(p)) << seed;
      EXPECT_TRUE(IsUtf8(o.message)) << seed;
    }
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(120));
}

// ---- token files ------------------------------------------------------------------

std::string LlmcBytes(int32_t magic, int32_t version, int32_t count, size_t tokens, uint16_t fill) {
  std::vector<int32_t> h(256, 0);
  h[0] = magic, h[1] = version, h[2] = count;
  std::string s(reinterpret_cast<const char*>(h.data()), 1024);
  std::vector<uint16_t> t(tokens, fill);
  s.append(reinterpret_cast<const char*>(t.data()), 2 * tokens);
  return s;
}

TEST(ConfigFuzz, MalformedTokenFilesAreCleanErrors) {
  TempDir dir;
  std::vector<std::pair<std::string, std::string>> files = {
      {"empty.bin", ""},
      {"one.bin", "x"},
      {"odd.bin", std::string(1001, '\1')},
      {"header-only.bin", LlmcBytes(20240520, 1, 0, 0, 0)},
      {"negative-count.bin", LlmcBytes(20240520, 1, -5, 100, 1)},
      {"huge-count.bin", LlmcBytes(20240520, 1, 2147483647, 100, 1)},
      {"version-2.bin", LlmcBytes(20240520, 2, 100, 100, 1)},
      {"wrong-magic.bin", LlmcBytes(12345, 1, 100, 100, 1)},
      {"wrong-magic.txt", LlmcBytes(20240519, 1, 100, 100, 1)},
      {"uint32.bin", LlmcBytes(20240801, 7, 50, 100, 1)},
      {"model.bin", LlmcBytes(20240326, 3, 1024, 100, 1)},
      {"out-of-vocab.bin", LlmcBytes(20240520, 1, 100, 100, 65535)},
      {"raw-out-of-vocab.bin", std::string(200, '\xFF')},
  };
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 rng(seed);
    std::string s(rng() % 5000, '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xFF);
    if (seed % 3 == 0 && s.size() >= 12) {  // a real magic over random fields
      const int32_t magic = 20240520;
      std::memcpy(s.data(), &magic, 4);
    }
    files.push_back({"random-" + std::to_string(seed) + (seed % 2 ? ".bin" : ".dat"), s});
  }
  const auto t0 = Clock::now();
  for (const auto& [name, bytes] : files) {
    SCOPED_TRACE(name);
    const std::string p = WriteFile(dir, name, bytes);
    for (const char* format : {"auto", "tokens", "text"}) {
      try {
        DataConfig cfg;
        cfg.path = p;
        cfg.format = format;
        auto d = DataLoader::Open(cfg, "", 50304, 2, 8);
        if (!d.ok()) {
          EXPECT_FALSE(d.status().message().empty());
          EXPECT_THAT(d.status().ToString(), HasSubstr(p));
          continue;
        }
        std::vector<int32_t> x(16), y(16);
        for (int k = 0; k < 3; ++k) {
          Status s = (*d)->NextTrain(x.data(), y.data());
          if (!s.ok()) {
            EXPECT_THAT(s.ToString(), HasSubstr(p));
          }
        }
        if ((*d)->val_tokens()) {
          Status s = (*d)->Val(0, x.data(), y.data());
          if (!s.ok()) {
            EXPECT_THAT(s.ToString(), HasSubstr(p));
          }
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << format << ": exception " << e.what();
      }
    }
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(60));
  // The known-bad ones are errors whatever else passes.
  for (const char* bad : {"empty.bin", "odd.bin", "negative-count.bin", "huge-count.bin", "version-2.bin",
                          "wrong-magic.bin", "wrong-magic.txt", "uint32.bin", "model.bin", "out-of-vocab.bin",
                          "raw-out-of-vocab.bin"}) {
    DataConfig cfg;
    cfg.path = dir.File(bad);
    EXPECT_FALSE(DataLoader::Open(cfg, "", 50304, 2, 8).ok()) << bad;
  }
}

// A few of the corpus through the binary: exit 2 or 1 with a message naming
// the file, within the time limit, no signal.
TEST(ConfigFuzz, TheBinaryEndsCleanlyOnTheNastyOnes) {
  TempDir dir;
  const std::vector<std::string> names = {"lr-1e999", "deep-arrays", "deep-objects", "huge", "dup-nested",
                                          "invalid-utf8", "bom-utf16le", "empty", "type-mix", "auto-everywhere"};
  std::map<std::string, std::string> nasty;
  for (const auto& [name, text] : NastyConfigs()) nasty[name] = text;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const std::string p = WriteFile(dir, name + ".json", nasty.at(name));
    StrataRun r = RunStrata({"train", "--config", p, "--dry-run", "--backend", "cpu"}, 30);
    EXPECT_FALSE(r.timed_out);
    EXPECT_FALSE(r.signalled) << r.output.substr(0, 400);
    EXPECT_TRUE(r.rc == 2 || r.rc == 1) << r.rc << ": " << r.output.substr(0, 400);
    EXPECT_THAT(r.output, HasSubstr("strata: "));
    EXPECT_THAT(r.output, HasSubstr(p));
  }
  // A token file with a wrong magic as --data.
  json cfg = {{"train_micro_batch_size_per_gpu", 1},
              {"model", {{"n_layer", 1}, {"n_embd", 32}, {"n_head", 2}, {"vocab_size", 50304}, {"seq_len", 8}}}};
  const std::string c = WriteFile(dir, "c.json", cfg.dump());
  const std::string data = WriteFile(dir, "shard.bin", LlmcBytes(20240521, 1, 100, 100, 1));
  StrataRun r = RunStrata({"train", "--config", c, "--data", data, "--backend", "cpu", "--steps", "1"}, 60);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr(data + " has an llm.c token file's 256-int header"));
}

}  // namespace
}  // namespace strata
