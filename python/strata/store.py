# SPDX-License-Identifier: Apache-2.0
"""TierStore: named tensors over GPU, pinned host memory and NVMe.

A thin layer over the C API (tiers/c_api.h); the model, the access modes and
the budgets are those of tiers/tier_store.h.

    with strata.TierStore(host_budget_bytes=64 << 20, nvme_dirs=["/mnt/nvme"]) as store:
        t = store.create("layer0.master", "f32", (1024, 1024), home="nvme")
        t.write(array)                      # any buffer, e.g. a numpy array
        t.evict("host").wait()              # written home to the NVMe file
        t.prefetch("host").wait()           # and back
        t.read_into(out)

Thread-safety: a TierStore may be used from several threads at once (the C
store is thread-safe); close() must be the last call. Tickets may be waited
on from any thread, also after the store is closed.
"""

import ctypes

from . import _buffers, _handle, _lib, errors
from .errors import call

TIERS = {"gpu": 0, "host": 1, "nvme": 2}
TIER_NAMES = {v: k for k, v in TIERS.items()}
ACCESS = {"read": 0, "read_write": 1, "write_discard": 2}
_CHECKSUMS = {"none": 0, "crc32c": 1, "xxh64": 2, "xxhash64": 2}
_EVICTIONS = {"lru": 0, "next_use": 1}


def _tier(tier):
    if isinstance(tier, int):
        return tier  # the library checks the range
    if tier not in TIERS:
        raise errors.InvalidArgumentError("tier %r is not one of gpu, host, nvme" % (tier,))
    return TIERS[tier]


class Ticket(_handle.Handle):
    """The handle of one prefetch/evict/flush. wait() blocks and raises the
    move's error; poll() is True when done, False while pending. The C
    ticket is freed by free() or when the object goes away."""

    _what = "ticket"

    def __init__(self, handle):
        self._h = handle

    def wait(self):
        call(_lib.lib().strata_ticket_wait, self._handle())

    def poll(self):
        done = ctypes.c_int(0)
        call(_lib.lib().strata_ticket_poll, self._handle(), ctypes.byref(done))
        return bool(done.value)

    def free(self):
        """Frees the C ticket (the move goes on). Waiting afterwards raises."""
        self.close()

    def _free(self, h):
        _lib.lib().strata_ticket_free(h)


class View:
    """A pinned copy of a tensor on one tier (TierStore.acquire). `address`
    is a device pointer when `device_memory`, else a host pointer; `memory`
    is a writable memoryview of host copies. Use it as a context manager or
    call release(); dirty defaults to True for the write modes."""

    def __init__(self, tensor, tier, access, cview):
        self.tensor = tensor
        self.tier = TIER_NAMES.get(cview.tier, cview.tier)
        self.access = access
        self.address = cview.data or 0
        self.nbytes = cview.bytes
        self.dtype = _buffers.DTYPE_NAMES.get(cview.dtype, cview.dtype)
        self.device_memory = bool(cview.device_memory)
        self._tier = tier
        self._released = False

    @property
    def memory(self):
        if self.device_memory:
            raise errors.InvalidArgumentError("a gpu view holds a device pointer; it has no host memoryview")
        if self._released:
            raise errors.FailedPreconditionError("the view was released")
        if self.nbytes == 0:
            return memoryview(bytearray())
        return memoryview((ctypes.c_char * self.nbytes).from_address(self.address)).cast("B")

    def release(self, dirty=None, stream=None):
        if self._released:
            return
        if dirty is None:
            dirty = self.access != "read"
        store = self.tensor.store
        call(_lib.lib().strata_tensor_release, store._handle(), self.tensor.id, self._tier, int(bool(dirty)),
             stream)
        self._released = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # On an exception inside the block the data may be half written:
        # release it clean so the store keeps the previous contents valid.
        self.release(dirty=None if exc_type is None else False)
        return False


