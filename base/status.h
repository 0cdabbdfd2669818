// SPDX-License-Identifier: Apache-2.0
// Status and Result<T>: every error in strata is a value.
//
// A Status is OK or carries a code, a message and the facts a caller needs to
// decide what to do: for I/O the errno, the file and the offset; for memory
// the tier and the bytes asked for and available; whether retrying can help
// and whether data was lost. Foreign errors are converted at one boundary each
// (errno: ErrnoStatus below; CUDA: tiers/cuda_check.h).
//
// Status is cheap to copy (one shared pointer, null when OK) so that a
// background thread can store the first error and every later call can return
// it ("sticky" errors, see STYLE.md).
//
// Thread-safety: a Status is immutable once made; copies may be used from any
// thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "base/tier_kind.h"

namespace strata {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     // bad input from the caller: a config value, a shape, an id
  kNotFound,            // a named thing does not exist
  kAlreadyExists,       // a named thing exists already
  kOutOfMemory,         // a tier's budget or the device/host cannot give the bytes
  kIoError,             // a system call or an I/O completion failed
  kDataLoss,            // stored data is corrupt or truncated (checksum, short file)
  kFailedPrecondition,  // the call is not valid in the current state
  kUnavailable,         // the machine lacks the thing (no GPU, no io_uring, no O_DIRECT)
  kCudaError,           // the CUDA runtime or a CUDA library reported an error
  kCancelled,           // the operation was cancelled before it finished
  kInternal,            // a broken invariant inside strata (a bug)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // The details an error may carry. Unset fields are simply absent.
  struct Rep {
    StatusCode code = StatusCode::kInternal;
    std::string message;
    int sys_errno = 0;                    // errno / -cqe->res, 0 if none
    std::string path;                     // file or directory concerned
    std::optional<uint64_t> offset;       // byte offset in `path`
    std::optional<TierKind> tier;         // tier concerned (OutOfMemory)
    uint64_t bytes_requested = 0;         // OutOfMemory: what was asked for
    uint64_t bytes_available = 0;         // OutOfMemory: what was free
    bool retryable = false;               // trying again may succeed
    bool data_lost = false;               // some data could not be kept
  };

  Status() = default;  // OK
  explicit Status(Rep rep) : rep_(std::make_shared<const Rep>(std::move(rep))) {}

  static Status OK() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  std::string_view message() const { return rep_ ? std::string_view(rep_->message) : ""; }
  int sys_errno() const { return rep_ ? rep_->sys_errno : 0; }
  std::string_view path() const { return rep_ ? std::string_view(rep_->path) : ""; }
  std::optional<uint64_t> offset() const { return rep_ ? rep_->offset : std::nullopt; }
  std::optional<TierKind> tier() const { return rep_ ? rep_->tier : std::nullopt; }
  uint64_t bytes_requested() const { return rep_ ? rep_->bytes_requested : 0; }
  uint64_t bytes_available() const { return rep_ ? rep_->bytes_available : 0; }
  bool retryable() const { return rep_ && rep_->retryable; }
  bool data_lost() const { return rep_ && rep_->data_lost; }
  const Rep* rep() const { return rep_.get(); }

  // A copy whose message is "<context>: <message>"; all other fields kept.
  // OK stays OK.
  Status WithContext(std::string_view context) const;

  // "IoError: pread failed [errno 5 EIO, file /x/y, offset 4096]"
  std::string ToString() const;

 private:
  std::shared_ptr<const Rep> rep_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

// ---- Constructors for the common codes ------------------------------------

Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status AlreadyExists(std::string message);
Status FailedPrecondition(std::string message);
Status Unavailable(std::string message);
Status Cancelled(std::string message);
Status Internal(std::string message);
Status DataLoss(std::string message, std::string path = {},
                std::optional<uint64_t> offset = std::nullopt);
// `what` names the allocation ("layer 3 params"), `tier` where it failed.
Status OutOfMemory(TierKind tier, uint64_t requested, uint64_t available, std::string what);
// An I/O error from errno `err` (positive) during `op` on `path` at `offset`.
// EAGAIN/EINTR/EBUSY are marked retryable.
Status IoError(std::string op, int err, std::string path = {},
               std::optional<uint64_t> offset = std::nullopt);
// IoError for the current errno.
Status ErrnoStatus(std::string op, std::string path = {},
                   std::optional<uint64_t> offset = std::nullopt);

// ---- Result<T> --------------------------------------------------------------

template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> is meaningless");

 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) {
      Status::Rep rep;
      rep.message = "Result constructed from an OK Status";
      v_ = Status(std::move(rep));
    }
  }
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U&&, T> &&
                                                    !std::is_same_v<std::decay_t<U>, Status> &&
                                                    !std::is_same_v<std::decay_t<U>, T>>>
  Result(U&& value) : v_(T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T value_or(T other) const& { return ok() ? value() : std::move(other); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace strata

// ---- Propagation macros -----------------------------------------------------

#define STRATA_CONCAT_INNER_(a, b) a##b
#define STRATA_CONCAT_(a, b) STRATA_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::strata::Status strata_status_ = (expr);         \
    if (!strata_status_.ok()) return strata_status_;  \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` — declares/assigns x or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(STRATA_CONCAT_(strata_result_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
