// SPDX-License-Identifier: Apache-2.0
/* The C API of the tier store (libstrata.so): tiers/tier_store.h for C, and
 * for anything that can call C (Python's ctypes: python/strata/).
 *
 * C99, no C++ types across the boundary. The semantics are those of the C++
 * TierStore, whose header (tiers/tier_store.h) is the reference for the
 * model (home tier, caches, dirty write-back), the access modes, tickets,
 * budgets and eviction; this header says only what is particular to C.
 *
 * ERRORS: the convention of base/c_api.h (a strata_status returned, a
 * strata_error** last).
 *
 * OWNERSHIP
 * - Objects returned through `T** out` (strata_store, strata_ticket,
 *   strata_error) belong to the caller, who frees each with its function.
 * - Tensors are named by id (strata_tensor_id, a number, 0 never a tensor):
 *   an id of a removed tensor, or one from another store, is NOT_FOUND, not
 *   undefined behaviour.
 * - Strings passed in are copied; caller memory passed to write/read is used
 *   only during the call. Views (strata_tensor_view.data) belong to the
 *   store and are valid until the matching strata_tensor_release and never
 *   after strata_store_close.
 *
 * THREAD-SAFETY
 * - A strata_store may be used from any number of threads at once (as the
 *   C++ TierStore), except strata_store_close, which must be the last call
 *   on the store (no call may be running or start later).
 * - A strata_ticket may be waited on or polled from any thread, also after
 *   the store is closed; strata_ticket_free must be its last use.
 * - A strata_error is immutable: read it from any thread; free it once.
 */
#ifndef STRATA_TIERS_C_API_H_
#define STRATA_TIERS_C_API_H_

#include <stddef.h>
#include <stdint.h>

#include "base/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* sizeof the named struct of this header as the library was compiled
 * ("strata_error", "strata_store_options", "strata_tensor_info",
 * "strata_tensor_view", "strata_store_stats", ...); 0 for another name.
 * For bindings that mirror the structs (python/strata checks every one). */
STRATA_C_API size_t strata_tiers_struct_size(const char* name);

/* ---- the store --------------------------------------------------------- */

typedef struct strata_store strata_store;
typedef uint64_t strata_tensor_id; /* 0 is never a tensor */

typedef enum strata_checksum {
  STRATA_CHECKSUM_NONE = 0,
  STRATA_CHECKSUM_CRC32C = 1,
  STRATA_CHECKSUM_XXH64 = 2
} strata_checksum;

typedef enum strata_eviction {
  STRATA_EVICT_LRU = 0,      /* least recently used copy first */
  STRATA_EVICT_NEXT_USE = 1  /* farthest hinted next use first (strata_tensor_set_next_use) */
} strata_eviction;

/* Options of strata_store_open. Start from strata_store_options_init (the
 * C++ defaults), then change what you need. Sizes are bytes. */
typedef struct strata_store_options {
  /* gpu tier (tiers/gpu_tier.h) */
  int gpu;                       /* 1: have a gpu tier; without a usable GPU it is the
                                    host-memory stand-in (views are then host pointers) */
  int gpu_stand_in;              /* 1: the stand-in even when a GPU is usable */
  int gpu_device;                /* CUDA device ordinal */
  uint64_t gpu_budget_bytes;     /* 0: the device's free memory (stand-in: 1 GiB) */
  uint64_t gpu_slab_bytes;       /* growth step; 0: the whole budget at once */
  /* host tier (tiers/host_tier.h) */
  uint64_t host_budget_bytes;    /* 0: half of the machine's memory */
  uint64_t host_slab_bytes;      /* growth step, <= 1 GiB; 0: the whole budget at once */
  int host_pin;                  /* 1: pinned (cudaHostRegister, else mlock); 0: pageable */
  /* nvme tier (tiers/nvme/nvme_tier.h): present when nvme_dir_count > 0 */
  const char* const* nvme_dirs;  /* directories that must exist; copied by open */
  size_t nvme_dir_count;
  uint64_t nvme_capacity_bytes;  /* over all files; 0: the disks' space */
  uint32_t nvme_block_size;      /* largest single I/O (DeepSpeed aio.block_size), multiple of 4096 */
  uint32_t nvme_queue_depth;     /* I/Os in flight per ring (aio.queue_depth) */
  int nvme_rings;                /* io_uring rings, one I/O thread each */
  int nvme_buffered_fallback;    /* 1: buffered I/O where O_DIRECT is refused (tmpfs) */
  strata_checksum nvme_checksum; /* verify every read against checksums kept in memory (default crc32c) */
  uint32_t nvme_checksum_block;
  /* moves */
  uint64_t staging_chunk_bytes;  /* multi-hop pieces, multiple of 4096 */
  int staging_buffers;           /* pinned staging buffers (from the host budget) */
  int staging_per_move;          /* staging buffers per gpu<->nvme move (>= 2) */
  int worker_threads;            /* threads running prefetch/evict/flush moves */
  strata_eviction eviction;
} strata_store_options;

