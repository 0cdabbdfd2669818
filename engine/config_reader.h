// SPDX-License-Identifier: Apache-2.0
// The config's key reader (engine/config.cc's, internal): one JSON object of
// the config with its path, every key read marked, so that Finish() can
// classify the rest: DeepSpeed keys strata does not implement warn or are
// errors per their policy, anything else is an error naming the nearest
// known key (a typo is never silently ignored). Values are checked as they
// are read (range, kind, allowed spellings) with errors naming the key's
// path, the value and what is allowed. Errors are collected (Ctx::errors)
// so that a file's errors are reported together; a method that finds one
// returns it too, so that a rule stops where it cannot go on.
//
// Thread-safety: a reader is used by one thread.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/config.h"
#include "engine/config_json.h"

namespace strata::config_internal {

using nlohmann::json;

// What to do with a DeepSpeed key strata does not implement.
enum class Policy {
  kWarn,            // accepted, one warning
  kErrorIfEnabled,  // error when true / nonzero / {"enabled": true} / a non-empty object without enabled:false
  kError,           // always an error (present at all changes the result)
};

struct Ignored {
  const char* key;
  Policy policy;
  const char* why;  // for errors: what ignoring it would change
};

inline bool Enabled(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) return !v.get<std::string>().empty() && v.get<std::string>() != "none";
  if (v.is_object()) {
    if (v.contains("enabled")) return Enabled(v["enabled"]);
    return !v.empty();
  }
  if (v.is_array()) return !v.empty();
  return false;
}

// `v` as JSON text, bounded: at most `max` bytes of it are built, however
// large or deep `v` is (a message never prints a whole 4 MiB value, and never
// recurses into 100,000 levels).
inline void ShowInto(const json& v, std::string* out, size_t max, int depth) {
  if (out->size() > max) return;
  if (v.is_object() || v.is_array()) {
    const bool obj = v.is_object();
    if (depth >= 6) {
      *out += obj ? "{...}" : "[...]";
      return;
    }
    *out += obj ? "{" : "[";
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out->size() <= max; ++it) {
      if (!first) *out += ",";
      first = false;
      if (obj) *out += "\"" + PrintableText(it.key(), max) + "\":";
      ShowInto(it.value(), out, max, depth + 1);
    }
    *out += obj ? "}" : "]";
  } else if (v.is_string()) {
    *out += "\"" + PrintableText(v.get_ref<const std::string&>(), max) + "\"";
  } else {
    *out += v.dump();  // a number, true, false, null (never invalid UTF-8)
  }
}

inline std::string Show(const json& v) {
  std::string s;
  ShowInto(v, &s, 80, 0);
  return PrintableText(s, 60);
}

// DeepSpeed keys whose default is None: null there means the default (as
// leaving the key out does); elsewhere null is a wrong type.
inline bool NullMeansDefault(const std::string& path) {
  static const std::set<std::string> paths = {
      "train_batch_size",
      "train_micro_batch_size_per_gpu",
      "gradient_accumulation_steps",
      "activation_checkpointing.number_checkpoints",
      "zero_optimization.offload_param",
      "zero_optimization.offload_optimizer",
      "zero_optimization.offload_param.nvme_path",
      "zero_optimization.offload_optimizer.nvme_path",
      "scheduler.params.cycle_second_step_size",
      "scheduler.params.cycle_second_stair_count",
  };
  return paths.count(path) > 0;
}

inline std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The first error of `all`, each of which was evaluated (in order): a rule
// reads every key it owns before it stops, so that none is left unread (and
// reported as unknown).
inline Status FirstError(std::initializer_list<Status> all) {
  for (const Status& s : all)
    if (!s.ok()) return s;
  return Status::OK();
}

struct Ctx {
  std::string source;
  std::vector<std::string>* warnings;
  std::vector<std::string> errors;  // every error found, in reading order
  std::set<std::string> unresolved;  // key paths of "auto" values reported unresolved (read as absent)
};

// One JSON object of the config, with its path; every key read is marked so
// that Finish() can classify the rest.
class Obj {
 public:
  Obj(const json& j, std::string path, Ctx* ctx) : j_(j), path_(std::move(path)), ctx_(ctx) {}

