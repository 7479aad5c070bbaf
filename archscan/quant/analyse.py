"""``--quant``: a scan's model quantized with torchao on the meta device, its layers as stored and as
the fused kernels that serve them run (see the package docstring)."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn

from ..costs import activation_quantize, inner_named, storage_id
from ..devices.gpus import GPU
from ..errors import ArchscanError
from ..measure.gpu import kernel_us, node_work, simulate
from ..measure.predict import predict_node
from ..results import NodeReport, Report
from ..rules.context import dtype_size
from .schemes import INT4_ON_CPU, Scheme, cannot_use, config, gpu_int4_bytes, int8_bytes, layout_of, torchao, _quiet_import

_WEIGHT_CATEGORIES = ("linear", "matmul", "conv", "grouped_conv", "depthwise_conv", "embedding")


# layers no config takes: the section refuses a model with nothing else
_NOT_TAKEN = ("torchao leaves nn.MultiheadAttention's output projection (its forward reads the weight itself)",
              "not run by the forward")


@dataclass(frozen=True)
class Layer:
    """One layer a torchao config could take (an ``nn.Linear``), quantized or kept, and why."""

    module: str
    in_features: int
    out_features: int
    weight_bytes: int                 # as the model holds it (its dtype)
    stored_bytes: int                 # as the scheme stores it (== weight_bytes when kept)
    parts: dict                       # inner tensor -> bytes (qdata, scale, zero_point)
    kept: str | None = None           # why it stays in high precision; None: quantized

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        return {k: v for k, v in out.items() if v is not None}


def _forward_order(report: Report) -> list[str]:
    """Module paths of the weight layers in the order the forward first runs them."""
    seen: dict[str, None] = {}
    for n in report.nodes:
        if n.weight_bytes and n.category in _WEIGHT_CATEGORIES and n.module:
            seen.setdefault(n.module, None)
    return list(seen)


def _compute_bound(nodes: Sequence[NodeReport], gpu: GPU | None, profile) -> bool | None:
    """Whether the nodes' kernels are bound by their multiply-adds (the GPU model's kernels on
    ``gpu``, else the profile's roofline); None without a time model."""
    if gpu is not None:
        priced = [kernel_us(w, gpu) for n in nodes for w in node_work(n)]
    elif profile is not None:
        priced = [predict_node(n, profile) for n in nodes]
    else:
        return None
    return bool(priced) and max(priced)[1] == "compute"


def _matches(path: str, patterns: Sequence[str]) -> bool:
    return any(re.fullmatch(p, path) or path == p or path.startswith(p + ".") for p in patterns)


