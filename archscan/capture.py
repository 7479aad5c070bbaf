"""Capture a model as a torch.fx graph whose nodes carry per-op costs.

Three ways, tried in order; the report names the one used:

* ``fx``: ``torch.fx`` symbolic tracing (module-level graph, leaf modules kept whole).
* ``export``: ``torch.export.export(strict=False)`` when the Python code defeats symbolic
  tracing (e.g. shape-dependent control flow); aten-level graph with the module stack kept.
* ``eager``: when both fail (tensor-valued control flow such as ``if x.mean() > 0`` or
  ``.item()`` in a condition), the model runs once on a real random input under a
  ``TorchDispatchMode`` that records every aten op with its module (the way
  ``torch.utils.flop_counter.FlopCounterMode`` attributes FLOPs); the graph is rebuilt from
  tensor identity. It covers the path taken for that input.

``fx`` and ``export`` run on fake tensors (``FakeTensorMode``): no weights are allocated and
nothing is computed, so a 70B-parameter model is analysed in seconds on a laptop.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .costs import OpCost, cost_op, storage_key, tensors_in
from .errors import ArchscanError, CaptureError
from .loading import InputSpec, ModelTarget, user_frame

_THIS_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


@dataclass
class NodeCosts:
    """What one graph node executed: its aten ops with costs, the params it read first."""

    ops: list[OpCost] = field(default_factory=list)
    param_keys: set = field(default_factory=set)
    out_shape: tuple[int, ...] | None = None
    out_dtype: torch.dtype | None = None


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


class OpRecorder(TorchDispatchMode):
    """Costs every aten op executed while active, into the current ``NodeCosts``."""

    def __init__(self, weight_keys: set, param_keys: set):
        super().__init__()
        self.weight_keys = weight_keys
        self.param_keys = param_keys
        self.current: NodeCosts | None = None
        self.on_op = None  # optional callback(func, args, kwargs, out, cost)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "prim":  # prim.device and friends: metadata queries, no work
            return out
        cost = cost_op(func, args, kwargs, out, self.weight_keys)
        if self.current is not None:
            self.current.ops.append(cost)
            if cost.weight_bytes:
                self.current.param_keys |= self.params_read(args, kwargs)
        if self.on_op is not None:
            self.on_op(func, args, kwargs, out, cost)
        return out

    def params_read(self, args, kwargs) -> set:
        """Storage keys of the model parameters among an op's arguments."""
        return {k for k in map(storage_key, tensors_in((args, kwargs))) if k in self.param_keys}


def _first_tensor(value) -> torch.Tensor | None:
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            return leaf
    return None


def _shape_str(value) -> str:
    shapes = [list(t.shape) for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]
    return ", ".join(str(s) for s in shapes) if shapes else "no tensors"


