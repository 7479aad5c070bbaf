"""The analysis core's top: load -> capture -> cost -> graph -> rules -> ``Report``.

``analyse`` counts a model and checks the rules; every stage above calls it: the transforms,
prune and distill count their changed copies with it, and ``archscan.scan`` (the orchestrator,
``archscan.api``) adds measurement, predictions and recommendations on top. The core imports
nothing above it (docs/development.md): what must ride the capture's one run (the channel labels
of pruning) is handed in as an ``Observer``.
"""

from __future__ import annotations

import ast
import functools
import linecache
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
import torch.fx
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.node import _get_qualified_name

from ..capture import (Captured, NodeCosts, Observer, Weight, capture, model_weights, module_stack, run_again,
                       seeded_rng, source_of)
from ..costs import CATEGORIES, MASK_ELEMENTS, bound_arguments, mask_pairs, storage_key
from ..load.frames import exit_error
from ..memory import MemoryObserver, forward_memory
from ..load.targets import (InputLike, InputSpec, ModelTarget, check_kwargs, dtype_name, input_specs, model_dtype,
                            to_target)
from ..results import ModuleReport, NodeReport, Report, Totals, module_and_ancestors
from ..rules import RuleContext, run_rules, select_rules


@dataclass(frozen=True)
class Analysis:
    """What the core found: the report, and the capture it was built from (its model, fake or
    real, and what the observers found), for the stages that go on from there."""

    report: Report
    captured: Captured
    target: ModelTarget
    specs: tuple[InputSpec, ...]
    dtype: torch.dtype | None


def analyse(model: nn.Module | Callable[..., nn.Module] | str | ModelTarget,
            inputs: Sequence[InputLike] | InputLike, *, kwargs: dict | None = None,
            dtype: torch.dtype | str | None = None, capture_method: str = "auto", name: str | None = None,
            rules: Sequence[str] | None = (), observers: Sequence[Observer] = (), memory: bool = True,
            graph: torch.fx.Graph | None = None) -> Report:
    """Count a model (params, FLOPs, MAC per layer) and check the rules, with no measurement,
    prediction or recommendation: ``analysis(...).report``. Arguments as for ``analysis``; the
    stages that count changed copies of a model leave their memory out (``memory=False``) and may
    hand in the graph the copy traces to (``graph``, with ``capture_method="direct"``:
    ``archscan.capture.capture``)."""
    return analysis(model, inputs, kwargs=kwargs, dtype=dtype, capture_method=capture_method, name=name,
                    rules=rules, observers=observers, memory=memory, graph=graph).report


def analysis(model: nn.Module | Callable[..., nn.Module] | str | ModelTarget,
             inputs: Sequence[InputLike] | InputLike, *, kwargs: dict | None = None,
             dtype: torch.dtype | str | None = None, capture_method: str = "auto", name: str | None = None,
             rules: Sequence[str] | None = (), observers: Sequence[Observer] = (), memory: bool = True,
             graph: torch.fx.Graph | None = None) -> Analysis:
    """Capture and cost a model, build its report and check the rules.

    Args:
        model, inputs, kwargs, dtype, capture_method, name: as for ``archscan.scan``.
        rules: rule ids to check (``archscan.rules.RULES``); None checks all, ``()`` none. A rule
            that reads measurements finds nothing here: ``archscan.scan`` checks the rules after
            measuring.
        observers: what rides the capture's run (``archscan.capture.Observer``).
        memory: find the inference forward's memory (``Report.memory``, ``archscan.memory``).
        graph: the fx graph to run instead of a trace (``archscan.capture.capture``).
    """
    dtype = model_dtype(dtype)
    specs = input_specs(inputs, dtype)
    target = to_target(model, name)
    check_kwargs(target, kwargs)
    selected = select_rules() if rules is None else select_rules(rules) if rules else []
    try:
        with seeded_rng():
            captured = capture(target, specs, kwargs or {}, dtype, capture_method,
                               (MemoryObserver(), *observers) if memory else observers, graph)
            report = build_report(captured, name or target.name, specs, dtype, memory)
    except SystemExit as exc:  # the model's constructor or forward called sys.exit()
        raise exit_error(exc, "running the model", target.source_file) from None
    if selected:
        report = check_rules(report, selected)[0]
    return Analysis(report, captured, target, tuple(specs), dtype)


