# SPDX-License-Identifier: Apache-2.0
"""strata.tokenize: text and a model directory's tokenizer.json to an llm.c
token file, uint16 for a vocabulary that fits (magic 20240520, version 1),
uint32 past 65536 ids (magic 20240801, version 7), the model's BOS before
each document. Needs Hugging Face `tokenizers` (exits 77, skipped, without it:
python_with.sh picks a Python that has it)."""
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from strata import tokenize as st


def make_model(dirname, vocab, bos_id=None):
    """A word-level tokenizer of `vocab` words w0..w<vocab-1> in a model directory."""
    os.makedirs(dirname)
    t = Tokenizer(WordLevel({"w%d" % i: i for i in range(vocab)}, unk_token="w0"))
    t.pre_tokenizer = Whitespace()
    t.save(os.path.join(dirname, "tokenizer.json"))
    config = {"vocab_size": vocab}
    if bos_id is not None:
        config["bos_token_id"] = bos_id
    with open(os.path.join(dirname, "config.json"), "w") as f:
        json.dump(config, f)
    return t


def read_token_file(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    width = {20240520: 2, 20240801: 4}[header[0]]
    body = data[1024:]
    assert len(body) == width * header[2], (len(body), header[2])
    return header[0], header[1], list(struct.unpack("<%d%s" % (header[2], "H" if width == 2 else "I"), body))


class TokenizeTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="strata-tokenize-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def text(self, name, words):
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(words)
        return path

    def test_a_small_vocabulary_gives_uint16(self):
        tok = make_model(os.path.join(self.dir, "m"), 300, bos_id=7)
        a = self.text("a.txt", "w1 w2 w299\nw3\n")
        b = self.text("b.txt", "w5 w6")
        out = os.path.join(self.dir, "out.bin")
        n = st.tokenize(os.path.join(self.dir, "m"), [a, b], out, log=io.StringIO())
        magic, version, ids = read_token_file(out)
        self.assertEqual((magic, version), (20240520, 1))
        want = [7] + tok.encode("w1 w2 w299\nw3\n").ids + [7] + tok.encode("w5 w6").ids
        self.assertEqual(ids, want)
        self.assertEqual(ids, [7, 1, 2, 299, 3, 7, 5, 6])
        self.assertEqual(n, len(ids))

    def test_a_large_vocabulary_gives_uint32_as_llmc_writes_for_llama3(self):
        make_model(os.path.join(self.dir, "m"), 70000)
        a = self.text("a.txt", "w1 w69999 w65536 w65535")
        out = os.path.join(self.dir, "out.bin")
        st.tokenize(os.path.join(self.dir, "m"), [a], out, log=io.StringIO())
        magic, version, ids = read_token_file(out)
        self.assertEqual((magic, version), (20240801, 7))
        self.assertEqual(ids, [1, 69999, 65536, 65535])  # no BOS: the model has none
        # uint16 cannot hold them: an error, and no file left behind.
        out16 = os.path.join(self.dir, "out16.bin")
        with self.assertRaises(st.TokenizeError):
            st.tokenize(os.path.join(self.dir, "m"), [a], out16, dtype="uint16", log=io.StringIO())
        self.assertFalse(os.path.exists(out16))
        self.assertEqual(os.listdir(self.dir).count("out16.bin.tmp.%d" % os.getpid()), 0)

    def test_the_command_line(self):
        make_model(os.path.join(self.dir, "m"), 300, bos_id=0)
        a = self.text("a.txt", "w9 w8")
        out = os.path.join(self.dir, "out.bin")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        r = subprocess.run([sys.executable, "-m", "strata.tokenize", os.path.join(self.dir, "m"), a, "-o", out,
                            "--no-bos", "--dtype", "uint32"], env=env, stderr=subprocess.PIPE, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 tokens as uint32", r.stderr)
        self.assertEqual(read_token_file(out), (20240801, 7, [9, 8]))
        r = subprocess.run([sys.executable, "-m", "strata.tokenize", os.path.join(self.dir, "nope"), a, "-o", out],
                           env=env, stderr=subprocess.PIPE, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("nope", r.stderr)


if __name__ == "__main__":
    unittest.main()
