# SPDX-License-Identifier: Apache-2.0
"""ParamState: one parameter's Adam state in the tier store.

The state of a parameter of n elements is one store tensor "p<index>" of
raw bytes laid out as
    master      (n) fp32         at 0
    exp_avg     (n) state dtype  at 4n
    exp_avg_sq  (n) state dtype  at 4n + size(state dtype) n
so that one prefetch, one acquire and one eviction move all of it. Its
host copy is seen as torch tensors over the store's own memory
(torch.frombuffer over the view): nothing is copied.

Thread-safety: a ParamState is used by one thread at a time (the step's
update, or the optimizer's caller between updates); `ready` and
`cuda_event` are how the two hand it over (offload_adam.py).
"""

import contextlib
import threading

import torch

STATE_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
PARAM_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def dtype_size(dtype):
    """Bytes per element of a floating-point dtype."""
    return torch.finfo(dtype).bits // 8


class ParamState:
    """The store tensor of one parameter (created at its first update or
    load) and its step count. `ready` is clear while an update of the
    parameter is in flight; `cuda_event`, for a CUDA parameter, is recorded
    after its last upload."""

    def __init__(self, index, param, state_dtype):
        if param.dtype not in PARAM_DTYPES:
            raise TypeError("OffloadAdam: parameter %d is %s; it takes float32, float16 and bfloat16 parameters"
                            % (index, param.dtype))
        if param.device.type not in ("cpu", "cuda"):
            raise TypeError("OffloadAdam: parameter %d is on %s; it takes CPU and CUDA parameters"
                            % (index, param.device))
        if not param.is_contiguous():
            raise ValueError("OffloadAdam: parameter %d (shape %s) is not contiguous" % (index, tuple(param.shape)))
        self.index = index
        self.name = "p%d" % index
        self.numel = param.numel()
        self.shape = tuple(param.shape)
        self.device = param.device
        self.state_dtype = STATE_DTYPES[state_dtype]
        self._state_size = dtype_size(self.state_dtype)
        self.nbytes = self.numel * (4 + 2 * self._state_size)
        self.tensor = None  # the store tensor once created
        self.step = 0
        self.ready = threading.Event()
        self.ready.set()
        self.cuda_event = None

    @property
    def created(self):
        return self.tensor is not None

    def create(self, store, home):
        self.tensor = store.create(self.name, "u8", (self.nbytes,), home=home)

    def remove(self):
        if self.tensor is not None:
            self.tensor.remove()
            self.tensor = None
        self.step = 0

    @contextlib.contextmanager
    def host(self, access):
        """(master, exp_avg, exp_avg_sq), flat torch tensors over the host
        copy, pinned for the block ("read", "read_write", or
        "write_discard": every byte must then be written). Released dirty
        for the write modes unless the block raises; the tensors must not
        be used after it."""
        with self.tensor.acquire("host", access) as view:
            raw = torch.frombuffer(view.memory, dtype=torch.uint8)
            n, s = self.numel, self._state_size
            yield (raw[:4 * n].view(torch.float32),
                   raw[4 * n:(4 + s) * n].view(self.state_dtype),
                   raw[(4 + s) * n:].view(self.state_dtype))

    def write(self, master, exp_avg, exp_avg_sq, home_is_nvme):
        """Sets the whole state from tensors of numel elements (any device
        and float dtype; None for a moment: zeros); with an NVMe home the
        host copy is then written back and dropped."""
        with self.host("write_discard") as views:
            for view, src in zip(views, (master, exp_avg, exp_avg_sq)):
                if src is None:
                    view.zero_()
                else:
                    view.copy_(src.detach().reshape(-1))
        if home_is_nvme:
            self.tensor.evict("host").wait()

    def read(self, home_is_nvme):
        """New CPU tensors of the parameter's shape: master (fp32),
        exp_avg and exp_avg_sq (state dtype)."""
        if home_is_nvme:
            self.tensor.prefetch("host").wait()
        with self.host("read") as views:
            out = tuple(v.clone().view(self.shape) for v in views)
        if home_is_nvme:
            self.tensor.evict("host").wait()
        return out
