"""Small models for ``archscan fuse``'s tests: batch norms that fold or stay, hand-written attention."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------- batch norms
class ConvBN(nn.Module):
    """conv(3->8, 3x3, no bias) -> BN -> ReLU -> conv(8->4, 1x1, bias) -> BN."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 1)
        self.bn2 = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn2(self.conv2(torch.relu(self.bn(self.conv(x)))))


class BatchNormAct2d(nn.BatchNorm2d):
    """timm's BatchNormAct2d: a BatchNorm2d subclass that calls F.batch_norm itself, then an activation."""

    def __init__(self, num_features, act=nn.SiLU):
        super().__init__(num_features)
        self.act = act()

    def forward(self, x):
        assert x.ndim == 4, f"expected a 4-D input, got {x.ndim}-D"
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        return self.act(x)


class TimmStyle(nn.Module):
    """conv -> BatchNormAct2d(SiLU) -> conv -> BatchNormAct2d(ReLU)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = BatchNormAct2d(8, nn.SiLU)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = BatchNormAct2d(8, nn.ReLU)

    def forward(self, x):
        return self.bn2(self.conv2(self.bn1(self.conv1(x))))


class FunctionalBN(nn.Module):
    """conv then a plain ``F.batch_norm`` on statistics the module registered itself (random,
    set in __init__: ``randomize_batch_norms`` only knows ``running_mean``/``running_var``)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.register_buffer("mean", torch.randn(6, generator=g))
        self.register_buffer("var", torch.rand(6, generator=g) + 0.5)
        self.gamma = nn.Parameter(torch.rand(6, generator=g) + 0.5)
        self.beta = nn.Parameter(torch.randn(6, generator=g))

    def forward(self, x):
        return F.batch_norm(self.conv(x), self.mean, self.var, self.gamma, self.beta, False, 0.0, 1e-5)


class TwoUsers(nn.Module):
    """conv1 -> bn1 folds; conv2's output feeds bn2 and a residual add (bn2 stays); conv3 -> bn3 folds."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 8, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(8)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        y = self.conv2(x)
        x = torch.relu(self.bn2(y) + y)
        return self.bn3(self.conv3(x))


class LinearBN(nn.Module):
    """Linear(16->32) -> BatchNorm1d(32) on a 2-D input [N, 16]."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)

    def forward(self, x):
        return self.bn(self.fc(x))


class LinearBN3d(nn.Module):
    """Linear(16->12) on the last dim of [N, 8, 16], then BatchNorm1d(8) over dim 1: not the linear's features."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 12)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x):
        return self.bn(self.fc(x))


class ConvTransposeBN(nn.Module):
    """ConvTranspose2d(8->6, groups) -> BatchNorm2d(6)."""

    def __init__(self, groups: int = 1):
        super().__init__()
        self.up = nn.ConvTranspose2d(8, 6, 2, stride=2, groups=groups)
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x):
        return self.bn(self.up(x))


class Conv1dBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class Conv3dBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm3d(4)

    def forward(self, x):
        return self.bn(self.conv(x))


class SharedNorm(nn.Module):
    """One BatchNorm2d module applied after two different convs: both fold (its statistics are read, not written)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 1, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv2(torch.relu(self.bn(self.conv1(x)))))


class SamePaddingConvBN(nn.Module):
    """Conv2d(padding='same') -> BN: export records it as aten.conv2d.padding (string padding overload)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding="same", bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x))


class TiedConv(nn.Module):
    """One conv applied twice, each output normalised by its own BN: the weight is shared, neither folds."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn_a = nn.BatchNorm2d(4)
        self.bn_b = nn.BatchNorm2d(4)

    def forward(self, x):
        a = torch.relu(self.bn_a(self.conv(x)))
        return self.bn_b(self.conv(a))


# ----------------------------------------------------------------------------- attention
L, D = 8, 16  # sequence length and head size of the attention inputs [B, H, L, D]


class HandAttention(nn.Module):
    """softmax(q @ k^T * scale + mask, dim=-1) @ v on q, k, v [B, H, L, D], written out in one of
    several ways (``variant``); the negative variants are not attention SDPA computes the same way."""

    REWRITTEN = ("mask", "div_sqrt", "masked_fill", "no_mask", "dropout", "prescaled")
    KEPT = ("softmax_dim1", "returns_weights", "mask_after_softmax")
    TEMPERATURE = ("tensor_scale",)  # a learned scalar temperature: folded into q

    def __init__(self, variant: str = "mask"):
        super().__init__()
        self.variant = variant
        g = torch.Generator().manual_seed(2)
        self.register_buffer("mask", torch.randn(L, L, generator=g))          # additive
        self.register_buffer("blocked", torch.ones(L, L).triu(1).bool())       # causal: True = masked out
        self.log_temp = nn.Parameter(torch.tensor(-1.0))
        self.dropout = nn.Dropout(0.1)

    def forward(self, q, k, v):
        scale = 1.0 / math.sqrt(q.shape[-1])
        kt = k.transpose(-2, -1)
        if self.variant == "mask":
            p = torch.softmax(q @ kt * scale + self.mask, dim=-1)
        elif self.variant == "div_sqrt":
            p = torch.softmax((q @ kt) / math.sqrt(D), dim=-1)
        elif self.variant == "masked_fill":
            p = torch.softmax((q @ kt * scale).masked_fill(self.blocked, float("-inf")), dim=-1)
        elif self.variant == "no_mask":
            p = (q @ kt * scale).softmax(-1)
        elif self.variant == "dropout":
            p = self.dropout(F.softmax(q @ kt * scale + self.mask, dim=-1))
        elif self.variant == "prescaled":
            p = torch.softmax((q * scale) @ kt, dim=-1)
        elif self.variant == "softmax_dim1":
            p = torch.softmax(q @ kt * scale, dim=1)
        elif self.variant == "returns_weights":
            p = torch.softmax(q @ kt * scale + self.mask, dim=-1)
            return p @ v, p
        elif self.variant == "tensor_scale":
            p = torch.softmax(q @ kt * self.log_temp.exp(), dim=-1)
        elif self.variant == "mask_after_softmax":
            p = torch.softmax(q @ kt * scale, dim=-1).masked_fill(self.blocked, 0.0)
        else:
            raise ValueError(self.variant)
        return p @ v
