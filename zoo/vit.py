"""Vision Transformer (ViT): patch embedding + class token + pre-norm Transformer encoder.

Paper: "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale",
A. Dosovitskiy, L. Beyer, A. Kolesnikov, D. Weissenborn, X. Zhai, T. Unterthiner,
M. Dehghani, M. Minderer, G. Heigold, S. Gelly, J. Uszkoreit, N. Houlsby, 2020,
arXiv:2010.11929 (ICLR 2021). ViT-Ti/16 is the "tiny" size of DeiT (Touvron et al. 2020,
arXiv:2012.12877).

Module names and parameters follow torchvision's `VisionTransformer` (`conv_proj`,
`class_token`, `encoder.pos_embedding`, `encoder.layers.encoder_layer_{i}.{ln_1,
self_attention, ln_2, mlp.0, mlp.3}`, `encoder.ln`, `heads.head`), so torchvision state
dicts load as-is with the default `attention="mha"`.

Published at 224x224, 1000 classes (FLOPs = multiply-adds, as torchvision reports them):

    model       params        GMACs
    vit_b_16    86,567,656    17.564
    vit_b_32    88,224,232     4.409
    vit_l_16    304,326,632   61.555
    vit_tiny    5,717,416      1.26   (DeiT-Ti: 5.7M, 1.3G)
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._registry import register_model

__all__ = ["VisionTransformer"]


def _trunc_normal_(t: torch.Tensor, std: float) -> torch.Tensor:
    """N(0, std) truncated to [-2std, 2std] by the inverse-CDF method.

    `nn.init.trunc_normal_` in recent torch checks `mask.any()`, which is data-dependent and
    fails under FakeTensorMode; this form only uses elementwise in-place ops.
    """
    with torch.no_grad():
        lo, hi = math.erf(-2 / math.sqrt(2)), math.erf(2 / math.sqrt(2))
        t.uniform_(lo, hi).erfinv_().mul_(std * math.sqrt(2)).clamp_(-2 * std, 2 * std)
    return t


class SelfAttention(nn.Module):
    """Multi-head self-attention as qkv Linear + `F.scaled_dot_product_attention` + proj Linear.

    Same parameter count and FLOPs as `nn.MultiheadAttention(dim, heads)` (in_proj with bias,
    out_proj with bias), but every step is a visible module or function call.
    """

    def __init__(self, dim: int, heads: int, attention_dropout: float = 0.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.head_dim = dim // heads
        self.attention_dropout = attention_dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, N, D] -> [B, N, D]."""
        qkv = self.qkv(x).unflatten(-1, (3, self.heads, self.head_dim))  # [B, N, 3, H, Dh]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x [B, H, N, Dh]
        p = self.attention_dropout if self.training else 0.0
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # [B, H, N, Dh]
        return self.proj(x.transpose(1, 2).flatten(2))  # [B, N, D]


class EncoderBlock(nn.Module):
    """Pre-norm Transformer encoder block: x + MHSA(LN(x)), then x + MLP(LN(x))."""

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_dim: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        attention: str = "mha",
    ) -> None:
        super().__init__()
        if attention not in ("mha", "sdpa"):
            raise ValueError(f"attention must be 'mha' or 'sdpa', not {attention!r}")
        self.use_mha = attention == "mha"
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        if self.use_mha:
            self.self_attention = nn.MultiheadAttention(dim, heads, dropout=attention_dropout, batch_first=True)
        else:
            self.self_attention = SelfAttention(dim, heads, attention_dropout)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        # Indices 0..4 match torchvision's MLPBlock (mlp.0 / mlp.3 hold the weights).
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, N, D] -> [B, N, D]."""
        y = self.ln_1(x)  # [B, N, D]
        if self.use_mha:  # a constructor constant, not data: fx-traceable
            y, _ = self.self_attention(y, y, y, need_weights=False)  # [B, N, D]
        else:
            y = self.self_attention(y)  # [B, N, D]
        x = x + self.dropout(y)
        return x + self.mlp(self.ln_2(x))  # [B, N, D]


class Encoder(nn.Module):
    """Learned position embedding + a stack of encoder blocks + final LayerNorm."""

    def __init__(
        self,
        seq_length: int,
        depth: int,
        dim: int,
        heads: int,
        mlp_dim: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        attention: str = "mha",
    ) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, dim).normal_(std=0.02))  # [1, N, D]
        self.dropout = nn.Dropout(dropout)
        # Blocks are named like torchvision's (encoder_layer_0 ...) for state-dict compatibility.
        self.layers = nn.Sequential(
            OrderedDict(
                (f"encoder_layer_{i}", EncoderBlock(dim, heads, mlp_dim, dropout, attention_dropout, attention))
                for i in range(depth)
            )
        )
        self.ln = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, N, D] -> [B, N, D]."""
        x = self.dropout(x + self.pos_embedding)
        return self.ln(self.layers(x))


