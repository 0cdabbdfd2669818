// SPDX-License-Identifier: Apache-2.0
// The three tiers of the store, fastest first.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class TierKind : uint8_t { kGpu = 0, kHost = 1, kNvme = 2 };
inline constexpr int kNumTiers = 3;

inline std::string_view TierName(TierKind t) {
  switch (t) {
    case TierKind::kGpu: return "gpu";
    case TierKind::kHost: return "host";
    case TierKind::kNvme: return "nvme";
  }
  return "?";
}

// Accepts "gpu"/"cuda"/"device", "host"/"cpu", "nvme"/"disk".
std::optional<TierKind> ParseTierKind(std::string_view s);

}  // namespace strata
