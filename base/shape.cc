// SPDX-License-Identifier: Apache-2.0
#include "base/shape.h"

#include <cstdlib>
#include <limits>

namespace strata {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  if (dims.size() > kMaxRank) std::abort();  // programming error; untrusted input uses Make()
  rank_ = static_cast<int>(dims.size());
  for (int i = 0; i < rank_; ++i) dims_[i] = dims[i];
}

Result<Shape> Shape::Make(std::span<const int64_t> dims) {
  if (dims.size() > kMaxRank)
    return InvalidArgument("shape has rank " + std::to_string(dims.size()) + ", at most " +
                           std::to_string(kMaxRank) + " is supported");
  int64_t n = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0)
      return InvalidArgument("shape dimension " + std::to_string(i) + " is negative (" +
                             std::to_string(dims[i]) + ")");
    if (dims[i] != 0 && n > std::numeric_limits<int64_t>::max() / dims[i])
      return InvalidArgument("shape element count overflows int64");
    n *= dims[i];
  }
  return Shape(dims);
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::ToString() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

}  // namespace strata
