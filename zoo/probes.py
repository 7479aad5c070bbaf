"""ShuffleNetV2 guideline probes: the G1-G4 micro-benchmark networks, at 56x56.

Paper: "ShuffleNet V2: Practical Guidelines for Efficient CNN Architecture Design",
Ningning Ma, Xiangyu Zhang, Hai-Tao Zheng, Jian Sun, ECCV 2018, arXiv:1807.11164.
Appendix / Tables 1-4 (the four guidelines' benchmark networks). FLOPs here are
multiply-adds, as in the paper.

Every probe is a plain stack of `blocks` (default 10) identical units on a 1xCx56x56
input, bias-free convolutions, no BatchNorm. `scale` is the paper's x1/x2/x4 channel
multiplier: every channel count of the GPU x1 column is multiplied by it.

G1 (Table 1, "equal channel width minimizes MAC"), `G1Block`:
    1x1 conv c1->c2, then 1x1 conv c2->c1; no norm, no activation. The four rows keep
    the FLOPs fixed (hw*2*c1*c2 per block) while the ratio c1:c2 grows.
    g1_ratio_1_1 (128,128)  g1_ratio_1_2 (90,180)  g1_ratio_1_6 (52,312)  g1_ratio_1_12 (36,432)
G2 (Table 2, "excessive group convolution increases MAC"), `GroupConvStack`:
    1x1 group conv c->c with g groups per layer; c grows with g so FLOPs stay fixed.
    g2_groups_1 (c=128)  g2_groups_2 (180)  g2_groups_4 (256)  g2_groups_8 (360)
G3 (Table 3, "network fragmentation reduces the degree of parallelism"), c = 128:
    each block has the FLOPs of one 1x1 conv c->c (hw*c^2).
    g3_fragment_1: `SeriesBlock` with k=1 (a single 1x1 conv c->c).
    g3_series_k:   `SeriesBlock`, k 1x1 convs c_s->c_s in a row, c_s = round(c/sqrt(k))
                   (91 for k=2, 64 for k=4), so k*c_s^2 ~ c^2; the input has c_s channels.
    g3_parallel_k: `ParallelBlock`, k parallel 1x1 convs c->c/k on the same input,
                   concatenated (torch.cat) back to c channels; FLOPs = hw*c*c.
    With scale, c = 128*scale and c_s = round(c/sqrt(k)) from that c.
G4 (Table 4, "element-wise operations are non-negligible"), `BottleneckProbe`, c = 32:
    ResNet bottleneck 1x1 c->c/4, 3x3 c/4->c/4 (padding 1), 1x1 c/4->c, ReLU after each
    conv (the last one after the identity shortcut add: relu(conv3(...) + x)).
    relu=False builds no ReLU modules at all; shortcut=False drops the add.
    g4_relu_shortcut (both)  g4_relu_only  g4_shortcut_only  g4_plain (neither)

`PAPER` holds the paper's measured speeds per registered name and `TABLES` each table's
names in row order, for "this device vs the paper" comparisons. Units: GPU in
batches/s (one GTX 1080Ti, CUDNN 7.0), CPU/ARM in images/s (Snapdragon 810, single
thread; Table 1 labels the column "ARM", Tables 2-4 "CPU"); higher = faster. The CPU/ARM
columns were measured at narrower widths than the GPU ones: see each entry's
"cpu_channels" (Table 1 ARM x1 is about GPU x1 / 4, Tables 2-3 CPU x1 is GPU x1 / 2,
Table 4 uses c = 32/64/128 on both).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ._registry import register_model


def _conv1x1(cin: int, cout: int, groups: int = 1) -> nn.Conv2d:
    """1x1 convolution, no bias."""
    return nn.Conv2d(cin, cout, kernel_size=1, groups=groups, bias=False)


# ----------------------------------------------------------------------------- G1
class G1Block(nn.Module):
    """1x1 conv c1->c2 then 1x1 conv c2->c1 (Table 1); no norm, no activation."""

    def __init__(self, c1: int, c2: int) -> None:
        super().__init__()
        self.conv1 = _conv1x1(c1, c2)
        self.conv2 = _conv1x1(c2, c1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class G1Net(nn.Module):
    """`blocks` stacked G1Blocks on a (N, c1, H, W) input."""

    def __init__(self, c1: int, c2: int, blocks: int = 10) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[G1Block(c1, c2) for _ in range(blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def _g1(c1: int, c2: int, scale: int = 1, blocks: int = 10, **kwargs) -> G1Net:
    return G1Net(c1 * scale, c2 * scale, blocks=blocks, **kwargs)


@register_model(default_input="1,128,56,56")
def g1_ratio_1_1(scale: int = 1, blocks: int = 10, **kwargs) -> G1Net: return _g1(128, 128, scale, blocks, **kwargs)


@register_model(default_input="1,90,56,56")
def g1_ratio_1_2(scale: int = 1, blocks: int = 10, **kwargs) -> G1Net: return _g1(90, 180, scale, blocks, **kwargs)


@register_model(default_input="1,52,56,56")
def g1_ratio_1_6(scale: int = 1, blocks: int = 10, **kwargs) -> G1Net: return _g1(52, 312, scale, blocks, **kwargs)


@register_model(default_input="1,36,56,56")
def g1_ratio_1_12(scale: int = 1, blocks: int = 10, **kwargs) -> G1Net: return _g1(36, 432, scale, blocks, **kwargs)


# ----------------------------------------------------------------------------- G2
class GroupConvStack(nn.Module):
    """`blocks` stacked 1x1 group convs c->c with `groups` groups (Table 2)."""

    def __init__(self, c: int, groups: int, blocks: int = 10) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[_conv1x1(c, c, groups) for _ in range(blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _g2(c: int, groups: int, scale: int = 1, blocks: int = 10, **kwargs) -> GroupConvStack:
    return GroupConvStack(c * scale, groups, blocks=blocks, **kwargs)


@register_model(default_input="1,128,56,56")
def g2_groups_1(scale: int = 1, blocks: int = 10, **kwargs) -> GroupConvStack: return _g2(128, 1, scale, blocks, **kwargs)


@register_model(default_input="1,180,56,56")
def g2_groups_2(scale: int = 1, blocks: int = 10, **kwargs) -> GroupConvStack: return _g2(180, 2, scale, blocks, **kwargs)


@register_model(default_input="1,256,56,56")
def g2_groups_4(scale: int = 1, blocks: int = 10, **kwargs) -> GroupConvStack: return _g2(256, 4, scale, blocks, **kwargs)


@register_model(default_input="1,360,56,56")
def g2_groups_8(scale: int = 1, blocks: int = 10, **kwargs) -> GroupConvStack: return _g2(360, 8, scale, blocks, **kwargs)


# ----------------------------------------------------------------------------- G3
def series_width(c: int, k: int) -> int:
    """Width of each conv in a k-fragment-series block with the FLOPs of one c->c conv."""
    return round(c / math.sqrt(k))


class SeriesBlock(nn.Module):
    """k 1x1 convs c->c in a row (k=1 is the 1-fragment block), Table 3."""

    def __init__(self, c: int, k: int) -> None:
        super().__init__()
        self.convs = nn.Sequential(*[_conv1x1(c, c) for _ in range(k)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(x)


class ParallelBlock(nn.Module):
    """k parallel 1x1 convs c->c/k on the same input, concatenated to c channels (Table 3)."""

    def __init__(self, c: int, k: int) -> None:
        super().__init__()
        if c % k:
            raise ValueError(f"ParallelBlock: c={c} is not divisible by k={k}")
        self.branches = nn.ModuleList([_conv1x1(c, c // k) for _ in range(k)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=1)


class FragmentNet(nn.Module):
    """`blocks` stacked SeriesBlocks or ParallelBlocks, held in an nn.Sequential."""

    def __init__(self, block: type[SeriesBlock] | type[ParallelBlock], c: int, k: int, blocks: int = 10) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[block(c, k) for _ in range(blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def _g3(kind: str, k: int, scale: int = 1, blocks: int = 10, **kwargs) -> FragmentNet:
    c = 128 * scale
    if kind == "series":
        return FragmentNet(SeriesBlock, series_width(c, k), k, blocks=blocks, **kwargs)
    return FragmentNet(ParallelBlock, c, k, blocks=blocks, **kwargs)


@register_model(default_input="1,128,56,56")
def g3_fragment_1(scale: int = 1, blocks: int = 10, **kwargs) -> FragmentNet: return _g3("series", 1, scale, blocks, **kwargs)


@register_model(default_input="1,91,56,56")
def g3_series_2(scale: int = 1, blocks: int = 10, **kwargs) -> FragmentNet: return _g3("series", 2, scale, blocks, **kwargs)


@register_model(default_input="1,64,56,56")
def g3_series_4(scale: int = 1, blocks: int = 10, **kwargs) -> FragmentNet: return _g3("series", 4, scale, blocks, **kwargs)


@register_model(default_input="1,128,56,56")
def g3_parallel_2(scale: int = 1, blocks: int = 10, **kwargs) -> FragmentNet: return _g3("parallel", 2, scale, blocks, **kwargs)


@register_model(default_input="1,128,56,56")
def g3_parallel_4(scale: int = 1, blocks: int = 10, **kwargs) -> FragmentNet: return _g3("parallel", 4, scale, blocks, **kwargs)


# ----------------------------------------------------------------------------- G4
class BottleneckProbe(nn.Module):
    """ResNet bottleneck 1x1 c->c/4, 3x3, 1x1 c/4->c; optional ReLUs and identity shortcut."""

    def __init__(self, c: int, relu: bool = True, shortcut: bool = True) -> None:
        super().__init__()
        mid = c // 4
        self.shortcut = shortcut
        self.conv1 = _conv1x1(c, mid)
        self.conv2 = nn.Conv2d(mid, mid, kernel_size=3, padding=1, bias=False)
        self.conv3 = _conv1x1(mid, c)
        if relu:
            self.relu1 = nn.ReLU(inplace=False)
            self.relu2 = nn.ReLU(inplace=False)
            self.relu3 = nn.ReLU(inplace=False)
        else:
            self.relu1 = self.relu2 = self.relu3 = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        if self.relu1 is not None:
            out = self.relu1(out)
        out = self.conv2(out)
        if self.relu2 is not None:
            out = self.relu2(out)
        out = self.conv3(out)
        if self.shortcut:
            out = out + x
        if self.relu3 is not None:
            out = self.relu3(out)
        return out


class BottleneckNet(nn.Module):
    """`blocks` stacked BottleneckProbes on a (N, c, H, W) input."""

    def __init__(self, c: int, relu: bool = True, shortcut: bool = True, blocks: int = 10) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[BottleneckProbe(c, relu, shortcut) for _ in range(blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def _g4(relu: bool, shortcut: bool, scale: int = 1, blocks: int = 10, **kwargs) -> BottleneckNet:
    return BottleneckNet(32 * scale, relu=relu, shortcut=shortcut, blocks=blocks, **kwargs)


@register_model(default_input="1,32,56,56")
def g4_relu_shortcut(scale: int = 1, blocks: int = 10, **kwargs) -> BottleneckNet: return _g4(True, True, scale, blocks, **kwargs)


@register_model(default_input="1,32,56,56")
def g4_relu_only(scale: int = 1, blocks: int = 10, **kwargs) -> BottleneckNet: return _g4(True, False, scale, blocks, **kwargs)


@register_model(default_input="1,32,56,56")
def g4_shortcut_only(scale: int = 1, blocks: int = 10, **kwargs) -> BottleneckNet: return _g4(False, True, scale, blocks, **kwargs)


@register_model(default_input="1,32,56,56")
def g4_plain(scale: int = 1, blocks: int = 10, **kwargs) -> BottleneckNet: return _g4(False, False, scale, blocks, **kwargs)


# ----------------------------------------------------------------------------- paper figures
def _row(table: int, gpu: tuple, gpu_ch: tuple, cpu: tuple, cpu_ch: tuple) -> dict:
    """One table row: speeds and the channel widths they were measured at, keyed by scale."""
    return {
        "table": table,
        "gpu": dict(zip((1, 2, 4), gpu)),            # batches/s, GTX 1080Ti
        "gpu_channels": dict(zip((1, 2, 4), gpu_ch)),
        "cpu": dict(zip((1, 2, 4), cpu)),            # images/s, ARM Snapdragon 810, 1 thread
        "cpu_channels": dict(zip((1, 2, 4), cpu_ch)),
        "cpu_label": "ARM" if table == 1 else "CPU",  # the paper's column header
    }


def _x124(*widths):
    """Channel widths at x1/x2/x4 from the x1 width(s)."""
    return tuple(tuple(w * s for w in widths) if len(widths) > 1 else widths[0] * s for s in (1, 2, 4))


PAPER: dict[str, dict] = {
    # Table 1: (c1, c2); GPU batches/s | ARM images/s.
    "g1_ratio_1_1": _row(1, (1480, 723, 232), _x124(128, 128), (76.2, 21.7, 5.3), _x124(32, 32)),
    "g1_ratio_1_2": _row(1, (1296, 586, 206), _x124(90, 180), (72.9, 20.5, 5.1), _x124(22, 44)),
    "g1_ratio_1_6": _row(1, (876, 489, 189), _x124(52, 312), (69.1, 17.9, 4.6), _x124(13, 78)),
    "g1_ratio_1_12": _row(1, (748, 392, 163), _x124(36, 432), (57.6, 15.1, 4.4), _x124(9, 108)),
    # Table 2: c; GPU batches/s | CPU images/s.
    "g2_groups_1": _row(2, (2451, 1289, 437), _x124(128), (40.0, 10.2, 2.3), _x124(64)),
    "g2_groups_2": _row(2, (1725, 873, 341), _x124(180), (35.0, 9.5, 2.2), _x124(90)),
    "g2_groups_4": _row(2, (1026, 644, 338), _x124(256), (32.9, 8.7, 2.1), _x124(128)),
    "g2_groups_8": _row(2, (634, 445, 230), _x124(360), (27.8, 7.5, 1.8), _x124(180)),
    # Table 3: c is the 1-fragment width; GPU at 128/256/512 | CPU at 64/128/256.
    "g3_fragment_1": _row(3, (2446, 1274, 434), _x124(128), (40.2, 10.1, 2.3), _x124(64)),
    "g3_series_2": _row(3, (1790, 909, 336), _x124(128), (38.6, 10.1, 2.2), _x124(64)),
    "g3_series_4": _row(3, (752, 745, 349), _x124(128), (38.4, 10.1, 2.3), _x124(64)),
    "g3_parallel_2": _row(3, (1537, 803, 320), _x124(128), (33.4, 9.1, 2.2), _x124(64)),
    "g3_parallel_4": _row(3, (691, 572, 292), _x124(128), (35.0, 8.4, 2.1), _x124(64)),
    # Table 4: c at 32/64/128 on both; GPU batches/s | CPU images/s.
    "g4_relu_shortcut": _row(4, (2427, 2066, 1436), _x124(32), (56.7, 16.9, 5.0), _x124(32)),
    "g4_relu_only": _row(4, (2647, 2256, 1735), _x124(32), (61.9, 18.8, 5.2), _x124(32)),
    "g4_shortcut_only": _row(4, (2672, 2121, 1458), _x124(32), (57.3, 18.2, 5.1), _x124(32)),
    "g4_plain": _row(4, (2842, 2376, 1782), _x124(32), (66.3, 20.2, 5.4), _x124(32)),
}

TABLES: dict[str, tuple[str, ...]] = {
    "G1": ("g1_ratio_1_1", "g1_ratio_1_2", "g1_ratio_1_6", "g1_ratio_1_12"),
    "G2": ("g2_groups_1", "g2_groups_2", "g2_groups_4", "g2_groups_8"),
    "G3": ("g3_fragment_1", "g3_series_2", "g3_series_4", "g3_parallel_2", "g3_parallel_4"),
    "G4": ("g4_relu_shortcut", "g4_relu_only", "g4_shortcut_only", "g4_plain"),
}
