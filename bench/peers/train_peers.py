#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a user would run instead of strata, on strata's GPT shape, timed the
same way: tokens/s (the median of the timed steps after the warm-up) and the
GPU peak memory of each peer, in one run.

Peers (`--peers`, comma-separated; default all on CUDA, eager on the CPU):
  eager                    PyTorch eager, the whole model on the GPU
  compile                  the same under torch.compile (its compilation in the warm-up)
  fsdp2-offload            PyTorch FSDP2: fully_shard per block and at the root with
                           CPUOffloadPolicy (parameters, gradients and AdamW on the
                           host, fp32) and MixedPrecisionPolicy(bf16); world size 1
  deepspeed-zero3-offload  DeepSpeed ZeRO-3, offload_param and offload_optimizer to
                           the CPU (pinned), DeepSpeedCPUAdam; world size 1
  deepspeed-zero2-offload  DeepSpeed ZeRO-2, offload_optimizer to the CPU

`--step fwd-bwd` times forward + backward only (what `strata-bench train
--resident` times); `--step train` adds gradient clipping (`--clip`, 0: none)
and the AdamW update (what `strata-bench train --workload` times). The
offload peers always take the update: their engines offload its state, and
DeepSpeed has no step without its optimizer; the table's `step` column says
what each row timed. `--checkpoint` picks the per-layer activation
checkpointing (bench/peers/gpt_torch.py): all-but-last, the default, is
strata's own recompute (every block's input kept, the block recomputed in
the backward, the last block's internals kept), so both sides do the same
arithmetic; `all` matches `strata-bench train --recompute-last`; `none`
keeps every activation (faster where it fits, but not strata's workload).

Each peer runs in a child process of its own, so that its GPU peak is its
own and a peer that cannot run (not importable, out of memory, killed by
the kernel for host memory) leaves its reason in its row rather than
stopping the others. The table goes to stdout, `--json FILE` writes the
rows. Exits 77 without torch, 1 when no peer ran, else 0.

    bench/peers/train_peers.py [--layers 24 --d-model 2048 --heads 16 --seq 2048 --vocab 50257
        --micro-batch 8 --accum 1 --steps 10 --warmup 3 --step fwd-bwd --checkpoint all-but-last
        --dtype bf16 --clip 0 --device cuda --peers LIST --json FILE]
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import torch
except ImportError as e:
    print("skipped: torch is not importable: %s" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch  # noqa: E402  (next to this file)

PEERS = ["eager", "compile", "fsdp2-offload", "deepspeed-zero3-offload", "deepspeed-zero2-offload"]
LR, BETAS, EPS, WD = 1e-4, (0.9, 0.95), 1e-8, 0.1  # strata-bench train's workloads
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


class Skip(Exception):
    """The peer cannot run here; the message says why."""


# ---- one peer, in its own process ------------------------------------------------


def batch(args, device):
    g = torch.Generator().manual_seed(1234)
    x = torch.randint(0, args.vocab, (args.micro_batch, args.seq), generator=g)
    y = torch.cat([x[:, 1:], torch.full((args.micro_batch, 1), -1, dtype=x.dtype)], dim=1)  # none after the last
    return x.to(device), y.to(device)


def make_model(args):
    torch.manual_seed(0)
    return gpt_torch.GPT(args.layers, args.d_model, args.heads, args.seq, args.vocab, args.checkpoint)


class AdamW:
    """torch's AdamW, fused where this torch has it for the parameters (the fastest; a torch
    without it refuses at construction or at the first step), else foreach. `kind` says which."""

    def __init__(self, params):
        self.params = params
        self.note = None
        try:
            self.opt = self._make(fused=True)
            self.kind = "fused"
        except (RuntimeError, TypeError, ValueError) as e:
            self.opt = self._make(foreach=True)
            self.kind, self.note = "foreach", "no fused AdamW here: %s" % str(e).split("\n")[0][:200]
        self.stepped = False

    def _make(self, **impl):
        return torch.optim.AdamW(self.params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **impl)

    def step(self):
        if self.kind == "fused" and not self.stepped:
            try:
                self.opt.step()
            except RuntimeError as e:  # before any state was kept: start again with foreach
                self.opt = self._make(foreach=True)
                self.kind, self.note = "foreach", "fused AdamW failed: %s" % str(e).split("\n")[0][:200]
                self.opt.step()
        else:
            self.opt.step()
        self.stepped = True

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)


class Plain:
    """eager and compile: the model on the device in --dtype; the update (train) by AdamW there."""

    def __init__(self, args, device, compiled):
        self.model = make_model(args).to(device, DTYPES[args.dtype])
        self.params = list(self.model.parameters())
        self.train = args.step == "train"
        self.clip = args.clip
        self.opt = AdamW(self.params) if self.train else None
        self.forward = self.model
        if compiled:
            if not hasattr(torch, "compile"):
                raise Skip("torch %s has no torch.compile (2.0 and later)" % torch.__version__)
            self.forward = torch.compile(self.model)
        self.device = device

    @property
    def what(self):
        return ("fwd+bwd+AdamW(%s)" % self.opt.kind if self.train else "fwd+bwd") + ", all on the " + ("GPU" if self.device == "cuda" else "CPU")

    def micro(self, x, y, scale):
        loss = self.forward(x, y)
        (loss * scale).backward()
        return loss

    def step(self):
        if self.train:
            if self.clip > 0:
                torch.nn.utils.clip_grad_norm_(self.params, self.clip)
            self.opt.step()
        for p in self.params:
            p.grad = None


def local_process_group():
    """World size 1 on this machine: a TCP store on a free loopback port, NCCL."""
    import torch.distributed as dist

    if not dist.is_available():
        raise Skip("torch.distributed is not available in this torch build")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    torch.cuda.set_device(0)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl", rank=0, world_size=1)


class Fsdp2:
    """FSDP2 with CPUOffloadPolicy: fp32 parameters sharded (world size 1: whole) in pinned host
    memory, gathered to the GPU in bf16 per block; gradients and AdamW on the host."""

    def __init__(self, args):
        try:
            from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        except ImportError:
            try:
                from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
            except ImportError as e:
                raise Skip("torch %s has no FSDP2 fully_shard with CPUOffloadPolicy (2.4 and later): %s"
                           % (torch.__version__, e))
        local_process_group()
        self.model = make_model(args)
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[args.dtype], reduce_dtype=torch.float32)
        for blk in self.model.blocks:
            fully_shard(blk, mp_policy=mp, offload_policy=CPUOffloadPolicy())
        fully_shard(self.model, mp_policy=mp, offload_policy=CPUOffloadPolicy())
        self.params = list(self.model.parameters())
        self.opt = AdamW(self.params)
        self.clip = args.clip

    @property
    def what(self):
        return "fwd+bwd+AdamW(%s) on the CPU, FSDP2 CPUOffloadPolicy" % self.opt.kind

    def micro(self, x, y, scale):
        loss = self.model(x, y)
        (loss * scale).backward()
        return loss

    def step(self):
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        self.opt.zero_grad()


