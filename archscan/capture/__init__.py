"""Capture a model as a torch.fx graph whose nodes carry per-op costs.

Three ways; the report names the one used, tried in this order:

* ``fx``: ``torch.fx`` symbolic tracing (module-level graph, leaf modules kept whole).
* ``eager``: when fx fails, one forward pass under a ``TorchDispatchMode`` that records every
  aten op with its module (the way ``torch.utils.flop_counter.FlopCounterMode`` attributes
  FLOPs); the graph is rebuilt from tensor identity. Without the weights' values when the model
  does not read values (in a direct run, ``_record_direct``, else on fake tensors); for real, on
  seeded random inputs, when it does (``if x.mean() > 0``, ``.item()``, and export failed too):
  then it covers the path taken for those values.
* ``export``: ``torch.export.export(strict=False)``, aten-level graph with the module stack
  kept, in place of the recording when the recording holds an attention written by hand (a
  softmax between two matrix products: ``writes_attention``), whose SDPA rewrite matches
  export's ops; or when the recording could not run. Outputs of any type (Hugging Face cache
  objects) are flattened to their tensors. The recording costs what one forward costs under its
  modes; export traces the same code several times slower (HF Mamba-130m at 64 tokens: about
  22 s, against 6 s for the recording on fake tensors and 2 s in a direct run).

Everything but a real eager run works without weights: in a direct run (``archscan.capture.direct``:
weights on the meta device, CPU activations, matrix products by shape) where it gives the same
answer cheaply, else on fake tensors (``FakeTensorMode``): no weights are allocated and nothing
large is computed, so a 70B-parameter model is analysed in seconds on a laptop.

Takes the scan's build of the model (``archscan.load``) and its input specs; gives ``Captured``:
the graph, its per-node costs, what the observers handed in found, notes on the path taken.

Modules: this ``__init__`` (the order of attempts, fx, export, the recording on fake tensors),
``direct`` (the direct run on meta weights), ``eager`` (the recording's graph, a real run),
``graphmodule`` (a GraphModule from recorded nodes), ``nocompile`` (the compiler guard: keeps
``torch._dynamo`` unloaded while the command analyses).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import inspect
import math
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch
import torch.fx
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from . import direct
from ..load.building import (Call, build_fake, build_meta, build_real, global_hooks_set_aside, has_lazy, make_call,
                             meta_instance, on_meta, strip_user_hooks)
from ..costs import composite_attention, inner_tensors, packed, packed_attributes, packed_key, storage_key, stored_nbytes
from ..devices import short_of
from .eager import capture_eager
from ..errors import ArchscanError, CaptureError, DeviceError
from ..load.frames import at, is_user_file, short, where
from .graphmodule import graph_module
from ..load.targets import InputSpec, ModelTarget
from ..load.recording import (NodeCosts, OpRecorder, SyncWatcher, first_tensor, module_stack, needs_values,
                              output_tensors, python_stack, quiet, shape_str, source_of)

__all__ = ["Captured", "NodeCosts", "Observer", "Weight", "model_weights", "between_products", "capture", "capture_context", "module_stack", "run_again", "source_of",
           "trace_export", "trace_fx"]


@dataclass
class Captured:
    """A captured model: the graph (nodes annotated with ``node.meta['archscan']``)."""

    gm: torch.fx.GraphModule
    kind: str
    model: nn.Module
    notes: list[str]
    param_names: dict[Any, str]        # storage key -> parameter name
    param_numel: dict[Any, int]        # storage key -> numel
    failures: dict[str, str]           # capture kind -> why it failed
    training: bool = False             # the user's module instance was in train mode
    host_syncs: tuple[dict, ...] = ()  # Python-level syncs the graph does not show (SyncWatcher)
    fake: bool = True                  # ``model`` holds no real weights: fake or meta tensors (a direct run)
    observed: dict[str, Any] = field(default_factory=dict)  # Observer.key -> what it found in the same run


class Observer(Protocol):
    """What rides the capture's one run, handed in by the stage that needs it (the channel labels
    of ``archscan.prune.groups.ChannelLabels``): the capture imports none of them.

    ``mode(model)`` gives a dispatch mode the run stacks between the tensors and the cost
    recorder; after the run ``result(mode, output, model)`` says what it found, kept in
    ``Captured.observed[key]``. The direct run (``archscan.capture.direct``) carries observers: it is
    cheap where it runs. Where the capture takes another path the key is absent and the stage
    finds what it needs itself (``archscan.prune.analyse``), or goes without (a memory figure on
    the captured graph's lifetimes). A mode with a ``where`` attribute is told the fx node that
    runs. An observer with ``eager_mode(model, inputs)`` rides the recording on fake tensors
    too (the model's own forward, not a graph; ``result`` then gets no output), and what it
    found there is kept whichever graph the capture keeps. One with ``rides_direct = False`` rides
    only the recording: its stage gets what it needs otherwise, and ``run_again`` runs the direct
    graph once more for it where it must.
    """

    key: str

    def mode(self, model: nn.Module) -> Any: ...

    def result(self, mode: Any, output: Any, model: nn.Module) -> Any: ...


@dataclass(frozen=True)
class Weight:
    """One weight a model stores: a parameter, or torch.ao's packed parameters (a quantized layer's
    weight and bias, packed in a TorchScript object: ``archscan.costs.quantized``)."""

    name: str       # 'fc.weight', 'fc._packed_params._packed_params'
    key: Any        # storage_key (a parameter), packed_key (packed parameters)
    numel: int      # elements: a tensor subclass's logical ones (N*K), the packed weights' and biases'
    nbytes: int     # bytes as stored: a subclass's inner storages, the packed int8 values, scales, zero points
    inner: tuple = ()  # storage keys of a tensor subclass's inner tensors (qdata, scale, zero_point)


def model_weights(model: nn.Module) -> list[Weight]:
    """Every weight of ``model`` once, in registration order: its parameters, then the packed
    parameters of its torch.ao quantized layers (``quantize_dynamic``, static ``convert``), which
    torch does not list among the parameters."""
    out, seen = [], set()
    for name, p in model.named_parameters(remove_duplicate=True):  # each parameter once (tied ones too)
        subclass = is_traceable_wrapper_subclass(p)
        out.append(Weight(name, storage_key(p), p.numel(), stored_nbytes(p),
                          tuple(storage_key(t) for t in inner_tensors(p)) if subclass else ()))
    for path, module in model.named_modules():
        for attr, value in packed_attributes(module):
            if packed_key(value) not in seen:
                seen.add(packed_key(value))
                found = packed(value)
                out.append(Weight(f"{path}.{attr}" if path else attr, packed_key(value), found.numel, found.nbytes))
    return out


def _weight_maps(model: nn.Module) -> tuple[dict, dict, set, bool]:
    """(weight key -> name, weight key -> elements, the keys of every weight and buffer, whether a
    weight is a tensor subclass). A subclass's inner tensors are weights too (an op that reads one
    reads the weight at its stored bytes), under its own key for the parameter counts."""
    names, numel, weight_keys, subclasses = {}, {}, set(), False
    for w in model_weights(model):
        names.setdefault(w.key, w.name)
        numel.setdefault(w.key, w.numel)
        weight_keys.add(w.key)
        weight_keys.update(w.inner)
        subclasses |= bool(w.inner)
    for _, b in model.named_buffers():
        weight_keys.add(storage_key(b))
    return names, numel, weight_keys, subclasses


# --- fx and export ---------------------------------------------------------------------------------

class _Tracer(torch.fx.Tracer):
    """fx tracer that records the user's file:line for each node (cheaper than fx's own stacks)."""

    def create_proxy(self, *args, **kwargs):
        proxy = super().create_proxy(*args, **kwargs)
        proxy.node.stack_trace = python_stack()
        return proxy


def trace_fx(model: nn.Module, call: Call | None = None) -> torch.fx.GraphModule:
    """torch.fx symbolic trace with stack traces recorded (for file:line in findings). Forward
    arguments that ``call`` does not pass are traced as their defaults (``mask=None`` stays None)."""
    tracer = _Tracer()
    graph = tracer.trace(model, concrete_args=_defaults_not_given(model, call) if call is not None else None)
    return graph_module(tracer.root, graph, model.__class__.__name__)


def _forward_params(model: nn.Module) -> list[inspect.Parameter] | None:
    """forward's parameters (bound: no self), or None when Python cannot tell them."""
    try:
        return list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None


