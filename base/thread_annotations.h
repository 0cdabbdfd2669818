// SPDX-License-Identifier: Apache-2.0
// Clang thread-safety annotations (no-ops elsewhere), as leveldb and abseil
// use them: fields shared between threads say which mutex guards them, and
// functions say which they need held. They are checked by clang's
// -Wthread-safety on code that locks base/mutex.h's Mutex (the CTest
// `thread_safety` compiles those files with it); with std::mutex they
// document.
#pragma once

#if defined(__clang__)
#define STRATA_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define STRATA_THREAD_ANNOTATION_(x)
#endif

#define CAPABILITY(x) STRATA_THREAD_ANNOTATION_(capability(x))
#define SCOPED_CAPABILITY STRATA_THREAD_ANNOTATION_(scoped_lockable)
#define GUARDED_BY(x) STRATA_THREAD_ANNOTATION_(guarded_by(x))
#define PT_GUARDED_BY(x) STRATA_THREAD_ANNOTATION_(pt_guarded_by(x))
#define REQUIRES(...) STRATA_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) STRATA_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) STRATA_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) STRATA_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) STRATA_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS STRATA_THREAD_ANNOTATION_(no_thread_safety_analysis)
