# SPDX-License-Identifier: Apache-2.0
"""python -m strata generate: a GPT-2-shaped model directory with a
tokenizer.json (a byte-level BPE trained here with Hugging Face tokenizers
on the bundled corpus; weights drawn with a fixed seed, written as
safetensors), run through the front: the text it prints is the prompt and
then the tokenizer's decoding of the ids the binary chose, the same for a
seed, other for another; what it cannot do is an error that says why.

Needs tokenizers (CTest runs it under a Python that has it) and the strata
binary ($STRATA_BIN).
"""

import array
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

L, C, H, T = 2, 64, 4, 64


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        data = array.array("f", values).tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def make_model(directory, tokenizer):
    V = tokenizer.get_vocab_size()
    rng = random.Random(5)

    def normal(n, std=0.3):
        return [rng.gauss(0, std) for _ in range(n)]

    t = {"transformer.wte.weight": ([V, C], normal(V * C)), "transformer.wpe.weight": ([T, C], normal(T * C, 0.1))}
    for l in range(L):
        p = "transformer.h.%d." % l
        t[p + "ln_1.weight"] = ([C], [1.0] * C)
        t[p + "ln_1.bias"] = ([C], [0.0] * C)
        t[p + "attn.c_attn.weight"] = ([C, 3 * C], normal(3 * C * C, 0.1))
        t[p + "attn.c_attn.bias"] = ([3 * C], [0.0] * (3 * C))
        t[p + "attn.c_proj.weight"] = ([C, C], normal(C * C, 0.1))
        t[p + "attn.c_proj.bias"] = ([C], [0.0] * C)
        t[p + "ln_2.weight"] = ([C], [1.0] * C)
        t[p + "ln_2.bias"] = ([C], [0.0] * C)
        t[p + "mlp.c_fc.weight"] = ([C, 4 * C], normal(4 * C * C, 0.1))
        t[p + "mlp.c_fc.bias"] = ([4 * C], [0.0] * (4 * C))
        t[p + "mlp.c_proj.weight"] = ([4 * C, C], normal(4 * C * C, 0.1))
        t[p + "mlp.c_proj.bias"] = ([C], [0.0] * C)
    t["transformer.ln_f.weight"] = ([C], [1.0] * C)
    t["transformer.ln_f.bias"] = ([C], [0.0] * C)
    write_safetensors(os.path.join(directory, "model.safetensors"), t)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_embd": C,
                   "n_head": H, "n_positions": T, "vocab_size": V}, f)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    with open(os.path.join(REPO, "data", "kjv.txt"), encoding="utf-8") as f:
        text = f.read(200000)
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    return tok


class GenerateFront(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.binary = os.environ.get("STRATA_BIN")
        if not cls.binary:
            raise unittest.SkipTest("STRATA_BIN is not set (CTest sets it to the strata binary)")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        cls.tokenizer = train_tokenizer()
        make_model(cls.dir, cls.tokenizer)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def front(self, *args):
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
        return subprocess.run([sys.executable, "-m", "strata", "generate", "--model", self.dir] + list(args),
                              capture_output=True, text=True, env=env, timeout=120)

    def test_text_is_the_prompt_and_the_decoded_ids(self):
        prompt = "And God said, Let there be light"
        r = self.front("--prompt", prompt, "--max-new-tokens", "12", "--seed", "3", "--backend", "cpu")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith(prompt), r.stdout)
        self.assertIn("12 new tokens", r.stderr)
        ids = self.tokenizer.encode(prompt).ids
        direct = subprocess.run([self.binary, "generate", "--model", self.dir, "--tokens", ",".join(map(str, ids)),
                                 "--print-ids", "--max-new-tokens", "12", "--seed", "3", "--backend", "cpu"],
                                capture_output=True, text=True, timeout=120)
        self.assertEqual(direct.returncode, 0, direct.stderr)
        new = [int(x) for x in direct.stdout.split()]
        self.assertEqual(len(new), 12)
        self.assertEqual(r.stdout, prompt + self.tokenizer.decode(new) + "\n")

    def test_a_seed_gives_the_same_text_and_another_seed_other_text(self):
        a = self.front("--prompt", "In the beginning", "--max-new-tokens", "20", "--seed", "1", "--backend", "cpu")
        b = self.front("--prompt", "In the beginning", "--max-new-tokens", "20", "--seed", "1", "--backend", "cpu")
        c = self.front("--prompt", "In the beginning", "--max-new-tokens", "20", "--seed", "2", "--backend", "cpu")
        self.assertEqual(a.returncode, 0, a.stderr)
        self.assertEqual(a.stdout, b.stdout)
        self.assertNotEqual(a.stdout, c.stdout)

    def test_what_it_cannot_do_says_why(self):
        r = self.front("--prompt", "x", "--tokens", "1")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--tokens is set by this front", r.stderr)
        r = self.front("--prompt", "x", "--temprature", "0")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("did you mean --temperature?", r.stderr)
        with tempfile.TemporaryDirectory() as empty:
            env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
            r = subprocess.run([sys.executable, "-m", "strata", "generate", "--model", empty, "--prompt", "x"],
                               capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("has no tokenizer.json", r.stderr)
        # Text straight to the binary names the front.
        d = subprocess.run([self.binary, "generate", "--model", self.dir, "--prompt", "x"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(d.returncode, 2)
        self.assertIn("python -m strata generate", d.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