def _defaults_not_given(model: nn.Module, call: Call) -> dict[str, Any] | None:
    params = _forward_params(model)
    if params is None:
        return None
    given = {p.name for p in params[:len(call.args)]} | set(call.kwargs)
    return {p.name: p.default for p in params
            if p.name not in given and p.default is not p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} or None


def trace_export(model: nn.Module, call: Call) -> torch.fx.GraphModule:
    """torch.export (non-strict) on fake tensors; the unlifted module keeps nn_module_stack."""
    return export_program(model, call).module()


def export_program(model: nn.Module, call: Call, dynamic_shapes: Any = None) -> torch.export.ExportedProgram:
    """``torch.export.export(model, ..., strict=False)`` with forward's output flattened.

    Whatever forward returns (a Hugging Face ``DynamicCache`` inside a ``ModelOutput``, any
    object holding tensors) is flattened to a tuple of its tensors: export only accepts outputs
    it can flatten, and what a model returns does not change what it computes.
    """
    forward = model.forward

    @functools.wraps(forward)
    def flat_forward(*args, **kwargs):
        return output_tensors(forward(*args, **kwargs))

    model.forward = flat_forward  # on this instance only: export still sees the same module tree
    sites: list[tuple[tuple[str, ...], bool]] = []
    try:
        with _factory_sites(sites):
            program = torch.export.export(model, call.args, call.kwargs, strict=False, dynamic_shapes=dynamic_shapes)
    finally:
        del model.forward
    _mark_factory_sites(program.graph, sites)
    return program


_FACTORIES = ("tensor", "as_tensor", "asarray")


