# SPDX-License-Identifier: Apache-2.0
"""CudaStaging: the pinned host buffers and side streams through which the
update of CUDA parameters moves, one per device.

A CUDA parameter is updated in chunks of at most `buffer_bytes` of its
gradient: the gradient chunk is copied down into a pinned buffer on the
`d2h` stream, the CPU Adam steps the chunk writing the new half (or fp32)
values into a second pinned buffer, and that is copied up into the
parameter on the `h2d` stream. `buffers` pairs of buffers let that many
chunks be in flight: copies of the next chunks run while the CPU works.
Pinned memory is 2 x buffers x buffer_bytes, allocated once.

Thread-safety: used by one update at a time (offload_adam.py runs one).
"""

import torch

from ._state import dtype_size


class CudaStaging:
    def __init__(self, device, buffers, buffer_bytes):
        self.device = device
        self.buffers = buffers
        self.buffer_bytes = buffer_bytes
        with torch.cuda.device(device):
            self.d2h = torch.cuda.Stream(device)
            self.h2d = torch.cuda.Stream(device)
        self._grads = [torch.empty(buffer_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(buffers)]
        self._outs = [torch.empty(buffer_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(buffers)]
        self._out_done = [None] * buffers  # the event after the last upload from each out buffer
        self._next = 0

    def chunk_elems(self, grad_dtype, param_dtype):
        """Elements per chunk for these dtypes."""
        return self.buffer_bytes // max(dtype_size(grad_dtype), dtype_size(param_dtype))

    def take(self):
        """The next buffer pair, round robin. Its previous chunk is at least
        `buffers` chunks back, so its gradient has been consumed; its upload
        may still run (wait_out_free before writing the out buffer)."""
        k = self._next
        self._next = (k + 1) % self.buffers
        return k

    def grad_buffer(self, k, n, dtype):
        return self._grads[k][:n * dtype_size(dtype)].view(dtype)

    def out_buffer(self, k, n, dtype):
        return self._outs[k][:n * dtype_size(dtype)].view(dtype)

    def wait_out_free(self, k):
        """Blocks until the last upload from out buffer k has finished."""
        if self._out_done[k] is not None:
            self._out_done[k].synchronize()
            self._out_done[k] = None

    def uploaded(self, k, event):
        self._out_done[k] = event