def check_rules(report: Report, selected: Sequence[str]) -> tuple[Report, RuleContext]:
    """The report with the findings of ``selected`` rules and the blocks they saw; and the graph
    view they read (``RuleContext``), for the recommenders that answer them."""
    ctx = RuleContext(report)
    report = run_rules(report, selected, ctx) if selected else report
    return replace(report, blocks=tuple(b.to_json() for b in ctx.blocks)), ctx


def _op_name(node: torch.fx.Node) -> str:
    """A node's op, human-readable: 'Conv2d', 'Tensor.view', 'aten.conv2d', 'operator.add'."""
    if node.op == "call_module":
        return type(node.graph.owning_module.get_submodule(node.target)).__name__
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket) if target._overloadname == "default" else str(target)
    try:
        return _get_qualified_name(target).replace("torch.nn.functional.", "F.").replace("_operator.", "operator.")
    except Exception:
        return str(target)


def _node_category(costs: NodeCosts, module_type: str = "") -> str:
    present = {c.category for c in costs.ops}
    if "Pool" in module_type and present <= {"pooling", "reduction", "view", "factory"}:
        return "pooling"  # adaptive pooling to 1x1 runs as a mean: still a pooling layer
    for cat in CATEGORIES:
        if cat in present:
            return cat
    return "view"


def _merge_attrs(costs: NodeCosts) -> dict:
    """The first op's attributes (conv/linear shapes), and the bytes (and multiply-adds) per category
    of a node made of several kinds of ops (a whole nn.Transformer kept as one fx leaf, say)."""
    attrs = next((dict(c.attrs) for c in costs.ops if c.attrs), {})
    if any("idle_expert_params" in c.attrs for c in costs.ops):  # every grouped expert GEMM of the node
        attrs["idle_expert_params"] = sum(c.attrs.get("idle_expert_params", 0) for c in costs.ops)
    if any("routed_flops" in c.attrs for c in costs.ops):  # experts run on every token: what routing needs
        attrs["routed_flops"] = sum(c.attrs.get("routed_flops", c.flops) for c in costs.ops)
    if any("executed_flops" in c.attrs for c in costs.ops):  # causal attention: the pairs it computes
        attrs["executed_flops"] = sum(c.attrs.get("executed_flops", c.flops) for c in costs.ops)
    by_category: Counter = Counter()
    flops_by: Counter = Counter()
    for c in costs.ops:
        if c.mac_bytes:
            by_category[c.category] += c.mac_bytes
        if c.flops:
            flops_by[c.category] += c.flops
    if len(by_category) > 1:
        attrs["mac_by_category"] = dict(by_category)
    if len(flops_by) > 1:  # projections and attention in one node: the GPU model prices each at its own rate
        attrs["flops_by_category"] = dict(flops_by)
    return attrs


_HOST_FACTORIES = {torch.tensor, torch.as_tensor, torch.from_numpy, torch.zeros, torch.ones, torch.empty, torch.full,
                   torch.arange, torch.randn, torch.rand, torch.randint, torch.eye, torch.linspace}
_DEVICE_METHODS = {"to", "cuda", "cpu"}


def _executes(node: torch.fx.Node) -> bool:
    """Did the node run something (a report row)? Pure Python values (x.size(), getattr) did not."""
    costs = node.meta.get("archscan")
    if costs is None:
        return False
    # export's metadata asserts (``.to()`` leaves aten._assert_tensor_metadata) check, run nothing
    return costs.out_shape is not None or any(not c.op.startswith("aten._assert") for c in costs.ops)


