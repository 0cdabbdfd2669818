# SPDX-License-Identifier: Apache-2.0
"""strata.Error and one subclass per status code (tiers/c_api.h, strata_status).

Every failure of the library raises the subclass of its code, carrying the
details of the C strata_error: code, message, errno, path, offset (None when
absent), tier (a name, or None), bytes_requested, bytes_available, retryable,
data_lost. str(e) is the library's one-line description.
"""

import ctypes

from . import _lib

OK = 0
INVALID_ARGUMENT = 1
NOT_FOUND = 2
ALREADY_EXISTS = 3
OUT_OF_MEMORY = 4
IO_ERROR = 5
DATA_LOSS = 6
FAILED_PRECONDITION = 7
UNAVAILABLE = 8
CUDA_ERROR = 9
CANCELLED = 10
INTERNAL = 11

_TIER_NAMES = ("gpu", "host", "nvme")


class Error(Exception):
    """A strata error. `code` is the strata_status value, `code_name` its name."""

    code = INTERNAL
    code_name = "Internal"

    def __init__(self, message, *, text=None, errno=0, path="", offset=None, tier=None,
                 bytes_requested=0, bytes_available=0, retryable=False, data_lost=False):
        super().__init__(text if text is not None else "%s: %s" % (self.code_name, message))
        self.message = message
        self.errno = errno
        self.path = path
        self.offset = offset
        self.tier = tier
        self.bytes_requested = bytes_requested
        self.bytes_available = bytes_available
        self.retryable = retryable
        self.data_lost = data_lost


class InvalidArgumentError(Error, ValueError):
    code, code_name = INVALID_ARGUMENT, "InvalidArgument"


class NotFoundError(Error):
    code, code_name = NOT_FOUND, "NotFound"


class AlreadyExistsError(Error):
    code, code_name = ALREADY_EXISTS, "AlreadyExists"


class OutOfMemoryError(Error):
    code, code_name = OUT_OF_MEMORY, "OutOfMemory"


class IoError(Error):
    code, code_name = IO_ERROR, "IoError"


class DataLossError(Error):
    code, code_name = DATA_LOSS, "DataLoss"


class FailedPreconditionError(Error):
    code, code_name = FAILED_PRECONDITION, "FailedPrecondition"


class UnavailableError(Error):
    code, code_name = UNAVAILABLE, "Unavailable"


class CudaError(Error):
    code, code_name = CUDA_ERROR, "CudaError"


class CancelledError(Error):
    code, code_name = CANCELLED, "Cancelled"


class InternalError(Error):
    code, code_name = INTERNAL, "Internal"


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgumentError, NotFoundError, AlreadyExistsError, OutOfMemoryError, IoError, DataLossError,
    FailedPreconditionError, UnavailableError, CudaError, CancelledError, InternalError)}


def _s(b):
    return b.decode("utf-8", "replace") if b else ""


def from_c(status, err_ptr):
    """The exception for a failed call: `status` its code, `err_ptr` the
    strata_error* it returned (may be NULL). Frees the C error."""
    cls = _BY_CODE.get(status, InternalError)
    if not err_ptr:
        return cls("%s (no details: the library could not allocate them)" % cls.code_name)
    try:
        e = err_ptr.contents
        return cls(_s(e.message), text=_s(e.text), errno=e.sys_errno, path=_s(e.path),
                   offset=e.offset if e.has_offset else None,
                   tier=_TIER_NAMES[e.tier] if 0 <= e.tier < len(_TIER_NAMES) else None,
                   bytes_requested=e.bytes_requested, bytes_available=e.bytes_available,
                   retryable=bool(e.retryable), data_lost=bool(e.data_lost))
    finally:
        _lib.lib().strata_error_free(err_ptr)


def call(fn, *args):
    """Calls a C API function that can fail, raising its error."""
    err = ctypes.POINTER(_lib.StrataError)()
    status = fn(*args, ctypes.byref(err))
    if status != OK:
        raise from_c(status, err)
