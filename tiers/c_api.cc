// SPDX-License-Identifier: Apache-2.0
// The tier store's C API (tiers/c_api.h): thin wrappers over TierStore that
// convert enums and structs, report Status values as strata_error and keep
// exceptions inside.
#include "tiers/c_api.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "base/c_api_internal.h"
#include "tiers/tier_store.h"

static_assert(STRATA_MAX_RANK == strata::Shape::kMaxRank);

struct strata_store {
  std::unique_ptr<strata::TierStore> store;
};

struct strata_ticket {
  strata::Ticket ticket;
};

using strata::InvalidArgument;
using strata::Status;
using strata::capi::Call;
using strata::capi::NullArgument;
using strata::capi::ToDType;
using strata::capi::ToTier;

namespace {

strata::TensorId Id(strata_tensor_id id) { return strata::TensorId{id}; }

Status NoStore(const char* function) { return NullArgument(function, "store"); }

// The ticket of a move into *out.
Status GiveTicket(strata::Result<strata::Ticket> r, strata_ticket** out) {
  if (!r.ok()) return r.status();
  *out = new strata_ticket{std::move(r).value()};
  return Status::OK();
}

}  // namespace

extern "C" {

size_t strata_tiers_struct_size(const char* name) {
  if (name == nullptr) return 0;
  const std::string_view n(name);
#define STRATA_SIZE(T) \
  if (n == #T) return sizeof(T)
  STRATA_SIZE(strata_error);
  STRATA_SIZE(strata_store_options);
  STRATA_SIZE(strata_copy_info);
  STRATA_SIZE(strata_tensor_info);
  STRATA_SIZE(strata_tensor_view);
  STRATA_SIZE(strata_link_stats);
  STRATA_SIZE(strata_tier_stats);
  STRATA_SIZE(strata_store_stats);
#undef STRATA_SIZE
  return 0;
}

void strata_store_options_init(strata_store_options* o) {
  if (o == nullptr) return;
  const strata::TierStoreOptions d;
  const strata::NvmeOptions n;
  *o = strata_store_options{};
  o->gpu = d.gpu ? 1 : 0;
  o->gpu_stand_in = d.gpu_tier.stand_in ? 1 : 0;
  o->gpu_device = d.gpu_tier.device;
  o->gpu_budget_bytes = d.gpu_tier.budget_bytes;
  o->gpu_slab_bytes = d.gpu_tier.slab_bytes;
  o->host_budget_bytes = d.host_tier.budget_bytes;
  o->host_slab_bytes = d.host_tier.slab_bytes;
  o->host_pin = d.host_tier.pin ? 1 : 0;
  o->nvme_dirs = nullptr;
  o->nvme_dir_count = 0;
  o->nvme_capacity_bytes = n.capacity_bytes;
  o->nvme_block_size = n.block_size;
  o->nvme_queue_depth = n.queue_depth;
  o->nvme_rings = n.rings;
  o->nvme_buffered_fallback = n.buffered_fallback ? 1 : 0;
  o->nvme_checksum = static_cast<strata_checksum>(n.checksum);
  o->nvme_checksum_block = n.checksum_block;
  o->staging_chunk_bytes = d.staging_chunk_bytes;
  o->staging_buffers = d.staging_buffers;
  o->staging_per_move = d.staging_per_move;
  o->worker_threads = d.worker_threads;
  o->eviction = static_cast<strata_eviction>(d.eviction);
}

strata_status strata_store_open(const strata_store_options* o, strata_store** store, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (o == nullptr) return NullArgument("strata_store_open", "options");
    if (store == nullptr) return NullArgument("strata_store_open", "store");
    strata::TierStoreOptions t;
    t.gpu = o->gpu != 0;
    t.gpu_tier.stand_in = o->gpu_stand_in != 0;
    t.gpu_tier.device = o->gpu_device;
    t.gpu_tier.budget_bytes = o->gpu_budget_bytes;
    t.gpu_tier.slab_bytes = o->gpu_slab_bytes;
    t.host_tier.budget_bytes = o->host_budget_bytes;
    t.host_tier.slab_bytes = o->host_slab_bytes;
    t.host_tier.pin = o->host_pin != 0;
    if (o->nvme_dir_count > 0) {
      if (o->nvme_dirs == nullptr) return NullArgument("strata_store_open", "options.nvme_dirs");
      strata::NvmeOptions n;
      for (size_t i = 0; i < o->nvme_dir_count; ++i) {
        if (o->nvme_dirs[i] == nullptr)
          return InvalidArgument("strata_store_open: options.nvme_dirs[" + std::to_string(i) + "] is NULL");
        n.dirs.emplace_back(o->nvme_dirs[i]);
      }
      n.capacity_bytes = o->nvme_capacity_bytes;
      n.block_size = o->nvme_block_size;
      n.queue_depth = o->nvme_queue_depth;
      n.rings = o->nvme_rings;
      n.buffered_fallback = o->nvme_buffered_fallback != 0;
      if (o->nvme_checksum < STRATA_CHECKSUM_NONE || o->nvme_checksum > STRATA_CHECKSUM_XXH64)
        return InvalidArgument("strata_store_open: options.nvme_checksum " + std::to_string(o->nvme_checksum) +
                               " is not a strata_checksum (0 none, 1 crc32c, 2 xxh64)");
      n.checksum = static_cast<strata::ChecksumKind>(o->nvme_checksum);
      n.checksum_block = o->nvme_checksum_block;
      t.nvme = std::move(n);
    }
    t.staging_chunk_bytes = o->staging_chunk_bytes;
    t.staging_buffers = o->staging_buffers;
    t.staging_per_move = o->staging_per_move;
    t.worker_threads = o->worker_threads;
    if (o->eviction != STRATA_EVICT_LRU && o->eviction != STRATA_EVICT_NEXT_USE)
      return InvalidArgument("strata_store_open: options.eviction " + std::to_string(o->eviction) +
                             " is not a strata_eviction (0 lru, 1 next use)");
    t.eviction = o->eviction == STRATA_EVICT_LRU ? strata::EvictionPolicy::kLru : strata::EvictionPolicy::kNextUse;
    auto r = strata::TierStore::Open(std::move(t));
    if (!r.ok()) return r.status();
    *store = new strata_store{std::move(r).value()};
    return Status::OK();
  });
}

