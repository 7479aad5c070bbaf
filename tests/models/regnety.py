"""A RegNetY-shaped network (Radosavovic et al. 2020): stages of residual bottlenecks with grouped 3x3
convs and squeeze-excite, nested as torchvision nests them (a Sequential of Sequential stages whose
blocks hold a Sequential transform of conv-norm-activation Sequentials). ``RegNetY()`` has
regnet_y_400mf's widths, depths and group width: 4,344,144 parameters, as torchvision publishes."""
from collections import OrderedDict
import torch
from torch import nn


class ConvNormAct(nn.Sequential):
    def __init__(self, cin, cout, k=1, stride=1, groups=1, act=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act:
            layers.append(nn.ReLU(inplace=True))
        super().__init__(*layers)


class SE(nn.Module):
    def __init__(self, c, squeeze):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)
        self.activation, self.scale_activation = nn.ReLU(), nn.Sigmoid()

    def forward(self, x):
        s = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return s * x


class Transform(nn.Sequential):
    def __init__(self, cin, cout, stride, group_width, se_ratio=0.25):
        layers = OrderedDict()
        layers["a"] = ConvNormAct(cin, cout)
        layers["b"] = ConvNormAct(cout, cout, 3, stride, groups=cout // group_width)
        layers["se"] = SE(cout, int(round(se_ratio * cin)))
        layers["c"] = ConvNormAct(cout, cout, act=False)
        super().__init__(layers)


class Block(nn.Module):
    def __init__(self, cin, cout, stride, group_width):
        super().__init__()
        self.proj = ConvNormAct(cin, cout, 1, stride, act=False) if cin != cout or stride != 1 else None
        self.f = Transform(cin, cout, stride, group_width)
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = (self.proj(x) if self.proj is not None else x) + self.f(x)
        return self.activation(x)


class Stage(nn.Sequential):
    def __init__(self, cin, cout, stride, depth, group_width, index):
        super().__init__()
        for i in range(depth):
            self.add_module(f"block{index}-{i}", Block(cin if i == 0 else cout, cout, stride if i == 0 else 1, group_width))


class RegNetY(nn.Module):
    def __init__(self, widths=(48, 104, 208, 440), depths=(1, 3, 6, 6), group_width=8):
        super().__init__()
        self.stem = ConvNormAct(3, 32, 3, 2)
        stages, cin = [], 32
        for i, (w, d) in enumerate(zip(widths, depths)):
            stages.append((f"block{i + 1}", Stage(cin, w, 2, d, group_width, i + 1)))
            cin = w
        self.trunk_output = nn.Sequential(OrderedDict(stages))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, 1000)

    def forward(self, x):
        return self.fc(self.avgpool(self.trunk_output(self.stem(x))).flatten(1))


def small():
    """regnet_y_200mf-like widths and depths."""
    return RegNetY(widths=(24, 56, 152, 368), depths=(1, 1, 4, 7))
