# SPDX-License-Identifier: Apache-2.0
"""Loading libstrata.so and the ctypes mirror of its C API.

The structs below mirror tiers/c_api.h and optim/c_api.h field for field; at
load every one is checked against the size the library reports
(strata_tiers_struct_size / strata_optim_struct_size), so a header change
that this file missed fails at import instead of corrupting memory.

Where the library is looked for, in order:
  1. $STRATA_LIB (the path of the file),
  2. libstrata.so next to this package (an installed copy),
  3. the build tree: <repo>/build/lib/libstrata.so.
"""

import ctypes
import os
import threading

API_VERSION = 1  # STRATA_C_API_VERSION this module mirrors

c_int, c_size_t, c_uint32, c_uint64, c_int64, c_double, c_void_p, c_char_p = (
    ctypes.c_int, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64,
    ctypes.c_double, ctypes.c_void_p, ctypes.c_char_p)

MAX_RANK = 8
NUM_TIERS = 3


class StrataError(ctypes.Structure):
    _fields_ = [
        ("code", c_int),
        ("message", c_char_p),
        ("text", c_char_p),
        ("sys_errno", c_int),
        ("path", c_char_p),
        ("has_offset", c_int),
        ("offset", c_uint64),
        ("tier", c_int),
        ("bytes_requested", c_uint64),
        ("bytes_available", c_uint64),
        ("retryable", c_int),
        ("data_lost", c_int),
    ]


class StoreOptions(ctypes.Structure):
    _fields_ = [
        ("gpu", c_int),
        ("gpu_stand_in", c_int),
        ("gpu_device", c_int),
        ("gpu_budget_bytes", c_uint64),
        ("gpu_slab_bytes", c_uint64),
        ("host_budget_bytes", c_uint64),
        ("host_slab_bytes", c_uint64),
        ("host_pin", c_int),
        ("nvme_dirs", ctypes.POINTER(c_char_p)),
        ("nvme_dir_count", c_size_t),
        ("nvme_capacity_bytes", c_uint64),
        ("nvme_block_size", c_uint32),
        ("nvme_queue_depth", c_uint32),
        ("nvme_rings", c_int),
        ("nvme_buffered_fallback", c_int),
        ("nvme_checksum", c_int),
        ("nvme_checksum_block", c_uint32),
        ("staging_chunk_bytes", c_uint64),
        ("staging_buffers", c_int),
        ("staging_per_move", c_int),
        ("worker_threads", c_int),
        ("eviction", c_int),
    ]


class CopyInfo(ctypes.Structure):
    _fields_ = [("allocated", c_int), ("valid", c_int), ("dirty", c_int), ("readers", c_int), ("writer", c_int)]


class TensorInfo(ctypes.Structure):
    _fields_ = [
        ("dtype", c_int),
        ("rank", c_int),
        ("dims", c_int64 * MAX_RANK),
        ("numel", c_uint64),
        ("bytes", c_uint64),
        ("home", c_int),
        ("written", c_int),
        ("copies", CopyInfo * NUM_TIERS),
    ]


class TensorView(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("bytes", c_uint64), ("dtype", c_int), ("tier", c_int), ("device_memory", c_int)]


class LinkStats(ctypes.Structure):
    _fields_ = [("bytes", c_uint64), ("transfers", c_uint64), ("seconds", c_double)]


class TierStats(ctypes.Structure):
    _fields_ = [
        ("present", c_int),
        ("budget", c_uint64),
        ("used", c_uint64),
        ("peak_used", c_uint64),
        ("reserved", c_uint64),
        ("hits", c_uint64),
        ("misses", c_uint64),
        ("evictions", c_uint64),
        ("writebacks", c_uint64),
        ("writeback_bytes", c_uint64),
        ("resident", c_uint64),
    ]


