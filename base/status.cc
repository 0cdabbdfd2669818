// SPDX-License-Identifier: Apache-2.0
#include "base/status.h"

#include <cerrno>
#include <cstring>

#include "base/bytes.h"

namespace strata {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kOutOfMemory: return "OutOfMemory";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kCudaError: return "CudaError";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}


Status Status::WithContext(std::string_view context) const {
  if (ok() || context.empty()) return *this;
  Rep rep = *rep_;
  rep.message = std::string(context) + ": " + rep.message;
  return Status(std::move(rep));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(rep_->code));
  s += ": ";
  s += rep_->message;
  std::string facts;
  auto add = [&facts](const std::string& f) {
    if (!facts.empty()) facts += ", ";
    facts += f;
  };
  if (rep_->sys_errno != 0) {
    const char* name = strerrorname_np(rep_->sys_errno);
    add("errno " + std::to_string(rep_->sys_errno) + " " + (name ? name : "?") + " (" +
        std::strerror(rep_->sys_errno) + ")");
  }
  if (!rep_->path.empty()) add("file " + rep_->path);
  if (rep_->offset) add("offset " + std::to_string(*rep_->offset));
  if (rep_->tier) add("tier " + std::string(TierName(*rep_->tier)));
  if (rep_->code == StatusCode::kOutOfMemory) {
    add("requested " + FormatBytes(rep_->bytes_requested));
    add("available " + FormatBytes(rep_->bytes_available));
  }
  if (rep_->data_lost) add("data lost");
  if (!facts.empty()) s += " [" + facts + "]";
  return s;
}

std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

namespace {
Status Make(StatusCode code, std::string message) {
  Status::Rep rep;
  rep.code = code;
  rep.message = std::move(message);
  return Status(std::move(rep));
}
}  // namespace

Status InvalidArgument(std::string m) { return Make(StatusCode::kInvalidArgument, std::move(m)); }
Status NotFound(std::string m) { return Make(StatusCode::kNotFound, std::move(m)); }
Status AlreadyExists(std::string m) { return Make(StatusCode::kAlreadyExists, std::move(m)); }
Status FailedPrecondition(std::string m) {
  return Make(StatusCode::kFailedPrecondition, std::move(m));
}
Status Unavailable(std::string m) { return Make(StatusCode::kUnavailable, std::move(m)); }
Status Cancelled(std::string m) { return Make(StatusCode::kCancelled, std::move(m)); }
Status Internal(std::string m) { return Make(StatusCode::kInternal, std::move(m)); }

Status DataLoss(std::string message, std::string path, std::optional<uint64_t> offset) {
  Status::Rep rep;
  rep.code = StatusCode::kDataLoss;
  rep.message = std::move(message);
  rep.path = std::move(path);
  rep.offset = offset;
  rep.data_lost = true;
  return Status(std::move(rep));
}

Status OutOfMemory(TierKind tier, uint64_t requested, uint64_t available, std::string what) {
  Status::Rep rep;
  rep.code = StatusCode::kOutOfMemory;
  rep.message = std::move(what);
  rep.tier = tier;
  rep.bytes_requested = requested;
  rep.bytes_available = available;
  return Status(std::move(rep));
}

Status IoError(std::string op, int err, std::string path, std::optional<uint64_t> offset) {
  Status::Rep rep;
  rep.code = StatusCode::kIoError;
  rep.message = std::move(op);
  rep.sys_errno = err;
  rep.path = std::move(path);
  rep.offset = offset;
  rep.retryable = (err == EAGAIN || err == EINTR || err == EBUSY);
  return Status(std::move(rep));
}

Status ErrnoStatus(std::string op, std::string path, std::optional<uint64_t> offset) {
  return IoError(std::move(op), errno, std::move(path), offset);
}

}  // namespace strata
