# SPDX-License-Identifier: Apache-2.0
"""The GPT that the peer scripts train in PyTorch: GPT-2's architecture at
strata's shapes (models/gpt2.h), shared by bench/peers/train_peers.py and
bench/peers/offload_adam.py so that both time the same model.

Pre-LayerNorm blocks (attention through scaled_dot_product_attention,
causal; a tanh-GELU MLP of width 4 d), learned position embeddings, a final
LayerNorm and a head tied to the token embedding; weights drawn from
N(0, 0.02) as strata's InitRandom does. The vocabulary is padded to a
multiple of 128 as strata pads it (50257 -> 50304); the loss is the
cross-entropy over the real vocabulary's targets, in fp32.

Per-layer activation checkpointing (`checkpoint`) matches strata's
recompute: "all" keeps only each block's input and recomputes the block in
the backward; "all-but-last" does so for every block but the last, whose
forward internals are kept for its backward (what strata's resident model
and its offload trainer do by default); "none" keeps every activation.
"""

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as _checkpoint

CHECKPOINT_MODES = ("all-but-last", "all", "none")


def padded_vocab(vocab):
    """strata's padding of the vocabulary: up to a multiple of 128."""
    return (vocab + 127) // 128 * 128


def _sdpa(q, k, v):
    """Causal attention: PyTorch's fused kernel where this torch has it (2.0
    and later), else the plain softmax(q k^T / sqrt(dh)) v."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return att @ v


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.out = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = _sdpa(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    """GPT-2's architecture; the head is tied to the token embedding (both
    modules hold the one parameter). `vocab` is the real vocabulary; the
    embedding has padded_vocab(vocab) rows."""

    def __init__(self, layers, d, heads, seq, vocab=50304, checkpoint="none"):
        super().__init__()
        if checkpoint not in CHECKPOINT_MODES:
            raise ValueError("checkpoint %r: one of %s" % (checkpoint, ", ".join(CHECKPOINT_MODES)))
        if d % heads != 0:
            raise ValueError("d %d is not a multiple of heads %d" % (d, heads))
        self.vocab = vocab
        self.vp = padded_vocab(vocab)
        self.checkpoint = checkpoint
        self.wte = torch.nn.Embedding(self.vp, d)
        self.wpe = torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, self.vp, bias=False)
        self.head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=0.02)

    def recomputed(self, i):
        """Whether block i is recomputed in the backward (from its input)."""
        last = len(self.blocks) - 1
        return self.checkpoint == "all" or (self.checkpoint == "all-but-last" and i != last)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for i, blk in enumerate(self.blocks):
            if self.recomputed(i) and torch.is_grad_enabled():
                x = _checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        logits = self.head(self.ln_f(x))[..., : self.vocab]
        return F.cross_entropy(logits.float().reshape(-1, self.vocab), targets.reshape(-1), ignore_index=-1)


def num_parameters(model):
    """Distinct parameters (the tied head counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
