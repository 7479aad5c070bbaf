"""LLaMA-style decoder-only Transformer: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Papers: "LLaMA: Open and Efficient Foundation Language Models", H. Touvron, T. Lavril,
G. Izacard, X. Martinet, M.-A. Lachaux, T. Lacroix, B. Roziere, N. Goyal, E. Hambro,
F. Azhar, A. Rodriguez, A. Joulin, E. Grave, G. Lample, 2023, arXiv:2302.13971;
"Llama 2: Open Foundation and Fine-Tuned Chat Models", H. Touvron et al., 2023,
arXiv:2307.09288 (grouped-query attention for the 70B); "The Llama 3 Herd of Models",
A. Grattafiori, A. Dubey et al. (Llama Team, AI @ Meta), 2024, arXiv:2407.21783.

Module names follow Meta's reference code (`tok_embeddings`, `layers.{i}.attention.{wq,wk,
wv,wo}`, `attention_norm`, `feed_forward.{w1,w2,w3}`, `ffn_norm`, `norm`, `output`). RoPE
uses the "rotate_half" formulation on real tensors (as in Hugging Face), so Meta checkpoints
need the usual per-head permutation of wq / wk to load.

Published parameter counts (untied embedding and lm_head, RMSNorm weights, no biases).
A forward pass over T tokens costs about T * (non-embedding params) multiply-adds for the
linear layers plus n_layers * 2 * T^2 * dim for QK^T and AV (half that with causal skipping):

    model        params            MACs per token (linear)
    llama2_7b    6,738,415,616     ~6.61G
    llama3_8b    8,030,261,248     ~7.50G
    llama3_70b   70,553,706,496    ~69.5G
    llama_tiny   19,532,032        (toy size for tests)
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._registry import register_model

__all__ = ["Llama"]


class RMSNorm(nn.Module):
    """Root-mean-square LayerNorm without mean subtraction or bias (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., D] -> [..., D], computed in x's dtype."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding tables (Su et al. 2021, arXiv:2104.09864).

    cos / sin are non-persistent buffers of shape [max_seq_len, head_dim], built with
    arange / outer / cos / sin only, so construction is cheap and works under
    FakeTensorMode and on the meta device.
    """

    def __init__(self, head_dim: int, max_seq_len: int = 4096, theta: float = 10000.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.theta = theta
        cos, sin = self._tables()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        t = torch.arange(self.max_seq_len, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [S, Dh/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [S, Dh]
        return emb.cos(), emb.sin()

    def reset_parameters(self) -> None:
        """Recompute the tables in place (e.g. after `to_empty()` from the meta device)."""
        cos, sin = self._tables()
        with torch.no_grad():
            self.cos.copy_(cos)
            self.sin.copy_(sin)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, T, ...] (only its length is read) -> (cos, sin), each [T, Dh] float32."""
        seq_len = x.shape[1]  # an fx Proxy when traced; narrow (unlike [:n]) accepts it on a buffer
        return self.cos.narrow(0, 0, seq_len), self.sin.narrow(0, 0, seq_len)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] along the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate query / key heads. x: [B, H, T, Dh]; cos, sin: [T, Dh]."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE (n_kv_heads divides n_heads)."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int) -> None:
        super().__init__()
        if dim % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"need dim % n_heads == 0 and n_heads % n_kv_heads == 0 ({dim}, {n_heads}, {n_kv_heads})")
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.n_rep = n_heads // n_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def _repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, T, Dh] -> [B, H, T, Dh], each kv head shared by n_rep consecutive q heads."""
        if self.n_rep == 1:  # a constructor constant: fx-traceable
            return x
        return x.unsqueeze(2).expand(-1, -1, self.n_rep, -1, -1).flatten(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past: tuple | None = None,
                use_cache: bool = False):
        """x: [B, T, D]; cos, sin: [T, Dh] -> [B, T, D]; with ``use_cache``, also this layer's
        keys and values ([B, Hkv, L + T, Dh] each: ``past``'s L tokens, then these T)."""
        q = self.wq(x).unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)  # [B, H, T, Dh]
        k = self.wk(x).unflatten(-1, (self.n_kv_heads, self.head_dim)).transpose(1, 2)  # [B, Hkv, T, Dh]
        v = self.wv(x).unflatten(-1, (self.n_kv_heads, self.head_dim)).transpose(1, 2)  # [B, Hkv, T, Dh]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if past is not None:  # the cache: the keys and values of the tokens before these
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        present = (k, v)
        k, v = self._repeat_kv(k), self._repeat_kv(v)  # [B, H, L + T, Dh]
        if past is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, Dh]
        elif q.shape[2] == 1:  # one new token sees every key
            y = F.scaled_dot_product_attention(q, k, v)
        else:  # new token i sees the past and the new tokens up to i
            t, total = q.shape[2], k.shape[2]
            mask = torch.ones(t, total, dtype=torch.bool, device=q.device).tril(total - t)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = self.wo(y.transpose(1, 2).flatten(2))  # [B, T, D]
        return (out, present) if use_cache else out


