// SPDX-License-Identifier: Apache-2.0
// Checkpoints (engine/checkpoint.h): the save — state files, the Hugging
// Face files, the manifest with every file's checksum, into place — and the
// load — the manifest and every file verified, then the tensors validated
// and written into the shards.
#include "engine/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "base/half.h"
#include "engine/durable_file.h"
#include "engine/hf_export.h"
#include "engine/hf_weights_writer.h"
#include "engine/safetensors.h"
#include "tiers/nvme/checksum.h"

namespace strata {

namespace fs = std::filesystem;
using models::ParamSpec;

namespace {

constexpr const char* kFormat = "strata-checkpoint-1";
constexpr const char* kMasterFile = "master.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
// Where a checkpoint written before master.safetensors existed kept the masters.
constexpr const char* kOldMasterFile = "model.safetensors";
constexpr const char* kManifest = "manifest.json";

nlohmann::json ModelJson(const models::ModelSpec& m) {
  return {{"family", m.family},          {"architecture", m.hf_architecture}, {"n_layer", m.n_layer},
          {"n_embd", m.d_model},         {"n_head", m.n_head},                {"n_kv_head", m.kv_heads()},
          {"num_parameters", m.NumParameters()}, {"vocab_size", m.vocab_size},
          {"padded_vocab_size", m.padded_vocab}, {"seq_len", m.max_seq}};
}

// What a manifest written before a field existed means by its absence: the
// GPT-2 model they all were.
nlohmann::json ManifestModelDefault(const std::string& key, const models::ModelSpec& m) {
  if (key == "family") return "gpt2";
  if (key == "architecture") return "GPT2LMHeadModel";
  if (key == "n_kv_head") return m.n_head;
  if (key == "num_parameters") return m.family == "gpt2" ? nlohmann::json(m.NumParameters()) : nlohmann::json();
  return nlohmann::json();
}

// The manifest's checksum of itself: of its compact dump (keys sorted)
// without the field that holds it.
uint32_t ManifestCrc(nlohmann::json m) {
  m.erase("manifest_crc32c");
  const std::string d = m.dump();
  return Crc32c(d.data(), d.size());
}

nlohmann::json SumJson(const FileSum& s) { return {{"crc32c", Crc32cHex(s.crc32c)}, {"bytes", s.bytes}}; }

using FileSums = std::map<std::string, FileSum>;  // file name in the step directory -> its sum

}  // namespace

std::vector<size_t> CheckpointUnitReads(const models::ModelSpec& model) {
  std::vector<size_t> out;
  for (const ParamSpec& t : model.params)
    if (out.empty() || out.back() != static_cast<size_t>(t.unit)) out.push_back(static_cast<size_t>(t.unit));
  return out;
}

namespace {

// n moment values in the checkpoint's dtype for them (bf16: the values the
// shard read from bf16, so rounding them back is exact).
Status AppendMoment(SafetensorsWriter* w, DType dtype, const float* x, size_t n) {
  if (dtype == DType::kF32) return w->Append(x, n * 4);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = FloatToBF16(x[i]);
  return w->Append(h.data(), n * 2);
}

// master.safetensors, optimizer.safetensors and the Hugging Face weights of
// `shards`, streamed: one unit's master/m/v read at a time, each parameter
// appended to the three. Partitioned (extras.rank_files: the ranks wrote
// the state), the Hugging Face weights alone, from the masters; a failed
// write leaves the reads (the ranks' gathers) going to the last unit.
Status WriteStateFiles(const std::string& tmp_dir, const models::ModelSpec& model,
                       const std::vector<CheckpointShard>& shards, const TrainState& state,
                       const CheckpointExtras& extras, FileSums* sums, std::string* hf_entry) {
  const bool partitioned = !extras.rank_files.empty();
  const std::vector<ParamSpec>& tensors = model.params;
  if (shards.size() != model.units.size())
    return Internal("checkpoint: " + std::to_string(shards.size()) + " shards for a model of " +
                    std::to_string(model.units.size()) + " units");
  std::vector<SafetensorsWriter::Tensor> mdecl, odecl;
  for (const auto& t : tensors) {
    Shape shape(std::span<const int64_t>(t.shape.data(), t.shape.size()));
    const DType md = shards[static_cast<size_t>(t.unit)].moment_dtype;
    mdecl.push_back({t.name, DType::kF32, shape});
    odecl.push_back({"exp_avg." + t.name, md, shape});
    odecl.push_back({"exp_avg_sq." + t.name, md, shape});
  }
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"producer", "strata"},
                                             {"step", std::to_string(state.step)}};
  std::unique_ptr<SafetensorsWriter> mw, ow;
  if (!partitioned) {
    ASSIGN_OR_RETURN(mw, SafetensorsWriter::Begin(tmp_dir + "/" + kMasterFile, mdecl, meta));
    ASSIGN_OR_RETURN(ow, SafetensorsWriter::Begin(tmp_dir + "/" + kOptimizerFile, odecl, meta));
  }
  Result<std::unique_ptr<HfWeightsWriter>> hw =
      HfWeightsWriter::Begin(tmp_dir, model, extras.hf_dtype, extras.hf_max_shard_bytes, meta);
  if (!hw.ok() && !partitioned) return hw.status();
  Status failed = hw.status();  // the first write that failed (partitioned: the reads go on)
  size_t loaded = SIZE_MAX;  // (the reads CheckpointUnitReads lists)
  std::vector<float> w, m, v;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ParamSpec& t = tensors[i];
    const size_t si = static_cast<size_t>(t.unit);
    if (si != loaded) {
      const auto& sh = shards[si];
      w.resize(static_cast<size_t>(sh.numel));
      m.resize(partitioned ? 0 : w.size());
      v.resize(m.size());
      RETURN_IF_ERROR(sh.read(w.data(), partitioned ? nullptr : m.data(), partitioned ? nullptr : v.data())
                          .WithContext("checkpoint: reading " + t.name));
      loaded = si;
    }
    if (!failed.ok()) continue;
    const size_t off = static_cast<size_t>(t.offset), n = static_cast<size_t>(t.numel);
    if (!partitioned) {
      RETURN_IF_ERROR(mw->Append(w.data() + off, n * 4));
      RETURN_IF_ERROR(AppendMoment(ow.get(), shards[si].moment_dtype, m.data() + off, n));
      RETURN_IF_ERROR(AppendMoment(ow.get(), shards[si].moment_dtype, v.data() + off, n));
    }
    failed = (*hw)->Append(i, w.data() + off);
    if (!failed.ok() && !partitioned) return failed;
  }
  RETURN_IF_ERROR(failed);
  if (!partitioned) {
    RETURN_IF_ERROR(mw->Commit());
    RETURN_IF_ERROR(ow->Commit());
    (*sums)[kMasterFile] = {mw->crc32c(), mw->file_bytes()};
    (*sums)[kOptimizerFile] = {ow->crc32c(), ow->file_bytes()};
  } else {
    for (size_t r = 0; r < extras.rank_files.size(); ++r)
      (*sums)[RankStateFileName(static_cast<int>(r), static_cast<int>(extras.rank_files.size()))] =
          extras.rank_files[r];
  }
  auto& hwr = *hw;
  ASSIGN_OR_RETURN(const auto hf_sums, hwr->Finish());
  for (const auto& [name, sum] : hf_sums) (*sums)[name] = sum;
  *hf_entry = hwr->entry_file();
  return Status::OK();
}

