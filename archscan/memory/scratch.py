"""Scratch a kernel allocates inside itself, invisible at the dispatcher: one registry, keyed by
the execution model (``archscan.memory.gpu``: the CPU's kernels or a GPU's) and the op.

Each entry takes the op's arguments and result (fake tensors: shapes, dtypes, strides) and
returns the bytes the kernel holds at its worst moment on top of the result it returns.

The CPU's entries are read from the allocator's events of torch 2.13's CPU kernels (oneDNN
convolution, whose choices differ between AVX-512 and AVX2 CPUs: ``onednn_block``), what the
tests' oracle, the CPU allocator under ``torch.profiler``, sees: ``benchmarks/probe_scratch.py``
prints them for any shape. The GPU's are the workspaces torch 2.11's CUDA kernels take from the
caching allocator, read from the allocator's events recorded on an H200 (``tests/gpu_truth``):
the fused attention backwards, the reductions' staging buffers (``reduction.py``) and cuDNN's
convolution workspaces (``cudnn.py``: a rule read from the recorded runs). cuBLAS's workspace is allocated once per process and kept
(``gpu.LIBRARY_BYTES``), not per op.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Callable

import torch

from .gpu import current
from .cudnn import conv_backward_workspaces, conv_workspaces
from .reduction import reduction_scratch, threads_per_sm
from . import rnn

aten = torch.ops.aten

Scratch = Callable[..., int]
_SCRATCH: dict[str, dict[Any, Scratch]] = {"cpu": {}, "cuda": {}}


def register_scratch(*ops, on: str = "cpu") -> Callable[[Scratch], Scratch]:
    """Register a scratch formula for the ops (OpOverloadPackets) under one execution model
    ('cpu' or 'cuda'); each op has one there."""
    def wrap(fn: Scratch) -> Scratch:
        for op in ops:
            if op in _SCRATCH[on]:
                raise ValueError(f"{on} scratch formula for {op} registered twice")
            _SCRATCH[on][op] = fn
        return fn
    return wrap


def scratch_bytes(func, args: tuple, kwargs: dict, out: Any) -> int:
    """The transient bytes of ``func`` beyond its result under the current execution model (0
    for an op with no entry)."""
    fn = _SCRATCH["cuda" if current().is_gpu else "cpu"].get(func.overloadpacket)
    if fn is None:
        return 0
    try:
        return int(fn(*args, out=out, **kwargs))
    except Exception:
        return 0


def _conv_kind(x, w, stride, padding, dilation, transposed, groups, backward: bool = False) -> str | None:
    """A convolution the CPU's scratch entries do not model, by name; None for one they model:
    torch's own im2col kernels (``Slow2d``, ``Slow3d``: 1-, 2- and 3-D) and oneDNN's 1-, 2- and 3-D
    forward kernels, its 1- and 2-D backward, and the transposed 2-D ones ``_plain_deconvolution``
    models. Named: oneDNN's 3-D backward (its weight gradient's scratchpad follows the thread
    partition), its gemm kernel for groups narrower than its block, the other transposed
    convolutions, dilated ones, and channels-last ones but a depthwise one at stride 1
    (``_channels_last_depthwise``)."""
    if not isinstance(x, torch.Tensor):
        return None
    dims = x.dim() - 2
    if transposed:
        return None if _plain_deconvolution(x, w, stride, padding, dilation, groups) else f"conv_transpose{dims}d"
    if _slow_cpu(x, w, stride, padding, dilation, groups) or _channels_last_depthwise(x, w, stride, padding, dilation, groups) \
            or (_onednn_cpu(x, w, stride, padding, dilation, groups) and not _onednn_gemm(x, w, groups)
                and not (backward and dims == 3) and not _avx512_unread(x, backward)):
        return None
    notes = ", ".join(n for n, on in (("bfloat16", x.dtype == torch.bfloat16), ("backward", backward)) if on)
    return f"conv{dims}d" + (f" ({notes})" if notes else "")


def _avx512_unread(x: torch.Tensor, backward: bool) -> bool:
    """oneDNN's kernels on an AVX-512 CPU that the entries were not read from: the backward (its
    scratch follows the kernel oneDNN picks per ISA: on a CPU with AMX a patch embedding's was 4×
    the entry's) and bfloat16 (AMX and AVX512-BF16 run it natively, other AVX-512 CPUs convert);
    the float32 forward is modelled on AVX-512 as on AVX2."""
    return onednn_block() != 8 and (backward or x.dtype != torch.float32)


def _plain_deconvolution(x, weight, stride, padding, dilation, groups) -> bool:
    """A transposed 2-D convolution whose CPU scratch is modelled: float32 NCHW on oneDNN's AVX2
    kernels (channels blocked by 8), kernel equal to its stride (the patches do not overlap: a
    UNet's or a segmentation head's 2×2, stride-2 upsampling), no padding or dilation, one group,
    channels a multiple of 8. Read from the allocator's events of torch 2.13 on an AVX2 CPU; the
    other transposed convolutions, and these on AVX-512, are named unmodelled."""
    return (isinstance(x, torch.Tensor) and x.dim() == 4 and x.dtype == torch.float32 and x.is_contiguous()
            and _cpu_backend(x, weight, stride, padding, dilation, True, groups) == "MkldnnTranspose" and onednn_block() == 8
            and groups == 1
            and tuple(weight.shape[2:]) == tuple(stride) and all(p == 0 for p in padding)
            and all(d == 1 for d in dilation) and x.shape[1] % 8 == 0 and weight.shape[1] % 8 == 0)


@functools.lru_cache(maxsize=None)
def _onednn_matmul(dtype: torch.dtype) -> bool:
    """Does torch hand a matrix product of ``dtype`` to oneDNN on this CPU (half precision where
    oneDNN has kernels for it: ``torch.ops.mkldnn._is_mkldnn_bf16_supported``, AVX-512 and up)?"""
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


MKLDNN_GEMM_MIN = 16 * 16 * 16  # ATen's mkldnn matmul takes products larger than this (Matmul.cpp, checksize)


def _matmul_kind(a, b) -> str | None:
    """A half-precision matrix product oneDNN runs (its weights repacked for AMX or AVX-512 blocks:
    scratch up to twice the operands, following its blocking heuristics), by name; None otherwise."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.device.type != "cpu" \
            or not torch.backends.mkldnn.enabled or not _onednn_matmul(a.dtype):
        return None
    size = math.prod(a.shape) * b.shape[-1]
    if isinstance(size, torch.SymInt) or size <= MKLDNN_GEMM_MIN:
        return None
    return f"matmul ({str(a.dtype).removeprefix('torch.')}, oneDNN)"


