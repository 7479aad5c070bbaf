"""Models that are already quantized, as they are: what their weights store and what their ops cost.

Two kinds of quantized weight reach an op:

* torch.ao's packed parameters (``torch.ao.nn.quantized.Linear``/``Conv2d`` from eager static
  quantization, ``torch.ao.nn.quantized.dynamic.Linear``/``LSTM`` from ``quantize_dynamic``): a
  TorchScript object (``LinearPackedParamsBase``, ``Conv2dPackedParamsBase``, the LSTM's
  ``CellParamsBase``) handed to ops of the ``quantized`` namespace (``quantized::linear_dynamic``,
  ``quantized::linear``, ``quantized::conv2d.new``) or to ``aten::quantized_lstm``. It holds no
  tensor the dispatcher sees: ``packed`` unpacks it (torch's own ``linear_unpack``, ``unpack``) to
  the weights and biases it packs. They count as those tensors' elements; their bytes as stored are
  the quantized tensor's int8 values, its scales (float64) and zero points (int64), one per tensor
  or per output channel, as torch holds them unpacked, plus the float biases.
* tensor subclasses (torchao's ``Int8Tensor``, ``Float8Tensor``, ``IntxUnpackedToInt8Tensor``): a
  parameter of the float shape whose inner tensors (``__tensor_flatten__``: ``qdata``, ``scale``,
  ``zero_point``) hold what is stored. It counts as its logical elements (N·K for a [N, K] weight);
  its bytes as stored are its inner tensors' storages' bytes, each storage once (``stored_nbytes``).

The formulas here take shapes (the registry, ``registry.py``, registers them for the ops and
imports this module; this module imports nothing of archscan's). Multiply-adds are those of the
float layer the op stands for: a quantized linear of M rows is M·N·K, a quantized convolution
counts as its float convolution, a quantized LSTM as its float LSTM (each weight matrix once per
token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes, is_traceable_wrapper_subclass


@dataclass(frozen=True)
class Packed:
    """What a torch.ao packed-parameters object holds: ``weights`` (the quantized weight tensors, in
    the order the op uses them), ``biases`` (float), their elements and their bytes as stored."""

    weights: tuple[torch.Tensor, ...]
    biases: tuple[torch.Tensor, ...]
    numel: int
    nbytes: int
    dtype: str  # the weights' stored type: 'qint8', 'float16'

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(int(s) for s in w.shape) for w in self.weights)


def real_object(obj: Any) -> Any:
    """The TorchScript object itself (fake tensor mode wraps one as a ``FakeScriptObject``)."""
    return getattr(obj, "real_obj", obj)


def is_packed(obj: Any) -> bool:
    """A torch.ao packed-parameters object (linear, convolution, an RNN cell's)?"""
    if not isinstance(obj, torch.ScriptObject):
        if type(obj).__name__ != "FakeScriptObject":  # the common case, answered without a lookup
            return False
        obj = real_object(obj)
    return isinstance(obj, torch.ScriptObject) and _kind(obj) is not None


def packed_attributes(module: Any) -> list[tuple[str, Any]]:
    """(attribute, object) of the torch.ao packed parameters a module holds as plain attributes
    (a quantized layer's ``_packed_params``); its own bookkeeping (dicts, flags) is passed over at
    once, since every module of every build is asked."""
    return [(attr, value) for attr, value in vars(module).items()
            if not isinstance(value, (dict, bool, int, float, str)) and is_packed(value)]


def packed_key(obj: Any) -> tuple[str, int]:
    """The identity of a packed-parameters object, as ``storage_key`` is a tensor's: the TorchScript
    object's own hash (its address), the same whichever Python wrapper holds it (each op call gets a
    new one: ``id`` differs)."""
    return ("packed", hash(real_object(obj)))


def _kind(obj: torch.ScriptObject) -> str | None:
    try:
        name = obj._type().qualified_name()
    except Exception:
        return None
    for kind in ("LinearPackedParamsBase", "PackedParamsBase", "CellParamsBase"):
        if name.endswith(kind):
            return kind
    return None


_CACHE: dict[int, tuple[Any, Packed]] = {}  # hash -> (the object, kept alive so its address stays its own; what it holds)
_CACHE_SIZE = 4096


def packed(obj: Any) -> Packed | None:
    """What a packed-parameters object holds (``Packed``), unpacked once per object; None for
    anything else."""
    obj = real_object(obj)
    if not isinstance(obj, torch.ScriptObject):
        return None
    hit = _CACHE.get(hash(obj))
    if hit is not None:
        return hit[1]
    kind = _kind(obj)
    if kind is None:
        return None
    with _disable_current_modes():  # the real objects they are, read beneath no fake or recording mode
        weights, biases = _unpack(obj, kind)
        biases = [b for b in biases if b is not None]
        found = Packed(tuple(weights), tuple(biases), sum(t.numel() for t in weights + biases),
                       sum(map(stored_nbytes, weights + biases)),
                       str(weights[0].dtype).removeprefix("torch.") if weights else "")
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.clear()
    _CACHE[hash(obj)] = (obj, found)
    return found


def _unpack(obj: torch.ScriptObject, kind: str) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """([weights], [biases]) of a packed object, by torch's own unpacking."""
    if kind == "LinearPackedParamsBase":
        try:
            w, b = torch.ops.quantized.linear_unpack(obj)
        except RuntimeError:  # quantize_dynamic(dtype=torch.float16) packs fp16 weights
            w, b = torch.ops.quantized.linear_unpack_fp16(obj)
        return [w], [b]
    if kind == "CellParamsBase":  # (('quantized_dynamic', [b_ih, b_hh], [], [...], [packed w_ih, packed w_hh]), type)
        state = obj.__getstate__()[0]
        weights, biases = [], []
        for inner in state[4]:  # each packs its weight with its bias, which the state lists again
            found = packed(inner)
            if found is not None:
                weights += found.weights
                biases += found.biases
        if not biases:
            biases = [b for b in state[1] if isinstance(b, torch.Tensor) and b.dim() == 1]
        return weights, biases
    w, b = obj.unpack()  # convolutions
    return [w], [b]


def stored_nbytes(t: torch.Tensor) -> int:
    """A tensor's bytes as stored: a tensor subclass's inner tensors' storages (each storage once,
    recursively); a quantized tensor's int8 values with its scales and zero points; any other
    tensor its elements at its dtype."""
    if is_traceable_wrapper_subclass(t):
        return storages_nbytes([t])
    if t.is_quantized:
        if t.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric,
                           torch.per_channel_affine_float_qparams):
            qparams = t.q_per_channel_scales().nbytes + t.q_per_channel_zero_points().nbytes
        else:
            qparams = 8 + 8  # one scale (a double) and one zero point (an int64)
        return t.numel() * t.element_size() + qparams
    return t.numel() * t.element_size()


