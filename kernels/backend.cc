#include "kernels/backend.h"

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

#if !STRATA_WITH_CUDA
Result<std::unique_ptr<Backend>> MakeCudaBackend(int) {
  return Unavailable("strata was built without CUDA (nvcc was not found at configure time)");
}
#endif

}  // namespace strata::kernels
