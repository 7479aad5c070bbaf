"""Rewrite hand-written attention to ``F.scaled_dot_product_attention`` where it provably matches.

The pattern, on the aten graph ``torch.export`` gives::

    s = q @ k.transpose(-2, -1)      # q may be scaled first: (q * c) @ k.T
    s = s * scale  (or s / d)        # optional; a Python number, or a tensor constant over the
                                     # last two dims (a learned per-head temperature), folded into q
    s = s + mask                     # optional additive mask (or masked_fill(bool, -inf))
    p = softmax(s, dim=-1)           # in the input dtype (a float32 softmax of float32 scores)
    p = dropout(p, p, train=False)   # optional, and only when inactive
    o = p @ v

becomes ``o = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=c * scale)`` (with a
temperature ``t``: ``sdpa(q * t, k, v, scale=c)``): the scores are never written to memory (flash /
memory-efficient kernels). It is rewritten only when every intermediate has no other reader
(attention weights that are returned or stored stay), q, k and v have equal ranks and batch
dimensions, and the scale is a constant or a temperature. A softmax between two matrix products
that is left alone has its reason (``unmatched``), which ``archscan fuse`` prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx

from ..capture import between_products
from .fold import module_path

aten = torch.ops.aten

_MATMULS = {aten.matmul.default, aten.bmm.default}
_SOFTMAXES = {aten.softmax.int, aten._softmax.default, aten._safe_softmax.default}


@dataclass(frozen=True)
class Rewrite:
    """One attention pattern replaced."""

    module: str
    masked: bool
    scale: float
    nodes_removed: int
    temperature: bool = False  # a tensor scale, folded into q


def _val(node) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _op(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


_CHECKS = {aten._assert_tensor_metadata.default} if hasattr(aten, "_assert_tensor_metadata") else set()


def _users(node: torch.fx.Node) -> list[torch.fx.Node]:
    """Readers of ``node``'s value: export's metadata asserts (``.to()`` leaves one) do not count."""
    return [u for u in node.users if u.target not in _CHECKS]


def _only_user(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    return _users(node) == [user]


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _scale_of(node: torch.fx.Node) -> tuple[torch.fx.Node, float] | None:
    """(input, factor) when ``node`` multiplies or divides a tensor by a constant number."""
    if _op(node, aten.mul.Tensor, aten.mul.Scalar):
        a, b = node.args[:2]
        if _number(b) is not None and isinstance(a, torch.fx.Node):
            return a, _number(b)
        if _number(a) is not None and isinstance(b, torch.fx.Node):
            return b, _number(a)
    if _op(node, aten.div.Tensor, aten.div.Scalar) and not node.kwargs.get("rounding_mode"):
        a, b = node.args[:2]
        if _number(b) not in (None, 0.0) and isinstance(a, torch.fx.Node):
            return a, 1.0 / _number(b)
    return None


def _transposed_last(node) -> torch.fx.Node | None:
    """k when ``node`` is k with its last two dims swapped."""
    if _op(node, aten.transpose.int):
        k, d0, d1 = node.args[:3]
        rank = _val(k).dim() if _val(k) is not None else None
        if rank is not None and {d0 % rank, d1 % rank} == {rank - 2, rank - 1}:
            return k
    if _op(node, aten.permute.default):
        k, dims = node.args[:2]
        rank = len(dims)
        want = list(range(rank - 2)) + [rank - 1, rank - 2]
        if [d % rank for d in dims] == want:
            return k
    if _op(node, aten.t.default, aten.numpy_T.default):
        return node.args[0] if _val(node.args[0]) is not None and _val(node.args[0]).dim() == 2 else None
    return None


def _temperature(node: torch.fx.Node, scores: torch.Tensor) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(scores, t) when ``node`` multiplies the scores by a tensor ``t`` that is constant over their
    last two dims (a learned per-head temperature, shape [heads, 1, 1]): ``t`` folds into q."""
    if not _op(node, aten.mul.Tensor):
        return None
    a, b = node.args[:2]
    for x, t in ((a, b), (b, a)):
        vx, vt = _val(x), _val(t)
        if vx is None or vt is None or not isinstance(t, torch.fx.Node) or vt.dtype != vx.dtype:
            continue
        trailing = list(vt.shape)[-2:] if vt.dim() >= 2 else [1] * (2 - vt.dim()) + list(vt.shape)
        if vt.dim() <= vx.dim() and all(d == 1 for d in trailing) and tuple(torch.broadcast_shapes(vx.shape, vt.shape)) == tuple(vx.shape):
            return x, t
    return None


