"""The direct run: a model torch.fx traces runs once on the CPU, its weights left on the meta device.

Fake tensors (``FakeTensorMode``) let archscan analyse a model of any size without allocating
or computing anything, but in a short process their machinery costs more than a small model's
forward: they import sympy and ``torch.distributed.tensor`` (half a second together), and every
op runs torch's Python meta kernels (``torch._check`` alone imports sympy). So a model torch.fx
traces is first run directly, under ``Direct``: its inputs and activations are real CPU tensors,
its weights stay on the meta device, and

* convolutions and matrix products (``convolution`` of contiguous tensors, ``mm``, ``addmm``,
  ``bmm``, ``baddbmm``: the bulk of a network's work) are not computed: their output is a zero
  CPU tensor of the shape and layout the CPU kernel gives (with zero weights, also its values);
* view ops of weights stay on meta (no memory); any other op that reads a weight reads zeros of
  its layout on the CPU (``zeros_like_meta``: views of one zero buffer, no larger than
  ``MAX_WEIGHT_BYTES``);
* the meta device stands for the CPU the fake path's tensors are on: a device argument naming
  it (``torch.zeros(n, device=self.weight.device)``) names the CPU, and a move between the two
  and nothing else (``x.to(self.weight.device)``, ``w.to(x.device)``) returns its input, as
  ``Tensor.to`` does on fake tensors without an op (the recorder skips it); only weights and
  their views stay on the meta device;
* everything else runs on the CPU as it would, within ``MACS`` multiply-adds of convolution and
  attention (estimated from the input shapes before the op runs), ``OUTPUT_BYTES`` of tensors
  made and ``SECONDS`` spent in the kernels.

Recording modes above ``Direct`` see the op as the model called it (weights as the model's own
meta tensors, activations with their shapes and layouts), so the counts are those of fake CPU
tensors — fake tensors exist to behave as the CPU kernels do. ``tests/test_direct.py`` pins whole
reports of the zoo against the fake path.

Values never change a count, and no op whose result depends on them may run: the run stops
(``Stop``) before an op tagged ``data_dependent_output`` or ``dynamic_output_shape`` (``.item()``,
``nonzero``...), past its budget, and on any error; the analysis then runs on fake tensors from
the start, as it always has, so what a user sees never depends on the path taken.
"""

from __future__ import annotations

import math
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..costs import tensors_in

aten = torch.ops.aten

MACS = 20e9                     # multiply-adds of the convolution and attention it computes (~0.3 s, 2 cores)
MAX_WEIGHT_BYTES = 1 << 30      # the largest weight it reads as zeros
OUTPUT_BYTES = 512 << 20        # the bytes of the tensors its ops make (ResNet-50 at batch 1: 145 MiB; ViT-L/16: 391 MiB)
SECONDS = 2.0                   # and the time its kernels may take, whatever the estimates said (a backstop: the budgets above come first)
# the eager recording's run (archscan.capture): a model written as a Python loop over small ops
# (Mamba's CPU path: 22,000 ops at 64 tokens) makes more bytes over the run than a graph of
# large ops, and holds few of them at once; its recording saves ~150 us an op over fake tensors
RECORDING_OUTPUT_BYTES = 4 << 30

_VALUES = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)


class Stop(Exception):
    """The direct run cannot give the fake path's answer, or would cost more than it."""


# --- matrix products by shape ---------------------------------------------------------------------------

def _product(a, b, batched: bool) -> tuple[int, ...] | None:
    """The shape of ``a @ b`` for ``mm`` (2-D) or ``bmm`` (3-D), None when the CPU kernel would refuse."""
    dims = 3 if batched else 2
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != dims or b.dim() != dims \
            or a.dtype != b.dtype or not a.dtype.is_floating_point or a.shape[-1] != b.shape[-2] \
            or (batched and a.shape[0] != b.shape[0]):
        return None
    return (*a.shape[:-1], b.shape[-1])


def _broadcasts(c, shape: tuple[int, ...] | None, dtype) -> tuple[int, ...] | None:
    if shape is None or not isinstance(c, torch.Tensor) or c.dtype != dtype or c.dim() > len(shape) \
            or any(s not in (1, t) for s, t in zip(reversed(c.shape), reversed(shape))):
        return None
    return shape


def _conv_spatial(x, w, stride, padding, dilation, transposed, output_padding) -> list[int]:
    """A convolution's output size along each spatial dim (per-dim lists, as aten passes them)."""
    if transposed:
        return [(i - 1) * s - 2 * p + d * (k - 1) + op + 1
                for i, s, p, d, k, op in zip(x.shape[2:], stride, padding, dilation, w.shape[2:], output_padding)]
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, s, p, d, k in zip(x.shape[2:], stride, padding, dilation, w.shape[2:])]


