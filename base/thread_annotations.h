// Clang thread-safety annotations (no-ops elsewhere), as leveldb uses them:
// fields shared between threads say which mutex guards them.
#pragma once

#if defined(__clang__)
#define STRATA_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define STRATA_THREAD_ANNOTATION_(x)
#endif

#define GUARDED_BY(x) STRATA_THREAD_ANNOTATION_(guarded_by(x))
#define PT_GUARDED_BY(x) STRATA_THREAD_ANNOTATION_(pt_guarded_by(x))
#define REQUIRES(...) STRATA_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) STRATA_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