def _match(sm: torch.fx.Node):
    """The pattern around softmax node ``sm``: (q, k, v, mask, mask_is_bool, scale, chain, out,
    temperature or None), or a string: why it is not one (``unmatched``)."""
    found = _match_or_why(sm)
    return found if not isinstance(found, str) else None


def _match_or_why(sm: torch.fx.Node):
    x, dim = sm.args[0], sm.args[1]
    vx = _val(x)
    if vx is None or not vx.is_floating_point() or dim % vx.dim() != vx.dim() - 1:
        return "the softmax is not over the last dimension of floating scores"
    if sm.target is aten._softmax.default and sm.args[2]:
        return "the softmax changes dtype (half to float)"
    if sm.target is aten.softmax.int and len(sm.args) > 2 and sm.args[2] not in (None, vx.dtype):
        return "the softmax changes dtype"
    chain = [sm]
    # forward: optional inactive dropout / same-dtype casts, then p @ v
    p = sm
    while True:
        users = _users(p)
        if len(users) != 1:
            return "the attention weights have another reader (returned or stored), so they must be written"
        u = users[0]
        if _op(u, aten.dropout.default) and (not u.args[2] or u.args[1] == 0):
            chain.append(u)
            p = u
            continue
        if _op(u, aten.to.dtype, aten._to_copy.default) and _val(u) is not None and _val(u).dtype == vx.dtype:
            chain.append(u)
            p = u
            continue
        break
    out = u
    if not _op(out, *_MATMULS) or out.args[0] is not p:
        return "the weights do not go straight into a matrix product with v"
    v = out.args[1]
    # backward: optional mask, optional scale, then q @ k^T; each feeds only the node after it
    s, head, mask, mask_bool, scale = x, sm, None, False, 1.0
    if _op(s, aten.add.Tensor) and len(s.args) == 2 and s.kwargs.get("alpha", 1) == 1:
        a, b = s.args
        if not (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)):
            return "a number is added to the scores"
        scores, mask = (a, b) if _op(a, *_MATMULS, aten.mul.Tensor, aten.div.Tensor) else (b, a)
        chain.append(s)
        head, s = s, scores
    elif _op(s, aten.masked_fill.Scalar) and s.args[2] == -math.inf:
        chain.append(s)
        head, s, mask, mask_bool = s, s.args[0], s.args[1], True
    if head is not sm and not _only_user(head, sm):
        return "the masked scores have another reader"
    scaled = _scale_of(s)
    temperature = None
    if scaled is None and _val(s) is not None and (found := _temperature(s, _val(s))) is not None:
        scaled, temperature = (found[0], 1.0), found[1]
    if scaled is not None:
        if not _only_user(s, head):
            return "the scaled scores have another reader"
        chain.append(s)
        head, s, scale = s, scaled[0], scaled[1]
    mm = s
    if not _op(mm, *_MATMULS):
        return (f"the scores are changed by {mm.target if isinstance(mm, torch.fx.Node) else mm} before the softmax, "
                "which scaled_dot_product_attention has no argument for")
    if not _only_user(mm, head):
        return "the raw scores have another reader"
    q, kt = mm.args[:2]
    k = _transposed_last(kt)
    if k is None or not _only_user(kt, mm):
        return "k is not transposed in its last two dimensions (or the transpose has another reader)"
    chain += [mm, kt]
    q_scaled = _scale_of(q)
    if q_scaled is not None and _users(q) == [mm]:
        chain.append(q)
        q, scale = q_scaled[0], scale * q_scaled[1]
    vq, vk, vv = _val(q), _val(k), _val(v)
    if vq is None or vk is None or vv is None or not (vq.dim() == vk.dim() == vv.dim() >= 3):
        return "q, k and v are not batched tensors of one rank"
    if vq.shape[:-2] != vk.shape[:-2] or vk.shape[:-2] != vv.shape[:-2] or vq.shape[-1] != vk.shape[-1] \
            or vk.shape[-2] != vv.shape[-2] or not (vq.dtype == vk.dtype == vv.dtype == vx.dtype):
        return "q, k and v differ in their batch dimensions, sizes or dtypes"
    if temperature is not None and tuple(torch.broadcast_shapes(vq.shape, _val(temperature).shape)) != tuple(vq.shape):
        return "the temperature does not broadcast over q"
    vm = _val(mask) if mask is not None else None
    if mask is not None and (vm is None or (mask_bool and vm.dtype != torch.bool)
                             or (not mask_bool and vm.dtype not in (vq.dtype, torch.bool)) or vm.dim() > vq.dim()):
        return "the mask's dtype or rank is not one scaled_dot_product_attention takes"
    if mask is not None and not mask_bool and vm.dtype == torch.bool:
        return "a bool tensor is added to the scores"  # not a mask SDPA reads the same way
    return q, k, v, mask, mask_bool, scale, chain, out, temperature


