// SPDX-License-Identifier: Apache-2.0
#include "engine/model_config.h"

#include <fstream>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/config_json.h"
#include "engine/hf_export.h"
#include "engine/hf_weights.h"
#include "models/family.h"

namespace strata {

models::ModelDesc DescOf(const ModelConfig& m) {
  models::ModelDesc d;
  d.arch = m.arch;
  d.n_layer = m.n_layer;
  d.n_embd = m.n_embd;
  d.n_head = m.n_head;
  d.n_kv_head = m.n_kv_head;
  d.intermediate_size = m.intermediate_size;
  d.vocab_size = m.vocab_size;
  d.seq_len = m.seq_len;
  Result<const models::Family*> f = models::FindFamily(m.arch);
  // GPT-2 keeps its LayerNorm epsilon (1e-5); the Llama family reads rms_norm_eps.
  d.norm_eps = f.ok() && std::string((*f)->name) == "gpt2" ? 0 : m.rms_norm_eps;
  d.rope.theta = static_cast<float>(m.rope_theta);
  const RopeScalingConfig& r = m.rope_scaling;
  d.rope.type = r.rope_type == "linear" ? kernels::RopeParams::kLinear
                : r.rope_type == "llama3" ? kernels::RopeParams::kLlama3 : kernels::RopeParams::kDefault;
  d.rope.factor = static_cast<float>(r.factor);
  d.rope.low_freq_factor = static_cast<float>(r.low_freq_factor);
  d.rope.high_freq_factor = static_cast<float>(r.high_freq_factor);
  d.rope.original_max_positions = r.original_max_position_embeddings;
  d.tie_word_embeddings = m.tie_word_embeddings;
  d.attention_bias = m.attention_bias;
  return d;
}

ModelConfig ConfigOf(const models::ModelDesc& d) {
  ModelConfig m;
  m.arch = d.hf_architecture.empty() ? d.arch : d.hf_architecture;
  m.n_layer = static_cast<int>(d.n_layer);
  m.n_embd = static_cast<int>(d.n_embd);
  m.n_head = static_cast<int>(d.n_head);
  m.n_kv_head = static_cast<int>(d.n_kv_head);
  m.intermediate_size = static_cast<int>(d.intermediate_size);
  m.vocab_size = static_cast<int>(d.vocab_size);
  m.seq_len = static_cast<int>(d.seq_len);
  if (d.norm_eps > 0) m.rms_norm_eps = d.norm_eps;
  m.rope_theta = d.rope.theta;
  m.rope_scaling.rope_type = d.rope.type == kernels::RopeParams::kLinear   ? "linear"
                             : d.rope.type == kernels::RopeParams::kLlama3 ? "llama3" : "default";
  m.rope_scaling.factor = d.rope.factor;
  m.rope_scaling.low_freq_factor = d.rope.low_freq_factor;
  m.rope_scaling.high_freq_factor = d.rope.high_freq_factor;
  m.rope_scaling.original_max_position_embeddings = d.rope.original_max_positions;
  m.tie_word_embeddings = d.tie_word_embeddings;
  m.attention_bias = d.attention_bias;
  return m;
}

Result<models::ModelSpec> ModelSpecFor(const Config& c) {
  Result<models::ModelSpec> spec = models::BuildModel(DescOf(c.model));
  if (!spec.ok()) return spec.status().WithContext(c.source + ": model");
  return spec;
}

DType ComputeDType(const Config& c) {
  if (c.bf16) return DType::kBF16;
  if (c.fp16.enabled) return DType::kF16;
  return DType::kF32;
}

double ModelFlopsPerToken(const models::ModelSpec& m, int64_t seq) {
  return 6.0 * static_cast<double>(m.NumParameters()) +
         12.0 * static_cast<double>(m.n_layer) * static_cast<double>(m.d_model) * static_cast<double>(seq);
}

Status CheckSeqLenWithinSource(const Config& c, const std::string& init_from) {
  if (init_from.empty()) return Status::OK();
  const std::string path = ModelSourceDir(init_from) + "/config.json";
  Result<std::string> text = ReadConfigText(path);
  if (!text.ok()) return Status::OK();  // no config.json: the weights' shapes decide
  ASSIGN_OR_RETURN(nlohmann::json j, ParseConfigJson(*text, path));
  if (!j.is_object()) return Status::OK();
  for (const char* key : {"max_position_embeddings", "n_positions"}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) continue;
    const int64_t positions = it->get<int64_t>();
    if (c.model.seq_len > positions)
      return InvalidArgument(c.source + ": model.seq_len " + std::to_string(c.model.seq_len) +
                             " is longer than the --init-from model's " + key + " " + std::to_string(positions) +
                             " (" + path + "): the model was made for at most " + std::to_string(positions) +
                             " positions; give a seq_len of at most " + std::to_string(positions) +
                             " (or leave the model section out to take " + key + ")");
    return Status::OK();
  }
  return Status::OK();
}

