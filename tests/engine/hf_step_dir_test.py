# SPDX-License-Identifier: Apache-2.0
"""A step directory of `strata train` as Hugging Face loads it.

Fine-tunes (--init-from a model directory that has a tokenizer) and loads
the step directory it saved with AutoConfig, GenerationConfig and
AutoTokenizer, and, where torch is importable, AutoModelForCausalLM (its
weights those of model.safetensors, a forward pass on the tokenizer's ids),
then sharded fp32 and bf16 weights (trainer.save_dtype,
save_max_shard_size) giving strata's validation loss in transformers.

Usage: hf_step_dir_test.py STRATA_BINARY. Exits 77 (CTest: skipped), saying
why, when transformers is not importable.
"""
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import transformers
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig, GPT2TokenizerFast
except ImportError as e:  # pragma: no cover - the machine lacks it
    print("skipped: transformers is not importable here (%s); pip install transformers to run this test" % e)
    sys.exit(77)

try:
    import torch
    from transformers import AutoModelForCausalLM
except ImportError:
    torch = None

VOCAB = 257  # the 256 bytes and <|endoftext|>
EOS = 256


def bytes_to_unicode():
    """GPT-2's byte <-> printable character table (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


# STRATA_TEST_BACKEND=cuda runs the same checks on the CUDA backend (the GPU
# machine's check of the Llama round trip); CI runs the CPU backend.
BACKEND = os.environ.get("STRATA_TEST_BACKEND", "cpu")


def run(strata, *args):
    r = subprocess.run([strata, "train", "--backend", BACKEND, "--threads", "2"] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout)
        raise SystemExit("strata train %s exited %d" % (" ".join(args), r.returncode))
    return r.stdout


KJV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "kjv.txt")


def check_loss(strata, work, dtype, rel):
    """Sharded weights in `dtype` (trainer.save_dtype) load in transformers and
    give strata's validation loss on the same batches: exactly (to fp32
    rounding) from fp32 weights, within `rel` from bf16 ones (the masters
    rounded; strata evaluates the fp32 masters)."""
    import torch.nn.functional as F
    B, T, V, batches = 4, 32, 256, 2
    config = os.path.join(work, "loss-%s.json" % dtype)
    with open(config, "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": B,
                   "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": V, "seq_len": T},
                   "data": {"path": KJV, "val_fraction": 0.05},
                   "trainer": {"save_dtype": dtype, "save_max_shard_size": "64KB", "eval_batches": batches}}, f)
    save, log = os.path.join(work, "loss-" + dtype), os.path.join(work, "loss-%s.jsonl" % dtype)
    run(strata, "--config", config, "--steps", "3", "--save", save, "--log-json", log)
    with open(log) as f:
        strata_loss = [r for r in map(json.loads, f) if r.get("type") == "val"][-1]["val_loss"]
    step = os.path.join(save, "step-000003")
    index = json.load(open(os.path.join(step, "model.safetensors.index.json")))
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and not os.path.exists(os.path.join(step, "model.safetensors")), files
    model = AutoModelForCausalLM.from_pretrained(step, torch_dtype=torch.float32).eval()
    x, y = val_batches(T, B, batches)
    with torch.no_grad():
        logits = model(x).logits.double()
    hf_loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)).item()
    print("%s weights in %d shards: transformers' loss %.6f, strata's %.6f" % (dtype, len(files), hf_loss, strata_loss))
    assert abs(hf_loss - strata_loss) <= rel * strata_loss, (dtype, hf_loss, strata_loss)


def held_out():
    """The bytes strata validates on with data.val_fraction 0.05: the last 5%."""
    data = open(KJV, "rb").read()
    return data[len(data) - int(len(data) * 0.05):]


def val_batches(T, B, batches):
    """The validation batches as strata draws them (engine/data.h): the byte
    tokens' last 5%, row k the window at k * T mod (n_val - T)."""
    val = held_out()
    n_val = len(val)
    starts = [(k * T) % (n_val - T) for k in range(batches * B)]
    x = torch.tensor([list(val[s:s + T]) for s in starts])
    y = torch.tensor([list(val[s + 1:s + T + 1]) for s in starts])
    return x, y


