"""ShuffleNet V2: channel split, concat and channel shuffle; torchvision layout.

Paper: "ShuffleNet V2: Practical Guidelines for Efficient CNN Architecture Design",
Ningning Ma, Xiangyu Zhang, Hai-Tao Zheng, Jian Sun, 2018, arXiv:1807.11164.

Published complexity at 224x224 (paper Table 5, multiply-adds; torchvision params):
    shufflenet_v2_x0_5   41M MACs  1.366M params
    shufflenet_v2_x1_0  146M MACs  2.279M params
    shufflenet_v2_x1_5  299M MACs  3.504M params
    shufflenet_v2_x2_0  591M MACs  7.394M params
Module names match torchvision (conv1, maxpool, stage2-4, conv5, fc), so torchvision
state dicts load unchanged; the global pool is an nn.AdaptiveAvgPool2d (no parameters).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._layers import ChannelShuffle
from ._registry import register_model


class InvertedResidual(nn.Module):
    """ShuffleNet V2 unit: split (stride 1) or duplicate (stride 2), two branches, concat, shuffle."""

    def __init__(self, inp: int, oup: int, stride: int) -> None:
        """Args:
        inp: input channels.
        oup: output channels (each branch makes oup // 2).
        stride: 1 (basic unit, channel split) or 2 (down-sampling unit).
        """
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        self.stride = stride
        branch_features = oup // 2
        if stride == 1 and inp != branch_features << 1:
            raise ValueError("a stride-1 unit needs inp == oup")

        if stride > 1:
            # left branch: 3x3 dw (stride 2) -> BN -> 1x1 -> BN -> ReLU
            self.branch1 = nn.Sequential(
                nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False),
                nn.BatchNorm2d(inp),
                nn.Conv2d(inp, branch_features, 1, 1, 0, bias=False),
                nn.BatchNorm2d(branch_features),
                nn.ReLU(inplace=True),
            )
        else:
            self.branch1 = nn.Sequential()  # identity on the split-off half

        # right branch: 1x1 -> BN -> ReLU -> 3x3 dw -> BN -> 1x1 -> BN -> ReLU
        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if stride > 1 else branch_features, branch_features, 1, 1, 0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
            nn.Conv2d(branch_features, branch_features, 3, stride, 1, groups=branch_features, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.Conv2d(branch_features, branch_features, 1, 1, 0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
        )
        self.shuffle = ChannelShuffle(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)  # (N, C/2, H, W) each
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)  # (N, oup, H/2, W/2)
        return self.shuffle(out)


class ShuffleNetV2(nn.Module):
    """ShuffleNet V2 for ImageNet: 3x3 stem, max pool, three stages, 1x1 conv5, linear head."""

    def __init__(
        self,
        stages_repeats: list[int],
        stages_out_channels: list[int],
        num_classes: int = 1000,
    ) -> None:
        """Args:
        stages_repeats: units per stage (3 stages).
        stages_out_channels: conv1, stage2, stage3, stage4 and conv5 channels.
        num_classes: classifier outputs.
        """
        super().__init__()
        if len(stages_repeats) != 3 or len(stages_out_channels) != 5:
            raise ValueError("expected 3 stage repeats and 5 channel counts")
        self._stage_out_channels = stages_out_channels

        input_channels = 3
        output_channels = stages_out_channels[0]
        # (N,3,224,224) -> (N,24,112,112) -> maxpool (N,24,56,56)
        self.conv1 = nn.Sequential(
            nn.Conv2d(input_channels, output_channels, 3, 2, 1, bias=False),
            nn.BatchNorm2d(output_channels),
            nn.ReLU(inplace=True),
        )
        input_channels = output_channels
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

        # stage2: 28x28, stage3: 14x14, stage4: 7x7
        self.stage2: nn.Sequential
        self.stage3: nn.Sequential
        self.stage4: nn.Sequential
        stage_names = [f"stage{i}" for i in (2, 3, 4)]
        for name, repeats, output_channels in zip(stage_names, stages_repeats, stages_out_channels[1:]):
            seq = [InvertedResidual(input_channels, output_channels, 2)]
            seq += [InvertedResidual(output_channels, output_channels, 1) for _ in range(repeats - 1)]
            setattr(self, name, nn.Sequential(*seq))
            input_channels = output_channels

        output_channels = stages_out_channels[-1]
        self.conv5 = nn.Sequential(
            nn.Conv2d(input_channels, output_channels, 1, 1, 0, bias=False),
            nn.BatchNorm2d(output_channels),
            nn.ReLU(inplace=True),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(output_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.conv1(x))
        x = self.stage4(self.stage3(self.stage2(x)))
        x = self.conv5(x)  # (N, 1024 or 2048, 7, 7)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


_CHANNELS: dict[float, list[int]] = {
    0.5: [24, 48, 96, 192, 1024],
    1.0: [24, 116, 232, 464, 1024],
    1.5: [24, 176, 352, 704, 1024],
    2.0: [24, 244, 488, 976, 2048],
}


def _shufflenet_v2(width: float, **kwargs) -> ShuffleNetV2:
    """Build ShuffleNet V2 at width multiplier 0.5, 1.0, 1.5 or 2.0."""
    return ShuffleNetV2([4, 8, 4], _CHANNELS[width], **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v2_x0_5(**kwargs) -> ShuffleNetV2: return _shufflenet_v2(0.5, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v2_x1_0(**kwargs) -> ShuffleNetV2: return _shufflenet_v2(1.0, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v2_x1_5(**kwargs) -> ShuffleNetV2: return _shufflenet_v2(1.5, **kwargs)


@register_model(default_input="1,3,224,224")
def shufflenet_v2_x2_0(**kwargs) -> ShuffleNetV2: return _shufflenet_v2(2.0, **kwargs)
