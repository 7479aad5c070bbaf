"""Pieces shared by the zoo's CNN families: channel shuffle and the usual weight init."""

from __future__ import annotations

import torch
import torch.nn as nn


class ChannelShuffle(nn.Module):
    """Interleave channels across `groups` (ShuffleNet): (N, g*c, H, W) -> view (N, g, c) -> (N, c, g)."""

    def __init__(self, groups: int) -> None:
        """Args:
        groups: number of channel groups to interleave.
        """
        super().__init__()
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (N, C, H, W) -> (N, g, C/g, H, W) -> (N, C/g, g, H, W) -> (N, C, H, W)
        return x.unflatten(1, (self.groups, -1)).transpose(1, 2).flatten(1, 2)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"


def init_cnn_weights(model: nn.Module, linear_std: float | None = 0.01) -> None:
    """Kaiming-normal convs (fan_out, ReLU), unit/zero batch norms, N(0, linear_std) linears
    (left at PyTorch's default when ``linear_std`` is None); biases zero."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and linear_std is not None:
            nn.init.normal_(m.weight, 0, linear_std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
