"""MobileNet V2: inverted residuals with linear bottlenecks; torchvision layout.

Paper: "MobileNetV2: Inverted Residuals and Linear Bottlenecks", Mark Sandler, Andrew
Howard, Menglong Zhu, Andrey Zhmoginov, Liang-Chieh Chen, 2018, arXiv:1801.04381.

Published complexity at 224x224 (multiply-adds, parameters):
    mobilenet_v2      300M MACs  3.4M params (paper Table 4); torchvision: 300.8M, 3.505M
    mobilenet_v2_140  585M MACs  6.9M params (paper Table 4)
Channels are rounded with torchvision's _make_divisible(., 8); the last conv is widened
only for width > 1 (1280 -> 1792 at 1.4). Module names match torchvision (features.N,
classifier), so torchvision state dicts load unchanged.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._layers import init_cnn_weights
from ._registry import register_model


def _make_divisible(v: float, divisor: int, min_value: int | None = None) -> int:
    """Round `v` to the nearest multiple of `divisor`, never going below 90% of `v`."""
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNReLU6(nn.Sequential):
    """Conv2d (no bias, 'same' padding) -> BatchNorm2d -> ReLU6; torchvision's Conv2dNormActivation."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int = 3, stride: int = 1, groups: int = 1) -> None:
        """Args:
        in_ch: input channels.
        out_ch: output channels.
        kernel_size: square kernel size.
        stride: convolution stride.
        groups: convolution groups (in_ch for depthwise).
        """
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(in_ch, out_ch, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """1x1 expand (ReLU6) -> 3x3 depthwise (ReLU6) -> 1x1 linear project, residual if shapes match."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        """Args:
        inp: input channels.
        oup: output channels.
        stride: depthwise stride, 1 or 2.
        expand_ratio: hidden width = round(inp * expand_ratio).
        """
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        self.stride = stride
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup

        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(inp, hidden_dim, kernel_size=1))  # pw expand
        layers += [
            ConvBNReLU6(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),  # dw
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),  # pw-linear
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)
        self.out_channels = oup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNet V2 for ImageNet: 3x3 stem, 17 inverted residuals, 1x1 conv, pool, dropout, linear."""

    def __init__(
        self,
        width_mult: float = 1.0,
        num_classes: int = 1000,
        round_nearest: int = 8,
        dropout: float = 0.2,
    ) -> None:
        """Args:
        width_mult: channel multiplier.
        num_classes: classifier outputs.
        round_nearest: channels are rounded to a multiple of this.
        dropout: dropout before the classifier.
        """
        super().__init__()
        input_channel = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)
        # t (expansion), c (channels), n (repeats), s (first stride); spatial 112 -> 7
        inverted_residual_setting = [
            [1, 16, 1, 1],   # 112x112
            [6, 24, 2, 2],   # 56x56
            [6, 32, 3, 2],   # 28x28
            [6, 64, 4, 2],   # 14x14
            [6, 96, 3, 1],   # 14x14
            [6, 160, 3, 2],  # 7x7
            [6, 320, 1, 1],  # 7x7
        ]

        # (N,3,224,224) -> (N,32*w,112,112)
        features: list[nn.Module] = [ConvBNReLU6(3, input_channel, stride=2)]
        for t, c, n, s in inverted_residual_setting:
            output_channel = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel, s if i == 0 else 1, t))
                input_channel = output_channel
        features.append(ConvBNReLU6(input_channel, self.last_channel, kernel_size=1))  # (N,1280,7,7)
        self.features = nn.Sequential(*features)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(self.last_channel, num_classes),
        )

        init_cnn_weights(self, linear_std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(self.avgpool(x), 1)  # (N, last_channel)
        return self.classifier(x)


def _mobilenet_v2(width_mult: float, **kwargs) -> MobileNetV2:
    """Build MobileNet V2 at the given width multiplier."""
    return MobileNetV2(width_mult=width_mult, **kwargs)


@register_model(default_input="1,3,224,224")
def mobilenet_v2(**kwargs) -> MobileNetV2: return _mobilenet_v2(1.0, **kwargs)


@register_model(default_input="1,3,224,224")
def mobilenet_v2_140(**kwargs) -> MobileNetV2: return _mobilenet_v2(1.4, **kwargs)
