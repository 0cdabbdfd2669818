// SPDX-License-Identifier: Apache-2.0
#include "engine/hf_weights.h"

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace strata {

namespace {

constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The index's weight_map: tensor name -> file name (a plain name in the directory).
Result<std::map<std::string, std::string>> ReadWeightMap(const std::string& index) {
  std::ifstream in(index, std::ios::binary);
  if (!in) return ErrnoStatus("cannot open", index);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss("index is not a JSON object", index);
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object() || wm->empty())
    return DataLoss("index has no \"weight_map\" object naming the tensors' files", index);
  std::map<std::string, std::string> out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string())
      return DataLoss("index maps tensor '" + it.key() + "' to " + it.value().dump() + ", not a file name", index);
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      return DataLoss("index maps tensor '" + it.key() + "' to '" + file + "', not a file of the directory", index);
    out[it.key()] = file;
  }
  return out;
}

}  // namespace

Result<std::string> HfWeightsEntry(const std::string& dir) {
  if (Exists(dir + "/" + kSingle)) return dir + "/" + kSingle;
  if (Exists(dir + "/" + kIndex)) return dir + "/" + kIndex;
  for (const char* other : {"pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack"})
    if (Exists(dir + "/" + other))
      return InvalidArgument(dir + " has " + other + " but no model.safetensors (nor " + kIndex +
                             "): strata reads safetensors (save the model with safe_serialization=True)");
  return NotFound(dir + " is a directory without model.safetensors or " + kIndex);
}

Result<HfWeights> HfWeights::Open(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot read model weights", path);
  HfWeights w;
  w.path_ = path;
  if (!S_ISDIR(st.st_mode)) {
    RETURN_IF_ERROR(w.AddFile(path, nullptr));
    return w;
  }
  ASSIGN_OR_RETURN(const std::string entry, HfWeightsEntry(path));
  if (entry.size() < 5 || entry.compare(entry.size() - 5, 5, ".json") != 0) {
    RETURN_IF_ERROR(w.AddFile(entry, nullptr));
    return w;
  }
  w.index_ = entry;
  ASSIGN_OR_RETURN(const auto weight_map, ReadWeightMap(entry));
  std::map<std::string, std::string> first_tensor;  // file -> a tensor the index places there
  for (const auto& [tensor, file] : weight_map) first_tensor.emplace(file, tensor);
  for (const auto& [file, tensor] : first_tensor) {
    const std::string fpath = path + "/" + file;
    if (!Exists(fpath))
      return NotFound(entry + " places tensor '" + tensor + "' in " + file + ", but " + fpath + " does not exist");
    RETURN_IF_ERROR(w.AddFile(fpath, &weight_map));
  }
  for (const auto& [tensor, file] : weight_map)
    if (!w.tensors_.count(tensor))
      return DataLoss(entry + " places tensor '" + tensor + "' in " + file + ", which does not hold it",
                      path + "/" + file);
  return w;
}

// The tensors of `file`'s header, checked against the index when there is one.
Status HfWeights::AddFile(const std::string& file, const std::map<std::string, std::string>* weight_map) {
  ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(file));
  const std::string base = file.substr(file.rfind('/') + 1);
  for (const SafetensorsEntry& e : f.entries()) {
    if (weight_map) {
      auto it = weight_map->find(e.name);
      if (it == weight_map->end())
        return DataLoss("tensor '" + e.name + "' is in " + file + " but " + index_ + " does not list it", file);
      if (it->second != base) continue;  // a copy: the index places it in another file, which must hold it
    }
    tensors_.emplace(e.name, HfTensor{file, e});  // (a name is in one header once, and the index names one file)
  }
  files_.push_back(file);
  return Status::OK();
}

const HfTensor* HfWeights::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status HfWeights::ReadF32Into(const HfTensor& t, std::span<float> out) {
  if (!mapped_ || mapped_->path() != t.file) {
    mapped_.reset();  // unmap the file read before first
    ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(t.file));
    mapped_.emplace(std::move(f));
  }
  const SafetensorsEntry* e = mapped_->Find(t.entry.name);
  if (!e || e->dtype != t.entry.dtype || e->shape != t.entry.shape)
    return DataLoss("tensor '" + t.entry.name + "' changed in " + t.file + " while the model was read", t.file);
  return mapped_->ReadF32Into(*e, out);
}

}  // namespace strata
