// SPDX-License-Identifier: Apache-2.0
// Hugging Face weights as save_pretrained writes them, streamed parameter by
// parameter from fp32 values: one model.safetensors when everything fits in
// one shard, else model-0000N-of-0000M.safetensors with
// model.safetensors.index.json ({"metadata": {"total_size",
// "total_parameters"}, "weight_map": {name: file}}), in bf16 or fp32.
//
// Sharding is transformers' (huggingface_hub's
// split_torch_state_dict_into_shards) over the model's parameter order: a
// tensor joins the shard being filled unless that would take it past
// max_shard_size, in which case that shard is closed and a new one started;
// a tensor larger than max_shard_size is a shard of its own, listed when it
// is met (before the shard being filled, which goes on filling after it).
// Family-blind: the names, shapes and order are the ModelSpec's.
//
// Streaming: a shard file is open from its first tensor to its last
// (SafetensorsWriter: a temp file, fsynced and renamed when complete) — at
// most the shard being filled and one oversized tensor's — and values are
// converted in bounded chunks, so the writer holds no tensor, let alone a
// shard, beyond a chunk.
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/durable_file.h"
#include "engine/safetensors.h"
#include "models/model_spec.h"

namespace strata {

// Which file each parameter of `spec` goes to (0-based), and the file names.
struct HfShardPlan {
  std::vector<std::string> files;
  std::vector<size_t> file_of;  // per spec.params entry
  uint64_t total_bytes = 0;
};
HfShardPlan PlanHfShards(const models::ModelSpec& spec, DType dtype, uint64_t max_shard_bytes);

class HfWeightsWriter {
 public:
  // Writes into directory `dir`; `metadata` goes into every shard's header
  // (with "format": "pt", which transformers requires). dtype: kBF16 or kF32.
  static Result<std::unique_ptr<HfWeightsWriter>> Begin(const std::string& dir, const models::ModelSpec& spec,
                                                        DType dtype, uint64_t max_shard_bytes,
                                                        std::map<std::string, std::string> metadata);
  // Parameter `param` (an index into spec.params, each once, in order): its
  // numel fp32 values.
  Status Append(size_t param, const float* values);
  // After the last parameter: the index (when sharded). Returns every file
  // written (name in `dir` -> its checksum and size).
  Result<std::map<std::string, FileSum>> Finish();
  // The file transformers looks for first: model.safetensors or the index.
  const std::string& entry_file() const { return entry_; }

 private:
  HfWeightsWriter() = default;
  Status OpenShard(size_t file);
  std::string dir_, entry_;
  const models::ModelSpec* spec_ = nullptr;
  DType dtype_ = DType::kBF16;
  HfShardPlan plan_;
  std::map<std::string, std::string> metadata_;
  std::map<size_t, std::unique_ptr<SafetensorsWriter>> open_;  // file -> its writer, while incomplete
  std::vector<size_t> left_;                                   // per file: tensors not yet appended
  size_t next_param_ = 0;
  std::map<std::string, FileSum> sums_;
};

}  // namespace strata