def _passes_device(source: str | None) -> bool | None:
    """Does every torch.tensor/as_tensor call that starts on the source line pass a device?
    None when no such call starts there (or the line cannot be read)."""
    fname, _, line = (source or "").rpartition(":")
    if not (fname and line.isdigit()):
        return None
    lines, first = linecache.getlines(fname), int(line)
    for end in range(first, min(first + 20, len(lines)) + 1):  # a call may span lines
        try:
            tree = ast.parse("".join(lines[first - 1:end]).strip())
        except SyntaxError:
            continue
        calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and c.lineno == 1
                 and getattr(c.func, "attr", getattr(c.func, "id", None)) in ("tensor", "as_tensor", "asarray")]
        return all(any(k.arg == "device" and not (isinstance(k.value, ast.Constant) and k.value.value is None)
                       for k in c.keywords) for c in calls) if calls else None
    return None


def _active_params(used: int, nodes: Sequence[NodeReport]) -> int | None:
    """Mixture of experts: the parameters one token uses, the experts' k of E and everything else;
    None for a model without routed experts (every parameter used is active)."""
    idle = [n.attrs["idle_expert_params"] for n in nodes if "idle_expert_params" in n.attrs]
    return used - sum(idle) if idle else None


def _masked_attrs(node: torch.fx.Node, costs: NodeCosts, masks: dict, keys: dict) -> dict:
    """``{"masked": True, "executed_flops"}`` for attention given an explicit mask that the model
    computes from positions alone (a causal mask, a sliding window, a cache's offset: aranges and
    comparisons): the mask is evaluated on the CPU and the multiply-adds are those of the
    query-key pairs it lets through (the dense count stays ``flops``); {} otherwise (a mask read
    from an input, one made of weights, one too large to evaluate, or ``is_causal`` already
    counted). ``masks``: what a mask computes (``_structure``, its ``keys`` memo) -> its pairs,
    filled as masks are met: each layer may make its own copy of the model's one mask, evaluated
    once."""
    if not any(c.category == "attention" for c in costs.ops) or any("executed_flops" in c.attrs for c in costs.ops):
        return {}
    mask = bound_arguments(node.target, node.args, node.kwargs).get("attn_mask") if node.op == "call_function" else None
    if not isinstance(mask, torch.fx.Node):
        return {}
    key = _structure(mask, keys)
    if key not in masks:
        masks[key] = _allowed_pairs(mask)
    pairs = masks[key]
    if pairs is None:
        return {}
    allowed, total = pairs
    return {"masked": True, "executed_flops": sum(c.flops * allowed // total if c.category == "attention" else c.flops
                                                  for c in costs.ops)}


_SOFTMAX_NAMES = frozenset({"_softmax", "softmax", "_safe_softmax"})
_PRODUCT_NAMES = frozenset({"bmm", "matmul", "mm", "baddbmm"})
_MASKING_NAMES = frozenset({"add", "add_", "where", "masked_fill", "masked_fill_"})
_PASS_NAMES = frozenset({"view", "_unsafe_view", "reshape", "expand", "mul", "div", "to", "_to_copy", "clone",
                         "dropout", "contiguous", "float", "type_as", "clamp"})
_HOPS = 6  # ops between a product and the softmax (a view, a scale, the mask, a cast)


def _call_name(node: torch.fx.Node) -> str:
    """What a node calls, by name across graph kinds: 'bmm' for aten.bmm.default, torch.bmm,
    operator.matmul ('matmul') and a ``.bmm()`` method alike."""
    target = node.target
    if node.op == "call_method":
        return str(target)
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    name = getattr(target, "__name__", "")
    return {"truediv": "div", "iadd": "add_"}.get(name, name)