def check_llama(strata, work):
    """A Llama directory saved by transformers (bf16, sharded, GQA 4:2), fine-
    tuned 50 steps by strata with no model section in the config (the model
    from DIR/config.json), loads back in transformers, and transformers' loss
    on the held-out batches equals strata's validation loss there (what
    `strata eval` prints for the step directory) within 1e-3 relative."""
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM
    B, T, V, batches, steps = 4, 64, 256, 2, 50
    torch.manual_seed(7)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=0)
    base = os.path.join(work, "llama-base")
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(base, max_shard_size="100KB", safe_serialization=True)
    config = os.path.join(work, "llama-ft.json")
    with open(config, "w") as f:  # no model section: the model and seq come from base/config.json
        json.dump({"train_micro_batch_size_per_gpu": B, "bf16": {"enabled": False},
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                   "data": {"path": KJV, "val_fraction": 0.05},
                   "trainer": {"save_dtype": "fp32", "eval_batches": batches}}, f)
    tuned, log = os.path.join(work, "llama-ft"), os.path.join(work, "llama-ft.jsonl")
    run(strata, "--config", config, "--init-from", base, "--steps", str(steps), "--save", tuned, "--log-json", log)
    with open(log) as f:
        strata_loss = [r for r in map(json.loads, f) if r.get("type") == "val"][-1]["val_loss"]
    step = os.path.join(tuned, "step-%06d" % steps)
    # `strata eval` on the step directory, given the held-out 5% as its file
    # (it evaluates on the whole file it is given), prints the same
    # validation loss (to its four decimals).
    val_file = os.path.join(work, "kjv-val.txt")
    with open(val_file, "wb") as f:
        f.write(held_out())
    ev = subprocess.run([strata, "eval", "--backend", BACKEND, "--model", step, "--data", val_file,
                         "--batches", str(batches), "--batch", str(B)],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert ev.returncode == 0, ev.stdout
    eval_loss = float(ev.stdout.split("val loss")[1].split()[0])
    assert abs(eval_loss - strata_loss) <= 5.01e-5, (eval_loss, strata_loss, ev.stdout)
    model = AutoModelForCausalLM.from_pretrained(step, torch_dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM", type(model)
    x, y = val_batches(T, B, batches)
    with torch.no_grad():
        logits = model(x).logits.double()
    hf_loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)).item()
    print("llama fine-tuned %d steps on %s: transformers' loss %.6f, strata's validation loss %.6f" %
          (steps, BACKEND, hf_loss, strata_loss))
    assert abs(hf_loss - strata_loss) <= 1e-3 * strata_loss, (hf_loss, strata_loss)


def main():
    strata = sys.argv[1]
    work = tempfile.mkdtemp(prefix="strata-hf-")
    try:
        config = os.path.join(work, "config.json")
        with open(config, "w") as f:
            json.dump({"train_micro_batch_size_per_gpu": 4,
                       "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": VOCAB, "seq_len": 32}}, f)
        # A model directory as Hugging Face writes one: weights, config, tokenizer.
        base = os.path.join(work, "base")
        run(strata, "--config", config, "--steps", "1", "--save", base)
        model_dir = os.path.join(work, "gpt2-bytes")
        os.makedirs(model_dir)
        shutil.copy(os.path.join(base, "step-000001", "model.safetensors"), model_dir)
        with open(os.path.join(base, "step-000001", "config.json")) as f:
            c = json.load(f)
        c.update(bos_token_id=EOS, eos_token_id=EOS)
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(c, f)
        enc = bytes_to_unicode()
        vocab = {enc[b]: b for b in range(256)}
        vocab["<|endoftext|>"] = EOS
        with open(os.path.join(work, "vocab.json"), "w") as f:
            json.dump(vocab, f)
        with open(os.path.join(work, "merges.txt"), "w") as f:
            f.write("#version: 0.2\n")
        if "vocab_file" in inspect.signature(GPT2TokenizerFast.__init__).parameters:  # transformers 4
            tok = GPT2TokenizerFast(vocab_file=os.path.join(work, "vocab.json"),
                                    merges_file=os.path.join(work, "merges.txt"))
        else:  # transformers 5: the vocabulary and merges themselves
            tok = GPT2TokenizerFast(vocab=vocab, merges=[])
        assert tok("ab")["input_ids"] == [97, 98], "the byte tokenizer does not tokenize"
        tok.save_pretrained(model_dir)

        tuned = os.path.join(work, "tuned")
        run(strata, "--config", config, "--init-from", model_dir, "--steps", "2", "--save", tuned)
        step = os.path.join(tuned, "step-000002")

        cfg = AutoConfig.from_pretrained(step)
        assert cfg.model_type == "gpt2", cfg
        assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.n_positions) == (2, 64, 4, VOCAB, 32), cfg
        assert cfg.eos_token_id == EOS, cfg
        gen = GenerationConfig.from_pretrained(step)
        assert gen.eos_token_id == EOS, gen
        t = AutoTokenizer.from_pretrained(step)
        text = "In the beginning God created"
        ids = t(text)["input_ids"]
        assert ids == list(text.encode()), ids
        assert t.eos_token_id == EOS, t.eos_token_id
        print("transformers %s: config, generation config and tokenizer of %s load" % (transformers.__version__, step))

        if torch is None:
            print("AutoModelForCausalLM not tried: torch is not importable here")
            return
        model = AutoModelForCausalLM.from_pretrained(step, torch_dtype=torch.float32)
        from safetensors.torch import load_file
        wte = load_file(os.path.join(step, "model.safetensors"))["transformer.wte.weight"]
        assert wte.dtype == torch.bfloat16, wte.dtype  # trainer.save_dtype's default
        assert torch.equal(model.transformer.wte.weight.detach(), wte.float()), "the weights differ from the file's"
        x = torch.tensor([ids])
        loss = model(x, labels=x).loss.item()
        assert loss == loss and 0 < loss < 10, loss
        out = model.generate(x, max_new_tokens=4, do_sample=False)
        assert out.shape == (1, len(ids) + 4), out.shape
        print("AutoModelForCausalLM: loss %.4f on %r, generated %d tokens" % (loss, text, 4))
        for dtype, rel in (("fp32", 1e-5), ("bf16", 5e-3)):
            check_loss(strata, work, dtype, rel)
        check_llama(strata, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
