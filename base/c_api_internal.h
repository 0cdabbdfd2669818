// SPDX-License-Identifier: Apache-2.0
// C++ side of the C API boundary (base/c_api.h: the shared part of tiers/c_api.h and optim/c_api.h): turning a
// Status into a strata_error, catching every exception, checking the enums a
// C caller passes as plain ints. Used only by the c_api.cc files, which are
// compiled into libstrata.so (not into the folder libraries).
//
// Thread-safety: pure functions.
#pragma once

#include <exception>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "base/c_api.h"
#include "base/dtype.h"
#include "base/status.h"
#include "base/tier_kind.h"

namespace strata::capi {

// `s`'s code; with an error and `error` non-null, *error gets a new
// strata_error holding its details. Never throws (if the error object itself
// cannot be allocated, only the code is returned).
strata_status Report(const Status& s, strata_error** error) noexcept;

// The Status for an exception caught at the boundary.
Status FromException(std::exception_ptr e) noexcept;

// Runs f() (returning a Status) and reports its result; exceptions become
// errors. Every exported function that can fail goes through this.
template <typename F>
strata_status Call(strata_error** error, F&& f) noexcept {
  try {
    return Report(f(), error);
  } catch (...) {
    return Report(FromException(std::current_exception()), error);
  }
}

// "<function>: <what> is NULL" as InvalidArgument.
Status NullArgument(const char* function, const char* what);

// Checked conversions of C enum values (plain ints from C or ctypes).
// InvalidArgument naming the parameter and the allowed values.
Result<DType> ToDType(int dtype, const char* what);
Result<TierKind> ToTier(int tier, const char* what);

}  // namespace strata::capi
