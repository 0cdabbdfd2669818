// SPDX-License-Identifier: Apache-2.0
/* The C boundary's shared vocabulary (libstrata.so): the status codes, the
 * error object, the tier and dtype enums, and the export macro, used by the
 * tier store's C API (tiers/c_api.h) and the Adam's (optim/c_api.h).
 *
 * C99, no C++ types across the boundary.
 *
 * ERRORS: one convention for every function that can fail
 * - It returns a strata_status: STRATA_OK (0) or the error's code. The codes
 *   mirror strata::StatusCode one for one (same names, same values).
 * - Its last parameter is `strata_error** error`. NULL: the caller wants the
 *   code only. Otherwise, on failure *error receives a new strata_error with
 *   the details (message, errno, path, offset, tier, bytes, retryable,
 *   data lost) that the caller owns and frees with strata_error_free; on
 *   success *error is left untouched (so one error variable can serve a
 *   sequence of calls that stops at the first failure).
 * - Out-parameters are written only on success.
 * - Nothing aborts and no C++ exception leaves the library: an exception
 *   inside (std::bad_alloc, a broken invariant) becomes an error
 *   (STRATA_OUT_OF_MEMORY or STRATA_INTERNAL).
 * Why out-parameters and not a thread-local "last error": errors of
 * background moves are reported by tickets that may be waited on from any
 * thread; an error object that is a value, owned by whoever received it, is
 * the same on every thread and cannot be overwritten by a later call.
 * Functions that cannot fail (the *_init default fillers, frees, name
 * lookups) return void or their value and take no error parameter.
 *
 */
#ifndef STRATA_BASE_C_API_H_
#define STRATA_BASE_C_API_H_

#include <stddef.h>
#include <stdint.h>

/* Marks the exported symbols of libstrata.so (everything else is hidden). */
#if defined(STRATA_C_BUILDING)
#define STRATA_C_API __attribute__((visibility("default")))
#else
#define STRATA_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct's layout or a function's signature changes.
 * Compare with strata_c_api_version() when loading the library at run time. */
#define STRATA_C_API_VERSION 1
STRATA_C_API int strata_c_api_version(void);

/* ---- errors ------------------------------------------------------------ */

typedef enum strata_status {
  STRATA_OK = 0,
  STRATA_INVALID_ARGUMENT = 1,     /* bad input: a value, a shape, an id, a NULL pointer */
  STRATA_NOT_FOUND = 2,            /* a named thing (tensor, directory) does not exist */
  STRATA_ALREADY_EXISTS = 3,       /* a named thing exists already */
  STRATA_OUT_OF_MEMORY = 4,        /* a tier's budget or the system cannot give the bytes */
  STRATA_IO_ERROR = 5,             /* a system call or an I/O completion failed */
  STRATA_DATA_LOSS = 6,            /* stored data is corrupt or truncated */
  STRATA_FAILED_PRECONDITION = 7,  /* not valid in the current state (e.g. pinned) */
  STRATA_UNAVAILABLE = 8,          /* the machine lacks the thing (GPU, io_uring, O_DIRECT) */
  STRATA_CUDA_ERROR = 9,           /* the CUDA runtime reported an error */
  STRATA_CANCELLED = 10,           /* cancelled before it finished (store closed) */
  STRATA_INTERNAL = 11             /* a broken invariant inside strata (a bug) */
} strata_status;

/* "OK", "InvalidArgument", ... (strata::StatusCodeName); "Unknown" otherwise. */
STRATA_C_API const char* strata_status_name(int status);

typedef enum strata_tier {
  STRATA_TIER_GPU = 0,
  STRATA_TIER_HOST = 1,
  STRATA_TIER_NVME = 2
} strata_tier;
#define STRATA_NUM_TIERS 3

/* "gpu", "host", "nvme"; "?" otherwise. */
STRATA_C_API const char* strata_tier_name(int tier);

/* The details of one failure. Allocated by the library, read-only to the
 * caller, freed with strata_error_free. Fields beyond `code` and `message`
 * are zero / "" when the error does not carry them. */
typedef struct strata_error {
  strata_status code;
  const char* message;        /* what went wrong, naming the thing concerned */
  const char* text;           /* the whole error in one line, e.g.
                                 "IoError: pread failed [errno 5 EIO, file /x, offset 4096]" */
  int sys_errno;              /* errno (or -cqe->res), 0 if none */
  const char* path;           /* file or directory concerned, "" if none */
  int has_offset;             /* 1 when `offset` is set */
  uint64_t offset;            /* byte offset in `path` */
  int tier;                   /* strata_tier concerned (OUT_OF_MEMORY), -1 if none */
  uint64_t bytes_requested;   /* OUT_OF_MEMORY: what was asked for */
  uint64_t bytes_available;   /* OUT_OF_MEMORY: what was free */
  int retryable;              /* 1: trying again may succeed */
  int data_lost;              /* 1: some data could not be kept */
} strata_error;

/* Frees an error (NULL is fine). */
STRATA_C_API void strata_error_free(strata_error* error);

/* ---- element types ----------------------------------------------------- */

typedef enum strata_dtype {
  STRATA_F32 = 0,
  STRATA_F16 = 1,
  STRATA_BF16 = 2,
  STRATA_F64 = 3,
  STRATA_I64 = 4,
  STRATA_I32 = 5,
  STRATA_I16 = 6,
  STRATA_U16 = 7,
  STRATA_I8 = 8,
  STRATA_U8 = 9
} strata_dtype;

/* Bytes per element; 0 for a value that is not a strata_dtype. */
STRATA_C_API size_t strata_dtype_size(int dtype);
/* "f32", "f16", "bf16", ...; "?" otherwise. */
STRATA_C_API const char* strata_dtype_name(int dtype);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* STRATA_BASE_C_API_H_ */
