"""Recording executed aten ops: the dispatch mode that costs them, and what a node keeps."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..costs import (OpCost, cost_op, is_packed, packed_key, storage_key, subclass_linear_costs, tensors_in,
                     topk_routing)
from ..costs.kernels import run_op
from .frames import is_user_file, where



@dataclass
class NodeCosts:
    """What one graph node executed: its aten ops with costs, the params it read first."""

    ops: list[OpCost] = field(default_factory=list)
    param_keys: set = field(default_factory=set)
    out_shape: tuple[int, ...] | None = None
    out_dtype: torch.dtype | None = None


_AUTOGRAD_KEYS = (torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality)
                 | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradOther)
                 | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradNestedTensor))


def run_higher_order(mode: TorchDispatchMode, func, args, kwargs) -> Any:
    """A higher-order op reaching ``mode`` (the top of archscan's modes), run as eager PyTorch
    runs it, every op of its body through ``mode`` and the modes below:

    * ``torch.cond``: the branch its predicate chooses. The predicate's value is read below
      ``mode`` (``.item()``): on fake tensors or in a direct run (whose activations are zeros) it
      has none, so the capture goes on as for any model that reads values, to a real run on
      seeded inputs, whose branch is counted (``mode.taken`` says which);
    * ``torch.while_loop``: its condition and body, iteration by iteration, the same way;
    * ``map``: the body on each slice, as torch's eager ``map`` runs it.

    The body runs with the autograd keys torch's higher-order dispatch set aside put back, so
    its composite ops (``linear``, ``matmul``) reach the modes as the aten ops they are made of,
    as everywhere else. Any other higher-order op (``scan``, ``flex_attention``...) raises one
    line naming it."""
    name = func.name()
    taken = getattr(mode, "taken", None)

    def body(fn, *operands):
        guard = torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                                torch._C._dispatch_tls_local_exclude_set() - _AUTOGRAD_KEYS)
        with guard, mode:
            return fn(*operands)

    if name == "cond":
        pred, true_fn, false_fn, operands = args
        branch = bool(pred.item() if isinstance(pred, torch.Tensor) else pred)
        if taken is not None:
            taken.append(f"torch.cond took its {'true' if branch else 'false'} branch, "
                         f"the {'false' if branch else 'true'} one is not counted")
        return body(true_fn if branch else false_fn, *operands)
    if name == "while_loop":
        cond_fn, body_fn, carried, additional = args[:4]
        carried, steps = tuple(carried), 0
        while True:
            go = body(cond_fn, *carried, *additional)
            if not bool(go.item() if isinstance(go, torch.Tensor) else go):
                break
            carried = tuple(body(body_fn, *carried, *additional))
            steps += 1
        if taken is not None:
            taken.append(f"torch.while_loop ran {steps} iteration(s)")
        return carried
    if name == "map_impl":  # torch's map: the body on each slice of the mapped inputs, the results stacked
        from torch._higher_order_ops.map import _stack_pytree, _unstack_pytree

        fn, xs, pos_args = args
        with mode:
            slices = _unstack_pytree(xs)
        outs = [body(fn, *inputs, *pos_args) for inputs in slices]
        with mode:
            return _stack_pytree(outs)
    raise NotImplementedError(f"torch's higher-order op {name} is not counted by archscan (it counts torch.cond, "
                              "torch.while_loop and map): write it as a plain loop or call to be analysed")



class OpRecorder(TorchDispatchMode):
    """Costs every aten op executed while active, into the current ``NodeCosts``. Higher-order
    ops (``torch.cond``) run as eager PyTorch runs them (``run_higher_order``); ``taken`` says
    what they did.

    ``subclass_weights``: the model holds tensor-subclass weights (torchao's quantized tensors).
    ``F.linear`` on one is then costed whole, as the fused kernel that serves it runs
    (``costs.subclass_linear_costs``): a ``TorchFunctionMode`` (``_SubclassLinears``) sees the call
    before the subclass turns it into the ops of its CPU fallback (the weight dequantized to a float
    copy, then a float GEMM), which run beneath with the recorder paused. Only then: a function mode
    sees every call, and a model without such weights runs as it always has."""

    supports_higher_order_operators = True

    def __init__(self, weight_keys: set, param_keys: set, subclass_weights: bool = False):
        super().__init__()
        self.weight_keys = weight_keys
        self.param_keys = param_keys
        self.current: NodeCosts | None = None
        self.on_op = None  # optional callback(func, args, kwargs, out, costs): the op's costs, a list
        self.routing: tuple[int, int] | None = None  # the last router's (tokens, k)
        self.taken: list[str] = []
        self.paused = False  # inside a call costed whole (_SubclassLinears): its ops are not costed again
        self._linears = _SubclassLinears(self) if subclass_weights else None

    def __enter__(self):
        out = super().__enter__()
        if self._linears is not None:
            self._linears.__enter__()
        return out

    def __exit__(self, *exc):
        if self._linears is not None:
            self._linears.__exit__(*exc)
        return super().__exit__(*exc)

    def record(self, func, args, kwargs, out, costs: list[OpCost]) -> None:
        """Put an op's costs (one, or a fused call's kernels) in the current node, and hand them to ``on_op``."""
        if self.current is not None:
            self.current.ops.extend(costs)
            if any(c.weight_bytes for c in costs):
                self.current.param_keys |= self.params_read(args, kwargs)
        if self.on_op is not None:
            self.on_op(func, args, kwargs, out, costs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return run_op(func, args, kwargs)
        if isinstance(func, torch._ops.HigherOrderOperator):
            return run_higher_order(self, func, args, kwargs)
        if func is torch.ops.aten.embedding.default and args[1].is_floating_point():
            # the real kernel refuses float indices; the fake one of torch < 2.13 does not check
            raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                               f"Long, Int; but got {args[1].dtype} instead")
        out = run_op(func, args, kwargs)
        if func.namespace == "prim":  # prim.device and friends: metadata queries, no work
            return out
        if func is torch.ops.aten._to_copy.default and out is args[0]:
            return out  # a direct run's move between the meta device and the CPU: no op on fake tensors
        self.routing = topk_routing(func, out, self.routing) or self.routing
        cost = cost_op(func, args, kwargs, out, self.weight_keys, self.routing)
        self.record(func, args, kwargs, out, [cost])
        return out

    def params_read(self, args, kwargs) -> set:
        """Storage keys of the model parameters among an op's arguments (torch.ao's packed weights
        by ``packed_key``)."""
        keys = {k for k in map(storage_key, tensors_in((args, kwargs))) if k in self.param_keys}
        for a in args:
            for obj in (a if isinstance(a, (list, tuple)) else (a,)):
                if is_packed(obj) and packed_key(obj) in self.param_keys:
                    keys.add(packed_key(obj))
        return keys


class _SubclassLinears(TorchFunctionMode):
    """``F.linear`` on a tensor-subclass weight, costed whole into ``recorder`` (see ``OpRecorder``)."""

    def __init__(self, recorder: OpRecorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        recorder = self.recorder
        if func is not torch.nn.functional.linear or recorder.paused:
            return func(*args, **kwargs)
        bound = dict(zip(("input", "weight", "bias"), args)) | kwargs
        x, weight, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
        if not (isinstance(x, torch.Tensor) and is_traceable_wrapper_subclass(weight)):
            return func(*args, **kwargs)
        recorder.paused = True
        try:
            out = func(*args, **kwargs)
        finally:
            recorder.paused = False
        recorder.record(func, args, kwargs, out, subclass_linear_costs(x, weight, bias, out, recorder.weight_keys))
        return out


_SYNC_METHODS = ("tolist", "item", "numpy")


def _tensor_classes() -> tuple[type, ...]:
    """torch.Tensor and the subclasses a capture hands the model (they override ``tolist``)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return (torch.Tensor, FakeTensor, FunctionalTensor)


