"""Fold inference-mode batch norms into the convolution or linear layer before them.

Works on the graph ``torch.export`` gives (``ExportedProgram.module()``: aten ops, weights read
with ``get_attr``), so module BNs and functional ``F.batch_norm`` calls look the same, and users
that only read a tensor's shape (timm's ``BatchNormAct2d`` asserts ``x.ndim == 4``) are gone:
export resolved them to constants. The arithmetic is torch's own
(``torch.nn.utils.fusion.fuse_conv_bn_weights`` / ``fuse_linear_bn_weights``), done in float64
and cast back to the layer's dtype.

A batch norm is folded when (torch.fx's ``fuse`` guards, extended to what export shows):
- it runs in inference mode with running statistics;
- its input is a conv (1d/2d/3d; transposed with groups=1) or a linear with a 2-D output, whose
  output nothing else reads;
- the layer's weight and bias are the model's own tensors read only there (not tied to another
  layer, not computed in forward), and the norm's channels are the layer's output channels.
Every batch norm left says why (``Kept.reason``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

aten = torch.ops.aten



def _overload(packet, *names):
    return next(getattr(packet, n) for n in names if n in packet.overloads())


# op -> (kind, index of bias, index of groups or None, transposed?)
_CONVS = {
    aten.conv1d.default: ("conv1d", 2, 6, False),
    aten.conv2d.default: ("conv2d", 2, 6, False),
    aten.conv3d.default: ("conv3d", 2, 6, False),
    aten.conv1d.padding: ("conv1d", 2, 6, False),  # padding='same' / 'valid'
    aten.conv2d.padding: ("conv2d", 2, 6, False),
    aten.conv3d.padding: ("conv3d", 2, 6, False),
    _overload(aten.conv_transpose1d, "default", "input"): ("conv_transpose1d", 2, 6, True),
    _overload(aten.conv_transpose2d, "input", "default"): ("conv_transpose2d", 2, 6, True),
    _overload(aten.conv_transpose3d, "input", "default"): ("conv_transpose3d", 2, 6, True),
    aten.convolution.default: ("convolution", 2, 8, None),  # transposed is args[6]
    aten.linear.default: ("linear", 2, None, False),
}
_BATCH_NORMS = {aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default}


@dataclass(frozen=True)
class Fold:
    """One batch norm folded into the layer before it."""

    kind: str            # "conv2d+bn", "linear+bn", ...
    layer: str           # module path of the conv/linear (or the node name)
    norm: str            # module path of the batch norm
    activation: str | None = None  # the activation that follows (left as its own op)


@dataclass(frozen=True)
class Kept:
    """A batch norm that stays, and why."""

    norm: str
    reason: str


@dataclass(frozen=True)
class FoldResult:
    folded: tuple[Fold, ...]
    kept: tuple[Kept, ...]


def module_path(node: torch.fx.Node) -> str:
    """The module that ran ``node`` (export's ``nn_module_stack``), else the node's name."""
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else ""
    return path or node.name  # a functional call in the root module's forward: the node


def _bn_args(node: torch.fx.Node) -> tuple | None:
    """(input, weight, bias, running_mean, running_var, eps) of an inference batch norm, else None."""
    a = list(node.args) + [None] * 9
    if node.target is aten.batch_norm.default:
        x, w, b, rm, rv, training, _momentum, eps = a[:8]
        training = node.kwargs.get("training", training)
        eps = node.kwargs.get("eps", eps)
    else:  # _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps)
        x, w, b, rm, rv, _momentum, eps = a[:7]
        training = False
    if training or rm is None or rv is None:
        return None
    return x, w, b, rm, rv, float(eps)


def _bn_output(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node holding the normalised tensor: the BN itself, or getitem 0 of the legit op."""
    if node.target is aten.batch_norm.default:
        return node
    outs = [u for u in node.users if u.target is operator.getitem and u.args[1] == 0]
    others = [u for u in node.users if u not in outs]
    return outs[0] if len(outs) == 1 and not others else None


class _Attrs:
    """The graph's get_attr tensors: values, and how many graph reads each underlying tensor has."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.reads: dict[int, int] = {}
        for n in gm.graph.nodes:
            if n.op == "get_attr":
                t = self.value(n)
                if isinstance(t, torch.Tensor):
                    self.reads[id(t)] = self.reads.get(id(t), 0) + len(n.users)

    def value(self, node) -> torch.Tensor | None:
        if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
            return None
        owner, _, name = str(node.target).rpartition(".")
        return getattr(self.gm.get_submodule(owner) if owner else self.gm, name, None)

    def private(self, node) -> bool:
        """Read by this one node only (not tied, not shared)."""
        t = self.value(node)
        return t is not None and self.reads.get(id(t), 0) == 1

    def set(self, node: torch.fx.Node, value: torch.Tensor) -> None:
        owner, _, name = str(node.target).rpartition(".")
        setattr(self.gm.get_submodule(owner) if owner else self.gm, name, torch.nn.Parameter(value, requires_grad=False))

    def add(self, near: torch.fx.Node, value: torch.Tensor, insert_before: torch.fx.Node) -> torch.fx.Node:
        """Register ``value`` beside the tensor ``near`` reads ('conv.bias' for 'conv.weight') and read it."""
        owner_path, _, _ = str(near.target).rpartition(".")
        owner = self.gm.get_submodule(owner_path) if owner_path else self.gm
        name, i = "bias", 0
        while getattr(owner, name, None) is not None or (name in owner._parameters and owner._parameters[name] is not None):
            i += 1
            name = f"bias_folded_{i}"
        if name in owner._parameters or not hasattr(owner, name):
            owner.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
        else:  # a plain attribute set to None
            setattr(owner, name, torch.nn.Parameter(value, requires_grad=False))
        with self.gm.graph.inserting_before(insert_before):
            return self.gm.graph.get_attr(f"{owner_path}.{name}" if owner_path else name)


def _why_not(bn: torch.fx.Node, args, layer: torch.fx.Node, attrs: _Attrs) -> str | None:
    """Why ``bn`` cannot fold into ``layer`` (None when it can)."""
    if not isinstance(layer, torch.fx.Node) or layer.target not in _CONVS:
        return "its input is not a conv or linear layer"
    kind, bias_i, groups_i, transposed = _CONVS[layer.target]
    la = list(layer.args)
    if transposed is None:
        transposed = bool(la[6]) if len(la) > 6 else False
    if len(layer.users) > 1:
        return f"the {kind} output has {len(layer.users)} users"
    if not attrs.private(la[1]):
        return f"the {kind} weight is shared or computed in forward"
    bias = la[bias_i] if len(la) > bias_i else layer.kwargs.get("bias")
    if bias is not None and not attrs.private(bias):
        return f"the {kind} bias is shared or computed in forward"
    _, w, b, rm, rv, _ = args
    stats = [attrs.value(t) for t in (rm, rv)] + [attrs.value(t) for t in (w, b) if t is not None]
    if any(s is None for s in stats):
        return "the norm's statistics or affine parameters are computed in forward"
    weight = attrs.value(la[1])
    out = layer.meta.get("val")
    if kind == "linear":
        if out is None or out.dim() != 2:
            return "a linear with a 3-D or larger output normalises a dimension that is not its features"
        channels = weight.shape[0]
    else:
        groups = la[groups_i] if groups_i is not None and len(la) > groups_i else 1
        if transposed and groups != 1:
            return "a grouped transposed conv: the per-channel scale does not map onto its weight"
        channels = weight.shape[1] * groups if transposed else weight.shape[0]
    if attrs.value(rm).numel() != channels:
        return "the norm's channels are not the layer's output channels"
    return None


def _activation_after(node: torch.fx.Node) -> str | None:
    users = list(node.users)
    if len(users) == 1 and isinstance(users[0].target, torch._ops.OpOverload):
        name = users[0].target.overloadpacket.__name__.rstrip("_")
        if name in ("relu", "relu6", "hardtanh", "silu", "gelu", "hardswish", "sigmoid", "tanh", "leaky_relu", "elu", "mish"):
            return name
    return None


def fold_batch_norms(gm: torch.fx.GraphModule) -> FoldResult:
    """Fold every foldable inference batch norm of an exported graph in place (see the module doc)."""
    attrs = _Attrs(gm)
    folded: list[Fold] = []
    kept: list[Kept] = []
    dead_attrs: set[str] = set()
    for bn in list(gm.graph.nodes):
        if bn.op != "call_function" or bn.target not in _BATCH_NORMS:
            continue
        args = _bn_args(bn)
        out = _bn_output(bn)
        if args is None:
            kept.append(Kept(module_path(bn), "it normalises with batch statistics (training mode or no running stats)"))
            continue
        if out is None:
            kept.append(Kept(module_path(bn), "its mean or variance outputs are read"))
            continue
        layer = args[0]
        why = _why_not(bn, args, layer, attrs)
        if why is not None:
            kept.append(Kept(module_path(bn), why))
            continue
        kind, bias_i, _, transposed = _CONVS[layer.target]
        if transposed is None:
            transposed = bool(layer.args[6])
        _, w_node, b_node, rm_node, rv_node, eps = args
        weight_node = layer.args[1]
        bias_node = layer.args[bias_i] if len(layer.args) > bias_i else layer.kwargs.get("bias")
        weight = attrs.value(weight_node)
        bias = attrs.value(bias_node) if bias_node is not None else None
        rm, rv = attrs.value(rm_node), attrs.value(rv_node)
        bn_w = attrs.value(w_node) if w_node is not None else torch.ones_like(rm)
        bn_b = attrs.value(b_node) if b_node is not None else torch.zeros_like(rm)
        f64 = [t.detach().to(torch.float64) if t is not None else None for t in (weight, bias, rm, rv, bn_w, bn_b)]
        if kind == "linear":
            new_w, new_b = fuse_linear_bn_weights(f64[0], f64[1], f64[2], f64[3], eps, f64[4], f64[5])
        else:
            new_w, new_b = fuse_conv_bn_weights(f64[0], f64[1], f64[2], f64[3], eps, f64[4], f64[5], transpose=transposed)
        new_w = new_w.detach().to(weight.dtype)
        new_b = new_b.detach().to(bias.dtype if bias is not None else weight.dtype)
        attrs.set(weight_node, new_w)
        if bias_node is not None:
            attrs.set(bias_node, new_b)
        else:
            getter = attrs.add(weight_node, new_b, layer)
            args_list = list(layer.args) + [None] * max(0, bias_i + 1 - len(layer.args))
            args_list[bias_i] = getter
            layer.args = tuple(args_list)
            layer.kwargs = {k: v for k, v in layer.kwargs.items() if k != "bias"}
        folded.append(Fold(f"{kind}+bn", module_path(layer), module_path(bn), _activation_after(out)))
        out.replace_all_uses_with(layer)
        dead_attrs.update(str(n.target) for n in (w_node, b_node, rm_node, rv_node) if n is not None)
        dead_attrs.update(f"{str(n.target).rpartition('.')[0]}.num_batches_tracked" for n in (rm_node,))
    if folded:
        gm.graph.eliminate_dead_code()
        _drop_unread(gm, dead_attrs)
        gm.recompile()
    return FoldResult(tuple(folded), tuple(kept))


def _drop_unread(gm: torch.fx.GraphModule, candidates: set[str]) -> None:
    """Delete the folded norms' tensors that no node reads any more (so the saved program has no
    dead weights)."""
    read = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for target in candidates - read:
        owner_path, _, name = target.rpartition(".")
        try:
            owner = gm.get_submodule(owner_path) if owner_path else gm
        except AttributeError:
            continue
        for store in (owner._parameters, owner._buffers):
            store.pop(name, None)
        if name in vars(owner):
            delattr(owner, name)
