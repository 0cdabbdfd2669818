#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A plain PyTorch training loop with strata's OffloadAdam: the Adam state
(fp32 masters, moments) in a strata tier store, here homed on NVMe (a
directory: argv[1], else a fresh one under /var/tmp), the update overlapped
with the next forward, gradients clipped to norm 1, a checkpoint written
and read back with torch.save / torch.load.

A small MLP learns a fixed random linear map on the CPU; prints the loss
every 20 steps and exits 1 unless it fell below a tenth of the first.

    PYTHONPATH=python STRATA_LIB=build/lib/libstrata.so python3 examples/python/torch_offload_adam.py
"""

import io
import os
import shutil
import sys
import tempfile

import torch

try:
    import strata
except ImportError:  # run from a checkout: the package is in <repo>/python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
    import strata
import strata.torch


def main(directory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 16))
    teacher = torch.randn(64, 16) / 8

    opt = strata.torch.OffloadAdam(model.parameters(), lr=1e-3, weight_decay=0.01, nvme_dirs=[directory],
                                   store_options={"nvme_buffered_fallback": True})  # tmpfs has no O_DIRECT
    opt.overlap_with(model)  # step() returns at once; each layer's forward waits for its own update

    first = loss = None
    for step in range(1, 201):
        x = torch.randn(32, 64)
        loss = torch.nn.functional.mse_loss(model(x), x @ teacher)
        loss.backward()
        opt.step(grad_scale=strata.clip_coefficient(opt.grad_norm(), 1.0))  # clip to norm 1
        opt.zero_grad()
        first = first if first is not None else loss.item()
        if step % 20 == 0:
            print("step %3d: loss %.5f (last update %.2f ms)" % (step, loss.item(), 1e3 * opt.last_update_seconds))

    checkpoint = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint)
    checkpoint.seek(0)
    opt.load_state_dict(torch.load(checkpoint)["optimizer"])
    opt.close()
    if not loss.item() < 0.1 * first:
        print("the loss did not fall below a tenth: %.5f -> %.5f" % (first, loss.item()))
        return 1
    print("loss %.5f -> %.5f" % (first, loss.item()))
    return 0


if __name__ == "__main__":
    own = len(sys.argv) < 2
    d = tempfile.mkdtemp(prefix="strata-example-", dir="/var/tmp") if own else sys.argv[1]
    try:
        sys.exit(main(d))
    finally:
        if own:
            shutil.rmtree(d, ignore_errors=True)