# Ops whose CPU kernels allocate inside themselves where no entry above models it, by the name a
# report gives them (``unmodelled_scratch``): a memory figure across them may be low by their
# scratch, and the report says so rather than give a quiet figure.
_UNMODELLED_CPU: dict[Any, Callable[..., str | None]] = {
    aten.convolution: lambda x, w, b, stride, padding, dilation, transposed, output_padding, groups, *rest:
        _conv_kind(x, w, stride, padding, dilation, transposed, groups),
    aten.convolution_backward: lambda g, x, w, bias, stride, padding, dilation, transposed, output_padding, groups, *rest:
        _conv_kind(x, w, stride, padding, dilation, transposed, groups, backward=True),
    aten._thnn_fused_lstm_cell: lambda *args: "lstm",
    aten._thnn_fused_lstm_cell_backward_impl: lambda *args: "lstm",
    aten._thnn_fused_gru_cell: lambda *args: "gru",
    aten.mkldnn_rnn_layer: lambda x, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode, hidden, layers, has_biases,
    *rest: None if _lstm_modelled(x, mode, has_biases, batch_sizes) else "rnn (oneDNN)",
    aten.mkldnn_rnn_layer_backward: lambda x, w_ih, w_hh, b_ih, b_hh, hx, cx, out, hy, cy, g_out, g_hy, g_cy, reverse, mode,
    hidden, layers, has_biases, *rest: None if _lstm_modelled(x, mode, has_biases, rest[2]) else "rnn (oneDNN)",
    aten.mm: _matmul_kind,
    aten.bmm: _matmul_kind,
    aten.addmm: lambda bias, a, b, *rest: _matmul_kind(a, b),
    aten.baddbmm: lambda bias, a, b, *rest: _matmul_kind(a, b),
}


def unmodelled_scratch(func, args: tuple) -> str | None:
    """The op's name where its kernel allocates scratch that no entry models, under the current
    execution model (the CPU's list: ``_UNMODELLED_CPU``), else None."""
    if current().is_gpu:
        return None
    fn = _UNMODELLED_CPU.get(func.overloadpacket)
    try:
        return fn(*args) if fn is not None else None
    except Exception:
        return None


