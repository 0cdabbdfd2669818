// SPDX-License-Identifier: Apache-2.0
// The `aio` block of a ds_config.json as strata-bench nvme --tune prints it:
// the text to paste (a JSON member, `"aio": {...}`, two-space indented), and
// exactly what engine/config.h's reader accepts (tests/bench parses it back).
#pragma once

#include <string>

#include "engine/config.h"

namespace strata::bench {

// `"aio": {` ... `}`, one key a line, ints for the sizes (bytes), no trailing newline.
std::string AioBlock(const AioConfig& aio);

}  // namespace strata::bench