@contextlib.contextmanager
def _factory_sites(sites: list[tuple[tuple[str, ...], bool]]):
    """Record each ``torch.tensor``/``as_tensor``/``asarray`` call made while tracing: the model-code
    lines on its stack (innermost first) and whether it passed ``device=``.

    Export's stack traces keep only ``forward`` frames, so a tensor a helper makes (Hugging Face's
    ``cache_utils``) is placed on the forward line that called the helper, where no such call is
    written; these records say what the helper did.
    """
    originals = {name: getattr(torch, name) for name in _FACTORIES}

    def recording(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            lines, frame = [], sys._getframe(1)
            while frame is not None:
                if is_user_file(frame.f_code.co_filename):
                    lines.append(where(frame.f_code.co_filename, frame.f_lineno))
                frame = frame.f_back
            sites.append((tuple(lines), kwargs.get("device") is not None))
            return fn(*args, **kwargs)
        return call

    for name, fn in originals.items():
        setattr(torch, name, recording(fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)


def _mark_factory_sites(graph: torch.fx.Graph, sites: list[tuple[tuple[str, ...], bool]]) -> None:
    """``node.meta['archscan_made_at']``: for each lifted constant (``lift_fresh``) whose source line
    does not itself make a tensor, the recorded calls made below that line: [(line, passed device)]."""
    for node in graph.nodes:
        if node.op != "call_function" or getattr(node.target, "__name__", "").split(".")[0] not in (
                "lift_fresh", "lift_fresh_copy"):
            continue
        line = source_of(node)
        below = [(lines[0], device) for lines, device in sites if line in lines[1:]]
        if line and below:
            node.meta["archscan_made_at"] = below


_ATTENTION_CALLS = (torch.nn.functional.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)


class CostInterpreter(torch.fx.Interpreter):
    """Runs the graph on fake tensors, costing each node's aten ops into ``node.meta['archscan']``."""

    def __init__(self, gm: torch.fx.GraphModule, recorder: OpRecorder, watchers: Sequence[Any] = ()):
        super().__init__(gm, garbage_collect_values=True)
        self.recorder = recorder
        self.watchers = [w for w in watchers if hasattr(w, "where")]  # observers' modes told the node that runs
        self.outs: dict[str, Any] | None = None  # what each node gave (``_spec``), for a later run to reuse
        self.extra_traceback = False  # a failing node is described by _NodeFailure; torch's structured
        # log of it would symbolize a traceback, importing torch._inductor and dynamo (seconds)

    def run_node(self, n: torch.fx.Node) -> Any:
        costs = NodeCosts()
        self.recorder.current = costs
        for watcher in self.watchers:
            watcher.where = n
        try:
            result = super().run_node(n)
        except Exception as exc:
            raise _NodeFailure(n, self._input_shapes(n), exc) from exc
        finally:
            self.recorder.current = None
        t = first_tensor(result)
        if t is not None:
            costs.out_shape, costs.out_dtype = tuple(int(s) for s in t.shape), t.dtype
        if self.outs is not None:
            self.outs[n.name] = _spec(result)
        if n.target in _ATTENTION_CALLS and len(n.args) >= 2:  # decomposed on the CPU: still one attention
            query, key = (self.env.get(a) if isinstance(a, torch.fx.Node) else a for a in n.args[:2])
            causal = n.kwargs.get("is_causal", n.args[5] if len(n.args) > 5 else False)
            costs.ops = composite_attention(costs.ops, query, key, causal is True)
        n.meta["archscan"] = costs
        return result

    def _input_shapes(self, n: torch.fx.Node) -> str:
        vals = [self.env.get(a) for a in n.all_input_nodes if a in self.env]
        return shape_str(vals)


class _NodeFailure(Exception):
    def __init__(self, node: torch.fx.Node, shapes: str, exc: BaseException):
        super().__init__(str(exc))
        self.node, self.shapes, self.exc = node, shapes, exc

    def describe(self, model_type: str) -> str:
        if self.node.op == "placeholder":
            return f"input {self.node.name!r} could not be bound: {str(self.exc).strip().splitlines()[0]}"
        stack = module_stack(self.node)
        where = (f"layer {stack[-1][0]!r} ({stack[-1][1]})" if stack and stack[-1][0]
                 else f"{model_type}.forward (node {self.node.name!r})")
        if self.node.op == "call_module":
            sub = self.node.graph.owning_module.get_submodule(self.node.target)
            where = f"layer {self.node.target!r} ({type(sub).__name__})"
        src = source_of(self.node)
        msg = str(self.exc).strip().splitlines()[0] if str(self.exc).strip() else type(self.exc).__name__
        return f"{where}{' at ' + src if src else ''} rejected input of shape {self.shapes}: {msg}"


@dataclass(frozen=True)
class _TensorSpec:
    """What a node gave, as a later run of the same graph must find it to reuse the node's costs."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


def _spec(value: Any) -> Any:
    """``value`` with each CPU tensor as a ``_TensorSpec`` (None where it holds anything else than
    CPU tensors, numbers, strings, None and sequences of them: such a node always runs again)."""
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor or value.device.type != "cpu" or value.layout != torch.strided:
            return None
        return _TensorSpec(tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return ("value", value)
    if isinstance(value, (tuple, list)):  # torch.Size too
        items = [_spec(v) for v in value]
        return None if any(i is None for i in items) else (type(value).__name__, tuple(items))
    return None


def _made(spec: Any) -> Any:
    """A value ``_spec`` describes: zeros of each tensor's layout (values never count, and a zero
    index stays a valid index for an op that reads it)."""
    if isinstance(spec, _TensorSpec):
        extent = spec.offset + 1 + sum((n - 1) * st for n, st in zip(spec.shape, spec.stride)) if all(spec.shape) else 0
        return torch.zeros(extent, dtype=spec.dtype).as_strided(spec.shape, spec.stride, spec.offset)
    kind, inner = spec
    if kind == "value":
        return inner
    items = [_made(i) for i in inner]
    return torch.Size(items) if kind == "Size" else tuple(items) if kind == "tuple" else items


@dataclass(frozen=True)
class _Prior:
    """A node of an earlier direct run of the same graph: its costs, what it gave, the weights it
    read (by name) and, for a layer, its weights' shapes."""

    costs: NodeCosts
    out: Any
    params: frozenset[str]
    weights: tuple


def _module_weights(gm: torch.fx.GraphModule, n: torch.fx.Node) -> tuple:
    if n.op != "call_module":
        return ()
    module = gm.get_submodule(n.target)
    return tuple((name, tuple(t.shape), t.dtype) for name, t in (*module.named_parameters(), *module.named_buffers()))


_PRIORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a direct run's graph -> its nodes' _Priors


def _priors(gm: torch.fx.GraphModule, names: dict, outs: dict[str, Any]) -> dict[str, _Prior] | None:
    """Each node's ``_Prior`` after a direct run of ``gm`` (``names``: weight key -> name; ``outs``:
    node -> ``_spec`` of what it gave), or None where the run's costs depend on more than each
    node's own inputs (a router's choice of experts is carried from op to op)."""
    priors = {}
    for n in gm.graph.nodes:
        costs, out = n.meta.get("archscan"), outs.get(n.name)
        if costs is None or out is None:
            continue
        if any("topk" in c.op or "experts" in c.attrs for c in costs.ops):
            return None
        priors[n.name] = _Prior(costs, out, frozenset(names[k] for k in costs.param_keys if k in names),
                                _module_weights(gm, n))
    return priors


@dataclass(frozen=True)
class _Unmade:
    """A reused node's value, not made yet: most are read only by other reused nodes."""

    spec: Any


class _ReusingInterpreter(CostInterpreter):
    """A run of a graph whose earlier direct run's costs (``priors``) stand for every node that
    reads what it read then and holds the weights it held then: such a node is not run, its costs
    are copied (its weights named anew: ``keys``, weight name -> key) and it gives zeros of the
    layout it gave. A cut copy of a model runs only the nodes its cut reaches."""

    def __init__(self, gm, recorder, priors: dict[str, _Prior], keys: dict[str, Any], watchers: Sequence[Any] = ()):
        super().__init__(gm, recorder, watchers)
        self.priors, self.keys, self.same = priors, keys, set()

    def run_node(self, n: torch.fx.Node) -> Any:
        prior = self.priors.get(n.name)
        if prior is not None and n.op in ("call_function", "call_method", "call_module") \
                and all(a.name in self.same for a in n.all_input_nodes) \
                and all(p in self.keys for p in prior.params) and _module_weights(self.module, n) == prior.weights:
            n.meta["archscan"] = NodeCosts(list(prior.costs.ops), {self.keys[p] for p in prior.params},
                                           prior.costs.out_shape, prior.costs.out_dtype)
            self.same.add(n.name)
            return _Unmade(prior.out)  # made only if a node that runs reads it
        for a in n.all_input_nodes:
            if isinstance(self.env.get(a), _Unmade):
                self.env[a] = _made(self.env[a].spec)
        result = super().run_node(n)
        if prior is not None and _spec(result) == prior.out:
            self.same.add(n.name)
        elif n.op == "placeholder":  # an input given as before (a later run of the same call)
            self.same.add(n.name)
        return result


def _interpret(gm, call: Call, fake_mode, recorder, below: Sequence[Any] = (), priors: dict | None = None,
               keys: dict | None = None, outs: dict | None = None) -> Any:
    """Run ``gm`` under ``recorder`` (with ``below``, the observers' modes, between it and ``fake_mode``);
    with ``priors`` (and ``keys``), reusing an earlier run's costs (``_ReusingInterpreter``);
    ``outs`` is filled with what each node gave (``_spec``), for such a later run."""
    interp = _ReusingInterpreter(gm, recorder, priors, keys, below) if priors is not None \
        else CostInterpreter(gm, recorder, below)
    interp.outs = outs
    with contextlib.ExitStack() as stack:
        for mode in (fake_mode, *below, recorder, torch.no_grad(), quiet()):
            stack.enter_context(mode)
        return interp.run(*call.graph_args(gm))


# --- the entry point -----------------------------------------------------------------------------------

def capture(target: ModelTarget, specs: Sequence[InputSpec], kwargs: dict | None = None,
            dtype: torch.dtype | None = None, method: str = "auto", observers: Sequence[Observer] = (),
            graph: torch.fx.Graph | None = None) -> Captured:
    """Capture and cost a model (see module docstring).

    ``auto`` tries fx, then (when fx fails) one forward pass recorded (in a direct run, else on
    fake tensors), then export when the recording holds an attention written by hand or could
    not run. When neither runs without tensor values, the model runs once for real, after a
    check that its weights fit in memory. ``eager`` records the same way, and runs for real only
    when the model needs values.

    Args:
        target: the resolved model.
        specs: example input shapes/dtypes.
        kwargs: constructor arguments.
        dtype: cast the model (and float inputs) to this dtype.
        method: "auto", or force "fx", "export" or "eager" (a forced capture that fails is an error);
            "direct": the fx capture in a direct run only, for a stage that counts a changed copy and
            goes without where that cannot (``archscan.recommend``'s cut copies).
        observers: what rides the run (``Observer``), each found in ``Captured.observed`` where a
            direct run or the recording on fake tensors ran it.
        graph: with ``direct``, the fx graph of a model of the same structure, run instead of
            tracing this one again: a copy whose changes fx does not trace through (channels cut
            from torch.nn layers, which fx keeps as calls; their weights, read by ``get_attr``,
            are taken from this model) traces to the same graph.
    """
    with capture_context():
        return _capture(target, specs, kwargs or {}, dtype, method, observers, graph)


def _capture(target: ModelTarget, specs: Sequence[InputSpec], kwargs: dict, dtype: torch.dtype | None,
             method: str, observers: Sequence[Observer] = (), graph: torch.fx.Graph | None = None) -> Captured:
    meta = _meta_model(target, kwargs, specs) if method in ("auto", "fx", "eager", "direct") \
        and _direct_allowed(target, specs, dtype) else None
    hooks = strip_user_hooks(meta) if meta is not None else None
    failures: dict[str, str] = {}
    direct_recording = None
    if meta is not None:
        training = _was_training(target)
        captured = _try_direct(meta, specs, hooks, observers, failures, training,
                               graph if method == "direct" else None) if method != "eager" else None
        if captured is not None:
            return captured
        if method == "eager" or (method == "auto" and "fx" in failures):
            direct_recording = _record_direct(meta, specs, observers, target.source_file, failures, hooks, training)
        if direct_recording is not None and (method == "eager" or not writes_attention(direct_recording.gm)):
            direct_recording.notes[:0] = _notes(failures)
            return direct_recording
    if method == "direct":  # a quick count or nothing: no fake tensors (their machinery costs seconds to load)
        raise CaptureError(f"{target.name} cannot be counted by a direct run"
                           + (f": {failures['fx']}" if "fx" in failures else ""))
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = build_fake(target, kwargs, dtype, fake_mode, specs, meta=meta)  # the constructor runs once
    hooks = strip_user_hooks(model) if hooks is None else hooks
    _check_arity(model, specs)
    names, numel, weight_keys, subclasses = _weight_maps(model)
    call = make_call(specs, dtype, fake_mode)

    observed: dict[str, Any] = {}

    def captured(gm, kind, notes=(), syncs=(), real_model=None) -> Captured:
        return Captured(gm, kind, real_model if real_model is not None else model, _notes(failures) + list(notes)
                        + _hook_notes(hooks), names, numel, failures, _was_training(target), tuple(syncs),
                        fake=real_model is None, observed=observed if real_model is None else {})

    if target.program:  # an exported program (.pt2): its graph is the capture, module stacks included
        gm = _try_graph("program", model, call, fake_mode, weight_keys, names, failures, subclasses=subclasses)
        if gm is None:
            raise CaptureError(f"the exported program {target.name} does not run: {failures['program']}")
        return captured(gm, "export")
    if method in ("auto", "fx"):
        gm = _try_graph("fx", model, call, fake_mode, weight_keys, names, failures, subclasses=subclasses)
        if gm is not None:
            return captured(gm, "fx")
    recording = None
    if method in ("auto", "eager") and direct_recording is None:
        try:
            recording, watcher, found = _record(model, call, weight_keys, names, target.source_file, observers, fake_mode,
                                                subclasses=subclasses)
            observed.update(found)
        except CaptureError as exc:
            if not needs_values(exc.__cause__):
                raise  # the model fails on these inputs: a real run would fail the same way
            why = f"the model needs tensor values{at(exc.__cause__, target.source_file)}: {short(exc.__cause__)}"
            failures["eager on fake tensors"] = why
    if recording is not None and (method == "eager" or not writes_attention(recording)):
        return captured(recording, "eager", _EAGER_NOTE, watcher.records())
    if method in ("auto", "export"):
        syncs = SyncWatcher()
        gm = _try_graph("export", model, call, fake_mode, weight_keys, names, failures, syncs, subclasses)
        if gm is not None:
            return captured(gm, "export", syncs=syncs.records())
    if method in ("fx", "export"):
        raise CaptureError(f"--capture {method} failed: {failures.get(method, 'not tried')}",
                           hint="use --capture auto to let archscan fall back to another capture")
    if direct_recording is not None:  # export could not take the model the recording took
        direct_recording.notes[:0] = _notes(failures)
        return direct_recording
    if recording is not None:
        return captured(recording, "eager", _EAGER_NOTE, watcher.records())
    # the model reads tensor values: a real run on seeded random inputs, with real weights
    _check_real_fits(model, specs, dtype, failures)
    real = build_real(target, kwargs, dtype, specs)
    strip_user_hooks(real)
    names, numel, weight_keys, subclasses = _weight_maps(real)
    torch.manual_seed(0)
    call = make_call(specs, dtype)
    gm, watcher, found = _record(real, call, weight_keys, names, target.source_file, observers,  # the memory rides it
                                 subclasses=subclasses)
    taken = gm.meta.get("archscan_taken") or []
    note = ("eager capture: the model reads tensor values, so it ran once for real on seeded random inputs "
            f"({_input_note(specs)}); the analysis covers the path taken for those values"
            + (f" ({'; '.join(dict.fromkeys(taken))})" if taken else ""))
    result = captured(gm, "eager", [note], watcher.records(), real_model=real)
    result.observed.update(found)
    return result


_PRODUCTS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.matmul.default,
                       torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default})