// config.json, generation_config.json and the source model's tokenizer files.
Status WriteHfFiles(const std::string& tmp_dir, const models::ModelSpec& model, const std::string& source,
                    DType dtype, FileSums* sums) {
  Result<nlohmann::json> config = HfConfigJson(model, source, dtype == DType::kBF16 ? "bfloat16" : "float32");
  if (config.status().code() == StatusCode::kUnavailable) return Status::OK();  // a family without a HF class
  RETURN_IF_ERROR(config.status());
  ASSIGN_OR_RETURN(nlohmann::json gen, HfGenerationConfig(*config, source));
  ASSIGN_OR_RETURN((*sums)["config.json"], WriteFileSynced(tmp_dir + "/config.json", config->dump(2) + "\n"));
  ASSIGN_OR_RETURN((*sums)["generation_config.json"],
                   WriteFileSynced(tmp_dir + "/generation_config.json", gen.dump(2) + "\n"));
  for (const std::string& name : TokenizerFiles(source)) {
    ASSIGN_OR_RETURN((*sums)[name], CopyFileSynced(source + "/" + name, tmp_dir + "/" + name));
  }
  return Status::OK();
}

nlohmann::json ManifestJson(const models::ModelSpec& model, const TrainState& state, const nlohmann::json& config,
                            const std::string& hf_entry, DType hf_dtype, const FileSums& sums,
                            const std::vector<FileSum>& rank_files) {
  nlohmann::json checksums = nlohmann::json::object();
  for (const auto& [name, sum] : sums) checksums[name] = SumJson(sum);
  nlohmann::json manifest = {
      {"format", kFormat},
      {"step", state.step},
      {"data_position", state.data_position},
      {"precision", state.precision},
      {"model", ModelJson(model)},
      {"loss_scaler",
       {{"cur_scale", state.scaler.cur_scale},
        {"cur_iter", state.scaler.cur_iter},
        {"last_overflow_iter", state.scaler.last_overflow_iter},
        {"cur_hysteresis", state.scaler.cur_hysteresis}}},
      {"files", {{"model", hf_entry}, {"model_dtype", std::string(DTypeName(hf_dtype))}}},
      {"checksums", checksums},
      {"config", config},
  };
  if (rank_files.empty()) {
    manifest["files"]["master"] = kMasterFile;
    manifest["files"]["optimizer"] = kOptimizerFile;
  } else {
    const int world = static_cast<int>(rank_files.size());
    nlohmann::json names = nlohmann::json::array();
    for (int r = 0; r < world; ++r) names.push_back(RankStateFileName(r, world));
    manifest["files"]["zero"] = {{"world", world}, {"files", names}};
  }
  manifest["manifest_crc32c"] = Crc32cHex(ManifestCrc(manifest));
  return manifest;
}

