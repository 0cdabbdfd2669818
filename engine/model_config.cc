#include "engine/model_config.h"

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/config_json.h"
#include "engine/hf_export.h"
#include "engine/hf_weights.h"
#include "models/gpt2.h"

namespace strata {

Result<models::ModelSpec> ModelSpecFor(const Config& c) {
  models::GptConfig g;
  g.n_layer = c.model.n_layer;
  g.n_embd = c.model.n_embd;
  g.n_head = c.model.n_head;
  g.vocab_size = c.model.vocab_size;
  g.padded_vocab_size = 0;
  g.seq_len = c.model.seq_len;
  Result<models::ModelSpec> spec = models::Gpt2Spec(g);
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

Result<WeightsModel> ModelFromHfWeights(const std::string& path) {
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
