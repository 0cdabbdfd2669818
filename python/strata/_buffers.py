# SPDX-License-Identifier: Apache-2.0
"""Caller memory for the C calls: anything with the buffer protocol
(bytes, bytearray, memoryview, array.array, numpy arrays, ...), C-contiguous,
and CPU torch tensors (by their storage's address: data_ptr(); torch is not
imported here)."""

import ctypes

from . import errors

# strata_dtype values (tiers/c_api.h) by name, and the buffer formats that
# imply one (bf16 has no buffer format: pass dtype="bf16" explicitly).
DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "f64": 3, "i64": 4, "i32": 5, "i16": 6, "u16": 7, "i8": 8, "u8": 9}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
DTYPE_SIZES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i64": 8, "i32": 4, "i16": 2, "u16": 2, "i8": 1, "u8": 1}
_ALIASES = {"float32": "f32", "float": "f32", "float16": "f16", "half": "f16", "fp16": "f16", "fp32": "f32",
            "bfloat16": "bf16", "float64": "f64", "double": "f64", "int64": "i64", "int32": "i32",
            "int16": "i16", "uint16": "u16", "int8": "i8", "uint8": "u8"}
_FLOAT_FORMATS = {"f": "f32", "e": "f16", "d": "f64"}
_INT_FORMATS = {("b", 1): "i8", ("B", 1): "u8", ("h", 2): "i16", ("H", 2): "u16"}
_TORCH_DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float64": "f64",
                 "torch.int64": "i64", "torch.int32": "i32", "torch.int16": "i16", "torch.int8": "i8",
                 "torch.uint8": "u8"}


def is_tensor(obj):
    """True for a torch.Tensor (duck-typed: strata does not import torch)."""
    return all(hasattr(obj, a) for a in ("data_ptr", "element_size", "is_contiguous", "device"))


def dtype_code(dtype):
    """The strata_dtype value of a name ("f32", "float16", ...) or a value."""
    if isinstance(dtype, int):
        return dtype  # the library checks the range and names the bad value
    name = str(getattr(dtype, "name", dtype)).lower()  # numpy dtypes have .name
    name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise errors.InvalidArgumentError("dtype %r is not one of %s" % (dtype, ", ".join(DTYPES)))
    return DTYPES[name]


def format_dtype(mv):
    """The dtype name a memoryview's format implies, or None."""
    fmt = mv.format.lstrip("@=<>!")
    if fmt in _FLOAT_FORMATS:
        return _FLOAT_FORMATS[fmt]
    if (fmt, mv.itemsize) in _INT_FORMATS:
        return _INT_FORMATS[(fmt, mv.itemsize)]
    if fmt in ("i", "l", "q") and mv.itemsize in (4, 8):
        return "i32" if mv.itemsize == 4 else "i64"
    return None


class Buffer:
    """The address and size of caller memory for the duration of a call.

    Writable buffers are used in place. A read-only one is used in place
    when it is a bytes object, otherwise copied (only where the call reads
    it). Keep the Buffer alive until the call returns."""

    def __init__(self, obj, writable, what="buffer"):
        if is_tensor(obj):
            self._init_tensor(obj, what)
            return
        try:
            mv = memoryview(obj)
        except TypeError:
            raise TypeError("%s: %s does not support the buffer protocol" % (what, type(obj).__name__)) from None
        if not mv.c_contiguous:
            raise errors.InvalidArgumentError("%s is not C-contiguous" % what)
        self.nbytes = mv.nbytes
        self.format_dtype = format_dtype(mv)
        self.described = "its buffer format (%s)" % mv.format
        self._keep = None
        if self.nbytes == 0:
            self.address = None
            return
        if mv.readonly:
            if writable:
                raise TypeError("%s is read-only (%s); the call writes into it" % (what, type(obj).__name__))
            if isinstance(obj, bytes):
                self._keep = ctypes.c_char_p(obj)  # points at the bytes object's own storage
                self.address = ctypes.cast(self._keep, ctypes.c_void_p).value
                return
            mv = memoryview(bytearray(mv.cast("B")))
        self._keep = (ctypes.c_char * self.nbytes).from_buffer(mv.cast("B"))
        self.address = ctypes.addressof(self._keep)

    def _init_tensor(self, t, what):
        """A CPU tensor is used in place: its storage, from data_ptr(). The
        caller keeps it alive and does not resize it during the call."""
        if t.device.type != "cpu":
            raise errors.InvalidArgumentError("%s is a tensor on %s; strata reads and writes host memory "
                                              "(give it a CPU tensor)" % (what, t.device))
        if not t.is_contiguous():
            raise errors.InvalidArgumentError("%s is a non-contiguous tensor (shape %s, stride %s)"
                                              % (what, tuple(t.shape), t.stride()))
        self.nbytes = t.numel() * t.element_size()
        self.format_dtype = _TORCH_DTYPES.get(str(t.dtype))
        self.described = "its dtype (%s)" % t.dtype
        self._keep = t
        self.address = t.data_ptr() if self.nbytes else None

    def release(self):
        """Drops the hold on the caller's object (a bytearray can resize again)."""
        self._keep = None
