"""Time on a named GPU without the GPU: the GPU execution model's time side.

A datasheet's peaks say what a GPU could do; eager PyTorch gets a fraction of them, and between
its kernels the host runs Python, the dispatcher and a launch for every op. This model prices
both sides and simulates them, so that one op stream gives two labelled predictions:

- **as written** (eager PyTorch, ``latency.predicted_ms``): each op's host time (Python,
  dispatcher, launch: ``FIT.host_us`` by host class, and each call of a torch.nn layer its
  ``Module.__call__``) runs on the host's timeline; its kernels
  start on the GPU's timeline at ``max(their launch, the previous kernel's end)``. A run whose
  host is the slower side is host-bound, and the GPU waits. An op that reads a value back
  (``host_sync``) makes the host wait for the GPU.
- **as served** (a CUDA graph or a compiled model, ``latency.served_ms``): the kernels alone,
  back to back.

A kernel takes ``kernels × FIT.floor_us + max(flops / (compute × peak), bytes / (bandwidth ×
datasheet bandwidth))`` (for a class in ``RATE_CLASSES``, bytes over the lesser of that and an absolute
rate, ``FIT.rate_tbs``: a concatenation's kernel is bound by itself, not by HBM): ``compute`` and ``bandwidth`` are the fraction of the datasheet figure
each kernel class reaches (``kernel_class``), ``kernels`` how many kernels an aten op of the
class launches on the GPU (cuDNN's layout transposes, batch norm's three kernels). The peak is
the dtype's: bf16/fp16 tensor cores; fp32 matmuls on CUDA cores (torch's default
``allow_tf32=False``); fp32 convolutions on TF32 tensor cores (cuDNN's default ``allow_tf32=True``),
at half the bf16 figure as NVIDIA's datasheets give it. Attention with ``is_causal`` runs on a
fused kernel that skips the masked blocks: its time is that of the executed pairs
(``executed_flops``); an explicit mask (a sliding window, a chunk's) is computed whole by eager
PyTorch's kernel and priced dense as written, and as executed as served (a serving engine's
FlashAttention skips the blocks a window or a chunk leaves out).

A decode step that appends to its KV cache by rewriting it whole (``torch.cat``, as Hugging Face's
``DynamicCache`` and many hand-written caches do) is priced so as written; as served, the append
writes the new tokens in place (``served_bytes``): a serving engine's paged cache, or the static
cache a CUDA graph or ``torch.compile`` needs.

The constants (``FIT``) are fit on the recorded H200 traces in ``tests/gpu_truth`` by
``benchmarks/fit_gpu_time.py``; ``docs/gpu-time.md`` has the fit, its data and its error. FLOPs
are multiply-adds throughout (archscan's convention).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from ..devices.gpus import GPU, gpu as _gpu_named, gpu_named_like
from ..results import NodeReport


@dataclass(frozen=True)
class GpuTimeFit:
    """The constants of the GPU time model (see the module docstring)."""

    floor_us: float                     # GPU time of every kernel beyond its roofline (launch latency, ramp, tail)
    compute: dict[str, float]           # kernel class -> fraction of the dtype's dense datasheet peak
    bandwidth: dict[str, float]         # kernel class -> fraction of the datasheet memory bandwidth
    kernels: dict[str, float]           # kernel class -> GPU kernels per aten op
    host_us: dict[str, float]           # host class -> host µs per aten op in eager PyTorch (unprofiled)
    source: str = ""
    priors: tuple[str, ...] = field(default=())  # the entries the fit had no data for (kept at their prior)
    # kernel class -> TB/s its kernels reach at most on any GPU (``RATE_CLASSES``: kernel-bound, not HBM-bound)
    rate_tbs: dict[str, float] = field(default_factory=dict)


# Where the fit has no data for a class, these stand (``benchmarks/fit_gpu_time.py`` starts from them
# and keeps them for classes its data do not reach): large cuBLAS GEMMs reach 70-80% of the dense
# tensor-core peak, FlashAttention-2 50-73% (Dao, 2023), STREAM-like copies 80-90% of HBM bandwidth.
PRIOR = GpuTimeFit(
    floor_us=2.0,
    compute={"gemm": 0.70, "attention": 0.50, "conv": 0.55, "patch_conv": 0.50, "grouped_conv": 0.30,
             "depthwise_conv": 0.10, "depthwise_conv_backward": 0.02},
    bandwidth={"gemm": 0.80, "attention": 0.80, "conv": 0.80, "patch_conv": 0.50, "grouped_conv": 0.50, "depthwise_conv": 0.30,
               "elementwise": 0.80, "activation": 0.80, "norm": 0.80, "batch_norm": 0.50, "reduction": 0.60,
               "pooling": 0.50, "copy": 0.80, "cat": 0.50, "embedding": 0.60, "factory": 0.80, "other": 0.50,
               "host_sync": 0.50, "rnn": 0.30},
    kernels={},
    host_us={"view": 3.0, "op": 10.0, "gemm": 25.0, "conv": 40.0, "attention": 60.0, "batch_norm": 40.0,
             "module": 5.0},
    source="prior")

# FIT: benchmarks/fit_gpu_time.py on tests/gpu_truth (NVIDIA H200, torch 2.11.0+cu130, recorded
# 2026-11-26); fit on lat_resnet50_fwd_b64_bf16, lat_mobilenet_v2_fwd_b128_bf16,
# lat_vit_b_16_fwd_b64_bf16, lat_llama_1b_decode_b1_l2048_bf16, lat_llama_1b_decode_b16_l2048_bf16.
# Written by the script (`python benchmarks/fit_gpu_time.py --write`); `--check` fails when they differ.
FIT = GpuTimeFit(
    floor_us=1.61,
    compute={"attention": 0.5, "attention_backward": 0.591, "conv": 0.247, "conv_backward": 0.217,
        "depthwise_conv": 0.1, "depthwise_conv_backward": 0.0135, "gemm": 0.663, "gemm_backward": 0.717,
        "grouped_conv": 0.3, "patch_conv": 0.411},
    bandwidth={"activation": 0.907, "attention": 0.519, "batch_norm": 0.324, "batch_norm_backward": 0.273, "cat": 0.5,
        "conv": 0.689, "conv_backward": 0.427, "copy": 0.8, "depthwise_conv": 0.131, "elementwise": 0.989,
        "elementwise_backward": 0.921, "embedding": 0.6, "factory": 0.8, "gemm": 0.7, "grouped_conv": 0.5,
        "host_sync": 0.5, "norm": 0.286, "norm_backward": 0.321, "other": 0.5, "patch_conv": 0.5, "pooling": 0.216,
        "reduction": 0.6, "rnn": 0.3},
    kernels={"activation": 1.0, "attention": 1.5, "attention_backward": 5.25, "batch_norm": 3.0,
        "batch_norm_backward": 1.0, "cat": 1.0, "conv": 2.45, "conv_backward": 5.19, "copy": 1.0,
        "depthwise_conv": 1.0, "depthwise_conv_backward": 2.0, "elementwise": 1.0, "elementwise_backward": 1.0,
        "embedding": 1.0, "gemm": 1.17, "gemm_backward": 1.44, "norm": 1.0, "norm_backward": 2.35, "patch_conv": 3.0,
        "pooling": 1.0, "reduction": 1.0},
    host_us={"attention": 78.8, "batch_norm": 71.5, "conv": 60.6, "gemm": 20.7, "module": 7.1, "op": 15.6,
        "view": 3.49},
    source="benchmarks/fit_gpu_time.py, tests/gpu_truth, 5 runs and 8 training steps' backward, 2026-11-26",
    priors=('bandwidth.cat', 'bandwidth.copy', 'bandwidth.embedding', 'bandwidth.factory', 'bandwidth.grouped_conv',
        'bandwidth.host_sync', 'bandwidth.other', 'bandwidth.patch_conv', 'bandwidth.reduction', 'bandwidth.rnn',
        'compute.attention', 'compute.depthwise_conv', 'compute.grouped_conv'),
    rate_tbs={"cat": 0.645})

MEMORY_CLASSES = ("elementwise", "activation", "norm", "batch_norm", "reduction", "pooling", "copy", "cat",
                  "embedding", "factory", "other", "host_sync", "rnn")
# Classes whose kernels run at a rate of their own below a fast GPU's bandwidth: a memory time of bytes over
# the lesser of a fraction of the datasheet bandwidth and an absolute rate (``GpuTimeFit.rate_tbs``). The
# KV cache's ``torch.cat`` (a concatenation along the sequence dimension) ran at 0.64 TB/s on the H200 and
# 0.67 TB/s on the H100, whose HBM differs 1.43x.
RATE_CLASSES = ("cat",)
COMPUTE_CLASSES = ("gemm", "attention", "conv", "patch_conv", "grouped_conv", "depthwise_conv")
HOST_CLASSES = ("view", "op", "gemm", "conv", "attention", "batch_norm", "module")
# A training step's backward kernels by the forward class of their op: cuDNN's input- and weight-gradient
# convolutions, its depthwise backward (far slower than its forward in float32), the GEMMs of a linear's
# gradients, the norms' and element-wise ops' backward kernels. Fit on the recorded training steps'
# backward kernels (``benchmarks/fit_gpu_time.py``); a class without its own entry uses its forward's.
BACKWARD_CLASSES = {"conv": "conv_backward", "patch_conv": "conv_backward", "grouped_conv": "grouped_conv_backward",
                    "depthwise_conv": "depthwise_conv_backward", "gemm": "gemm_backward",
                    "attention": "attention_backward", "norm": "norm_backward", "batch_norm": "batch_norm_backward",
                    "elementwise": "elementwise_backward", "activation": "elementwise_backward"}
_CONVS = ("conv", "patch_conv", "grouped_conv", "depthwise_conv")
_HALF = ("bfloat16", "float16")
# Ops that allocate or alias without launching a kernel (``predict.kernels``'s list, and aliases).
_NO_KERNEL = ("aten.empty", "aten.new_empty", "aten.lift_fresh", "aten.alias", "aten.detach", "aten._unsafe_view")


# --- which GPU ---------------------------------------------------------------------------------------

def gpu_of(profile) -> GPU | None:
    """The named GPU a device profile stands for, with datasheet compute figures: a datasheet profile
    (``--device-profile h200``: ``'h200 (datasheet)'``) or a calibrated CUDA profile whose device name
    names one (``'NVIDIA H100 80GB HBM3'``: ``devices.gpus.gpu_named_like``); None for a CPU or an
    unknown GPU."""
    if profile is None or not str(profile.device).startswith("cuda"):
        return None
    found = _gpu_named(profile.name.split(" (")[0]) or gpu_named_like(profile.name)
    return found if found is not None and found.bf16_tflops is not None else None


def execution_model(profile) -> str:
    """What predicted a report's times: the GPU's name (this module) or ``'cpu'`` (the roofline of a
    calibrated CPU profile); ``'roofline'`` for a GPU profile this model has no datasheet for."""
    if profile is None:
        return "none"
    found = gpu_of(profile)
    if found is not None:
        return found.name
    return "cpu" if str(profile.device).startswith("cpu") else "roofline"


def peak_macs(gpu: GPU, dtype: str | None, kclass: str) -> float:
    """Dense multiply-adds per second of ``kclass`` in ``dtype`` (see the module docstring): bf16/fp16
    on tensor cores, int8 (a w8a8 quantized GEMM, ``archscan.quant``) on int8 tensor cores at twice
    that, fp32 convolutions on TF32 tensor cores (half the bf16 figure), other fp32 work on CUDA cores."""
    half = gpu.bf16_tflops * 1e12 / 2
    if kclass == "depthwise_conv_backward":  # cuDNN's depthwise gradients: per-channel kernels on CUDA cores
        return gpu.fp32_tflops * 1e12 / 2
    kclass = kclass.removesuffix("_backward")
    if kclass == "patch_conv":  # cuDNN's precomputed-index SGEMM, on CUDA cores whatever the dtype
        return gpu.fp32_tflops * 1e12 / 2
    if dtype in _HALF:
        return half
    if dtype == "int8":  # int8 tensor cores: twice the bf16 rate on every datasheet of the table
        return 2 * half
    if kclass in _CONVS:
        return half / 2
    return gpu.fp32_tflops * 1e12 / 2


# --- classes -----------------------------------------------------------------------------------------

def kernel_class(category: str, ops: Sequence[str] = (), attrs: dict | None = None) -> str:
    """The kernel class of work of ``category`` done by aten ``ops`` (their names, 'aten.cat.default'),
    with the op's ``attrs`` (a convolution's kernel and stride): the efficiency table's key. Batch norm
    and concatenation run kernels of their own (NCHW batch norm below the bandwidth of other norms; a
    concatenation along an inner dimension far below a copy), and so does a convolution whose kernel
    tiles its input without overlap (a patch embedding, kernel = stride: cuDNN runs it on CUDA cores)."""
    if category in ("linear", "matmul"):
        return "gemm"
    if category == "conv" and attrs and _patches(attrs):
        return "patch_conv"
    if category in COMPUTE_CLASSES:
        return category
    if category == "norm":
        return "batch_norm" if any("batch_norm" in op for op in ops) else "norm"
    if category == "data_movement":
        return "cat" if any(op.startswith(("aten.cat", "aten.concat", "aten.stack")) for op in ops) else "copy"
    for prefix, kclass in _BY_OP:
        if any(op.startswith(prefix) for op in ops):
            return kclass
    return category if category in MEMORY_CLASSES else "other"


# Ops the cost registry files under "other" (backward kernels, the optimizers' foreach kernels) and the
# kernel class that runs them: a convolution's backward is two convolutions (its input's and its
# weight's gradient), a norm's backward a norm kernel, a fused attention's backward attention.
_BY_OP = (("aten.convolution_backward", "conv"), ("aten.cudnn_convolution", "conv"),
          ("aten.native_batch_norm_backward", "batch_norm"), ("aten.cudnn_batch_norm", "batch_norm"),
          ("aten.native_layer_norm_backward", "norm"), ("aten.native_group_norm_backward", "norm"),
          ("aten._scaled_dot_product", "attention"), ("aten._flash_attention", "attention"),
          ("aten._efficient_attention", "attention"), ("aten._cudnn_attention", "attention"),
          ("aten.max_pool2d_with_indices_backward", "pooling"), ("aten.avg_pool2d_backward", "pooling"),
          ("aten.adaptive_avg_pool2d_backward", "pooling"), ("aten.embedding_dense_backward", "embedding"),
          ("aten._foreach", "elementwise"), ("aten._fused_adam", "elementwise"), ("aten._fused_sgd", "elementwise"))


def backward_class(kclass: str) -> str:
    """The kernel class of a training step's backward op whose forward class is ``kclass``
    (``BACKWARD_CLASSES``; the forward class where it has none: pooling, embedding, copies)."""
    return BACKWARD_CLASSES.get(kclass, kclass)


def _efficiency(table: dict, prior: dict, kclass: str) -> float:
    """``kclass``'s fraction in ``table``; a backward class without one takes its forward class's."""
    forward = kclass.removesuffix("_backward")
    return table.get(kclass, table.get(forward, prior.get(kclass, prior.get(forward, 0.5))))


def host_class(kclass: str) -> str:
    """The host-cost class of an aten op of kernel class ``kclass`` (``'view'`` for no kernel)."""
    kclass = kclass.removesuffix("_backward")
    if kclass in ("gemm", "attention", "batch_norm"):
        return kclass
    if kclass in _CONVS:
        return "conv"
    return "view" if kclass == "view" else "op"


def _patches(attrs: dict) -> bool:
    """Does a convolution cut its input into patches (kernel = stride, each above 1: ViT's 16×16/16)?"""
    kernel, stride = tuple(attrs.get("kernel", ())), tuple(attrs.get("stride", ()))
    return bool(kernel) and kernel == stride and all(k > 1 for k in kernel) and not attrs.get("transposed")


@functools.lru_cache(maxsize=None)
def _builtin(module_type: str) -> bool:
    """Is ``module_type`` one of torch.nn's own layers (``Linear``, ``Conv2d``, ``ReLU``, ``Dropout``...)?"""
    cls = getattr(torch.nn, module_type, None) if module_type else None
    return isinstance(cls, type) and issubclass(cls, torch.nn.Module) and cls.__module__.startswith("torch.nn.modules")


def module_call(node: NodeReport, previous: NodeReport | None) -> str | None:
    """The host class of the torch.nn layer call ``node`` starts (its ``Module.__call__``: ``'module'``),
    or None. A layer call is an fx node that calls a module (its op is the module's type), or the first
    op an op-by-op capture records inside such a layer."""
    if not _builtin(node.module_type):
        return None
    starts = node.op == node.module_type or (
        node.op.startswith("aten.") and (previous is None or previous.module != node.module))
    return "module" if starts else None


def _call_us(node: NodeReport, previous: NodeReport | None, fit: "GpuTimeFit") -> float:
    """Host µs of the layer call ``node`` starts (``module_call``), else 0."""
    key = module_call(node, previous)
    return fit.host_us.get(key, 0.0) if key else 0.0


@functools.lru_cache(maxsize=None)
def _op_category(name: str) -> str:
    """The cost category of an aten op by name ('aten.mm.default' -> 'matmul'); 'other' when unknown."""
    from ..costs import category_of

    parts = name.split(".")
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        return category_of(getattr(packet, parts[2] if len(parts) > 2 else "default"))
    except (AttributeError, IndexError, RuntimeError):
        return "other"


def _launches(op: str) -> bool:
    return not op.startswith(_NO_KERNEL)


@dataclass(frozen=True)
class Work:
    """One kernel class's share of a node: what the model prices."""

    kclass: str
    dtype: str | None
    flops: int             # multiply-adds as eager PyTorch's kernel computes them
    served_flops: int      # as a serving engine's kernel computes them (masked blocks skipped)
    bytes: int
    launches: int          # aten ops that launch kernels
    host_ops: dict         # host class -> aten ops
    served_bytes: int | None = None  # bytes as served, where they differ (a KV cache appended in place)


def node_work(node: NodeReport) -> list[Work]:
    """A node as the kernel classes it runs: a node of one category is one ``Work``; a node that holds
    several kinds of op (an ``nn.MultiheadAttention`` kept whole: projections, attention, copies) is
    split by its ``mac_by_category`` and ``flops_by_category``."""
    ops = tuple(node.aten_ops)
    if node.category == "view" or not ops:
        return [Work("view", node.dtype, 0, 0, 0, 0, {"view": 1})]
    dense = node.flops
    attrs = node.attrs
    executed = attrs.get("executed_flops", dense)
    causal = bool(attrs.get("causal"))
    eager = executed if causal else dense
    by_mac = attrs.get("mac_by_category")
    if not by_mac:
        kclass = kernel_class(node.category, ops, attrs)
        work = _work(kclass, node.dtype, eager, executed, node.mac_bytes, ops)
        return [dataclasses.replace(work, served_bytes=attrs["served_bytes"]) if "served_bytes" in attrs else work]
    by_flops = attrs.get("flops_by_category") or {node.category: dense}
    groups: dict[str, list[str]] = {}
    for op in ops:
        groups.setdefault(_op_category(op), []).append(op)
    out = []
    for category in sorted(set(by_mac) | set(by_flops) | set(groups)):
        flops = by_flops.get(category, 0)
        if category == "attention" and dense:
            share_e, share_s = (eager / dense, executed / dense)
        else:
            share_e = share_s = 1.0
        kclass = kernel_class(category, groups.get(category, ()), attrs if category == node.category else None)
        out.append(_work(kclass, node.dtype, round(flops * share_e), round(flops * share_s), by_mac.get(category, 0),
                         tuple(groups.get(category, ()))))
    return out


def _work(kclass: str, dtype: str | None, flops: int, served_flops: int, nbytes: int, ops: Sequence[str]) -> Work:
    launching = [op for op in ops if _launches(op)]
    host: dict[str, int] = {}
    for op in ops:
        key = host_class(kclass) if _launches(op) else "view"
        host[key] = host.get(key, 0) + 1
    return Work(kclass, dtype, flops, served_flops, nbytes, len(launching), host)


# --- time --------------------------------------------------------------------------------------------

def kernel_us(work: Work, gpu: GPU, fit: GpuTimeFit = FIT, served: bool = False) -> tuple[float, str]:
    """(GPU µs, bound) of one ``Work``: its kernels' floors plus the slower of compute and memory."""
    if work.kclass == "view" or (not work.launches and not work.bytes and not work.flops):
        return 0.0, "none"
    flops = work.served_flops if served else work.flops
    compute_us = 0.0
    if flops:
        eff = _efficiency(fit.compute, PRIOR.compute, work.kclass)
        compute_us = flops / (eff * peak_macs(gpu, work.dtype, work.kclass)) * 1e6
    bw = _efficiency(fit.bandwidth, PRIOR.bandwidth, work.kclass)
    nbytes = work.served_bytes if served and work.served_bytes is not None else work.bytes
    rate = fit.rate_tbs.get(work.kclass)
    memory_us = nbytes / (min(bw * gpu.bandwidth_tbs, rate or float("inf")) * 1e12) * 1e6
    launches = max(work.launches, 1)
    per_op = fit.kernels.get(work.kclass, fit.kernels.get(work.kclass.removesuffix("_backward"), 1.0))
    floor_us = launches * per_op * fit.floor_us
    roof = max(compute_us, memory_us)
    bound = "compute" if compute_us >= memory_us else "memory"
    if floor_us > roof:
        bound = "overhead"
    return floor_us + roof, bound


def host_us(work: Work, fit: GpuTimeFit = FIT) -> float:
    """Host µs eager PyTorch spends on one ``Work``'s aten ops (Python, dispatcher, launches)."""
    return sum(n * fit.host_us.get(key, fit.host_us.get("op", 0.0)) for key, n in work.host_ops.items())


@dataclass(frozen=True)
class Timeline:
    """Both predictions of an op stream (ms), and per node its share of the eager run."""

    eager_ms: float         # as written: the host's and the GPU's timelines, simulated
    served_ms: float        # as served: the kernels back to back
    host_ms: float          # the host's time alone (Python, dispatcher, launches)
    nodes: tuple            # per node: (eager ms it adds, kernel ms, bound)

    @property
    def host_bound(self) -> bool:
        return self.host_ms > self.served_ms


def simulate(nodes: Iterable[NodeReport], gpu: GPU, fit: GpuTimeFit = FIT) -> Timeline:
    """Both timelines over ``nodes`` in order (see the module docstring). A node's eager share is how
    far it moves the later of the two timelines; its bound is ``host`` when the GPU waited for it."""
    host = gpu_end = done = served = host_total = 0.0
    per = []
    previous = None
    for node in nodes:
        works = node_work(node)
        h = sum(host_us(w, fit) for w in works) + _call_us(node, previous, fit)
        previous = node
        priced = [kernel_us(w, gpu, fit) for w in works]
        k = sum(t for t, _ in priced)
        served += sum(kernel_us(w, gpu, fit, served=True)[0] for w in works)
        if node.category == "host_sync":  # the value is read back: the host waits for the GPU
            host = max(host, gpu_end)
        host += h
        host_total += h
        bound = max(priced, key=lambda p: p[0])[1] if priced else "none"
        if k:
            waited = host > gpu_end
            gpu_end = max(host, gpu_end) + k
            bound = "host" if waited and h > k else bound
        now = max(host, gpu_end)
        per.append(((now - done) / 1e3, k / 1e3, bound))
        done = now
    return Timeline(done / 1e3, served / 1e3, host_total / 1e3, tuple(per))


def node_ms(node: NodeReport, gpu: GPU, fit: GpuTimeFit = FIT) -> tuple[float, str]:
    """(ms, bound) of one node on its own, as written: the slower of its host time and its kernels."""
    works = node_work(node)
    h = sum(host_us(w, fit) for w in works) + _call_us(node, None, fit)
    priced = [kernel_us(w, gpu, fit) for w in works]
    k = sum(t for t, _ in priced)
    if h > k:
        return h / 1e3, "host"
    return k / 1e3, (max(priced, key=lambda p: p[0])[1] if priced else "none")


# --- a training step ---------------------------------------------------------------------------------

def training_ms(step: dict, gpu: GPU, fit: GpuTimeFit = FIT) -> dict | None:
    """A training step's time on ``gpu`` from its per-op-class sums (``op_classes``, built by
    ``archscan.memory.train``): per phase (forward, backward, the recompute of checkpointed regions,
    optimizer) the kernels' time (the backward's by ``BACKWARD_CLASSES``) and the host's; as written the
    slower of the two per phase (a phase's
    kernels overlap its own host work, the phases follow one another), as served the kernels alone.
    None for a step without the sums. Each class's ops are priced together (their multiply-adds and
    bytes summed): exact for the memory-bound classes, a lower bound where one class mixes compute-
    and memory-bound ops."""
    classes = step.get("op_classes")
    if not classes:
        return None
    phases = {}
    for phase, rows in classes.items():
        kernel = host = served = 0.0
        for row in rows:
            op, count = row["op"], row["ops"]
            if row["category"] == "view" or (phase == "optimizer" and row["category"] == "host_sync"):
                # an optimizer's .item() reads its step counters, which live on the CPU (torch's default
                # unless capturable): no kernel, no wait
                host += count * fit.host_us.get("view", 0.0)
                continue
            kclass = kernel_class(row["category"], (op,))
            if phase == "backward":
                kclass = backward_class(kclass)
            launches = count if _launches(op) else 0
            work = Work(kclass, row["dtype"], row.get("executed_flops", row["flops"]), row.get("executed_flops", row["flops"]),
                        row["mac_bytes"], launches, {host_class(kclass) if launches else "view": count})
            k = kernel_us(work, gpu, fit)[0] if launches or row["mac_bytes"] else 0.0
            kernel += k
            served += k
            host += host_us(work, fit)
        phases[phase] = {"predicted_ms": max(kernel, host) / 1e3, "served_ms": served / 1e3, "kernel_ms": kernel / 1e3,
                         "host_ms": host / 1e3, "bound": "host" if host > kernel else "gpu"}
    return {"execution_model": gpu.name, "predicted_ms": sum(p["predicted_ms"] for p in phases.values()),
            "served_ms": sum(p["served_ms"] for p in phases.values()), "phases": phases}


__all__ = ["BACKWARD_CLASSES", "FIT", "PRIOR", "RATE_CLASSES", "GpuTimeFit", "Timeline", "Work", "backward_class", "execution_model",
           "gpu_of", "host_us", "kernel_class",
           "kernel_us", "node_ms", "node_work", "peak_macs", "simulate", "training_ms"]
