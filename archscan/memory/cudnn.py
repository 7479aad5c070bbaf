"""The workspace cuDNN takes from the caching allocator for one convolution, as torch 2.11 calls it
with ``cudnn.benchmark`` off: a rule read from recorded runs, not cuDNN's choice derived.

Takes a convolution's input and weight shapes, stride, padding, dilation, groups, dtype, the layout
torch hands cuDNN (``channels_last``: ``cudnn_conv_suggest_memory_format`` gives ChannelsLast) and,
for a backward, its output mask. Gives the bytes each cuDNN call asks the caching allocator for and
frees before the op returns (the request; the allocator rounds it to its blocks): one workspace in a
forward; in a backward one for the input gradient, then one for the weight gradient
(``conv_backward_workspaces``), each taken after the gradient it makes. Not workspace: the results,
the layout copies torch makes before calling cuDNN, the bias gradient's reduction.

With the benchmark off torch asks cuDNN's heuristics for engines and runs the first that builds;
the workspace is that engine's. Which engine wins cannot be derived offline, so this is the rule
the recorded runs follow: torch 2.11, cuDNN 9.19, TF32 on, compute capability 9.0 (an H200 and an
H100), float32, batches 16 to 256; tests/gpu_truth/conv_workspaces.json, written by
benchmarks/extract_conv_workspaces.py. ``x``, ``y``, ``w``: the input's, output's and weight's bytes;
``T = x + y + w`` (``x + y`` for a 1×1 kernel); ``N`` the batch; MACs the multiply-adds.

* NCHW, k×k or strided: forward ``T`` (a 1×1 kernel: ``x + w``), input gradient ``T``, weight
  gradient ``T + min(16 w, 8 MiB)``.
* NCHW, 1×1 stride 1: forward and input gradient 400, weight gradient ``min(N w, T)``; on maps of
  at most 7×7 the forward takes ``x + w`` from 1.5e9 MACs, the input gradient ``T`` from 0.9e9.
* NCHW stem (groups 1, fewer than 4 input channels): nothing below 3e9 MACs (forward, input
  gradient) and 1e9 (weight gradient), else as k×k.
* Depthwise, NCHW, not float16: nothing (torch's own ``_conv_depthwise2d`` runs it, not cuDNN).
* Depthwise, channels-last or float16 (cuDNN; torch's further conditions for float16 NCHW are left
  out, an upper bound): nothing forward and input gradient; weight gradient ``8 x + 10 MiB`` on
  maps of 28×28 or more, nothing below.
* Channels-last, not depthwise: forward and input gradient 512, weight gradient ``min(16 w, 8 MiB)``.

Why, as far as the data shows: with NCHW tensors cuDNN's large-problem engines are NHWC tensor-core
engines that transpose their operands through the workspace (``T``, plus 16 or 147 bytes),
and a weight gradient adds the partial sums of a split reduction (16 weights' worth, at most 8 MiB).
Small problems run NCHW engines with no or a 400-byte workspace: 1×1 convolutions on 14×14 or larger
maps at every recorded size (up to 3.3e9 MACs), on 7×7 maps below the forward's and the input
gradient's switch, and 3-channel stems below theirs (``SWITCH_MACS``: each switch lies between two
recorded problems). A 1×1 NCHW weight gradient keeps one partial gradient per image (``N w``) or
transposes, whichever is smaller; a 1×1 forward on the NHWC engines transposes the input and the
weight only (``x + w``), the smaller of the two sizes recorded (``x + y`` in some runs), since an
over-predicted transient opens a segment the run never had: ResNet-50 b64's reserved peak comes out
28% high with ``x + y``.

Fit on the 555 recorded calls (a backward graded by the worse of its two; by run and by name in
tests/test_cudnn_workspace.py): 298 match (within 512 bytes, neither 0 alone), 62 are within 2×, 179
differ but are both under 1 MiB (the small pool's; mostly 400 bytes for none), 16 are outside 2×;
7.40 GB predicted in all for 7.92 GB recorded. Replayed through ``allocator.py`` with the rule's
workspaces in place of the recorded ones, each run's reserved peak comes out within 1.3% (without
workspaces: up to 6.7% low; ``benchmarks/extract_conv_workspaces.py --replay``).

Where the data says nothing the rule keeps its form, an upper bound there: ``T`` for k×k
convolutions of 4 or more channels below the smallest recorded (3.3e9 MACs), for grouped ones and
for 16-bit dtypes (whose engines transpose as float32's do); other compute capabilities get the
9.0 rule (``capability`` is taken for the day they differ). A transposed convolution runs its
equivalent convolution's engines with the passes swapped (its forward is the input gradient of the
convolution from its output to its input): pass that convolution.

Units: bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

MiB = 1 << 20
POINTWISE_BYTES = 400            # the NCHW 1×1 engines' request, forward and input gradient
CHANNELS_LAST_BYTES = 512        # forward and input gradient of a channels-last convolution
SMALL_MAP = 7 * 7                # 1×1 convolutions on maps of at most this many pixels can switch
STEM_CHANNELS = 4                # an ungrouped convolution of fewer input channels: a stem
SPLIT_SLICES, SPLIT_CAP = 16, 8 * MiB   # a split weight gradient's partial sums: min(16 w, 8 MiB)
DEPTHWISE_MAP = 28 * 28          # cuDNN's depthwise weight gradient takes 8 x + 10 MiB from here on
DEPTHWISE_EXTRA = 10 * MiB
# the MACs from which an NCHW problem of the class runs the transposing NHWC engines, per pass
# (forward, input gradient, weight gradient), each between the two recorded problems named
SWITCH_MACS = {
    "pointwise": (1.5e9,    # MobileNetV2 320->1280 b64 (1.28e9) NCHW, ResNet-50 512->2048 b32 (1.60e9) NHWC
                  0.9e9,    # EfficientNet-B0 192->1152 b64 (0.69e9) NCHW, MobileNetV2 960->320 b64 (0.96e9) NHWC
                  None),    # the weight gradient: min(N w, T) at any size
    "stem": (3e9,           # EfficientNet-B0's stem b256 (2.77e9) NCHW, ResNet-50's b32 (3.78e9) NHWC
             3e9,           # never recorded (a stem's input needs no gradient): the forward's
             1e9),          # MobileNetV2's stem b64 (0.69e9) NCHW, ViT-B/16's patches b16 (1.85e9) NHWC
}


@dataclass(frozen=True)
class Sizes:
    """What the rule reads of one convolution (bytes, MACs, output pixels)."""
    x: int
    y: int
    w: int
    batch: int
    macs: int
    pixels: int
    one_by_one: bool             # every kernel dim 1

    @property
    def t(self) -> int:
        """The NHWC engines' transposes: input, output and (unless 1×1, the same in both layouts) weight."""
        return self.x + self.y + (0 if self.one_by_one else self.w)