class SyncWatcher:
    """Notes the calls in model code that copy a tensor's values to the host (``.tolist()``,
    ``.item()``, ``.numpy()``) while the model runs eagerly or under torch.export: the eager
    recording never sees ``.tolist()`` (it reads memory without dispatching an op) and export
    drops what it cannot trace, yet each one is a host-device sync.

    The methods are wrapped, while the watcher is active, on ``torch.Tensor`` and the tensor
    subclasses that define their own (fake and functional tensors). A profile hook
    (``sys.setprofile``) would run on every Python call and return, doubling an export's time;
    a ``TorchFunctionMode`` would switch off fused fast paths (``nn.MultiheadAttention``) and so
    change the path being captured.
    """

    def __init__(self):
        self.calls: dict[tuple[str, str], int] = {}  # (op, file:line) -> count
        self._saved: list[tuple[type, str, Any]] = []

    def _wrap(self, name: str, method):
        calls = self.calls

        @functools.wraps(method)
        def watched(tensor, *args, **kwargs):
            line = user_line(sys._getframe(1))
            if line is not None:
                key = (f"Tensor.{name}", line)
                calls[key] = calls.get(key, 0) + 1
            return method(tensor, *args, **kwargs)

        return watched

    def __enter__(self) -> "SyncWatcher":
        for cls in _tensor_classes():
            for name in _SYNC_METHODS:
                if cls is torch.Tensor or name in cls.__dict__:
                    self._saved.append((cls, name, cls.__dict__.get(name)))
                    setattr(cls, name, self._wrap(name, getattr(cls, name)))
        return self

    def __exit__(self, *exc) -> None:
        for cls, name, before in reversed(self._saved):
            if before is None:
                delattr(cls, name)
            else:
                setattr(cls, name, before)
        self._saved.clear()

    def records(self) -> tuple[dict, ...]:
        return tuple({"op": op, "source": source, "count": n} for (op, source), n in self.calls.items())