class StoreStats(ctypes.Structure):
    _fields_ = [
        ("tiers", TierStats * NUM_TIERS),
        ("gpu_to_host", LinkStats),
        ("host_to_gpu", LinkStats),
        ("host_to_nvme", LinkStats),
        ("nvme_to_host", LinkStats),
        ("tensors", c_uint64),
        ("acquires", c_uint64),
        ("releases", c_uint64),
        ("prefetches", c_uint64),
        ("evicts", c_uint64),
        ("flushes", c_uint64),
        ("queue_depth", c_uint64),
        ("max_queue_depth", c_uint64),
        ("failures", c_uint64),
        ("nvme_bytes_read", c_uint64),
        ("nvme_bytes_written", c_uint64),
    ]


class AdamOptions(ctypes.Structure):
    _fields_ = [
        ("threads", c_int),
        ("isa", c_int),
        ("tile_elems", c_size_t),
        ("pin_threads", c_int),
        ("numa_node", c_int),
        ("prefetch_bytes", c_size_t),
        ("prefetch_hint", c_int),
    ]


class AdamInfo(ctypes.Structure):
    _fields_ = [("isa", c_int), ("threads", c_int), ("tile_elems", c_size_t), ("prefetch_bytes", c_size_t),
                ("pinned", c_int)]


class AdamHyper(ctypes.Structure):
    _fields_ = [
        ("lr", c_double),
        ("beta1", c_double),
        ("beta2", c_double),
        ("eps", c_double),
        ("weight_decay", c_double),
        ("decay_mode", c_int),
        ("bias_correction", c_int),
        ("step", c_int64),
    ]


class AdamShard(ctypes.Structure):
    _fields_ = [
        ("n", c_size_t),
        ("master", c_void_p),
        ("exp_avg", c_void_p),
        ("exp_avg_sq", c_void_p),
        ("state_dtype", c_int),
        ("grad", c_void_p),
        ("grad_dtype", c_int),
        ("param_out", c_void_p),
        ("param_out_dtype", c_int),
    ]


class AdamResult(ctypes.Structure):
    _fields_ = [("nonfinite_grads", c_uint64), ("skipped", c_int)]


class GradStats(ctypes.Structure):
    _fields_ = [("sum_sq", c_double), ("nonfinite", c_uint64), ("count", c_uint64)]


_TIERS_STRUCTS = {
    "strata_error": StrataError, "strata_store_options": StoreOptions, "strata_copy_info": CopyInfo,
    "strata_tensor_info": TensorInfo, "strata_tensor_view": TensorView, "strata_link_stats": LinkStats,
    "strata_tier_stats": TierStats, "strata_store_stats": StoreStats,
}
_OPTIM_STRUCTS = {
    "strata_adam_options": AdamOptions, "strata_adam_info": AdamInfo, "strata_adam_hyper": AdamHyper,
    "strata_adam_shard": AdamShard, "strata_adam_result": AdamResult, "strata_grad_stats": GradStats,
}

P = ctypes.POINTER
ERR = P(P(StrataError))
STORE = c_void_p
TICKET = c_void_p
ADAM = c_void_p

