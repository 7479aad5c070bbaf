"""Fit the GPU time model (``archscan/measure/gpu.py``) on the recorded H200 traces in ``tests/gpu_truth``.

    python benchmarks/fit_gpu_time.py            # fit, print the fit and its error per configuration
    python benchmarks/fit_gpu_time.py --check    # ... and fail unless gpu.FIT holds what it computes
    python benchmarks/fit_gpu_time.py --write    # ... and write the constants into gpu.py
    python benchmarks/fit_gpu_time.py --scan     # ... and predict every configuration through archscan.scan

Each latency configuration's ``trace.json.gz`` is torch.profiler's trace of one eager run: every
top-level aten call the model made (its input shapes, dtypes and scalars), the host time it took
(the call itself and the Python before it, since the last call ended), and the kernels it launched
with their GPU durations. Every call is replayed on fake CPU tensors under archscan's own op costing
(``archscan.costs.cost_op``), which gives the ops archscan sees for it, their kernel classes, FLOPs
(executed ones for causal attention) and bytes. Then:

1. kernels per aten op of each class: the kernels the calls launched over the ops that launch;
2. the kernel floor and each class's compute and bandwidth fraction: least squares (non-negative,
   each call weighted by one over the square root of its measured kernel time) of
   ``Σ kernels × floor + max(flops / (compute × peak), bytes / (bandwidth × datasheet bandwidth))``
   against the calls' kernel time, the bound of each op re-decided until it no longer changes (a class in
   ``model.RATE_CLASSES`` gets an absolute TB/s instead of a bandwidth fraction, which keeps its prior);
3. host µs per aten op of each host class: least squares of the calls' host time as profiled;
4. the profiler's own cost taken out: one factor on the host times, chosen so that the simulated
   eager runs (host timeline from 3, kernels as measured) match each fit configuration's
   unprofiled ``eager_ms`` (least squares of the log ratio);
5. the backward classes (``model.BACKWARD_CLASSES``: a training step's backward kernels by their
   op's forward class) from the backward calls of the training steps in ``BACKWARD_CONFIGS`` (the
   autograd engine's thread; a convolution's backward filed by its groups, as
   ``archscan.memory.train`` files it): kernels per op as in 1, then their compute and bandwidth
   fractions as in 2 with the floor and the forward classes held at the fit of 2.

Only the configurations in ``FIT_CONFIGS`` are fit on; every other one is predicted (held out), and
``--loo`` prints each configuration predicted by a fit on all the others.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import gzip
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from archscan.costs import cost_op, storage_key, tensors_in  # noqa: E402
from archscan.costs.kernels import run_op  # noqa: E402
from archscan.devices.gpus import gpu as named_gpu  # noqa: E402
from archscan.measure import gpu as model  # noqa: E402
from archscan.memory.train import backward_category  # noqa: E402

TRUTH = ROOT / "tests" / "gpu_truth"
# fit on these; every other recorded latency configuration is held out (tests/test_gpu_time.py names the same)
FIT_CONFIGS = ("lat_resnet50_fwd_b64_bf16", "lat_mobilenet_v2_fwd_b128_bf16", "lat_vit_b_16_fwd_b64_bf16",
               "lat_llama_1b_decode_b1_l2048_bf16", "lat_llama_1b_decode_b16_l2048_bf16")
# the recorded training steps whose backward kernels fit the backward classes (model.BACKWARD_CLASSES); their
# forward and optimizer are not fit on. The H100 set's training steps stay held out.
BACKWARD_CONFIGS = ("lat_resnet50_train_b32_fp32", "mem_resnet50_train_b32", "mem_mobilenet_v2_train_b64",
                    "mem_vit_b_16_train_b16", "mem_roberta_base_train_8x512", "mem_roberta_base_train_8x512_bf16",
                    "mem_pythia_160m_train_4x1024", "mem_llama_1b_train_2x2048_bf16w")
DATE = "2026-11-26"

_DTYPES = {"c10::BFloat16": torch.bfloat16, "float": torch.float32, "c10::Half": torch.float16, "double": torch.float64,
           "long int": torch.int64, "int": torch.int32, "bool": torch.bool, "unsigned char": torch.uint8,
           "signed char": torch.int8}
_SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
                 6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16}
# the arguments of a call that are the model's parameters (a linear's weight and bias, a norm's affine...)
_WEIGHTS = {"aten::linear": (1, 2), "aten::conv2d": (1, 2), "aten::convolution": (1, 2), "aten::batch_norm": (1, 2, 3, 4),
            "aten::layer_norm": (2, 3), "aten::group_norm": (2, 3), "aten::embedding": (0,),
            "aten::_native_multi_head_attention": (5, 6, 7, 8)}
_SMALL_US = 2.0  # an op whose roofline is below this informs the floor only
# the calls torch.nn's layers make (nn.Conv2d -> aten::conv2d, nn.SiLU -> aten::silu...): each carries the
# host time of a Module.__call__, as archscan.measure.gpu.module_call counts it on archscan's side
_MODULE_CALLS = ("aten::conv2d", "aten::conv1d", "aten::conv3d", "aten::batch_norm", "aten::layer_norm",
                 "aten::group_norm", "aten::linear", "aten::embedding", "aten::relu_", "aten::relu", "aten::hardtanh_",
                 "aten::hardtanh", "aten::gelu", "aten::silu", "aten::silu_", "aten::dropout", "aten::max_pool2d",
                 "aten::adaptive_avg_pool2d", "aten::avg_pool2d", "aten::_native_multi_head_attention")
_SYNCS = ("aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::nonzero")


# --- the traces ----------------------------------------------------------------------------------------

@dataclass
class Call:
    """One top-level aten call of a recorded run."""

    name: str
    args: dict
    host_us: float                  # the call and the Python since the last call ended (profiled)
    kernel_us: float                # its kernels' GPU time
    kernels: int
    ops: list | None = None         # archscan's (OpCost, dtype) for it, replayed
    works: list = field(default_factory=list)


def _kernel_times(events: list, by_id: dict) -> dict[int, list]:
    """The durations of the GPU work (kernels, memsets, copies) each top-level op launched, by the
    op's id: linked through the launching op's External id to its ``_top``."""
    kernel_time: dict[int, list] = {}
    for k in events:
        if k.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"):
            op = by_id.get(k["args"].get("External id"))
            if op is not None and "_top" in op:
                kernel_time.setdefault(id(op["_top"]), []).append(k["dur"])
    return kernel_time


def read_trace(path: Path) -> list[Call]:
    """The top-level aten calls of a trace's main thread, in order, with their kernels."""
    with gzip.open(path, "rt") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["ts"], -e["dur"]))
    main = ops[0]["tid"]
    by_id = {e["args"]["External id"]: e for e in ops}
    tops, stack = [], []
    for e in ops:
        if e["tid"] != main:
            continue
        while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
            stack.pop()
        e["_top"] = stack[0] if stack else e
        if not stack:
            tops.append(e)
        stack.append(e)
    kernel_time = _kernel_times(events, by_id)
    calls, end = [], None
    for e in tops:
        gap = e["ts"] - end if end is not None else 0.0
        end = e["ts"] + e["dur"]
        ks = kernel_time.get(id(e), [])
        calls.append(Call(e["name"], e["args"], e["dur"] + gap, sum(ks), len(ks)))
    return calls