def _masked_products(gm: torch.fx.GraphModule, masks: dict, keys: dict) -> dict:
    """Attention written out (Hugging Face's eager attention, the CPU's math decomposition of
    ``scaled_dot_product_attention`` recorded op by op): scores = Q·Kᵀ, a mask added (or applied
    with ``where``/``masked_fill``), softmax, then ·V. Where the mask is computed from positions
    alone (``_allowed_pairs``), both products get ``{"masked": True, "executed_flops"}`` for the
    query-key pairs it lets through, as a fused kernel given the same mask has them: the dense
    count stays ``flops``. {node: attrs}."""
    found: dict = {}
    for sm in gm.graph.nodes:
        if sm.op not in ("call_function", "call_method") or _call_name(sm) not in _SOFTMAX_NAMES or not sm.args \
                or not isinstance(sm.args[0], torch.fx.Node):
            continue
        scores, mask, n = None, None, sm.args[0]
        for _ in range(_HOPS):  # back from the softmax along its input to the product that made the scores
            name = _call_name(n)
            if name in _PRODUCT_NAMES:
                scores = n
                break
            tensors = [a for a in n.all_input_nodes if _is_tensor_node(a)]
            if name in _MASKING_NAMES and len(tensors) >= 2:
                if name == "where":  # where(mask, scores, fill) or where(mask, fill, scores)
                    cond, *rest = n.args[:3]
                    mask = cond if isinstance(cond, torch.fx.Node) else None
                    nxt = next((a for a in rest if _shape(a) is not None and _shape(a) == _shape(n)), None)
                else:  # scores + mask, or scores.masked_fill(mask, value)
                    first, second = n.args[0], n.args[1]
                    nxt = first if isinstance(first, torch.fx.Node) and _shape(first) == _shape(n) else second
                    mask = second if nxt is first else first
                if not isinstance(nxt, torch.fx.Node):
                    break
                n = nxt
            elif name in _PASS_NAMES and tensors:
                n = tensors[0]
            else:
                break
        if scores is None or not isinstance(mask, torch.fx.Node):
            continue
        values = _reader_product(sm)
        if values is None:
            continue
        key = _structure(mask, keys)
        if key not in masks:
            masks[key] = _allowed_pairs(mask)
        if masks[key] is None:
            continue
        allowed, total = masks[key]
        for product in (scores, values):
            costs = product.meta.get("archscan")
            if costs is not None and not any("executed_flops" in c.attrs for c in costs.ops):
                flops = sum(c.flops for c in costs.ops)
                found[product] = {"masked": True, "executed_flops": flops * allowed // total}
    return found


def _is_tensor_node(n: torch.fx.Node) -> bool:
    costs = n.meta.get("archscan")
    return n.op in ("placeholder", "get_attr") or (costs is not None and costs.out_shape is not None)


def _shape(n: Any) -> tuple | None:
    costs = n.meta.get("archscan") if isinstance(n, torch.fx.Node) else None
    return costs.out_shape if costs is not None else None


def _reader_product(sm: torch.fx.Node) -> torch.fx.Node | None:
    """The product that reads the softmax's probabilities (·V), through views, casts and dropout."""
    todo = [(sm, 0)]
    while todo:
        n, depth = todo.pop()
        for user in n.users:
            name = _call_name(user)
            if name in _PRODUCT_NAMES and user.args and user.args[0] is n:
                return user
            if name in _PASS_NAMES and depth < _HOPS:
                todo.append((user, depth + 1))
    return None


def _structure(node: torch.fx.Node, keys: dict) -> str:
    """What ``node`` computes, as text: its op and its arguments, each node among them by what it
    computes in turn (two nodes that make the same mask from the same ops have one key)."""
    if node not in keys:
        if node.op == "call_function":
            args = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: _structure(a, keys))
            keys[node] = f"{node.target}{args!r}"
        else:  # an input, a weight: itself
            keys[node] = f"{node.op}:{node.target}"
    return keys[node]


