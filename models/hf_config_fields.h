// SPDX-License-Identifier: Apache-2.0
// Typed reads of a Hugging Face config.json's fields for the families'
// readers (models/gpt2.cc, models/llama.cc): a missing field takes its
// default (a required one, default -1, is an error), a present one of the
// wrong type or out of range is InvalidArgument naming the file and field.
//
// Thread-safety: a value over a const json.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace strata::models {

class HfFields {
 public:
  HfFields(const nlohmann::json& j, std::string path) : j_(j), path_(std::move(path)) {}

  bool Has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  // A positive integer (< 2^31); `dflt` -1: required.
  Result<int64_t> Int(const char* key, int64_t dflt) const {
    if (!Has(key)) {
      if (dflt < 0) return InvalidArgument(path_ + ": no \"" + key + "\"");
      return dflt;
    }
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() >= (int64_t{1} << 31))
      return InvalidArgument(path_ + ": \"" + key + "\" is " + v.dump() + ", not a positive integer");
    return v.get<int64_t>();
  }
  // A finite number > 0.
  Result<double> Real(const char* key, double dflt) const { return RealIn(j_, key, dflt); }
  Result<double> RealIn(const nlohmann::json& obj, const char* key, double dflt) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return dflt;
    const nlohmann::json& v = obj.at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
      return InvalidArgument(path_ + ": \"" + key + "\" is " + v.dump() + ", not a number > 0");
    return v.get<double>();
  }
  Result<bool> Bool(const char* key, bool dflt) const {
    if (!Has(key)) return dflt;
    if (!j_.at(key).is_boolean()) return InvalidArgument(path_ + ": \"" + key + "\" is " + j_.at(key).dump() + ", not true or false");
    return j_.at(key).get<bool>();
  }
  Result<std::string> Text(const char* key, const std::string& dflt) const {
    if (!Has(key)) return dflt;
    if (!j_.at(key).is_string()) return InvalidArgument(path_ + ": \"" + key + "\" is " + j_.at(key).dump() + ", not a string");
    return j_.at(key).get<std::string>();
  }
  const std::string& path() const { return path_; }

 private:
  const nlohmann::json& j_;
  std::string path_;
};

// The float's nearest short decimal (1e-05, not 9.999999747378752e-06).
inline double ShortDecimal(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7g", static_cast<double>(v));
  return std::stod(buf);
}

}  // namespace strata::models
