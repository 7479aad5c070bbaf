"""A small mixture-of-experts decoder with static shapes, for the parallel step's tests.

Routing is GShard's (Lepikhin et al. 2020, arXiv:2006.16668) top-2 with a fixed expert capacity:
tokens are dispatched to ``[experts, capacity, dim]`` by one-hot einsums, so every shape is known
without the router's values (a fake-tensor step runs it as a GPU would).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Experts(nn.Module):
    """E SwiGLU experts as batched weights: [E, D, F], [E, F, D]."""

    def __init__(self, experts: int, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) * 0.02)
        self.w3 = nn.Parameter(torch.randn(experts, dim, hidden) * 0.02)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [E, C, D] -> [E, C, D]."""
        return torch.bmm(F.silu(torch.bmm(x, self.w1)) * torch.bmm(x, self.w3), self.w2)


class MoE(nn.Module):
    """Top-2 routing with capacity factor 1.25 (GShard's dispatch and combine tensors)."""

    def __init__(self, dim: int, hidden: int, experts: int = 4, top_k: int = 2, capacity_factor: float = 1.25):
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = Experts(experts, dim, hidden)
        self.top_k, self.capacity_factor, self.n = top_k, capacity_factor, experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        tokens = x.reshape(b * t, d)                                           # [N, D]
        gates = self.router(tokens).softmax(-1)                                 # [N, E]
        weights, chosen = gates.topk(self.top_k, dim=-1)                        # [N, k]
        capacity = int(self.capacity_factor * b * t * self.top_k / self.n)
        mask = F.one_hot(chosen, self.n).to(x.dtype)                            # [N, k, E]
        position = (mask.flatten(0, 1).cumsum(0).reshape_as(mask) - 1) * mask   # slot of each token in its expert
        slots = F.one_hot(position.sum(-1).long().clamp(max=capacity - 1), capacity).to(x.dtype)  # [N, k, C]
        keep = (position.sum(-1) < capacity).to(x.dtype)                        # [N, k]: dropped past capacity
        dispatch = torch.einsum("nke,nkc,nk->nec", mask, slots, keep)           # [N, E, C]
        combine = torch.einsum("nke,nkc,nk->nec", mask, slots, keep * weights)  # [N, E, C]
        expert_in = torch.einsum("nec,nd->ecd", dispatch, tokens)               # [E, C, D]
        out = torch.einsum("nec,ecd->nd", combine, self.experts(expert_in))     # [N, D]
        return out.reshape(b, t, d)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, experts: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.LayerNorm(dim)
        self.moe = MoE(dim, hidden, experts)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.moe(self.norm2(x))


class MoEDecoder(nn.Module):
    """Token embedding, ``layers`` blocks of attention and a top-2 MoE, a norm and the output head."""

    def __init__(self, vocab: int = 1000, dim: int = 128, layers: int = 2, heads: int = 4, hidden: int = 256,
                 experts: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, hidden, experts) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))
