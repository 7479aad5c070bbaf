"""Latency predictions on a device profile.

On a GPU the GPU execution model predicts (``archscan.measure.gpu``): the host's and the GPU's
timelines of eager PyTorch (``predicted_ms``, as written) and the kernels alone (``served_ms``, as
a CUDA graph or a compiled model runs them), with efficiencies and host costs fit on recorded
traces. On a CPU profile (and a GPU the model has no datasheet for), the roofline of the profile:

    compute_ms  = flops / multiply-adds per second (the rate measured for the node's op class --
                  dense, grouped or depthwise conv -- or the dtype's matmul peak)
    memory_ms   = mac_bytes / bytes per second (measured for norms, activations, element-wise
                  ops, pools and copies; else the large-copy bandwidth)
    overhead_ms = kernels * the per-call floor of the node's op class (its time on a tiny
                  input; else the launch overhead of a one-element op)
    predicted   = max(compute_ms, memory_ms) + overhead_ms

A node is compute-bound when compute_ms is the largest of the three terms, memory-bound when
memory_ms is, and overhead-bound when launching its kernels costs more than either.
"""

from __future__ import annotations

import dataclasses

from ..results import NodeReport, Report
from . import gpu as _gpu
from .profile import DeviceProfile

# Ops that allocate without launching a kernel.
_NO_KERNEL_PREFIXES = ("aten.empty", "aten.new_empty", "aten.lift_fresh")


def kernels(node: NodeReport) -> int:
    """Kernels a node launches: its non-view aten ops that do work."""
    return sum(1 for op in node.aten_ops if not op.startswith(_NO_KERNEL_PREFIXES))


def report_totals(report: Report) -> dict:
    """A report's params, flops, mac_bytes and kernels, and predicted_ms when a profile predicted it:
    what transforms and variants of a model are compared by."""
    out = {"params": report.totals.params, "flops": report.totals.flops, "mac_bytes": report.totals.mac_bytes,
           "kernels": sum(map(kernels, report.nodes))}
    if report.latency and report.latency.get("predicted_ms") is not None:
        out["predicted_ms"] = report.latency["predicted_ms"]
    return out


def predict_node(node: NodeReport, profile: DeviceProfile) -> tuple[float, str]:
    """(predicted ms, bound) for one node: on a GPU the model's (``gpu.node_ms``: the slower of its
    host time and its kernels, as written), else the roofline's."""
    found = _gpu.gpu_of(profile)
    if found is not None:
        return _gpu.node_ms(node, found)
    compute = node.flops / profile.flops_for(node.dtype, node.category) * 1e3
    memory = node.mac_bytes / profile.bandwidth_for(node.category) * 1e3
    overhead = kernels(node) * profile.overhead_for(node.category)
    bound = max((compute, "compute"), (memory, "memory"), (overhead, "overhead"))[1]
    if compute == memory == overhead == 0:
        bound = "none"
    return max(compute, memory) + overhead, bound


_AUTOCAST_CATEGORIES = ("conv", "grouped_conv", "depthwise_conv", "linear", "matmul", "attention")
_AMP_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


def as_run(n: NodeReport, amp: str | None) -> NodeReport:
    """The node as autocast runs it: matmul-class ops in the low-precision dtype, half the bytes."""
    if amp not in _AMP_DTYPES or n.category not in _AUTOCAST_CATEGORIES or n.dtype != "float32":
        return n
    return dataclasses.replace(n, dtype=_AMP_DTYPES[amp], mac_bytes=n.mac_bytes // 2)


def predicted(report: Report, profile: DeviceProfile | None) -> Report:
    """The report with ``profile``'s predictions (``apply_predictions``), or as it is without a profile."""
    return apply_predictions(report, profile) if profile else report


def apply_predictions(report: Report, profile: DeviceProfile) -> Report:
    """The report with ``predicted_ms`` and ``bound`` on every node and the predicted total
    (under ``--amp``, conv/linear/matmul/attention nodes are predicted in the autocast dtype).
    ``latency.execution_model`` says what predicted: a GPU's name (``archscan.measure.gpu``: then
    ``served_ms`` and ``host_ms`` too, and each node's ``predicted_ms`` is how far it moves the
    eager run) or ``cpu``."""
    amp = (report.latency or {}).get("amp")
    found = _gpu.gpu_of(profile)
    run = [as_run(n, amp) for n in report.nodes]
    timeline = _gpu.simulate(run, found) if found is not None else None
    nodes = []
    for i, n in enumerate(report.nodes):
        if timeline is not None:
            ms, kernel_ms, bound = timeline.nodes[i]
            attrs = {**n.attrs, "bound": bound, "kernel_ms": kernel_ms}
        else:
            ms, bound = predict_node(run[i], profile)
            attrs = {**n.attrs, "bound": bound}
        if n.latency_ms:
            attrs["achieved"] = ms / n.latency_ms  # fraction of the roofline this node reaches
        nodes.append(dataclasses.replace(n, predicted_ms=ms, attrs=attrs))
    latency = dict(report.latency or {})
    latency["execution_model"] = _gpu.execution_model(profile)
    if timeline is not None:
        latency["predicted_ms"] = timeline.eager_ms
        latency["served_ms"] = timeline.served_ms
        latency["host_ms"] = timeline.host_ms
    else:
        latency["predicted_ms"] = sum(n.predicted_ms for n in nodes)
    latency["profile"] = {"device": profile.device, "name": profile.name, "threads": profile.threads,
                          "created": profile.created, "peak_flops": dict(profile.peak_flops),
                          "bandwidth": profile.bandwidth, "launch_overhead_ms": profile.launch_overhead_ms}
    measured = latency.get("end_to_end_ms")
    if measured:
        latency["prediction_error"] = latency["predicted_ms"] / measured - 1
    return dataclasses.replace(report, nodes=tuple(nodes), latency=latency)


def with_training_time(step: dict, profile: DeviceProfile | None) -> dict:
    """A training step (``archscan.memory.train.train_step``'s section) with its time on a GPU profile
    (``time``: as written and as served, per phase; ``gpu.training_ms``); as it is on any other."""
    found = _gpu.gpu_of(profile)
    timed = _gpu.training_ms(step, found) if found is not None else None
    return {**step, "time": timed} if timed is not None else step


def _ranks(values: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their average rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation (Pearson correlation of the ranks)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("spearman needs two equally long lists of at least 2 values")
    ra, rb = _ranks(list(a)), _ranks(list(b))
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else 0.0


def fidelity(report: Report) -> dict:
    """How well predictions track measurements: Spearman per node, end-to-end error, worst nodes."""
    pairs = [(n.predicted_ms, n.latency_ms, n) for n in report.nodes
             if n.predicted_ms is not None and n.latency_ms is not None and n.category != "view"]
    if len(pairs) < 2:
        return {}
    lat = report.latency or {}
    below = sorted(pairs, key=lambda p: p[0] / p[1] if p[1] else 1.0)
    return {
        "nodes": len(pairs),
        "spearman": spearman([p[0] for p in pairs], [p[1] for p in pairs]),
        "end_to_end_error": lat.get("prediction_error"),
        "furthest_below_roofline": [{"node": n.name, "module": n.module, "achieved": pred / meas if meas else None,
                                     "measured_ms": meas, "predicted_ms": pred} for pred, meas, n in below[:5]],
    }
