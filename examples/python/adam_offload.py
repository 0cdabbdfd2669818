#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Optimizer state offloaded to NVMe, updated by the CPU Adam, from Python.

The loop of examples/c/adam_offload.c with the strata package (standard
library only): a tiny "model" of LAYERS shards fits targets t by minimizing
0.5 * sum (p - t)^2 (gradient p - t). The fp32 master weights and Adam
moments live in a TierStore with their home on NVMe (a directory: argv[1],
else a fresh one under /var/tmp) and stream through host memory each step:
prefetch -> gradient statistics -> clip -> CpuAdam.step on the host views ->
release dirty -> evict (written back). Prints the loss per step; exits 1
unless the loss fell by more than half.

    STRATA_LIB=build/lib/libstrata.so PYTHONPATH=python python3 examples/python/adam_offload.py
"""

import array
import math
import os
import shutil
import sys
import tempfile

try:
    import strata
except ImportError:  # run from a checkout: the package is in <repo>/python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
    import strata

LAYERS, N, STEPS = 4, 5000, 8


def main():
    own_dir = len(sys.argv) < 2
    directory = tempfile.mkdtemp(prefix="strata-example-", dir="/var/tmp") if own_dir else sys.argv[1]
    try:
        return run(directory)
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


def run(directory):
    adam = strata.CpuAdam(threads=2)
    print("cpu adam: %s, %d threads; state on nvme in %s" % (adam.isa, adam.threads, directory))
    store = strata.TierStore(gpu=False, host_budget_bytes=4 << 20, host_slab_bytes=0, host_pin=False,
                             staging_chunk_bytes=64 << 10, staging_buffers=2, staging_per_move=2,
                             nvme_dirs=[directory], nvme_capacity_bytes=64 << 20, nvme_block_size=256 << 10,
                             nvme_queue_depth=8, nvme_buffered_fallback=True)
    with store:
        zeros = array.array("f", bytes(4 * N))
        layers = []
        for l in range(LAYERS):
            tensors = []
            for kind in ("master", "exp_avg", "exp_avg_sq"):
                t = store.create("layer%d.%s" % (l, kind), "f32", (N,), home="nvme")
                t.write(zeros)
                t.evict("host").wait()  # onto the NVMe file
                tensors.append(t)
            target = array.array("f", (math.sin(0.01 * i + l) for i in range(N)))
            layers.append((tensors, target))

        first_loss = loss = None
        params_f16 = [array.array("H", bytes(2 * N)) for _ in range(LAYERS)]  # the copy a GPU would upload
        for step in range(1, STEPS + 1):
            # 1. gradients and their global statistics
            grads, total, loss = [], strata.GradStats(0.0, 0, 0), 0.0
            for (master, _, _), target in layers:
                master.prefetch("host").wait()
                with master.acquire("host", "read") as view:
                    p = view.memory.cast("f")
                    g = array.array("f", (p[i] - target[i] for i in range(N)))
                    del p  # the view's memory must not outlive the release
                loss += 0.5 * sum(x * x for x in g)
                total = total.merge(adam.grad_stats(g))
                grads.append(g)
            first_loss = loss if first_loss is None else first_loss
            norm = strata.global_grad_norm(total, loss_scale=1.0)
            coef = strata.clip_coefficient(norm, max_norm=10.0)
            mult = strata.grad_multiplier(1.0, coef)

            # 2. the update, shard by shard, streamed through host memory
            for l, ((master, m, v), _) in enumerate(layers):
                tickets = [m.prefetch("host"), v.prefetch("host")]
                for t in tickets:
                    t.wait()
                with master.acquire("host", "read_write") as pv, m.acquire("host", "read_write") as mv, \
                        v.acquire("host", "read_write") as vv:
                    r = adam.step(pv.memory, mv.memory, vv.memory, grads[l], step=step, lr=0.1,
                                  grad_scale=mult, skip_on_nonfinite=True, param_out=params_f16[l],
                                  param_out_dtype="f16", state_dtype="f32")
                for t in (master, m, v):
                    t.evict("host").wait()  # written back home
                if r.skipped:
                    print("  layer %d: step skipped (%d non-finite gradients)" % (l, r.nonfinite_grads))
            print("step %d: loss %.4f  grad_norm %.4f  clip %.4f" % (step, loss, norm, coef))

        st = store.stats()
        links = st["links"]
        print("moved host->nvme %d bytes in %d transfers, nvme->host %d bytes in %d transfers"
              % (links["host_to_nvme"]["bytes"], links["host_to_nvme"]["transfers"],
                 links["nvme_to_host"]["bytes"], links["nvme_to_host"]["transfers"]))
        print("host tier peak %d of %d bytes" % (st["tiers"]["host"]["peak_used"], st["tiers"]["host"]["budget"]))
    ok = loss < 0.5 * first_loss and math.isfinite(loss)
    print("%s: loss %.4f -> %.4f" % ("OK" if ok else "FAILED", first_loss, loss))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
