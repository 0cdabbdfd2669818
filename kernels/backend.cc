// SPDX-License-Identifier: Apache-2.0
#include "kernels/backend.h"

#include <cmath>
#include <string>
#include <utility>

namespace strata::kernels {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    owner_ = o.owner_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.owner_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (owner_ && data_) owner_->Free(data_, bytes_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Status CheckDecodeAttentionShape(const DecodeAttentionShape& s, const char* op) {
  auto bad = [op](const std::string& what) { return InvalidArgument(std::string(op) + ": " + what); };
  for (auto [name, v] : {std::pair{"batch", s.batch}, std::pair{"rows", s.rows}, std::pair{"past", s.past},
                         std::pair{"capacity", s.capacity}, std::pair{"kv_heads", s.kv_heads}})
    if (v < 0) return bad(std::string(name) + " = " + std::to_string(v) + " is negative");
  if (s.heads < 1) return bad("heads = " + std::to_string(s.heads) + " must be positive");
  if (s.head_dim < 1) return bad("head_dim = " + std::to_string(s.head_dim) + " must be positive");
  if (s.heads % s.kv() != 0)
    return bad("heads = " + std::to_string(s.heads) + " is not a multiple of kv_heads = " + std::to_string(s.kv()));
  if (s.past + s.rows > s.capacity)
    return bad("past + rows = " + std::to_string(s.past) + " + " + std::to_string(s.rows) +
               " exceeds the cache's capacity of " + std::to_string(s.capacity) + " positions");
  if (!(s.scale >= 0.f) || !std::isfinite(s.scale))
    return bad("scale = " + std::to_string(s.scale) + " must be finite and >= 0 (0: 1/sqrt(head_dim))");
  constexpr int64_t kMax = int64_t{1} << 30;
  if (s.capacity > kMax || s.heads * s.head_dim > kMax || s.batch > kMax)
    return bad("a dimension exceeds 2^30");
  return Status::OK();
}

#if !STRATA_WITH_CUDA
Result<std::unique_ptr<Backend>> MakeCudaBackend(int) {
  return Unavailable("strata was built without CUDA (nvcc was not found at configure time)");
}
#endif

}  // namespace strata::kernels