class Tensor:
    """One named tensor of a store (by id: a removed tensor's calls raise
    NotFoundError)."""

    def __init__(self, store, tensor_id, name):
        self.store = store
        self.id = tensor_id
        self.name = name

    def __repr__(self):
        return "Tensor(%r, id=%d)" % (self.name, self.id)

    def info(self):
        """dtype, shape, nbytes, home, written and the per-tier copies."""
        i = _lib.TensorInfo()
        call(_lib.lib().strata_tensor_info_get, self.store._handle(), self.id, ctypes.byref(i))
        copies = {}
        for k, name in TIER_NAMES.items():
            c = i.copies[k]
            copies[name] = {"allocated": bool(c.allocated), "valid": bool(c.valid), "dirty": bool(c.dirty),
                            "readers": c.readers, "writer": bool(c.writer)}
        return {"dtype": _buffers.DTYPE_NAMES.get(i.dtype, i.dtype), "shape": tuple(i.dims[:i.rank]),
                "numel": i.numel, "nbytes": i.bytes, "home": TIER_NAMES.get(i.home, i.home),
                "written": bool(i.written), "copies": copies}

    @property
    def nbytes(self):
        return self.info()["nbytes"]

    def write(self, buf):
        """Copies the whole tensor from `buf` (its size must match)."""
        b = _buffers.Buffer(buf, writable=False, what="write source")
        try:
            call(_lib.lib().strata_tensor_write, self.store._handle(), self.id, b.address, b.nbytes)
        finally:
            b.release()

    def read_into(self, buf):
        """Copies the whole tensor into the writable `buf` (its size must match)."""
        b = _buffers.Buffer(buf, writable=True, what="read destination")
        try:
            call(_lib.lib().strata_tensor_read, self.store._handle(), self.id, b.address, b.nbytes)
        finally:
            b.release()
        return buf

    def read(self):
        """The whole tensor as a new bytearray."""
        return self.read_into(bytearray(self.nbytes))

    def prefetch(self, tier):
        return self._move(_lib.lib().strata_tensor_prefetch, _tier(tier))

    def evict(self, tier):
        return self._move(_lib.lib().strata_tensor_evict, _tier(tier))

    def flush(self):
        return self._move(_lib.lib().strata_tensor_flush)

    def _move(self, fn, *tier):
        h = ctypes.c_void_p()
        call(fn, self.store._handle(), self.id, *tier, ctypes.byref(h))
        return Ticket(h)

    def acquire(self, tier="host", access="read"):
        if access not in ACCESS:
            raise errors.InvalidArgumentError("access %r is not one of %s" % (access, ", ".join(ACCESS)))
        t = _tier(tier)
        v = _lib.TensorView()
        call(_lib.lib().strata_tensor_acquire, self.store._handle(), self.id, t, ACCESS[access], ctypes.byref(v))
        return View(self, t, access, v)

    def set_next_use(self, tick):
        call(_lib.lib().strata_tensor_set_next_use, self.store._handle(), self.id, tick)

    def clear_next_use(self):
        call(_lib.lib().strata_tensor_clear_next_use, self.store._handle(), self.id)

    def remove(self):
        call(_lib.lib().strata_tensor_remove, self.store._handle(), self.id)