def deepspeed_config(args, stage):
    zero = {"stage": stage, "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True, "contiguous_gradients": True}
    if stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.accum,
        "train_batch_size": args.micro_batch * args.accum,
        "bf16": {"enabled": args.dtype == "bf16"},
        "fp16": {"enabled": args.dtype == "f16"},
        "gradient_clipping": args.clip,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD}},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


class DeepSpeed:
    """deepspeed.initialize with a config dict: ZeRO-2 or ZeRO-3, optimizer (and for 3 the
    parameters) offloaded to the CPU; the engine scales for accumulation and steps at its boundary."""

    def __init__(self, args, stage):
        try:
            import deepspeed
        except Exception as e:  # ImportError, or a deepspeed that fails on import (its ops, its torch)
            raise Skip("deepspeed is not importable: %s: %s" % (type(e).__name__, e))
        local_process_group()
        deepspeed.init_distributed(dist_backend="nccl")
        model = make_model(args)
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                    config=deepspeed_config(args, stage))
        self.what = "fwd+bwd+DeepSpeedCPUAdam, ZeRO-%d, %s offloaded to the CPU" % (
            stage, "parameters and optimizer" if stage == 3 else "optimizer")

    def micro(self, x, y, scale):
        loss = self.engine(x, y)
        self.engine.backward(loss)
        self.engine.step()  # a no-op off the accumulation boundary
        return loss

    def step(self):
        pass


