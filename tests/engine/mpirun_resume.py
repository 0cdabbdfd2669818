#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A checkpoint saved by 2 ranks resumes at 3 ranks (and at 1) and continues
the run of one rank (CTest's engine.mpirun_resume; strata train under
mpirun on loopback, as a user runs it).

The global batch is the same at every world size: 6 samples per
micro-batch step (micro 6 x 1 rank, 3 x 2 ranks, 2 x 3 ranks), so the
sample sequence is too (docs/training.md, Several ranks). The resumed
steps' losses must match the uninterrupted one-rank run's within fp32
reduction-order tolerance (relative 1e-6; about 1e-8 is seen).

With a ZeRO stage (>= 1 partitions the state across the ranks), every run
uses it: the 2-rank checkpoint (each rank's slices in its own file) is
resharded into 3 slices, or 1.

usage: mpirun_resume.py MPIEXEC STRATA [ZERO_STAGE]
"""
import json
import os
import subprocess
import sys
import tempfile

TOL = 1e-6
STEPS, SAVE_AT, GLOBAL = 4, 2, 6


def config(path, ranks, stage):
    with open(path, "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": GLOBAL // ranks, "gradient_accumulation_steps": 2,
                   "steps_per_print": 1, "gradient_clipping": 1.0, "zero_optimization": {"stage": stage},
                   "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "seq_len": 32},
                   "trainer": {"steps": STEPS, "eval_interval": 0, "eval_batches": 1}}, f)


def train(mpiexec, strata, ranks, cfg, log, extra):
    cmd = [strata, "train", "--backend", "cpu", "--threads", "1", "--config", cfg, "--log-json", log] + extra
    if ranks > 1:
        flags = ["--oversubscribe", "-n", str(ranks), "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
                 "--mca", "oob_tcp_if_include", "lo"]
        if os.geteuid() == 0:
            flags.append("--allow-run-as-root")
        cmd = [mpiexec] + flags + cmd
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    print("$ " + " ".join(cmd) + "\n" + r.stdout)
    if r.returncode != 0:
        sys.exit(f"mpirun_resume.py: {ranks} rank(s) exited {r.returncode}")


def losses(log):
    out = {}
    with open(log) as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "step":
                out[j["step"]] = j["loss"]
    return out


def main():
    mpiexec, strata = sys.argv[1], sys.argv[2]
    stage = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    with tempfile.TemporaryDirectory() as d:
        cfgs = {n: os.path.join(d, f"config{n}.json") for n in (1, 2, 3)}
        for n, p in cfgs.items():
            config(p, n, stage)
        want = os.path.join(d, "one.jsonl")
        train(mpiexec, strata, 1, cfgs[1], want, [])
        ckpt = os.path.join(d, "ckpt")
        train(mpiexec, strata, 2, cfgs[2], os.path.join(d, "two.jsonl"), ["--save", ckpt, "--steps", str(SAVE_AT)])
        # Partitioned, each rank wrote its own slices (engine/checkpoint.h);
        # unpartitioned, rank 0 the whole state.
        step_dir = os.path.join(ckpt, f"step-{SAVE_AT:06d}")
        state = sorted(f for f in os.listdir(step_dir) if f.startswith(("zero-rank-", "master.", "optimizer.")))
        expect = (["zero-rank-00000-of-00002.safetensors", "zero-rank-00001-of-00002.safetensors"] if stage >= 1
                  else ["master.safetensors", "optimizer.safetensors"])
        if state != expect:
            sys.exit(f"mpirun_resume.py: the 2-rank checkpoint holds {state}, expected {expect}")
        ref = losses(want)
        bad = []
        for n in (3, 1):
            log = os.path.join(d, f"resumed{n}.jsonl")
            # The micro batch differs from the checkpoint's (3): a change that
            # keeps the samples but not every bit, so it must be allowed.
            train(mpiexec, strata, n, cfgs[n], log, ["--resume", ckpt, "--allow-config-change"])
            got = losses(log)
            if sorted(got) != list(range(SAVE_AT + 1, STEPS + 1)):
                bad.append(f"resumed at {n} rank(s) logged steps {sorted(got)}")
            for s, loss in got.items():
                rel = abs(loss - ref[s]) / ref[s]
                print(f"resumed at {n} rank(s): step {s} loss {loss:.6f}, one rank {ref[s]:.6f} (relative {rel:.1e})")
                if rel > TOL:
                    bad.append(f"step {s} at {n} rank(s): {loss} vs {ref[s]}")
        if bad:
            sys.exit("mpirun_resume.py: " + "; ".join(bad))
    print(f"mpirun_resume.py: the 2-rank checkpoint (ZeRO stage {stage}) continued the one-rank run at 3 ranks and at 1")


if __name__ == "__main__":
    main()