// The complete `tmp_dir` becomes DIR/`name`; a checkpoint of the same step
// saved before is replaced only after the new one is in place.
Status MoveIntoPlace(const std::string& dir, const std::string& name, const std::string& tmp_dir) {
  const std::string final_dir = dir + "/" + name;
  std::error_code ec;
  std::string old_dir;
  if (fs::exists(final_dir, ec)) {
    old_dir = dir + "/." + name + ".old." + std::to_string(::getpid());
    if (::rename(final_dir.c_str(), old_dir.c_str()) != 0) return ErrnoStatus("cannot move aside", final_dir);
  }
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) return ErrnoStatus("cannot rename into place", final_dir);
  RETURN_IF_ERROR(SyncDir(dir));
  RETURN_IF_ERROR(WriteFileAtomic(dir + "/latest", name + "\n"));
  if (!old_dir.empty()) fs::remove_all(old_dir, ec);
  return Status::OK();
}

}  // namespace

std::string CheckpointStepName(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%06lld", static_cast<long long>(step));
  return b;
}

FlatSlice FlatSliceOf(int64_t numel, int world, int rank) {
  const int64_t pad = (numel + world - 1) / world;
  FlatSlice s;
  s.off = std::min<int64_t>(numel, pad * rank);
  s.len = std::min<int64_t>(numel, s.off + pad) - s.off;
  return s;
}

std::string RankStateFileName(int rank, int world) {
  char b[64];
  std::snprintf(b, sizeof b, "zero-rank-%05d-of-%05d.safetensors", rank, world);
  return b;
}

std::string CheckpointTmpDir(const std::string& dir, int64_t step, int64_t pid) {
  return dir + "/." + CheckpointStepName(step) + ".tmp." + std::to_string(pid);
}

Status PrepareCheckpointTmpDir(const std::string& dir, int64_t step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError("cannot create checkpoint directory", ec.value(), dir);
  const std::string tmp_dir = CheckpointTmpDir(dir, step, ::getpid());
  fs::remove_all(tmp_dir, ec);
  if (::mkdir(tmp_dir.c_str(), 0755) != 0) return ErrnoStatus("cannot create", tmp_dir);
  return Status::OK();
}

Result<FileSum> WriteRankStateFile(const std::string& tmp_dir, const models::ModelSpec& model,
                                   const std::vector<CheckpointShard>& shards, int rank, int world, int64_t step) {
  if (shards.size() != model.units.size())
    return Internal("checkpoint: " + std::to_string(shards.size()) + " shards for a model of " +
                    std::to_string(model.units.size()) + " units");
  std::vector<SafetensorsWriter::Tensor> decl;
  for (size_t si = 0; si < shards.size(); ++si) {
    const CheckpointShard& sh = shards[si];
    const FlatSlice want = FlatSliceOf(sh.numel, world, rank);
    if (!sh.read_own || sh.slice_off != want.off || sh.slice_len != want.len)
      return Internal("checkpoint: unit " + model.units[si].name + " is not rank " + std::to_string(rank) +
                      "'s slice of " + std::to_string(world));
    const Shape shape{sh.slice_len};
    const std::string& u = model.units[si].name;
    decl.push_back({"master." + u, DType::kF32, shape});
    decl.push_back({"exp_avg." + u, sh.moment_dtype, shape});
    decl.push_back({"exp_avg_sq." + u, sh.moment_dtype, shape});
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"producer", "strata"},
                                                   {"step", std::to_string(step)}, {"rank", std::to_string(rank)},
                                                   {"world", std::to_string(world)}};
  const std::string path = tmp_dir + "/" + RankStateFileName(rank, world);
  ASSIGN_OR_RETURN(auto fw, SafetensorsWriter::Begin(path, decl, meta));
  std::vector<float> w, m, v;
  for (size_t si = 0; si < shards.size(); ++si) {
    const CheckpointShard& sh = shards[si];
    const size_t n = static_cast<size_t>(sh.slice_len);
    w.resize(n);
    m.resize(n);
    v.resize(n);
    RETURN_IF_ERROR(sh.read_own(w.data(), m.data(), v.data())
                        .WithContext("checkpoint: reading rank " + std::to_string(rank) + "'s slice of " +
                                     model.units[si].name));
    RETURN_IF_ERROR(fw->Append(w.data(), n * 4));
    RETURN_IF_ERROR(AppendMoment(fw.get(), sh.moment_dtype, m.data(), n));
    RETURN_IF_ERROR(AppendMoment(fw.get(), sh.moment_dtype, v.data(), n));
  }
  RETURN_IF_ERROR(fw->Commit());
  return FileSum{fw->crc32c(), fw->file_bytes()};
}

