// SPDX-License-Identifier: Apache-2.0
/* Optimizer state offloaded to NVMe, updated by the CPU Adam: the C API of
 * libstrata.so end to end.
 *
 * A tiny "model" of LAYERS shards of N fp32 parameters fits targets t by
 * minimizing 0.5 * sum (p - t)^2, whose gradient is p - t. The fp32 master
 * weights and the Adam moments m, v of every shard live in a tier store
 * with their home on NVMe (a directory: argv[1], else a fresh one under
 * /var/tmp). Each step streams them through host memory:
 *   1. prefetch master (nvme -> host), compute the gradient and its
 *      statistics per shard; global norm -> clip coefficient -> multiplier
 *   2. per shard: prefetch m, v; acquire master/m/v on the host tier,
 *      strata_adam_step (writing an fp16 parameter copy), release them
 *      dirty; evict the host copies (written back to NVMe)
 * and prints the loss, the gradient norm and the clip coefficient. It exits
 * with 1 unless the loss fell by more than half, and prints the bytes moved
 * over each link. C99; links only libstrata.so.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "optim/c_api.h"
#include "tiers/c_api.h"

#define LAYERS 4
#define N 5000 /* parameters per shard (not a multiple of the SIMD width) */
#define STEPS 8

/* Examples may stop at the first error; a library never does. E is the
 * error out-parameter of the CHECK around the call. */
#define CHECK(call)                                                          \
  do {                                                                       \
    strata_error* err_ = NULL;                                               \
    if ((call) != STRATA_OK) {                                               \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,                     \
              err_ ? err_->text : "(no details)");                           \
      strata_error_free(err_);                                               \
      exit(2);                                                               \
    }                                                                        \
  } while (0)
#define E (&err_)

static void wait_and_free(strata_ticket* t) {
  CHECK(strata_ticket_wait(t, E));
  strata_ticket_free(t);
}

static float* acquire_f32(strata_store* s, strata_tensor_id id, int access) {
  strata_tensor_view v;
  CHECK(strata_tensor_acquire(s, id, STRATA_TIER_HOST, access, &v, E));
  return (float*)v.data;
}