def make_peer(name, args, device):
    if name in ("eager", "compile"):
        return Plain(args, device, compiled=name == "compile")
    if name == "fsdp2-offload":
        return Fsdp2(args)
    return DeepSpeed(args, 3 if name == "deepspeed-zero3-offload" else 2)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run_one(name, args):
    """Times peer `name`; returns its row."""
    device = args.device
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    peer = make_peer(name, args, device)
    x, y = batch(args, device)
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(args.accum):
            loss = peer.micro(x, y, 1.0 / args.accum)
        peer.step()
        sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()))
        print("  %s step %d: loss %.4f, %.3f s" % (name, i, losses[-1], time.perf_counter() - t0),
              file=sys.stderr, flush=True)
    step_s = statistics.median(times)
    opt = getattr(peer, "opt", None)
    row = {"peer": name, "status": "ok", "what": peer.what, "tokens_per_s": args.micro_batch * args.seq * args.accum
           / step_s, "step_s": step_s, "step_times_s": times, "first_loss": losses[0], "loss": losses[-1]}
    if opt is not None and opt.note:
        row["note"] = opt.note
    if device == "cuda":
        free, total = torch.cuda.mem_get_info()
        row.update(gpu_peak_bytes=torch.cuda.max_memory_allocated(), gpu_reserved_bytes=torch.cuda.max_memory_reserved(),
                   device_in_use_bytes=total - free)
    return row


def child_main(args):
    try:
        row = run_one(args.run_one, args)
    except Skip as e:
        row = {"peer": args.run_one, "status": "skipped: %s" % e}
    except Exception as e:  # out of memory, a CUDA or NCCL error: the peer's result, not a crash
        row = {"peer": args.run_one, "status": "failed: %s: %s" % (type(e).__name__, str(e).split("\n")[0][:300])}
    with open(args.result, "w") as f:
        json.dump(row, f)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return 0


# ---- the parent: one child per peer, the table ------------------------------------


def child_args(args, name, result):
    keep = ["layers", "d_model", "heads", "seq", "vocab", "micro_batch", "accum", "steps", "warmup", "step",
            "checkpoint", "dtype", "clip", "device"]
    out = [sys.executable, os.path.abspath(__file__), "--run-one", name, "--result", result]
    for k in keep:
        out += ["--" + k.replace("_", "-"), str(getattr(args, k))]
    return out


def died(rc, name):
    if rc < 0:
        sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
        hint = " (SIGKILL: the kernel's out-of-memory killer, host memory?)" if -rc == signal.SIGKILL else ""
        return "failed: killed by %s%s" % (sig, hint)
    return "failed: the %s process exited %d without a result" % (name, rc)


def run_peer(args, name):
    if args.device == "cpu" and name != "eager":
        return {"peer": name, "status": "skipped: --device cpu measures eager only"}
    with tempfile.TemporaryDirectory(prefix="strata-peers.") as tmp:
        result = os.path.join(tmp, "row.json")
        try:
            rc = subprocess.run(child_args(args, name, result), timeout=args.peer_timeout or None).returncode
        except subprocess.TimeoutExpired:
            return {"peer": name, "status": "failed: still running after --peer-timeout %d s" % args.peer_timeout}
        if not os.path.exists(result):
            return {"peer": name, "status": died(rc, name)}
        with open(result) as f:
            return json.load(f)


def gib(b):
    return "%.1f GiB" % (b / 2**30) if b is not None else "-"


