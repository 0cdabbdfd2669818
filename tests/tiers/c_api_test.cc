// SPDX-License-Identifier: Apache-2.0
// Tests for the tier store's C API (tiers/c_api.h) through libstrata.so:
// every function, the error convention (code, message, errno, path, tier,
// bytes) on each error path, and data round trips through host and NVMe.
// The C++ store's own behaviour is tested in tier_store_test.cc; here the
// point is that the boundary passes everything through faithfully.
#include "tiers/c_api.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/status.h"
#include "tests/c_api_test_util.h"
#include "tests/test_util.h"
#include "tiers/tier_store.h"

namespace strata {
namespace {

using ::strata::testing::CError;
using ::strata::testing::CFails;
using ::strata::testing::COk;
using ::strata::testing::RandomBytes;

struct CStoreFixture : ::testing::Test {
  testing::TempDir dir;
  const char* dirs[1] = {nullptr};
  strata_store* store = nullptr;

  ~CStoreFixture() override { strata_store_close(store); }

  // Small tiers on the gpu stand-in, as tier_store_test.cc sets them up.
  strata_store_options Options(uint64_t host_budget, bool with_nvme = true) {
    strata_store_options o;
    strata_store_options_init(&o);
    o.gpu = 1;
    o.gpu_stand_in = 1;
    o.gpu_budget_bytes = kMiB;
    o.gpu_slab_bytes = 0;
    o.host_budget_bytes = host_budget;
    o.host_slab_bytes = 0;
    o.host_pin = 0;
    o.staging_chunk_bytes = 64 * kKiB;
    o.staging_buffers = 2;
    o.staging_per_move = 2;
    if (with_nvme) {
      dirs[0] = dir.path().c_str();
      o.nvme_dirs = dirs;
      o.nvme_dir_count = 1;
      o.nvme_capacity_bytes = 16 * kMiB;
      o.nvme_block_size = 64 * kKiB;
      o.nvme_queue_depth = 8;
      o.nvme_buffered_fallback = 1;  // where the temp dir refuses O_DIRECT
    }
    return o;
  }
  void Open(const strata_store_options& o) {
    CError err;
    ASSERT_TRUE(COk(strata_store_open(&o, &store, err.out()), err));
    ASSERT_NE(store, nullptr);
  }
  strata_tensor_id Create(const char* name, int64_t bytes, int home) {
    CError err;
    strata_tensor_id id = 0;
    EXPECT_TRUE(COk(strata_tensor_create(store, name, STRATA_U8, &bytes, 1, home, &id, err.out()), err));
    return id;
  }
  std::vector<uint8_t> ReadAll(strata_tensor_id id, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    CError err;
    EXPECT_TRUE(COk(strata_tensor_read(store, id, out.data(), out.size(), err.out()), err));
    return out;
  }
};

TEST(CApiNames, VersionStatusTierDtype) {
  EXPECT_EQ(strata_c_api_version(), STRATA_C_API_VERSION);
  EXPECT_STREQ(strata_status_name(STRATA_OK), "OK");
  EXPECT_STREQ(strata_status_name(STRATA_OUT_OF_MEMORY), "OutOfMemory");
  EXPECT_STREQ(strata_status_name(STRATA_INTERNAL), "Internal");
  EXPECT_STREQ(strata_status_name(99), "Unknown");
  EXPECT_STREQ(strata_tier_name(STRATA_TIER_NVME), "nvme");
  EXPECT_STREQ(strata_tier_name(-1), "?");
  EXPECT_EQ(strata_dtype_size(STRATA_BF16), 2u);
  EXPECT_EQ(strata_dtype_size(STRATA_F64), 8u);
  EXPECT_EQ(strata_dtype_size(42), 0u);
  EXPECT_STREQ(strata_dtype_name(STRATA_F16), "f16");
  EXPECT_STREQ(strata_dtype_name(42), "?");
  EXPECT_EQ(strata_tiers_struct_size("strata_store_options"), sizeof(strata_store_options));
  EXPECT_EQ(strata_tiers_struct_size("strata_store_stats"), sizeof(strata_store_stats));
  EXPECT_EQ(strata_tiers_struct_size("strata_adam_hyper"), 0u);  // not a struct of this header
  EXPECT_EQ(strata_tiers_struct_size(nullptr), 0u);
  strata_error_free(nullptr);  // allowed
  strata_ticket_free(nullptr);
  strata_store_close(nullptr);
}

TEST(CApiOptions, InitIsTheCppDefaults) {
  strata_store_options o;
  std::memset(&o, 0xff, sizeof o);
  strata_store_options_init(&o);
  const TierStoreOptions d;
  EXPECT_EQ(o.gpu, 1);
  EXPECT_EQ(o.gpu_stand_in, 0);
  EXPECT_EQ(o.gpu_budget_bytes, d.gpu_tier.budget_bytes);
  EXPECT_EQ(o.gpu_slab_bytes, d.gpu_tier.slab_bytes);
  EXPECT_EQ(o.host_slab_bytes, d.host_tier.slab_bytes);
  EXPECT_EQ(o.host_pin, 1);
  EXPECT_EQ(o.nvme_dir_count, 0u);
  EXPECT_EQ(o.nvme_dirs, nullptr);
  EXPECT_EQ(o.nvme_block_size, NvmeOptions{}.block_size);
  EXPECT_EQ(o.nvme_queue_depth, NvmeOptions{}.queue_depth);
  EXPECT_EQ(o.staging_chunk_bytes, d.staging_chunk_bytes);
  EXPECT_EQ(o.worker_threads, d.worker_threads);
  EXPECT_EQ(o.eviction, STRATA_EVICT_LRU);
  strata_store_options_init(nullptr);  // ignored
}

TEST(CApiErrors, NullArgumentsAreInvalidArgument) {
  CError err;
  strata_store* store = nullptr;
  EXPECT_TRUE(CFails(strata_store_open(nullptr, &store, err.out()), err, STRATA_INVALID_ARGUMENT,
                     "strata_store_open: options is NULL"));
  EXPECT_EQ(store, nullptr);
  strata_tensor_id id = 7;
  EXPECT_TRUE(CFails(strata_tensor_find(nullptr, "x", &id, err.out()), err, STRATA_INVALID_ARGUMENT, "store is NULL"));
  EXPECT_EQ(id, 7u);  // out-parameters are written only on success
  EXPECT_TRUE(
      CFails(strata_ticket_wait(nullptr, err.out()), err, STRATA_INVALID_ARGUMENT, "strata_ticket_wait: ticket is NULL"));
  // Without an error pointer only the code comes back.
  EXPECT_EQ(strata_ticket_wait(nullptr, nullptr), STRATA_INVALID_ARGUMENT);
}

TEST_F(CStoreFixture, NvmeDirMissingIsNotFound) {
  const std::string missing = dir.File("no-such-dir");
  strata_store_options o = Options(kMiB);
  dirs[0] = missing.c_str();
  CError err;
  EXPECT_TRUE(CFails(strata_store_open(&o, &store, err.out()), err, STRATA_NOT_FOUND,
                     "NVMe directory '" + missing + "' does not exist"));
  EXPECT_EQ(store, nullptr);
}

TEST_F(CStoreFixture, NvmeDirUnderAFileIsIoErrorWithErrnoAndPath) {
  const std::string file = dir.File("plain-file");
  std::ofstream(file) << "x";
  const std::string bad = file + "/sub";
  strata_store_options o = Options(kMiB);
  dirs[0] = bad.c_str();
  CError err;
  ASSERT_TRUE(CFails(strata_store_open(&o, &store, err.out()), err, STRATA_IO_ERROR, "cannot stat NVMe directory"));
  EXPECT_EQ(err.e->sys_errno, ENOTDIR);
  EXPECT_STREQ(err.e->path, bad.c_str());
  EXPECT_EQ(err.e->has_offset, 0);
  EXPECT_EQ(err.e->tier, -1);
  EXPECT_NE(std::string(err.e->text).find("errno 20 ENOTDIR"), std::string::npos) << err.e->text;
}

TEST_F(CStoreFixture, BadOptionsNameTheOption) {
  strata_store_options o = Options(kMiB);
  o.nvme_checksum = static_cast<strata_checksum>(9);
  CError err;
  EXPECT_TRUE(CFails(strata_store_open(&o, &store, err.out()), err, STRATA_INVALID_ARGUMENT, "options.nvme_checksum 9"));
  o = Options(kMiB);
  o.eviction = static_cast<strata_eviction>(5);
  EXPECT_TRUE(CFails(strata_store_open(&o, &store, err.out()), err, STRATA_INVALID_ARGUMENT, "options.eviction 5"));
  o = Options(kMiB);
  o.nvme_dirs = nullptr;
  EXPECT_TRUE(CFails(strata_store_open(&o, &store, err.out()), err, STRATA_INVALID_ARGUMENT, "options.nvme_dirs is NULL"));
  o = Options(kMiB);
  o.nvme_block_size = 1000;  // the C++ validation, passed through
  EXPECT_TRUE(CFails(strata_store_open(&o, &store, err.out()), err, STRATA_INVALID_ARGUMENT, "block_size"));
  EXPECT_EQ(store, nullptr);
}

TEST_F(CStoreFixture, RoundTripThroughHostAndNvme) {
  Open(Options(kMiB));
  const size_t n = 200 * 1000;  // not a multiple of 4096
  const strata_tensor_id h = Create("host.t", n, STRATA_TIER_HOST);
  const strata_tensor_id d = Create("nvme.t", n, STRATA_TIER_NVME);
  ASSERT_NE(h, 0u);
  ASSERT_NE(d, 0u);
  const auto a = RandomBytes(n, 1), b = RandomBytes(n, 2);
  CError err;
  ASSERT_TRUE(COk(strata_tensor_write(store, h, a.data(), n, err.out()), err));
  ASSERT_TRUE(COk(strata_tensor_write(store, d, b.data(), n, err.out()), err));

  // The nvme tensor's host cache is dirty: evicting it writes it home.
  strata_ticket* t = nullptr;
  ASSERT_TRUE(COk(strata_tensor_evict(store, d, STRATA_TIER_HOST, &t, err.out()), err));
  ASSERT_TRUE(COk(strata_ticket_wait(t, err.out()), err));
  int done = 0;
  ASSERT_TRUE(COk(strata_ticket_poll(t, &done, err.out()), err));
  EXPECT_EQ(done, 1);
  strata_ticket_free(t);

  strata_tensor_info info;
  ASSERT_TRUE(COk(strata_tensor_info_get(store, d, &info, err.out()), err));
  EXPECT_EQ(info.dtype, STRATA_U8);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.dims[0], static_cast<int64_t>(n));
  EXPECT_EQ(info.numel, n);
  EXPECT_EQ(info.bytes, n);
  EXPECT_EQ(info.home, STRATA_TIER_NVME);
  EXPECT_EQ(info.written, 1);
  EXPECT_EQ(info.copies[STRATA_TIER_HOST].allocated, 0);
  EXPECT_EQ(info.copies[STRATA_TIER_NVME].valid, 1);