def sizes(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int], padding: Sequence[int],
          dilation: Sequence[int], dtype: torch.dtype) -> Sizes:
    """The convolution's bytes and MACs: [N, C_in, *S] * [C_out, C_in/groups, *K] -> [N, C_out, *S_out]."""
    n, _, *spatial = x_shape
    c_out, c_per_group, *kernel = w_shape
    out = [(s + 2 * p - d * (k - 1) - 1) // st + 1
           for s, k, st, p, d in zip(spatial, kernel, stride, padding, dilation)]
    item = dtype.itemsize
    return Sizes(x=math.prod(x_shape) * item, y=n * c_out * math.prod(out) * item, w=math.prod(w_shape) * item,
                 batch=n, macs=n * math.prod(out) * c_out * c_per_group * math.prod(kernel),
                 pixels=math.prod(out), one_by_one=all(k == 1 for k in kernel))


def _split(s: Sizes) -> int:
    """A split weight gradient's partial sums."""
    return min(SPLIT_SLICES * s.w, SPLIT_CAP)


def _nhwc(kind: str, s: Sizes, pass_: int) -> bool:
    """Does a problem of the class run the transposing NHWC engines in this pass (0 forward, 1 input
    gradient, 2 weight gradient)?"""
    if kind == "pointwise" and s.pixels > SMALL_MAP:
        return False
    return s.macs >= SWITCH_MACS[kind][pass_]