def _allowed_pairs(mask: torch.fx.Node) -> tuple[int, int] | None:
    """(entries that let a query-key pair through, entries) of a mask computed by aten ops from
    numbers alone, evaluated on real CPU tensors; None when any op reads something else (a model
    input, a weight, a constant) or the mask is larger than ``MASK_ELEMENTS``. A bool mask lets
    True through; a float one any entry above its dtype's lowest value (-inf, or finfo.min)."""
    shape = getattr(mask.meta.get("archscan"), "out_shape", None)
    if shape is None or math.prod(shape) > MASK_ELEMENTS:
        return None
    made, stack, constants = set(), [mask], {}
    while stack:
        n = stack.pop()
        if n in made:
            continue
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) or n.target.namespace != "aten":
            return None
        made.add(n)
        for a in n.all_input_nodes:
            constant = _small_constant(a)
            if constant is not None:
                constants[a] = constant
            else:
                stack.append(a)
    values: dict = dict(constants)
    try:
        for n in mask.graph.nodes:  # in the graph's order: what an op reads is made before it
            if n in made:
                args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), values.__getitem__)
                if any(isinstance(a, str) for a in torch.utils._pytree.tree_leaves((args, kwargs))):
                    return None  # a tensor the recording did not make (named by its shape)
                values[n] = n.target(*args, **kwargs)
    except Exception:
        return None
    return mask_pairs(values[mask])


def _small_constant(n: torch.fx.Node) -> torch.Tensor | None:
    """A constant the graph holds with its value (torch.export lifts ``torch.tensor(0.0)`` in a mask
    function to an attribute): a real tensor of at most 64 elements, else None."""
    if n.op != "get_attr":
        return None
    try:
        value = functools.reduce(getattr, str(n.target).split("."), n.graph.owning_module)
    except Exception:
        return None
    if not isinstance(value, torch.Tensor) or type(value) is not torch.Tensor or value.is_meta or value.numel() > 64:
        return None
    return value


def _placement_attrs(node: torch.fx.Node) -> dict:
    """Where a node's tensors come from: host factories without ``device=``, ``.to(device)``, and the
    graph inputs and attributes it shares with other nodes.

    ``shared_inputs`` names the placeholders and get_attr nodes (not report nodes themselves) that
    this node reads and at least one other node reads too: ``archscan.graph`` finds fork/join blocks
    that fork there (an inception block on the model input). A ``torch.tensor(...)`` that export or
    the eager capture record as ``lift_fresh`` has lost its ``device=`` argument: the call on the
    node's source line tells whether it passed one (fx keeps it as a kwarg). Export's stack traces
    stop at the innermost ``forward``, so a call made in a helper below it (Hugging Face cache
    code) is not on that line: the export records the calls made below it (``archscan_made_at``, whose
    first line without ``device=`` becomes ``made_at``); without a record ``host_factory_unchecked``
    says so. A 0-dim tensor is never flagged: kernels on any device take a CPU scalar as a number,
    with no copy.
    """
    attrs: dict = {}
    shared = [a.name for a in node.all_input_nodes
              if a.op in ("placeholder", "get_attr") and sum(map(_executes, a.users)) > 1]
    if shared:
        attrs["shared_inputs"] = shared
    target = node.target
    if node.op == "call_function" and target in _HOST_FACTORIES and node.kwargs.get("device") is None:
        costs = node.meta.get("archscan")
        if costs is None or costs.out_shape != ():  # a 0-dim tensor is a number to any device's kernels
            attrs["host_factory"] = True
    elif node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
        name = target.overloadpacket.__name__
        if name in ("lift_fresh", "lift_fresh_copy"):
            device, costs = _passes_device(source_of(node)), node.meta.get("archscan")
            scalar = costs is not None and costs.out_shape == ()  # a Python number wrapped (x[:, 0] = 5)
            made_at = node.meta.get("archscan_made_at")  # the calls a helper below that line made
            if device is None and made_at:
                without = [line for line, passed in made_at if not passed]
                device = not without
                if without:
                    attrs["made_at"] = without[0]
            if scalar:  # a 0-dim tensor: kernels on any device take a CPU scalar as a number, with no
                pass    # copy (transformers' caches wrap their window size so), wherever it was made
            elif device is None:
                attrs["host_factory_unchecked"] = True
            elif device is False:
                attrs["host_factory"] = True
        elif name == "_to_copy" and node.kwargs.get("device") is not None:
            attrs["device_move"] = True
    elif node.op == "call_method" and target in _DEVICE_METHODS:
        moves = target != "to" or (any(_names_device(a) for a in list(node.args[1:]) + [node.kwargs.get("device")])
                                   and not _registered(node.args[0]))
        if moves:
            attrs.update(device_move=True, to_host=target == "cpu")
    return attrs


