#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# A Hugging Face model directory for checking strata generate/eval where no
# model can be downloaded (scripts/generate-check.sh, the GPU machine):
# GPT-2 small's shape (12 layers, d 768, 1024 positions), random init with
# seed 0, saved by transformers (model.safetensors, config.json,
# generation_config.json), with a byte-level BPE tokenizer.json trained by
# Hugging Face tokenizers on the bundled corpus (8192 tokens), the corpus
# as a nanoGPT token file (kjv.bin, uint16), a prompt (prompt.json) and
# PyTorch's greedy continuation of it by full recompute (torch_greedy.json:
# the ids and each step's gap between the two largest logits).
#
#   scripts/make_hf_gpt2.py DIR      (needs torch with CUDA, transformers, tokenizers)
import json, os, sys, time
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
text = open("data/kjv.txt", encoding="utf-8").read()
tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=8192, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(os.path.join(out, "tokenizer.json"))
V = tok.get_vocab_size()
import array
array.array("H", tok.encode(text).ids).tofile(open(os.path.join(out, "kjv.bin"), "wb"))
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=V, n_positions=1024, bos_token_id=0, eos_token_id=0)
m = GPT2LMHeadModel(cfg).eval()
m.save_pretrained(out, safe_serialization=True)
m = m.cuda()
ids = tok.encode("In the beginning God created the heaven and the earth.").ids
json.dump(ids, open(os.path.join(out, "prompt.json"), "w"))
seq = list(ids)
gaps = []
with torch.no_grad():
    for _ in range(64):
        logits = m(torch.tensor([seq]).cuda()).logits[0, -1].float()
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
        seq.append(int(logits.argmax()))
json.dump({"greedy": seq[len(ids):], "gaps": gaps}, open(os.path.join(out, "torch_greedy.json"), "w"))
print("hf model: vocab", V, "prompt", len(ids), "tokens; min top-2 gap", min(gaps))