# not aten._safe_softmax: scaled_dot_product_attention's math path (the CPU kernel for shapes its
# flash kernel does not take, such as DeepSeek's 192-wide keys beside 128-wide values) runs it
# between matrix products of its own, and that attention is one call already
_SOFTMAXES = frozenset({torch.ops.aten._softmax.default, torch.ops.aten.softmax.int})


def writes_attention(gm: torch.fx.GraphModule, hops: int = 6) -> bool:
    """Does a softmax sit between two matrix products in ``gm`` (within ``hops`` ops each way), as
    in an attention written by hand? The attention rewrite (``archscan.transform.attention``)
    matches export's ops, so such a model is captured by export: what the scan says of its
    attention is what ``archscan fuse`` then does."""
    return any(n.target in _SOFTMAXES and between_products(n, _PRODUCTS, hops) for n in gm.graph.nodes)


def between_products(node: torch.fx.Node, products, hops: int) -> bool:
    """Does one of ``products`` (op targets) feed ``node`` and another read what it gives, each
    within ``hops`` ops?"""
    def reaches(n: torch.fx.Node, step, left: int) -> bool:
        return any(m.target in products or (left > 1 and reaches(m, step, left - 1)) for m in step(n))
    return reaches(node, lambda m: m.all_input_nodes, hops) and reaches(node, lambda m: list(m.users), hops)