def read_backward(path: Path) -> list[Call]:
    """The aten calls of a training step's backward (the autograd engine's thread: every thread but the
    main one), the outermost aten call of each nest, with their kernels; no host time."""
    with gzip.open(path, "rt") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["ts"], -e["dur"]))
    main = ops[0]["tid"]
    by_id = {e["args"]["External id"]: e for e in ops}
    tops, stacks = [], {}
    for e in ops:
        if e["tid"] == main:
            continue
        stack = stacks.setdefault(e["tid"], [])
        while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
            stack.pop()
        outer = next((s for s in stack if s["name"].startswith("aten::")), None)
        if outer is not None:
            e["_top"] = outer
        elif e["name"].startswith("aten::"):
            e["_top"] = e
            tops.append(e)
        stack.append(e)
    kernel_time = _kernel_times(events, by_id)
    calls = []
    for e in tops:
        ks = kernel_time.get(id(e), [])
        calls.append(Call(e["name"], e["args"], 0.0, sum(ks), len(ks)))
    return calls


def read_summary(root: Path = TRUTH) -> tuple[dict, dict]:
    """(the environment line, {id: configuration}) of ``summary.jsonl``."""
    env, configs = {}, {}
    with open(root / "summary.jsonl", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["id"] == "env":
                env = rec
            else:
                configs[rec["id"]] = rec
    return env, configs


# --- replaying a call on fake tensors under archscan's costing -------------------------------------------

class _Costs(TorchDispatchMode):
    def __init__(self, weights: set):
        super().__init__()
        self.weights, self.ops = weights, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = run_op(func, args, kwargs)
        if func.namespace != "prim":
            tensors = tensors_in(out)
            cost = cost_op(func, args, kwargs, out, self.weights)
            self.ops.append((dataclasses.replace(cost, category=backward_category(func, args, cost.category)),
                             str(tensors[0].dtype).removeprefix("torch.") if tensors else None))
        return out


def _scalar(text: str):
    if text in ("True", "False"):
        return text == "True"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _arguments(call: Call) -> list:
    a = call.args
    types, dims = a.get("Input type", []), a.get("Input Dims", [])
    strides, concrete = a.get("Input Strides", []), a.get("Concrete Inputs", [])
    out = []
    for i, kind in enumerate(types):
        text = concrete[i] if i < len(concrete) else ""
        if kind in _DTYPES:
            if text:  # a Python number
                out.append(_scalar(text))
            elif kind == "double" and dims[i] == []:  # a float whose value was not recorded
                out.append(1.0)
            else:
                st = strides[i] if i < len(strides) and strides[i] and len(strides[i]) == len(dims[i]) else None
                out.append(torch.empty_strided(dims[i], st, dtype=_DTYPES[kind]) if st else
                           torch.empty(dims[i], dtype=_DTYPES[kind]))
        elif kind == "TensorList":
            first = next((_DTYPES[t] for t in types if t in _DTYPES), torch.bfloat16)
            out.append([torch.empty(d, dtype=first) for d in dims[i]])
        else:
            out.append(_scalar(text) if text else None)
    return out


def _mha(args: list):
    """``_native_multi_head_attention`` as its CUDA fast path runs it: the packed input projection,
    attention, the output projection."""
    import torch.nn.functional as F

    x, _, _, embed, heads, w_in, b_in, w_out, b_out = args[:9]
    b, s, _ = x.shape
    qkv = F.linear(x, w_in, b_in).view(b, s, 3, heads, embed // heads).permute(2, 0, 3, 1, 4)
    out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
    return F.linear(out.transpose(1, 2).reshape(b, s, embed), w_out, b_out)


def replay(call: Call) -> list | None:
    """archscan's ``(OpCost, dtype)`` for each op of the call, replayed on fake CPU tensors; None when
    it cannot be (not an aten call, a value read back, an overload that does not match)."""
    if not call.name.startswith("aten::") or call.name in _SYNCS:
        return None
    packet = getattr(torch.ops.aten, call.name[6:], None)
    if packet is None:
        return None
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = _arguments(call)
        weights = {storage_key(args[i]) for i in _WEIGHTS.get(call.name, ())
                   if i < len(args) and isinstance(args[i], torch.Tensor)}
        if call.name == "aten::_native_multi_head_attention":
            attempts = [(_mha, args, {})]
        else:
            lists = [args]
            if call.name == "aten::to":  # a dtype recorded as its ScalarType number
                lists.insert(0, [_SCALAR_TYPES.get(v, v) if type(v) is int and i in (1, 2) else v
                                 for i, v in enumerate(args)])
            attempts = []
            for values in lists:  # the schema says which recorded arguments are keyword-only
                for name in packet.overloads():
                    op = getattr(packet, name)
                    schema = op._schema.arguments
                    if len(schema) == len(values):
                        attempts.append((op, [v for s, v in zip(schema, values) if not s.kwarg_only],
                                         {s.name: v for s, v in zip(schema, values) if s.kwarg_only and v is not None}))
        for fn, pos, kw in attempts:
            recorder = _Costs(weights)
            try:
                with recorder:
                    fn(*pos, **kw) if fn is not _mha else fn(pos)
            except Exception:
                continue
            return recorder.ops
    return None


def works_of(ops: list, name: str = "", backward: bool = False) -> list[model.Work]:
    """The replayed ops of a call as the model's ``Work``s: one per op. A pooling call is pooling, as
    archscan's node of a pooling module is, whatever op runs it (adaptive average pooling to 1×1 runs a mean).
    A backward call's ops are in their backward classes (``model.backward_class``)."""
    out = []
    for cost, dtype in ops:
        if cost.category == "view":
            out.append(model.Work("view", dtype, 0, 0, 0, 0, {"view": 1}))
            continue
        category = "pooling" if "pool" in name and cost.category == "reduction" else cost.category
        kclass = model.kernel_class(category, (cost.op,), cost.attrs)
        if backward:
            kclass = model.backward_class(kclass)
        executed = cost.attrs.get("executed_flops", cost.flops)
        eager = executed if cost.attrs.get("causal") else cost.flops
        launches = 1 if not cost.op.startswith(model._NO_KERNEL) else 0
        host = {model.host_class(kclass) if launches else "view": 1}
        out.append(model.Work(kclass, dtype, eager, executed, cost.mac_bytes, launches, host))
    return out


def load(names, backward: bool = False) -> dict[str, list[Call]]:
    """Each configuration's calls (with ``backward``: each training step's backward calls), replayed."""
    out = {}
    for name in names:
        calls = (read_backward if backward else read_trace)(TRUTH / name / "trace.json.gz")
        for c in calls:
            c.ops = replay(c)
            c.works = works_of(c.ops, c.name, backward=backward) if c.ops is not None else []
        out[name] = calls
    return out


# --- least squares -------------------------------------------------------------------------------------

def nnls(a: np.ndarray, b: np.ndarray, iterations: int = 200) -> np.ndarray:
    """min ||a x - b|| with x >= 0 (Lawson and Hanson's active set method)."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, bool)
    for _ in range(iterations):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-1) <= 1e-12:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x


# --- the fit -------------------------------------------------------------------------------------------

def fit(data: dict[str, list[Call]], configs: dict, gpu, backward: dict[str, list[Call]] | None = None) -> model.GpuTimeFit:
    """The model's constants from ``data`` (see the module docstring), and the backward classes' from the
    training steps' ``backward`` calls (step 5)."""
    calls = [c for name in data for c in data[name] if c.ops is not None]
    kernels = _kernels_per_op(calls)
    floor, compute, bandwidth, rate, priors = _kernel_fit(calls, kernels, gpu)
    host, speeds = _host_fit(data)
    print("host: speed of each run against their average: " + ", ".join(f"{n} {v:.2f}" for n, v in speeds.items()))
    scale, per_run = _host_scale(data, configs)
    print(f"host: profiled -> unprofiled factor {scale:.3f} (per run: "
          + ", ".join(f"{n} {f:.3f}" for n, f in per_run.items()) + ")")
    host_us = {k: _round(v * scale) for k, v in host.items()}
    for k in model.HOST_CLASSES:
        if k not in host_us:
            host_us[k] = model.PRIOR.host_us[k]
            priors.append(f"host_us.{k}")
    source = f"benchmarks/fit_gpu_time.py, tests/gpu_truth, {len(data)} runs, {DATE}"
    result = model.GpuTimeFit(floor_us=_round(floor), compute=compute, bandwidth=bandwidth, kernels=kernels,
                              host_us=dict(sorted(host_us.items())), source=source, priors=tuple(sorted(priors)),
                              rate_tbs=rate)
    if not backward:
        return result
    bc, bb, bk = _backward_fit([c for n in backward for c in backward[n] if c.ops is not None], result, gpu)
    return dataclasses.replace(
        result, compute=dict(sorted({**compute, **bc}.items())), bandwidth=dict(sorted({**bandwidth, **bb}.items())),
        kernels=dict(sorted({**kernels, **bk}.items())),
        priors=tuple(k for k in result.priors if k.split(".", 1)[1] not in (bc if k.startswith("compute.") else bb)),
        source=f"benchmarks/fit_gpu_time.py, tests/gpu_truth, {len(data)} runs and {len(backward)} training steps' "
               f"backward, {DATE}")


def _round(v: float, digits: int = 3) -> float:
    return float(f"{v:.{digits}g}")


def _classes(call: Call) -> set[str]:
    """The kernel classes a call launches kernels of."""
    return {w.kclass for w in call.works if w.kclass != "view" and w.launches}


def _kernels_per_op(calls: list[Call]) -> dict[str, float]:
    """GPU kernels per launching aten op, per kernel class: over the calls that run one class."""
    launched: dict[str, list[int]] = {}
    for c in calls:
        classes = _classes(c)
        if len(classes) != 1 or not c.kernels:
            continue
        n = sum(w.launches for w in c.works)
        if n:
            got = launched.setdefault(classes.pop(), [0, 0])
            got[0] += c.kernels
            got[1] += n
    return {k: _round(v[0] / v[1]) for k, v in sorted(launched.items())}


def _kernel_fit(calls: list[Call], kernels: dict, gpu) -> tuple[float, dict, dict, dict, list]:
    """floor µs, compute and bandwidth fractions per class, and the absolute TB/s of ``model.RATE_CLASSES``
    (their bandwidth fraction kept at its prior): the regime-iterated non-negative least squares."""
    rows = [c for c in calls if c.kernels and c.kernel_us > 0 and _classes(c)]
    compute_classes = sorted({w.kclass for c in rows for w in c.works if w.flops})
    memory_classes = sorted({w.kclass for c in rows for w in c.works if w.kclass != "view"})
    cols = ["floor"] + [f"c.{k}" for k in compute_classes] + [f"b.{k}" for k in memory_classes]
    index = {k: i for i, k in enumerate(cols)}
    x = np.ones(len(cols))
    x[0] = model.PRIOR.floor_us
    for k in compute_classes:
        x[index[f"c.{k}"]] = 1 / model.PRIOR.compute[k]
    for k in memory_classes:
        x[index[f"b.{k}"]] = 1 / model.PRIOR.bandwidth[k]
    bw = gpu.bandwidth_tbs * 1e12
    # a rate class's column is µs at 1 TB/s: its solution is 1 / the class's TB/s, whatever the GPU
    per_byte = {k: 1e12 if k in model.RATE_CLASSES else bw for k in memory_classes}
    for k in memory_classes:
        if k in model.RATE_CLASSES:
            x[index[f"b.{k}"]] /= gpu.bandwidth_tbs
    regimes = None
    for _ in range(50):
        a = np.zeros((len(rows), len(cols)))
        chosen = []
        for r, c in enumerate(rows):
            for w in c.works:
                if w.kclass == "view":
                    continue
                a[r, 0] += w.launches * kernels.get(w.kclass, 1.0)
                cu = w.flops / model.peak_macs(gpu, w.dtype, w.kclass) * 1e6 if w.flops else 0.0
                mu = w.bytes / per_byte[w.kclass] * 1e6
                if max(cu * x[index[f"c.{w.kclass}"]] if w.flops else 0.0, mu * x[index[f"b.{w.kclass}"]]) < _SMALL_US:
                    continue  # a tiny op: its floor, not its bytes, is what it takes; it says nothing of a rate
                use_compute = bool(w.flops) and cu * x[index[f"c.{w.kclass}"]] >= mu * x[index[f"b.{w.kclass}"]]
                chosen.append(use_compute)
                if use_compute:
                    a[r, index[f"c.{w.kclass}"]] += cu
                else:
                    a[r, index[f"b.{w.kclass}"]] += mu
        b = np.array([c.kernel_us for c in rows])
        weight = 1 / np.sqrt(b)
        used = a.any(axis=0)
        solved = nnls(a[:, used] * weight[:, None], b * weight)
        x_new = x.copy()
        x_new[used] = np.where(solved > 0, solved, x[used])
        x = x_new
        if chosen == regimes:
            break
        regimes = chosen
    priors = [f"compute.{k}" for k in compute_classes if not used[index[f"c.{k}"]]]
    priors += [f"bandwidth.{k}" for k in memory_classes if not used[index[f"b.{k}"]]]
    compute = {k: _round(min(1 / x[index[f"c.{k}"]], 1.0)) for k in compute_classes if used[index[f"c.{k}"]]}
    bandwidth = {k: _round(min(1 / x[index[f"b.{k}"]], 1.0)) for k in memory_classes
                 if used[index[f"b.{k}"]] and k not in model.RATE_CLASSES}
    rate = {k: _round(1 / x[index[f"b.{k}"]]) for k in memory_classes if used[index[f"b.{k}"]] and k in model.RATE_CLASSES}
    for k, v in model.PRIOR.compute.items():
        if k not in compute:
            compute[k] = v
            priors.append(f"compute.{k}")
    for k, v in model.PRIOR.bandwidth.items():
        if k not in bandwidth:
            bandwidth[k] = v
            priors.append(f"bandwidth.{k}")
    return float(x[0]), dict(sorted(compute.items())), dict(sorted(bandwidth.items())), rate, sorted(set(priors))


def _backward_fit(calls: list[Call], base: model.GpuTimeFit, gpu) -> tuple[dict, dict, dict]:
    """Compute and bandwidth fractions and kernels per op of the backward classes, from the training steps'
    backward calls: the floor and the forward classes' fractions held at ``base`` (the forward fit), the
    same regime-iterated non-negative least squares as the forward's on what the backward classes take."""
    backward = set(model.BACKWARD_CLASSES.values())
    kernels = {k: v for k, v in _kernels_per_op(calls).items() if k in backward}
    rows = [c for c in calls if c.kernels and c.kernel_us > 0 and _classes(c) & backward]
    compute_classes = sorted({w.kclass for c in rows for w in c.works if w.flops and w.kclass in backward})
    memory_classes = sorted({w.kclass for c in rows for w in c.works if w.kclass in backward})
    cols = [f"c.{k}" for k in compute_classes] + [f"b.{k}" for k in memory_classes]
    index = {k: i for i, k in enumerate(cols)}
    def prior(table: dict, k: str) -> float:
        return table.get(k, table[k.removesuffix("_backward")])

    x = np.array([1 / prior(model.PRIOR.compute, k[2:]) if k.startswith("c.") else 1 / prior(model.PRIOR.bandwidth, k[2:])
                  for k in cols])
    bw = gpu.bandwidth_tbs * 1e12
    known = np.zeros(len(rows))
    for r, c in enumerate(rows):
        for w in c.works:
            if w.kclass == "view":
                continue
            known[r] += w.launches * kernels.get(w.kclass, base.kernels.get(w.kclass, 1.0)) * base.floor_us
            if w.kclass not in backward:
                known[r] += model.kernel_us(dataclasses.replace(w, launches=0), gpu, base)[0]
    b = np.maximum(np.array([c.kernel_us for c in rows]) - known, 0.0)
    weight = 1 / np.sqrt(np.array([c.kernel_us for c in rows]))
    regimes, used = None, np.zeros(len(cols), bool)
    for _ in range(50):
        a = np.zeros((len(rows), len(cols)))
        chosen = []
        for r, c in enumerate(rows):
            for w in c.works:
                if w.kclass not in backward:
                    continue
                cu = w.flops / model.peak_macs(gpu, w.dtype, w.kclass) * 1e6 if w.flops else 0.0
                mu = w.bytes / bw * 1e6
                ct = cu * x[index[f"c.{w.kclass}"]] if w.flops else 0.0
                if max(ct, mu * x[index[f"b.{w.kclass}"]]) < _SMALL_US:
                    continue
                use_compute = bool(w.flops) and ct >= mu * x[index[f"b.{w.kclass}"]]
                chosen.append(use_compute)
                a[r, index[f"c.{w.kclass}" if use_compute else f"b.{w.kclass}"]] += cu if use_compute else mu
        used = a.any(axis=0)
        solved = nnls(a[:, used] * weight[:, None], b * weight)
        x[used] = np.where(solved > 0, solved, x[used])
        if chosen == regimes:
            break
        regimes = chosen
    compute = {k: _round(min(1 / x[index[f"c.{k}"]], 1.0)) for k in compute_classes if used[index[f"c.{k}"]]}
    bandwidth = {k: _round(min(1 / x[index[f"b.{k}"]], 1.0)) for k in memory_classes if used[index[f"b.{k}"]]}
    return compute, bandwidth, kernels


def _host_fit(data: dict[str, list[Call]]) -> tuple[dict[str, float], dict[str, float]]:
    """Host µs per aten op of each host class as profiled, at the fit runs' average host speed; and each
    run's speed against it. The recorded host's speed changed from run to run by up to 1.8× (the two
    decode steps run the same op stream: 2.7 and 4.1 µs per ``aten::slice``), so each run r has its own
    factor v_r: host µs of a call = v_r × (Σ ops × µs per op of their class + its layer call's µs). The
    factors are read from the plain calls every run makes (one element-wise op or views: the same work
    in every model), as the median of measured over modelled; the µs per class by non-negative least
    squares of every call divided by its run's factor; the two alternate until they settle, and are
    normalised to the runs' average speed (their geometric mean). The first call of a run (the
    profiler's start) and calls over 5 ms are left out."""
    runs = {n: [c for c in calls[1:] if c.works and c.host_us < 5000] for n, calls in data.items()}
    keys = sorted({k for calls in runs.values() for c in calls for w in c.works for k in w.host_ops}) + ["module"]

    def features(c: Call) -> list[int]:
        return [sum(w.host_ops.get(k, 0) for w in c.works) for k in keys[:-1]] + [int(c.name in _MODULE_CALLS)]

    def plain(c: Call) -> bool:
        ops = [k for w in c.works for k, n in w.host_ops.items() for _ in range(n) if k != "view"]
        return ops in ([], ["op"])

    speed = {n: 1.0 for n in runs}
    for _ in range(50):
        a = np.array([features(c) for n in runs for c in runs[n]], float)
        b = np.array([c.host_us / speed[n] for n in runs for c in runs[n]])
        h = nnls(a, b)
        new = {}
        for n, calls in runs.items():
            probe = [c for c in calls if plain(c)] or calls
            new[n] = float(np.median([c.host_us / max(float(np.array(features(c), float) @ h), 1e-9) for c in probe]))
        done = max(abs(new[n] / speed[n] - 1) for n in runs) < 1e-6
        speed = new
        if done:
            break
    mean = math.exp(sum(math.log(v) for v in speed.values()) / len(speed))
    return ({k: float(v) * mean for k, v in zip(keys, h) if v > 0}, {n: v / mean for n, v in speed.items()})


def _simulate_calls(calls: list[Call], scale: float) -> float:
    """Eager ms of a recorded run from its own calls: each call's host time as profiled × ``scale``,
    its kernels as measured, the two timelines as ``archscan.measure.gpu.simulate`` runs them."""
    t_host = t_gpu = 0.0
    for i, c in enumerate(calls):
        if c.name in _SYNCS:  # the profiled time of a read-back is the wait: the host waits for the GPU
            t_host = max(t_host, t_gpu)
        elif i:
            t_host += c.host_us * scale
        if c.kernel_us:
            t_gpu = max(t_host, t_gpu) + c.kernel_us
    return max(t_host, t_gpu) / 1e3


def _host_scale(data: dict, configs: dict) -> tuple[float, dict]:
    """The factor from profiled to unprofiled host time (the profiler's own cost taken out), and each
    run's: per run, the factor that makes its own calls (host as profiled, kernels as measured)
    simulate to its unprofiled ``eager_ms``; combined (geometric mean) over the runs whose eager time
    the host decides (a run the GPU bounds says nothing of its host: left out). Each run's own host
    times are used, so a run whose host was slower or faster than usual does not move the factor."""
    factors = {}
    for name, calls in data.items():
        eager = configs[name]["eager_ms"]
        lo, hi = 0.05, 2.0
        if _simulate_calls(calls, hi) < eager:
            continue
        for _ in range(60):  # bisection: the simulation grows with the factor
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _simulate_calls(calls, mid) < eager else (lo, mid)
        factor = (lo + hi) / 2
        # host-decided: a tenth less host time would have made the run at least 5% faster
        if _simulate_calls(calls, factor * 0.9) < 0.95 * eager:
            factors[name] = factor
    return math.exp(sum(map(math.log, factors.values())) / len(factors)), factors


# --- predictions of the recorded runs ------------------------------------------------------------------------

def predict_calls(calls: list[Call], fit_: model.GpuTimeFit, gpu) -> tuple[float, float]:
    """(eager ms, served ms) the model predicts for a recorded run from its replayed calls."""
    def kernel_us(c: Call) -> float:
        return sum(model.kernel_us(w, gpu, fit_)[0] for w in c.works)

    host = dict(fit_.host_us)
    t_host = t_gpu = served = 0.0
    for c in calls:
        if c.ops is None:
            if c.name in _SYNCS:
                t_host = max(t_host, t_gpu)
            continue
        k = kernel_us(c)
        t_host += sum(model.host_us(w, fit_) for w in c.works) + (fit_.host_us["module"] if c.name in _MODULE_CALLS else 0)
        if k:
            t_gpu = max(t_host, t_gpu) + k
        served += sum(model.kernel_us(w, gpu, fit_, served=True)[0] for w in c.works)
    del host
    return max(t_host, t_gpu) / 1e3, served / 1e3


def table(data: dict, configs: dict, fit_: model.GpuTimeFit, gpu, fitted: set) -> list[dict]:
    rows = []
    for name, calls in data.items():
        eager, served = predict_calls(calls, fit_, gpu)
        rec = configs[name]
        rows.append({"config": name, "set": "fit" if name in fitted else "held out", "eager_pred": eager,
                     "eager_ms": rec["eager_ms"], "served_pred": served, "graph_ms": rec.get("graph_ms"),
                     "kernels_ms": sum(c.kernel_us for c in calls) / 1e3})
    return rows


def print_table(rows: list[dict], title: str) -> None:
    print(f"\n{title}")
    print(f"{'configuration':<47} {'set':<9} {'eager pred':>10} {'eager_ms':>9} {'ratio':>6}   {'served':>8} "
          f"{'graph_ms':>8} {'ratio':>6} {'kernels':>8}")
    for r in rows:
        g = r["graph_ms"]
        print(f"{r['config']:<47} {r['set']:<9} {r['eager_pred']:>10.3f} {r['eager_ms']:>9.3f} "
              f"{r['eager_pred'] / r['eager_ms']:>6.2f}   {r['served_pred']:>8.3f} "
              + (f"{g:>8.3f} {r['served_pred'] / g:>6.2f}" if g else f"{'-':>8} {'-':>6}") + f" {r['kernels_ms']:>8.3f}")


def fit_text(f: model.GpuTimeFit) -> str:
    """The ``FIT = GpuTimeFit(...)`` source the module holds."""
    def d(values: dict) -> str:
        return "{" + ", ".join(f'"{k}": {v!r}' for k, v in values.items()) + "}"
    return (f"FIT = GpuTimeFit(\n    floor_us={f.floor_us!r},\n    compute={d(f.compute)},\n"
            f"    bandwidth={d(f.bandwidth)},\n    kernels={d(f.kernels)},\n    host_us={d(f.host_us)},\n"
            f"    source={f.source!r},\n    priors={f.priors!r},\n    rate_tbs={d(f.rate_tbs)})\n")


_FIT_BLOCK = re.compile(r"^FIT = .*?\n(?=\n)", re.S | re.M)


def write(f: model.GpuTimeFit) -> None:
    path = ROOT / "archscan" / "measure" / "gpu.py"
    text = path.read_text(encoding="utf-8")
    new, n = _FIT_BLOCK.subn(lambda _: _wrap(fit_text(f)), text, count=1)
    if n != 1:
        raise SystemExit("no FIT block in gpu.py")
    path.write_text(new, encoding="utf-8")


def _wrap(text: str, width: int = 120) -> str:
    """Long dict lines broken after a comma, the continuation indented."""
    out = []
    for line in text.splitlines():
        while len(line) > width:
            cut = line.rfind(", ", 0, width - 1) + 1
            out.append(line[:cut])
            line = "        " + line[cut:].lstrip()
        out.append(line)
    return "\n".join(out) + "\n"


def same(a: model.GpuTimeFit, b: model.GpuTimeFit) -> bool:
    return (a.floor_us, a.compute, a.bandwidth, a.kernels, a.host_us, a.priors, a.rate_tbs) == \
           (b.floor_us, b.compute, b.bandwidth, b.kernels, b.host_us, b.priors, b.rate_tbs)


def scan_predictions(fitted: set) -> list[dict]:
    """Every configuration tests/test_gpu_time.py predicts, the way a user gets it (archscan.scan with
    the GPU's datasheet profile; a decode step as --decode runs it), with the old datasheet roofline's."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_gpu_time import FIT, FIT_TRAIN, HELD_OUT, HELD_OUT_H100, predict_config, truth  # noqa: E402

    rows = []
    for name in FIT + tuple(n for n in FIT_TRAIN if n.startswith("lat_")) + HELD_OUT + HELD_OUT_H100:
        got, rec = predict_config(name), truth()[name]
        rows.append({"config": f"{name} ({rec['gpu']})", "set": "fit" if name in fitted or name in FIT_TRAIN else "held out",
                     "eager_pred": got["eager_ms"], "eager_ms": rec["eager_ms"], "served_pred": got["served_ms"],
                     "graph_ms": rec.get("graph_ms"), "kernels_ms": float("nan"), "roofline": got["roofline_ms"]})
    return rows


def by_class(data: dict, fit_: model.GpuTimeFit, gpu) -> None:
    """Per configuration and kernel class: measured and predicted kernel ms of the calls that run one class."""
    print("\nkernel ms by class (calls of one class), measured / predicted:")
    for name, calls in data.items():
        got: dict[str, list[float]] = {}
        for c in calls:
            classes = _classes(c)
            key = classes.pop() if len(classes) == 1 else "mixed" if classes else "none"
            g = got.setdefault(key, [0.0, 0.0])
            g[0] += c.kernel_us / 1e3
            g[1] += sum(model.kernel_us(w, gpu, fit_)[0] for w in c.works) / 1e3
        print(f"  {name}: " + ", ".join(f"{k} {m:.2f}/{p:.2f}" for k, (m, p) in sorted(got.items(), key=lambda kv: -kv[1][0])))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail unless archscan.measure.gpu.FIT is what the fit computes")
    p.add_argument("--write", action="store_true", help="write the constants into archscan/measure/gpu.py")
    p.add_argument("--loo", action="store_true", help="also predict each configuration from a fit on all the others")
    p.add_argument("--scan", action="store_true", help="also predict every configuration through archscan.scan")
    args = p.parse_args()
    env, configs = read_summary()
    latency = {k: v for k, v in configs.items() if k.startswith("lat_") and v.get("ok") and v["kind"] != "latency_train"}
    gpu = named_gpu("h200")
    print(f"truth: {env.get('device')}, torch {env.get('torch')}, recorded {env.get('date', '')[:10]}; "
          f"datasheet {gpu.name}: {gpu.bf16_tflops} bf16 / {gpu.fp32_tflops} fp32 TFLOPS, {gpu.bandwidth_tbs} TB/s")
    data = load(latency)
    for name, calls in data.items():
        missed = [c.name for c in calls if c.ops is None]
        print(f"  {name}: {len(calls)} calls, {len(calls) - len(missed)} replayed"
              + (f" (not: {', '.join(sorted(set(missed)))})" if missed else ""))
    fitted = set(FIT_CONFIGS)
    backward = load(BACKWARD_CONFIGS, backward=True)
    result = fit({n: data[n] for n in FIT_CONFIGS}, latency, gpu, backward)
    print("\n" + fit_text(result))
    print_table(table(data, latency, result, gpu, fitted), "replayed calls, predicted with the fit (ms):")
    by_class(data, result, gpu)
    if args.loo:
        rows = []
        for name in data:
            others = {n: data[n] for n in data if n != name}
            rows += [r for r in table(data, latency, fit(others, latency, gpu), gpu, set(others))
                     if r["config"] == name]
        print_table(rows, "leave one out: each configuration predicted by a fit on all the others (ms):")
    if args.scan:
        rows = scan_predictions(fitted)
        print_table(rows, "archscan.scan with the GPU's datasheet profile (ms; the H100 set is held out too):")
        print("the datasheet roofline before this model, predicted / eager_ms: " + ", ".join(
            f"{r['config'].split(' ')[0]} {r['roofline'] / r['eager_ms']:.2f}" for r in rows if r["roofline"]))
    if args.write:
        write(result)
        print("wrote archscan/measure/gpu.py")
    elif args.check and not same(result, model.FIT):
        print("archscan.measure.gpu.FIT differs from this fit: run with --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

