// SPDX-License-Identifier: Apache-2.0
// Checkpoints on the CPU backend: every file's crc32c and the step are in
// the manifest and verified before a resume loads anything (a flipped byte
// in any file, a file copied in from another step: DataLoss naming the
// file); an older manifest without checksums still loads, with a warning;
// a step directory carries what Hugging Face needs to load it (config.json,
// generation_config.json, the tokenizer files of --init-from's directory);
// --init-from takes a model directory as well as a file.
#include "engine/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "engine/safetensors.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::FileBytes;
using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

TrainOptions Tiny(int64_t steps) {
  TrainOptions o = testing::TinyTrainer(2);
  o.steps = steps;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.gpu_memory_limit = 256 * kMiB;
  o.host_memory_limit = 256 * kMiB;
  return o;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// A trainer after `steps` steps, saved under `dir` (after each step with `every`).
void TrainAndSave(const TrainOptions& o, int64_t steps, const std::string& dir, bool every = false) {
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  ASSERT_OK(t.status());
  for (int64_t i = 0; i < steps; ++i) {
    ASSERT_OK((*t)->Step().status());
    if (every) {
      ASSERT_OK((*t)->Save(dir));
    }
  }
  if (!every) {
    ASSERT_OK((*t)->Save(dir));
  }
}

Status Resume(const std::string& dir, std::string* log_text = nullptr) {
  TrainOptions r = Tiny(4);
  r.resume_dir = dir;
  std::ostringstream log;
  auto t = Trainer::Create(r, log);
  if (log_text) *log_text = log.str();
  return t.status();
}

// One flipped byte in any file of a step directory, at its start, middle or
// end, is DataLoss naming that file; the restored file resumes again.
TEST(Checkpoint, AFlippedByteInAnyFileIsDataLossNamingIt) {
  TempDir dir;
  TrainAndSave(Tiny(1), 1, dir.path());
  const std::string step = dir.File("step-000001");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(step)) files.push_back(e.path().filename().string());
  for (const char* f : {"model.safetensors", "master.safetensors", "optimizer.safetensors", "manifest.json",
                        "config.json", "generation_config.json"})
    EXPECT_NE(std::find(files.begin(), files.end(), f), files.end()) << f;
  for (const std::string& name : files) {
    const std::string path = step + "/" + name;
    const std::string good = FileBytes(path);
    ASSERT_FALSE(good.empty()) << name;
    for (size_t at : {size_t{0}, good.size() / 2, good.size() - 1}) {
      SCOPED_TRACE(name + " byte " + std::to_string(at));
      std::string bad = good;
      bad[at] = static_cast<char>(bad[at] ^ 0x01);
      WriteBytes(path, bad);
      Status s = Resume(dir.path());
      EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
      EXPECT_THAT(s.ToString(), HasSubstr(path));
    }
    WriteBytes(path, good);
  }
  EXPECT_OK(Resume(dir.path()));
}

// An exponent bit flipped in a weight (the loss would have gone from 4.12 to
// 5.54 with exit 0): the error names master.safetensors and both checksums.
TEST(Checkpoint, AFlippedExponentIsCaught) {
  TempDir dir;
  TrainAndSave(Tiny(1), 1, dir.path());
  const std::string path = dir.File("step-000001/master.safetensors");
  std::string bytes = FileBytes(path);
  bytes[bytes.size() - 1] = static_cast<char>(bytes[bytes.size() - 1] ^ 0x40);  // the last float's exponent
  WriteBytes(path, bytes);
  Status s = Resume(dir.path());
  ASSERT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(s.ToString(), HasSubstr("does not match its checksum"));
  EXPECT_THAT(s.ToString(), HasSubstr("master.safetensors"));
}

// A state file copied in from another step's directory: the error says which
// step it belongs to.
TEST(Checkpoint, AFileFromAnotherStepIsRefused) {
  TempDir dir;
  TrainAndSave(Tiny(2), 2, dir.path(), /*every=*/true);
  for (const char* f : {"model.safetensors", "master.safetensors", "optimizer.safetensors"}) {
    SCOPED_TRACE(f);
    const std::string two = dir.File(std::string("step-000002/") + f);
    const std::string good = FileBytes(two);
    fs::copy_file(dir.File(std::string("step-000001/") + f), two, fs::copy_options::overwrite_existing);
    Status s = Resume(dir.path());
    ASSERT_THAT(s, StatusIs(StatusCode::kDataLoss));
    EXPECT_THAT(s.ToString(), HasSubstr("belongs to step 1"));
    EXPECT_THAT(s.ToString(), HasSubstr("manifest to step 2"));
    EXPECT_THAT(s.ToString(), HasSubstr(two));
    WriteBytes(two, good);
  }
  EXPECT_OK(Resume(dir.path()));
}