  strata_store_stats st;
  ASSERT_TRUE(COk(strata_store_stats_get(store, &st, err.out()), err));
  EXPECT_EQ(st.tensors, 2u);
  const uint64_t io_bytes = (n + 4095) / 4096 * 4096;  // nvme I/O moves whole 4 KiB blocks
  EXPECT_EQ(st.host_to_nvme.bytes, io_bytes);
  EXPECT_GE(st.host_to_nvme.transfers, 1u);
  EXPECT_EQ(st.nvme_to_host.bytes, 0u);
  EXPECT_EQ(st.tiers[STRATA_TIER_HOST].evictions, 1u);
  EXPECT_EQ(st.tiers[STRATA_TIER_HOST].writebacks, 1u);
  EXPECT_EQ(st.tiers[STRATA_TIER_HOST].budget, kMiB);
  EXPECT_EQ(st.tiers[STRATA_TIER_NVME].present, 1);
  EXPECT_EQ(st.tiers[STRATA_TIER_NVME].budget, 16 * kMiB);  // the capacity
  EXPECT_EQ(st.tiers[STRATA_TIER_NVME].used, io_bytes);  // the nvme tensor's home extent
  EXPECT_EQ(st.tiers[STRATA_TIER_GPU].present, 1);
  EXPECT_GE(st.nvme_bytes_written, n);

