// SPDX-License-Identifier: Apache-2.0
// A trained model loaded to run it (strata generate, strata eval): from a
// checkpoint step directory, a --save directory (its `latest`), or a Hugging
// Face model directory — a model.safetensors with the config.json beside it
// that names the heads — into a ModelSpec (engine/model_config.h) and its
// parameters resident in backend memory, one buffer per unit in `dtype`
// (rounded once from the file's values; padding zero).
//
// The weights are resident, not offloaded: a model runs here when its
// parameters (and the decoder's cache) fit the backend's memory.
//
// Ownership: owns its buffers; borrows the backend, which must outlive it.
// Thread-safety: one thread at a time.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "models/model_spec.h"

namespace strata {

struct InferenceModel {
  std::string dir;      // the model directory (a step directory when `dir` was a --save directory)
  std::string weights;  // the file read: master.safetensors (a step directory; its manifest.json when saved
                        // partitioned, the masters then in the ranks' state files), model.safetensors or the
                        // shards' index
  models::ModelSpec spec;
  DType dtype = DType::kF32;
  std::vector<kernels::DeviceBuffer> units;  // per unit of spec
  nlohmann::json generation_config;          // generation_config.json, or null
  nlohmann::json train_config;               // a checkpoint manifest's config, or null
  bool has_tokenizer = false;                // tokenizer.json is there

  std::vector<const void*> unit_params() const;
  // generation_config.json's eos_token_id (the first, when it is a list) or -1.
  int64_t eos_token_id() const;
};

// Loads `dir`; errors name `flag` ("--model") and the file.
Result<InferenceModel> LoadInferenceModel(const std::string& dir, kernels::Backend* backend, DType dtype,
                                          const std::string& flag);

}  // namespace strata