_MODULE_OWN = frozenset(vars(nn.Module()))  # what torch keeps on every module: parameters, hooks, mode


@contextlib.contextmanager
def state_kept(model: nn.Module):
    """The model's own Python state given back as it was after a run: a forward that fills a cache
    on its modules (timm's LeViT keeps its attention biases per device in eval mode) would hand a
    later capture the cached tensor instead of the parameters it is made from. Attributes a module
    gained are removed, replaced ones put back, and dicts, lists and sets refilled in place."""
    saved = [(m, {k: (v, v.copy() if isinstance(v, (dict, list, set)) else None)
                  for k, v in vars(m).items() if k not in _MODULE_OWN}) for m in model.modules()]
    try:
        yield
    finally:
        for module, attrs in saved:
            state = vars(module)
            for k in [k for k in state if k not in _MODULE_OWN and k not in attrs]:
                del state[k]
            for k, (value, contents) in attrs.items():
                state[k] = value
                if contents is not None and not _same_contents(value, contents):
                    try:
                        value.clear()
                        (value.extend if isinstance(value, list) else value.update)(contents)
                    except Exception:  # a container that refuses changes (diffusers' FrozenDict) and was
                        state[k] = contents  # changed all the same: the module gets its old contents back


def _same_contents(value, contents) -> bool:
    """Does a container hold what it held (the same objects)? Only a changed one is refilled: a
    frozen one (diffusers' ``FrozenDict`` config) refuses ``clear`` and ``update``."""
    if len(value) != len(contents):
        return False
    if isinstance(value, dict):
        return all(k in value and value[k] is v for k, v in contents.items())
    if isinstance(value, list):
        return all(a is b for a, b in zip(value, contents))
    return all(x in value for x in contents)  # a set: hashed (a tensor by its identity)