def _conv(args, kwargs) -> tuple[int, ...] | None:
    """The output shape of ``aten.convolution`` on contiguous tensors (the CPU kernel's output is
    then contiguous too), None for any other call: it runs, and refuses what it refuses."""
    if kwargs or len(args) != 9:
        return None
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = args
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)) or x.dim() != w.dim() \
            or x.dim() not in (3, 4, 5) or x.dtype != w.dtype or not x.dtype.is_floating_point \
            or not x.is_contiguous() or not w.is_contiguous() or not isinstance(groups, int) or groups < 1 \
            or w.shape[0] % groups:
        return None
    n = x.dim() - 2
    lists = [list(v) for v in (stride, padding, dilation, output_padding)]
    if any(len(v) not in (1, n) for v in lists):
        return None
    stride, padding, dilation, output_padding = (v * n if len(v) == 1 else v for v in lists)
    spatial = _conv_spatial(x, w, stride, padding, dilation, transposed, output_padding)
    if transposed:
        c_out = w.shape[1] * groups
        ok = x.shape[1] == w.shape[0] and all(op < max(s, d) for op, s, d in zip(output_padding, stride, dilation))
    else:
        c_out = w.shape[0]
        ok = x.shape[1] == w.shape[1] * groups and not any(output_padding)
    if not ok or min(spatial) <= 0 or min(stride) <= 0 or min(dilation) <= 0 or min(padding) < 0 or x.shape[0] == 0 \
            or (bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (c_out,) or bias.dtype != x.dtype)):
        return None
    return (x.shape[0], c_out, *spatial)


_SHAPES = {
    aten.convolution.default: _conv,
    aten.mm.default: lambda a, k: _product(a[0], a[1], False) if len(a) == 2 and not k else None,
    aten.bmm.default: lambda a, k: _product(a[0], a[1], True) if len(a) == 2 and not k else None,
    aten.addmm.default: lambda a, k: _broadcasts(a[0], _product(a[1], a[2], False), a[1].dtype) if len(a) == 3 else None,
    aten.baddbmm.default: lambda a, k: _broadcasts(a[0], _product(a[1], a[2], True), a[1].dtype) if len(a) == 3 else None,
}


# --- what the CPU computes, estimated ----------------------------------------------------------------

def _conv_macs(args) -> int:
    x, w, transposed = args[0], args[1], args[6]
    if transposed:  # every input position meets the whole kernel
        return x.shape[0] * math.prod(x.shape[2:]) * w.numel()
    n = x.dim() - 2
    stride, padding, dilation = (list(v) * n if len(v) == 1 else list(v) for v in (args[3], args[4], args[5]))
    out = _conv_spatial(x, w, stride, padding, dilation, False, ())
    return x.shape[0] * math.prod(max(0, o) for o in out) * w.numel()


def _attention_macs(args) -> int:
    q, k, v = args[0], args[1], args[2]
    return math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])


_ESTIMATES = {
    aten.convolution.default: _conv_macs,
    aten._scaled_dot_product_flash_attention_for_cpu.default: _attention_macs,
    aten._scaled_dot_product_attention_math.default: _attention_macs,
}


_CPU = torch.device("cpu")
_KINDS: dict = {}  # op -> "values", "shape", "view" or "other"


def _kind(func) -> str:
    if any(tag in _VALUES for tag in func.tags):
        return "values"
    return "shape" if func in _SHAPES else "view" if func.is_view else "other"