def print_table(rows):
    print("%-24s %10s %10s %10s %9s  %s" % ("peer", "tokens/s", "step ms", "GPU peak", "loss", "status / what"))
    for r in rows:
        if r["status"] == "ok":
            print("%-24s %10.0f %10.1f %10s %9.4f  %s" % (r["peer"], r["tokens_per_s"], 1e3 * r["step_s"],
                                                         gib(r.get("gpu_peak_bytes")), r["loss"], r["what"]))
        else:
            print("%-24s %10s %10s %10s %9s  %s" % (r["peer"], "-", "-", "-", "-", r["status"]))
    for r in rows:
        if r.get("note"):
            print("  %s: %s" % (r["peer"], r["note"]))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=50257, help="padded to a multiple of 128 as strata pads it")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per timed step")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (the median is reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (torch.compile compiles here)")
    ap.add_argument("--step", choices=["fwd-bwd", "train"], default="fwd-bwd")
    ap.add_argument("--checkpoint", choices=gpt_torch.CHECKPOINT_MODES, default="all-but-last")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--clip", type=float, default=0.0, help="gradient clipping in --step train (0: none)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--peers", default=None, help="comma-separated, of: " + ", ".join(PEERS))
    ap.add_argument("--peer-timeout", type=int, default=0, help="seconds per peer (0: none)")
    ap.add_argument("--json", default=None, metavar="FILE")
    ap.add_argument("--run-one", choices=PEERS, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for flag, v, lo in (("--layers", args.layers, 1), ("--d-model", args.d_model, 1), ("--heads", args.heads, 1),
                        ("--seq", args.seq, 1), ("--vocab", args.vocab, 2), ("--micro-batch", args.micro_batch, 1),
                        ("--accum", args.accum, 1), ("--steps", args.steps, 1), ("--warmup", args.warmup, 0)):
        if v < lo:
            ap.error("%s %d: must be at least %d" % (flag, v, lo))
    if args.d_model % args.heads:
        ap.error("--d-model %d: must be a multiple of --heads %d" % (args.d_model, args.heads))
    if args.clip < 0:
        ap.error("--clip %g: must be at least 0" % args.clip)
    names = [p for p in (args.peers or ("eager" if args.device == "cpu" else ",".join(PEERS))).split(",") if p]
    for p in names:
        if p not in PEERS:
            ap.error("--peers: unknown peer %r (known: %s)" % (p, ", ".join(PEERS)))
    args.peer_names = names
    return args


def main(argv):
    args = parse_args(argv)
    if args.run_one:
        return child_main(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        why = "torch %s sees no CUDA device (--device cpu measures eager on the CPU)" % torch.__version__
        print("skipped: " + why)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"command": "train_peers", "skipped": why, "rows": []}, f)
        return 77
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print("peers: GPT %d layers, d %d, %d heads, seq %d, vocab %d (padded %d), micro-batch %d x %d, %s, "
          "checkpoint %s, --step %s; %s; torch %s; median of %d steps after %d"
          % (args.layers, args.d_model, args.heads, args.seq, args.vocab, gpt_torch.padded_vocab(args.vocab),
             args.micro_batch, args.accum, args.dtype, args.checkpoint, args.step, device_name, torch.__version__,
             args.steps, args.warmup), flush=True)
    rows = []
    try:
        for name in args.peer_names:
            rows.append(run_peer(args, name))
    except KeyboardInterrupt:  # Ctrl-C reaches the child too; what was measured is still printed
        print("stopped by Ctrl-C after %d of %d peers" % (len(rows), len(args.peer_names)), file=sys.stderr)
        print_table(rows)
        return 130
    print_table(rows)
    if args.json:
        shape = {k: getattr(args, k) for k in ("layers", "d_model", "heads", "seq", "vocab", "micro_batch", "accum",
                                               "step", "checkpoint", "dtype", "clip", "steps", "warmup")}
        with open(args.json, "w") as f:
            json.dump({"command": "train_peers", "device": device_name, "torch": torch.__version__, "shape": shape,
                       "rows": rows}, f, indent=1)
    if not any(r["status"] == "ok" for r in rows):
        print("no peer ran", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
