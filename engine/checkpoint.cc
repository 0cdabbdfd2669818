#include "engine/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "engine/safetensors.h"

namespace strata {

namespace fs = std::filesystem;
using models::ParamSpec;

namespace {

constexpr const char* kFormat = "strata-checkpoint-1";

Status WriteFileAtomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", tmp);
  Status s = WriteAll(fd, text.data(), text.size(), tmp, 0);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoStatus("fsync failed", tmp);
  if (::close(fd) != 0 && s.ok()) s = ErrnoStatus("close failed", tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoStatus("rename into place failed", path);
  if (!s.ok()) ::unlink(tmp.c_str());
  RETURN_IF_ERROR(s);
  return SyncParentDir(path);
}

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open directory to fsync", dir);
  Status s = ::fsync(fd) == 0 ? Status::OK() : ErrnoStatus("fsync of directory failed", dir);
  ::close(fd);
  return s;
}

std::string StepName(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%06lld", static_cast<long long>(step));
  return b;
}

nlohmann::json ModelJson(const models::ModelSpec& m) {
  return {{"n_layer", m.n_layer}, {"n_embd", m.d_model}, {"n_head", m.n_head},
          {"vocab_size", m.vocab_size}, {"padded_vocab_size", m.padded_vocab}, {"seq_len", m.max_seq}};
}

}  // namespace

Status SaveCheckpoint(const std::string& dir, const models::ModelSpec& model,
                      const std::vector<CheckpointShard>& shards, const TrainState& state,
                      const nlohmann::json& config, std::ostream* log) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError("cannot create checkpoint directory", ec.value(), dir);
  const std::string name = StepName(state.step);
  const std::string final_dir = dir + "/" + name;
  const std::string tmp_dir = dir + "/." + name + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp_dir, ec);
  if (::mkdir(tmp_dir.c_str(), 0755) != 0) return ErrnoStatus("cannot create", tmp_dir);
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

  const std::vector<ParamSpec>& tensors = model.params;
  if (shards.size() != model.units.size())
    return Internal("checkpoint: " + std::to_string(shards.size()) + " shards for a model of " +
                    std::to_string(model.units.size()) + " units");
  std::vector<SafetensorsWriter::Tensor> mdecl, odecl;
  for (const auto& t : tensors) {
    Shape shape(std::span<const int64_t>(t.shape.data(), t.shape.size()));
    mdecl.push_back({t.name, DType::kF32, shape});
    odecl.push_back({"exp_avg." + t.name, DType::kF32, shape});
    odecl.push_back({"exp_avg_sq." + t.name, DType::kF32, shape});
  }
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"producer", "strata"},
                                             {"step", std::to_string(state.step)}};
  ASSIGN_OR_RETURN(auto mw, SafetensorsWriter::Begin(tmp_dir + "/model.safetensors", mdecl, meta));
  ASSIGN_OR_RETURN(auto ow, SafetensorsWriter::Begin(tmp_dir + "/optimizer.safetensors", odecl, meta));
  size_t loaded = SIZE_MAX;
  std::vector<float> w, m, v;
  for (const auto& t : tensors) {
    const size_t si = static_cast<size_t>(t.unit);
    if (si != loaded) {
      const auto& sh = shards[si];
      w.resize(static_cast<size_t>(sh.numel));
      m.resize(w.size());
      v.resize(w.size());
      RETURN_IF_ERROR(sh.read(w.data(), m.data(), v.data()).WithContext("checkpoint: reading " + t.name));
      loaded = si;
    }
    const size_t off = static_cast<size_t>(t.offset), n = static_cast<size_t>(t.numel);
    RETURN_IF_ERROR(mw->Append(w.data() + off, n * 4));
    RETURN_IF_ERROR(ow->Append(m.data() + off, n * 4));
    RETURN_IF_ERROR(ow->Append(v.data() + off, n * 4));
  }
  RETURN_IF_ERROR(mw->Commit());
  RETURN_IF_ERROR(ow->Commit());

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
      {"files", {{"model", "model.safetensors"}, {"optimizer", "optimizer.safetensors"}}},
      {"config", config},
  };
  RETURN_IF_ERROR(WriteFileAtomic(tmp_dir + "/manifest.json", manifest.dump(2) + "\n"));
  RETURN_IF_ERROR(SyncDir(tmp_dir));

  // Into place. A checkpoint of the same step saved before is replaced only
  // after the new one is complete.
  std::string old_dir;
  if (fs::exists(final_dir, ec)) {
    old_dir = dir + "/." + name + ".old." + std::to_string(::getpid());
    if (::rename(final_dir.c_str(), old_dir.c_str()) != 0) return ErrnoStatus("cannot move aside", final_dir);
  }
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) return ErrnoStatus("cannot rename into place", final_dir);
  cleanup.keep = true;
  RETURN_IF_ERROR(SyncDir(dir));
  RETURN_IF_ERROR(WriteFileAtomic(dir + "/latest", name + "\n"));
  if (!old_dir.empty()) fs::remove_all(old_dir, ec);
  if (log) *log << "saved checkpoint " << final_dir << "\n";
  return Status::OK();
}

