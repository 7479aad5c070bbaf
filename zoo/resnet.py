"""ResNet: deep residual networks, torchvision layout (v1.5, stride on the 3x3 conv).

Paper: "Deep Residual Learning for Image Recognition", Kaiming He, Xiangyu Zhang,
Shaoqing Ren, Jian Sun, 2015, arXiv:1512.03385.

Published complexity at 224x224 (multiply-adds, parameters; torchvision's model card):
    resnet18   1.81G MACs  11.69M params
    resnet34   3.66G MACs  21.80M params
    resnet50   4.09G MACs  25.56M params
    resnet101  7.80G MACs  44.55M params
The paper's Table 1 gives 1.8/3.6/3.8/7.6 GFLOPs (v1, stride on the first 1x1 conv of a
bottleneck); torchvision and this file put the stride on the 3x3 conv ("v1.5"), which
costs a little more in the bottleneck variants. Module names match torchvision, so
torchvision state dicts load unchanged.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._layers import init_cnn_weights
from ._registry import register_model


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding 1 and no bias."""
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution with no bias."""
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with an identity (or 1x1 projection) shortcut; resnet18/34."""

    expansion: int = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        """Args:
        inplanes: input channels.
        planes: output channels.
        stride: stride of the first 3x3 conv.
        downsample: shortcut projection when the shape changes, else None.
        """
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, plus shortcut; resnet50/101."""

    expansion: int = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        """Args:
        inplanes: input channels.
        planes: bottleneck width; the block outputs planes * 4 channels.
        stride: stride of the 3x3 conv (torchvision v1.5).
        downsample: shortcut projection when the shape changes, else None.
        """
        super().__init__()
        width = planes
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet for ImageNet: 7x7 stem, max pool, four stages, global pool, linear head."""

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: list[int],
        num_classes: int = 1000,
        zero_init_residual: bool = False,
    ) -> None:
        """Args:
        block: BasicBlock or Bottleneck.
        layers: blocks per stage, e.g. [3, 4, 6, 3] for resnet50.
        num_classes: classifier outputs.
        zero_init_residual: zero the last BN gamma of each block (torchvision option).
        """
        super().__init__()
        self.inplanes = 64
        # (N,3,224,224) -> (N,64,112,112) -> maxpool (N,64,56,56)
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        # stage outputs at 224: 56x56, 28x28, 14x14, 7x7; channels 64..512 (x4 for Bottleneck)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

        init_cnn_weights(self, linear_std=None)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)
                elif isinstance(m, BasicBlock):
                    nn.init.zeros_(m.bn2.weight)

    def _make_layer(
        self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int, stride: int = 1
    ) -> nn.Sequential:
        """One stage: a (possibly strided, projecting) first block, then `blocks - 1` more."""
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)  # (N, 512 * expansion)
        return self.fc(x)


_CFGS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], list[int]]] = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
    "resnet101": (Bottleneck, [3, 4, 23, 3]),
}


def _resnet(variant: str, **kwargs) -> ResNet:
    """Build a ResNet variant by name ("resnet18" ... "resnet101")."""
    block, layers = _CFGS[variant]
    return ResNet(block, layers, **kwargs)


@register_model(default_input="1,3,224,224")
def resnet18(**kwargs) -> ResNet: return _resnet("resnet18", **kwargs)


@register_model(default_input="1,3,224,224")
def resnet34(**kwargs) -> ResNet: return _resnet("resnet34", **kwargs)


@register_model(default_input="1,3,224,224")
def resnet50(**kwargs) -> ResNet: return _resnet("resnet50", **kwargs)


@register_model(default_input="1,3,224,224")
def resnet101(**kwargs) -> ResNet: return _resnet("resnet101", **kwargs)