  // Reading loads it back from the file.
  EXPECT_EQ(ReadAll(d, n), b);
  EXPECT_EQ(ReadAll(h, n), a);
  ASSERT_TRUE(COk(strata_store_stats_get(store, &st, err.out()), err));
  EXPECT_EQ(st.nvme_to_host.bytes, io_bytes);

  // Prefetch to the gpu stand-in, then read the view there.
  ASSERT_TRUE(COk(strata_tensor_prefetch(store, d, STRATA_TIER_GPU, &t, err.out()), err));
  ASSERT_TRUE(COk(strata_ticket_wait(t, err.out()), err));
  strata_ticket_free(t);
  strata_tensor_view v;
  ASSERT_TRUE(COk(strata_tensor_acquire(store, d, STRATA_TIER_GPU, STRATA_ACCESS_READ, &v, err.out()), err));
  EXPECT_EQ(v.bytes, n);
  EXPECT_EQ(v.tier, STRATA_TIER_GPU);
  EXPECT_EQ(v.device_memory, 0);  // the stand-in is host memory
  EXPECT_EQ(std::memcmp(v.data, b.data(), n), 0);
  ASSERT_TRUE(COk(strata_tensor_release(store, d, STRATA_TIER_GPU, 0, nullptr, err.out()), err));
  int is_device = 7;
  ASSERT_TRUE(COk(strata_store_gpu_is_device(store, &is_device, err.out()), err));
  EXPECT_EQ(is_device, 0);
}

TEST_F(CStoreFixture, AcquireWriteReleaseFlush) {
  Open(Options(kMiB));
  const size_t n = 8192;
  const strata_tensor_id d = Create("w", n, STRATA_TIER_NVME);
  CError err;
  strata_tensor_view v;
  ASSERT_TRUE(COk(strata_tensor_acquire(store, d, STRATA_TIER_HOST, STRATA_ACCESS_WRITE_DISCARD, &v, err.out()), err));
  ASSERT_EQ(v.bytes, n);
  const auto data = RandomBytes(n, 3);
  std::memcpy(v.data, data.data(), n);

  // While pinned: a second writer and Remove are refused, naming the state.
  strata_tensor_view v2;
  EXPECT_TRUE(CFails(strata_tensor_acquire(store, d, STRATA_TIER_HOST, STRATA_ACCESS_READ, &v2, err.out()), err,
                     STRATA_FAILED_PRECONDITION, "'w'"));
  EXPECT_TRUE(CFails(strata_tensor_remove(store, d, err.out()), err, STRATA_FAILED_PRECONDITION, "'w'"));
  ASSERT_TRUE(COk(strata_tensor_release(store, d, STRATA_TIER_HOST, 1, nullptr, err.out()), err));

  strata_ticket* t = nullptr;
  ASSERT_TRUE(COk(strata_tensor_flush(store, d, &t, err.out()), err));
  ASSERT_TRUE(COk(strata_ticket_wait(t, err.out()), err));
  strata_ticket_free(t);
  strata_tensor_info info;
  ASSERT_TRUE(COk(strata_tensor_info_get(store, d, &info, err.out()), err));
  EXPECT_EQ(info.copies[STRATA_TIER_HOST].dirty, 0);
  EXPECT_EQ(info.copies[STRATA_TIER_HOST].valid, 1);
  EXPECT_EQ(info.copies[STRATA_TIER_NVME].valid, 1);
  ASSERT_TRUE(COk(strata_store_flush_all(store, err.out()), err));
  EXPECT_EQ(ReadAll(d, n), data);

  // nvme copies have no address.
  EXPECT_TRUE(CFails(strata_tensor_acquire(store, d, STRATA_TIER_NVME, STRATA_ACCESS_READ, &v, err.out()), err,
                     STRATA_INVALID_ARGUMENT, "cannot be acquired"));
  EXPECT_TRUE(CFails(strata_tensor_acquire(store, d, STRATA_TIER_HOST, 3, &v, err.out()), err,
                     STRATA_INVALID_ARGUMENT, "access 3 is not a strata_access"));

  ASSERT_TRUE(COk(strata_tensor_set_next_use(store, d, 42, err.out()), err));
  ASSERT_TRUE(COk(strata_tensor_clear_next_use(store, d, err.out()), err));
  ASSERT_TRUE(COk(strata_tensor_remove(store, d, err.out()), err));
  strata_tensor_id id = 0;
  EXPECT_TRUE(CFails(strata_tensor_find(store, "w", &id, err.out()), err, STRATA_NOT_FOUND, "no tensor named 'w'"));
}

TEST_F(CStoreFixture, UnknownTensorIsNotFound) {
  Open(Options(kMiB, /*with_nvme=*/false));
  CError err;
  strata_tensor_id id = 0;
  EXPECT_TRUE(CFails(strata_tensor_find(store, "missing", &id, err.out()), err, STRATA_NOT_FOUND, "'missing'"));
  uint8_t buf[16];
  EXPECT_EQ(strata_tensor_read(store, 12345, buf, sizeof buf, err.out()), STRATA_NOT_FOUND);
  EXPECT_EQ(strata_tensor_remove(store, 12345, err.out()), STRATA_NOT_FOUND);
  strata_ticket* t = nullptr;
  EXPECT_EQ(strata_tensor_prefetch(store, 12345, STRATA_TIER_HOST, &t, err.out()), STRATA_NOT_FOUND);
  EXPECT_EQ(t, nullptr);
}

TEST_F(CStoreFixture, CreateChecksItsArguments) {
  Open(Options(kMiB, /*with_nvme=*/false));
  CError err;
  strata_tensor_id id = 0;
  const int64_t dims[2] = {4, 8};
  EXPECT_TRUE(CFails(strata_tensor_create(store, "t", 42, dims, 2, STRATA_TIER_HOST, &id, err.out()), err,
                     STRATA_INVALID_ARGUMENT, "dtype 42 is not a strata_dtype"));
  EXPECT_TRUE(CFails(strata_tensor_create(store, "t", STRATA_F32, dims, 2, 3, &id, err.out()), err,
                     STRATA_INVALID_ARGUMENT, "home tier 3 is not a strata_tier"));
  EXPECT_TRUE(CFails(strata_tensor_create(store, "t", STRATA_F32, dims, 9, STRATA_TIER_HOST, &id, err.out()), err,
                     STRATA_INVALID_ARGUMENT, "rank 9"));
  const int64_t neg[1] = {-1};
  EXPECT_EQ(strata_tensor_create(store, "t", STRATA_F32, neg, 1, STRATA_TIER_HOST, &id, err.out()),
            STRATA_INVALID_ARGUMENT);
  EXPECT_TRUE(CFails(strata_tensor_create(store, "t", STRATA_F32, dims, 2, STRATA_TIER_NVME, &id, err.out()), err,
                     STRATA_INVALID_ARGUMENT, "home tier nvme is not configured"));
  EXPECT_EQ(id, 0u);

  ASSERT_TRUE(COk(strata_tensor_create(store, "t", STRATA_F32, dims, 2, STRATA_TIER_HOST, &id, err.out()), err));
  EXPECT_TRUE(CFails(strata_tensor_create(store, "t", STRATA_F32, dims, 2, STRATA_TIER_HOST, &id, err.out()), err,
                     STRATA_ALREADY_EXISTS, "'t'"));
  strata_tensor_id found = 0;
  ASSERT_TRUE(COk(strata_tensor_find(store, "t", &found, err.out()), err));
  EXPECT_EQ(found, id);
  char name[2];
  size_t len = 0;
  ASSERT_TRUE(COk(strata_tensor_name(store, id, name, sizeof name, &len, err.out()), err));
  EXPECT_STREQ(name, "t");
  EXPECT_EQ(len, 1u);

  // A scalar (rank 0, dims may be NULL) of 4 bytes.
  strata_tensor_id s = 0;
  ASSERT_TRUE(COk(strata_tensor_create(store, "scalar", STRATA_F32, nullptr, 0, STRATA_TIER_HOST, &s, err.out()), err));
  const float x = 2.5f;
  ASSERT_TRUE(COk(strata_tensor_write(store, s, &x, sizeof x, err.out()), err));
  float y = 0;
  ASSERT_TRUE(COk(strata_tensor_read(store, s, &y, sizeof y, err.out()), err));
  EXPECT_EQ(y, 2.5f);
  // The wrong size names both sizes.
  EXPECT_TRUE(CFails(strata_tensor_write(store, id, &x, sizeof x, err.out()), err, STRATA_INVALID_ARGUMENT,
                     "write of 4 bytes to tensor 't' of 128 bytes"));
}

TEST_F(CStoreFixture, BudgetExhaustedIsOutOfMemoryNamingTheTier) {
  // 256 KiB host budget, 128 KiB of it staging.
  Open(Options(256 * kKiB, /*with_nvme=*/false));
  CError err;
  strata_tensor_id id = 0;
  const int64_t bytes = 512 * kKiB;
  ASSERT_EQ(strata_tensor_create(store, "big", STRATA_U8, &bytes, 1, STRATA_TIER_HOST, &id, err.out()),
            STRATA_OUT_OF_MEMORY);
  ASSERT_NE(err.e, nullptr);
  EXPECT_EQ(err.e->code, STRATA_OUT_OF_MEMORY);
  EXPECT_EQ(err.e->tier, STRATA_TIER_HOST);
  EXPECT_EQ(err.e->bytes_requested, 512 * kKiB);
  EXPECT_LT(err.e->bytes_available, err.e->bytes_requested);
  EXPECT_LE(err.e->bytes_available, 256 * kKiB);
  EXPECT_NE(std::string(err.e->text).find("tier host"), std::string::npos) << err.e->text;
  EXPECT_NE(std::string(err.e->message).find("big"), std::string::npos) << err.e->message;
}

TEST_F(CStoreFixture, TicketOutlivesTheStore) {
  Open(Options(kMiB));
  const strata_tensor_id d = Create("late", 64 * kKiB, STRATA_TIER_NVME);
  const auto data = RandomBytes(64 * kKiB, 4);
  CError err;
  ASSERT_TRUE(COk(strata_tensor_write(store, d, data.data(), data.size(), err.out()), err));
  strata_ticket* t = nullptr;
  ASSERT_TRUE(COk(strata_tensor_flush(store, d, &t, err.out()), err));
  strata_store_close(store);
  store = nullptr;
  // Finished before the close, or cancelled by it: either way a clean answer.
  const strata_status s = strata_ticket_wait(t, err.out());
  EXPECT_TRUE(s == STRATA_OK || s == STRATA_CANCELLED) << strata_status_name(s) << " " << err.text();
  strata_ticket_free(t);
}

}  // namespace
}  // namespace strata
