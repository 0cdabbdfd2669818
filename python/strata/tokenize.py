# SPDX-License-Identifier: Apache-2.0
"""Text to a token file strata trains on, with a Hugging Face model's tokenizer.

    python -m strata.tokenize MODEL_DIR TEXT [TEXT ...] -o OUT.bin

MODEL_DIR is a model directory (or anything holding tokenizer.json); each
TEXT file is a document. The tokenizer is MODEL_DIR/tokenizer.json read by
Hugging Face `tokenizers` (pip install tokenizers), else
`transformers.AutoTokenizer` (for a directory with only vocab.json/merges.txt
or a sentencepiece model). Before each document goes the model's BOS token
(config.json's bos_token_id, else the tokenizer's), as llm.c separates
documents; --no-bos leaves it out, --bos-id N names another.

OUT is an llm.c token file (docs/training.md, engine/data.h): a 256 x int32
header, then the tokens as uint16 (magic 20240520, version 1) when every id
of the vocabulary fits in 16 bits (vocabularies up to 65536), else as uint32
(magic 20240801, version 7: what llm.c's dev/data/data_common.py writes for
Llama 3); --dtype forces one (uint16 with a larger vocabulary is an error).
Text is encoded in chunks of about 1 MiB ending at a line end, so memory
stays bounded; a token never spans such a boundary.

Run it as a module (python -m strata.tokenize): run as a file, its directory
would come first on sys.path and this module would hide the standard
library's `tokenize`.
"""

import argparse
import json
import os
import struct
import sys

UINT16 = (20240520, 1, "H", 2)
UINT32 = (20240801, 7, "I", 4)
HEADER_INTS = 256
CHUNK_BYTES = 1 << 20


class TokenizeError(Exception):
    """A problem with the inputs, said in a line."""


def _read_json(path):
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class _Tokenizer:
    """encode(text) -> ids, vocab_size, bos_id: over `tokenizers` or transformers."""

    def __init__(self, model_dir):
        path = os.path.join(model_dir, "tokenizer.json")
        self.name = path
        try:
            from tokenizers import Tokenizer
        except ImportError:
            Tokenizer = None
        if Tokenizer is not None and os.path.isfile(path):
            t = Tokenizer.from_file(path)
            self._encode = lambda text: t.encode(text, add_special_tokens=False).ids
            self.vocab_size = t.get_vocab_size(with_added_tokens=True)
            token = _read_json(os.path.join(model_dir, "tokenizer_config.json")).get("bos_token")
            if isinstance(token, dict):
                token = token.get("content")
            self.bos_id = t.token_to_id(token) if isinstance(token, str) else None
            return
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise TokenizeError("%s: no tokenizer.json readable with `tokenizers`, and transformers is not importable "
                                "(pip install tokenizers, or transformers)" % model_dir)
        t = AutoTokenizer.from_pretrained(model_dir)
        self.name = "%s (transformers %s)" % (model_dir, type(t).__name__)
        self._encode = lambda text: t(text, add_special_tokens=False)["input_ids"]
        self.vocab_size = len(t)
        self.bos_id = t.bos_token_id

    def encode(self, text):
        return self._encode(text)


def _chunks(path):
    """The text of `path` in pieces of about CHUNK_BYTES, each ending at a line end."""
    with open(path, encoding="utf-8") as f:
        buf = []
        size = 0
        for line in f:
            buf.append(line)
            size += len(line)
            if size >= CHUNK_BYTES:
                yield "".join(buf)
                buf, size = [], 0
        if buf:
            yield "".join(buf)


def _layout(dtype, vocab):
    if dtype == "auto":
        return UINT16 if vocab <= 1 << 16 else UINT32
    if dtype == "uint16":
        if vocab > 1 << 16:
            raise TokenizeError("--dtype uint16, but the vocabulary has %d ids (uint16 holds 65536)" % vocab)
        return UINT16
    return UINT32


def tokenize(model_dir, texts, out, dtype="auto", bos=True, bos_id=None, log=sys.stderr):
    """Writes the token file `out`; returns the number of tokens."""
    if not os.path.isdir(model_dir):
        raise TokenizeError("%s is not a model directory" % model_dir)
    tok = _Tokenizer(model_dir)
    config = _read_json(os.path.join(model_dir, "config.json"))
    vocab = max(tok.vocab_size, int(config.get("vocab_size") or 0))
    if bos and bos_id is None:
        bos_id = config.get("bos_token_id")
        if isinstance(bos_id, list):
            bos_id = bos_id[0] if bos_id else None
        if bos_id is None:
            bos_id = tok.bos_id
    if not bos:
        bos_id = None
    magic, version, code, width = _layout(dtype, vocab)
    limit = 1 << (8 * width)
    count = 0
    tmp = out + ".tmp.%d" % os.getpid()
    try:
        with open(tmp, "wb") as f:
            f.write(b"\0" * (4 * HEADER_INTS))
            for path in texts:
                ids = [bos_id] if bos_id is not None else []
                for chunk in _chunks(path):
                    ids.extend(tok.encode(chunk))
                    bad = next((i for i in ids if not 0 <= i < limit), None)
                    if bad is not None:
                        raise TokenizeError("%s: token id %d does not fit in uint%d" % (path, bad, 8 * width))
                    f.write(struct.pack("<%d%s" % (len(ids), code), *ids))
                    count += len(ids)
                    ids = []
                if count >= 1 << 31:
                    raise TokenizeError("more than 2^31 - 1 tokens: an llm.c header cannot count them; split the text")
            header = [0] * HEADER_INTS
            header[0], header[1], header[2] = magic, version, count
            f.seek(0)
            f.write(struct.pack("<%di" % HEADER_INTS, *header))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print("%s: %d tokens as uint%d (llm.c magic %d, version %d; vocabulary %d, tokenizer %s%s)"
          % (out, count, 8 * width, magic, version, vocab, tok.name,
             "" if bos_id is None else ", BOS %d before each document" % bos_id), file=log)
    return count


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m strata.tokenize", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", help="the model directory whose tokenizer to use (tokenizer.json, config.json)")
    p.add_argument("texts", nargs="+", help="UTF-8 text files, one document each")
    p.add_argument("-o", "--out", required=True, help="the token file to write")
    p.add_argument("--dtype", choices=["auto", "uint16", "uint32"], default="auto",
                   help="token width (auto: uint16 when the vocabulary fits)")
    p.add_argument("--no-bos", action="store_true", help="no BOS token before each document")
    p.add_argument("--bos-id", type=int, default=None, help="the token before each document (default: the model's BOS)")
    a = p.parse_args(argv)
    try:
        tokenize(a.model_dir, a.texts, a.out, a.dtype, not a.no_bos, a.bos_id)
    except (TokenizeError, OSError, ValueError) as e:
        print("strata.tokenize: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