/* Fills `options` with the defaults of strata::TierStoreOptions (no nvme
 * tier). NULL is ignored. */
STRATA_C_API void strata_store_options_init(strata_store_options* options);

/* Opens a store. The errors of TierStore::Open: INVALID_ARGUMENT for a bad
 * option (naming it), NOT_FOUND for a missing nvme directory, OUT_OF_MEMORY
 * when the staging does not fit the host budget, UNAVAILABLE when io_uring
 * or O_DIRECT cannot be used. *store is owned by the caller. */
STRATA_C_API strata_status strata_store_open(const strata_store_options* options, strata_store** store,
                                             strata_error** error);

/* Destroys the store: cancels queued moves (their tickets report
 * CANCELLED), waits for running ones, frees all tensor memory and removes
 * the nvme files. Dirty data not flushed is lost (call strata_store_flush_all
 * first to keep it). NULL is ignored. The last call on the store. */
STRATA_C_API void strata_store_close(strata_store* store);

/* Whether the gpu tier is real device memory: 1 a GPU, 0 the stand-in,
 * -1 no gpu tier. */
STRATA_C_API strata_status strata_store_gpu_is_device(const strata_store* store, int* is_device,
                                                      strata_error** error);

/* ---- tensors ----------------------------------------------------------- */

#define STRATA_MAX_RANK 8

/* Creates a tensor of `rank` dimensions `dims` (rank 0: a scalar; dims may
 * then be NULL) with its home copy on `home`. ALREADY_EXISTS for a taken
 * name; INVALID_ARGUMENT for an empty name, a bad dtype, tier or shape, or a
 * home tier the store does not have; OUT_OF_MEMORY (naming the tier) when
 * the home tier cannot hold it. */
STRATA_C_API strata_status strata_tensor_create(strata_store* store, const char* name, int dtype,
                                                const int64_t* dims, int rank, int home,
                                                strata_tensor_id* id, strata_error** error);
/* NOT_FOUND naming the tensor when there is none of that name. */
STRATA_C_API strata_status strata_tensor_find(const strata_store* store, const char* name,
                                              strata_tensor_id* id, strata_error** error);
/* Frees every copy. FAILED_PRECONDITION while a copy is acquired. */
STRATA_C_API strata_status strata_tensor_remove(strata_store* store, strata_tensor_id id,
                                                strata_error** error);

typedef struct strata_copy_info {
  int allocated, valid, dirty; /* 0/1: has a copy here; it holds the latest data; newer than home */
  int readers;                 /* kRead pins */
  int writer;                  /* 0/1: a write pin */
} strata_copy_info;

typedef struct strata_tensor_info {
  strata_dtype dtype;
  int rank;
  int64_t dims[STRATA_MAX_RANK];
  uint64_t numel;
  uint64_t bytes;
  strata_tier home;
  int written;                 /* 0/1: written at least once */
  strata_copy_info copies[STRATA_NUM_TIERS]; /* indexed by strata_tier */
} strata_tensor_info;

STRATA_C_API strata_status strata_tensor_info_get(const strata_store* store, strata_tensor_id id,
                                                  strata_tensor_info* info, strata_error** error);

/* The tensor's name into buf (NUL-terminated, truncated to buf_size - 1);
 * *name_len (may be NULL) receives the full length without the NUL. */
STRATA_C_API strata_status strata_tensor_name(const strata_store* store, strata_tensor_id id, char* buf,
                                              size_t buf_size, size_t* name_len, strata_error** error);

/* ---- whole-tensor copies from and to caller memory --------------------- */

/* `bytes` must be the tensor's size (INVALID_ARGUMENT naming both
 * otherwise). write leaves the data dirty on the fastest tier it passes
 * through (host for host/nvme homes); read loads it there. Both block until
 * done. Caller memory may be pageable. */
STRATA_C_API strata_status strata_tensor_write(strata_store* store, strata_tensor_id id, const void* src,
                                               uint64_t bytes, strata_error** error);
STRATA_C_API strata_status strata_tensor_read(strata_store* store, strata_tensor_id id, void* dst,
                                              uint64_t bytes, strata_error** error);

/* ---- asynchronous moves ------------------------------------------------ */

typedef struct strata_ticket strata_ticket;

/* Each returns at once with a ticket (owned by the caller; free it with
 * strata_ticket_free, waited on or not: freeing does not cancel the move).
 * prefetch makes the copy on `tier` valid; evict drops it (never the home),
 * writing it back first when it holds the only valid data
 * (FAILED_PRECONDITION when acquired); flush writes the latest contents
 * home. A failed move is reported by its ticket, or, if the ticket never
 * reports it, by the next call on that tensor. */