def _registered(arg) -> bool:
    """Is ``arg`` a parameter or buffer the model registered? Those move with ``model.to(device)``,
    so ``self.inv_freq.to(x.device)`` finds them there and copies nothing (a tensor fx baked in as
    a constant, a plain attribute, stays where it was made)."""
    if not (isinstance(arg, torch.fx.Node) and arg.op == "get_attr"):
        return False
    owner, _, name = str(arg.target).rpartition(".")
    try:
        module = arg.graph.owning_module.get_submodule(owner)
    except AttributeError:
        return False
    return not name.startswith("_tensor_constant") and (name in module._parameters or name in module._buffers)


def _names_device(arg) -> bool:
    """Is this argument of ``Tensor.to`` a device ('cuda', a ``torch.device``, ``x.device``), not a
    dtype (``torch.float16``, ``self.proj.weight.dtype``: a cast, not a move)?"""
    if isinstance(arg, (str, torch.device)):
        return True
    return (isinstance(arg, torch.fx.Node) and arg.op == "call_function" and arg.target is getattr
            and len(arg.args) > 1 and arg.args[1] == "device")


def build_report(captured: Captured, model_name: str, specs: Sequence[InputSpec], dtype, memory: bool = True) -> Report:
    """Turn an annotated graph into a Report: per-node rows, per-module sums, totals."""
    gm, model = captured.gm, captured.model
    seen_params: set = set()
    masks: dict = {}  # what an attention mask computes -> the pairs it lets through (_masked_attrs)
    mask_keys: dict = {}  # node -> what it computes (_structure)
    nodes: list[NodeReport] = []
    uncounted: Counter = Counter()
    kept: set[str] = set()
    node_stacks: list[list[tuple[str, str]]] = []
    # a recording's nodes share one module stack per stretch of ops, and many a source line
    stacks: dict[int, list[tuple[str, str]]] = {}
    sources: dict[str, str | None] = {}
    masked_products = _masked_products(gm, masks, mask_keys)
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        if not _executes(node):
            continue  # pure Python values (x.size(), getattr): nothing executed
        costs: NodeCosts = node.meta["archscan"]
        new_params = costs.param_keys - seen_params
        seen_params |= new_params
        params = sum(captured.param_numel[k] for k in new_params)
        for c in costs.ops:
            if not c.counted:
                uncounted[c.op] += 1
        meta_stack = node.meta.get("nn_module_stack")
        stack = stacks.get(id(meta_stack)) if meta_stack else None
        if stack is None:
            stack = module_stack(node)
            if meta_stack:
                stacks[id(meta_stack)] = stack
        if node.op == "call_module" and (not stack or stack[-1][0] != node.target):
            sub = gm.get_submodule(node.target)
            stack = stack + [(node.target, type(sub).__name__)]
        op = _op_name(node)
        module, module_type = (stack[-1] if stack else ("", type(model).__name__))
        leaf_type = module_type if node.op == "call_module" else ""
        nodes.append(NodeReport(
            name=node.name, op=op, module=module, module_type=module_type,
            category=_node_category(costs, leaf_type),
            flops=sum(c.flops for c in costs.ops), elem_ops=sum(c.elem_ops for c in costs.ops),
            mac_bytes=sum(c.mac_bytes for c in costs.ops), read_bytes=sum(c.read_bytes for c in costs.ops),
            write_bytes=sum(c.write_bytes for c in costs.ops), weight_bytes=sum(c.weight_bytes for c in costs.ops),
            params=params, out_shape=costs.out_shape,
            dtype=_node_dtype(costs),
            source=_source(node, sources), inputs=tuple(a.name for a in node.all_input_nodes if a.name in kept),
            aten_ops=tuple(c.op for c in costs.ops if c.category != "view"),
            attrs={**_merge_attrs(costs), **_masked_attrs(node, costs, masks, mask_keys),
                   **masked_products.get(node, {}), **_placement_attrs(node)},
        ))
        kept.add(node.name)
        node_stacks.append(stack)
    unused_names = tuple(sorted(name for key, name in captured.param_names.items() if key not in seen_params))
    # the parameters, and torch.ao's packed weights; a quantized weight at its bytes as stored (capture.Weight)
    weights = model_weights(model)
    modules = _module_reports(model, nodes, node_stacks, set(unused_names), weights)
    total_params = sum(w.numel for w in weights)
    param_bytes = sum(w.nbytes for w in weights)
    used = sum(n.params for n in nodes)
    totals = Totals(
        params=total_params, flops=sum(n.flops for n in nodes), mac_bytes=sum(n.mac_bytes for n in nodes),
        elem_ops=sum(n.elem_ops for n in nodes), read_bytes=sum(n.read_bytes for n in nodes),
        write_bytes=sum(n.write_bytes for n in nodes), weight_bytes=sum(n.weight_bytes for n in nodes),
        used_params=used, unused_params=total_params - used, param_bytes=param_bytes,
        executed_flops=sum(n.attrs.get("executed_flops", n.flops) for n in nodes),
        active_params=_active_params(used, nodes),
    )
    return Report(
        unused_param_names=unused_names, host_constants=_host_constants(gm), training=captured.training,
        host_syncs=captured.host_syncs,
        model=model_name, capture=captured.kind, inputs=tuple(s.to_json() for s in specs),
        dtype=dtype_name(dtype) if dtype is not None else "float32", totals=totals, nodes=tuple(nodes),
        modules=tuple(modules), uncounted=dict(uncounted.most_common()), capture_notes=tuple(captured.notes),
        memory=_memory(captured, specs, dtype) if memory else None,
    )