Result<std::string> SaveCheckpoint(const std::string& dir, const models::ModelSpec& model,
                                   const std::vector<CheckpointShard>& shards, const TrainState& state,
                                   const CheckpointExtras& extras) {
  const std::string name = CheckpointStepName(state.step);
  const std::string tmp_dir = CheckpointTmpDir(dir, state.step, ::getpid());
  if (extras.rank_files.empty()) RETURN_IF_ERROR(PrepareCheckpointTmpDir(dir, state.step));
  // Anything failing below removes the temporary directory; the previous
  // checkpoint and `latest` are untouched.
  struct Cleanup {
    std::string path;
    bool keep = false;
    ~Cleanup() {
      if (!keep) {
        std::error_code e;
        fs::remove_all(path, e);
      }
    }
  } cleanup{tmp_dir};

  FileSums sums;
  std::string hf_entry;
  RETURN_IF_ERROR(WriteStateFiles(tmp_dir, model, shards, state, extras, &sums, &hf_entry));
  RETURN_IF_ERROR(WriteHfFiles(tmp_dir, model, extras.model_source, extras.hf_dtype, &sums));
  const nlohmann::json manifest = ManifestJson(model, state, extras.config, hf_entry, extras.hf_dtype, sums, extras.rank_files);
  RETURN_IF_ERROR(WriteFileAtomic(tmp_dir + "/" + kManifest, manifest.dump(2) + "\n"));
  RETURN_IF_ERROR(SyncDir(tmp_dir));
  RETURN_IF_ERROR(MoveIntoPlace(dir, name, tmp_dir));
  cleanup.keep = true;
  const std::string final_dir = dir + "/" + name;
  if (extras.log) *extras.log << "saved checkpoint " << final_dir << "\n";
  return final_dir;
}

// ---- loading -------------------------------------------------------------------

Result<std::string> ResolveCheckpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir + "/" + kManifest, ec)) return dir;
  std::ifstream latest(dir + "/latest");
  if (!latest) {
    if (!fs::exists(dir, ec)) return IoError("checkpoint directory does not exist", ENOENT, dir);
    return NotFound("no checkpoint in " + dir + " (neither manifest.json nor a 'latest' file)");
  }
  std::string name;
  latest >> name;
  if (name.empty() || name.find('/') != std::string::npos)
    return DataLoss("the 'latest' file names no checkpoint", dir + "/latest");
  if (!fs::exists(dir + "/" + name + "/" + kManifest, ec))
    return DataLoss("'latest' names " + name + " but it has no manifest.json", dir + "/latest");
  return dir + "/" + name;
}

namespace {

// The manifest, parsed whole (trailing bytes are an error) and checked
// against its own checksum when it has one.
Result<nlohmann::json> ReadManifest(const std::string& mpath) {
  std::ifstream in(mpath, std::ios::binary);
  if (!in) return ErrnoStatus("cannot open", mpath);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json m = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object())
    return DataLoss("manifest is not a valid JSON object (damaged?)", mpath);
  if (m.contains("checksums") && !m.contains("manifest_crc32c"))
    return DataLoss("manifest has file checksums but not its own (manifest_crc32c): damaged", mpath);
  if (m.contains("manifest_crc32c")) {
    const std::string want = m["manifest_crc32c"].is_string() ? m["manifest_crc32c"].get<std::string>() : "";
    const std::string have = Crc32cHex(ManifestCrc(m));
    if (want != have)
      return DataLoss("manifest does not match its own checksum (crc32c " + have + ", recorded " + want +
                          "): it was changed after it was saved",
                      mpath);
  }
  return m;
}

