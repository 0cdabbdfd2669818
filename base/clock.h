// SPDX-License-Identifier: Apache-2.0
// The one clock strata measures time with: seconds on the steady clock (never
// adjusted, so differences are durations), as a double.
#pragma once

#include <chrono>

namespace strata {

inline double NowSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace strata
