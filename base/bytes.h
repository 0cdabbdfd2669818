// SPDX-License-Identifier: Apache-2.0
// Byte sizes: parsing "24GiB"/"512MB"/"1.5G" and printing them back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace strata {

inline constexpr uint64_t kKiB = 1ull << 10;
inline constexpr uint64_t kMiB = 1ull << 20;
inline constexpr uint64_t kGiB = 1ull << 30;

// Accepts a plain byte count ("4096") or a number with a unit: binary
// (KiB, MiB, GiB, TiB; also K, M, G, T and k, m, g, t, as DeepSpeed and most
// CLIs use them) or decimal (KB, MB, GB, TB). Fractions are allowed ("1.5GiB").
// Errors name the text and say what is accepted.
Result<uint64_t> ParseBytes(std::string_view text);

// "1.50 GiB", "512 B": binary units, 3 significant digits.
std::string FormatBytes(uint64_t bytes);

// Round up to a multiple of `align` (a power of two).
constexpr uint64_t AlignUp(uint64_t v, uint64_t align) { return (v + align - 1) & ~(align - 1); }
constexpr bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace strata
