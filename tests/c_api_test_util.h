// SPDX-License-Identifier: Apache-2.0
// Helpers for the C API tests (tests/tiers/c_api_test.cc,
// tests/optim/c_api_test.cc): an owner for strata_error and assertions that
// print the error's whole text.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "tiers/c_api.h"

namespace strata::testing {

// Owns the strata_error a call may return; out() frees the previous one.
struct CError {
  strata_error* e = nullptr;
  CError() = default;
  CError(const CError&) = delete;
  CError& operator=(const CError&) = delete;
  ~CError() { strata_error_free(e); }
  strata_error** out() {
    strata_error_free(e);
    e = nullptr;
    return &e;
  }
  std::string message() const { return e ? e->message : ""; }
  std::string text() const { return e ? e->text : ""; }
};

inline ::testing::AssertionResult COk(strata_status s, const CError& err) {
  if (s == STRATA_OK) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << strata_status_name(s) << ": "
                                       << (err.e ? err.e->text : "(no error details)");
}

// The call failed with `code`, the error carries the same code, and its
// message contains `substr`.
inline ::testing::AssertionResult CFails(strata_status s, const CError& err, strata_status code,
                                         const std::string& substr) {
  if (s != code)
    return ::testing::AssertionFailure() << "status " << strata_status_name(s) << ", expected "
                                         << strata_status_name(code) << " (" << err.text() << ")";
  if (err.e == nullptr) return ::testing::AssertionFailure() << "no strata_error was returned";
  if (err.e->code != code)
    return ::testing::AssertionFailure() << "error code " << strata_status_name(err.e->code) << " != status";
  if (std::string(err.e->message).find(substr) == std::string::npos)
    return ::testing::AssertionFailure() << "message '" << err.e->message << "' lacks '" << substr << "'";
  return ::testing::AssertionSuccess();
}

}  // namespace strata::testing
