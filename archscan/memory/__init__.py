"""Memory: the bytes live over a run by tensor lifetime, their peak and what holds them then.

``MemoryTracker`` (``tracker.py``) follows storages on fake tensors. Every scan reports its
inference forward's peak from the model's own forward: ``MemoryObserver`` (an
``archscan.capture.Observer``) rides the capture's recording on fake tensors where the capture
makes one; otherwise the forward runs once more on the capture's model (``forward_memory``), and
where that cannot run either, the captured graph's lifetimes, its direct run repeated with the
observer riding it (``archscan.capture.run_again``).
``archscan.memory.train`` analyses a whole training step; ``snapshot`` writes a run in PyTorch's
memory snapshot format. Every run is counted as the current execution model runs it
(``archscan.memory.gpu``: the CPU's kernels, or a named GPU's, whose caching allocator
``allocator.py`` simulates: the ``cuda`` entry of the summary).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor

from ..capture import direct
from ..load.building import global_hooks_set_aside, make_call, on_meta
from ..load.frames import short
from ..load.targets import InputSpec
from ..load.recording import module_stack, quiet, source_of, user_line
from .gpu import allocator_peaks, current
from .tracker import CATEGORIES, MemoryTracker, Peak

__all__ = ["CATEGORIES", "MemoryObserver", "MemoryTracker", "Peak", "forward_memory", "snapshot", "summary"]


class MemoryObserver:
    """The inference forward's memory, found in the capture's run (``Captured.observed["memory"]``):
    the captured graph's lifetimes in a direct run (``mode``), or the model's own forward where
    the capture records it on fake tensors (``eager_mode``: what ``forward_memory`` finds, in
    the same run)."""

    key = "memory"
    # the direct run's graph frees each value after its last use, which Python's variables do not:
    # the figure comes from the model's own forward (``forward_memory``), and the graph's
    # lifetimes only where that cannot run (``capture.run_again``), not on every scan
    rides_direct = False

    def mode(self, model: nn.Module) -> MemoryTracker:
        tracker = MemoryTracker()
        tracker.register(*weights(model))
        return tracker

    def eager_mode(self, model: nn.Module, inputs: Sequence[torch.Tensor]) -> MemoryTracker:
        tracker = MemoryTracker(locate=user_line)
        tracker.register(*weights(model))
        tracker.register(inputs, "inputs")
        tracker.hooks = module_hooks(model, tracker)
        return tracker

    def result(self, tracker: MemoryTracker, output: Any, model: nn.Module) -> dict:
        for h in tracker.hooks or ():
            h.remove()
        tracker.close()
        tracker.settle()
        return summary(tracker, {"basis": "eager" if tracker.hooks is not None else "graph"})


def forward_memory(model: nn.Module, specs: Sequence[InputSpec], dtype: torch.dtype | None,
                   why: list[str] | None = None) -> dict | None:
    """The inference forward's memory, the model's own forward run eagerly on the capture's model
    (meta weights with CPU activations under ``archscan.capture.direct``, or fake tensors): Python's
    variables hold what they hold in the model's code (``x = layer4(layer3(layer2(layer1(x))))``
    keeps the first ``x`` until the line ends), which the captured graph, freeing each value after
    its last use, cannot show. None where that run cannot be made (a model with real weights, one
    that needs tensor values; ``why`` gets the reason): the capture's graph then gives the figure.
    The direct run has no time budget here (the capture's own run had one): its multiply-adds and
    bytes bound it, and the figure's basis must not depend on how busy the machine is."""
    tensors = [*model.parameters(), *model.buffers()]
    if on_meta(model):
        base, call = direct.Direct(seconds=math.inf), make_call(specs, dtype)
    else:
        fake_mode = next((t.fake_mode for t in tensors if isinstance(t, FakeTensor)), None)
        if fake_mode is None:
            return None
        base, call = fake_mode, make_call(specs, dtype, fake_mode)
    observer = MemoryObserver()
    tracker = observer.eager_mode(model, call.tensors())
    ran = True
    try:
        with global_hooks_set_aside(), base, tracker, torch.no_grad(), quiet():
            call(model)
    except Exception as exc:  # direct.Stop, a value the fake tensors cannot give: the graph's figure stands
        ran = False
        if why is not None:
            why.append(short(exc))
    found = observer.result(tracker, None, model)  # its hooks go either way
    return found if ran else None


def weights(model: nn.Module) -> tuple[list[torch.Tensor], str, list[str]]:
    """``MemoryTracker.register``'s arguments for the model's parameters and buffers: the tensors,
    "params", and the path of the module holding each."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return [t for _, t in named], "params", [name.rpartition(".")[0] for name, _ in named]


def module_hooks(model: nn.Module, tracker: MemoryTracker | Any,
                 on_exit: Callable[[str, Any], None] | None = None) -> list:
    """Forward hooks that tell the tracker which module runs (the innermost; its parent again
    after it); ``on_exit(path, output)`` is called as each module returns. ``tracker``: anything
    with ``where`` (the module path) and ``called_at`` (path -> the model line that first called
    it), as a ``MemoryTracker`` has (``archscan.llm.decode``'s step costs too)."""
    stack: list[str] = []

    def pre(path):
        def hook(module, args):
            stack.append(path)
            tracker.where = path
            if path and path not in tracker.called_at:  # the root is called by whoever runs the model
                tracker.called_at[path] = user_line()
        return hook

    def post(path):
        def hook(module, args, output):
            if stack:
                stack.pop()
            tracker.where = stack[-1] if stack else ""
            if on_exit is not None:
                on_exit(path, output)
        return hook

    handles = []
    for path, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(pre(path)))
        handles.append(module.register_forward_hook(post(path)))
    return handles


def place(at: Any, source: str | None = None) -> dict:
    """What the run was at: an fx node (its name, module and source line), a module path, or nothing."""
    if isinstance(at, torch.fx.Node):
        stack = module_stack(at)
        return {"node": at.name, "module": stack[-1][0] if stack else "", "source": source or source_of(at)}
    return {"node": None, "module": at if isinstance(at, str) else None, "source": source}


def summary(tracker: MemoryTracker, extra: dict | None = None) -> dict:
    """The JSON ``memory`` section: ``peak_bytes``, ``peak_at``, ``at_peak`` (bytes by category),
    the largest tensors live at the peak, and the live-bytes ``timeline``."""
    peak = tracker.peak
    return {
        "peak_bytes": peak.bytes,
        "peak_at": {"phase": peak.phase, "op": peak.op,
                    **place(peak.where, peak.source or tracker.called_at.get(peak.where))},
        "at_peak": dict(peak.by_category),
        "scratch_bytes": peak.scratch,
        # any of them may raise the peak, before it or after it: a kernel's own scratch can exceed the margin
        **({"unmodelled_scratch": dict(sorted(tracker.unmodelled.items(), key=lambda kv: -kv[1]))} if tracker.unmodelled else {}),
        "largest": [{**{k: v for k, v in t.items() if k != "where"},
                     **place(t["where"], tracker.called_at.get(t["where"]) if isinstance(t["where"], str) else None)}
                    for t in peak.largest],
        "timeline": tracker.timeline(),
        "execution": current().to_json(),
        **({"cuda": allocator_peaks(tracker.log)} if current().is_gpu else {}),
        **(extra or {}),
    }


def snapshot(tracker: MemoryTracker) -> dict:
    """The run as PyTorch's memory snapshot (the format of ``torch.cuda.memory._snapshot()``), which
    https://pytorch.org/memory_viz and ``torch.cuda._memory_viz.trace_plot`` draw: every storage an
    alloc event (what existed before the run first), freed by ``free_requested``/``free_completed``
    events; a kernel's scratch is allocated and freed around its op. Addresses are the storages'
    serial numbers (fake tensors have none); each event's frame names the op, its category, phase
    and module."""
    events = []
    for made, s, _, _ in tracker.log:
        at = place(s.where)
        frame = {"filename": at["source"] or at["module"] or "", "line": 0,
                 "name": f"{s.op or 'existing'} [{s.category}, {s.phase}]"}
        actions = ("alloc",) if made else ("free_requested", "free_completed")
        for action in actions:
            events.append({"action": action, "addr": s.serial, "size": s.nbytes, "stream": 0, "frames": [frame]})
    return {"device_traces": [events],
            "segments": [{"device": 0, "address": 0, "total_size": tracker.peak.bytes, "stream": 0, "blocks": []}]}
