# SPDX-License-Identifier: Apache-2.0
"""CpuAdam: strata's SIMD CPU Adam/AdamW over caller buffers (optim/c_api.h).

    adam = strata.CpuAdam(threads=4)
    r = adam.step(master, m, v, grad, step=1, lr=1e-3, weight_decay=0.01)

The arrays are any C-contiguous buffers (array.array("f"), numpy arrays,
bytearrays, ...) updated in place: master fp32, exp_avg/exp_avg_sq fp32 (or
bf16 with state_dtype="bf16"), grad f32/f16/bf16, optional param_out
f16/bf16/f32. Dtypes are taken from the buffer format when it says one
("f" f32, "e" f16); bf16 data (stored as uint16) needs the dtype spelled out.
The update is bitwise the C++ CpuAdam::Step (DeepSpeed's fma sequence).

Thread-safety: step and grad_stats may run concurrently from several threads
on different shards (ctypes releases the GIL during the call).
"""

import ctypes
import collections

from . import _buffers, _handle, _lib, errors
from .errors import call

ISAS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3, "avx512bf16": 4}
ISA_NAMES = {v: k for k, v in ISAS.items()}
_HINTS = {"l1": 0, "l2": 1}
_DECAY = {"decoupled": 0, "adamw": 0, "l2": 1, "adam": 1}

StepResult = collections.namedtuple("StepResult", "nonfinite_grads skipped")


class GradStats(collections.namedtuple("GradStats", "sum_sq nonfinite count")):
    """What a gradient scan found (sum of squares in fp64, non-finite values, values)."""

    def _c(self):
        return _lib.GradStats(self.sum_sq, self.nonfinite, self.count)

    def merge(self, other):
        """self + other, through the library (merge shards in a fixed order)."""
        total = self._c()
        call(_lib.lib().strata_grad_stats_merge, ctypes.byref(total), ctypes.byref(other._c()))
        return GradStats(total.sum_sq, total.nonfinite, total.count)

    @property
    def overflow(self):
        return self.nonfinite != 0


def global_grad_norm(stats, loss_scale=1.0):
    """sqrt(sum_sq) / loss_scale; inf when any value was non-finite."""
    out = ctypes.c_double()
    call(_lib.lib().strata_global_grad_norm, ctypes.byref(stats._c()), float(loss_scale), ctypes.byref(out))
    return out.value


def clip_coefficient(norm, max_norm):
    """min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (no clipping)."""
    out = ctypes.c_double()
    call(_lib.lib().strata_clip_coefficient, float(norm), float(max_norm), ctypes.byref(out))
    return out.value


def grad_multiplier(loss_scale, clip_coef):
    """clip_coef / loss_scale: the grad_scale of CpuAdam.step."""
    out = ctypes.c_double()
    call(_lib.lib().strata_grad_multiplier, float(loss_scale), float(clip_coef), ctypes.byref(out))
    return out.value


def _dtype(buf, given, what, allowed, raw_default=None):
    """The dtype of a buffer: `given` when set, else the one its format says;
    raw bytes (bytearray, bytes: format "B") only where `raw_default` is set."""
    if given is not None:
        name = _buffers.DTYPE_NAMES.get(_buffers.dtype_code(given), str(given))
    else:
        name = buf.format_dtype
        if name in (None, "u8", "i8") and raw_default is not None:
            name = raw_default
        elif name not in allowed:
            raise errors.InvalidArgumentError(
                "%s: %s does not say one of %s; pass %s_dtype" % (what, buf.described, ", ".join(allowed), what))
    if name not in allowed:
        raise errors.InvalidArgumentError("%s dtype %s is not one of %s" % (what, name, ", ".join(allowed)))
    return name