  std::string KeyPath(const std::string& key) const {
    const std::string k = PrintableText(key, 60);
    return path_.empty() ? k : path_ + "." + k;
  }
  // The error at `key` (InvalidArgument "<source>: <path>.<key>: <what>"),
  // recorded in the context's errors; `key` is marked failed.
  Status Error(const std::string& key, const std::string& what) const {
    failed_.insert(key);
    Status s = InvalidArgument(ctx_->source + ": " + KeyPath(key) + ": " + what);
    ctx_->errors.emplace_back(s.message());
    return s;
  }
  // An error that is no one key's ("<source>: <what>"), recorded likewise.
  Status Fail(const std::string& what) const {
    Status s = InvalidArgument(ctx_->source + ": " + what);
    ctx_->errors.emplace_back(s.message());
    return s;
  }
  // True when reading `key` gave an error (rules across keys skip then).
  bool Failed(const std::string& key) const { return failed_.count(key) > 0; }

  // Marks `key` as known (implemented) and returns its value, or nullptr when
  // it is absent (or null where DeepSpeed's default is None).
  const json* Take(const std::string& key) {
    known_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end()) return nullptr;
    if (it->is_null() && NullMeansDefault(KeyPath(key))) return nullptr;
    if (ctx_->unresolved.count(KeyPath(key))) return nullptr;
    return &*it;
  }
  bool Has(const std::string& key) const { return j_.contains(key); }
  static bool IsAuto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

  Status AutoError(const std::string& key) const {
    return Error(key, "\"auto\" has nothing to resolve it here (strata resolves \"auto\" where the Hugging Face "
                      "Trainer fills it in, from the config's trainer section: docs/training.md); give a value");
  }

  Status Bool(const std::string& key, bool* out) {
    const json* v = Take(key);
    if (!v) return Status::OK();
    if (!v->is_boolean()) {
      if (IsAuto(*v)) return AutoError(key);
      return Error(key, Show(*v) + " is not allowed (allowed: true, false)");
    }
    *out = v->get<bool>();
    return Status::OK();
  }

  // Integers may be written as 5e8 (DeepSpeed configs do). `auto_ok`:
  // "auto" keeps the default (for performance-only sizes).
  template <typename T>
  Status Int(const std::string& key, T* out, double lo, double hi, bool auto_ok = false) {
    const json* v = Take(key);
    if (!v) return Status::OK();
    if (IsAuto(*v)) return auto_ok ? Status::OK() : AutoError(key);
    const std::string allowed = " (allowed: an integer from " + Num(lo) + " to " + Num(hi) + ")";
    if (!v->is_number()) return Error(key, Show(*v) + " is not a number" + allowed);
    // Integers exactly (a seed beyond 2^53 keeps its digits); 5e8 as a double.
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (lo > 0 && u < static_cast<uint64_t>(lo)) return Error(key, Show(*v) + " is out of range" + allowed);
      if (static_cast<long double>(u) > static_cast<long double>(hi))
        return Error(key, Show(*v) + " is out of range" + allowed);
      *out = static_cast<T>(u);
      return Status::OK();
    }
    if (v->is_number_integer()) {
      const int64_t i = v->get<int64_t>();
      if (static_cast<long double>(i) < static_cast<long double>(lo) ||
          static_cast<long double>(i) > static_cast<long double>(hi))
        return Error(key, Show(*v) + " is out of range" + allowed);
      *out = static_cast<T>(i);
      return Status::OK();
    }
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return Error(key, Show(*v) + " is not an integer" + allowed);
    if (d < lo || d > hi) return Error(key, Show(*v) + " is out of range" + allowed);
    *out = static_cast<T>(d);
    return Status::OK();
  }

  Status Double(const std::string& key, double* out, double lo, double hi, bool lo_open = false,
                bool auto_ok = false) {
    const json* v = Take(key);
    if (!v) return Status::OK();
    if (IsAuto(*v)) return auto_ok ? Status::OK() : AutoError(key);
    std::string range = std::string(lo_open ? "(" : "[") + Num(lo) + ", " + Num(hi) + "]";
    if (!v->is_number()) return Error(key, Show(*v) + " is not a number (allowed: " + range + ")");
    double d = v->get<double>();
    if (!std::isfinite(d) || d > hi || d < lo || (lo_open && d == lo))
      return Error(key, Show(*v) + " is out of range (allowed: " + range + ")");
    *out = d;
    return Status::OK();
  }

  // One of `allowed` (compared case-insensitively); stores the canonical spelling.
  Status Choice(const std::string& key, std::string* out, const std::vector<std::string>& allowed) {
    const json* v = Take(key);
    if (!v) return Status::OK();
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    if (!v->is_string()) return Error(key, Show(*v) + " is not allowed (allowed: " + list + ")");
    std::string s = v->get<std::string>();
    for (const auto& a : allowed)
      if (Lower(a) == Lower(s)) {
        *out = a;
        return Status::OK();
      }
    return Error(key, "\"" + s + "\" is not allowed (allowed: " + list + ")");
  }

  Status String(const std::string& key, std::string* out) {
    const json* v = Take(key);
    if (!v) return Status::OK();
    if (!v->is_string()) return Error(key, Show(*v) + " is not a string");
    *out = v->get<std::string>();
    return Status::OK();
  }

  // The sub-object at `key` (empty object when absent).
  Result<Obj> Child(const std::string& key) {
    const json* v = Take(key);
    if (!v) return Obj(Empty(), KeyPath(key), ctx_);
    if (!v->is_object()) return Error(key, Show(*v) + " is not a JSON object");
    return Obj(*v, KeyPath(key), ctx_);
  }

  // Classifies every key not read: DeepSpeed keys in `ignored` per their
  // policy, anything else an error naming the nearest known key. Every such
  // error is recorded; the first is returned.
  Status Finish(const std::vector<Ignored>& ignored) {
    Status first;
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      Status s = Classify(it.key(), it.value(), ignored);
      if (!s.ok() && first.ok()) first = s;
    }
    return first;
  }

  const json& raw() const { return j_; }
  const std::string& path() const { return path_; }

 private:
  Status Classify(const std::string& key, const json& value, const std::vector<Ignored>& ignored) {
    if (known_.count(key)) return Status::OK();
    const Ignored* ig = nullptr;
    for (const auto& i : ignored)
      if (key == i.key) ig = &i;
    if (ig) {
      bool err = ig->policy == Policy::kError || (ig->policy == Policy::kErrorIfEnabled && Enabled(value));
      if (err)
        return Error(key, "strata does not implement this DeepSpeed setting and ignoring " + Show(value) +
                              " would change the training result (" + ig->why + "); remove it or disable it");
      ctx_->warnings->push_back(ctx_->source + ": " + KeyPath(key) +
                                ": DeepSpeed setting not implemented by strata; ignored (" + ig->why + ")");
      return Status::OK();
    }
    // Past the errors a message shows, the nearest key is not looked for:
    // a file of 100,000 unknown keys would spend seconds on suggestions no
    // one reads.
    if (ctx_->errors.size() >= kConfigErrorsShown) return Error(key, "unknown key");
    std::string best;
    size_t best_d = SIZE_MAX;
    const std::string k = key.substr(0, 200);  // bounds the distance's cost
    auto consider = [&](const std::string& cand) {
      size_t d = EditDistance(k, cand);
      // A key that is a truncation of a known one ("train_micro_batch_size")
      // most likely means that one.
      if (cand.rfind(k, 0) == 0 || k.rfind(cand, 0) == 0)
        d = std::min(d, 1 + (std::max(cand.size(), k.size()) - std::min(cand.size(), k.size())) / 4);
      if (d < best_d) best_d = d, best = cand;
    };
    for (const auto& c : known_) consider(c);
    for (const auto& i : ignored) consider(i.key);
    std::string msg = "unknown key (neither DeepSpeed nor strata knows it)";
    if (!best.empty() && best_d <= std::max<size_t>(3, k.size() / 3) && best_d < k.size())
      msg += "; did you mean \"" + best + "\"?";
    else if (!best.empty())
      msg += "; the nearest known key here is \"" + best + "\"";
    return Error(key, msg);
  }

  static const json& Empty() {
    static const json e = json::object();
    return e;
  }
  static std::string Num(double d) {
    std::ostringstream os;
    if (d >= 1e15) os << "1e15+";
    else os << d;
    return os.str();
  }
  const json& j_;
  std::string path_;
  Ctx* ctx_;
  std::set<std::string> known_;
  mutable std::set<std::string> failed_;
};

}  // namespace strata::config_internal
