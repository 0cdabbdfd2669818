// SPDX-License-Identifier: Apache-2.0
#include "bench/aio_block.h"

#include <sstream>

namespace strata::bench {

std::string AioBlock(const AioConfig& aio) {
  std::ostringstream os;
  os << "\"aio\": {\n"
     << "  \"block_size\": " << aio.block_size << ",\n"
     << "  \"queue_depth\": " << aio.queue_depth << ",\n"
     << "  \"intra_op_parallelism\": " << aio.intra_op_parallelism << ",\n"
     << "  \"single_submit\": " << (aio.single_submit ? "true" : "false") << ",\n"
     << "  \"overlap_events\": " << (aio.overlap_events ? "true" : "false") << "\n"
     << "}";
  return os.str();
}

}  // namespace strata::bench