def _user_frame(frame):
    """The innermost model-code frame at or above ``frame``, or None."""
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_line(frame=None) -> str | None:
    """'file.py:LINE' of the innermost model-code frame now executing (at or above ``frame``)."""
    user = _user_frame(frame if frame is not None else sys._getframe(1))
    return where(user.f_code.co_filename, user.f_lineno) if user is not None else None


def first_tensor(value) -> torch.Tensor | None:
    return next(iter(tensors_in(value)), None)


def output_tensors(value: Any) -> tuple[torch.Tensor, ...]:
    """The tensors in a model's output, in order, through containers of any kind (tuples, dicts,
    dataclasses, cache objects): each object once, modules skipped (they are not outputs)."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif x is None or isinstance(x, (int, float, bool, str, bytes, nn.Module)) or id(x) in seen:
            continue
        else:
            seen.add(id(x))
            if isinstance(x, dict):
                stack.extend(reversed(list(x.values())))
            elif isinstance(x, (list, tuple)):
                stack.extend(reversed(x))
            else:  # an object: its attributes, in __dict__ and __slots__
                attrs = list(vars(x).values()) if hasattr(x, "__dict__") else []
                for cls in type(x).__mro__:
                    slots = getattr(cls, "__slots__", ())
                    attrs += [getattr(x, name, None) for name in ((slots,) if isinstance(slots, str) else slots)]
                stack.extend(reversed(attrs))
    return tuple(out)


def shape_str(value) -> str:
    shapes = [list(t.shape) for t in tensors_in(value)]
    return ", ".join(str(s) for s in shapes) if shapes else "no tensors"


@contextlib.contextmanager
def quiet():
    """Silence torch's logging and warnings while a capture attempt may fail noisily; the model
    runs inside see archscan's inputs as a real run would (``_unpacked_sequences``)."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), _unpacked_sequences():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def _unpacked_sequences():
    """transformers' mask creation looks for packed sequences in the position ids and, on a fake
    tensor (which it takes for tracing), cannot rule them out: it then builds an explicit mask,
    where a real run passes none and lets attention apply ``is_causal`` (another kernel, other
    saved tensors). archscan's inputs never pack sequences, so the search finds none here."""
    masking = sys.modules.get("transformers.masking_utils")
    find = getattr(masking, "find_packed_sequence_indices", None)
    if find is None:
        yield
        return
    masking.find_packed_sequence_indices = lambda *args, **kwargs: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = find


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
            if is_user_file(fname):
                best = (fname, lineno)
    return where(*best) if best is not None else None


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


def python_stack() -> str:
    """The innermost user frame now executing, as an fx ``stack_trace`` line."""
    frame = _user_frame(sys._getframe(1))
    if frame is None:
        return ""
    return f'  File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_name}'


_DATA_DEPENDENT = ("DataDependentOutputException", "DynamicOutputShapeException", "GuardOnDataDependentSymNode",
                   "UnsupportedOperatorException", "DataDependentOutputError")
_NEEDS_VALUES_TEXT = ("not supported for tensor subclasses", "Cannot access data pointer", "Cannot access storage")


def needs_values(exc: BaseException | None) -> bool:
    """Did a fake-tensor run fail because it needed real tensor values (``.item()``, a
    tensor-valued ``if``, ``nonzero``, ``.numpy()``, an op without a fake kernel)?"""
    while exc is not None:
        if type(exc).__name__ in _DATA_DEPENDENT or any(t in str(exc) for t in _NEEDS_VALUES_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