def _direct_allowed(target: ModelTarget, specs: Sequence[InputSpec], dtype: torch.dtype | None) -> bool:
    """A direct run (``archscan.capture.direct``) is tried for a model archscan builds itself, or an
    instance on the CPU whose floating-point weights are float32 (copied with them on the meta
    device; lazy modules need a real first forward), not for a program; in float32, on float32 or
    integer inputs."""
    if direct.MACS <= 0 or target.program or dtype not in (None, torch.float32) \
            or not all(s.dtype in (torch.float32, torch.int64, torch.int32) for s in specs):
        return False
    model = target.instance
    return model is None or (not has_lazy(model) and all(  # (a GPU model's fake copy picks GPU kernels)
        t.device.type == "cpu" and (t.dtype == torch.float32 or not t.is_floating_point())
        for t in [*model.parameters(), *model.buffers()]))


def _meta_model(target: ModelTarget, kwargs: dict, specs: Sequence[InputSpec]) -> nn.Module | None:
    """The model on the meta device for a direct run (built, or an instance copied), or None (the
    fake path builds it)."""
    try:
        model = (meta_instance(target.instance) if target.instance is not None else build_meta(target, kwargs, specs)).eval()
    except Exception:
        return None
    return model if on_meta(model) else None


def _try_direct(model: nn.Module, specs: Sequence[InputSpec], hooks: list[str],
                observers: Sequence[Observer] = (), failures: dict | None = None, training: bool = False,
                graph: torch.fx.Graph | None = None) -> Captured | None:
    """The fx capture of a meta-device ``model`` costed in a direct run (``archscan.capture.direct``: CPU
    activations, meta weights), or None where that cannot give the fake path's answer cheaply:
    the fake path then runs (and says what is wrong, if anything is). Why fx could not trace
    the model goes in ``failures["fx"]``. ``graph``: the traced graph to run instead (``capture``)."""
    try:
        _check_arity(model, specs)
        call = make_call(specs, None)
    except Exception:
        return None
    priors = None
    try:
        if graph is not None:  # a copy, its nodes not yet annotated: the run annotates them
            priors = _PRIORS.get(graph)
            copied = copy.deepcopy(graph)
            for node in copied.nodes:
                node.meta.pop("archscan", None)
            gm = graph_module(model, copied, model.__class__.__name__)
        else:
            with quiet(), state_kept(model):  # tracing runs forward's Python (RWKV rescales its weights once)
                gm = trace_fx(model, call)
    except Exception as exc:
        if failures is not None:
            failures["fx"] = short(exc)
        return None
    if any(n.op == "call_method" and n.target in _READS_VALUES for n in gm.graph.nodes):
        return None
    names, numel, weight_keys, subclasses = _weight_maps(model)
    observers = [o for o in observers if getattr(o, "rides_direct", True)]
    modes = [observer.mode(model) for observer in observers]
    reuse = priors is not None and not modes
    outs = {} if graph is None else None
    try:
        out = _interpret(gm, call, direct.Direct(), OpRecorder(weight_keys, set(names), subclasses), modes,
                         priors=priors if reuse else None, keys={v: k for k, v in names.items()} if reuse else None,
                         outs=outs)
    except Exception:  # the direct run's own limits (meta weights beside CPU inputs: an RNN's fused kernel
        return None    # refuses them) are not the model's: the fake path decides, and names a real input error
    if outs is not None:  # what a later run of this graph (a cut copy's) reuses
        priors = _priors(gm, names, outs)
        if priors is not None:
            _PRIORS[gm.graph] = priors
    observed = {observer.key: observer.result(mode, out, model) for observer, mode in zip(observers, modes)}
    return Captured(gm, "fx", model, _hook_notes(hooks), names, numel, {}, training, (), observed=observed)


def run_again(captured: Captured, specs: Sequence[InputSpec], observer: Observer) -> Any:
    """What ``observer`` finds riding the captured graph's direct run, run once more (an observer
    that does not ride the first run, ``rides_direct = False``, where it turns out to be needed);
    None for a capture that was not a direct run."""
    model = captured.model
    if captured.kind != "fx" or not on_meta(model):
        return None
    names, _, weight_keys, subclasses = _weight_maps(model)
    mode = observer.mode(model)
    out = _interpret(captured.gm, make_call(specs, None), direct.Direct(), OpRecorder(weight_keys, set(names), subclasses), [mode])
    return observer.result(mode, out, model)


_READS_VALUES = frozenset({"tolist", "numpy", "item", "__bool__", "__int__", "__float__", "__index__"})


_EAGER_NOTE = ["eager capture: one forward pass recorded on fake tensors (no values needed, nothing computed)"]