class FeedForward(nn.Module):
    """SwiGLU MLP (Shazeer 2020): w2(silu(w1 x) * w3 x), bias-free."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, D] -> [B, T, D]."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # hidden [B, T, F]


class TransformerBlock(nn.Module):
    """Pre-norm decoder block: x + Attn(RMSNorm(x)), then x + SwiGLU(RMSNorm(x))."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, ffn_dim: int, norm_eps: float) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.attention = Attention(dim, n_heads, n_kv_heads)
        self.ffn_norm = RMSNorm(dim, norm_eps)
        self.feed_forward = FeedForward(dim, ffn_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past: tuple | None = None,
                use_cache: bool = False):
        """x: [B, T, D] -> [B, T, D] (and the layer's keys and values with ``use_cache``)."""
        if not use_cache:
            x = x + self.attention(self.attention_norm(x), cos, sin)
            return x + self.feed_forward(self.ffn_norm(x))
        h, present = self.attention(self.attention_norm(x), cos, sin, past, use_cache=True)
        x = x + h
        return x + self.feed_forward(self.ffn_norm(x)), present


def llama_ffn_dim(dim: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """LLaMA's SwiGLU width rule: 2/3 * 4 * dim, optionally scaled, rounded up to `multiple_of`."""
    hidden = int(2 * 4 * dim / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class Llama(nn.Module):
    """LLaMA-style causal language model returning logits for every position.

    Args:
        vocab_size: token vocabulary.
        dim: model width D.
        n_layers: number of decoder blocks.
        n_heads: query heads.
        n_kv_heads: key / value heads (grouped-query attention); None = n_heads.
        ffn_dim: SwiGLU hidden width; None = `llama_ffn_dim(dim, multiple_of, ffn_dim_multiplier)`.
        multiple_of: rounding for the derived ffn_dim.
        ffn_dim_multiplier: scale for the derived ffn_dim.
        norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base frequency.
        max_seq_len: length of the precomputed RoPE tables (longest supported input).
    """

    def __init__(
        self,
        vocab_size: int = 32000,
        dim: int = 4096,
        n_layers: int = 32,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        ffn_dim: int | None = None,
        multiple_of: int = 256,
        ffn_dim_multiplier: float | None = None,
        norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        max_seq_len: int = 4096,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        ffn_dim = llama_ffn_dim(dim, multiple_of, ffn_dim_multiplier) if ffn_dim is None else ffn_dim
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.rope = RotaryEmbedding(dim // n_heads, max_seq_len, rope_theta)
        self.layers = nn.ModuleList(
            TransformerBlock(dim, n_heads, n_kv_heads, ffn_dim, norm_eps) for _ in range(n_layers)
        )
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, past_key_values: list | None = None, use_cache: bool = False):
        """tokens: [B, T] int64 ids (T <= max_seq_len) -> [B, T, vocab_size] logits.

        The decoding protocol archscan's ``--decode`` follows (as Hugging Face models do): with
        ``use_cache=True`` it returns ``(logits, past_key_values)``, a list of each layer's
        ``(keys, values)``, [B, n_kv_heads, L, head_dim]; passing them back runs the next tokens
        after those L, at positions L, L + 1, ...
        """
        x = self.tok_embeddings(tokens)  # [B, T, D]
        if past_key_values is None and not use_cache:
            cos, sin = self.rope(tokens)  # [T, Dh] each
            for layer in self.layers:
                x = layer(x, cos, sin)  # [B, T, D]
            return self.output(self.norm(x))  # [B, T, V]
        start = past_key_values[0][0].shape[2] if past_key_values else 0
        cos = self.rope.cos.narrow(0, start, tokens.shape[1])
        sin = self.rope.sin.narrow(0, start, tokens.shape[1])
        presents = []
        for i, layer in enumerate(self.layers):
            x, present = layer(x, cos, sin, past_key_values[i] if past_key_values else None, use_cache=True)
            presents.append(present)
        return self.output(self.norm(x)), presents


def _llama(cfg: dict, **kwargs) -> Llama:
    """Build a Llama from a variant config; `kwargs` override any constructor argument."""
    return Llama(**{**cfg, **kwargs})


@register_model(default_input="1,128:int64")
def llama_tiny(**kwargs): return _llama(dict(vocab_size=32000, dim=256, n_layers=4, n_heads=8, n_kv_heads=4), **kwargs)


@register_model(default_input="1,128:int64")
def llama2_7b(**kwargs): return _llama(dict(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim=11008), **kwargs)


@register_model(default_input="1,128:int64")
def llama3_8b(**kwargs): return _llama(dict(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, rope_theta=500000.0, max_seq_len=8192), **kwargs)


@register_model(default_input="1,128:int64")
def llama3_70b(**kwargs): return _llama(dict(vocab_size=128256, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672, rope_theta=500000.0, max_seq_len=8192), **kwargs)