void strata_store_close(strata_store* store) {
  delete store;  // ~TierStore does not throw
}

strata_status strata_store_gpu_is_device(const strata_store* store, int* is_device, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_store_gpu_is_device");
    if (is_device == nullptr) return NullArgument("strata_store_gpu_is_device", "is_device");
    const strata::GpuTier* gpu = store->store->gpu_tier();
    *is_device = gpu == nullptr ? -1 : (gpu->device_memory() ? 1 : 0);
    return Status::OK();
  });
}

strata_status strata_tensor_create(strata_store* store, const char* name, int dtype, const int64_t* dims, int rank,
                                   int home, strata_tensor_id* id, strata_error** error) {
  return Call(error, [&]() -> Status {
    const char* fn = "strata_tensor_create";
    if (store == nullptr) return NoStore(fn);
    if (name == nullptr) return NullArgument(fn, "name");
    if (id == nullptr) return NullArgument(fn, "id");
    if (rank < 0 || rank > STRATA_MAX_RANK)
      return InvalidArgument(std::string(fn) + ": rank " + std::to_string(rank) + " of tensor '" + name +
                             "' is outside 0.." + std::to_string(STRATA_MAX_RANK));
    if (rank > 0 && dims == nullptr) return NullArgument(fn, "dims");
    ASSIGN_OR_RETURN(const strata::DType dt, ToDType(dtype, "dtype"));
    ASSIGN_OR_RETURN(const strata::TierKind tier, ToTier(home, "home tier"));
    ASSIGN_OR_RETURN(const strata::Shape shape,
                     strata::Shape::Make(std::span<const int64_t>(dims, static_cast<size_t>(rank))));
    ASSIGN_OR_RETURN(const strata::TensorId t, store->store->Create(name, dt, shape, tier));
    *id = t.value;
    return Status::OK();
  });
}

strata_status strata_tensor_find(const strata_store* store, const char* name, strata_tensor_id* id,
                                 strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_find");
    if (name == nullptr) return NullArgument("strata_tensor_find", "name");
    if (id == nullptr) return NullArgument("strata_tensor_find", "id");
    ASSIGN_OR_RETURN(const strata::TensorId t, store->store->Find(name));
    *id = t.value;
    return Status::OK();
  });
}

strata_status strata_tensor_remove(strata_store* store, strata_tensor_id id, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_remove");
    return store->store->Remove(Id(id));
  });
}