def activation_quantize(elements: int, element_size: int, rows: int) -> tuple[int, int, int]:
    """(element ops, bytes read, bytes written) of the kernel that quantizes a dynamic-activation
    GEMM's [rows, K] input: it reads the activations and writes them one byte each, with a float32
    scale per row (torchao's w8a8; ``registry.subclass_linear_costs`` and ``archscan.quant`` both
    count it so)."""
    return 2 * elements, elements * element_size, elements + 4 * rows


def inner_named(t: torch.Tensor, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """(name, plain tensor) of what a tensor subclass is made of (``__tensor_flatten__``,
    recursively, nested names joined with '.': 'qdata', 'scale', 'zero_point'); [(prefix, t)] for a
    plain tensor."""
    if not is_traceable_wrapper_subclass(t):
        return [(prefix, t)]
    names, _ = t.__tensor_flatten__()
    return [inner for name in names for inner in inner_named(getattr(t, name), f"{prefix}.{name}" if prefix else name)]


def inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors a tensor subclass is made of (``inner_named``); [t] for a plain tensor."""
    return [inner for _, inner in inner_named(t)]


def storage_id(t: torch.Tensor):
    """One key per storage (a meta tensor's storage has no address: its object stands for it)."""
    storage = t.untyped_storage()
    return id(storage) if t.is_meta else storage._cdata


def storages_nbytes(tensors) -> int:
    """The bytes of the storages of ``tensors`` and of their subclasses' inner tensors, each storage once."""
    seen: dict = {}
    for t in tensors:
        for inner in inner_tensors(t):
            seen.setdefault(storage_id(inner), inner.untyped_storage().nbytes())
    return sum(seen.values())


def stored_dtype(t: torch.Tensor) -> str | None:
    """The type a quantized weight stores, by name ('int8', 'float8_e4m3fn', 'int4', 'qint8'); None
    for a plain float tensor."""
    if t.is_quantized:
        return str(t.dtype).removeprefix("torch.")
    if not is_traceable_wrapper_subclass(t):
        return None
    target = getattr(t, "target_dtype", None)  # IntxUnpackedToInt8Tensor: int4 values held in int8
    if isinstance(target, torch.dtype):
        return str(target).removeprefix("torch.")
    names, _ = t.__tensor_flatten__()
    data = getattr(t, "qdata", None) if "qdata" in names else getattr(t, names[0], None)
    return str(data.dtype).removeprefix("torch.") if isinstance(data, torch.Tensor) else type(t).__name__


def quantizes_activations(t: torch.Tensor) -> bool:
    """Does a tensor-subclass weight quantize the activations it meets (torchao's dynamic-activation
    configs: ``act_quant_kwargs``, ``activation_quantization``), so its GEMM computes in int8/float8?"""
    return any(getattr(t, name, None) is not None for name in ("act_quant_kwargs", "activation_quantization"))


# --- formulas, on shapes ------------------------------------------------------------------------------

def quantized_linear_flops(x: tuple[int, ...], out: tuple[int, ...]) -> int:
    """A quantized linear layer: the multiply-adds of its float layer, M·N·K.

    # [..., N] = linear([..., K], W [N, K]): prod(x) * N
    """
    return math.prod(x) * (out[-1] if out else 1)


def quantized_conv_flops(weight: tuple[int, ...], out: tuple[int, ...], transposed: bool = False,
                         x: tuple[int, ...] = ()) -> int:
    """A quantized convolution: the multiply-adds of its float convolution.

    # [n, co, *o] = conv([n, ci, *i], W [co, ci/g, *k]): n * co * prod(o) * ci/g * prod(k)
    # transposed, W [ci, co/g, *k]: every input position meets the whole kernel, n * prod(i) * prod(W)
    """
    if transposed:
        return x[0] * math.prod(x[2:]) * math.prod(weight) if x else 0
    return math.prod(out) * math.prod(weight[1:])


def quantized_rnn_flops(x: tuple[int, ...], weights: tuple[tuple[int, ...], ...]) -> int:
    """A quantized LSTM/GRU: every weight matrix multiplies once per token, as the float layer.

    # input [b, t, i] (or [t, b, i]): b*t * sum(w_ih [gates*h, i], w_hh [gates*h, h]) over layers, directions
    """
    tokens = math.prod(x[:-1]) if len(x) > 1 else 1
    return tokens * sum(math.prod(w) for w in weights if len(w) == 2)


def int_mm_flops(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """``aten._int_mm``, the int8 GEMM of int8 activations and weights (int32 out).

    # [m, n] = _int_mm([m, k], [k, n]): m * k * n
    """
    return a[0] * a[1] * b[1]


__all__ = ["Packed", "inner_tensors", "int_mm_flops", "is_packed", "packed", "packed_attributes", "packed_key", "quantized_conv_flops",
           "quantized_linear_flops", "quantized_rnn_flops", "quantizes_activations", "real_object", "stored_dtype",
           "stored_nbytes"]
