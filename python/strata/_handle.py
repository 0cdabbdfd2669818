# SPDX-License-Identifier: Apache-2.0
"""Handle: the base of the Python objects that own a C handle (TierStore,
Ticket, CpuAdam). It raises errors, which loads _lib, so it lives in its own
module: _lib imports nothing of the package, errors imports _lib, this
module imports errors, and nothing imports back up."""

from . import errors


class Handle:
    """An owned C handle (self._h) that close() frees; a context manager,
    closed at garbage collection too. Subclasses define _free(handle) and
    _what (for the error when used after close)."""

    _h = None
    _what = "handle"

    def _free(self, h):
        raise NotImplementedError

    def close(self):
        if self._h:
            h, self._h = self._h, None
            self._free(h)

    def _handle(self):
        if not self._h:
            raise errors.FailedPreconditionError("the %s is closed" % self._what)
        return self._h

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # at interpreter exit the module may be half torn down
            pass
