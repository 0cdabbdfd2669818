#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's fused CPU AdamW on the same host, for `strata-bench adam`'s reader.

The host memory of the GPU machine's VM instances differs by up to 40% from
one instance to the next, so a peer figure from another day says little about
this instance. This measures torch.optim.AdamW(fused=True) on fp32 parameters,
gradients and state (DeepSpeed's configuration, as strata's: 28 B per
parameter moved) in the same session as `strata-bench adam`.

    scripts/peer-adam.py [--params 200M] [--threads 16] [--steps 5]

Prints G params/s and GB/s (28 B/param); needs PyTorch (not a strata
dependency: the GPU machine has it).
"""
import argparse
import sys
import time


def parse_count(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="200M")
    ap.add_argument("--threads", type=int, default=0, help="0 = torch's default")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("peer-adam: PyTorch is not installed here; nothing to compare", file=sys.stderr)
        return 1
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    n = parse_count(a.params)
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
    p.grad = torch.randn(n, dtype=torch.float32)
    opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1, fused=True)
    opt.step()  # allocates m and v
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    t = sorted(times)[len(times) // 2]
    print(f"peer: torch {torch.__version__} AdamW(fused=True) fp32, {a.params} params, "
          f"{torch.get_num_threads()} threads: {n / t / 1e9:.2f} G params/s, "
          f"{28 * n / t / 1e9:.1f} GB/s at 28 B/param (median of {a.steps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
