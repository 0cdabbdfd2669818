// SPDX-License-Identifier: Apache-2.0
#include "base/tier_kind.h"

namespace strata {

std::optional<TierKind> ParseTierKind(std::string_view s) {
  if (s == "gpu" || s == "cuda" || s == "device") return TierKind::kGpu;
  if (s == "host" || s == "cpu") return TierKind::kHost;
  if (s == "nvme" || s == "disk") return TierKind::kNvme;
  return std::nullopt;
}

}  // namespace strata