def plan_layers(model: nn.Module, report: Report, scheme: Scheme, *, gpu: GPU | None = None, profile=None,
                keep: Sequence[str] = (), formula: bool = False) -> list[Layer]:
    """Every ``nn.Linear`` of ``model`` (on the meta device) with the scheme's bytes or the reason it
    stays: a ``keep`` pattern (a module path, its prefix, or a regular expression), the first or
    last weight layer of the forward (their error is not averaged over later layers), channel counts
    the scheme's kernel cannot take, or, weight-only on a device with a time model, a layer that is
    compute-bound at the scan's rows (weight-only saves bytes, not multiply-adds: no time).
    ``formula``: int8's bytes from its layout's shapes (``schemes.int8_bytes``), without torchao."""
    linears = {path: m for path, m in model.named_modules() if isinstance(m, nn.Linear)}
    order = _forward_order(report)
    used = [p for p in order if p in linears]
    ends = {order[0]: "the first layer: its error reaches every later layer",
            order[-1]: "the last layer: its error reaches the output unaveraged"} if order else {}
    nodes_of: dict[str, list[NodeReport]] = {}
    for n in report.nodes:
        nodes_of.setdefault(n.module, []).append(n)
    reasons: dict[str, str | None] = {}
    unmatched = [p for p in keep if not any(_matches(path, [p]) for path in linears)]
    if unmatched:
        raise ArchscanError(f"--keep {unmatched[0]} matches no linear layer of {report.model}",
                            hint="give a module path (e.g. " + (next(iter(linears), "layers.0.mlp")) + "), a prefix or a regular expression")
    for path, m in linears.items():
        if isinstance(m, nn.modules.linear.NonDynamicallyQuantizableLinear):
            reasons[path] = _NOT_TAKEN[0]
        elif path not in used:
            reasons[path] = _NOT_TAKEN[1]
        elif _matches(path, keep):
            reasons[path] = "kept by --keep"
        else:
            reasons[path] = cannot_use(scheme, m.in_features, m.out_features, gpu is not None)
    if sum(r is None for r in reasons.values()) > 2:  # the ends stay unless they are all there is
        for path, why in ends.items():
            if path in reasons and reasons[path] is None:
                reasons[path] = why
    stored = _stored(model, [p for p, r in reasons.items() if r is None], scheme, gpu is not None, formula)
    layers = []
    for path, m in linears.items():
        w = m.weight
        before = w.numel() * w.element_size()
        parts = stored.get(path)
        why = reasons[path]
        if why is None and scheme.weight_only and (gpu is not None or profile is not None):
            mine = [n for n in nodes_of.get(path, []) if n.weight_bytes]
            if _compute_bound(mine, gpu, profile):
                rows = max((math.prod(n.out_shape[:-1]) if n.out_shape else 0) for n in mine) if mine else 0
                where = gpu.name if gpu is not None else "this device"
                why = f"compute-bound at {rows:,} rows on {where}: weight-only quantization saves no time"
        if why is not None:
            layers.append(Layer(path, m.in_features, m.out_features, before, before, {}, why))
        else:
            layers.append(Layer(path, m.in_features, m.out_features, before, sum(parts.values()), parts))
    return layers


def _stored(model: nn.Module, paths: Sequence[str], scheme: Scheme, gpu: bool, formula: bool = False) -> dict[str, dict]:
    """Layer path -> {inner tensor: bytes} of the weights ``scheme`` stores on the device: torchao's
    own quantized tensors, made on the meta device and read from their inner storages; the GPU's
    int4 layout (whose kernel package a CPU machine lacks) from its shapes, and int8's too with
    ``formula``."""
    if not paths:
        return {}
    modules = dict(model.named_modules())
    if formula and scheme.name == "int8":
        return {p: int8_bytes(*modules[p].weight.shape) for p in paths}
    if scheme.name == "int4" and gpu:
        out = {}
        for p in paths:
            w = modules[p].weight
            out[p] = gpu_int4_bytes(w.shape[0], w.shape[1], scheme.group, w.element_size())
        return out
    torchao()
    from torchao.quantization import quantize_

    copies = {p: _layer_copy(modules[p]) for p in paths}
    holder = nn.ModuleDict({str(i): m for i, m in enumerate(copies.values())})
    try:
        with _quiet_import():
            quantize_(holder, config(scheme, gpu), filter_fn=lambda m, fqn: isinstance(m, nn.Linear))
    except Exception as exc:
        raise ArchscanError(f"torchao could not quantize the model as {scheme.label}: {type(exc).__name__}: {exc}",
                            hint="try another --quant scheme") from None
    out = {}
    for p, copy in zip(copies, holder.values()):
        out[p] = inner_bytes(copy.weight)
    return out


def _layer_copy(linear: nn.Linear) -> nn.Linear:
    """A fresh ``nn.Linear`` on the meta device with ``linear``'s shapes and dtype (quantize_ replaces
    the weight of the copy, never the scan's model)."""
    w = linear.weight
    with torch.device("meta"):
        copy = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, dtype=w.dtype)
    return copy


