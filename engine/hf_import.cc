// SPDX-License-Identifier: Apache-2.0
#include "engine/hf_import.h"

#include <set>

namespace strata {

namespace {

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Buffers, not parameters, that transformers wrote into some checkpoints.
bool IsSavedBuffer(const std::string& name) {
  for (const char* tail : {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"})
    if (EndsWith(name, tail)) return true;
  return false;
}

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t d = 0; d < s.size(); ++d) out += (d ? ", " : "") + std::to_string(s[d]);
  return out + "]";
}

Status CheckTensor(const HfTensor& h, const models::ParamSpec& t) {
  const SafetensorsEntry& e = h.entry;
  bool shape_ok = e.shape.rank() == static_cast<int>(t.shape.size());
  for (size_t d = 0; shape_ok && d < t.shape.size(); ++d)
    shape_ok = t.extra_rows_ok && d == 0 ? e.shape[0] >= t.shape[0] : e.shape[static_cast<int>(d)] == t.shape[d];
  if (!shape_ok)
    return InvalidArgument("tensor '" + e.name + "' in " + h.file + " has shape " + e.shape.ToString() +
                           ", the configured model needs " + ShapeText(t.shape) +
                           (t.extra_rows_ok ? " (at least seq_len rows)" : ""));
  if (!IsFloating(e.dtype))
    return InvalidArgument("tensor '" + e.name + "' in " + h.file + " is " + std::string(DTypeName(e.dtype)) +
                           ", not a floating-point tensor (bf16, fp16, fp32)");
  return Status::OK();
}

}  // namespace

Result<std::vector<HfParamSource>> MatchHfTensors(const HfWeights& weights, const models::ModelSpec& spec,
                                                  const std::string& prefix) {
  const std::string& base = spec.hf_base_prefix;
  const std::string where = weights.index_path().empty() ? weights.path() : weights.index_path();
  std::vector<HfParamSource> out;
  std::set<std::string> used;
  for (const models::ParamSpec& t : spec.params) {
    const HfTensor* h = weights.Find(prefix + t.name);
    if (!h && !base.empty() && t.name.rfind(base, 0) == 0) h = weights.Find(prefix + t.name.substr(base.size()));
    if (!h) return NotFound("tensor '" + prefix + t.name + "' is not in " + where);
    RETURN_IF_ERROR(CheckTensor(*h, t));
    used.insert(h->entry.name);
    out.push_back({&t, h});
  }
  for (const auto& [name, h] : weights.tensors()) {
    if (used.count(name) || name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    if (IsSavedBuffer(rest)) continue;
    if (spec.head.tied && (rest == "lm_head.weight")) continue;
    return InvalidArgument("tensor '" + name + "' in " + h.file + " is not a parameter of the configured model (" +
                           spec.hf_architecture + ", " + std::to_string(spec.n_layer) + " layers)");
  }
  return out;
}

}  // namespace strata