def _record_direct(model: nn.Module, specs: Sequence[InputSpec], observers: Sequence[Observer],
                   source_file: str | None, failures: dict, hooks: list[str], training: bool = False) -> Captured | None:
    """The eager recording (``capture_eager``) of a meta-device ``model`` in a direct run, with the
    observers that ride it, or None where the fake recording must decide (a value read, a budget
    spent, any failure: the direct run stops before an op whose result depends on values, and a
    ``.tolist()`` it would let through is refused here). The caller puts the failures' line first
    in its notes when it takes it.

    The same ops in the same order as on fake tensors (fake tensors behave as the CPU kernels do),
    without the fake tensors' cost: a model written as a Python loop of small ops (HF Mamba's CPU
    path, 22,000 ops at 64 tokens) records in a third of the time."""
    names, numel, weight_keys, subclasses = _weight_maps(model)
    try:
        gm, watcher, observed = _record(model, make_call(specs, None), weight_keys, names, source_file, observers,
                                        below=[direct.Direct(output_bytes=direct.RECORDING_OUTPUT_BYTES)],
                                        home=torch.device("cpu"), subclasses=subclasses)
    except Exception:
        return None
    if watcher.calls:
        return None
    notes = ["eager capture: one forward pass recorded with the weights on the meta device "
             "(no values needed, the matrix products not computed)", *_hook_notes(hooks)]
    return Captured(gm, "eager", model, notes, names, numel, failures, training, (), observed=observed)


def _record(model: nn.Module, call: Call, weight_keys, names, source_file: str | None, observers: Sequence[Observer],
            fake_mode: FakeTensorMode | None = None, below: Sequence[Any] = (), home: torch.device | None = None,
            subclasses: bool = False) -> tuple[torch.fx.GraphModule, SyncWatcher, dict]:
    """``capture_eager`` with the observers that ride it (``eager_mode``) above ``below`` and the
    model's Python state given back after: (graph, the syncs it saw, what the observers found).
    The observers let go of what they hold (hooks) whether or not the model ran; ``CaptureError``
    as ``capture_eager`` raises it."""
    riders = [(o, o.eager_mode(model, call.tensors())) for o in observers if hasattr(o, "eager_mode")]
    watcher = SyncWatcher()
    try:
        with watcher, state_kept(model):
            gm = capture_eager(model, call, weight_keys, set(names), source_file, fake_mode,
                               [*below, *(mode for _, mode in riders)], home, subclasses)
    finally:
        observed = {o.key: o.result(mode, None, model) for o, mode in riders}
    return gm, watcher, observed


def _try_graph(kind: str, model: nn.Module, call: Call, fake_mode, weight_keys, names, failures: dict,
               watcher: SyncWatcher | None = None, subclasses: bool = False) -> torch.fx.GraphModule | None:
    """Trace with fx or export and cost the graph on fake tensors; None (and ``failures[kind]``)
    when it does not work. A model that rejects its inputs is an input error, raised."""
    try:
        with quiet(), watcher or contextlib.nullcontext(), state_kept(model):
            gm = (model if kind == "program" else trace_fx(model, call) if kind == "fx"
                  else trace_export(model, call))
    except Exception as exc:
        failures[kind] = (f"the model needs tensor values{at(exc)}" if kind == "export"
                          and needs_values(exc) else short(exc))
        return None
    recorder = OpRecorder(weight_keys, set(names), subclasses)
    try:
        _interpret(gm, call, fake_mode, recorder)
    except _NodeFailure as failure:
        if needs_values(failure.exc):
            failures[kind] = f"needs tensor values at {source_of(failure.node) or failure.node.name}: {short(failure.exc)}"
            return None
        if _model_rejects(model, call, fake_mode):
            raise _rejected(failure, model, call) from failure.exc
        failures[kind] = f"graph did not run: {short(failure.exc)}"
        return None
    return gm


def _rejected(failure: _NodeFailure, model: nn.Module, call: Call) -> ArchscanError:
    """The error for a model that rejects its example inputs."""
    hint = f"inputs were {shape_str(call.tensors())}"
    if "Long, Int" in str(failure.exc):
        hint += "; token ids need an integer dtype, e.g. --input 1,128:int64"
    return ArchscanError(failure.describe(type(model).__name__), hint=hint)