// The file holding the fp32 masters: master.safetensors, or in a checkpoint
// from before it existed, model.safetensors.
std::string MasterFileOf(const nlohmann::json& manifest) {
  const nlohmann::json files = manifest.value("files", nlohmann::json::object());
  if (files.is_object() && files.contains("master") && files["master"].is_string())
    return files["master"].get<std::string>();
  return kOldMasterFile;
}

// The ranks' state files of a partitioned checkpoint (files.zero), in rank
// order; empty for one whose state is master.safetensors/optimizer.safetensors.
Result<std::vector<std::string>> RankFilesOf(const nlohmann::json& manifest, const std::string& mpath) {
  const nlohmann::json files = manifest.value("files", nlohmann::json::object());
  if (!files.is_object() || !files.contains("zero")) return std::vector<std::string>{};
  const nlohmann::json& z = files["zero"];
  if (!z.is_object() || !z.contains("world") || !z["world"].is_number_integer() || !z.contains("files") ||
      !z["files"].is_array())
    return DataLoss("manifest's files.zero is not {\"world\": N, \"files\": [...]}", mpath);
  const int64_t world = z["world"].get<int64_t>();
  if (world < 1 || static_cast<size_t>(world) != z["files"].size())
    return DataLoss("manifest's files.zero names " + std::to_string(z["files"].size()) + " files for world " +
                        std::to_string(world),
                    mpath);
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    const std::string want = RankStateFileName(r, static_cast<int>(world));
    if (!z["files"][static_cast<size_t>(r)].is_string() || z["files"][static_cast<size_t>(r)].get<std::string>() != want)
      return DataLoss("manifest's files.zero[" + std::to_string(r) + "] is not " + want, mpath);
    out.push_back(want);
  }
  return out;
}

// Every file the manifest lists has the size and crc32c it records (but
// the ranks' state files in `unread`, which this rank does not read).
Status VerifyFiles(const std::string& ck, const nlohmann::json& manifest, std::ostream* log,
                   const std::vector<std::string>& rank_files, const std::set<std::string>& unread) {
  if (!manifest.contains("checksums")) {
    if (log)
      *log << "warning: " << ck << " was saved without checksums (an older strata): its files are not "
           << "verified\n";
    return Status::OK();
  }
  const nlohmann::json& sums = manifest["checksums"];
  bool has_state = sums.is_object();
  if (has_state && rank_files.empty()) has_state = sums.contains(MasterFileOf(manifest)) && sums.contains(kOptimizerFile);
  for (const std::string& f : rank_files) has_state = has_state && sums.contains(f);
  if (!has_state) return DataLoss("manifest's checksums lack the state files", ck + "/" + kManifest);
  for (auto it = sums.begin(); it != sums.end(); ++it) {
    const std::string path = ck + "/" + it.key();
    if (it.key().find('/') != std::string::npos || !it.value().is_object())
      return DataLoss("manifest lists a bad file entry '" + it.key() + "'", ck + "/" + kManifest);
    if (unread.count(it.key())) continue;
    const std::string want = it.value().value("crc32c", "");
    const uint64_t want_bytes = it.value().value("bytes", uint64_t{0});
    Result<FileSum> have = FileChecksum(path);
    if (have.status().code() == StatusCode::kNotFound)
      return DataLoss("a file of the checkpoint is missing (the manifest lists it)", path);
    RETURN_IF_ERROR(have.status());
    if (have->bytes != want_bytes)
      return DataLoss("file is " + std::to_string(have->bytes) + " bytes, the manifest records " +
                          std::to_string(want_bytes) + " (truncated, or replaced after the save)",
                      path);
    if (Crc32cHex(have->crc32c) != want)
      return DataLoss("file does not match its checksum (crc32c " + Crc32cHex(have->crc32c) + ", the manifest records " +
                          want + "): damaged, or copied in from another checkpoint",
                      path);
  }
  return Status::OK();
}

// A state file holds the manifest's step (its metadata says which).
Status CheckStepOf(const SafetensorsFile& f, int64_t step) {
  auto it = f.metadata().find("step");
  if (it == f.metadata().end()) return Status::OK();  // not written by strata
  if (it->second != std::to_string(step))
    return DataLoss("file belongs to step " + it->second + " (its metadata) but the manifest to step " +
                        std::to_string(step) + ": copied in from another checkpoint",
                    f.path());
  return Status::OK();
}

