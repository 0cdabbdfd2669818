# SPDX-License-Identifier: Apache-2.0
"""python -m strata generate: strata generate with the model's own tokenizer.

A model whose directory holds a tokenizer.json (a Hugging Face model, or a
strata checkpoint of one: its step directories carry the tokenizer files)
takes and prints text here: the prompt is encoded with Hugging Face
`tokenizers` (PyPI: pip install tokenizers), the ids go to the `strata`
binary (`strata generate --tokens IDS --print-ids`), which runs the model
(on the GPU when there is one, with its KV cache) and prints each new id as
it is chosen, and the text is decoded as the ids arrive: each step prints
what the ids so far decode to beyond what was printed, holding back an
incomplete UTF-8 character (a byte-level BPE token can end inside one).

Why a front over the binary, not the C API: the generation engine (the
decoder, the backends, the model loading) is the binary's; libstrata.so's C
API exposes the tier store and the CPU Adam, not a model. The front stays a
thin, standard-library process wrapper and the binary stays the one
engine, whether run from here or from the shell.

The binary is $STRATA_BIN, `strata` on PATH, or the build tree's
(<repo>/build/bin/strata). Every other option is strata generate's.
"""

import argparse
import os
import shutil
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def strata_binary():
    """The strata binary to run, or None."""
    env = os.environ.get("STRATA_BIN")
    if env:
        return env
    found = shutil.which("strata")
    if found:
        return found
    tree = os.path.join(_HERE, "..", "..", "build", "bin", "strata")
    return os.path.abspath(tree) if os.path.exists(tree) else None


def model_dir(path):
    """The step directory a --save directory's `latest` names, else `path`."""
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            name = f.read().strip()
        if name and "/" not in name:
            return os.path.join(path, name)
    return path


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m strata generate",
        description="strata generate with the model's tokenizer.json (Hugging Face tokenizers): text in, text out.")
    p.add_argument("--model", required=True, metavar="DIR")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", metavar="TEXT")
    g.add_argument("--prompt-file", metavar="FILE")
    p.add_argument("--no-special-tokens", action="store_true",
                   help="encode the prompt without the tokenizer's special tokens (its post-processor)")
    return p


def _passed_on(extra):
    """strata generate's own options, given through; those this front sets are refused."""
    for a in extra:
        name = a.split("=", 1)[0]
        if name in ("--tokens", "--print-ids"):
            raise SystemExit("python -m strata generate: %s is set by this front; give --prompt or --prompt-file" % name)
    return list(extra)


class Decoder:
    """Incremental decoding: the new text of the ids so far, never half a character."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids = []
        self.printed = ""

    def push(self, token_id):
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next id
            return ""
        new = text[len(self.printed):] if text.startswith(self.printed) else text
        self.printed = text
        return new


def main(argv):
    args, extra = _parser().parse_known_args(argv)
    strata_args = _passed_on(extra)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("python -m strata generate: needs Hugging Face tokenizers (pip install tokenizers)", file=sys.stderr)
        return 2
    directory = model_dir(args.model)
    tok_path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(tok_path):
        print("python -m strata generate: %s has no tokenizer.json; a byte-level model takes text itself "
              "(strata generate --model %s --prompt ...)" % (directory, args.model), file=sys.stderr)
        return 2
    binary = strata_binary()
    if binary is None:
        print("python -m strata generate: no strata binary (set STRATA_BIN, put strata on PATH, or build it)",
              file=sys.stderr)
        return 2
    tokenizer = Tokenizer.from_file(tok_path)
    if args.prompt_file is not None:
        with open(args.prompt_file, encoding="utf-8") as f:
            prompt = f.read()
    else:
        prompt = args.prompt
    ids = tokenizer.encode(prompt, add_special_tokens=not args.no_special_tokens).ids
    if not ids:
        print("python -m strata generate: the prompt encodes to no tokens", file=sys.stderr)
        return 2
    cmd = [binary, "generate", "--model", args.model, "--tokens", ",".join(map(str, ids)), "--print-ids"] + strata_args
    out = sys.stdout
    out.write(prompt)
    out.flush()
    decoder = Decoder(tokenizer)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            line = line.strip()
            if not line:
                continue
            out.write(decoder.push(int(line)))
            out.flush()
        rc = proc.wait()
    out.write("\n")
    out.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