STRATA_C_API strata_status strata_tensor_prefetch(strata_store* store, strata_tensor_id id, int tier,
                                                  strata_ticket** ticket, strata_error** error);
STRATA_C_API strata_status strata_tensor_evict(strata_store* store, strata_tensor_id id, int tier,
                                               strata_ticket** ticket, strata_error** error);
STRATA_C_API strata_status strata_tensor_flush(strata_store* store, strata_tensor_id id,
                                               strata_ticket** ticket, strata_error** error);
/* Flushes every tensor and waits; the first error. */
STRATA_C_API strata_status strata_store_flush_all(strata_store* store, strata_error** error);

/* Blocks until the move has finished; its status (reporting a failure here
 * counts as reporting it). */
STRATA_C_API strata_status strata_ticket_wait(const strata_ticket* ticket, strata_error** error);
/* *done = 1 when finished OK, 0 while pending; the move's error when it failed. */
STRATA_C_API strata_status strata_ticket_poll(const strata_ticket* ticket, int* done, strata_error** error);
/* NULL is ignored. */
STRATA_C_API void strata_ticket_free(strata_ticket* ticket);

/* ---- views ------------------------------------------------------------- */

typedef enum strata_access {
  STRATA_ACCESS_READ = 0,          /* shared with other readers */
  STRATA_ACCESS_READ_WRITE = 1,    /* exclusive */
  STRATA_ACCESS_WRITE_DISCARD = 2  /* exclusive, not loaded: overwrite all of it */
} strata_access;

typedef struct strata_tensor_view {
  void* data;            /* a device pointer for a real gpu tier, else a host pointer */
  uint64_t bytes;        /* numel * dtype size */
  strata_dtype dtype;
  strata_tier tier;
  int device_memory;     /* 1: `data` is GPU device memory */
} strata_tensor_view;

/* Pins the copy on `tier` (gpu or host; nvme copies have no address:
 * INVALID_ARGUMENT), loading it first unless WRITE_DISCARD, and returns its
 * view. A conflicting acquire fails at once with FAILED_PRECONDITION naming
 * the holder. Every successful acquire needs one release. */
STRATA_C_API strata_status strata_tensor_acquire(strata_store* store, strata_tensor_id id, int tier,
                                                 int access, strata_tensor_view* view, strata_error** error);
/* `dirty` 1: the view was written. `stream`: a cudaStream_t whose queued work
 * uses the view, or NULL when the caller's work on it is done. */
STRATA_C_API strata_status strata_tensor_release(strata_store* store, strata_tensor_id id, int tier, int dirty,
                                                 void* stream, strata_error** error);

/* ---- eviction hints (with STRATA_EVICT_NEXT_USE) ------------------------ */

STRATA_C_API strata_status strata_tensor_set_next_use(strata_store* store, strata_tensor_id id, uint64_t tick,
                                                      strata_error** error);
STRATA_C_API strata_status strata_tensor_clear_next_use(strata_store* store, strata_tensor_id id,
                                                        strata_error** error);

/* ---- statistics -------------------------------------------------------- */

typedef struct strata_link_stats {
  uint64_t bytes;
  uint64_t transfers;
  double seconds; /* summed wall time of the transfers (they may overlap) */
} strata_link_stats;

typedef struct strata_tier_stats {
  int present;               /* 0/1: the store has this tier */
  uint64_t budget;           /* the tier's byte budget (nvme: the capacity, 0 = the disks') */
  uint64_t used;             /* bytes in live blocks now */
  uint64_t peak_used;        /* (nvme: 0, not tracked) */
  uint64_t reserved;         /* bytes taken from the system (nvme: 0) */
  uint64_t hits, misses;     /* acquire/prefetch found a valid copy / had to load it */
  uint64_t evictions;        /* copies dropped */
  uint64_t writebacks, writeback_bytes;
  uint64_t resident;         /* allocated copies now (homes included) */
} strata_tier_stats;

typedef struct strata_store_stats {
  strata_tier_stats tiers[STRATA_NUM_TIERS]; /* indexed by strata_tier */
  /* bytes moved per link and direction; a gpu<->nvme move counts on both links */
  strata_link_stats gpu_to_host, host_to_gpu, host_to_nvme, nvme_to_host;
  uint64_t tensors;
  uint64_t acquires, releases, prefetches, evicts, flushes;
  uint64_t queue_depth, max_queue_depth; /* moves queued or running */
  uint64_t failures;                     /* background moves that failed */
  uint64_t nvme_bytes_read, nvme_bytes_written;
} strata_store_stats;

STRATA_C_API strata_status strata_store_stats_get(const strata_store* store, strata_store_stats* stats,
                                                  strata_error** error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_TIERS_C_API_H_ */
