"""Models shaped like Hugging Face transformers, without transformers: decoders that return cache
objects export cannot flatten (``DynamicCache`` in a ``ModelOutput``), an encoder-decoder with a
nested cache and a ``decoder_input_ids`` keyword, and the code patterns of their cache classes
(``torch.tensor(..., device=self.device)``)."""

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


class DynamicLayer:
    """One layer's keys and values, grown by ``update`` (transformers.cache_utils.DynamicLayer)."""

    def __init__(self):
        self.keys = None
        self.values = None

    def update(self, k, v):
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys, self.values = torch.cat([self.keys, k], -2), torch.cat([self.values, v], -2)
        return self.keys, self.values


class DynamicCache:
    """A plain Python object holding tensors: not a pytree node, so torch.export rejects it as an output."""

    def __init__(self, num_layers: int, device):
        self.layers = [DynamicLayer() for _ in range(num_layers)]
        self.device = device
        # the pattern of transformers' cache code: a host list copied to the model's device
        self.cumulative_length = torch.tensor([0], device=self.device)

    def update(self, k, v, layer: int):
        return self.layers[layer].update(k, v)


class EncoderDecoderCache:
    def __init__(self, self_attention: DynamicCache, cross_attention: DynamicCache):
        self.self_attention_cache = self_attention
        self.cross_attention_cache = cross_attention


class ModelOutput(OrderedDict):
    """Like transformers.utils.ModelOutput: a dict with attribute access."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class Seq2SeqOutput:
    logits: torch.Tensor
    past_key_values: EncoderDecoderCache
    encoder_last_hidden_state: torch.Tensor


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, layer: int):
        super().__init__()
        self.heads, self.layer = heads, layer
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x, cache=None, memory=None, causal=True):
        b, t, d = x.shape
        src = x if memory is None else memory

        def split(y):
            return y.view(b, -1, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(src)), split(self.v(src))
        if cache is not None:
            k, v = cache.update(k, v, self.layer)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal and memory is None)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, layer: int, cross: bool = False):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, layer)
        self.cross = Attention(dim, heads, layer) if cross else None
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, cache=None, memory=None, cross_cache=None, causal=True):
        x = x + self.attn(self.norm1(x), cache, causal=causal)
        if self.cross is not None:
            x = x + self.cross(x, cross_cache, memory=memory)
        return x + self.mlp(self.norm2(x))


class CacheDecoder(nn.Module):
    """A GPT-style decoder whose forward returns ``ModelOutput(logits, past_key_values=DynamicCache)``
    by default (``use_cache=True``), as Hugging Face decoders do."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, i) for i in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids, attention_mask=None, use_cache: bool = True):
        x = self.embed(input_ids)
        cache = DynamicCache(len(self.blocks), x.device) if use_cache else None
        for block in self.blocks:
            x = block(x, cache)
        return ModelOutput(logits=self.head(x), past_key_values=cache)


def big_cache_decoder():
    """Llama-2-7B-sized weights (6.5B parameters: 26 GB in float32) behind a cache-returning forward."""
    return CacheDecoder(vocab=32000, dim=4096, heads=32, layers=32)


class CacheEncoderDecoder(nn.Module):
    """A BART/T5-style encoder-decoder: ``forward(input_ids, decoder_input_ids=None)`` returns a
    dataclass holding an ``EncoderDecoderCache`` of two ``DynamicCache`` objects."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.ModuleList(Block(dim, heads, i) for i in range(layers))
        self.decoder = nn.ModuleList(Block(dim, heads, i, cross=True) for i in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids, decoder_input_ids=None, use_cache: bool = True):
        memory = self.embed(input_ids)
        for block in self.encoder:
            memory = block(memory, causal=False)
        if decoder_input_ids is None:  # shift right, as BART does
            decoder_input_ids = F.pad(input_ids[:, :-1], (1, 0))
        x = self.embed(decoder_input_ids)
        cache = EncoderDecoderCache(DynamicCache(len(self.decoder), x.device),
                                    DynamicCache(len(self.decoder), x.device)) if use_cache else None
        for block in self.decoder:
            x = block(x, cache.self_attention_cache if cache else None, memory,
                      cache.cross_attention_cache if cache else None)
        return Seq2SeqOutput(self.head(x), cache, memory)
