"""MobileNet V1: a 3x3 stem and 13 depthwise-separable conv blocks.

Paper: "MobileNets: Efficient Convolutional Neural Networks for Mobile Vision
Applications", Andrew G. Howard, Menglong Zhu, Bo Chen, Dmitry Kalenichenko, Weijun
Wang, Tobias Weyand, Marco Andreetto, Hartwig Adam, 2017, arXiv:1704.04861.

Published complexity at 224x224 (paper Tables 1 and 6, multiply-adds, parameters):
    mobilenet_v1      569M MACs  4.2M params  (width 1.0)
    mobilenet_v1_050  149M MACs  1.3M params  (width 0.5)
Every conv is Conv-BN-ReLU; the head is global average pool and a linear classifier.
The paper's last depthwise conv is listed as stride 2 on a 7x7 map; like every public
implementation it is stride 1 here (the spatial size stays 7x7).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._layers import init_cnn_weights
from ._registry import register_model


class ConvBNReLU(nn.Sequential):
    """Conv2d (no bias, 'same' padding) -> BatchNorm2d -> ReLU."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int = 3, stride: int = 1, groups: int = 1) -> None:
        """Args:
        in_ch: input channels.
        out_ch: output channels.
        kernel_size: square kernel size.
        stride: convolution stride.
        groups: convolution groups (in_ch for depthwise).
        """
        super().__init__(
            nn.Conv2d(in_ch, out_ch, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(inplace=True),
        )


class DepthwiseSeparable(nn.Module):
    """3x3 depthwise Conv-BN-ReLU followed by 1x1 pointwise Conv-BN-ReLU."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1) -> None:
        """Args:
        in_ch: input channels.
        out_ch: output channels.
        stride: depthwise stride.
        """
        super().__init__()
        self.dw = ConvBNReLU(in_ch, in_ch, 3, stride, groups=in_ch)
        self.pw = ConvBNReLU(in_ch, out_ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pw(self.dw(x))


# (output channels, depthwise stride) of the 13 separable blocks at width 1.0
_BLOCKS: list[tuple[int, int]] = [
    (64, 1),    # 112x112
    (128, 2),   # 56x56
    (128, 1),
    (256, 2),   # 28x28
    (256, 1),
    (512, 2),   # 14x14
    (512, 1), (512, 1), (512, 1), (512, 1), (512, 1),
    (1024, 2),  # 7x7
    (1024, 1),
]


class MobileNetV1(nn.Module):
    """MobileNet V1 for ImageNet: 3x3 s2 stem, 13 separable blocks, pool, linear."""

    def __init__(self, width_mult: float = 1.0, num_classes: int = 1000, dropout: float = 0.0) -> None:
        """Args:
        width_mult: channel multiplier alpha (channels = int(c * alpha)).
        num_classes: classifier outputs.
        dropout: dropout before the classifier (0 disables it).
        """
        super().__init__()
        in_ch = int(32 * width_mult)
        # (N,3,224,224) -> (N,32a,112,112)
        layers: list[nn.Module] = [ConvBNReLU(3, in_ch, 3, 2)]
        for c, s in _BLOCKS:
            out_ch = int(c * width_mult)
            layers.append(DepthwiseSeparable(in_ch, out_ch, s))
            in_ch = out_ch
        self.features = nn.Sequential(*layers)  # (N,1024a,7,7)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(in_ch, num_classes)
        self.num_features = in_ch

        init_cnn_weights(self, linear_std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(self.avgpool(x), 1)  # (N, 1024a)
        return self.fc(self.dropout(x))


def _mobilenet_v1(width_mult: float, **kwargs) -> MobileNetV1:
    """Build MobileNet V1 at the given width multiplier."""
    return MobileNetV1(width_mult=width_mult, **kwargs)


@register_model(default_input="1,3,224,224")
def mobilenet_v1(**kwargs) -> MobileNetV1: return _mobilenet_v1(1.0, **kwargs)


@register_model(default_input="1,3,224,224")
def mobilenet_v1_050(**kwargs) -> MobileNetV1: return _mobilenet_v1(0.5, **kwargs)