class CpuAdam(_handle.Handle):
    """The CPU Adam engine (a thread pool; it holds no optimizer state).
    threads 0: all hardware threads. isa: "auto", "scalar", "avx2",
    "avx512", "avx512bf16". None for an option: the C default. close() (or
    a with block) frees it."""

    _what = "CpuAdam"

    def __init__(self, threads=0, isa="auto", tile_elems=None, pin_threads=False, numa_node=-1,
                 prefetch_bytes=None, prefetch_hint=None):
        lib = _lib.lib()
        o = _lib.AdamOptions()
        lib.strata_adam_options_init(ctypes.byref(o))
        o.threads = threads
        if isa not in ISAS:
            raise errors.InvalidArgumentError("isa %r is not one of %s" % (isa, ", ".join(ISAS)))
        o.isa = ISAS[isa]
        if tile_elems is not None:
            o.tile_elems = tile_elems
        o.pin_threads = int(bool(pin_threads))
        o.numa_node = numa_node
        if prefetch_bytes is not None:
            o.prefetch_bytes = prefetch_bytes
        if prefetch_hint is not None:
            if prefetch_hint not in _HINTS:
                raise errors.InvalidArgumentError("prefetch_hint %r is not l1 or l2" % (prefetch_hint,))
            o.prefetch_hint = _HINTS[prefetch_hint]
        h = ctypes.c_void_p()
        call(lib.strata_adam_create, ctypes.byref(o), ctypes.byref(h))
        self._h = h
        info = _lib.AdamInfo()
        call(lib.strata_adam_info_get, self._h, ctypes.byref(info))
        self.isa = ISA_NAMES.get(info.isa, info.isa)
        self.threads = info.threads
        self.tile_elems = info.tile_elems

    def _free(self, h):
        _lib.lib().strata_adam_destroy(h)

    def step(self, master, exp_avg, exp_avg_sq, grad, *, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
             weight_decay=0.0, decay="decoupled", bias_correction=True, grad_scale=1.0,
             skip_on_nonfinite=False, grad_dtype=None, state_dtype=None, param_out=None, param_out_dtype=None):
        """One Adam step over a shard, in place; returns StepResult(nonfinite_grads, skipped).
        decay: "decoupled" (AdamW) or "l2" (Adam). grad_scale: 1/loss_scale x clip coefficient."""
        if decay not in _DECAY:
            raise errors.InvalidArgumentError("decay %r is not decoupled or l2" % (decay,))
        bufs = []
        try:
            mb = _buffers.Buffer(master, True, "master")
            bufs.append(mb)
            _dtype(mb, None, "master", ("f32",), raw_default="f32")
            n = mb.nbytes // 4
            ab = _buffers.Buffer(exp_avg, True, "exp_avg")
            vb = _buffers.Buffer(exp_avg_sq, True, "exp_avg_sq")
            gb = _buffers.Buffer(grad, False, "grad")
            bufs += [ab, vb, gb]
            sdt = _dtype(ab, state_dtype, "state", ("f32", "bf16"))
            gdt = _dtype(gb, grad_dtype, "grad", ("f32", "f16", "bf16"))
            checks = [("master", mb, "f32"), ("exp_avg", ab, sdt), ("exp_avg_sq", vb, sdt), ("grad", gb, gdt)]
            shard = _lib.AdamShard()
            if param_out is not None:
                ob = _buffers.Buffer(param_out, True, "param_out")
                bufs.append(ob)
                odt = _dtype(ob, param_out_dtype, "param_out", ("f16", "bf16", "f32"))
                checks.append(("param_out", ob, odt))
                shard.param_out = ob.address
                shard.param_out_dtype = _buffers.DTYPES[odt]
            for what, b, dt in checks:
                if b.nbytes != n * _buffers.DTYPE_SIZES[dt]:
                    raise errors.InvalidArgumentError("%s holds %d bytes, %d %s values need %d"
                                                      % (what, b.nbytes, n, dt, n * _buffers.DTYPE_SIZES[dt]))
            shard.n = n
            shard.master = mb.address
            shard.exp_avg = ab.address
            shard.exp_avg_sq = vb.address
            shard.state_dtype = _buffers.DTYPES[sdt]
            shard.grad = gb.address
            shard.grad_dtype = _buffers.DTYPES[gdt]
            h = _lib.AdamHyper()
            _lib.lib().strata_adam_hyper_init(ctypes.byref(h))
            h.lr = lr
            h.beta1, h.beta2 = betas
            h.eps = eps
            h.weight_decay = weight_decay
            h.decay_mode = _DECAY[decay]
            h.bias_correction = int(bool(bias_correction))
            h.step = step
            r = _lib.AdamResult()
            call(_lib.lib().strata_adam_step, self._handle(), ctypes.byref(shard), ctypes.byref(h),
                 float(grad_scale), int(bool(skip_on_nonfinite)), ctypes.byref(r))
            return StepResult(r.nonfinite_grads, bool(r.skipped))
        finally:
            for b in bufs:
                b.release()

    def grad_stats(self, grad, dtype=None):
        """GradStats of a gradient buffer (f32, f16 or bf16). Writes nothing."""
        gb = _buffers.Buffer(grad, False, "grad")
        try:
            dt = _dtype(gb, dtype, "grad", ("f32", "f16", "bf16"))
            n = gb.nbytes // _buffers.DTYPE_SIZES[dt]
            s = _lib.GradStats()
            call(_lib.lib().strata_adam_grad_stats, self._handle(), gb.address, _buffers.DTYPES[dt], n,
                 ctypes.byref(s))
            return GradStats(s.sum_sq, s.nonfinite, s.count)
        finally:
            gb.release()