def inner_bytes(t: torch.Tensor) -> dict:
    """{inner tensor name: bytes} of a tensor subclass (``costs.inner_named``), each storage once; a
    plain tensor as {'data': its bytes}."""
    out: dict[str, int] = {}
    seen: set = set()
    for name, inner in inner_named(t):
        if storage_id(inner) not in seen:
            seen.add(storage_id(inner))
            out[name or "data"] = out.get(name or "data", 0) + inner.untyped_storage().nbytes()
    return out


def rewrite(nodes: Sequence[NodeReport], layers: dict[str, tuple[int, int]], scheme: Scheme,
            kv: Sequence[int] | None = None, kv_ratio: float = 1.0) -> list[NodeReport]:
    """``nodes`` as the fused kernels of a quantized model run them. ``layers``: module path ->
    (weight bytes in the model's dtype, bytes as stored). A node of a quantized layer that reads its
    weight reads the stored bytes instead (a dequantizing GEMM reads the quantized weight and its
    scales once); under w8a8 the GEMM computes in int8 on int8 activations, which a kernel before
    it quantizes (reading the activations, writing them as int8 with a float32 scale per row).
    ``kv``: per node, the KV-cache bytes it reads (a decode step's), scaled by ``kv_ratio``."""
    out = []
    for i, n in enumerate(nodes):
        if kv is not None and kv[i] and kv_ratio != 1.0:
            saved = round(kv[i] * (1 - kv_ratio))
            n = dataclasses.replace(n, read_bytes=n.read_bytes - saved, mac_bytes=n.mac_bytes - saved)
        found = layers.get(n.module)
        if found is None or not n.weight_bytes or n.category not in _WEIGHT_CATEGORIES:
            out.append(n)
            continue
        before, stored = found
        weight = n.weight_bytes - before + stored if n.weight_bytes >= before else round(n.weight_bytes * stored / before)
        saved = n.weight_bytes - weight
        attrs = {**n.attrs, "quant": scheme.label}
        if scheme.compute_dtype is None:
            out.append(dataclasses.replace(n, weight_bytes=weight, read_bytes=n.read_bytes - saved,
                                           mac_bytes=n.mac_bytes - saved, attrs=attrs))
            continue
        elements = max(n.read_bytes - n.weight_bytes, 0) // dtype_size(n.dtype)
        elem_ops, read, write = activation_quantize(elements, dtype_size(n.dtype), elements // max(found_k(n), 1))
        gemm_read = weight + elements
        out.append(dataclasses.replace(n, name=f"{n.name}.quantize_activations", op="torchao.quantize_affine",
                                       category="elementwise", flops=0, elem_ops=elem_ops, read_bytes=read,
                                       write_bytes=write, mac_bytes=read + write, weight_bytes=0, params=0,
                                       aten_ops=("torchao.quantize_affine",), attrs={"quant": scheme.label},
                                       latency_ms=None, predicted_ms=None))
        out.append(dataclasses.replace(n, dtype=scheme.compute_dtype, weight_bytes=weight, read_bytes=gemm_read,
                                       mac_bytes=gemm_read + n.write_bytes, attrs=attrs))
    return out


def found_k(n: NodeReport) -> int:
    """The inner size of a GEMM node, from its multiply-adds and output (M·N·K / (M·N))."""
    out = math.prod(n.out_shape or ())
    return n.flops // out if out and n.flops else 1


def times(nodes: Sequence[NodeReport], gpu: GPU | None, profile) -> dict:
    """The op stream's predicted time: on a named GPU as written (eager) and as served; else the
    profile's roofline; {} without either."""
    if gpu is not None:
        t = simulate(nodes, gpu)
        return {"predicted_ms": t.eager_ms, "served_ms": t.served_ms}
    if profile is not None:
        return {"predicted_ms": sum(predict_node(n, profile)[0] for n in nodes)}
    return {}


def _totals(nodes: Sequence[NodeReport], param_bytes: int, gpu: GPU | None, profile) -> dict:
    return {"param_bytes": param_bytes, "weight_bytes": sum(n.weight_bytes for n in nodes),
            "mac_bytes": sum(n.mac_bytes for n in nodes), "flops": sum(n.flops for n in nodes),
            "kernels": sum(1 for n in nodes for op in n.aten_ops if not op.startswith("aten.empty")),
            **times(nodes, gpu, profile)}


def quantized(layers: Sequence[Layer]) -> dict[str, tuple[int, int]]:
    """The layers quantized: module path -> (weight bytes as held, bytes as stored), as ``rewrite`` takes them."""
    return {l.module: (l.weight_bytes, l.stored_bytes) for l in layers if l.kept is None}


def quant_section(model: nn.Module, report: Report, scheme: Scheme, *, gpu: GPU | None = None, profile=None,
                  keep: Sequence[str] = (), layers: list[Layer] | None = None) -> dict:
    """``report.quant``: the layers, quantized and kept, the bytes as stored, and the forward's
    totals and predicted time before and after."""
    layers = plan_layers(model, report, scheme, gpu=gpu, profile=profile, keep=keep) if layers is None else layers
    chosen = quantized(layers)
    if not any(l.kept is None or not l.kept.startswith(_NOT_TAKEN) for l in layers):
        raise ArchscanError(f"{report.model} has nothing to quantize as {scheme.label}: "
                            + ("it has no nn.Linear layer (torchao's configs quantize nn.Linear only)" if not layers
                               else "no nn.Linear torchao takes runs in its forward"), hint="drop --quant")
    after_nodes = rewrite(report.nodes, chosen, scheme)
    saved = sum(w - s for w, s in chosen.values())
    before = _totals(report.nodes, report.totals.param_bytes, gpu, profile)
    after = _totals(after_nodes, report.totals.param_bytes - saved, gpu, profile)
    stored_params = sum(l.stored_bytes for l in layers if l.kept is None)
    elements = sum(l.in_features * l.out_features for l in layers if l.kept is None)
    section = {"scheme": scheme.label, "layout": layout_of(scheme, gpu is not None),
               "not_linear": not_linear(model),
               "device": gpu.name if gpu is not None else "cpu",
               "quantized": len(chosen), "kept": sum(1 for l in layers if l.kept is not None),
               "bits_per_weight": 8 * stored_params / elements if elements else None,
               "layers": [l.to_json() for l in layers], "before": before, "after": after}
    if scheme.name == "int4" and gpu is None:
        section["note"] = INT4_ON_CPU
    if "predicted_ms" in before and after.get("predicted_ms"):
        section["speedup"] = before["predicted_ms"] / after["predicted_ms"]
        if "served_ms" in before and after.get("served_ms"):
            section["served_speedup"] = before["served_ms"] / after["served_ms"]
    return section


def not_linear(model: nn.Module) -> dict:
    """The weights no torchao config here quantizes (torchao's configs take ``nn.Linear`` only):
    module type -> {modules, bytes}, largest first (embeddings, convolutions, norms...)."""
    out: dict[str, dict] = {}
    for m in model.modules():
        if isinstance(m, nn.Linear):
            continue
        own = [t for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]]
        if own:
            row = out.setdefault(type(m).__name__, {"modules": 0, "bytes": 0})
            row["modules"] += 1
            row["bytes"] += sum(t.numel() * t.element_size() for t in own)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["bytes"]))


def decode_variant(chosen: dict[str, tuple[int, int]], scheme: Scheme | None, kv_ratio: float = 1.0) -> Callable:
    """The decode step's nodes rewritten as the quantized model (``chosen``: ``quantized``'s layers)
    and cache run them, for ``archscan.llm.decode.decode_step(variants=...)``."""

    def variant(nodes: Sequence[NodeReport], kv: Sequence[int]) -> list[NodeReport]:
        return rewrite(nodes, chosen, scheme or Scheme("int8"), kv, kv_ratio)  # no scheme: no layer, the cache alone

    return variant


__all__ = ["Layer", "decode_variant", "inner_bytes", "plan_layers", "quant_section", "quantized", "rewrite", "times"]