def nbytes(t) -> int:
    """A tensor's bytes (0 for anything else: an absent gradient, a size list)."""
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _cpu_backend(x, weight, stride, padding, dilation, transposed, groups) -> str | None:
    """The kernel ``aten.convolution`` runs on the CPU, as torch itself chooses it
    (``torch._C._select_conv_backend``: ``Mkldnn`` for oneDNN; ``Slow2d``/``Slow3d``, torch's own
    im2col, for a small one-image convolution whose kernel is 3×3 or smaller, float16 where oneDNN
    has none for this CPU), None off the CPU or where torch cannot tell."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor) or x.device.type != "cpu":
        return None
    sizes = (*x.shape, *x.stride(), *weight.shape, *weight.stride(), *stride, *padding, *dilation, groups)
    if any(isinstance(d, torch.SymInt) for d in sizes):  # symbolic sizes: no kernel is chosen before they are known
        return None
    key = (tuple(x.shape), tuple(x.stride()), x.dtype, tuple(weight.shape), tuple(weight.stride()), weight.dtype,
           tuple(stride), tuple(padding), tuple(dilation), bool(transposed), int(groups), torch.get_num_threads(),
           torch.backends.mkldnn.enabled)
    if key not in _BACKENDS:
        if len(_BACKENDS) > 4096:  # a long-lived process scanning many models
            _BACKENDS.clear()
        try:
            backend = torch._C._select_conv_backend(x, weight, None, list(stride), list(padding), list(dilation),
                                                    bool(transposed), [0] * (x.dim() - 2), int(groups))
            _BACKENDS[key] = _UNBOUND_BACKENDS.get(backend.value) if backend.name == "???" else backend.name
        except (RuntimeError, TypeError, ValueError):  # arguments torch refuses: no kernel to name
            _BACKENDS[key] = None
    return _BACKENDS[key]


_BACKENDS: dict[tuple, str | None] = {}  # the choice by shapes, layouts and arguments: a scan asks for each conv several times


# ConvBackend members torch's Python binding leaves unnamed, by their value in ATen's ConvUtils.h
_UNBOUND_BACKENDS = {9: "MkldnnTranspose"}


_COLUMNS = ("Slow2d", "Slow3d")  # torch's im2col kernels: a column buffer (``_im2col``)


def _onednn_cpu(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int) -> bool:
    """Does the convolution take oneDNN's direct kernel, as modelled: torch chooses oneDNN
    (``_cpu_backend``), float32/bf16 NC(D)HW, contiguous, no padding as wide as the kernel (where
    oneDNN's 3-D kernels turn to their gemm one)?"""
    return (x.dtype in (torch.float32, torch.bfloat16) and x.is_contiguous() and x.dim() in (3, 4, 5)
            and _cpu_backend(x, weight, stride, padding, dilation, False, groups) == "Mkldnn"
            and all(p < k for p, k in zip(padding, weight.shape[2:])))


def onednn_block() -> int:
    """The channel block of oneDNN's blocked layouts on this CPU: nChw16c with AVX-512, nChw8c
    with AVX2 (``torch.backends.cpu.get_cpu_capability``)."""
    return 16 if "AVX512" in torch.backends.cpu.get_cpu_capability() else 8


def _blocked(c: int) -> int:
    block = onednn_block()
    return -(-c // block) * block


def _channels_last_depthwise(x, weight, stride, padding, dilation, groups: int) -> bool:
    """A depthwise 2-D convolution of a channels-last float32 input, stride 1, odd square kernel
    (ConvNeXt's 7×7, whose input comes permuted from the block before it) on oneDNN's AVX2
    kernels: read from the allocator's events, exact at 1 and 2 threads, kernels 3 to 9."""
    return (isinstance(x, torch.Tensor) and x.dim() == 4 and x.dtype == torch.float32 and x.shape[1] > 1
            and groups == x.shape[1] and weight.shape[1] == 1 and not x.is_contiguous()
            and x.is_contiguous(memory_format=torch.channels_last) and onednn_block() == 8
            and all(st == 1 for st in stride) and all(d == 1 for d in dilation)
            and weight.shape[2] == weight.shape[3] and weight.shape[2] % 2 == 1
            and all(p == weight.shape[2] // 2 for p in padding)
            and _cpu_backend(x, weight, stride, padding, dilation, False, groups) == "Mkldnn")


def _depthwise_blocked(weight: torch.Tensor) -> int:
    """A depthwise weight in oneDNN's blocked layout: its channels padded to the block."""
    return _blocked(weight.shape[0]) * math.prod(weight.shape[2:]) * weight.element_size()


def _slow_cpu(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int) -> bool:
    """Does the convolution take torch's own im2col kernel (``_cpu_backend``: Slow2d, Slow3d)?"""
    return _cpu_backend(x, weight, stride, padding, dilation, False, groups) in _COLUMNS


def _im2col(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, stride, padding, groups: int) -> int:
    """The column buffer of one group's im2col, for the whole batch (none for a 1×1, stride-1, unpadded kernel)."""
    if _pointwise(weight, stride, padding):
        return 0
    return x.shape[0] * (x.shape[1] // groups) * math.prod(weight.shape[2:]) * math.prod(out.shape[2:]) * x.element_size()


def _pointwise(weight, stride, padding) -> bool:
    """A 1×1(×1) kernel, stride 1, no padding: the input is its own column buffer."""
    return all(k == 1 for k in weight.shape[2:]) and all(st == 1 for st in stride) and all(p == 0 for p in padding)


def _slow_grouped(x: torch.Tensor, groups: int) -> int:
    """One group's slice of ``x``, copied to be contiguous (a batch of one is contiguous already)."""
    return nbytes(x) // groups if groups > 1 and x.shape[0] > 1 else 0


@register_scratch(aten.convolution)
def convolution_scratch(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *, out):
    """torch's im2col kernels (``Slow2d``, ``Slow3d``: a one-image convolution with a small kernel,
    float16 where oneDNN has none) fill a column buffer; grouped, they run group by group on
    contiguous copies of the input's slices and concatenate the outputs.

    oneDNN (1-, 2- and 3-D alike) reorders the input (unless it has fewer than 8 channels: its
    first-layer kernel reads NC(D)HW) and the weight to blocked layouts, channels padded to the
    block, and computes into a blocked output it then copies to the result: at its worst the
    kernel holds the reorders and the blocked output, then the blocked output and the result. A
    strided 2-D 1×1 kernel reads a compacted copy of one image per thread. A grouped convolution
    whose groups are narrower than the block (``_onednn_gemm``) runs oneDNN's gemm kernel instead,
    whose columns follow its thread partition: named, not modelled.

    A transposed convolution ``_plain_deconvolution`` models holds two output-sized buffers beside
    its result (oneDNN's deconvolution, read from the allocator's events)."""
    if transposed:
        return 2 * nbytes(out) if _plain_deconvolution(x, weight, stride, padding, dilation, groups) else 0
    if _slow_cpu(x, weight, stride, padding, dilation, groups):
        columns = _im2col(x, weight, out, stride, padding, groups)
        return columns if groups == 1 else max(_slow_grouped(x, groups) + columns, nbytes(out))
    if _channels_last_depthwise(x, weight, stride, padding, dilation, groups):
        return _depthwise_blocked(weight)
    if not _onednn_cpu(x, weight, stride, padding, dilation, groups):
        return 0
    n, cin, *spatial = x.shape
    cout, cin_g, *kernel = weight.shape
    size = x.element_size()
    if _onednn_gemm(x, weight, groups):
        return 0  # named (_conv_kind)
    depthwise = groups == cin and groups > 1
    x_blocked = 0 if cin < 8 else n * _blocked(cin) * math.prod(spatial) * size
    if x.dim() == 4 and math.prod(kernel) == 1 and any(st > 1 for st in stride):
        # a strided 1×1 reads a compacted input: one image's per thread
        x_blocked += torch.get_num_threads() * _blocked(cin) * math.prod(out.shape[2:]) * size + ONEDNN_PAD_BYTES
    w_blocked = (_depthwise_blocked(weight) if depthwise
                 else _blocked(cout) * (_blocked(cin_g) if cin >= 8 else cin_g) * math.prod(kernel) * size)
    out_blocked = n * _blocked(cout) * math.prod(out.shape[2:]) * size
    return max(x_blocked + w_blocked + out_blocked, out_blocked + nbytes(out)) - nbytes(out)


ONEDNN_PAD_BYTES = 128  # what oneDNN's scratchpads hold beyond their data (their alignment)


def _onednn_gemm(x, weight, groups: int) -> bool:
    """Does oneDNN run the grouped convolution with its gemm kernel: groups (not depthwise) whose
    input or output channels are not a multiple of the block (a ResNeXt-like group width of 4)?"""
    cout, cin_g = weight.shape[:2]
    block = onednn_block()
    return 1 < groups < x.shape[1] and (cin_g % block or (cout // groups) % block)


ONEDNN_REDUCTION_BYTES = 8448  # oneDNN's weight-gradient scratchpad beyond the weight's size (2 threads)


@register_scratch(aten.convolution_backward)
def convolution_backward_scratch(grad_output, x, weight, bias_sizes, stride, padding, dilation, transposed,
                                 output_padding, groups, output_mask, *, out):
    """torch's im2col path (float16) holds one column buffer for both gradients; grouped, it runs
    group by group on contiguous copies of grad_output's and the input's slices and concatenates
    the gradients.

    oneDNN's backward reorders grad_output (and the input, channels a multiple of 8) to its
    blocked layout; the input gradient is computed into a blocked tensor and copied out, the
    weight gradient through a scratchpad of the weight's size and a reduction buffer (not for a
    depthwise convolution). The bfloat16 weight-gradient kernel's scratchpad is larger and
    follows oneDNN's thread partitioning; it is counted as float32's (docs/memory.md).

    A transposed convolution ``_plain_deconvolution`` models holds grad_output's reordered copy and
    the weight's for the input gradient, grad_output's and the input's for the weight gradient."""
    if transposed:
        if not _plain_deconvolution(x, weight, stride, padding, dilation, groups):
            return 0
        return max(nbytes(grad_output) + nbytes(weight) if output_mask[0] else 0,
                   nbytes(grad_output) + nbytes(x) if output_mask[1] else 0)
    # a grad_output that is not contiguous (the gradient of a sum, expanded from one element: a model
    # whose output is a convolution's) is first copied whole, and the copy held through the kernel
    if _channels_last_depthwise(x, weight, stride, padding, dilation, groups):
        # the weight reordered (channels blocked) for the input gradient; for the weight gradient 64
        # partial weights and the sum for a kernel larger than 3×3 (ConvNeXt's 7×7), the reordered
        # weight and one more for a 3×3
        blocked = _depthwise_blocked(weight)
        if not output_mask[1]:
            return blocked
        return 65 * nbytes(weight) if math.prod(weight.shape[2:]) > 9 else blocked + nbytes(weight)
    dense = (nbytes(grad_output) if _onednn_cpu(x, weight, stride, padding, dilation, groups)
             and not grad_output.is_contiguous() else 0)
    return dense + _convolution_backward_scratch(grad_output, x, weight, stride, padding, dilation, groups,
                                                 output_mask, out)


def _convolution_backward_scratch(grad_output, x, weight, stride, padding, dilation, groups, output_mask, out) -> int:
    results = sum(nbytes(t) for t in out if isinstance(t, torch.Tensor)) if isinstance(out, (tuple, list)) else 0
    if _slow_cpu(x, weight, stride, padding, dilation, groups):
        # the weight gradient unfolds the input again; the 2-D input gradient needs no buffer, the 3-D
        # one (col2vol) a full column buffer even for a 1×1×1 kernel, freed before the weight gradient's
        columns = _im2col(x, weight, grad_output, stride, padding, groups) if output_mask[1] else 0
        if groups > 1:
            return max(_slow_grouped(grad_output, groups) + _slow_grouped(x, groups) + columns, results)
        if x.dim() < 5 or not output_mask[0]:
            return columns
        gi, gw = nbytes(x), (nbytes(weight) if output_mask[1] else 0)
        full = x.shape[0] * x.shape[1] * math.prod(weight.shape[2:]) * math.prod(grad_output.shape[2:]) * x.element_size()
        return max(gi + full, gi + gw + columns) - gi - gw
    if not _onednn_cpu(x, weight, stride, padding, dilation, groups) or x.dim() == 5 or _onednn_gemm(x, weight, groups):
        return 0  # named (_conv_kind)
    if onednn_block() == 8:
        return _avx2_backward(grad_output, x, weight, stride, groups, output_mask, results)
    go, xin, w = nbytes(grad_output), (nbytes(x) if x.shape[1] % 8 == 0 else 0), nbytes(weight)
    worst = 0
    if output_mask[0]:  # grad_output and weight reordered, blocked input gradient; then blocked and plain
        gi = nbytes(x)
        worst = max(go + w + gi, 2 * gi) - results
    if output_mask[1]:  # the input gradient (a result) is live by then
        pad = 0 if groups == x.shape[1] and groups > 1 else w + ONEDNN_REDUCTION_BYTES
        worst = max(worst, go + xin + pad + (nbytes(x) if output_mask[0] else 0) + w - results)
    return max(worst, 0)


ONEDNN_AVX2_REDUCTION_BYTES = 8320  # the 1×1 weight-gradient kernel's reduction buffer beyond its partial weights
ONEDNN_GEMM_BYTES = 256  # the gemm weight-gradient kernel's buffer beyond its partial weights and columns


def _avx2_backward(grad_output, x, weight, stride, groups: int, output_mask, results: int) -> int:
    """oneDNN's float32 backward on an AVX2 CPU (channels padded to 8), read from the allocator's
    events of torch 2.13 (``benchmarks/probe_scratch.py``). The input gradient: grad_output and the
    weight reordered, a blocked input gradient, then that and the plain one. The weight gradient
    by the jit kernel: grad_output and the input (8 channels or more) reordered, the weight's
    scratchpad, and for a 1×1 kernel partial weights per thread and a reduction buffer. When the
    input is shorter than the kernel (a 3×3 kernel on 2×2 maps: ResNet's last stage at 64×64
    pixels) oneDNN takes its gemm kernel instead: per thread that splits the batch, four partial
    weights and one image's columns, and the weight gradient twice."""
    n, cin, *spatial = x.shape
    cout, cin_g, *kernel = weight.shape
    size = x.element_size()
    depthwise = groups == cin and groups > 1
    go = n * _blocked(cout) * math.prod(grad_output.shape[2:]) * size
    w_data = (_blocked(cout) * math.prod(kernel) if depthwise  # the weight as the input gradient reads it
              else _blocked(cout) * (_blocked(cin_g) if cin_g >= 8 or groups == 1 else cin_g) * math.prod(kernel)) * size
    w = (_blocked(cout) * math.prod(kernel) if depthwise  # the weight gradient's scratchpad
         else _blocked(cout) * (_blocked(cin_g) if cin_g >= 8 else cin_g) * math.prod(kernel)) * size
    gi_blocked, gi = n * _blocked(cin) * math.prod(spatial) * size, nbytes(x)
    # a strided input gradient is computed into one more input-sized buffer before the copy out (and a
    # scratchpad of a few pages whose size follows the kernel's blocking: not counted)
    strided = gi if any(st > 1 for st in stride) and not depthwise else 0
    worst = max(go + w_data + gi_blocked, gi_blocked + strided + gi) - results if output_mask[0] else 0
    if not output_mask[1]:
        return max(worst, 0)
    held = gi if output_mask[0] else 0  # the input gradient, a result, is live by then
    if not depthwise and groups == 1 and spatial[0] < kernel[0]:  # the gemm kernel
        threads = min(torch.get_num_threads(), n)
        columns = cin * math.prod(kernel) * math.prod(grad_output.shape[2:]) * size
        # one image on one thread: its columns alone; one thread for the batch: four partial weights too
        partial = columns if n == 1 else threads * (4 * nbytes(weight) + columns) + ONEDNN_GEMM_BYTES
        return max(worst, held + nbytes(weight) + partial - results)
    x_blocked = gi_blocked if cin >= 8 else 0
    reduction = 0
    if math.prod(kernel) == 1 and not depthwise:
        blocks = _blocked(cin) // 8
        if blocks % 2 or blocks <= 8:  # the thread partition splits the batch: partial weights per thread
            reduction = torch.get_num_threads() * w + ONEDNN_AVX2_REDUCTION_BYTES
        if any(st > 1 for st in stride):  # a strided 1×1 reads a compacted copy of the input
            reduction += n * cin * math.prod(grad_output.shape[2:]) * size + 128
    return max(worst, held + max(go + x_blocked + reduction, nbytes(weight)) + w - results)


def _copied(*tensors) -> int:
    """The bytes of the contiguous copies a CPU kernel makes of those of ``tensors`` that are not
    contiguous (a layer norm over a permuted input: a ConvNeXt block's channels-last norm)."""
    return sum(nbytes(t) for t in tensors if isinstance(t, torch.Tensor) and not t.is_contiguous())


@register_scratch(aten.native_layer_norm)
def layer_norm_scratch(x, normalized_shape, weight, bias, eps, *, out):
    """The CPU kernel normalizes a contiguous copy of an input that is not contiguous."""
    return _copied(x) if x.device.type == "cpu" else 0


@register_scratch(aten.native_layer_norm_backward)
def layer_norm_backward_scratch(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask, *, out):
    """The CPU kernel sums the weight and bias gradients per thread: two float32 buffers of the
    normalized size for each of ``torch.get_num_threads()`` threads; it reads contiguous copies of
    an input and a grad_out that are not contiguous (the allocator's events, torch 2.13)."""
    if x.device.type != "cpu":
        return 0
    partial = 2 * torch.get_num_threads() * math.prod(normalized_shape) * 4 if output_mask[1] or output_mask[2] else 0
    return _copied(grad_out, x) + partial


def _lstm_modelled(x, mode: int, has_biases: bool, batch_sizes) -> bool:
    """``archscan.memory.rnn`` covers the call, on a CPU whose oneDNN blocks as AVX2's does."""
    return rnn.modelled(x, mode, has_biases, batch_sizes) and onednn_block() == 8


@register_scratch(aten.mkldnn_rnn_layer)
def lstm_scratch(x, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode, hidden_size, num_layers, has_biases,
                 bidirectional, batch_first, train, *, out):
    """oneDNN's LSTM forward: the summed biases, its weights reordered and its scratchpad
    (``archscan.memory.rnn``), in grad mode for the reference kernel, without for the brgemm one."""
    if not _lstm_modelled(x, mode, has_biases, batch_sizes):
        return 0
    return rnn.forward_scratch(*rnn.sizes(x, w_ih), torch.is_grad_enabled(), torch.get_num_threads())


@register_scratch(aten.mkldnn_rnn_layer_backward)
def lstm_backward_scratch(x, w_ih, w_hh, b_ih, b_hh, hx, cx, output, hy, cy, grad_output, grad_hy, grad_cy, reverse, mode,
                          hidden_size, num_layers, has_biases, train, bidirectional, batch_sizes, batch_first, workspace,
                          *, out):
    """oneDNN's LSTM backward (``archscan.memory.rnn``), with the copies it makes of gradients that
    come in missing or not contiguous, and of a cell state that shares the hidden state's storage."""
    if not _lstm_modelled(x, mode, has_biases, batch_sizes):
        return 0
    T, N, I, H = rnn.sizes(x, w_ih)
    state = N * H * 4

    def copied(t) -> bool:
        return not isinstance(t, torch.Tensor) or not t.is_contiguous()

    copies = (T * N * H * 4 if copied(grad_output) else 0) + state * (copied(grad_hy) + copied(grad_cy))
    if isinstance(hx, torch.Tensor) and isinstance(cx, torch.Tensor) and hx.untyped_storage()._cdata == cx.untyped_storage()._cdata:
        copies += state
    return rnn.backward_scratch(T, N, I, H, copies)


def as_the_kernel_returns(func, out: Any) -> Any:
    """Results as the CPU kernel returns them where torch's meta kernel differs: the LSTM backward's
    meta kernel returns its bias gradient twice (one storage), the kernel a copy the second time
    (two, each a parameter's gradient)."""
    if func.overloadpacket is aten.mkldnn_rnn_layer_backward and isinstance(out, (tuple, list)) and len(out) == 7 \
            and isinstance(out[3], torch.Tensor) and isinstance(out[4], torch.Tensor) \
            and out[3].untyped_storage()._cdata == out[4].untyped_storage()._cdata:
        return (*out[:4], out[4].clone(), *out[5:])
    return out


def hidden_result_bytes(func, args: tuple, out: Any) -> dict[int, int]:
    """Results whose bytes fake tensors do not show, by ``id``: the workspace oneDNN's LSTM makes in
    grad mode (torch's meta kernel returns it empty), which the backward reads."""
    if current().is_gpu or func.overloadpacket is not aten.mkldnn_rnn_layer or not torch.is_grad_enabled():
        return {}
    x, w_ih, mode, has_biases, batch_sizes = args[0], args[1], args[9], args[12], args[8]
    if not _lstm_modelled(x, mode, has_biases, batch_sizes) or not isinstance(out, (tuple, list)) or len(out) < 4 \
            or not isinstance(out[3], torch.Tensor):
        return {}
    return {id(out[3]): rnn.workspace_bytes(*rnn.sizes(x, w_ih))}


def _collapses(sizes, strides) -> bool:
    """Do these dims (outermost first) merge into one as a view (``Tensor.view``'s rule: each
    stride is the next one's times its size; dims of size 1 anywhere)?"""
    dims = [(n, st) for n, st in zip(sizes, strides) if n != 1]
    return all(outer == inner * n for (_, outer), (n, inner) in itertools.pairwise(dims))


def _fft_batch(strides, dim) -> list[int]:
    """The CPU's FFT (``_exec_fft``) puts the batch dims (those not transformed) outermost, by stride."""
    return sorted((d for d in range(len(strides)) if d not in dim), key=lambda d: -strides[d])


def _fft_copies(sizes, strides, dim) -> bool:
    """Does the CPU's FFT copy its input: it reshapes the batch dims (``_fft_batch``) into one, which
    copies where they do not merge as a view (a transform over dims 1 and 3 of a contiguous tensor)."""
    batch = _fft_batch(strides, dim)
    return not _collapses([sizes[d] for d in batch], [strides[d] for d in batch])


def _fft_layout(sizes, strides, dim) -> tuple:
    """The strides of an FFT's result: contiguous with the batch dims outermost (``_fft_batch``)
    and the transformed dims innermost, in their order."""
    order = _fft_batch(strides, dim) + list(dim)
    out, step = [0] * len(sizes), 1
    for d in reversed(order):
        out[d], step = step, step * sizes[d]
    return tuple(out)


@register_scratch(aten._fft_r2c, aten._fft_c2c)
def fft_scratch(x, dim, normalization, *rest, out):
    """The CPU's FFT copies an input whose batch dims do not merge as a view (``_fft_copies``);
    read from the allocator's events, exact on 90 shapes and dims each (torch 2.13)."""
    if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
        return 0
    dim = [d % x.dim() for d in dim]
    return nbytes(x) if _fft_copies(x.shape, x.stride(), dim) else 0


@register_scratch(aten._fft_c2r)
def fft_c2r_scratch(x, dim, normalization, last_dim_size, *, out):
    """A complex-to-real FFT over several dims runs a complex FFT over all but the last into a new
    tensor of the input's size (``_fft_layout``), then the real one over the last, which copies that
    tensor when its batch dims do not merge (``_fft_copies``); over one dim, only that copy."""
    if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
        return 0
    dim = [d % x.dim() for d in dim]
    if len(dim) == 1:
        return nbytes(x) if _fft_copies(x.shape, x.stride(), dim) else 0
    middle = _fft_layout(x.shape, x.stride(), dim[:-1])
    return nbytes(x) + (nbytes(x) if _fft_copies(x.shape, middle, dim[-1:]) else 0)


def _blas_ready(t) -> bool:
    """Can BLAS read the matrix as it is: row- or column-major, no broadcast (stride-0) dim?"""
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        return True
    *_, rows, cols = t.stride()
    size_r, size_c = t.shape[-2:]
    return 0 not in t.stride() and ((cols == 1 and rows >= max(size_c, 1)) or (rows == 1 and cols >= max(size_r, 1)))


@register_scratch(aten.mm, aten.bmm)
@register_scratch(aten.mm, aten.bmm, on="cuda")
def matmul_scratch(a, b, *, out):
    """The kernel copies an operand BLAS cannot read as it is (a broadcast one, such as the
    gradient of a sum, ``ones.expand(n, m)``) to a contiguous matrix first: the CPU's and cuBLAS's."""
    return sum(nbytes(t) for t in (a, b) if t.device.type == "cpu" and not _blas_ready(t))


@register_scratch(aten.addmm, aten.baddbmm)
@register_scratch(aten.addmm, aten.baddbmm, on="cuda")
def addmm_scratch(bias, a, b, *, out, **kwargs):
    return matmul_scratch(a, b, out=out)


# --- the GPU's kernels --------------------------------------------------------------------------------


def _rounded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@register_scratch(aten._scaled_dot_product_efficient_attention_backward, on="cuda")
def efficient_attention_backward_scratch(grad_out, q, k, v, attn_bias, out_, logsumexp, *rest, out, **kwargs):
    """The memory-efficient kernel's backward (torch 2.11's ``_efficient_attention_backward``):
    grad_out copied to the kernel's layout where it is not in it; ``delta``, the row sums of
    grad_out × out in float32 (the product, in float32, then the sums and their contiguous copy);
    then a float32 workspace accumulating the query gradient (queries padded to 64) and 12 KiB of
    the kernel's own, and for half-precision inputs the key and value gradients accumulated too."""
    b, h, m, d = q.shape
    n, dv = k.shape[-2], v.shape[-1]
    copy = 0 if grad_out.transpose(1, 2).is_contiguous() else nbytes(grad_out)
    product = b * h * m * dv * 4
    half = q.dtype in (torch.float16, torch.bfloat16)
    delta = b * h * m * 4
    temps = product * (3 if half else 1) + 2 * delta
    workspace = b * h * _rounded(m, 64) * d * 4 + 12288
    if half:
        workspace += b * h * _rounded(n, 64) * (d + dv) * 4
    return copy + max(temps, workspace + delta)


@register_scratch(aten._scaled_dot_product_cudnn_attention_backward, on="cuda")
def cudnn_attention_backward_scratch(grad_out, q, k, v, *rest, out, **kwargs):
    """cuDNN's backward workspace: per query row a float32 query-gradient accumulator and the
    softmax statistics (4 × head size + 4 bytes), and with grouped heads the key and value
    gradients per query head before they are summed; 512 bytes of its own."""
    b, hq, sq, d = q.shape
    hk, sk, dv = k.shape[1], k.shape[-2], v.shape[-1]
    grouped = 2 * b * hq * sk * dv * q.element_size() if hq != hk else 0
    return b * hq * sq * (4 * d + 4) + grouped + 512


@register_scratch(aten._scaled_dot_product_flash_attention_backward, on="cuda")
def flash_attention_backward_scratch(grad_out, q, k, v, *rest, out, **kwargs):
    """FlashAttention-2's backward (``mha_bwd``): the softmax row sums and a float32 query-gradient
    accumulator, rows padded to 128 and the head size to 32, and with grouped heads the key and
    value gradients per query head."""
    b, hq, sq, d = q.shape
    hk, sk, dv = k.shape[1], k.shape[-2], v.shape[-1]
    rows = _rounded(sq, 128)
    grouped = 2 * b * hq * sk * dv * q.element_size() if hq != hk else 0
    return b * hq * rows * 4 + b * rows * hq * _rounded(d, 32) * 4 + grouped


_REDUCTIONS = {"sum": aten.sum, "mean": aten.mean, "nansum": aten.nansum, "prod": aten.prod, "amax": aten.amax,
               "amin": aten.amin, "var": aten.var, "std": aten.std, "all": aten.all, "any": aten.any}


def _reduction(name: str):
    def scratch(x, *args, out, **kwargs):
        """Staging buffer and semaphores torch's CUDA reduction kernel takes from the caching
        allocator when it splits each output across CTAs (``reduction.py``: torch 2.11's
        setReduceConfig, ported)."""
        execution = current()
        if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor) or execution.sms is None:
            return 0
        dims = args[0] if args and isinstance(args[0], (list, tuple, int)) else kwargs.get("dim")
        dims = [] if dims is None else [dims] if isinstance(dims, int) else list(dims)
        keepdim = kwargs.get("keepdim", args[1] if len(args) > 1 and isinstance(args[1], bool) else False)
        return reduction_scratch(tuple(x.shape), tuple(x.stride()), dims, x.dtype, out.dtype, execution.sms, op=name,
                                 max_threads_per_sm=threads_per_sm(execution.capability), keepdim=keepdim,
                                 storage_offset=x.storage_offset())
    return scratch


for _name, _op in _REDUCTIONS.items():
    register_scratch(_op, on="cuda")(_reduction(_name))


def _channels_last(*tensors) -> bool:
    from torch._prims_common import suggest_memory_format

    return any(suggest_memory_format(t) == torch.channels_last for t in tensors if isinstance(t, torch.Tensor))


@register_scratch(aten.convolution, on="cuda")
def cudnn_convolution_scratch(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *, out):
    """cuDNN's workspace for the convolution (``cudnn.py``'s rule, read from the recorded H200 and
    H100 runs: torch 2.11, benchmark off). A transposed convolution's forward is the input-gradient
    pass of the convolution it transposes."""
    if x.dim() != 4:
        return 0
    last = _channels_last(x, weight)
    capability = current().capability
    if transposed:
        return conv_workspaces(tuple(out.shape), tuple(weight.shape), stride, padding, dilation, groups, x.dtype,
                               capability=capability, channels_last=last)[1]
    return conv_workspaces(tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups, x.dtype,
                           capability=capability, channels_last=last)[0]


@register_scratch(aten.convolution_backward, on="cuda")
def cudnn_convolution_backward_scratch(grad_output, x, weight, bias_sizes, stride, padding, dilation, transposed,
                                       output_padding, groups, output_mask, *, out):
    """cuDNN's workspaces for the input gradient (taken once it exists) and the weight gradient
    (taken once both exist), the larger over the kernel's run (``cudnn.py``)."""
    if x.dim() != 4 or transposed:
        return 0
    data, weight_ws = conv_backward_workspaces(tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups,
                                               x.dtype, backward_mask=output_mask, capability=current().capability,
                                               channels_last=_channels_last(x, weight))
    grad_weight = nbytes(out[1]) if isinstance(out, (tuple, list)) and len(out) > 1 else 0
    return max(data - grad_weight, weight_ws)
