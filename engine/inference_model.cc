// SPDX-License-Identifier: Apache-2.0
#include "engine/inference_model.h"

#include <sys/stat.h>

#include <fstream>
#include <span>

#include "base/half.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/hf_import.h"
#include "engine/hf_weights.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"

namespace strata {

namespace {

bool IsFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A JSON file beside the weights, or null when there is none.
Result<nlohmann::json> OptionalJson(const std::string& path) {
  if (!IsFile(path)) return nlohmann::json();
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(path + " is not valid JSON");
  return j;
}

// The unit's fp32 values rounded to `dtype`, as bytes.
std::vector<uint8_t> Encode(std::span<const float> master, DType dtype) {
  std::vector<uint8_t> out(master.size() * DTypeSize(dtype));
  if (dtype == DType::kF32) {
    std::memcpy(out.data(), master.data(), out.size());
  } else if (dtype == DType::kF64) {
    double* d = reinterpret_cast<double*>(out.data());
    for (size_t i = 0; i < master.size(); ++i) d[i] = master[i];
  } else {
    uint16_t* h = reinterpret_cast<uint16_t*>(out.data());
    for (size_t i = 0; i < master.size(); ++i)
      h[i] = dtype == DType::kBF16 ? FloatToBF16(master[i]) : FloatToHalf(master[i]);
  }
  return out;
}

}  // namespace

std::vector<const void*> InferenceModel::unit_params() const {
  std::vector<const void*> p;
  for (const kernels::DeviceBuffer& b : units) p.push_back(b.data());
  return p;
}

int64_t InferenceModel::eos_token_id() const {
  if (!generation_config.is_object() || !generation_config.contains("eos_token_id")) return -1;
  const nlohmann::json& e = generation_config["eos_token_id"];
  if (e.is_number_integer()) return e.get<int64_t>();
  if (e.is_array() && !e.empty() && e[0].is_number_integer()) return e[0].get<int64_t>();
  return -1;
}

Result<InferenceModel> LoadInferenceModel(const std::string& dir, kernels::Backend* backend, DType dtype,
                                          const std::string& flag) {
  InferenceModel m;
  m.dir = dir;
  if (IsFile(dir + "/latest")) {  // a --save directory: its latest step
    Result<std::string> step = ResolveCheckpoint(dir);
    if (!step.ok()) return step.status().WithContext(flag + " " + dir);
    m.dir = *step;
  }
  // A strata step directory holds the fp32 masters the run trained beside
  // the Hugging Face weights in the save dtype (bf16 by default): in
  // master.safetensors, or, saved partitioned across ranks, in slices in
  // the ranks' state files. Generation and eval read the masters, so that
  // they give the trainer's numbers.
  const std::string masters = m.dir + "/master.safetensors";
  Result<HfWeights> weights = HfWeights::Open(IsFile(masters) ? masters : m.dir);
  if (!weights.ok()) return weights.status().WithContext(flag + " " + dir);
  m.weights = weights->index_path().empty() ? weights->files().front() : weights->index_path();
  Result<WeightsModel> w = ModelFromHfWeights(m.dir);
  if (!w.ok()) return w.status().WithContext(flag + " " + dir);
  Config c = DefaultConfig();
  c.source = m.dir;
  c.model = w->model;
  ASSIGN_OR_RETURN(m.spec, ModelSpecFor(c));
  m.dtype = dtype;
  ASSIGN_OR_RETURN(m.generation_config, OptionalJson(m.dir + "/generation_config.json"));
  ASSIGN_OR_RETURN(nlohmann::json manifest, OptionalJson(m.dir + "/manifest.json"));
  if (manifest.is_object() && manifest.contains("config")) m.train_config = manifest["config"];
  m.has_tokenizer = IsFile(m.dir + "/tokenizer.json");

  auto upload = [&](std::span<const float> master) -> Status {
    const std::vector<uint8_t> bytes = Encode(master, dtype);
    ASSIGN_OR_RETURN(kernels::DeviceBuffer b, backend->Allocate(bytes.size()));
    RETURN_IF_ERROR(backend->CopyToDevice(b.data(), bytes.data(), bytes.size()));
    m.units.push_back(std::move(b));
    return Status::OK();
  };
  if (manifest.is_object() && !IsFile(masters)) {
    Result<bool> partitioned =
        ReadPartitionedMasters(m.dir, m.spec, [&](size_t, std::span<const float> master) { return upload(master); });
    if (!partitioned.ok()) return partitioned.status().WithContext(flag + " " + dir);
    if (*partitioned) {
      m.weights = m.dir + "/manifest.json";
      return m;
    }
  }
  ASSIGN_OR_RETURN(const std::vector<HfParamSource> sources, MatchHfTensors(*weights, m.spec, ""));
  for (int u = 0; u < m.spec.num_units(); ++u) {
    std::vector<float> master(static_cast<size_t>(m.spec.units[static_cast<size_t>(u)].numel), 0.f);
    for (const HfParamSource& src : sources) {
      if (src.param->unit != u) continue;
      std::span<float> dst(master.data() + src.param->offset, static_cast<size_t>(src.param->numel));
      RETURN_IF_ERROR(weights->ReadF32Into(*src.tensor, dst));
    }
    RETURN_IF_ERROR(upload(master));
  }
  return m;
}

}  // namespace strata
