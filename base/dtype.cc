// SPDX-License-Identifier: Apache-2.0
#include "base/dtype.h"

#include <array>
#include <utility>

namespace strata {

namespace {
struct Names {
  DType t;
  std::string_view short_name;
  std::string_view st_name;
};
constexpr std::array<Names, 10> kNames = {{
    {DType::kF32, "f32", "F32"},
    {DType::kF16, "f16", "F16"},
    {DType::kBF16, "bf16", "BF16"},
    {DType::kF64, "f64", "F64"},
    {DType::kI64, "i64", "I64"},
    {DType::kI32, "i32", "I32"},
    {DType::kI16, "i16", "I16"},
    {DType::kU16, "u16", "U16"},
    {DType::kI8, "i8", "I8"},
    {DType::kU8, "u8", "U8"},
}};
}  // namespace

std::string_view DTypeName(DType t) {
  for (const auto& n : kNames)
    if (n.t == t) return n.short_name;
  return "?";
}

std::string_view SafetensorsDTypeName(DType t) {
  for (const auto& n : kNames)
    if (n.t == t) return n.st_name;
  return "?";
}

std::optional<DType> ParseDType(std::string_view s) {
  for (const auto& n : kNames)
    if (n.short_name == s || n.st_name == s) return n.t;
  static constexpr std::pair<std::string_view, DType> kAliases[] = {
      {"float32", DType::kF32}, {"float", DType::kF32},    {"fp32", DType::kF32},
      {"float16", DType::kF16}, {"fp16", DType::kF16},     {"half", DType::kF16},
      {"bfloat16", DType::kBF16}, {"float64", DType::kF64}, {"double", DType::kF64},
      {"fp64", DType::kF64},    {"int64", DType::kI64},    {"int32", DType::kI32},
      {"int16", DType::kI16},   {"uint16", DType::kU16},   {"int8", DType::kI8},
      {"uint8", DType::kU8},
  };
  for (const auto& [name, t] : kAliases)
    if (name == s) return t;
  return std::nullopt;
}

std::optional<DType> ParseSafetensorsDType(std::string_view s) {
  for (const auto& n : kNames)
    if (n.st_name == s) return n.t;
  return std::nullopt;
}

}  // namespace strata
