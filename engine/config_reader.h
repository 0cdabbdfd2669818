// The config's key reader (engine/config.cc's, internal): one JSON object of
// the config with its path, every key read marked, so that Finish() can
// classify the rest: DeepSpeed keys strata does not implement warn or are
// errors per their policy, anything else is an error naming the nearest
// known key (a typo is never silently ignored). Values are checked as they
// are read (range, kind, allowed spellings) with errors naming the key's
// path, the value and what is allowed.
//
// Thread-safety: a reader is used by one thread.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/config.h"

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

inline std::string Show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

inline std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct Ctx {
  std::string source;
  std::vector<std::string>* warnings;
};

// One JSON object of the config, with its path; every key read is marked so
// that Finish() can classify the rest.
class Obj {
 public:
  Obj(const json& j, std::string path, Ctx* ctx) : j_(j), path_(std::move(path)), ctx_(ctx) {}

  std::string KeyPath(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  Status Error(const std::string& key, const std::string& what) const {
    return InvalidArgument(ctx_->source + ": " + KeyPath(key) + ": " + what);
  }

  // Marks `key` as known (implemented) and returns its value or nullptr.
  const json* Take(const std::string& key) {
    known_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  bool Has(const std::string& key) const { return j_.contains(key); }
  static bool IsAuto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

  Status AutoError(const std::string& key) const {
    return Error(key, "\"auto\" needs a value here (it is filled in by the Hugging Face Trainer, "
                      "which strata does not use); give a number");
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
    if (!v->is_number())
      return Error(key, Show(*v) + " is not a number (allowed: an integer from " + Num(lo) + " to " + Num(hi) + ")");
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d))
      return Error(key, Show(*v) + " is not an integer (allowed: an integer from " + Num(lo) + " to " + Num(hi) + ")");
    if (d < lo || d > hi)
      return Error(key, Show(*v) + " is out of range (allowed: an integer from " + Num(lo) + " to " + Num(hi) + ")");
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
  // policy, anything else an error naming the nearest known key.
  Status Finish(const std::vector<Ignored>& ignored) {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      const std::string& key = it.key();
      if (known_.count(key)) continue;
      const Ignored* ig = nullptr;
      for (const auto& i : ignored)
        if (key == i.key) ig = &i;
      if (ig) {
        bool err = ig->policy == Policy::kError ||
                   (ig->policy == Policy::kErrorIfEnabled && Enabled(it.value()));
        if (err)
          return Error(key, "strata does not implement this DeepSpeed setting and ignoring " +
                                Show(it.value()) + " would change the training result (" + ig->why +
                                "); remove it or disable it");
        ctx_->warnings->push_back(ctx_->source + ": " + KeyPath(key) +
                                  ": DeepSpeed setting not implemented by strata; ignored (" + ig->why + ")");
        continue;
      }
      std::string best;
      size_t best_d = SIZE_MAX;
      auto consider = [&](const std::string& cand) {
        size_t d = EditDistance(key, cand);
        // A key that is a truncation of a known one ("train_micro_batch_size")
        // most likely means that one.
        if (cand.rfind(key, 0) == 0 || key.rfind(cand, 0) == 0)
          d = std::min(d, 1 + (std::max(cand.size(), key.size()) - std::min(cand.size(), key.size())) / 4);
        if (d < best_d) best_d = d, best = cand;
      };
      for (const auto& k : known_) consider(k);
      for (const auto& i : ignored) consider(i.key);
      std::string msg = "unknown key (neither DeepSpeed nor strata knows it)";
      if (!best.empty() && best_d <= std::max<size_t>(3, key.size() / 3))
        msg += "; did you mean \"" + best + "\"?";
      else if (!best.empty())
        msg += "; the nearest known key here is \"" + best + "\"";
      return Error(key, msg);
    }
    return Status::OK();
  }

  const json& raw() const { return j_; }
  const std::string& path() const { return path_; }

 private:
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
};

}  // namespace strata::config_internal
