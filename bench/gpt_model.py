"""The GPT that zerotrain's nn::Gpt implements, in torch.nn, shared by the PyTorch anchors in bench/.

Same model as zerotrain's nn::Gpt (and tests/python/gpt_reference.py): learned positions, pre-LayerNorm
blocks (eps 1e-5), fused qkv Linear(C, 3C), causal softmax attention, tanh GELU, tied (or untied) lm_head, no
dropout, fp32, GPT-2 initialization (normal(0, 0.02), residual projections 0.02/sqrt(2 n_layer),
biases 0, LayerNorm 1/0).

Import it after setting the thread environment (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS): it imports
torch. Used by bench/pytorch_gpt_step.py (one process) and bench/pytorch_ddp_gpt.py (DDP).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head, seq_len):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.register_buffer("mask", torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.n_head))
        scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Mlp(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d_model, n_head, seq_len):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = CausalSelfAttention(d_model, n_head, seq_len)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.mlp = Mlp(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    """Parameter names are zerotrain's (wte.weight, h.0.attn.qkv.weight, h.0.mlp.fc.weight, ...,
    lm_head.weight when untied), so a `zerotrain checkpoint export` loads with load_state_dict."""

    def __init__(self, n_layer, n_head, d_model, seq_len, vocab, tie_embeddings=True):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.h = nn.ModuleList(Block(d_model, n_head, seq_len) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        self.lm_head = None if tie_embeddings else nn.Linear(d_model, vocab, bias=False)
        # GPT-2 initialization, as zerotrain's.
        residual_std = 0.02 / math.sqrt(2 * n_layer)
        for name, parameter in self.named_parameters():
            if name.endswith(".bias"):
                torch.nn.init.zeros_(parameter)
                continue
            if ".ln" in name or name.startswith("ln_f"):
                continue
            std = residual_std if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight") else 0.02
            torch.nn.init.normal_(parameter, 0.0, std)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe.weight[:T]
        for block in self.h:
            x = block(x)
        head = self.wte.weight if self.lm_head is None else self.lm_head.weight
        return self.ln_f(x) @ head.T


def adamw(model):
    """The optimizer of zerotrain's benchmark configs: AdamW lr 6e-4, betas (0.9, 0.95), eps 1e-8,
    weight decay 0.1 on every parameter (one group), no clipping, no scheduler."""
    return torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