def _node_dtype(costs: NodeCosts) -> str | None:
    """The dtype a node computes in: its output's, or the one its GEMM computes in where that is
    another (``compute_dtype``: a dynamically quantized linear's int8 GEMM gives float32 out)."""
    computes = next((c.attrs["compute_dtype"] for c in costs.ops if "compute_dtype" in c.attrs), None)
    if computes is not None:
        return computes
    return dtype_name(costs.out_dtype) if costs.out_dtype is not None else None


def _source(node: torch.fx.Node, seen: dict[str, str | None]) -> str | None:
    """``source_of(node)``, read once per distinct stack trace."""
    trace = node.meta.get("stack_trace") or ""
    if trace not in seen:
        seen[trace] = source_of(node)
    return seen[trace]


def _memory(captured: Captured, specs: Sequence[InputSpec], dtype) -> dict | None:
    """The inference forward's memory (``archscan.memory``), with the weights' and inputs' bytes:
    the model's own forward, run eagerly on the capture's model, else the captured graph's
    lifetimes (``basis`` says which, and ``basis_note`` why the forward could not run); a real
    capture's run carries the tracker itself."""
    found = captured.observed.get(MemoryObserver.key)
    why: list[str] = []
    if captured.fake and (found is None or found["basis"] != "eager"):  # not yet the model's own forward
        found = forward_memory(captured.model, specs, dtype, why) or found
        if found is None:  # the forward needs values: the captured graph's lifetimes, in its direct run again
            found = run_again(captured, specs, MemoryObserver())
    if found is None:
        return None
    if found["basis"] == "graph":
        found = {**found, "basis_note": "the model's own forward could not run again"
                 + (f" ({why[0]})" if why else "") + ": the captured graph's lifetimes, each value freed after "
                 "its last use (Python's variables may hold some longer: a lower bound)"}
    return {**found, "weights_bytes": found["at_peak"]["params"],
            "inputs_bytes": sum(math.prod(s.shape) * s.dtype.itemsize for s in specs)}