class TierStore(_handle.Handle):
    """Opens a store. Keyword options are the fields of strata_store_options
    (tiers/c_api.h) with their C defaults: gpu, gpu_stand_in, gpu_device,
    gpu_budget_bytes, gpu_slab_bytes, host_budget_bytes, host_slab_bytes,
    host_pin, nvme_capacity_bytes, nvme_block_size, nvme_queue_depth,
    nvme_rings, nvme_buffered_fallback, nvme_checksum ("none", "crc32c",
    "xxh64"), nvme_checksum_block, staging_chunk_bytes, staging_buffers,
    staging_per_move, worker_threads, eviction ("lru", "next_use"); plus
    nvme_dirs, a list of directories (an nvme tier when not empty).
    Booleans may be given as bool."""

    _what = "TierStore"

    def __init__(self, nvme_dirs=(), **options):
        lib = _lib.lib()
        o = _lib.StoreOptions()
        lib.strata_store_options_init(ctypes.byref(o))
        fields = {name for name, _ in _lib.StoreOptions._fields_} - {"nvme_dirs", "nvme_dir_count"}
        for key, value in options.items():
            if key not in fields:
                raise TypeError("TierStore: unknown option %r (known: %s)" % (key, ", ".join(sorted(fields))))
            if key == "nvme_checksum" and isinstance(value, str):
                value = _CHECKSUMS.get(value, value)
            if key == "eviction" and isinstance(value, str):
                value = _EVICTIONS.get(value, value)
            if isinstance(value, str):
                raise errors.InvalidArgumentError("TierStore option %s=%r is not a known name" % (key, value))
            setattr(o, key, int(value) if isinstance(value, bool) else value)
        if isinstance(nvme_dirs, (str, bytes)):
            nvme_dirs = [nvme_dirs]
        encoded = [d.encode() if isinstance(d, str) else bytes(d) for d in nvme_dirs]
        dirs = (ctypes.c_char_p * max(1, len(encoded)))(*encoded)
        if encoded:
            o.nvme_dirs = ctypes.cast(dirs, ctypes.POINTER(ctypes.c_char_p))
            o.nvme_dir_count = len(encoded)
        h = ctypes.c_void_p()
        call(lib.strata_store_open, ctypes.byref(o), ctypes.byref(h))
        self._h = h

    def close(self):
        """Cancels queued moves, waits for running ones, frees everything.
        Unflushed dirty data is lost (flush_all first to keep it)."""
        super().close()

    def _free(self, h):
        _lib.lib().strata_store_close(h)

    def create(self, name, dtype, shape, home="host"):
        """A new tensor (shape: a sequence of ints, () for a scalar)."""
        dims = [int(d) for d in shape]
        arr = (ctypes.c_int64 * max(1, len(dims)))(*dims)
        tid = ctypes.c_uint64()
        call(_lib.lib().strata_tensor_create, self._handle(), name.encode(), _buffers.dtype_code(dtype), arr,
             len(dims), _tier(home), ctypes.byref(tid))
        return Tensor(self, tid.value, name)

    def find(self, name):
        tid = ctypes.c_uint64()
        call(_lib.lib().strata_tensor_find, self._handle(), name.encode(), ctypes.byref(tid))
        return Tensor(self, tid.value, name)

    def flush_all(self):
        call(_lib.lib().strata_store_flush_all, self._handle())

    @property
    def gpu_is_device(self):
        """True: real GPU memory; False: the host stand-in; None: no gpu tier."""
        v = ctypes.c_int()
        call(_lib.lib().strata_store_gpu_is_device, self._handle(), ctypes.byref(v))
        return None if v.value < 0 else bool(v.value)

    def stats(self):
        """Per tier (budget, used, peak_used, ...; absent tiers left out) and
        per link (bytes, transfers, seconds), plus the store's counters."""
        s = _lib.StoreStats()
        call(_lib.lib().strata_store_stats_get, self._handle(), ctypes.byref(s))

        def fields(struct):
            return {name: getattr(struct, name) for name, _ in struct._fields_}

        out = {"tiers": {}}
        for k, name in TIER_NAMES.items():
            t = fields(s.tiers[k])
            if t.pop("present"):
                out["tiers"][name] = t
        out["links"] = {name: fields(getattr(s, name))
                        for name in ("gpu_to_host", "host_to_gpu", "host_to_nvme", "nvme_to_host")}
        for name, _ in _lib.StoreStats._fields_:
            if name not in ("tiers",) and name not in out["links"]:
                out[name] = getattr(s, name)
        return out
