// SPDX-License-Identifier: Apache-2.0
#include "base/access.h"

namespace strata {

std::string_view AccessName(Access a) {
  switch (a) {
    case Access::kRead: return "read";
    case Access::kReadWrite: return "read-write";
    case Access::kWriteDiscard: return "write-discard";
  }
  return "?";
}

}  // namespace strata
