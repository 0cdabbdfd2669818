// SPDX-License-Identifier: Apache-2.0
// Element types of stored tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class DType : uint8_t {
  kF32 = 0,
  kF16,
  kBF16,
  kF64,
  kI64,
  kI32,
  kI16,
  kU16,
  kI8,
  kU8,
};

constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
    case DType::kU16: return 2;
    case DType::kI8:
    case DType::kU8: return 1;
  }
  return 0;
}

constexpr bool IsFloating(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF64;
}

// Short names: "f32", "f16", "bf16", "f64", "i64", "i32", "i16", "u16", "i8", "u8".
std::string_view DTypeName(DType t);
// Accepts the short names and the common long ones ("float32", "fp16",
// "float16", "half", "bfloat16", "int32", "uint8", ...).
std::optional<DType> ParseDType(std::string_view s);
// safetensors' names: "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "U16", "I8", "U8".
std::string_view SafetensorsDTypeName(DType t);
std::optional<DType> ParseSafetensorsDType(std::string_view s);

}  // namespace strata
