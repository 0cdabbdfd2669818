// SPDX-License-Identifier: Apache-2.0
// How a holder uses a tensor's contents while it holds them: the vocabulary
// of the tier store's Acquire, the prefetcher's schedule and the model's
// passes alike.
#pragma once

#include <cstdint>
#include <string_view>

namespace strata {

enum class Access : uint8_t {
  kRead,          // reads the contents; writes nothing
  kReadWrite,     // reads and changes them
  kWriteDiscard,  // overwrites them without reading (the old contents are not needed)
};
// "read", "read-write", "write-discard".
std::string_view AccessName(Access a);

}  // namespace strata
