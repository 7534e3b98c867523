"""A small GPT-style decoder-only transformer and its synthetic data (no downloads).

Shared by fsdp2_gpt.py and ddp.py. Everything is deterministic given a seed: the initial
weights (init_weights) and every batch (synthetic_batch) depend only on (seed, step, rank),
so two runs of the same script - with and without zerocta - see identical inputs.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-LN block: x + attn(ln1(x)), then x + mlp(ln2(x)). Causal attention via SDPA."""

    def __init__(self, width, heads, mlp_ratio):
        super().__init__()
        assert width % heads == 0, "width must be a multiple of heads"
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, mlp_ratio * width, bias=False)
        self.fc2 = nn.Linear(mlp_ratio * width, width, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        # (b, s, 3, h, hd) -> (3, b, h, s, hd): the last dim stays contiguous, as flash needs.
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(
            2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Token + learned position embeddings, `depth` blocks, final LN, untied LM head.

    The head is not tied to the embedding so that FSDP2 can shard every parameter once.
    """

    def __init__(self, vocab, width, depth, heads, seq, mlp_ratio=4):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, width)
        self.pos_emb = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, mlp_ratio) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def init_std(name, depth):
    """GPT-2 init: N(0, 0.02), residual output projections scaled by 1/sqrt(2*depth);
    LayerNorm weight 1 and bias 0 (returned as None: not random)."""
    if ".ln" in name or name.startswith("ln_"):
        return None
    if name.endswith("proj.weight") or name.endswith("fc2.weight"):
        return 0.02 / math.sqrt(2 * depth)
    return 0.02


def full_init_value(name, index, shape, depth, seed, device):
    """The whole (unsharded) initial value of parameter `index` called `name`, in fp32.

    One generator per parameter, seeded from (seed, index): the value does not depend on the
    world size or on how the parameter is sharded, and is the same on every rank.
    """
    std = init_std(name, depth)
    if std is None:
        fill = 1.0 if name.endswith("weight") else 0.0
        return torch.full(shape, fill, dtype=torch.float32, device=device)
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + index)
    return torch.empty(shape, dtype=torch.float32, device=device).normal_(0.0, std, generator=g)


def synthetic_batch(step, rank, world, batch, seq, vocab, seed, device):
    """(inputs, targets) of shape (batch, seq): learnable integer sequences.

    Each row is an arithmetic progression modulo vocab with a random start and stride, so the
    next token follows from the previous two and the loss can fall (a run that trains is a
    better test than noise). Seeded by (seed, step, rank): every rank gets its own data,
    identical across runs.
    """
    g = torch.Generator(device=device)
    g.manual_seed(seed * 7_919 + step * world + rank)
    start = torch.randint(0, vocab, (batch, 1), generator=g, device=device)
    stride = torch.randint(1, 64, (batch, 1), generator=g, device=device)
    tokens = (start + stride * torch.arange(seq + 1, device=device)) % vocab
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def lm_loss(logits, targets):
    """Cross-entropy in fp32 (logits may be bf16): a stable loss value to compare bitwise."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