class Direct(TorchDispatchMode):
    """The direct run (see the module docstring); enter it beneath the modes that record."""

    def __init__(self, macs: float | None = None, seconds: float | None = None, output_bytes: int | None = None):
        super().__init__()
        self.macs_left = MACS if macs is None else macs
        self.bytes_left = OUTPUT_BYTES if output_bytes is None else output_bytes
        self.seconds_left = SECONDS if seconds is None else seconds

    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):  # torch.cond reaching the direct run: its
            raise Stop(f"{func.name()} depends on tensor values")  # branch is chosen by values it has not got
        given = args
        try:
            done, args, kwargs = self._prepare(func, args, kwargs)
        except Stop:
            raise
        except Exception as exc:  # archscan's own mistake: never reported as the model's
            raise Stop(f"{func}: {type(exc).__name__}: {exc}") from exc
        if done is not None:
            return done
        start = time.perf_counter()
        out = func(*args, **kwargs)
        self.seconds_left -= time.perf_counter() - start
        if not func.is_view:
            self._spend(sum(t.numel() * t.element_size() for t in tensors_in(out)))
        if func._schema.is_mutable and isinstance(out, torch.Tensor) and args is not given:
            # an in-place op on a weight (RWKV rescales its weights in forward) ran on private zeros;
            # it returns the weight itself, as on fake tensors, so later reads see the op's result
            out = next((g for g, a in zip(given, args) if a is out and g is not a), out)
        return out

    def _spend(self, nbytes: int) -> None:
        """Count the memory an op's outputs take (a large input makes large activations: the fake
        path costs the same whatever their size, the direct run does not)."""
        self.bytes_left -= nbytes
        if self.bytes_left < 0:
            raise Stop("larger activations than a direct run makes")

    def _prepare(self, func, args, kwargs):
        """(the output without running the kernel, or None; the arguments to run it with)."""
        kind = _KINDS.get(func)
        if kind is None:
            kind = _KINDS[func] = _kind(func)
        if kind == "values":
            raise Stop(f"{func} depends on tensor values")
        if self.seconds_left < 0:
            raise Stop("the direct run took too long")
        if func is aten.lift_fresh.default:  # torch.tensor(...) in forward: fake tensors make a copy of their
            return args[0].clone(), args, kwargs  # own, and the memory counts it as made in the run, as here
        if func is aten._to_copy.default and _moves_only_between_meta_and_cpu(args, kwargs):
            return args[0], args, kwargs  # fake tensors are on the CPU already: no copy, no op (OpRecorder)
        if kwargs and kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "meta":
            kwargs = {**kwargs, "device": _CPU}
        if kind == "shape":
            out = _SHAPES[func](args, kwargs)
            if out is not None:
                self._spend(math.prod(out) * args[1].element_size())
                return torch.zeros(out, dtype=args[1].dtype), args, kwargs
        on_meta = {t.is_meta for t in (tensors_in((args, kwargs)) if kwargs else tensors_in(args))}
        if True in on_meta:
            if kind == "view" and on_meta == {True}:
                return func(*args, **kwargs), args, kwargs  # a view of a weight: no memory
            # an op that writes one of its arguments gets private zeros: the shared buffer stays zero
            # (a zero index stays a valid index for every later read)
            writes = func._schema.is_mutable or (func is aten.native_batch_norm.default and len(args) > 5 and args[5])
            zeros = _private_zeros if writes else zeros_like_meta  # (training batch norm updates its statistics unannotated)
            args = tuple(_on_cpu(a, zeros) for a in args)
            kwargs = {k: _on_cpu(v, zeros) for k, v in kwargs.items()} if kwargs else kwargs
        estimate = _ESTIMATES.get(func)
        if estimate is not None:
            try:
                self.macs_left -= estimate(args)
            except (IndexError, TypeError, AttributeError):  # a call the formula does not read: its time is watched
                pass
            if self.macs_left < 0:
                raise Stop("more multiply-adds than a direct run computes")
        return None, args, kwargs


def _moves_only_between_meta_and_cpu(args, kwargs) -> bool:
    """Is this ``_to_copy`` a move between the meta device and the CPU and nothing else
    (``w.to(x.device)``, ``x.to(self.weight.device)``)? On fake tensors, all on the CPU, the
    same call changes nothing, and ``Tensor.to`` dispatches no op."""
    if len(args) != 1 or not isinstance(args[0], torch.Tensor) or kwargs.get("device") is None \
            or kwargs.get("pin_memory") or not set(kwargs) <= _TO_COPY_KWARGS:
        return False
    x = args[0]
    if {x.device.type, torch.device(kwargs["device"]).type} != {"meta", "cpu"}:
        return False
    return kwargs.get("dtype") in (None, x.dtype) and kwargs.get("layout") in (None, x.layout) \
        and kwargs.get("memory_format") in (None, torch.preserve_format)


_TO_COPY_KWARGS = frozenset({"dtype", "layout", "device", "pin_memory", "non_blocking", "memory_format"})


def _on_cpu(value, zeros):
    """``value`` (a tensor, or a list or tuple of them, as aten ops take) with each meta tensor
    replaced by ``zeros(t)``."""
    if isinstance(value, torch.Tensor):
        return zeros(value) if value.is_meta else value
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_on_cpu(v, zeros) for v in value)
    return value


def _private_zeros(t: torch.Tensor) -> torch.Tensor:
    """Zeros of ``t``'s layout of their own, for an op that may write them."""
    return torch.zeros_like(t, device="cpu")


_ZEROS: dict[torch.dtype, torch.Tensor] = {}  # per dtype, one zero CPU buffer every weight's copy views


def zeros_like_meta(t: torch.Tensor) -> torch.Tensor:
    """A zero CPU tensor with ``t``'s size, strides and dtype: a view of one shared zero buffer,
    so a weight costs no memory or time of its own. Views of one buffer may alias each other,
    which changes values at most (an in-place write to a weight), and values are never counted."""
    extent = 1 + sum((size - 1) * stride for size, stride in zip(t.size(), t.stride())) if t.numel() else 0
    if extent * t.element_size() > MAX_WEIGHT_BYTES:
        raise Stop("a weight larger than a direct run copies")
    buffer = _ZEROS.get(t.dtype)
    if buffer is None or buffer.numel() < extent:
        buffer = _ZEROS[t.dtype] = torch.zeros(max(extent, 1 << 16), dtype=t.dtype)
    return buffer.as_strided(t.size(), t.stride())