@contextlib.contextmanager
def seeded_rng():
    """Seed torch's RNG (random inputs, weight initialisers, the model's own sampling) so a scan
    is repeatable, and give the caller back the RNG state it had."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(0)
        yield


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while a scan runs, as it is for the whole of an
    ``archscan`` command (``cli.entry``), and back on after. A recording makes a graph node and a
    handful of containers per executed op, and the collector would walk that growing graph again
    and again (HF Mamba-130m, 22,000 ops: 25% of the recording). Lifetimes are then the reference
    counts' in the library as in the command: a tensor in a reference cycle stays live until the
    scan ends, where it would otherwise die at an unpredictable moment."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def capture_context():
    """What every capture runs under: a seeded RNG (see ``seeded_rng``), fused fast paths off (see
    README "Capture": fx, export and eager then see the same ops), and the global module hooks
    the user registered set aside (``building.global_hooks_set_aside``).

    One op runs first under a dispatch mode: a process's first such op imports ``torch._dynamo``
    (torch wraps every mode's dispatch), and inside a model's forward that import keeps its frames,
    and the tensors they hold, alive (a memory peak off on the first scan of a process)."""
    with direct.Direct():
        torch.zeros(())
    fastpath = torch.backends.mha.get_fastpath_enabled()
    with seeded_rng(), global_hooks_set_aside():
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            yield
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)


def _hook_notes(removed: list[str]) -> list[str]:
    if not removed:
        return []
    where = ", ".join(sorted(set(removed))[:3]) + (", ..." if len(set(removed)) > 3 else "")
    return [f"{len(removed)} forward hook(s) on the model ({where}) were not run: the analysis covers forward itself"]


def _input_note(specs: Sequence[InputSpec]) -> str:
    """Which values the real run used, input by input kind."""
    def kind(s: InputSpec) -> str:
        if s.example is not None:
            return "the example tensors' values"
        if s.dtype.is_floating_point:
            return "floats ~ N(0, 1)"
        if s.values is not None:
            return f"integers uniform in {s.values[0]}..{s.values[1]}"
        return "integers all 0 (give others: --input SHAPE:int64=LOW..HIGH)"
    return "torch.manual_seed(0); " + ", ".join(sorted({kind(s) for s in specs}))


def _check_real_fits(model: nn.Module | None, specs: Sequence[InputSpec], dtype: torch.dtype | None,
                     failures: dict[str, str]) -> None:
    """The eager capture allocates real weights and inputs: fail with one line, before allocating,
    when they would not fit in the memory that is free. ``model`` (fake or real) gives the weights."""
    inputs = sum(math.prod(s.shape) * s.dtype.itemsize for s in specs)
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers())) if model is not None else 0
    need = inputs + weights
    avail = short_of(need)
    if avail is not None:
        why = "; ".join(f"{k}: {v}" for k, v in failures.items()) or "forced with --capture eager"
        fix = ("use a smaller --input, or make the model traceable" if weights < avail
               else f"the weights alone take {weights / 2**30:.1f} GiB: make the model traceable (fx or export), "
                    "or scan a smaller configuration of it (--kwargs)")
        raise DeviceError(f"eager capture needs a real run ({need / 2**30:.1f} GiB of inputs and weights) but "
                          f"{avail / 2**30:.1f} GiB is free; it was taken because {why}", hint=fix)


_FX_WORDS = (  # what torch.fx's symbolic tracer says, in words: its proxies cannot do what the code does
    ("co_varnames is too small", "its code takes *args/**kwargs in a form symbolic tracing cannot follow"),
    ("__cuda_array_interface__", "the code hands a traced value to a function that needs a real tensor"),
    ("symbolically traced variables cannot be used as inputs to control flow", "the code branches on a tensor's value"),
    ("Proxy object cannot be iterated", "the code iterates over a tensor"),
)


def _in_words(kind: str, why: str) -> str:
    """A capture's failure as users read it: fx's internal messages said in words, the original kept short."""
    if kind == "fx":
        for needle, words in _FX_WORDS:
            if needle in why:
                return f"symbolic tracing could not follow it: {words}"
    return why


def _notes(failures: dict[str, str]) -> list[str]:
    """One line naming the captures that failed or were skipped, and why (none when nothing failed)."""
    return ["; ".join(f"{k} skipped ({v.removeprefix('skipped: ')})" if v.startswith("skipped: ")
                      else f"{k} failed ({_in_words(k, v)})" for k, v in failures.items())] if failures else []


def _was_training(target: ModelTarget) -> bool:
    """Was the module handed over in train mode? (An exported program's module always says it is:
    its graph was traced in the mode the model had then.)"""
    return target.instance is not None and not target.program and any(
        m.training for m in target.instance.modules() if not type(m).__module__.startswith(_QUANTIZED_MODULES))


# torch.ao's quantized modules: ``quantize_dynamic`` and ``convert`` make them in train mode whatever the
# model's mode (torch's swap does not carry it over), and their forward is the same in either
_QUANTIZED_MODULES = ("torch.ao.nn.quantized.", "torch.nn.quantized.")


def _check_arity(model: nn.Module, specs: Sequence[InputSpec]) -> None:
    """One clear message when the --input list does not fit forward's signature."""
    params = _forward_params(model)
    if params is None:
        return
    forward = f"{type(model).__name__}.forward"
    specs = _arguments(specs)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    any_name = any(p.kind == p.VAR_KEYWORD for p in params)
    n_pos = sum(1 for s in specs if not s.name)
    names = [s.name for s in specs if s.name]
    first_named = next((i for i, s in enumerate(specs) if s.name), len(specs))
    if any(not s.name for s in specs[first_named:]):
        raise ArchscanError("a positional --input follows a named one", hint="give positional inputs first, in order")
    for name in names:
        if names.count(name) > 1:
            raise ArchscanError(f"--input {name}= is given twice", hint="name each forward argument once")
        if name not in by_name and not any_name:
            raise ArchscanError(f"{forward} has no argument {name!r}",
                                hint=f"its arguments are: {', '.join(p.name for p in params) or 'none'}")
        if name in [p.name for p in positional[:n_pos]]:
            raise ArchscanError(f"--input {name}= names an argument a positional --input already fills",
                                hint="give each forward argument once, by position or by name")
    given = {p.name for p in positional[:n_pos]} | set(names)
    missing = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                                             p.KEYWORD_ONLY) and p.name not in given]
    most = float("inf") if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
    if missing or n_pos > most:
        required = sum(1 for p in positional if p.default is p.empty)
        want = (f"{required}" if required == most else f"at least {required}" if most == float("inf")
                else f"{required} to {most}")
        raise ArchscanError(
            f"{forward} takes {want} input(s) ({', '.join(p.name for p in positional)}) "
            f"but {len(specs)} --input {'was' if len(specs) == 1 else 'were'} given"
            + (f"; {', '.join(missing)} missing" if missing and names else ""),
            hint="pass one --input per tensor argument, in order, or by name: --input attention_mask=1,128:int64",
        )


def _arguments(specs: Sequence[InputSpec]) -> list[InputSpec]:
    """One spec per forward argument: the tensors of a nested one (a list of images) count once."""
    seen, out = set(), []
    for s in specs:
        key = (s.name, s.arg, bool(s.path)) if s.path else id(s)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def _model_rejects(model: nn.Module, call: Call, fake_mode) -> bool:
    """Does the model itself (not just its traced graph) fail on these fake inputs (or in a direct run)?"""
    try:  # under a recorder: it makes the checks the fake kernels of older torch skip
        with fake_mode, OpRecorder(set(), set()), torch.no_grad(), quiet():
            call(model)
    except direct.Stop:
        return False
    except Exception:
        return True
    return False