Status ReadTrainState(const nlohmann::json& manifest, const models::ModelSpec& model, const std::string& mpath,
                      TrainState* state) {
  try {
    if (manifest.value("format", "") != kFormat)
      return InvalidArgument(mpath + ": format is " + manifest.value("format", std::string("missing")) +
                             ", expected " + kFormat);
    nlohmann::json want = ModelJson(model);
    const auto& have = manifest.at("model");
    for (auto it = want.begin(); it != want.end(); ++it) {
      const nlohmann::json got = have.contains(it.key()) ? have.at(it.key()) : ManifestModelDefault(it.key(), model);
      if (got != it.value())
        return InvalidArgument(mpath + ": the checkpoint's model." + it.key() + " is " + got.dump() +
                               " but the configured model has " + it.value().dump());
    }
    state->step = manifest.at("step").get<int64_t>();
    state->data_position = manifest.at("data_position").get<uint64_t>();
    state->precision = manifest.value("precision", "");
    const auto& ls = manifest.at("loss_scaler");
    state->scaler.cur_scale = ls.at("cur_scale").get<double>();
    state->scaler.cur_iter = ls.at("cur_iter").get<int64_t>();
    state->scaler.last_overflow_iter = ls.at("last_overflow_iter").get<int64_t>();
    state->scaler.cur_hysteresis = ls.at("cur_hysteresis").get<int>();
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(std::string("manifest is missing a field: ") + e.what(), mpath);
  }
  return Status::OK();
}

// A state tensor is in `f` with the shape `want`: f32, or for a moment f32
// or bf16 (whichever the run saved them in).
Status CheckStateTensor(const SafetensorsFile& f, const std::string& name, const Shape& want, bool moment,
                        const std::string& what = "") {
  const SafetensorsEntry* e = f.Find(name);
  if (!e) return NotFound("tensor '" + name + "' is missing from " + f.path());
  const bool dtype_ok = e->dtype == DType::kF32 || (moment && e->dtype == DType::kBF16);
  if (!dtype_ok || e->shape != want)
    return InvalidArgument("tensor '" + name + "' in " + f.path() + " is " + std::string(DTypeName(e->dtype)) + " " +
                           e->shape.ToString() + ", expected " + (moment ? "f32 or bf16 " : "f32 ") + want.ToString() +
                           what);
  return Status::OK();
}

// `n` values of a tensor from its element `first` on, as fp32 (bf16 widened: exact).
void CopyAsFloat(const SafetensorsFile& f, const SafetensorsEntry& e, size_t first, size_t n, float* dst) {
  const std::span<const uint8_t> d = f.Data(e);
  if (e.dtype == DType::kF32) {
    std::memcpy(dst, d.data() + first * 4, n * 4);
    return;
  }
  for (size_t k = 0; k < n; ++k) {
    uint16_t h;
    std::memcpy(&h, d.data() + 2 * (first + k), 2);
    dst[k] = BF16ToFloat(h);
  }
}

// The part of a unit a resume fills: [begin, end) of its master and moments.
struct KeptRange {
  int64_t begin = 0, end = 0;
  bool Overlaps(const FlatSlice& s) const { return s.len > 0 && s.off < end && s.off + s.len > begin; }
};
KeptRange Kept(const CheckpointShard& sh) {
  if (sh.slice_len < 0) return {0, sh.numel};
  return {sh.slice_off, sh.slice_off + sh.slice_len};
}

// Whether rank `r` of `world`'s file holds any part this rank keeps.
bool ReadsRankFile(const std::vector<CheckpointShard>& shards, int world, int r) {
  for (const CheckpointShard& sh : shards)
    if (Kept(sh).Overlaps(FlatSliceOf(sh.numel, world, r))) return true;
  return false;
}

// The ranks' state files `files` of step `step` in `ck` that `wanted(r)`
// names, opened, each holding that step and saying it is rank r of the
// world the manifest names.
Result<std::map<int, SafetensorsFile>> OpenRankFiles(const std::string& ck, const std::vector<std::string>& files,
                                                     int64_t step, const std::function<bool(int)>& wanted) {
  const int world = static_cast<int>(files.size());
  std::map<int, SafetensorsFile> read;
  for (int r = 0; r < world; ++r) {
    if (!wanted(r)) continue;
    ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(ck + "/" + files[static_cast<size_t>(r)]));
    RETURN_IF_ERROR(CheckStepOf(f, step));
    const auto& meta = f.metadata();
    auto rank_it = meta.find("rank"), world_it = meta.find("world");
    if (rank_it == meta.end() || world_it == meta.end() || rank_it->second != std::to_string(r) ||
        world_it->second != std::to_string(world))
      return DataLoss("file's metadata does not say rank " + std::to_string(r) + " of " + std::to_string(world) +
                          " (the manifest's name for it)",
                      f.path());
    read.emplace(r, std::move(f));
  }
  return read;
}

