# SPDX-License-Identifier: Apache-2.0
"""strata for Python: the tier store and the CPU Adam of libstrata.so.

Standard library only (ctypes); numpy is optional: every buffer argument
takes any object with the buffer protocol (bytearray, memoryview,
array.array, numpy arrays) or a CPU torch tensor (used in place, by its
data_ptr; strata.torch is the PyTorch optimizer).

    import strata
    with strata.TierStore(host_budget_bytes=256 << 20, nvme_dirs=["/mnt/nvme"]) as store:
        t = store.create("w", "f32", (1024,), home="nvme")
        t.write(array.array("f", [0.0] * 1024))
        t.prefetch("host").wait()
    adam = strata.CpuAdam(threads=4)
    adam.step(master, m, v, grad, step=1, lr=1e-3)

Errors raise strata.Error subclasses (strata.NotFoundError,
strata.OutOfMemoryError, ...) carrying code, errno, path, offset, tier.
The library is loaded from $STRATA_LIB, next to this package, or the build
tree (build/lib/libstrata.so), on first use.
"""

from ._buffers import DTYPES
from .adam import CpuAdam, GradStats, StepResult, clip_coefficient, global_grad_norm, grad_multiplier
from .errors import (AlreadyExistsError, CancelledError, CudaError, DataLossError, Error, FailedPreconditionError,
                     InternalError, InvalidArgumentError, IoError, NotFoundError, OutOfMemoryError, UnavailableError)
from .store import TIERS, Tensor, Ticket, TierStore, View

__all__ = [
    "DTYPES", "TIERS", "TierStore", "Tensor", "Ticket", "View", "CpuAdam", "GradStats", "StepResult",
    "global_grad_norm", "clip_coefficient", "grad_multiplier", "Error", "InvalidArgumentError", "NotFoundError",
    "AlreadyExistsError", "OutOfMemoryError", "IoError", "DataLossError", "FailedPreconditionError",
    "UnavailableError", "CudaError", "CancelledError", "InternalError", "library_path",
]


def library_path():
    """The path libstrata.so was loaded from (loading it if needed)."""
    from . import _lib
    return _lib.lib()._name
