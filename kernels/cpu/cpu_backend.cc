// SPDX-License-Identifier: Apache-2.0
// CpuBackend: construction, memory, copies, and the op runner.
#include "kernels/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>

#include <oneapi/tbb/info.h>

#include "kernels/cpu/common.h"
#include "kernels/cpu/isa.h"

namespace strata::kernels::cpu {
namespace {

constexpr size_t kAlign = 64;
constexpr int64_t kCopyBlock = int64_t{1} << 20;  // bytes per parallel copy block

int ResolveThreads(int threads) {
  int all = tbb::info::default_concurrency();
  return threads > 0 ? threads : (all > 0 ? all : 1);
}

}  // namespace

CpuBackend::CpuBackend(int threads)
    : threads_(ResolveThreads(threads)), arena_(std::make_unique<tbb::task_arena>(threads_)) {}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const {
  return "cpu (" + std::to_string(threads_) + (threads_ == 1 ? " thread, " : " threads, ") +
         IsaName(ActiveIsa()) + ")";
}

Result<DeviceBuffer> CpuBackend::Allocate(size_t bytes) {
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded == 0) rounded = kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) return OutOfMemory(TierKind::kHost, bytes, 0, "cpu backend buffer");
  return DeviceBuffer(this, p, bytes);
}

void CpuBackend::Free(void* p, size_t) { std::free(p); }

Status CpuBackend::Memset(void* dst, int value, size_t bytes) {
  if (bytes == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(dst, "Memset", "dst"));
  return Run("Memset", [&] {
    ParallelBlocks(static_cast<int64_t>(bytes), kCopyBlock, [&](int64_t b, int64_t e) {
      std::memset(static_cast<char*>(dst) + b, value, static_cast<size_t>(e - b));
    });
    return Status::OK();
  });
}

namespace {
Status Copy(CpuBackend* be, const char* op, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::OK();
  RETURN_IF_ERROR(CheckPtr(dst, op, "dst"));
  RETURN_IF_ERROR(CheckPtr(src, op, "src"));
  if (dst == src) return Status::OK();
  return be->Run(op, [&] {
    ParallelBlocks(static_cast<int64_t>(bytes), kCopyBlock, [&](int64_t b, int64_t e) {
      std::memmove(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b,
                   static_cast<size_t>(e - b));
    });
    return Status::OK();
  });
}
}  // namespace

Status CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  return Copy(this, "CopyToDevice", dst, src, bytes);
}
Status CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  return Copy(this, "CopyToHost", dst, src, bytes);
}
Status CpuBackend::CopyDeviceToDevice(void* dst, const void* src, size_t bytes) {
  return Copy(this, "CopyDeviceToDevice", dst, src, bytes);
}

Status CpuBackend::RunImpl(const char* op, void* ctx, Status (*fn)(void*)) {
  Status result;
  try {
    arena_->execute([&] { result = fn(ctx); });
  } catch (const std::bad_alloc&) {
    return OutOfMemory(TierKind::kHost, 0, 0, std::string("cpu backend temporaries of ") + op);
  } catch (const std::exception& e) {
    return Internal(std::string(op) + ": unexpected exception: " + e.what());
  } catch (...) {
    return Internal(std::string(op) + ": unexpected exception");
  }
  return result;
}

}  // namespace strata::kernels::cpu

namespace strata::kernels {

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<cpu::CpuBackend>(threads);
}

}  // namespace strata::kernels