# name: (restype, argtypes). Every function that can fail returns the status
# (int) and takes the error out-parameter last.
_SIGNATURES = {
    "strata_c_api_version": (c_int, []),
    "strata_tiers_struct_size": (c_size_t, [c_char_p]),
    "strata_optim_struct_size": (c_size_t, [c_char_p]),
    "strata_status_name": (c_char_p, [c_int]),
    "strata_tier_name": (c_char_p, [c_int]),
    "strata_error_free": (None, [P(StrataError)]),
    "strata_dtype_size": (c_size_t, [c_int]),
    "strata_dtype_name": (c_char_p, [c_int]),
    "strata_store_options_init": (None, [P(StoreOptions)]),
    "strata_store_open": (c_int, [P(StoreOptions), P(STORE), ERR]),
    "strata_store_close": (None, [STORE]),
    "strata_store_gpu_is_device": (c_int, [STORE, P(c_int), ERR]),
    "strata_tensor_create": (c_int, [STORE, c_char_p, c_int, P(c_int64), c_int, c_int, P(c_uint64), ERR]),
    "strata_tensor_find": (c_int, [STORE, c_char_p, P(c_uint64), ERR]),
    "strata_tensor_remove": (c_int, [STORE, c_uint64, ERR]),
    "strata_tensor_info_get": (c_int, [STORE, c_uint64, P(TensorInfo), ERR]),
    "strata_tensor_name": (c_int, [STORE, c_uint64, c_char_p, c_size_t, P(c_size_t), ERR]),
    "strata_tensor_write": (c_int, [STORE, c_uint64, c_void_p, c_uint64, ERR]),
    "strata_tensor_read": (c_int, [STORE, c_uint64, c_void_p, c_uint64, ERR]),
    "strata_tensor_prefetch": (c_int, [STORE, c_uint64, c_int, P(TICKET), ERR]),
    "strata_tensor_evict": (c_int, [STORE, c_uint64, c_int, P(TICKET), ERR]),
    "strata_tensor_flush": (c_int, [STORE, c_uint64, P(TICKET), ERR]),
    "strata_store_flush_all": (c_int, [STORE, ERR]),
    "strata_ticket_wait": (c_int, [TICKET, ERR]),
    "strata_ticket_poll": (c_int, [TICKET, P(c_int), ERR]),
    "strata_ticket_free": (None, [TICKET]),
    "strata_tensor_acquire": (c_int, [STORE, c_uint64, c_int, c_int, P(TensorView), ERR]),
    "strata_tensor_release": (c_int, [STORE, c_uint64, c_int, c_int, c_void_p, ERR]),
    "strata_tensor_set_next_use": (c_int, [STORE, c_uint64, c_uint64, ERR]),
    "strata_tensor_clear_next_use": (c_int, [STORE, c_uint64, ERR]),
    "strata_store_stats_get": (c_int, [STORE, P(StoreStats), ERR]),
    "strata_isa_name": (c_char_p, [c_int]),
    "strata_adam_options_init": (None, [P(AdamOptions)]),
    "strata_adam_create": (c_int, [P(AdamOptions), P(ADAM), ERR]),
    "strata_adam_destroy": (None, [ADAM]),
    "strata_adam_info_get": (c_int, [ADAM, P(AdamInfo), ERR]),
    "strata_adam_hyper_init": (None, [P(AdamHyper)]),
    "strata_adam_step": (c_int, [ADAM, P(AdamShard), P(AdamHyper), c_double, c_int, P(AdamResult), ERR]),
    "strata_adam_grad_stats": (c_int, [ADAM, c_void_p, c_int, c_size_t, P(GradStats), ERR]),
    "strata_grad_stats_merge": (c_int, [P(GradStats), P(GradStats), ERR]),
    "strata_global_grad_norm": (c_int, [P(GradStats), c_double, P(c_double), ERR]),
    "strata_clip_coefficient": (c_int, [c_double, c_double, P(c_double), ERR]),
    "strata_grad_multiplier": (c_int, [c_double, c_double, P(c_double), ERR]),
}

_lock = threading.Lock()
_lib = None


def candidates():
    """The paths tried, in order."""
    out = []
    env = os.environ.get("STRATA_LIB")
    if env:
        out.append(env)
    here = os.path.dirname(os.path.abspath(__file__))
    out.append(os.path.join(here, "libstrata.so"))
    out.append(os.path.join(here, os.pardir, os.pardir, "build", "lib", "libstrata.so"))
    return out


def _load():
    tried = []
    lib = None
    for path in candidates():
        if not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        lib = ctypes.CDLL(path)
        break
    if lib is None:
        raise OSError("libstrata.so not found; build the strata_c target or set STRATA_LIB. Tried: " +
                      "; ".join(tried))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    version = lib.strata_c_api_version()
    if version != API_VERSION:
        raise OSError("libstrata.so at %s has C API version %d, this package mirrors version %d"
                      % (lib._name, version, API_VERSION))
    for table, size_fn in ((_TIERS_STRUCTS, lib.strata_tiers_struct_size),
                           (_OPTIM_STRUCTS, lib.strata_optim_struct_size)):
        for cname, cls in table.items():
            want = size_fn(cname.encode())
            if want != ctypes.sizeof(cls):
                raise OSError("%s: libstrata.so says %d bytes, the ctypes mirror has %d (header changed?)"
                              % (cname, want, ctypes.sizeof(cls)))
    return lib


def lib():
    """The loaded library (loaded and checked on first use)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _load()
    return _lib
