// SPDX-License-Identifier: Apache-2.0
#include "engine/config_change.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>

#include "engine/config_json.h"

namespace strata {

using nlohmann::json;

namespace {

// Leaves by key path; arrays are leaves (betas). Depth is bounded by the
// config reader (these are ConfigToJson's).
void Flatten(const json& j, const std::string& path, std::map<std::string, const json*>* out, int depth = 0) {
  if (j.is_object() && depth < kMaxConfigDepth) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::string key = path;
      if (!key.empty()) key += '.';
      key += it.key();
      Flatten(it.value(), key, out, depth + 1);
    }
    return;
  }
  (*out)[path] = &j;
}

bool KeepsTheBits(const std::string& key) {
  static const char* const kPrefixes[] = {"zero_optimization.", "aio.", "activation_checkpointing."};
  static const char* const kKeys[] = {"steps_per_print",        "wall_clock_breakdown",
                                      "trainer.eval_interval",  "trainer.eval_batches",
                                      "trainer.schedule",       "trainer.gpu_assisted_optimizer",
                                      "trainer.steps",          "trainer.seed",
                                      "trainer.nvme_checksum",  "trainer.save_dtype",
                                      "trainer.save_max_shard_size"};
  for (const char* p : kPrefixes)
    if (key.rfind(p, 0) == 0) return true;
  for (const char* k : kKeys)
    if (key == k) return true;
  return false;
}

bool Same(const std::string& key, const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if ((key == "data.path" || key == "data.val_path") && a.is_string() && b.is_string()) {
    const std::string& x = a.get_ref<const std::string&>();
    const std::string& y = b.get_ref<const std::string&>();
    if (x == y) return true;
    if (x.empty() || y.empty()) return false;
    std::error_code e1, e2;
    const auto cx = std::filesystem::weakly_canonical(x, e1), cy = std::filesystem::weakly_canonical(y, e2);
    return !e1 && !e2 && cx == cy;
  }
  return a == b;
}

// Keys added after checkpoints were first written, with the value a
// manifest without them meant: absent there and this value here is no change.
const json* AddedLaterDefault(const std::string& key) {
  static const json kFalse = false;
  if (key == "bf16.bf16_optimizer_states") return &kFalse;
  return nullptr;
}

std::string Text(const json* v) {
  if (!v) return "(absent)";
  return PrintableText(v->dump(-1, ' ', false, json::error_handler_t::replace), 60);
}

}  // namespace

std::vector<ConfigChange> ConfigChanges(const json& recorded, const json& now) {
  std::map<std::string, const json*> a, b;
  Flatten(recorded, "", &a);
  Flatten(now, "", &b);
  std::vector<ConfigChange> out;
  auto add = [&](const std::string& key, const json* x, const json* y) {
    if (x && y && Same(key, *x, *y)) return;
    if (const json* d = AddedLaterDefault(key); d && (x ? !y && Same(key, *x, *d) : y && Same(key, *y, *d))) return;
    out.push_back({key, Text(x), Text(y), !KeepsTheBits(key)});
  };
  for (const auto& [key, v] : a) {
    auto it = b.find(key);
    add(key, v, it == b.end() ? nullptr : it->second);
  }
  for (const auto& [key, v] : b)
    if (!a.count(key)) add(key, nullptr, v);
  std::sort(out.begin(), out.end(), [](const ConfigChange& x, const ConfigChange& y) { return x.key < y.key; });
  return out;
}

std::string DescribeChange(const ConfigChange& c) {
  return c.key + ": " + c.before + " -> " + c.after + (c.breaks_identity ? "" : " (keeps the bits)");
}

}  // namespace strata
