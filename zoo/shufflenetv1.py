"""ShuffleNet V1: pointwise group convolutions with channel shuffle.

Paper: "ShuffleNet: An Extremely Efficient Convolutional Neural Network for Mobile
Devices", Xiangyu Zhang, Xinyu Zhou, Mengxiao Lin, Jian Sun, 2017, arXiv:1707.01083.

Published complexity at 224x224 (multiply-adds; params from megvii's model card):
    g=3  0.5x / 1x / 1.5x / 2x   38 / 140 / 292 / 524 MFLOPs (ShuffleNetV2 paper Table 8)
                                 0.7 / 1.9 / 3.4 / 5.4 M params (megvii ShuffleNet-Series)
    1x   g=1 / 2 / 3 / 4 / 8     143 / 140 / 137 / 133 / 137 MFLOPs (ShuffleNetV1 Table 1)
Layout follows the official megvii PyTorch implementation (ShuffleNet-Series/ShuffleNetV1):
stage-2 output channels at 1x are 144/200/240/272/384 for g=1/2/3/4/8 (stages double);
width multipliers scale them, rounded to a multiple of 4*g so the bottleneck (out/4) and
every grouped conv divide evenly (g=3: 120/240/360/480 for 0.5x/1x/1.5x/2x, as megvii);
the stem is 12/24/24/48 channels for 0.5x/1x/1.5x/2x, as megvii. The first pointwise
conv of stage 2 is not grouped; stride-2 units concatenate a 3x3 avg-pooled shortcut,
so their residual branch outputs out - in channels. The classifier has no bias (megvii).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._layers import ChannelShuffle, init_cnn_weights
from ._registry import register_model


class ShuffleV1Block(nn.Module):
    """ShuffleNet unit: 1x1 GConv -> shuffle -> 3x3 DWConv -> 1x1 GConv, add or concat shortcut."""

    def __init__(self, inp: int, oup: int, groups: int, stride: int, first_group: bool = False) -> None:
        """Args:
        inp: input channels.
        oup: output channels (including the concatenated shortcut for stride 2).
        groups: groups of the pointwise convs.
        stride: 1 (add identity) or 2 (concat avg-pooled input).
        first_group: the first pointwise conv is dense (first unit of stage 2).
        """
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        self.stride = stride
        mid = oup // 4
        outputs = oup - inp if stride == 2 else oup
        g1 = 1 if first_group else groups

        # main branch (N,inp,H,W) -> (N,mid,H,W) -> (N,mid,H/s,W/s) -> (N,outputs,H/s,W/s)
        self.branch_main_1 = nn.Sequential(
            nn.Conv2d(inp, mid, 1, 1, 0, groups=g1, bias=False),  # pw group conv
            nn.BatchNorm2d(mid),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False),  # dw
            nn.BatchNorm2d(mid),
        )
        self.shuffle = ChannelShuffle(groups) if groups > 1 else nn.Identity()
        self.branch_main_2 = nn.Sequential(
            nn.Conv2d(mid, outputs, 1, 1, 0, groups=groups, bias=False),  # pw-linear group conv
            nn.BatchNorm2d(outputs),
        )
        self.branch_proj = nn.AvgPool2d(kernel_size=3, stride=2, padding=1) if stride == 2 else nn.Identity()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch_main_2(self.shuffle(self.branch_main_1(x)))
        if self.stride == 1:
            return self.relu(out + x)
        return torch.cat((self.branch_proj(x), self.relu(out)), dim=1)  # (N, oup, H/2, W/2)


class ShuffleNetV1(nn.Module):
    """ShuffleNet V1 for ImageNet: 3x3 stem, max pool, three stages of units, pool, linear."""

    def __init__(
        self,
        stage_out_channels: list[int],
        groups: int,
        stage_repeats: tuple[int, ...] = (4, 8, 4),
        num_classes: int = 1000,
    ) -> None:
        """Args:
        stage_out_channels: stem, stage2, stage3, stage4 channels.
        groups: groups of the pointwise convs.
        stage_repeats: units per stage.
        num_classes: classifier outputs.
        """
        super().__init__()
        input_channel = stage_out_channels[0]
        # (N,3,224,224) -> (N,24,112,112) -> maxpool (N,24,56,56)
        self.first_conv = nn.Sequential(
            nn.Conv2d(3, input_channel, 3, 2, 1, bias=False),
            nn.BatchNorm2d(input_channel),
            nn.ReLU(inplace=True),
        )
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

        # stage2: 28x28, stage3: 14x14, stage4: 7x7
        features: list[nn.Module] = []
        for idx, (repeats, output_channel) in enumerate(zip(stage_repeats, stage_out_channels[1:])):
            for i in range(repeats):
                features.append(
                    ShuffleV1Block(
                        input_channel, output_channel, groups,
                        stride=2 if i == 0 else 1, first_group=idx == 0 and i == 0,
                    )
                )
                input_channel = output_channel
        self.features = nn.Sequential(*features)
        self.globalpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(nn.Linear(input_channel, num_classes, bias=False))

        init_cnn_weights(self, linear_std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.first_conv(x))
        x = self.features(x)  # (N, stage4 channels, 7, 7)
        x = torch.flatten(self.globalpool(x), 1)
        return self.classifier(x)


# stage-2 output channels at 1x (paper Table 1)
_STAGE2_1X: dict[int, int] = {1: 144, 2: 200, 3: 240, 4: 272, 8: 384}
# stem channels per width multiplier (megvii)
_STEM: dict[float, int] = {0.5: 12, 1.0: 24, 1.5: 24, 2.0: 48}


def _shufflenet_v1(groups: int, width: float, **kwargs) -> ShuffleNetV1:
    """Build ShuffleNet V1 with `groups` pointwise groups at width multiplier 0.5 ... 2.0."""
    div = 4 * groups  # bottleneck = out/4 must split into `groups`
    c2 = max(div, int(_STAGE2_1X[groups] * width + div / 2) // div * div)
    channels = [_STEM[width], c2, 2 * c2, 4 * c2]
    return ShuffleNetV1(channels, groups, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v1_g3_x0_5(**kwargs) -> ShuffleNetV1: return _shufflenet_v1(3, 0.5, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v1_g3_x1_0(**kwargs) -> ShuffleNetV1: return _shufflenet_v1(3, 1.0, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v1_g3_x1_5(**kwargs) -> ShuffleNetV1: return _shufflenet_v1(3, 1.5, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v1_g3_x2_0(**kwargs) -> ShuffleNetV1: return _shufflenet_v1(3, 2.0, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v1_g1_x1_0(**kwargs) -> ShuffleNetV1: return _shufflenet_v1(1, 1.0, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v1_g2_x1_0(**kwargs) -> ShuffleNetV1: return _shufflenet_v1(2, 1.0, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v1_g4_x1_0(**kwargs) -> ShuffleNetV1: return _shufflenet_v1(4, 1.0, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v1_g8_x1_0(**kwargs) -> ShuffleNetV1: return _shufflenet_v1(8, 1.0, **kwargs)