def rewrite_attention(gm: torch.fx.GraphModule) -> tuple[Rewrite, ...]:
    """Replace every matching hand-written attention in ``gm`` (in place) with one SDPA call."""
    done: list[Rewrite] = []
    while True:  # one at a time: a rewrite replaces nodes a later pattern may read
        found = next((m for m in map(_match, [n for n in gm.graph.nodes if _op(n, *_SOFTMAXES)]) if m), None)
        if found is None:
            break
        q, k, v, mask, mask_bool, scale, chain, out, temperature = found
        g = gm.graph
        with g.inserting_before(out):
            if temperature is not None:  # (q @ k^T) * t == (q * t) @ k^T for t constant over the last two dims
                q = g.call_function(aten.mul.Tensor, (q, temperature))
            if mask is not None and mask_bool:
                mask = g.call_function(aten.logical_not.default, (mask,))  # masked_fill(m, -inf) keeps ~m
            sdpa = g.call_function(aten.scaled_dot_product_attention.default, (q, k, v),
                                   {"attn_mask": mask, "dropout_p": 0.0, "is_causal": False, "scale": scale})
        sdpa.meta.update({k_: v_ for k_, v_ in out.meta.items() if k_ in ("nn_module_stack", "stack_trace", "val")})
        out.replace_all_uses_with(sdpa)
        order = {n: i for i, n in enumerate(g.nodes)}
        before = len(g.nodes)
        for n in sorted([out, *chain], key=order.__getitem__, reverse=True):  # readers before what they read
            for u in [u for u in n.users if u.target in _CHECKS]:  # the asserts on the removed values go too
                g.erase_node(u)
            if not n.users:  # dropout counts as impure for dead-code elimination: erased by hand
                g.erase_node(n)
        done.append(Rewrite(module_path(sdpa), mask is not None, scale, before - len(g.nodes) + (temperature is not None),
                            temperature is not None))
    if done:
        gm.recompile()
    return tuple(done)


def unmatched(gm: torch.fx.GraphModule) -> tuple[tuple[str, str], ...]:
    """(module, why) of every softmax between two matrix products that is not rewritten."""
    out = []
    for sm in [n for n in gm.graph.nodes if _op(n, *_SOFTMAXES)]:
        why = _match_or_why(sm)
        if isinstance(why, str) and between_products(sm, _MATMULS, 4):
            out.append((module_path(sm), why))
    return tuple(out)