strata_status strata_tensor_info_get(const strata_store* store, strata_tensor_id id, strata_tensor_info* info,
                                     strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_info_get");
    if (info == nullptr) return NullArgument("strata_tensor_info_get", "info");
    ASSIGN_OR_RETURN(const strata::TensorInfo t, store->store->Info(Id(id)));
    strata_tensor_info out{};
    out.dtype = static_cast<strata_dtype>(t.dtype);
    out.rank = t.shape.rank();
    for (int i = 0; i < t.shape.rank(); ++i) out.dims[i] = t.shape[i];
    out.numel = static_cast<uint64_t>(t.shape.numel());
    out.bytes = t.bytes;
    out.home = static_cast<strata_tier>(t.home);
    out.written = t.written ? 1 : 0;
    for (int k = 0; k < STRATA_NUM_TIERS; ++k) {
      const auto& c = t.copies[k];
      out.copies[k] = strata_copy_info{c.allocated ? 1 : 0, c.valid ? 1 : 0, c.dirty ? 1 : 0, c.readers,
                                       c.writer ? 1 : 0};
    }
    *info = out;
    return Status::OK();
  });
}

strata_status strata_tensor_name(const strata_store* store, strata_tensor_id id, char* buf, size_t buf_size,
                                 size_t* name_len, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_name");
    if (buf == nullptr && buf_size > 0) return NullArgument("strata_tensor_name", "buf");
    ASSIGN_OR_RETURN(const strata::TensorInfo t, store->store->Info(Id(id)));
    if (buf_size > 0) {
      const size_t n = std::min(buf_size - 1, t.name.size());
      std::memcpy(buf, t.name.data(), n);
      buf[n] = '\0';
    }
    if (name_len != nullptr) *name_len = t.name.size();
    return Status::OK();
  });
}

strata_status strata_tensor_write(strata_store* store, strata_tensor_id id, const void* src, uint64_t bytes,
                                  strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_write");
    if (src == nullptr && bytes > 0) return NullArgument("strata_tensor_write", "src");
    return store->store->Write(Id(id), src, bytes);
  });
}

strata_status strata_tensor_read(strata_store* store, strata_tensor_id id, void* dst, uint64_t bytes,
                                 strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_read");
    if (dst == nullptr && bytes > 0) return NullArgument("strata_tensor_read", "dst");
    return store->store->Read(Id(id), dst, bytes);
  });
}

strata_status strata_tensor_prefetch(strata_store* store, strata_tensor_id id, int tier, strata_ticket** ticket,
                                     strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_prefetch");
    if (ticket == nullptr) return NullArgument("strata_tensor_prefetch", "ticket");
    ASSIGN_OR_RETURN(const strata::TierKind t, ToTier(tier, "tier"));
    return GiveTicket(store->store->Prefetch(Id(id), t), ticket);
  });
}

strata_status strata_tensor_evict(strata_store* store, strata_tensor_id id, int tier, strata_ticket** ticket,
                                  strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_evict");
    if (ticket == nullptr) return NullArgument("strata_tensor_evict", "ticket");
    ASSIGN_OR_RETURN(const strata::TierKind t, ToTier(tier, "tier"));
    return GiveTicket(store->store->Evict(Id(id), t), ticket);
  });
}

strata_status strata_tensor_flush(strata_store* store, strata_tensor_id id, strata_ticket** ticket,
                                  strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_flush");
    if (ticket == nullptr) return NullArgument("strata_tensor_flush", "ticket");
    return GiveTicket(store->store->Flush(Id(id)), ticket);
  });
}

strata_status strata_store_flush_all(strata_store* store, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_store_flush_all");
    return store->store->FlushAll();
  });
}

strata_status strata_ticket_wait(const strata_ticket* ticket, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (ticket == nullptr) return NullArgument("strata_ticket_wait", "ticket");
    return ticket->ticket.Wait();
  });
}

strata_status strata_ticket_poll(const strata_ticket* ticket, int* done, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (ticket == nullptr) return NullArgument("strata_ticket_poll", "ticket");
    if (done == nullptr) return NullArgument("strata_ticket_poll", "done");
    ASSIGN_OR_RETURN(const bool d, ticket->ticket.Poll());
    *done = d ? 1 : 0;
    return Status::OK();
  });
}

void strata_ticket_free(strata_ticket* ticket) { delete ticket; }