// A missing or truncated file is named as such.
TEST(Checkpoint, AMissingOrTruncatedFileIsNamed) {
  TempDir dir;
  TrainAndSave(Tiny(1), 1, dir.path());
  const std::string path = dir.File("step-000001/optimizer.safetensors");
  const std::string good = FileBytes(path);
  WriteBytes(path, good.substr(0, good.size() - 4096));
  Status s = Resume(dir.path());
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(s.ToString(), HasSubstr("truncated"));
  fs::remove(path);
  s = Resume(dir.path());
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(s.ToString(), HasSubstr("missing"));
  EXPECT_THAT(s.ToString(), HasSubstr(path));
}

// A checkpoint written before checksums existed (no "checksums", no
// "manifest_crc32c") still resumes, and says it could not be verified.
TEST(Checkpoint, AnOlderManifestLoadsWithAWarning) {
  TempDir dir;
  TrainAndSave(Tiny(1), 1, dir.path());
  const std::string mpath = dir.File("step-000001/manifest.json");
  nlohmann::json m = nlohmann::json::parse(FileBytes(mpath));
  m.erase("checksums");
  m.erase("manifest_crc32c");
  WriteBytes(mpath, m.dump(2));
  std::string log;
  EXPECT_OK(Resume(dir.path(), &log));
  EXPECT_THAT(log, HasSubstr("saved without checksums"));
  // The manifest's own fields are the old ones, and the new ones only added.
  m = nlohmann::json::parse(FileBytes(mpath));
  for (const char* k : {"format", "step", "data_position", "precision", "model", "loss_scaler", "files", "config"})
    EXPECT_TRUE(m.contains(k)) << k;
  EXPECT_EQ(m["files"]["model"], "model.safetensors");
}

TEST(Checkpoint, TheManifestRecordsEveryFileAndTheStep) {
  TempDir dir;
  TrainAndSave(Tiny(1), 1, dir.path());
  const std::string step = dir.File("step-000001");
  nlohmann::json m = nlohmann::json::parse(FileBytes(step + "/manifest.json"));
  EXPECT_EQ(m["step"], 1);
  ASSERT_TRUE(m["checksums"].is_object());
  size_t listed = 0;
  for (const auto& e : fs::directory_iterator(step)) {
    const std::string name = e.path().filename().string();
    if (name == "manifest.json") continue;
    ASSERT_TRUE(m["checksums"].contains(name)) << name;
    EXPECT_EQ(m["checksums"][name]["bytes"].get<uint64_t>(), fs::file_size(e.path())) << name;
    EXPECT_EQ(m["checksums"][name]["crc32c"].get<std::string>().size(), 8u) << name;
    ++listed;
  }
  EXPECT_EQ(listed, m["checksums"].size());
  ASSERT_OK_AND_ASSIGN(auto f, SafetensorsFile::Open(step + "/model.safetensors"));
  EXPECT_EQ(f.metadata().at("step"), "1");
}

// A Hugging Face model directory as Hugging Face writes it: config.json,
// model.safetensors (these weights: a saved strata checkpoint's), the
// tokenizer files.
void MakeModelDir(const std::string& from_step, const std::string& dir) {
  fs::create_directories(dir);
  fs::copy_file(from_step + "/model.safetensors", dir + "/model.safetensors");
  nlohmann::json config = nlohmann::json::parse(FileBytes(from_step + "/config.json"));
  config["bos_token_id"] = 0;
  config["eos_token_id"] = 1;
  config["resid_pdrop"] = 0.1;
  WriteBytes(dir + "/config.json", config.dump(2));
  WriteBytes(dir + "/tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})");
  WriteBytes(dir + "/tokenizer_config.json", R"({"model_max_length": 32, "tokenizer_class": "GPT2Tokenizer"})");
  WriteBytes(dir + "/special_tokens_map.json", R"({"eos_token": "<|endoftext|>"})");
  WriteBytes(dir + "/merges.txt", "#version: 0.2\n");
}