int main(int argc, char** argv) {
  char tmpl[] = "/var/tmp/strata-example-XXXXXX";
  const char* dir = argc > 1 ? argv[1] : mkdtemp(tmpl);
  if (dir == NULL) {
    perror("mkdtemp");
    return 2;
  }

  strata_store_options o;
  strata_store_options_init(&o);
  o.gpu = 0;                          /* host and NVMe only */
  o.host_budget_bytes = 4u << 20;
  o.host_slab_bytes = 0;              /* the whole budget as one slab */
  o.host_pin = 0;                     /* pageable: no RLIMIT_MEMLOCK needed */
  o.staging_chunk_bytes = 64u << 10;
  o.staging_buffers = 2;
  o.staging_per_move = 2;
  o.nvme_dirs = &dir;
  o.nvme_dir_count = 1;
  o.nvme_capacity_bytes = 64u << 20;
  o.nvme_block_size = 256u << 10;
  o.nvme_queue_depth = 8;
  o.nvme_buffered_fallback = 1;       /* where the directory refuses O_DIRECT (tmpfs) */
  strata_store* store = NULL;
  CHECK(strata_store_open(&o, &store, E));

  strata_adam_options ao;
  strata_adam_options_init(&ao);
  ao.threads = 2;
  strata_adam* adam = NULL;
  CHECK(strata_adam_create(&ao, &adam, E));
  strata_adam_info info;
  CHECK(strata_adam_info_get(adam, &info, E));
  printf("cpu adam: %s, %d threads; state on nvme in %s\n", strata_isa_name(info.isa), info.threads, dir);

  /* The state: master = 0, m = v = 0, all homed on NVMe. */
  static float target[LAYERS][N], grad[LAYERS][N], zeros[N];
  static uint16_t params_f16[LAYERS][N]; /* the fp16 copy a GPU would upload */
  strata_tensor_id master[LAYERS], m[LAYERS], v[LAYERS];
  const int64_t dims[1] = {N};
  for (int l = 0; l < LAYERS; ++l) {
    char name[64];
    strata_tensor_id* ids[3] = {&master[l], &m[l], &v[l]};
    const char* kinds[3] = {"master", "exp_avg", "exp_avg_sq"};
    for (int k = 0; k < 3; ++k) {
      snprintf(name, sizeof name, "layer%d.%s", l, kinds[k]);
      CHECK(strata_tensor_create(store, name, STRATA_F32, dims, 1, STRATA_TIER_NVME, ids[k], E));
      CHECK(strata_tensor_write(store, *ids[k], zeros, sizeof zeros, E));
      strata_ticket* t = NULL;
      CHECK(strata_tensor_evict(store, *ids[k], STRATA_TIER_HOST, &t, E)); /* onto the NVMe file */
      wait_and_free(t);
    }
    for (int i = 0; i < N; ++i) target[l][i] = sinf(0.01f * (float)i + (float)l);
  }

  strata_adam_hyper h;
  strata_adam_hyper_init(&h);
  h.lr = 0.1;
  h.weight_decay = 0.0;
  const double max_norm = 10.0, loss_scale = 1.0;
  double first_loss = 0, loss = 0;
  for (int step = 1; step <= STEPS; ++step) {
    /* 1. gradients and their global statistics */
    strata_grad_stats total = {0, 0, 0};
    loss = 0;
    for (int l = 0; l < LAYERS; ++l) {
      strata_ticket* t = NULL;
      CHECK(strata_tensor_prefetch(store, master[l], STRATA_TIER_HOST, &t, E));
      wait_and_free(t);
      const float* p = acquire_f32(store, master[l], STRATA_ACCESS_READ);
      for (int i = 0; i < N; ++i) {
        grad[l][i] = p[i] - target[l][i];
        loss += 0.5 * (double)grad[l][i] * grad[l][i];
      }
      CHECK(strata_tensor_release(store, master[l], STRATA_TIER_HOST, 0, NULL, E));
      strata_grad_stats st;
      CHECK(strata_adam_grad_stats(adam, grad[l], STRATA_F32, N, &st, E));
      CHECK(strata_grad_stats_merge(&total, &st, E));
    }
    if (step == 1) first_loss = loss;
    double norm = 0, coef = 0, mult = 0;
    CHECK(strata_global_grad_norm(&total, loss_scale, &norm, E));
    CHECK(strata_clip_coefficient(norm, max_norm, &coef, E));
    CHECK(strata_grad_multiplier(loss_scale, coef, &mult, E));

    /* 2. the update, shard by shard, streamed through host memory */
    h.step = step;
    for (int l = 0; l < LAYERS; ++l) {
      strata_ticket *tm = NULL, *tv = NULL;
      CHECK(strata_tensor_prefetch(store, m[l], STRATA_TIER_HOST, &tm, E));
      CHECK(strata_tensor_prefetch(store, v[l], STRATA_TIER_HOST, &tv, E));
      wait_and_free(tm);
      wait_and_free(tv);
      strata_adam_shard s;
      memset(&s, 0, sizeof s);
      s.n = N;
      s.master = acquire_f32(store, master[l], STRATA_ACCESS_READ_WRITE);
      s.exp_avg = acquire_f32(store, m[l], STRATA_ACCESS_READ_WRITE);
      s.exp_avg_sq = acquire_f32(store, v[l], STRATA_ACCESS_READ_WRITE);
      s.state_dtype = STRATA_F32;
      s.grad = grad[l];
      s.grad_dtype = STRATA_F32;
      s.param_out = params_f16[l];
      s.param_out_dtype = STRATA_F16;
      strata_adam_result r;
      CHECK(strata_adam_step(adam, &s, &h, mult, /*skip_on_nonfinite=*/1, &r, E));
      strata_tensor_id ids[3] = {master[l], m[l], v[l]};
      for (int k = 0; k < 3; ++k) {
        CHECK(strata_tensor_release(store, ids[k], STRATA_TIER_HOST, /*dirty=*/1, NULL, E));
        strata_ticket* t = NULL;
        CHECK(strata_tensor_evict(store, ids[k], STRATA_TIER_HOST, &t, E)); /* written back home */
        wait_and_free(t);
      }
      if (r.skipped) printf("  layer %d: step skipped (%llu non-finite gradients)\n", l,
                            (unsigned long long)r.nonfinite_grads);
    }
    printf("step %d: loss %.4f  grad_norm %.4f  clip %.4f\n", step, loss, norm, coef);
  }

  strata_store_stats st;
  CHECK(strata_store_stats_get(store, &st, E));
  printf("moved host->nvme %llu bytes in %llu transfers, nvme->host %llu bytes in %llu transfers\n",
         (unsigned long long)st.host_to_nvme.bytes, (unsigned long long)st.host_to_nvme.transfers,
         (unsigned long long)st.nvme_to_host.bytes, (unsigned long long)st.nvme_to_host.transfers);
  printf("host tier peak %llu of %llu bytes\n", (unsigned long long)st.tiers[STRATA_TIER_HOST].peak_used,
         (unsigned long long)st.tiers[STRATA_TIER_HOST].budget);

  strata_adam_destroy(adam);
  strata_store_close(store); /* removes the swap files */
  if (argc <= 1) rmdir(dir);
  const int ok = loss < 0.5 * first_loss && isfinite(loss);
  printf("%s: loss %.4f -> %.4f\n", ok ? "OK" : "FAILED", first_loss, loss);
  return ok ? 0 : 1;
}
