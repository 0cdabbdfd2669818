// SPDX-License-Identifier: Apache-2.0
#include "engine/hf_weights_writer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "base/half.h"

namespace strata {

namespace {

constexpr size_t kChunk = size_t{1} << 20;  // elements converted at a time

Shape ShapeOf(const models::ParamSpec& p) { return Shape(std::span<const int64_t>(p.shape.data(), p.shape.size())); }

}  // namespace

HfShardPlan PlanHfShards(const models::ModelSpec& spec, DType dtype, uint64_t max_shard_bytes) {
  HfShardPlan plan;
  plan.file_of.assign(spec.params.size(), 0);
  std::vector<std::vector<size_t>> shards;  // huggingface_hub's shard_list, of parameter indices
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const uint64_t bytes = static_cast<uint64_t>(spec.params[i].numel) * DTypeSize(dtype);
    plan.total_bytes += bytes;
    if (bytes > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + bytes > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += bytes;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  const size_t n = shards.size();
  for (size_t f = 0; f < n; ++f) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", f + 1, n);
    plan.files.push_back(n == 1 ? "model.safetensors" : name);
    for (size_t i : shards[f]) plan.file_of[i] = f;
  }
  return plan;
}

Result<std::unique_ptr<HfWeightsWriter>> HfWeightsWriter::Begin(const std::string& dir, const models::ModelSpec& spec,
                                                                DType dtype, uint64_t max_shard_bytes,
                                                                std::map<std::string, std::string> metadata) {
  if (dtype != DType::kBF16 && dtype != DType::kF32)
    return InvalidArgument("Hugging Face weights are written in bf16 or fp32, not " + std::string(DTypeName(dtype)));
  if (max_shard_bytes == 0) return InvalidArgument("max_shard_size must be more than 0 bytes");
  std::unique_ptr<HfWeightsWriter> w(new HfWeightsWriter());
  w->dir_ = dir;
  w->spec_ = &spec;
  w->dtype_ = dtype;
  w->plan_ = PlanHfShards(spec, dtype, max_shard_bytes);
  w->entry_ = w->plan_.files.size() == 1 ? "model.safetensors" : "model.safetensors.index.json";
  metadata["format"] = "pt";
  w->metadata_ = std::move(metadata);
  w->left_.assign(w->plan_.files.size(), 0);
  for (size_t f : w->plan_.file_of) ++w->left_[f];
  return w;
}

Status HfWeightsWriter::OpenShard(size_t file) {
  std::vector<SafetensorsWriter::Tensor> decl;
  for (size_t i = 0; i < spec_->params.size(); ++i)
    if (plan_.file_of[i] == file) decl.push_back({spec_->params[i].name, dtype_, ShapeOf(spec_->params[i])});
  ASSIGN_OR_RETURN(open_[file], SafetensorsWriter::Begin(dir_ + "/" + plan_.files[file], decl, metadata_));
  return Status::OK();
}

Status HfWeightsWriter::Append(size_t param, const float* values) {
  if (param != next_param_ || param >= spec_->params.size())
    return Internal("Hugging Face weights: parameter " + std::to_string(param) + " appended, expected " +
                    std::to_string(next_param_));
  ++next_param_;
  const size_t file = plan_.file_of[param];
  if (!open_.count(file)) RETURN_IF_ERROR(OpenShard(file));
  SafetensorsWriter& w = *open_[file];
  const size_t n = static_cast<size_t>(spec_->params[param].numel);
  if (dtype_ == DType::kF32) {
    RETURN_IF_ERROR(w.Append(values, n * 4));
  } else {
    std::vector<uint16_t> chunk(std::min(n, kChunk));
    for (size_t at = 0; at < n; at += chunk.size()) {
      const size_t k = std::min(chunk.size(), n - at);
      for (size_t i = 0; i < k; ++i) chunk[i] = FloatToBF16(values[at + i]);
      RETURN_IF_ERROR(w.Append(chunk.data(), k * 2));
    }
  }
  if (--left_[file] == 0) {
    RETURN_IF_ERROR(w.Commit());
    sums_[plan_.files[file]] = {w.crc32c(), w.file_bytes()};
    open_.erase(file);
  }
  return Status::OK();
}

Result<std::map<std::string, FileSum>> HfWeightsWriter::Finish() {
  if (next_param_ != spec_->params.size() || !open_.empty())
    return Internal("Hugging Face weights: " + std::to_string(next_param_) + " of " +
                    std::to_string(spec_->params.size()) + " parameters appended");
  if (plan_.files.size() > 1) {
    nlohmann::json weight_map = nlohmann::json::object();
    int64_t numel = 0;
    for (size_t i = 0; i < spec_->params.size(); ++i) {
      weight_map[spec_->params[i].name] = plan_.files[plan_.file_of[i]];
      numel += spec_->params[i].numel;
    }
    const nlohmann::json index = {{"metadata", {{"total_size", plan_.total_bytes}, {"total_parameters", numel}}},
                                  {"weight_map", weight_map}};
    ASSIGN_OR_RETURN(sums_[entry_], WriteFileSynced(dir_ + "/" + entry_, index.dump(2) + "\n"));
  }
  return sums_;
}

}  // namespace strata
