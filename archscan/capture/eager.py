"""The eager capture: run the model once and rebuild its graph from the aten ops it executes.

For models that defeat torch.fx and torch.export: a ``TorchDispatchMode`` records every aten op
with its module (forward hooks keep the module stack) and data flow follows tensor identity.
It runs on fake tensors when the model does not need values (nothing is computed or
allocated); a model whose forward reads values (``.item()``, tensor-valued ``if``) runs for
real, and the graph covers the path taken for that input.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from typing import Any, Sequence

import torch
import torch.fx
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ..load.building import Call, nested_tensors
from ..costs import storage_key, tensors_in
from ..errors import CaptureError
from ..load.frames import at, short
from .graphmodule import graph_module
from ..load.recording import NodeCosts, OpRecorder, first_tensor, output_tensors, python_stack, quiet


_PLAIN_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_PLAIN = frozenset(_PLAIN_TYPES)  # the exact types, for the common case


class _EagerGraphBuilder:
    """Builds an fx graph from the aten ops a real run executes (data flow by tensor identity)."""

    def __init__(self, model: nn.Module, call: Call, recorder: OpRecorder, home: torch.device | None = None):
        self.model = model
        self.home = home  # the device meta tensors stand for (a direct run's weights), or None
        self.graph = torch.fx.Graph()
        # id(tensor) -> (a weak reference to it, the node that made it): a tensor is freed when the
        # model lets it go, as in its own run (a memory tracker riding the recording sees the same
        # lifetimes); an id a freed tensor left to a new one is told apart by its reference
        self.produced: dict[int, tuple[weakref.ref, torch.fx.Node]] = {}
        self.attr_nodes: dict[Any, torch.fx.Node] = {}
        self.weights = {}
        for name, p in model.named_parameters():
            self.weights.setdefault(storage_key(p), name)
        for name, b in model.named_buffers():
            self.weights.setdefault(storage_key(b), name)
        for name, x in [*((f"input_{i}", x) for i, x in enumerate(call.args)), *call.kwargs.items()]:
            for where, t in nested_tensors(x):  # a list of images: a placeholder for each
                self._made(t, self.graph.placeholder(name + re.sub(r"\W+", "_", where).rstrip("_")))
        self.names = {id(m): n for n, m in model.named_modules()}
        self.stack: list[nn.Module] = []
        self.stack_meta: dict | None = None  # the nn_module_stack of the modules in ``stack``
        self.recorder = recorder
        recorder.on_op = self.on_op

    def _arg(self, a):
        kind = type(a)
        if kind in _PLAIN:
            return a
        if kind is tuple or kind is list:  # an op's arguments, a shape, a list of tensors
            return a if all(type(x) in _PLAIN for x in a) else kind([self._arg(x) for x in a])
        if isinstance(a, torch.Tensor):
            made = self.produced.get(id(a))
            if made is not None and made[0]() is a:
                return made[1]
            k = storage_key(a)
            if k in self.weights:
                if k not in self.attr_nodes:
                    self.attr_nodes[k] = self.graph.get_attr(self.weights[k])
                return self.attr_nodes[k]
            return f"<tensor {list(a.shape)}>"
        if isinstance(a, _PLAIN_TYPES):  # their subclasses (an IntEnum)
            return a
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        return repr(a)

    def _device(self, device) -> torch.device:
        device = torch.device(device)
        return self.home if self.home is not None and device.type == "meta" else device

    def on_op(self, func, args, kwargs, out, costs):
        if kwargs.get("device") is not None:
            device = self._device(kwargs["device"])
            if func is torch.ops.aten._to_copy.default and args and isinstance(args[0], torch.Tensor) \
                    and device == self._device(args[0].device):
                # `.to(device=x.device, dtype=...)` of a tensor already there: a cast, no move (export
                # records no device either); the rules read a device here as a copy between devices
                kwargs = {k: v for k, v in kwargs.items() if k != "device"}
            else:
                kwargs = {**kwargs, "device": device}
        node = self.graph.call_function(func)
        # arguments set on the node, not passed to call_function: Graph.create_node walks them with
        # pytree looking for symbolic ints, which a recording never holds (a quarter of the time
        # a long recording spends building its graph)
        node.args = self._arg(tuple(args))
        if kwargs:
            node.kwargs = {k: self._arg(v) for k, v in kwargs.items()}
        if self.stack_meta is None:  # one dict per stretch of ops in the same module (read only)
            self.stack_meta = {}
            for m in self.stack:
                path = self.names.get(id(m), "")
                self.stack_meta[path or "L__self__"] = (path, type(m).__name__)
        node.meta["nn_module_stack"] = self.stack_meta
        node.meta["stack_trace"] = python_stack()
        costs = NodeCosts(ops=list(costs), param_keys=self.recorder.params_read(args, kwargs)
                          if any(c.weight_bytes for c in costs) else set())
        t = first_tensor(out)
        if t is not None:
            costs.out_shape, costs.out_dtype = tuple(int(s) for s in t.shape), t.dtype
        node.meta["archscan"] = costs
        for leaf in tensors_in(out):
            self._made(leaf, node)

    def _made(self, tensor: torch.Tensor, node: torch.fx.Node) -> None:
        self.produced[id(tensor)] = (weakref.ref(tensor), node)

    def pre_hook(self, module, args):
        self.stack.append(module)
        self.stack_meta = None

    def post_hook(self, module, args, output):
        if self.stack and self.stack[-1] is module:
            self.stack.pop()
            self.stack_meta = None

    def finish(self, out) -> torch.fx.GraphModule:
        self.graph.output(tuple(self._arg(t) for t in output_tensors(out)))
        return graph_module(self.model, self.graph, self.model.__class__.__name__)


def capture_eager(model: nn.Module, call: Call, weight_keys: set, param_keys: set,
                  source_file: str | None, fake_mode: FakeTensorMode | None = None,
                  below: Sequence[Any] = (), home: torch.device | None = None,
                  subclass_weights: bool = False) -> torch.fx.GraphModule:
    """Run the model once, recording every aten op with its module: on fake tensors under
    ``fake_mode`` (nothing computed; fails where the model needs values), else for real.
    ``below``: dispatch modes (observers', a direct run's) stacked between the tensors and the
    recorder. ``home``: the device the model's meta tensors stand for (a direct run's weights).
    ``subclass_weights``: the model holds tensor-subclass weights (``OpRecorder``).

    Raises:
        CaptureError: the model failed; its ``__cause__`` is the model's exception.
    """
    recorder = OpRecorder(weight_keys, param_keys, subclass_weights)
    builder = _EagerGraphBuilder(model, call, recorder, home)
    pre = nn.modules.module.register_module_forward_pre_hook(builder.pre_hook)
    post = nn.modules.module.register_module_forward_hook(builder.post_hook)
    try:
        with contextlib.ExitStack() as modes:
            for mode in (fake_mode or contextlib.nullcontext(), torch.no_grad(), *below, recorder, quiet()):
                modes.enter_context(mode)
            out = call(model)
    except Exception as exc:
        where = ""
        if builder.stack:
            m = builder.stack[-1]
            path = builder.names.get(id(m), "")
            where = f" in layer {path!r} ({type(m).__name__})" if path else f" in {type(m).__name__}.forward"
        zeros = fake_mode is None and any(not t.is_floating_point() and t.dtype != torch.bool and t.numel() and not t.any()
                                          for t in call.tensors())
        raise CaptureError(
            f"the model cannot run{where}{at(exc, source_file)}: {short(exc)}",
            hint="archscan fed its integer inputs zeros; give them values: --input 4,50:int64=1..100" if zeros else None,
        ) from exc
    finally:
        pre.remove()
        post.remove()
        recorder.on_op = None
    gm = builder.finish(out)
    gm.meta["archscan_taken"] = list(recorder.taken)  # what torch.cond and torch.while_loop did (run_higher_order)
    return gm
