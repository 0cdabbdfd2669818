#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""strata.torch.OffloadAdam against PyTorch's usual optimizers-on-the-CPU,
in one run: a PyTorch GPT training loop (bf16 parameters on the GPU, the
fp32 Adam state in host memory), timed for each optimizer in turn.

Workloads (all AdamW with the same hyperparameters, data and init):
  none            forward + backward only: the baseline every step is set against
  strata          OffloadAdam, the update after the backward (step() returns
                  with the parameters updated on the GPU)
  strata-overlap  OffloadAdam with overlap_with(model): step() returns at once
                  and the update runs behind the next forward
  torch           torch.optim.AdamW(fused=True) over fp32 master copies in
                  pinned host memory: gradients copied down (bf16 -> fp32),
                  the step, new values copied up (the "optimizer on the CPU"
                  pattern); foreach=True where this torch has no fused CPU AdamW
  deepspeed       deepspeed.ops.adam.DeepSpeedCPUAdam on the same masters
                  (when deepspeed imports and its CPU Adam op builds)

For each: the optimizer time (from the end of the backward to the new
parameters on the GPU; for strata-overlap what the step exposes: its step
time less the baseline's) and the whole step, the median of the timed
steps, beside each other with the ratios; the last loss of each (they
train the same model the same way, so the losses agree to a few digits); and
the host-memory roof of the update (the bytes an in-place Adam pass moves
per parameter, at the copy bandwidth measured in the same run).

    bench/peers/offload_adam.py [--layers 24 --d-model 2048 --heads 16 --seq 2048
                                 --micro-batch 8 --steps 5 --warmup 2 --threads 0
                                 --workloads none,strata,strata-overlap,torch,deepspeed]

The defaults are GPT 1.3B (24 layers, d 2048, 16 heads, seq 2048, vocab
50304). Exits 77 (skipped) without torch or a CUDA device. strata is
imported from the installed package, else from this tree (python/, with
STRATA_LIB or build/lib/libstrata.so).
"""

import argparse
import gc
import math
import os
import statistics
import sys
import time

try:
    import torch
except ImportError as e:
    print("skipped: torch is not importable: %s" % e)
    sys.exit(77)

try:
    import strata
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
    import strata
import strata.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_torch import GPT  # noqa: E402  (next to this file: the model train_peers.py times too)

WORKLOADS = ["none", "strata", "strata-overlap", "torch", "deepspeed"]
LR, BETAS, EPS, WD = 3e-4, (0.9, 0.95), 1e-8, 0.1
VOCAB = 50304


# ---- the optimizers -----------------------------------------------------------


class OnCpu:
    """The usual optimizer-on-the-CPU loop around a torch optimizer class:
    fp32 masters and gradients in pinned host memory; step() copies the
    gradients down, steps, copies the parameters up, and waits."""

    def __init__(self, params, make):
        self.params = [p for p in params]
        self.masters = [torch.empty(p.shape, dtype=torch.float32, pin_memory=True) for p in self.params]
        for m, p in zip(self.masters, self.params):
            m.copy_(p.detach())
            m.requires_grad_(True)
            m.grad = torch.empty(p.shape, dtype=torch.float32, pin_memory=True)
        self.opt = make(self.masters)

    def step(self):
        for m, p in zip(self.masters, self.params):
            m.grad.copy_(p.grad, non_blocking=True)
        torch.cuda.synchronize()
        self.opt.step()
        with torch.no_grad():
            for m, p in zip(self.masters, self.params):
                p.copy_(m, non_blocking=True)
        torch.cuda.synchronize()

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def close(self):
        pass


def torch_adamw(params):
    try:
        return OnCpu(params, lambda ms: torch.optim.AdamW(ms, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                                          fused=True)), "AdamW(fused=True)"
    except (RuntimeError, TypeError, ValueError) as e:  # a torch without the fused CPU kernel
        print("torch: no fused CPU AdamW here (%s); foreach=True instead" % e)
        return OnCpu(params, lambda ms: torch.optim.AdamW(ms, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                                          foreach=True)), "AdamW(foreach=True)"


def deepspeed_adam(params):
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # raises where deepspeed is absent or its op cannot build
    return OnCpu(params, lambda ms: DeepSpeedCPUAdam(ms, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                                     adamw_mode=True)), "DeepSpeedCPUAdam"


class Strata:
    def __init__(self, model, params, threads, overlap):
        self.opt = strata.torch.OffloadAdam(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, threads=threads)
        self.overlap = overlap
        if overlap:
            self.opt.overlap_with(model)

    def step(self):
        self.opt.step()  # overlapped: returns at once (the next forward waits per layer)

    def zero_grad(self):
        self.opt.zero_grad()

    def close(self):
        self.opt.close()


# ---- the loop -----------------------------------------------------------------


def run(workload, args, data):
    torch.manual_seed(0)
    model = GPT(args.layers, args.d_model, args.heads, args.seq, VOCAB).to("cuda", torch.bfloat16)
    params = list(model.parameters())
    label = workload
    if workload == "none":
        opt = None
    elif workload in ("strata", "strata-overlap"):
        opt = Strata(model, params, args.threads, overlap=workload == "strata-overlap")
        label = "OffloadAdam" + (", overlapped" if opt.overlap else "")
    elif workload == "torch":
        opt, label = torch_adamw(params)
    else:
        opt, label = deepspeed_adam(params)
    steps, opts, losses = [], [], []
    torch.cuda.synchronize()
    end = time.perf_counter()
    for i, (x, y) in enumerate(data):
        loss = model(x, y)
        loss.backward()
        torch.cuda.synchronize()
        t_bwd = time.perf_counter()
        if opt is not None:
            opt.step()
            opt.zero_grad()
        else:
            for p in params:
                p.grad = None
        torch.cuda.synchronize()
        t_end = time.perf_counter()
        if i >= args.warmup:
            steps.append(t_end - end)
            opts.append(t_end - t_bwd)
        losses.append(loss.item())
        end = t_end
    if opt is not None:
        opt.close()
    n = sum(p.numel() for p in params)
    del model, params, opt
    gc.collect()
    torch.cuda.empty_cache()
    return {"label": label, "step": statistics.median(steps), "opt": statistics.median(opts),
            "loss": losses[-1], "params": n}


def host_copy_gbps():
    """Bytes read + written per second by a multi-threaded 2 GiB copy in host memory."""
    a = torch.ones(512 << 20, dtype=torch.float32)
    b = torch.empty_like(a)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() * 4 / best / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per workload")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="CPU Adam threads (0: all)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        return 77
    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            ap.error("unknown workload %r (known: %s)" % (w, ", ".join(WORKLOADS)))
    torch.set_num_threads(args.threads or os.cpu_count())
    g = torch.Generator().manual_seed(1)
    data = [tuple(torch.randint(0, VOCAB, (args.micro_batch, args.seq), generator=g).cuda() for _ in range(2))
            for _ in range(args.warmup + args.steps)]

    print("GPT: %d layers, d %d, %d heads, seq %d, micro-batch %d, bf16 on %s; torch %s, %d CPU threads"
          % (args.layers, args.d_model, args.heads, args.seq, args.micro_batch, torch.cuda.get_device_name(),
             torch.__version__, torch.get_num_threads()))
    results = {}
    for w in workloads:
        try:
            results[w] = run(w, args, data)
        except Exception as e:  # deepspeed absent or its op failing to build is a result, not a crash
            if w != "deepspeed":
                raise
            print("deepspeed: skipped: %s: %s" % (type(e).__name__, e))
            continue
        r = results[w]
        print("  %-16s step %.3f s, optimizer %.3f s, last loss %.4f" % (w, r["step"], r["opt"], r["loss"]))

    bw = host_copy_gbps()
    n = next(iter(results.values()))["params"] if results else 0
    roof = 28 * n / (bw * 1e9)  # master, m, v read and written, bf16 gradient read, bf16 parameter written
    base = results.get("none")
    ref = results.get("strata")
    print("\n%.3f G parameters; host copy %.1f GB/s, so an in-place Adam pass (28 B/parameter) takes >= %.3f s"
          % (n / 1e9, bw, roof))
    print("%-34s %12s %12s %14s %14s %12s" % ("workload", "optimizer s", "step s", "step/baseline",
                                             "opt/OffloadAdam", "opt/roof"))
    for w, r in results.items():
        opt = r["opt"] if w != "strata-overlap" or base is None else max(0.0, r["step"] - base["step"])
        if w == "none":
            cells = ("-", "%.3f" % r["step"], "1.00", "-", "-")
        else:
            cells = ("%.3f%s" % (opt, " exp" if w == "strata-overlap" else ""), "%.3f" % r["step"],
                     "%.2f" % (r["step"] / base["step"]) if base else "-",
                     "%.2f" % (opt / ref["opt"]) if ref and ref["opt"] > 0 else "-",
                     "%.2f" % (opt / roof) if roof > 0 else "-")
        print("%-34s %12s %12s %14s %14s %12s" % ((r["label"],) + cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