strata_status strata_tensor_acquire(strata_store* store, strata_tensor_id id, int tier, int access,
                                    strata_tensor_view* view, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_acquire");
    if (view == nullptr) return NullArgument("strata_tensor_acquire", "view");
    ASSIGN_OR_RETURN(const strata::TierKind t, ToTier(tier, "tier"));
    if (access < STRATA_ACCESS_READ || access > STRATA_ACCESS_WRITE_DISCARD)
      return InvalidArgument("strata_tensor_acquire: access " + std::to_string(access) +
                             " is not a strata_access (0 read, 1 read-write, 2 write-discard)");
    const auto a = access == STRATA_ACCESS_READ         ? strata::Access::kRead
                   : access == STRATA_ACCESS_READ_WRITE ? strata::Access::kReadWrite
                                                        : strata::Access::kWriteDiscard;
    ASSIGN_OR_RETURN(const strata::TensorView v, store->store->Acquire(Id(id), t, a));
    const strata::GpuTier* gpu = store->store->gpu_tier();
    strata_tensor_view out{};
    out.data = v.data;
    out.bytes = v.bytes;
    out.dtype = static_cast<strata_dtype>(v.dtype);
    out.tier = static_cast<strata_tier>(v.tier);
    out.device_memory = v.tier == strata::TierKind::kGpu && gpu != nullptr && gpu->device_memory() ? 1 : 0;
    *view = out;
    return Status::OK();
  });
}

strata_status strata_tensor_release(strata_store* store, strata_tensor_id id, int tier, int dirty, void* stream,
                                    strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_release");
    ASSIGN_OR_RETURN(const strata::TierKind t, ToTier(tier, "tier"));
    return store->store->Release(Id(id), t, dirty != 0, stream);
  });
}

strata_status strata_tensor_set_next_use(strata_store* store, strata_tensor_id id, uint64_t tick,
                                         strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_set_next_use");
    return store->store->SetNextUse(Id(id), tick);
  });
}

strata_status strata_tensor_clear_next_use(strata_store* store, strata_tensor_id id, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_tensor_clear_next_use");
    return store->store->ClearNextUse(Id(id));
  });
}

strata_status strata_store_stats_get(const strata_store* store, strata_store_stats* stats, strata_error** error) {
  return Call(error, [&]() -> Status {
    if (store == nullptr) return NoStore("strata_store_stats_get");
    if (stats == nullptr) return NullArgument("strata_store_stats_get", "stats");
    const strata::TierStoreStats s = store->store->stats();
    const bool present[STRATA_NUM_TIERS] = {store->store->gpu_tier() != nullptr, true,
                                            store->store->nvme_tier() != nullptr};
    strata_store_stats out{};
    for (int k = 0; k < STRATA_NUM_TIERS; ++k) {
      const auto& t = s.tiers[k];
      strata_tier_stats& o = out.tiers[k];
      o.present = present[k] ? 1 : 0;
      o.budget = t.usage.budget;
      o.used = t.usage.used;
      o.peak_used = t.usage.peak_used;
      o.reserved = t.usage.reserved;
      o.hits = t.hits;
      o.misses = t.misses;
      o.evictions = t.evictions;
      o.writebacks = t.writebacks;
      o.writeback_bytes = t.writeback_bytes;
      o.resident = t.resident;
    }
    // The nvme tier is not a MemoryTier: its capacity and use come from NvmeStats.
    if (present[STRATA_TIER_NVME]) {
      out.tiers[STRATA_TIER_NVME].budget = s.nvme.capacity;
      out.tiers[STRATA_TIER_NVME].used = s.nvme.used;
    }
    auto link = [](const strata::LinkStats& l) { return strata_link_stats{l.bytes, l.transfers, l.seconds}; };
    out.gpu_to_host = link(s.gpu_to_host);
    out.host_to_gpu = link(s.host_to_gpu);
    out.host_to_nvme = link(s.host_to_nvme);
    out.nvme_to_host = link(s.nvme_to_host);
    out.tensors = s.tensors;
    out.acquires = s.acquires;
    out.releases = s.releases;
    out.prefetches = s.prefetches;
    out.evicts = s.evicts;
    out.flushes = s.flushes;
    out.queue_depth = s.queue_depth;
    out.max_queue_depth = s.max_queue_depth;
    out.failures = s.failures;
    out.nvme_bytes_read = s.nvme.bytes_read;
    out.nvme_bytes_written = s.nvme.bytes_written;
    *stats = out;
    return Status::OK();
  });
}

}  // extern "C"