namespace {

Result<std::string> ResolveCheckpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir + "/manifest.json", ec)) return dir;
  std::ifstream latest(dir + "/latest");
  if (!latest) {
    if (!fs::exists(dir, ec)) return IoError("checkpoint directory does not exist", ENOENT, dir);
    return NotFound("no checkpoint in " + dir + " (neither manifest.json nor a 'latest' file)");
  }
  std::string name;
  latest >> name;
  if (name.empty() || name.find('/') != std::string::npos)
    return DataLoss("the 'latest' file names no checkpoint", dir + "/latest");
  if (!fs::exists(dir + "/" + name + "/manifest.json", ec))
    return DataLoss("'latest' names " + name + " but it has no manifest.json", dir + "/latest");
  return dir + "/" + name;
}

}  // namespace

Status LoadCheckpoint(const std::string& dir, const models::ModelSpec& model,
                      const std::vector<CheckpointShard>& shards, TrainState* state, std::string* path) {
  ASSIGN_OR_RETURN(std::string ck, ResolveCheckpoint(dir));
  if (path) *path = ck;
  const std::string mpath = ck + "/manifest.json";
  nlohmann::json manifest;
  {
    std::ifstream in(mpath);
    if (!in) return ErrnoStatus("cannot open", mpath);
    try {
      in >> manifest;
    } catch (const std::exception& e) {
      return DataLoss(std::string("manifest is not valid JSON: ") + e.what(), mpath);
    }
  }
  try {
    if (manifest.value("format", "") != kFormat)
      return InvalidArgument(mpath + ": format is " + manifest.value("format", std::string("missing")) +
                             ", expected " + kFormat);
    nlohmann::json want = ModelJson(model);
    const auto& have = manifest.at("model");
    for (auto it = want.begin(); it != want.end(); ++it)
      if (have.at(it.key()) != it.value())
        return InvalidArgument(mpath + ": the checkpoint's model." + it.key() + " is " + have.at(it.key()).dump() +
                               " but the configured model has " + it.value().dump());
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

  ASSIGN_OR_RETURN(SafetensorsFile mf, SafetensorsFile::Open(ck + "/model.safetensors"));
  ASSIGN_OR_RETURN(SafetensorsFile of, SafetensorsFile::Open(ck + "/optimizer.safetensors"));
  const std::vector<ParamSpec>& tensors = model.params;
  if (shards.size() != model.units.size())
    return Internal("resume: " + std::to_string(shards.size()) + " shards for a model of " +
                    std::to_string(model.units.size()) + " units");
  // Validate every tensor of both files before writing anything.
  auto check = [](const SafetensorsFile& f, const std::string& name, const ParamSpec& t) -> Status {
    const SafetensorsEntry* e = f.Find(name);
    if (!e) return NotFound("tensor '" + name + "' is missing from " + f.path());
    Shape want(std::span<const int64_t>(t.shape.data(), t.shape.size()));
    if (e->dtype != DType::kF32 || e->shape != want)
      return InvalidArgument("tensor '" + name + "' in " + f.path() + " is " + std::string(DTypeName(e->dtype)) + " " +
                             e->shape.ToString() + ", expected f32 " + want.ToString());
    return Status::OK();
  };
  for (const auto& t : tensors) {
    RETURN_IF_ERROR(check(mf, t.name, t));
    RETURN_IF_ERROR(check(of, "exp_avg." + t.name, t));
    RETURN_IF_ERROR(check(of, "exp_avg_sq." + t.name, t));
  }
  for (size_t si = 0; si < shards.size(); ++si) {
    const auto& sh = shards[si];
    std::vector<float> w(static_cast<size_t>(sh.numel), 0.f), m(w.size(), 0.f), v(w.size(), 0.f);
    for (const auto& t : tensors) {
      if (static_cast<size_t>(t.unit) != si) continue;
      auto copy = [&](const SafetensorsFile& f, const std::string& name, std::vector<float>& dst) {
        auto d = f.Data(*f.Find(name));
        std::memcpy(dst.data() + t.offset, d.data(), d.size());
      };
      copy(mf, t.name, w);
      copy(of, "exp_avg." + t.name, m);
      copy(of, "exp_avg_sq." + t.name, v);
    }
    RETURN_IF_ERROR(sh.write(w.data(), m.data(), v.data()).WithContext("resume"));
  }
  return Status::OK();
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