namespace {

// "n_head" of the config.json of the model directory of `weights` (itself,
// or the file's directory), or 0.
int HeadsFromConfigJson(const std::string& weights, std::string* from) {
  const std::string path = ModelSourceDir(weights) + "/config.json";
  Result<std::string> text = ReadConfigText(path);
  if (!text.ok()) return 0;
  Result<nlohmann::json> j = ParseConfigJson(*text, path);
  if (!j.ok() || !j->is_object()) return 0;
  for (const char* key : {"n_head", "num_attention_heads"}) {
    auto it = j->find(key);
    if (it != j->end() && it->is_number_integer() && it->get<int64_t>() > 0 && it->get<int64_t>() < (1 << 14)) {
      *from = path + " (" + key + ")";
      return static_cast<int>(it->get<int64_t>());
    }
  }
  return 0;
}

}  // namespace

static Result<std::optional<WeightsModel>> ModelFromHfConfig(const std::string& init_from) {
  const std::string dir = ModelSourceDir(init_from);
  const std::string path = dir + "/config.json";
  Result<std::string> text = ReadConfigText(path);
  if (!text.ok()) return std::optional<WeightsModel>();
  ASSIGN_OR_RETURN(nlohmann::json j, ParseConfigJson(*text, path));
  if (!j.is_object()) return std::optional<WeightsModel>();
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  else if (j.contains("model_type") && j["model_type"].is_string())
    arch = j["model_type"].get<std::string>();
  if (arch.empty()) return std::optional<WeightsModel>();
  Result<const models::Family*> fam = models::FindFamily(arch);
  if (!fam.ok()) return fam.status().WithContext(path + ": architectures");
  // GPT-2's shape comes from its weights (below), the heads from this file.
  if (std::string((*fam)->name) == "gpt2") return std::optional<WeightsModel>();
  ASSIGN_OR_RETURN(models::ModelDesc d, models::ReadHfConfig(j, path));
  WeightsModel w;
  w.model = ConfigOf(d);
  w.n_head_from = path;
  w.from_config_json = true;
  const std::string dt = j.value("torch_dtype", j.value("dtype", std::string("float32")));
  w.dtype = dt == "bfloat16" ? "bf16" : dt == "float16" ? "fp16" : "fp32";
  return std::optional<WeightsModel>(w);
}

Result<WeightsModel> ModelFromHfWeights(const std::string& path) {
  // A config.json naming a family whose shape the weights alone do not give
  // (every one but GPT-2) describes the model.
  ASSIGN_OR_RETURN(std::optional<WeightsModel> from_config, ModelFromHfConfig(path));
  if (from_config) return *from_config;
  ASSIGN_OR_RETURN(HfWeights f, HfWeights::Open(path));
  auto find = [&f](const std::string& name) -> const SafetensorsEntry* {
    const HfTensor* t = f.Find(name);
    return t ? &t->entry : nullptr;
  };
  std::string prefix;
  const SafetensorsEntry* wte = find("wte.weight");
  if (!wte) {
    prefix = "transformer.";
    wte = find(prefix + "wte.weight");
  }
  if (!wte) return NotFound("no GPT-2 token embedding (wte.weight or transformer.wte.weight) in " + path);
  const SafetensorsEntry* wpe = find(prefix + "wpe.weight");
  if (!wpe) return NotFound("no GPT-2 position embedding (" + prefix + "wpe.weight) in " + path);
  if (wte->shape.rank() != 2 || wpe->shape.rank() != 2 || wte->shape[1] != wpe->shape[1])
    return InvalidArgument(path + ": wte " + wte->shape.ToString() + " and wpe " + wpe->shape.ToString() +
                           " are not [vocab, d] and [positions, d] of one width");
  std::set<int64_t> layers;
  const std::string h = prefix + "h.";
  for (const auto& [name, t] : f.tensors()) {
    const SafetensorsEntry& e = t.entry;
    if (e.name.rfind(h, 0) != 0) continue;
    const size_t dot = e.name.find('.', h.size());
    const std::string n = e.name.substr(h.size(), dot == std::string::npos ? std::string::npos : dot - h.size());
    if (!n.empty() && n.size() < 6 && n.find_first_not_of("0123456789") == std::string::npos) layers.insert(std::stoll(n));
  }
  if (layers.empty()) return NotFound("no transformer blocks (" + h + "<l>.*) in " + path);
  WeightsModel w;
  w.model.n_layer = static_cast<int>(*layers.rbegin() + 1);
  w.model.n_embd = static_cast<int>(wte->shape[1]);
  w.model.vocab_size = static_cast<int>(wte->shape[0]);
  w.model.seq_len = static_cast<int>(wpe->shape[0]);
  w.model.n_head = HeadsFromConfigJson(path, &w.n_head_from);
  // The heads change no tensor's shape: guessing them would train another
  // model without a word.
  if (w.model.n_head == 0)
    return InvalidArgument(path + ": the weights do not say their number of heads and no config.json beside them "
                           "does (n_head); put the model's config.json there, or give the model section");
  if (w.model.n_embd % w.model.n_head)
    return InvalidArgument(w.n_head_from + ": n_head " + std::to_string(w.model.n_head) + " does not divide the "
                           "weights' width " + std::to_string(w.model.n_embd));
  w.dtype = wte->dtype == DType::kBF16 ? "bf16" : wte->dtype == DType::kF16 ? "fp16" : "fp32";
  return w;
}

}  // namespace strata
