# SPDX-License-Identifier: Apache-2.0
"""bench/peers/train_peers.py at a tiny GPT on the CPU (eager): the table and
the JSON it writes, the loss of a fresh model, checkpointing that leaves the
arithmetic alone, a peer that cannot run here saying why in its row, and a
bad argument named. Run under a Python with torch (python/tests/python_with.sh);
the script path is the first argument."""

import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = None
TINY = ["--device", "cpu", "--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--vocab", "1000",
        "--micro-batch", "2"]


def run(*extra):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peers.json")
        p = subprocess.run([sys.executable, SCRIPT, *TINY, *extra, "--json", out], capture_output=True, text=True)
        doc = None
        if os.path.exists(out):
            with open(out) as f:
                doc = json.load(f)
    return p, doc


def row(doc, peer):
    return next(r for r in doc["rows"] if r["peer"] == peer)


class TrainPeers(unittest.TestCase):
    def test_eager_on_the_cpu_and_a_peer_that_cannot_run(self):
        p, doc = run("--steps", "2", "--warmup", "1", "--peers", "eager,deepspeed-zero3-offload")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("tokens/s", p.stdout)
        eager = row(doc, "eager")
        self.assertEqual(eager["status"], "ok", eager)
        self.assertEqual(len(eager["step_times_s"]), 2)
        # tokens/s is the micro-batch's tokens over the median step
        self.assertAlmostEqual(eager["tokens_per_s"], 2 * 32 / eager["step_s"], delta=1e-6 * eager["tokens_per_s"])
        # a fresh model (weights N(0, 0.02)) predicts about uniformly: the loss is near ln(vocab)
        self.assertLess(abs(eager["first_loss"] - math.log(1000)), 0.05 * math.log(1000), eager)
        self.assertNotIn("gpu_peak_bytes", eager)  # no GPU: no GPU figure
        ds = row(doc, "deepspeed-zero3-offload")
        self.assertTrue(ds["status"].startswith("skipped: "), ds)
        self.assertIn("deepspeed-zero3-offload", p.stdout)
        self.assertEqual(doc["shape"]["checkpoint"], "all-but-last")

    def test_checkpointing_changes_no_arithmetic(self):
        # The update makes the second step's loss depend on the gradients: the
        # recomputed backward must give what the kept activations give.
        losses = {}
        for mode in ("none", "all"):
            p, doc = run("--steps", "2", "--warmup", "0", "--step", "train", "--clip", "1", "--checkpoint", mode,
                         "--dtype", "f32")
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            r = row(doc, "eager")
            self.assertEqual(r["status"], "ok", r)
            self.assertIn("AdamW", r["what"])
            losses[mode] = (r["first_loss"], r["loss"])
        self.assertNotEqual(losses["none"][0], losses["none"][1], "the update changed nothing")
        for a, b in zip(losses["none"], losses["all"]):
            self.assertAlmostEqual(a, b, places=4)

    def test_a_bad_peer_is_named(self):
        p, _ = run("--peers", "eager,megatron")
        self.assertEqual(p.returncode, 2)
        self.assertIn("megatron", p.stderr)


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    unittest.main(verbosity=2)