@contextlib.contextmanager
def _quiet():
    """Silence torch's logging and warnings while a capture attempt may fail noisily."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def source_of(node: torch.fx.Node) -> str | None:
    """'file.py:LINE' of the user code that produced a node, from its recorded stack trace."""
    trace = node.meta.get("stack_trace") or ""
    best = None
    for line in trace.splitlines():
        line = line.strip()
        if line.startswith("File "):
            try:
                fname = line.split('"')[1]
                lineno = int(line.split("line ")[1].split(",")[0])
            except (IndexError, ValueError):
                continue
            if not fname.startswith(_TORCH_DIR) and not fname.startswith(_THIS_DIR) and "<" not in fname:
                best = (fname, lineno)
    if best is None:
        return None
    fname, lineno = best
    try:
        rel = os.path.relpath(fname)
        fname = rel if not rel.startswith("..") else fname
    except ValueError:
        pass
    return f"{fname}:{lineno}"


def module_stack(node: torch.fx.Node) -> list[tuple[str, str]]:
    """[(module path, type name)] from outermost to innermost, for fx/export/eager nodes."""
    stack = node.meta.get("nn_module_stack") or {}
    out = []
    for value in stack.values():
        path, typ = value[0], value[1]
        typ = typ.__name__ if isinstance(typ, type) else str(typ).rsplit(".", 1)[-1]
        path = path.replace("L__self__.", "").replace("L['self'].", "")
        if path in ("L__self__", "L['self']"):
            path = ""
        out.append((path, typ))
    return out


# --- model construction ---------------------------------------------------------------------------

def _weight_maps(model: nn.Module) -> tuple[dict, dict, set]:
    names, numel, weight_keys = {}, {}, set()
    for name, p in model.named_parameters(remove_duplicate=True):
        k = storage_key(p)
        names.setdefault(k, name)
        numel.setdefault(k, p.numel())
        weight_keys.add(k)
    for _, b in model.named_buffers():
        weight_keys.add(storage_key(b))
    return names, numel, weight_keys


def _fake_copy(model: nn.Module, fake_mode: FakeTensorMode) -> nn.Module:
    """A copy of a user's module whose tensors are fake; the original is left untouched."""
    memo: dict[int, Any] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in memo:
            fake = fake_mode.from_tensor(t.detach())
            memo[id(t)] = nn.Parameter(fake, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else fake
    return copy.deepcopy(model, memo)


def _meta_to_fake(model: nn.Module, fake_mode: FakeTensorMode) -> nn.Module:
    """Wrap a meta-device model's tensors as fake CPU tensors (shared ones stay shared)."""
    cpu = torch.device("cpu")
    memo: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            if not t.is_meta:
                raise ValueError("a tensor of the model is not on the meta device")
            memo[id(t)] = FakeTensor(fake_mode, t.detach(), cpu)
        return memo[id(t)]

    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = _as_parameter(fake(p))
        for name, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[name] = fake(b)
    return model


def _as_parameter(t: torch.Tensor) -> torch.Tensor:
    """Mark a fake tensor as a parameter.

    ``nn.Parameter(subclass_tensor)`` returns the subclass instance flagged ``_is_param``
    (that is how ``isinstance(x, nn.Parameter)`` works for tensor subclasses); setting the flag
    directly skips a dispatched ``detach`` and is 15x faster, which matters on small networks.
    """
    t._is_param = True
    return t if isinstance(t, nn.Parameter) else nn.Parameter(t, requires_grad=False)


def _fakeify(model: nn.Module, fake_mode: FakeTensorMode) -> nn.Module:
    """Replace a real model's parameters and buffers with fake tensors (shared ones stay shared)."""
    memo: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            memo[id(t)] = fake_mode.from_tensor(t)
        return memo[id(t)]

    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = nn.Parameter(fake(p.detach()), requires_grad=p.requires_grad)
        for name, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[name] = fake(b)
    return model


_INIT_METHODS = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.fill_, torch.Tensor.zero_,
                 torch.Tensor.random_, torch.Tensor.exponential_, torch.Tensor.bernoulli_, torch.Tensor.copy_,
                 torch.Tensor.clamp_, torch.Tensor.erfinv_, torch.Tensor.mul_, torch.Tensor.add_, torch.Tensor.div_}


class _SkipInit(TorchFunctionMode):
    """Turns in-place writes into no-ops while a model is built on the meta device.

    Meta tensors hold no values, so initialisers (``normal_``, ``uniform_``, ``fill_``...) have
    nothing to do; on meta they still run shape-checking Python reference code, which costs more
    than the rest of building a small network.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _INIT_METHODS and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            return args[0]
        return func(*args, **(kwargs or {}))


def build_fake(target: ModelTarget, kwargs: dict, dtype: torch.dtype | None, fake_mode: FakeTensorMode) -> nn.Module:
    """Construct the model without allocating weights (fake tensors)."""
    if target.instance is not None:
        return _prepare(_fake_copy(target.instance, fake_mode), dtype, fake_mode)
    try:
        # Built on the meta device (initialisers are no-ops there), then each tensor is wrapped
        # as a fake CPU tensor so kernels are chosen as on a CPU (fused attention paths).
        with torch.device("meta"), _SkipInit(), _quiet():
            model = target.build(kwargs)
        return _prepare(_meta_to_fake(model, fake_mode), dtype, fake_mode)
    except ArchscanError:
        raise
    except Exception:
        pass
    try:
        with fake_mode, _quiet():
            model = target.build(kwargs)
        return _prepare(model, dtype, fake_mode)
    except ArchscanError:
        raise
    except Exception:
        pass  # the constructor needs real values (e.g. .tolist() on a tensor): build for real
    model = build_real(target, kwargs, None)
    return _prepare(_fakeify(model, fake_mode), dtype, fake_mode)


def build_real(target: ModelTarget, kwargs: dict, dtype: torch.dtype | None) -> nn.Module:
    """Construct the model with real weights on the CPU."""
    try:
        model = copy.deepcopy(target.instance) if target.instance is not None else target.build(kwargs)
    except ArchscanError:
        raise
    except Exception as exc:
        raise CaptureError(
            f"building {target.name} failed at {user_frame(exc, target.source_file)}: {type(exc).__name__}: {exc}"
        ) from exc
    model.eval()
    if dtype is not None:
        model.to(dtype)
    return model


def _prepare(model: nn.Module, dtype: torch.dtype | None, fake_mode: FakeTensorMode) -> nn.Module:
    model.eval()
    if dtype is not None:
        with fake_mode:
            _cast(model, dtype)
    return model


def _cast(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast floating-point parameters and buffers in place, keeping shared tensors shared.

    (``Module.to`` swaps tensors, which fake parameters of a copied module do not allow.)
    """
    memo: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for store in (mod._parameters, mod._buffers):
            for name, t in list(store.items()):
                if t is None or not t.is_floating_point():
                    continue
                if id(t) not in memo:
                    cast = t.detach().to(dtype)
                    memo[id(t)] = nn.Parameter(cast, t.requires_grad) if isinstance(t, nn.Parameter) else cast
                store[name] = memo[id(t)]