# class -> (forward, input gradient, weight gradient) workspace requests
RULES: dict[str, tuple[Callable[[Sizes], int], ...]] = {
    "nchw": (lambda s: s.x + s.w if s.one_by_one else s.t,
             lambda s: s.t,
             lambda s: s.t + _split(s)),
    "nchw pointwise": (lambda s: s.x + s.w if _nhwc("pointwise", s, 0) else POINTWISE_BYTES,
                       lambda s: s.t if _nhwc("pointwise", s, 1) else POINTWISE_BYTES,
                       lambda s: min(s.batch * s.w, s.t)),
    "nchw stem": (lambda s: s.t if _nhwc("stem", s, 0) else 0,
                  lambda s: s.t if _nhwc("stem", s, 1) else 0,
                  lambda s: s.t + _split(s) if _nhwc("stem", s, 2) else 0),
    "depthwise, torch's kernel": (lambda s: 0, lambda s: 0, lambda s: 0),
    "depthwise, cuDNN": (lambda s: 0, lambda s: 0,
                         lambda s: 8 * s.x + DEPTHWISE_EXTRA if s.pixels >= DEPTHWISE_MAP else 0),
    "channels-last": (lambda s: CHANNELS_LAST_BYTES, lambda s: CHANNELS_LAST_BYTES, _split),
}


def conv_class(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int], groups: int,
               dtype: torch.dtype, channels_last: bool = False) -> str:
    """The row of ``RULES`` a convolution falls in."""
    c_in, c_per_group = x_shape[1], w_shape[1]
    if groups > 1 and c_per_group == 1 and c_in == groups:
        # torch's use_cudnn_depthwise: channels-last always, NCHW only for float16
        return "depthwise, cuDNN" if channels_last or dtype == torch.float16 else "depthwise, torch's kernel"
    if channels_last:
        return "channels-last"
    if all(k == 1 for k in w_shape[2:]) and all(s == 1 for s in stride):
        return "nchw pointwise"
    return "nchw stem" if groups == 1 and c_in < STEM_CHANNELS else "nchw"


def conv_workspaces(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int], groups: int, dtype: torch.dtype, *,
                    capability: tuple[int, int] = (9, 0), channels_last: bool = False) -> tuple[int, int, int]:
    """(forward, input gradient, weight gradient) workspace requests of one convolution."""
    s = sizes(x_shape, w_shape, stride, padding, dilation, dtype)
    rules = RULES[conv_class(x_shape, w_shape, stride, groups, dtype, channels_last)]
    return tuple(rule(s) for rule in rules)


def conv_backward_workspaces(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                             padding: Sequence[int], dilation: Sequence[int], groups: int,
                             dtype: torch.dtype, *, backward_mask: Sequence[bool] = (True, True, True),
                             capability: tuple[int, int] = (9, 0), channels_last: bool = False) -> tuple[int, int]:
    """(input gradient, weight gradient) workspaces of a convolution's backward, 0 where the mask
    (torch's ``output_mask``) leaves the gradient out."""
    _, data, weight = conv_workspaces(x_shape, w_shape, stride, padding, dilation, groups, dtype,
                                      capability=capability, channels_last=channels_last)
    return (data if backward_mask[0] else 0), (weight if backward_mask[1] else 0)


def conv_workspace(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                   padding: Sequence[int], dilation: Sequence[int], groups: int, dtype: torch.dtype, *,
                   backward_mask: Sequence[bool] | None = None, capability: tuple[int, int] = (9, 0),
                   channels_last: bool = False) -> int:
    """Bytes cuDNN's workspace asks the caching allocator for in a convolution's forward (no
    ``backward_mask``) or, the larger of its two, in its backward (``backward_mask``: torch's
    ``output_mask``)."""
    # [N, C_in, *S] * [C_out, C_in/groups, *K] -> one transient request
    if backward_mask is None:
        return conv_workspaces(x_shape, w_shape, stride, padding, dilation, groups, dtype,
                               capability=capability, channels_last=channels_last)[0]
    return max(conv_backward_workspaces(x_shape, w_shape, stride, padding, dilation, groups, dtype,
                                        backward_mask=backward_mask, capability=capability,
                                        channels_last=channels_last))