// Fine-tuning keeps what the model came with: a step directory saved after
// --init-from DIR has DIR's tokenizer files (the same bytes), a config.json
// of the trained shape over DIR's (its token ids and dropouts kept), and a
// generation_config.json with those ids; so does the next run's, resumed
// from it.
TEST(Checkpoint, FineTuningKeepsTheModelsFiles) {
  TempDir base, model, tuned, again;
  TrainAndSave(Tiny(1), 1, base.path());
  MakeModelDir(base.File("step-000001"), model.File("gpt2"));
  TrainOptions o = Tiny(2);
  o.init_from = model.File("gpt2");  // a directory
  TrainAndSave(o, 2, tuned.path());
  const std::string step = tuned.File("step-000002");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "merges.txt"})
    EXPECT_EQ(FileBytes(step + "/" + f), FileBytes(model.File("gpt2/") + f)) << f;
  nlohmann::json config = nlohmann::json::parse(FileBytes(step + "/config.json"));
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["bos_token_id"], 0);
  EXPECT_EQ(config["eos_token_id"], 1);
  EXPECT_EQ(config["resid_pdrop"], 0.1);
  EXPECT_EQ(config["n_layer"], 2);
  EXPECT_EQ(config["n_embd"], 64);
  EXPECT_EQ(config["n_head"], 4);
  EXPECT_EQ(config["vocab_size"], 256);
  EXPECT_EQ(config["n_positions"], 32);
  EXPECT_EQ(config["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(config["tie_word_embeddings"], true);
  // The shapes agree with the weights transformers would load into them.
  ASSERT_OK_AND_ASSIGN(auto f, SafetensorsFile::Open(step + "/model.safetensors"));
  EXPECT_EQ(f.Find("transformer.wpe.weight")->shape, (Shape{32, 64}));
  EXPECT_EQ(f.Find("transformer.wte.weight")->shape, (Shape{256, 64}));
  nlohmann::json gen = nlohmann::json::parse(FileBytes(step + "/generation_config.json"));
  EXPECT_EQ(gen["bos_token_id"], 0);
  EXPECT_EQ(gen["eos_token_id"], 1);

  TrainOptions r = Tiny(3);
  r.resume_dir = tuned.path();
  TrainAndSave(r, 1, again.path());
  EXPECT_EQ(FileBytes(again.File("step-000003/tokenizer.json")), FileBytes(model.File("gpt2/tokenizer.json")));
  EXPECT_EQ(nlohmann::json::parse(FileBytes(again.File("step-000003/config.json")))["eos_token_id"], 1);
}

// A fresh model's step directory: a config.json without token ids (a byte
// vocabulary has none) and no tokenizer files.
TEST(Checkpoint, AFreshModelsConfigHasNoTokenIds) {
  TempDir dir;
  TrainAndSave(Tiny(1), 1, dir.path());
  nlohmann::json config = nlohmann::json::parse(FileBytes(dir.File("step-000001/config.json")));
  EXPECT_FALSE(config.contains("bos_token_id"));
  EXPECT_EQ(config["attn_pdrop"], 0.0);
  nlohmann::json gen = nlohmann::json::parse(FileBytes(dir.File("step-000001/generation_config.json")));
  EXPECT_FALSE(gen.contains("eos_token_id"));
  EXPECT_FALSE(fs::exists(dir.File("step-000001/tokenizer.json")));
}

// --init-from a directory (it was `cannot mmap ... ENODEV`): its
// model.safetensors, the same weights as --init-from the file.
TEST(Checkpoint, InitFromAcceptsAModelDirectory) {
  TempDir base, model;
  TrainAndSave(Tiny(1), 1, base.path());
  MakeModelDir(base.File("step-000001"), model.File("gpt2"));
  std::vector<std::vector<float>> got;
  for (const std::string& from : {model.File("gpt2"), model.File("gpt2/model.safetensors")}) {
    TrainOptions o = Tiny(1);
    o.init_from = from;
    std::ostringstream log;
    ASSERT_OK_AND_ASSIGN(auto t, Trainer::Create(o, log));
    ASSERT_OK_AND_ASSIGN(auto w, t->Parameter("transformer.h.1.mlp.c_fc.weight"));
    got.push_back(w);
  }
  EXPECT_EQ(got[0], got[1]);
  // A directory without model.safetensors reads the index instead (a
  // sharded directory: tests/engine/hf_weights_test.cc), or says it has neither.
  fs::remove(model.File("gpt2/model.safetensors"));
  WriteBytes(model.File("gpt2/model.safetensors.index.json"), "{}");
  TrainOptions o = Tiny(1);
  o.init_from = model.File("gpt2");
  std::ostringstream log;
  auto t = Trainer::Create(o, log);
  EXPECT_THAT(t, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(t.status().ToString(), HasSubstr("weight_map"));
  fs::remove(model.File("gpt2/model.safetensors.index.json"));
  t = Trainer::Create(o, log);
  EXPECT_THAT(t, StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(t.status().ToString(), HasSubstr("without model.safetensors"));
}

}  // namespace
}  // namespace strata