def make_inputs(specs: Sequence[InputSpec], model_dtype: torch.dtype | None, fake_mode=None) -> list[torch.Tensor]:
    """Random float inputs, zero integer inputs (valid token ids), in the model's dtype."""
    ctx = fake_mode if fake_mode is not None else contextlib.nullcontext()
    out = []
    with ctx:
        for s in specs:
            if s.dtype.is_floating_point:
                dt = model_dtype if (model_dtype is not None and s.dtype == torch.float32) else s.dtype
                out.append(torch.randn(s.shape, dtype=dt))
            else:
                out.append(torch.zeros(s.shape, dtype=s.dtype))
    return out


# --- fx and export ---------------------------------------------------------------------------------

class _Tracer(torch.fx.Tracer):
    """fx tracer that records the user's file:line for each node (cheaper than fx's own stacks)."""

    def create_proxy(self, *args, **kwargs):
        proxy = super().create_proxy(*args, **kwargs)
        proxy.node.stack_trace = _python_stack()
        return proxy


def trace_fx(model: nn.Module) -> torch.fx.GraphModule:
    """torch.fx symbolic trace with stack traces recorded (for file:line in findings)."""
    tracer = _Tracer()
    graph = tracer.trace(model)
    return torch.fx.GraphModule(tracer.root, graph, model.__class__.__name__)