class VisionTransformer(nn.Module):
    """ViT classifier (torchvision layout).

    Args:
        image_size: input height = width; must be a multiple of `patch`.
        patch: patch size (the stride and kernel of the patch-embedding conv).
        dim: hidden width D.
        depth: number of encoder blocks.
        heads: attention heads.
        mlp: MLP hidden width.
        num_classes: classifier outputs.
        in_chans: input channels.
        dropout: dropout after attention / MLP / position embedding.
        attention_dropout: dropout on attention weights.
        attention: "mha" uses `nn.MultiheadAttention` (torchvision-exact, fused fast path in
            eval); "sdpa" uses qkv Linear + `F.scaled_dot_product_attention` + proj Linear.
    """

    def __init__(
        self,
        image_size: int = 224,
        patch: int = 16,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        mlp: int = 3072,
        num_classes: int = 1000,
        in_chans: int = 3,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        attention: str = "mha",
    ) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image_size {image_size} is not a multiple of patch {patch}")
        self.image_size = image_size
        self.patch_size = patch
        self.hidden_dim = dim
        self.num_classes = num_classes
        seq_length = (image_size // patch) ** 2 + 1  # patches + class token

        self.conv_proj = nn.Conv2d(in_chans, dim, kernel_size=patch, stride=patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))  # [1, 1, D]
        self.encoder = Encoder(seq_length, depth, dim, heads, mlp, dropout, attention_dropout, attention)
        self.heads = nn.Sequential()
        self.heads.add_module("head", nn.Linear(dim, num_classes))
        self._init_weights()

    def _init_weights(self) -> None:
        """torchvision's init (cheap, and a no-op on meta / fake tensors)."""
        fan_in = self.conv_proj.in_channels * self.conv_proj.kernel_size[0] * self.conv_proj.kernel_size[1]
        _trunc_normal_(self.conv_proj.weight, std=math.sqrt(1 / fan_in))
        nn.init.zeros_(self.conv_proj.bias)
        for blk in self.encoder.layers:
            for m in (blk.mlp[0], blk.mlp[3]):
                nn.init.xavier_uniform_(m.weight)
                nn.init.normal_(m.bias, std=1e-6)
        nn.init.zeros_(self.heads.head.weight)
        nn.init.zeros_(self.heads.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, C, H, W] images -> [B, num_classes] logits."""
        x = self.conv_proj(x)  # [B, D, H/p, W/p]
        x = x.flatten(2).transpose(1, 2)  # [B, N-1, D]
        cls = self.class_token.expand(x.shape[0], -1, -1)  # [B, 1, D]
        x = torch.cat([cls, x], dim=1)  # [B, N, D]
        x = self.encoder(x)  # [B, N, D]
        return self.heads(x[:, 0])  # [B, num_classes]


def _vit(cfg: dict, **kwargs) -> VisionTransformer:
    """Build a ViT from a variant config; `kwargs` override any constructor argument
    (num_classes, image_size, depth, attention, ...)."""
    return VisionTransformer(**{**cfg, **kwargs})


@register_model(default_input="1,3,224,224")
def vit_b_16(**kwargs): return _vit(dict(patch=16, dim=768, depth=12, heads=12, mlp=3072), **kwargs)


@register_model(default_input="1,3,224,224")
def vit_b_32(**kwargs): return _vit(dict(patch=32, dim=768, depth=12, heads=12, mlp=3072), **kwargs)


@register_model(default_input="1,3,224,224")
def vit_l_16(**kwargs): return _vit(dict(patch=16, dim=1024, depth=24, heads=16, mlp=4096), **kwargs)


@register_model(default_input="1,3,224,224")
def vit_tiny(**kwargs): return _vit(dict(patch=16, dim=192, depth=12, heads=3, mlp=768), **kwargs)


@register_model(default_input="1,3,224,224")
def vit_tiny_sdpa(**kwargs): return _vit(dict(patch=16, dim=192, depth=12, heads=3, mlp=768, attention="sdpa"), **kwargs)