def _host_constants(gm: torch.fx.GraphModule) -> tuple[dict, ...]:
    """Tensors fx baked as constants that forward builds on the host each call.

    fx runs code that reads no proxy while it traces and bakes the result in as ``_tensor_constant*``.
    archscan builds every parameter and buffer as a fake or meta tensor (``archscan.capture.direct``) and fx
    traces outside fake mode, so a fake or meta constant was computed from them
    (``self.relative_position_index.view(-1)`` in Swin, BEiT, MaxViT): it lives wherever the model does, as does a constant sharing the storage of a parameter
    or buffer the graph holds. A real one was made by host code (``torch.tensor([1.0])`` in forward).
    """
    registered = {storage_key(t) for name, t in [*gm.named_parameters(), *gm.named_buffers()]
                  if not name.rpartition(".")[2].startswith("_tensor_constant")}  # fx registers constants too
    out = []
    for node in gm.graph.nodes:
        if node.op == "get_attr" and str(node.target).startswith("_tensor_constant"):
            value = getattr(gm, node.target, None)
            if isinstance(value, torch.Tensor) and (isinstance(value, FakeTensor) or value.is_meta
                                                    or storage_key(value) in registered or value.dim() == 0):
                continue  # the model's own state, viewed or computed at trace time; or a number
            for user in node.users:
                out.append({"name": node.target, "consumer": user.name, "source": source_of(user),
                            "shape": list(value.shape) if isinstance(value, torch.Tensor) else None})
    return tuple(out)


def _module_reports(model: nn.Module, nodes: list[NodeReport], stacks: list[list[tuple[str, str]]],
                    unused_names: set[str], weights: Sequence[Weight]) -> list[ModuleReport]:
    """Sum node costs into every module on each node's stack; every registered module is listed."""
    agg: dict[str, dict] = {}
    types: dict[str, str] = {}
    kinds: dict[str, tuple[bool, bool]] = {}
    for path, mod in model.named_modules(remove_duplicate=False):
        kinds[path] = (isinstance(mod, (nn.Sequential, nn.ModuleList, nn.ModuleDict)),
                       type(mod).__module__.startswith("torch.nn."))
        agg.setdefault(path, {"flops": 0, "elem_ops": 0, "mac_bytes": 0, "nodes": 0, "out": None, "cats": Counter()})
        if type(mod) not in (nn.Module, torch.fx.GraphModule):  # an exported program's: nodes know the types
            types.setdefault(path, type(mod).__name__)
    for node, stack in zip(nodes, stacks):
        for p, t in stack:
            types.setdefault(p, t)
        # every ancestor of the innermost module: containers such as ModuleList never run
        # a forward of their own, so they are not on the stack
        paths = {p for p, _ in stack} | set(module_and_ancestors(node.module))
        for p in paths:
            a = agg.setdefault(p, {"flops": 0, "elem_ops": 0, "mac_bytes": 0, "nodes": 0, "out": None, "cats": Counter()})
            a["flops"] += node.flops
            a["elem_ops"] += node.elem_ops
            a["mac_bytes"] += node.mac_bytes
            a["nodes"] += 1
            a["out"] = node.out_shape
            a["cats"][node.category] += node.mac_bytes + node.flops
    params: Counter = Counter()
    unused: Counter = Counter()
    for w in weights:  # each once, in the module that registered it first
        for owner in module_and_ancestors(w.name.rpartition(".")[0]):
            params[owner] += w.numel
            if w.name in unused_names:
                unused[owner] += w.numel
    out = []
    for path, a in agg.items():
        cat = a["cats"].most_common(1)[0][0] if a["cats"] else ""
        out.append(ModuleReport(
            path=path, type=types.get(path, type(model).__name__ if path == "" else "?"),
            depth=0 if path == "" else path.count(".") + 1, flops=a["flops"], elem_ops=a["elem_ops"],
            mac_bytes=a["mac_bytes"], params=params.get(path, 0), nodes=a["nodes"], out_shape=a["out"], category=cat,
            unused_params=unused.get(path, 0), container=kinds.get(path, (False, False))[0], builtin=kinds.get(path, (False, False))[1],
        ))
    return out
