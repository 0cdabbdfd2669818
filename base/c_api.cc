// SPDX-License-Identifier: Apache-2.0
// The C boundary's shared part (base/c_api.h, base/c_api_internal.h): the
// status codes, the error object, Status -> strata_error and the checked enum
// conversions. Compiled into libstrata.so only.
#include "base/c_api.h"

#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "base/c_api_internal.h"

// The C codes mirror StatusCode one for one.
#define STRATA_SAME_CODE(c, cc) \
  static_assert(static_cast<int>(c) == static_cast<int>(::strata::StatusCode::cc), #c " mirrors StatusCode::" #cc)
STRATA_SAME_CODE(STRATA_OK, kOk);
STRATA_SAME_CODE(STRATA_INVALID_ARGUMENT, kInvalidArgument);
STRATA_SAME_CODE(STRATA_NOT_FOUND, kNotFound);
STRATA_SAME_CODE(STRATA_ALREADY_EXISTS, kAlreadyExists);
STRATA_SAME_CODE(STRATA_OUT_OF_MEMORY, kOutOfMemory);
STRATA_SAME_CODE(STRATA_IO_ERROR, kIoError);
STRATA_SAME_CODE(STRATA_DATA_LOSS, kDataLoss);
STRATA_SAME_CODE(STRATA_FAILED_PRECONDITION, kFailedPrecondition);
STRATA_SAME_CODE(STRATA_UNAVAILABLE, kUnavailable);
STRATA_SAME_CODE(STRATA_CUDA_ERROR, kCudaError);
STRATA_SAME_CODE(STRATA_CANCELLED, kCancelled);
STRATA_SAME_CODE(STRATA_INTERNAL, kInternal);
#undef STRATA_SAME_CODE
static_assert(STRATA_F32 == static_cast<int>(strata::DType::kF32) && STRATA_F16 == static_cast<int>(strata::DType::kF16) &&
              STRATA_BF16 == static_cast<int>(strata::DType::kBF16) && STRATA_U8 == static_cast<int>(strata::DType::kU8));
static_assert(STRATA_TIER_GPU == static_cast<int>(strata::TierKind::kGpu) &&
              STRATA_TIER_HOST == static_cast<int>(strata::TierKind::kHost) &&
              STRATA_TIER_NVME == static_cast<int>(strata::TierKind::kNvme) && STRATA_NUM_TIERS == strata::kNumTiers);

namespace strata::capi {
namespace {

// A NUL-terminated copy owned by a strata_error (freed in strata_error_free).
const char* Dup(std::string_view s) {
  char* p = new char[s.size() + 1];
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  return p;
}

}  // namespace

strata_status Report(const Status& s, strata_error** error) noexcept {
  const auto code = static_cast<strata_status>(s.code());
  if (s.ok() || error == nullptr) return code;
  try {
    auto e = std::make_unique<strata_error>();
    *e = strata_error{};
    e->code = code;
    e->tier = -1;
    std::unique_ptr<const char[]> message(Dup(s.message())), text(Dup(s.ToString())), path(Dup(s.path()));
    e->sys_errno = s.sys_errno();
    if (s.offset()) {
      e->has_offset = 1;
      e->offset = *s.offset();
    }
    if (s.tier()) e->tier = static_cast<int>(*s.tier());
    e->bytes_requested = s.bytes_requested();
    e->bytes_available = s.bytes_available();
    e->retryable = s.retryable() ? 1 : 0;
    e->data_lost = s.data_lost() ? 1 : 0;
    e->message = message.release();
    e->text = text.release();
    e->path = path.release();
    *error = e.release();
  } catch (...) {
    // No memory for the details: the code alone still tells the caller.
  }
  return code;
}

Status FromException(std::exception_ptr ep) noexcept {
  try {
    std::rethrow_exception(ep);
  } catch (const std::bad_alloc&) {
    Status::Rep rep;
    rep.code = StatusCode::kOutOfMemory;
    rep.message = "out of host memory (std::bad_alloc inside strata)";
    return Status(std::move(rep));
  } catch (const std::exception& e) {
    return Internal(std::string("C++ exception inside strata: ") + e.what());
  } catch (...) {
    return Internal("unknown C++ exception inside strata");
  }
}

Status NullArgument(const char* function, const char* what) {
  return InvalidArgument(std::string(function) + ": " + what + " is NULL");
}

Result<DType> ToDType(int dtype, const char* what) {
  if (dtype < STRATA_F32 || dtype > STRATA_U8)
    return InvalidArgument(std::string(what) + " " + std::to_string(dtype) +
                           " is not a strata_dtype (0..9: f32 f16 bf16 f64 i64 i32 i16 u16 i8 u8)");
  return static_cast<DType>(dtype);
}

Result<TierKind> ToTier(int tier, const char* what) {
  if (tier < STRATA_TIER_GPU || tier > STRATA_TIER_NVME)
    return InvalidArgument(std::string(what) + " " + std::to_string(tier) +
                           " is not a strata_tier (0 gpu, 1 host, 2 nvme)");
  return static_cast<TierKind>(tier);
}

}  // namespace strata::capi

extern "C" {

int strata_c_api_version(void) { return STRATA_C_API_VERSION; }

const char* strata_status_name(int status) {
  if (status < STRATA_OK || status > STRATA_INTERNAL) return "Unknown";
  return strata::StatusCodeName(static_cast<strata::StatusCode>(status)).data();  // literals: NUL-terminated
}

const char* strata_tier_name(int tier) {
  if (tier < STRATA_TIER_GPU || tier > STRATA_TIER_NVME) return "?";
  return strata::TierName(static_cast<strata::TierKind>(tier)).data();
}

void strata_error_free(strata_error* error) {
  if (error == nullptr) return;
  delete[] error->message;
  delete[] error->text;
  delete[] error->path;
  delete error;
}

size_t strata_dtype_size(int dtype) {
  if (dtype < STRATA_F32 || dtype > STRATA_U8) return 0;
  return strata::DTypeSize(static_cast<strata::DType>(dtype));
}

const char* strata_dtype_name(int dtype) {
  if (dtype < STRATA_F32 || dtype > STRATA_U8) return "?";
  return strata::DTypeName(static_cast<strata::DType>(dtype)).data();
}

}  // extern "C"