// " (rank r's slice of W)", for the errors about a rank's tensor.
std::string OfRank(int r, int world) {
  return " (rank " + std::to_string(r) + "'s slice of " + std::to_string(world) + ")";
}

// A partitioned checkpoint's state into `shards`: each unit's kept parts
// copied from the ranks' slices that overlap them (every tensor of the
// files read is checked before anything is written).
Status LoadRankFiles(const std::string& ck, const models::ModelSpec& model, const std::vector<CheckpointShard>& shards,
                     const std::vector<std::string>& files, int64_t step) {
  const int world = static_cast<int>(files.size());
  Result<std::map<int, SafetensorsFile>> opened =
      OpenRankFiles(ck, files, step, [&](int r) { return ReadsRankFile(shards, world, r); });
  RETURN_IF_ERROR(opened.status());
  const std::map<int, SafetensorsFile>& read = *opened;
  for (size_t si = 0; si < shards.size(); ++si) {
    const std::string& u = model.units[si].name;
    for (const auto& [r, f] : read) {
      const Shape want{FlatSliceOf(shards[si].numel, world, r).len};
      const std::string of_rank = OfRank(r, world);
      RETURN_IF_ERROR(CheckStateTensor(f, "master." + u, want, false, of_rank));
      RETURN_IF_ERROR(CheckStateTensor(f, "exp_avg." + u, want, true, of_rank));
      RETURN_IF_ERROR(CheckStateTensor(f, "exp_avg_sq." + u, want, true, of_rank));
    }
  }
  for (size_t si = 0; si < shards.size(); ++si) {
    const CheckpointShard& sh = shards[si];
    const std::string& u = model.units[si].name;
    std::vector<float> w(static_cast<size_t>(sh.numel), 0.f), m(w.size(), 0.f), v(w.size(), 0.f);
    for (const auto& [r, f] : read) {
      const FlatSlice fs = FlatSliceOf(sh.numel, world, r);
      auto fill = [&](const std::string& name, KeptRange keep, std::vector<float>& dst) {
        const int64_t lo = std::max(keep.begin, fs.off), hi = std::min(keep.end, fs.off + fs.len);
        if (lo >= hi) return;
        CopyAsFloat(f, *f.Find(name), static_cast<size_t>(lo - fs.off), static_cast<size_t>(hi - lo),
                    dst.data() + lo);
      };
      fill("master." + u, Kept(sh), w);
      fill("exp_avg." + u, Kept(sh), m);
      fill("exp_avg_sq." + u, Kept(sh), v);
    }
    RETURN_IF_ERROR(sh.write(w.data(), m.data(), v.data()).WithContext("resume"));
  }
  return Status::OK();
}

}  // namespace