def trace_export(model: nn.Module, inputs: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """torch.export (non-strict) on fake tensors; the unlifted module keeps nn_module_stack."""
    ep = torch.export.export(model, tuple(inputs), strict=False)
    return ep.module()


class CostInterpreter(torch.fx.Interpreter):
    """Runs the graph on fake tensors, costing each node's aten ops into ``node.meta['archscan']``."""

    def __init__(self, gm: torch.fx.GraphModule, recorder: OpRecorder):
        super().__init__(gm, garbage_collect_values=True)
        self.recorder = recorder

    def run_node(self, n: torch.fx.Node) -> Any:
        costs = NodeCosts()
        self.recorder.current = costs
        try:
            result = super().run_node(n)
        except Exception as exc:
            raise _NodeFailure(n, self._input_shapes(n), exc) from exc
        finally:
            self.recorder.current = None
        t = _first_tensor(result)
        if t is not None:
            costs.out_shape, costs.out_dtype = tuple(int(s) for s in t.shape), t.dtype
        n.meta["archscan"] = costs
        return result

    def _input_shapes(self, n: torch.fx.Node) -> str:
        vals = [self.env.get(a) for a in n.all_input_nodes if a in self.env]
        return _shape_str(vals)


class _NodeFailure(Exception):
    def __init__(self, node: torch.fx.Node, shapes: str, exc: BaseException):
        super().__init__(str(exc))
        self.node, self.shapes, self.exc = node, shapes, exc

    def describe(self) -> str:
        if self.node.op == "placeholder":
            return f"input {self.node.name!r} could not be bound: {str(self.exc).strip().splitlines()[0]}"
        stack = module_stack(self.node)
        where = f"layer {stack[-1][0]!r} ({stack[-1][1]})" if stack and stack[-1][0] else f"node {self.node.name!r}"
        if self.node.op == "call_module":
            sub = self.node.graph.owning_module.get_submodule(self.node.target)
            where = f"layer {self.node.target!r} ({type(sub).__name__})"
        src = source_of(self.node)
        msg = str(self.exc).strip().splitlines()[0] if str(self.exc).strip() else type(self.exc).__name__
        return f"{where}{' at ' + src if src else ''} rejected input of shape {self.shapes}: {msg}"


def _interpret(gm, inputs, fake_mode, recorder) -> None:
    interp = CostInterpreter(gm, recorder)
    with fake_mode, recorder, torch.no_grad(), _quiet():
        interp.run(*inputs)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


# --- eager -------------------------------------------------------------------------------------------

class _EagerGraphBuilder:
    """Builds an fx graph from the aten ops a real run executes (data flow by tensor identity)."""

    def __init__(self, model: nn.Module, inputs: Sequence[torch.Tensor], recorder: OpRecorder):
        self.model = model
        self.graph = torch.fx.Graph()
        self.produced: dict[int, torch.fx.Node] = {}
        self.keep: list[Any] = []  # keep outputs alive so ids stay unique
        self.attr_nodes: dict[Any, torch.fx.Node] = {}
        self.weights = {}
        for name, p in model.named_parameters():
            self.weights.setdefault(storage_key(p), name)
        for name, b in model.named_buffers():
            self.weights.setdefault(storage_key(b), name)
        for i, x in enumerate(inputs):
            node = self.graph.placeholder(f"input_{i}")
            self.produced[id(x)] = node
            node.meta["archscan_out"] = x
        self.names = {id(m): n for n, m in model.named_modules()}
        self.stack: list[nn.Module] = []
        self.recorder = recorder
        recorder.on_op = self.on_op
        self.last_node: torch.fx.Node | None = None

    def _arg(self, a):
        if isinstance(a, torch.Tensor):
            if id(a) in self.produced:
                return self.produced[id(a)]
            k = storage_key(a)
            if k in self.weights:
                if k not in self.attr_nodes:
                    self.attr_nodes[k] = self.graph.get_attr(self.weights[k])
                return self.attr_nodes[k]
            return f"<tensor {list(a.shape)}>"
        if isinstance(a, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return a
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        return repr(a)

    def on_op(self, func, args, kwargs, out, cost):
        node = self.graph.call_function(func, self._arg(tuple(args)), {k: self._arg(v) for k, v in kwargs.items()})
        stack = {}
        for m in self.stack:
            path = self.names.get(id(m), "")
            stack[path or "L__self__"] = (path, type(m).__name__)
        node.meta["nn_module_stack"] = stack
        node.meta["stack_trace"] = _python_stack()
        costs = NodeCosts(ops=[cost], param_keys=self.recorder.params_read(args, kwargs) if cost.weight_bytes else set())
        t = _first_tensor(out)
        if t is not None:
            costs.out_shape, costs.out_dtype = tuple(int(s) for s in t.shape), t.dtype
        node.meta["archscan"] = costs
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.produced[id(leaf)] = node
                self.keep.append(leaf)
        self.last_node = node

    def pre_hook(self, module, args):
        self.stack.append(module)

    def post_hook(self, module, args, output):
        if self.stack and self.stack[-1] is module:
            self.stack.pop()

    def finish(self, out) -> torch.fx.GraphModule:
        self.graph.output(self._arg(out) if isinstance(out, (torch.Tensor, tuple, list)) else None)
        return torch.fx.GraphModule(self.model, self.graph, self.model.__class__.__name__)


def _python_stack() -> str:
    """The innermost user frame now executing, as an fx ``stack_trace`` line."""
    frame = sys._getframe(1)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not fname.startswith(_TORCH_DIR) and not fname.startswith(_THIS_DIR) and "<" not in fname:
            return f'  File "{fname}", line {frame.f_lineno}, in {frame.f_code.co_name}'
        frame = frame.f_back
    return ""


def capture_eager(model: nn.Module, inputs: Sequence[torch.Tensor], weight_keys: set, param_keys: set,
                  source_file: str | None) -> torch.fx.GraphModule:
    """Run the real model once, recording every aten op with its module."""
    recorder = OpRecorder(weight_keys, param_keys)
    builder = _EagerGraphBuilder(model, inputs, recorder)
    pre = nn.modules.module.register_module_forward_pre_hook(builder.pre_hook)
    post = nn.modules.module.register_module_forward_hook(builder.post_hook)
    try:
        with torch.no_grad(), recorder, _quiet():
            out = model(*inputs)
    except Exception as exc:
        where = ""
        if builder.stack:
            m = builder.stack[-1]
            where = f" in layer {builder.names.get(id(m), '')!r} ({type(m).__name__})"
        raise CaptureError(
            f"the model cannot run{where} at {user_frame(exc, source_file)}: {_short(exc)}"
        ) from exc
    finally:
        pre.remove()
        post.remove()
        recorder.on_op = None
    return builder.finish(out)


# --- the entry point -----------------------------------------------------------------------------------

def capture(target: ModelTarget, specs: Sequence[InputSpec], kwargs: dict | None = None,
            dtype: torch.dtype | None = None, method: str = "auto") -> Captured:
    """Capture and cost a model: fx, then export, then eager (see module docstring).

    Args:
        target: the resolved model.
        specs: example input shapes/dtypes.
        kwargs: constructor arguments.
        dtype: cast the model (and float inputs) to this dtype.
        method: "auto", or force "fx", "export" or "eager".
    """
    kwargs = kwargs or {}
    failures: dict[str, str] = {}
    notes: list[str] = []
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    if method in ("auto", "fx", "export"):
        model = build_fake(target, kwargs, dtype, fake_mode)
        _check_arity(model, specs)
        names, numel, weight_keys = _weight_maps(model)
        inputs = make_inputs(specs, dtype, fake_mode)
        for kind in ("fx", "export"):
            if method not in ("auto", kind):
                continue
            try:
                with _quiet():
                    gm = trace_fx(model) if kind == "fx" else trace_export(model, inputs)
            except Exception as exc:
                failures[kind] = _short(exc)
                continue
            recorder = OpRecorder(weight_keys, set(names))
            try:
                _interpret(gm, inputs, fake_mode, recorder)
            except _NodeFailure as failure:
                if _data_dependent(failure.exc):
                    # .item(), nonzero(), ...: values fake tensors do not have; a real run will
                    failures[kind] = f"needs tensor values at {source_of(failure.node) or failure.node.name}: {_short(failure.exc)}"
                    failures.setdefault("export", "skipped: the model needs tensor values")
                    break
                if _model_rejects(model, inputs, fake_mode):
                    hint = f"inputs were {_shape_str(inputs)}"
                    if "Long, Int" in str(failure.exc):
                        hint += "; token ids need an integer dtype, e.g. --input 1,128:int64"
                    raise ArchscanError(failure.describe(), hint=hint) from failure.exc
                failures[kind] = f"graph did not run: {_short(failure.exc)}"
                continue
            if failures:
                notes.append("; ".join(f"{k} failed ({v})" for k, v in failures.items()))
            return Captured(gm, kind, model, notes, names, numel, failures, _was_training(target))
    # eager: a real run on a random input
    model = build_real(target, kwargs, dtype)
    _check_arity(model, specs)
    names, numel, weight_keys = _weight_maps(model)
    inputs = make_inputs(specs, dtype)
    gm = capture_eager(model, inputs, weight_keys, set(names), target.source_file)
    notes.append("; ".join(f"{k} failed ({v})" for k, v in failures.items()))
    notes.append("eager capture: the analysis covers the path the model took for one random input")
    return Captured(gm, "eager", model, [n for n in notes if n], names, numel, failures, _was_training(target))


def _was_training(target: ModelTarget) -> bool:
    return target.instance is not None and any(m.training for m in target.instance.modules())


_DATA_DEPENDENT = ("DataDependentOutputException", "DynamicOutputShapeException", "GuardOnDataDependentSymNode",
                   "UnsupportedOperatorException", "DataDependentOutputError")


def _data_dependent(exc: BaseException) -> bool:
    """Did a fake-tensor run fail because it needed real tensor values?"""
    while exc is not None:
        if type(exc).__name__ in _DATA_DEPENDENT:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _check_arity(model: nn.Module, specs: Sequence[InputSpec]) -> None:
    """One clear message when the number of --input does not fit forward's signature."""
    import inspect

    try:
        params = list(inspect.signature(model.forward).parameters.values())  # bound: no self
    except (TypeError, ValueError):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    most = float("inf") if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
    if not required <= len(specs) <= most:
        want = (f"{required}" if required == most else f"at least {required}" if most == float("inf")
                else f"{required} to {most}")
        raise ArchscanError(
            f"{type(model).__name__}.forward takes {want} input(s) ({', '.join(p.name for p in positional)}) "
            f"but {len(specs)} --input {'was' if len(specs) == 1 else 'were'} given",
            hint="pass one --input per tensor argument, in order",
        )


def _model_rejects(model: nn.Module, inputs, fake_mode) -> bool:
    """Does the model itself (not just its traced graph) fail on these fake inputs?"""
    try:
        with fake_mode, torch.no_grad(), _quiet():
            model(*inputs)
    except Exception:
        return True
    return False
