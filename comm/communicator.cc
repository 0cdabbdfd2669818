// SPDX-License-Identifier: Apache-2.0
#include "comm/communicator.h"

#include <cstdio>

namespace strata::comm {

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

Status CollectiveError(StatusCode code, std::string_view collective, int rank, int world, int peer,
                       std::string_view what) {
  std::string m(collective);
  m += " on rank " + std::to_string(rank) + " of " + std::to_string(world);
  if (peer >= 0) m += " (peer rank " + std::to_string(peer) + ")";
  m += ": ";
  m += what;
  Status::Rep rep;
  rep.code = code;
  rep.message = std::move(m);
  return Status(std::move(rep));
}

std::string SecondsText(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g s", s);
  return b;
}

std::string CollectiveText(std::string_view collective, size_t count, DType dtype) {
  return std::string(collective) + " " + std::to_string(count) + " x " + std::string(DTypeName(dtype));
}

}  // namespace strata::comm