Status LoadCheckpoint(const std::string& dir, const models::ModelSpec& model,
                      const std::vector<CheckpointShard>& shards, TrainState* state, std::string* path,
                      std::ostream* log) {
  ASSIGN_OR_RETURN(std::string ck, ResolveCheckpoint(dir));
  if (path) *path = ck;
  const std::string mpath = ck + "/" + kManifest;
  ASSIGN_OR_RETURN(nlohmann::json manifest, ReadManifest(mpath));
  RETURN_IF_ERROR(ReadTrainState(manifest, model, mpath, state));
  if (shards.size() != model.units.size())
    return Internal("resume: " + std::to_string(shards.size()) + " shards for a model of " +
                    std::to_string(model.units.size()) + " units");
  ASSIGN_OR_RETURN(const std::vector<std::string> rank_files, RankFilesOf(manifest, mpath));
  std::set<std::string> unread;
  for (size_t r = 0; r < rank_files.size(); ++r)
    if (!ReadsRankFile(shards, static_cast<int>(rank_files.size()), static_cast<int>(r))) unread.insert(rank_files[r]);
  if (Status v = VerifyFiles(ck, manifest, log, rank_files, unread); !v.ok()) {
    // A weights or state file of another step says so more plainly than its checksum.
    const std::string bad(v.path());
    if (bad.size() > 12 && bad.compare(bad.size() - 12, 12, ".safetensors") == 0)
      if (Result<SafetensorsFile> other = SafetensorsFile::Open(bad); other.ok())
        RETURN_IF_ERROR(CheckStepOf(*other, state->step));
    return v;
  }
  if (!rank_files.empty()) return LoadRankFiles(ck, model, shards, rank_files, state->step);

  ASSIGN_OR_RETURN(SafetensorsFile mf, SafetensorsFile::Open(ck + "/" + MasterFileOf(manifest)));
  ASSIGN_OR_RETURN(SafetensorsFile of, SafetensorsFile::Open(ck + "/" + kOptimizerFile));
  RETURN_IF_ERROR(CheckStepOf(mf, state->step));
  RETURN_IF_ERROR(CheckStepOf(of, state->step));
  const std::vector<ParamSpec>& tensors = model.params;
  // Validate every tensor of both files before writing anything: masters
  // f32, moments f32 or bf16 (whichever the run saved them in).
  for (const auto& t : tensors) {
    const Shape want(std::span<const int64_t>(t.shape.data(), t.shape.size()));
    RETURN_IF_ERROR(CheckStateTensor(mf, t.name, want, false));
    RETURN_IF_ERROR(CheckStateTensor(of, "exp_avg." + t.name, want, true));
    RETURN_IF_ERROR(CheckStateTensor(of, "exp_avg_sq." + t.name, want, true));
  }
  for (size_t si = 0; si < shards.size(); ++si) {
    const auto& sh = shards[si];
    std::vector<float> w(static_cast<size_t>(sh.numel), 0.f), m(w.size(), 0.f), v(w.size(), 0.f);
    for (const auto& t : tensors) {
      if (static_cast<size_t>(t.unit) != si) continue;
      // fp32 copied; bf16 widened (exact). The shard's write rounds to its
      // own moment dtype (engine/model_state.h).
      auto copy = [&](const SafetensorsFile& f, const std::string& name, std::vector<float>& dst) {
        CopyAsFloat(f, *f.Find(name), 0, static_cast<size_t>(t.numel), dst.data() + t.offset);
      };
      copy(mf, t.name, w);
      copy(of, "exp_avg." + t.name, m);
      copy(of, "exp_avg_sq." + t.name, v);
    }
    RETURN_IF_ERROR(sh.write(w.data(), m.data(), v.data()).WithContext("resume"));
  }
  return Status::OK();
}

Result<bool> ReadPartitionedMasters(const std::string& dir, const models::ModelSpec& model,
                                    const std::function<Status(size_t unit, std::span<const float>)>& take) {
  ASSIGN_OR_RETURN(const std::string ck, ResolveCheckpoint(dir));
  const std::string mpath = ck + "/" + kManifest;
  ASSIGN_OR_RETURN(const nlohmann::json manifest, ReadManifest(mpath));
  ASSIGN_OR_RETURN(const std::vector<std::string> files, RankFilesOf(manifest, mpath));
  if (files.empty()) return false;
  if (!manifest.contains("step") || !manifest["step"].is_number_integer())
    return DataLoss("manifest has no integer step", mpath);
  const int world = static_cast<int>(files.size());
  Result<std::map<int, SafetensorsFile>> opened =
      OpenRankFiles(ck, files, manifest["step"].get<int64_t>(), [](int) { return true; });
  RETURN_IF_ERROR(opened.status());
  const std::map<int, SafetensorsFile>& read = *opened;
  for (const models::UnitSpec& u : model.units)
    for (const auto& [r, f] : read)
      RETURN_IF_ERROR(CheckStateTensor(f, "master." + u.name, Shape{FlatSliceOf(u.numel, world, r).len}, false,
                                       OfRank(r, world)));
  for (size_t ui = 0; ui < model.units.size(); ++ui) {
    const models::UnitSpec& u = model.units[ui];
    std::vector<float> w(static_cast<size_t>(u.numel));
    for (const auto& [r, f] : read) {
      const FlatSlice fs = FlatSliceOf(u.numel, world, r);
      if (fs.len > 0) CopyAsFloat(f, *f.Find("master." + u.name), 0, static_cast<size_t>(fs.len), w.data() + fs.off);
    }
    RETURN_IF_ERROR(take(ui, w));
  }
  return true;
}

Result<CheckpointManifest> ReadCheckpointManifest(const std::string& dir) {
  CheckpointManifest m;
  ASSIGN_OR_RETURN(m.path, ResolveCheckpoint(dir));
  const std::string mpath = m.path + "/manifest.json";
  std::ifstream in(mpath);
  if (!in) return ErrnoStatus("cannot open", mpath);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
    return DataLoss("manifest is not valid JSON with a step", mpath);
  m.step = j["step"].get<int64_t>();
  m.config = j.value("config", nlohmann::json());
  return m;
}

}  // namespace strata
