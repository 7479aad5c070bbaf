"""Coupled channel groups: which channels of which layers must be cut together.

One forward pass on fake tensors (nothing computed, so a 70B model costs seconds) under a
``TorchDispatchMode`` that follows a *channel label* for every element of every activation.

- An activation carries ``lab``: an int array broadcastable to its shape (size 1 on dims that
  carry no channel identity: batch, sequence, spatial), or None.
- Every parameter and buffer dim has its own labels, one per index.
- Data movement moves labels exactly: view/reshape (dim groups), permute/transpose, cat,
  split/slice, expand, squeeze/unsqueeze. So ShuffleNet's view-transpose-view shuffle, attention
  heads and GQA's repeat_kv are followed element by element.
- Element-wise ops unite the labels of their operands, except along a broadcast dim.
- Contractions (mm/addmm/bmm/convolution/attention) unite the contracted labels of both operands.
  Their output takes the labels of the weight's output dim, or of the free dim of the operand
  that has them. So q is coupled with k, and v with the output projection.
- Depthwise convolutions pass labels through. Norms unite their per-channel parameters with the
  channels they normalise.

A union-find over labels gives channel *classes*: sets of parameter indices that must go
together. Classes with the same members (the same parameter dims) form a *group*; cutting k
channels of a group removes k classes.

A class is *pinned* (cannot be cut by module surgery) when:
- it reaches a model output;
- it meets an unlabeled tensor (the model input, a tensor made in forward) along its dim;
- it goes through a view that splits or merges a channel dim with another non-trivial dim
  (head splits, channel shuffles: forward code reshapes with constants, so only uniform cuts of
  whole units fit);
- it meets a grouped convolution;
- it meets an op archscan has no rule for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from ..costs import storage_key
from ..costs.kernels import run_op
from ..load.recording import run_higher_order

aten = torch.ops.aten


def unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-D array: its values sorted, once each. numpy's imports
    ``numpy.ma``, 5 ms of every scan that finds channel groups."""
    values = np.sort(values, kind="stable")
    return values[np.r_[True, values[1:] != values[:-1]]] if len(values) else values


def unique_rows(rows: np.ndarray) -> tuple[int, np.ndarray]:
    """(how many distinct rows, each row's rank among them): ``np.unique(rows, axis=0,
    return_inverse=True)`` without its ``numpy.ma`` import (``torch.unique(dim=0)`` is slower still)."""
    order = np.lexsort(rows.T[::-1])
    ordered = rows[order]
    new = np.r_[True, np.any(ordered[1:] != ordered[:-1], axis=1)] if len(rows) else np.zeros(0, dtype=bool)
    rank = np.empty(len(rows), dtype=np.int64)
    rank[order] = np.cumsum(new) - 1
    return int(new.sum()), rank


def _broadcast_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two label arrays broadcast to where either varies."""
    target = tuple(max(x, y) for x, y in zip(a.shape, b.shape))
    if math.prod(target) > 50_000_000:
        raise _Unsupported("labels too large to unite")
    return np.broadcast_to(a, target), np.broadcast_to(b, target)


class UnionFind:
    """Union-find over int labels, vectorised with numpy (labels are allocated in blocks)."""

    def __init__(self):
        self._parent = np.zeros(1 << 16, dtype=np.int64)
        self.size = 0

    @property
    def parent(self) -> np.ndarray:
        return self._parent[:self.size]

    def new(self, n: int) -> np.ndarray:
        start, end = self.size, self.size + n
        if end > len(self._parent):  # grow by doubling: labels for a 70B model are made in a thousand blocks
            grown = np.zeros(max(end, 2 * len(self._parent)), dtype=np.int64)
            grown[:start] = self._parent[:start]
            self._parent = grown
        self._parent[start:end] = np.arange(start, end, dtype=np.int64)
        self.size = end
        return np.arange(start, end, dtype=np.int64)

    def find(self, x: np.ndarray) -> np.ndarray:
        parent = self._parent
        x = np.asarray(x, dtype=np.int64)
        root = parent[x]
        while True:
            nxt = parent[root]
            if (nxt == root).all():  # same shape: cheaper than np.array_equal's checks
                break
            root = nxt
        parent[x] = root  # path compression for the labels asked about
        return root

    def union(self, a: np.ndarray, b: np.ndarray) -> None:
        a, b = np.ravel(a), np.ravel(b)
        if a.size == 0:
            return
        while True:
            ra, rb = self.find(a), self.find(b)
            differ = ra != rb
            if not differ.any():
                return
            lo, hi = np.minimum(ra, rb)[differ], np.maximum(ra, rb)[differ]
            self._parent[hi] = lo

    def roots(self) -> np.ndarray:
        return self.find(np.arange(self.size))


@dataclass
class _ParamView:
    """A parameter (or buffer) seen through views: for each dim of the view, the parameter dim it
    is and which of that dim's indices it covers (None: a dim the parameter does not have)."""

    name: str
    dims: list  # per view dim: (param_dim, index array) or None


@dataclass
class Member:
    """One parameter dim in a group: which of its indices belong to each channel of the group."""

    param: str
    dim: int
    size: int


@dataclass
class ChannelGroup:
    """Channels that must be cut together: ``channels`` classes, each holding indices of every member.

    ``indices[(param, dim)]`` is a [channels, k] array: channel c of the group is indices
    ``indices[(param, dim)][c]`` of that parameter dim (k > 1 when one channel spans several
    indices: a GQA key head serving several query heads).
    """

    id: int
    members: list[Member]
    channels: int
    producers: list[str]      # parameters whose dim creates these channels (conv/linear outputs, embeddings)
    pinned: str | None        # why the group cannot be cut by surgery, or None
    indices: dict = field(default_factory=dict, repr=False)

    @property
    def modules(self) -> list[str]:
        return sorted({m.param.rpartition(".")[0] for m in self.members})


_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view.dtype}
_SAME = {aten.clone.default, aten.alias.default, aten.detach.default, aten._to_copy.default, aten.contiguous.default,
         aten.lift_fresh_copy.default, aten.lift_fresh.default, aten.dropout.default, aten.native_dropout.default,
         aten._softmax.default, aten.softmax.int, aten._log_softmax.default, aten._safe_softmax.default,
         aten.relu_.default, aten.hardtanh_.default, aten.silu_.default,
         # unary element-wise ops torch does not tag pointwise (and the in-place forms of some it does)
         aten.hardswish.default, aten.hardswish_.default, aten.mish_.default, aten.gelu_.default,
         aten.threshold_.default}
# element-wise with a per-channel weight broadcast to the input (PReLU's, viewed to [C, 1, 1])
_POINTWISE_UNTAGGED = {aten._prelu_kernel.default}
# channel-wise ops: the output keeps the input's labels (sizes change only on unlabeled dims)
_CHANNELWISE = {aten.max_pool2d_with_indices.default, aten.max_pool2d.default, aten.avg_pool2d.default,
                aten.max_pool1d.default, aten.avg_pool1d.default, aten.max_pool3d_with_indices.default,
                aten.avg_pool3d.default, aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default,
                aten.adaptive_max_pool2d.default, aten._adaptive_avg_pool3d.default, aten.adaptive_avg_pool1d.default,
                aten.upsample_nearest2d.default, aten.upsample_bilinear2d.default, aten.upsample_nearest2d.vec,
                aten.upsample_bilinear2d.vec, aten.constant_pad_nd.default, aten.reflection_pad2d.default,
                aten.replication_pad2d.default}
_FACTORIES = {aten.empty.memory_format, aten.zeros.default, aten.ones.default, aten.full.default, aten.arange.default,
              aten.arange.start, aten.arange.start_step, aten.empty_like.default, aten.zeros_like.default,
              aten.ones_like.default, aten.full_like.default, aten.scalar_tensor.default, aten.rand.default,
              aten.randn.default, aten.empty_strided.default, aten.new_empty.default, aten.new_zeros.default,
              aten.new_ones.default, aten.new_full.default}
_REDUCTIONS = {aten.mean.dim, aten.sum.dim_IntList, aten.amax.default, aten.amin.default, aten.var.correction,
               aten.std.correction, aten.var_mean.correction, aten.logsumexp.default, aten.norm.ScalarOpt_dim,
               aten.linalg_vector_norm.default}
_SDPA = tuple(getattr(aten, n).default for n in ("_scaled_dot_product_flash_attention_for_cpu",
                                                  "_scaled_dot_product_flash_attention",
                                                  "_scaled_dot_product_efficient_attention",
                                                  "_scaled_dot_product_cudnn_attention",
                                                  "scaled_dot_product_attention") if hasattr(aten, n))
_BATCH_NORMS = {aten.native_batch_norm.default, aten._native_batch_norm_legit_no_training.default,
                aten._native_batch_norm_legit.default, aten.batch_norm.default, aten.cudnn_batch_norm.default}


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


class LabelMode(TorchDispatchMode):
    """Follows channel labels through every aten op (see the module docstring)."""

    def __init__(self, params: dict, uf: UnionFind):
        super().__init__()
        self.uf = uf
        self.params = params                 # storage key -> parameter/buffer name
        self.param_labels: dict[str, list[np.ndarray]] = {}  # name -> per dim labels
        self.param_shapes: dict[str, tuple] = {}
        # keyed by the tensor itself, weakly: an entry goes with its tensor (whose id may then be
        # reused), and the mode keeps no tensor alive (the memory tracker beside it sees the frees)
        self.views: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> param view
        self.labs: WeakIdKeyDictionary = WeakIdKeyDictionary()   # activation -> labels
        self.pinned: dict[str, list[np.ndarray]] = {}  # reason -> label arrays
        self.producers: set[tuple[str, int]] = set()
        self.unknown: dict[str, int] = {}

    # --- what a tensor carries --------------------------------------------------------------
    def _param_view(self, t: torch.Tensor) -> _ParamView | None:
        if t in self.views:
            return self.views[t]
        name = self.params.get(storage_key(t))
        if name is None or t in self.labs:
            return None
        if name not in self.param_labels:
            self.param_labels[name] = [self.uf.new(s) for s in t.shape]
            self.param_shapes[name] = tuple(t.shape)
        if tuple(t.shape) != self.param_shapes[name]:
            return None  # a view of a parameter made outside the ops seen here
        view = _ParamView(name, [(d, np.arange(s)) for d, s in enumerate(t.shape)])
        self.views[t] = view
        return view

    def _view_labels(self, view: _ParamView) -> list[np.ndarray | None]:
        return [self.param_labels[view.name][d][idx] if d is not None else None for d, idx in
                ((x if x is not None else (None, None)) for x in view.dims)]

    def lab(self, t: torch.Tensor) -> np.ndarray | None:
        """An activation's labels as an array broadcastable to it; a parameter view's labels
        when it has one labelled dim (a bias, a norm weight); None when unlabelled."""
        if t in self.labs:
            return self.labs[t]
        view = self._param_view(t)
        if view is None:
            return None
        per_dim = self._view_labels(view)
        labelled = [i for i, (x, s) in enumerate(zip(per_dim, t.shape)) if x is not None and s > 1]
        if len(labelled) != 1:
            return None  # a matrix: contractions read its dims one by one
        i = labelled[0]
        shape = [1] * t.dim()
        shape[i] = t.shape[i]
        return per_dim[i].reshape(shape)

    def pin(self, reason: str, *labs) -> None:
        for lab in labs:
            if lab is not None:
                self.pinned.setdefault(reason, []).append(np.ravel(lab))

    def set(self, out, lab) -> None:
        for t in _tensors(out):
            self.labs[t] = lab

    # --- dispatch ---------------------------------------------------------------------------
    supports_higher_order_operators = True  # torch.cond: its branch's ops, one by one (run_higher_order)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return run_higher_order(self, func, args, kwargs)
        out = run_op(func, args, kwargs)
        if func.namespace == "prim":
            return out
        try:
            self.rule(func, args, kwargs, out)
        except _Unsupported as exc:
            self.unsupported(func, args, kwargs, out, str(exc))
        except (ValueError, IndexError, TypeError) as exc:  # shapes no rule foresaw: the op's labels are fixed
            self.unsupported(func, args, kwargs, out, f"{type(exc).__name__}: {exc}")
        return out

    def unsupported(self, func, args, kwargs, out, why: str = "") -> None:
        self.unknown[str(func)] = self.unknown.get(str(func), 0) + 1
        for t in _tensors((args, kwargs)):
            self.pin(f"{func} has no channel rule" + (f" ({why})" if why else ""), self.lab(t))
            view = self._param_view(t) if t not in self.labs else None
            if view is not None:
                self.pin(f"{func} has no channel rule", *[x for x in self._view_labels(view) if x is not None])
        self.set(out, None)

    def rule(self, func, args, kwargs, out) -> None:
        if func in _FACTORIES:
            return self.set(out, None)
        if func in _SAME:
            return self._same(args, out)
        if torch.Tag.pointwise in func.tags or func in _POINTWISE_UNTAGGED:
            return self._pointwise(func, args, kwargs, out)
        if func is aten.roll.default:
            return self._roll(args, out)
        if func in _VIEWS:
            return self._view(args[0], out)
        handler = _HANDLERS.get(func.overloadpacket)
        if handler is not None:
            return handler(self, func, args, kwargs, out)
        if func in _CHANNELWISE:
            return self._channelwise(args[0], out)
        if func in _REDUCTIONS:
            return self._reduce(args, kwargs, out)
        if func in _BATCH_NORMS:
            return self._batch_norm(args, out)
        if func in _SDPA:
            return self._sdpa(args, out)
        raise _Unsupported("")

    # --- rule helpers -------------------------------------------------------------------------
    def _same(self, args, out) -> None:
        x = args[0]
        view = self._param_view(x) if x not in self.labs else None
        outs = _tensors(out)
        if view is not None and outs and outs[0].shape == x.shape:
            self.views[outs[0]] = view
            return
        lab = self.lab(x)
        first = outs[0] if outs else None
        self.set(first, lab if first is not None and lab is not None and _fits(lab, first.shape) else None)
        for other in outs[1:]:
            self.set(other, None)

    def _pointwise(self, func, args, kwargs, out) -> None:
        outs = _tensors(out)
        if not outs:
            return
        shape = outs[0].shape
        operands = [t for t in _tensors((args, kwargs)) if t.dim() <= len(shape)]
        labs = []
        for t in operands:
            lab = self.lab(t)
            if lab is None:
                if t.numel() > 1 and (t in self.labs or self.params.get(storage_key(t)) is None):
                    labs.append(("bare", t))
                continue
            labs.append(("lab", _align(lab, t.shape, shape)))
        labelled = [x for kind, x in labs if kind == "lab"]
        if not labelled:
            return self.set(outs[0], None)
        result = labelled[0]
        for other in labelled[1:]:
            result = self._unite(result, other, shape)
        for t in operands:  # a parameter with several labelled dims (a position table, a rotary cache)
            view = self._param_view(t) if t not in self.labs else None
            if view is None or self.lab(t) is not None:
                continue
            offset = len(shape) - t.dim()
            for i, per in enumerate(self._view_labels(view)):
                p = offset + i
                if per is not None and t.shape[i] > 1 and result.shape[p] > 1:
                    along = [1] * len(shape)
                    along[p] = len(per)
                    self._unite(result, per.reshape(along), None)
        for kind, t in labs:
            if kind == "bare":  # an unlabelled tensor varies where the labels do: those channels are fixed
                bare = [len(shape) - t.dim() + i for i, s in enumerate(t.shape) if s > 1]
                varying = [i for i, s in enumerate(result.shape) if s > 1]
                if set(bare) & set(varying):
                    self.pin("element-wise with a tensor that has no channel identity (an input, or made in forward)",
                             result)
        self.set(outs[0], result)
        for o in outs[1:]:
            self.set(o, None)

    def _unite(self, a: np.ndarray, b: np.ndarray, shape) -> np.ndarray:
        """Unite two label arrays element by element (both broadcast to where either varies)."""
        self.uf.union(*_broadcast_pair(a, b))
        # the result: the finer of the two (the one varying along more dims)
        return a if a.size >= b.size else b

    def _unite_all(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """``_unite`` of several pairs in one union (a norm's weight, bias and statistics with its input)."""
        if pairs:
            full = [_broadcast_pair(a, b) for a, b in pairs]
            self.uf.union(np.concatenate([np.ravel(a) for a, _ in full]), np.concatenate([np.ravel(b) for _, b in full]))

    def _view(self, x: torch.Tensor, out: torch.Tensor) -> None:
        _view_like(self, x, out, pin_splits=True)

    def _roll(self, args, out) -> None:
        """``torch.roll``: each position's labels move with it (Swin's shifted windows roll the
        spatial dims, so the channel labels stay where they are)."""
        x, shifts, dims = args[0], args[1], (args[2] if len(args) > 2 else [])
        lab = self.lab(x)
        if lab is None:
            return self.set(out, None)
        if not dims:  # rolled as a flat tensor: the labels of a broadcast array cannot follow
            if lab.size > 1:
                self.pin("torch.roll over the flattened tensor", lab)
            return self.set(out, None)
        full = np.broadcast_to(lab, x.shape) if any(lab.shape[d] != x.shape[d] for d in dims if lab.shape[d] != 1) else lab
        self.set(out, np.roll(full, shifts, dims))

    def _channelwise(self, x, out) -> None:
        lab = self.lab(x)
        outs = _tensors(out)
        ok = lab is not None and lab.ndim == outs[0].dim() and all(
            s == 1 or s == o for s, o in zip(lab.shape, outs[0].shape))
        self.set(outs[0], lab if ok else None)
        if lab is not None and not ok:
            self.pin("a pooling or resize that changes a channel dim", lab)
        for o in outs[1:]:
            self.set(o, lab if ok and o.shape == outs[0].shape else None)

    def _reduce(self, args, kwargs, out) -> None:
        x = args[0]
        lab = self.lab(x)
        outs = _tensors(out)
        if lab is None:
            return self.set(out, None)
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        dims = list(range(x.dim())) if dims is None else ([dims] if isinstance(dims, int) else list(dims))
        dims = [d % x.dim() for d in dims]
        keepdim = bool(args[2]) if len(args) > 2 and isinstance(args[2], bool) else bool(kwargs.get("keepdim", False))
        if any(lab.shape[d] > 1 for d in dims):
            return self.set(out, None)  # reduced over the channels: no channel identity left
        new = lab if keepdim else lab.reshape([s for i, s in enumerate(lab.shape) if i not in dims])
        for o in outs:
            self.set(o, new if _fits(new, o.shape) else None)

    def _batch_norm(self, args, out) -> None:
        x, weight, bias, mean, var = args[:5]
        lab = self.lab(x)
        channels = [self._dim_labels(p, 0) for p in (weight, bias, mean, var) if isinstance(p, torch.Tensor)]
        outs = _tensors(out)
        if lab is not None:
            self._unite_all([(c.reshape([1, -1] + [1] * (x.dim() - 2)), lab) for c in channels if c is not None])
        elif channels and channels[0] is not None:
            self.pin("a norm over channels with no identity", *channels)
        self.set(outs[0], lab)
        for o in outs[1:]:
            self.set(o, None)

    def _dim_labels(self, t: torch.Tensor, dim: int) -> np.ndarray | None:
        """Labels of one dim of a parameter view (or of an activation that varies along only that dim)."""
        view = self._param_view(t) if t not in self.labs else None
        if view is not None:
            d = view.dims[dim]
            return self.param_labels[view.name][d[0]][d[1]] if d is not None else None
        lab = self.lab(t)
        if lab is None or lab.shape[dim] != t.shape[dim] or any(s > 1 for i, s in enumerate(lab.shape) if i != dim):
            return None
        return lab.reshape(-1)

    def _sdpa(self, args, out) -> None:
        q, k, v = args[:3]
        lq, lk, lv = self.lab(q), self.lab(k), self.lab(v)
        if lq is not None and lk is not None:
            # contracted over E, batched over the head dims: unite q's and k's (heads, E) labels
            lq_h = _squeeze_free(lq, -2)
            lk_h = _squeeze_free(lk, -2)
            if lq_h is None or lk_h is None:
                raise _Unsupported("attention labels vary along the sequence")
            self._unite(lq_h, lk_h, None)
        elif lq is not None or lk is not None:
            self.pin("attention with an unlabelled query or key", lq, lk)
        outs = _tensors(out)
        lo = None
        if lv is not None:
            lo = _squeeze_free(lv, -2)
            if lo is None:
                raise _Unsupported("attention values vary along the sequence")
        self.set(outs[0], lo if lo is None or _fits(lo, outs[0].shape) else None)
        for o in outs[1:]:
            self.set(o, None)


class _Unsupported(Exception):
    pass


def _fits(lab: np.ndarray, shape) -> bool:
    return lab.ndim == len(shape) and all(s == 1 or s == d for s, d in zip(lab.shape, shape))


def _align(lab: np.ndarray, shape, out_shape) -> np.ndarray:
    """``lab`` (for a tensor of ``shape``) right-aligned to ``out_shape``; broadcast dims get size 1."""
    lab = lab.reshape((1,) * (len(out_shape) - lab.ndim) + lab.shape)
    full = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    keep = [slice(None) if f == o else slice(0, 1) for f, o in zip(full, out_shape)]
    return lab[tuple(keep)] if any(f != o for f, o in zip(full, out_shape)) else lab


def _squeeze_free(lab: np.ndarray, dim: int) -> np.ndarray | None:
    """``lab`` with ``dim`` (a free, unlabelled dim) kept at size 1; None when labels vary along it."""
    return lab if lab.shape[dim] == 1 else None


def _groups_of_dims(a: tuple, b: tuple) -> list[tuple[list[int], list[int]]]:
    """Split a reshape from ``a`` to ``b`` into runs of dims with equal products."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        gi, gj = [], []
        pa = pb = 1
        while True:
            if pa <= pb and i < len(a):
                gi.append(i)
                pa *= a[i]
                i += 1
            elif j < len(b):
                gj.append(j)
                pb *= b[j]
                j += 1
            else:
                break
            if pa == pb and (i == len(a) or a[i] != 1 or pb != 1) and gi and gj:
                # absorb trailing size-1 dims on either side into this group
                while i < len(a) and a[i] == 1 and (j >= len(b) or b[j] != 1):
                    gi.append(i)
                    i += 1
                while j < len(b) and b[j] == 1 and (i >= len(a) or a[i] != 1):
                    gj.append(j)
                    j += 1
                break
        groups.append((gi, gj))
    return groups


def _reshape_labels(lab: np.ndarray, a: tuple, b: tuple) -> tuple[np.ndarray, bool]:
    """Labels through a view from shape ``a`` to ``b`` (dim groups with equal products), and
    whether a labelled dim was split or merged with another non-trivial dim."""
    if math.prod(a) == 0:
        return np.zeros([1] * len(b), dtype=np.int64), False
    groups = _groups_of_dims(a, b)
    new_shape, full_shape, split = [], [], False
    for gi, gj in groups:
        varies = any(lab.shape[i] > 1 for i in gi)
        if varies:
            full_shape += [a[i] for i in gi]
            new_shape += [b[j] for j in gj]
            big_in = sum(1 for i in gi if a[i] > 1)
            big_out = sum(1 for j in gj if b[j] > 1)
            if big_in > 1 or big_out > 1:
                split = True
        else:
            full_shape += [1] * len(gi)
            new_shape += [1] * len(gj)
    full = np.broadcast_to(lab, full_shape)
    return np.ascontiguousarray(full).reshape(new_shape), split


def _view_param(view: _ParamView, a: tuple, b: tuple) -> _ParamView | None:
    """A parameter view through a view that only adds or removes size-1 dims (None otherwise)."""
    if [s for s in a if s != 1] != [s for s in b if s != 1]:
        return None
    real = [d for d, s in zip(view.dims, a) if s != 1]
    dims, k = [], 0
    for s in b:
        if s == 1:
            dims.append(None)
        else:
            dims.append(real[k])
            k += 1
    return _ParamView(view.name, dims)


# --- handlers for ops with their own rules ---------------------------------------------------------

def _h_permute(m: LabelMode, func, args, kwargs, out):
    x, dims = args[0], list(args[1])
    view = m._param_view(x) if x not in m.labs else None
    if view is not None:
        m.views[out] = _ParamView(view.name, [view.dims[d] for d in dims])
        return
    lab = m.lab(x)
    m.set(out, np.transpose(lab, dims) if lab is not None else None)


def _h_transpose(m: LabelMode, func, args, kwargs, out):
    x = args[0]
    d0, d1 = (args[1], args[2]) if len(args) > 2 else (0, 1)
    dims = list(range(x.dim()))
    if dims:
        d0, d1 = d0 % x.dim(), d1 % x.dim()
        dims[d0], dims[d1] = dims[d1], dims[d0]
    _h_permute(m, func, (x, dims), kwargs, out)


def _h_expand(m: LabelMode, func, args, kwargs, out):
    x = args[0]
    view = m._param_view(x) if x not in m.labs else None
    extra = out.dim() - x.dim()
    if view is not None:
        dims = [None] * extra + [d if s == o else None for d, s, o in zip(view.dims, x.shape, out.shape[extra:])]
        m.views[out] = _ParamView(view.name, dims)
        return
    lab = m.lab(x)
    m.set(out, lab.reshape((1,) * extra + lab.shape) if lab is not None else None)


def _h_reshape(m: LabelMode, func, args, kwargs, out):
    """unsqueeze, squeeze, flatten, unflatten: a view of the first argument."""
    _view_like(m, args[0], out)


def _view_like(m: LabelMode, x, out, pin_splits: bool = False) -> None:
    """Labels (or a parameter view) through a view; with ``pin_splits``, channels a view splits or
    merges with another non-trivial dim are pinned (reshape/view; squeeze and friends cannot)."""
    view = m._param_view(x) if x not in m.labs else None
    if view is not None:
        mapped = _view_param(view, tuple(x.shape), tuple(out.shape))
        if mapped is not None:
            m.views[out] = mapped
            return
    lab = m.lab(x)
    if lab is None:
        return m.set(out, None)
    new, split = _reshape_labels(lab, tuple(x.shape), tuple(out.shape))
    if split and pin_splits:
        m.pin("a view splits or merges channels with another dim (heads, channel shuffle): "
              "only uniform cuts of whole units fit the model's code", lab)
    m.set(out, new)


def _h_slice(m: LabelMode, func, args, kwargs, out):
    x = args[0]
    dim = (args[1] if len(args) > 1 else 0) % max(1, x.dim())
    start = args[2] if len(args) > 2 else None
    end = args[3] if len(args) > 3 else None
    step = args[4] if len(args) > 4 else 1
    index = np.arange(x.shape[dim])[slice(start, end, step)] if x.dim() else None
    view = m._param_view(x) if x not in m.labs else None
    if view is not None:
        dims = list(view.dims)
        d = dims[dim]
        dims[dim] = (d[0], d[1][index]) if d is not None else None
        m.views[out] = _ParamView(view.name, dims)
        return
    lab = m.lab(x)
    if lab is not None and lab.shape[dim] > 1:
        lab = np.take(lab, index, axis=dim)
    m.set(out, lab)


def _h_select(m: LabelMode, func, args, kwargs, out):
    x, dim, i = args[0], args[1] % args[0].dim(), args[2]
    lab = m.lab(x)
    if lab is None:
        return m.set(out, None)
    picked = np.take(lab, [i % x.shape[dim]] if lab.shape[dim] > 1 else [0], axis=dim)
    m.set(out, np.squeeze(picked, axis=dim))


def _h_split(m: LabelMode, func, args, kwargs, out):
    x = args[0]
    outs = list(out)
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % x.dim()
    lab = m.lab(x)
    start = 0
    for o in outs:
        n = o.shape[dim]
        part = lab
        if lab is not None and lab.shape[dim] > 1:
            part = np.take(lab, np.arange(start, start + n), axis=dim)
        m.set(o, part)
        start += n


def _h_unbind(m: LabelMode, func, args, kwargs, out):
    x = args[0]
    dim = (args[1] if len(args) > 1 else 0) % x.dim()
    lab = m.lab(x)
    for i, o in enumerate(out):
        if lab is None:
            m.set(o, None)
        else:
            part = np.take(lab, [i] if lab.shape[dim] > 1 else [0], axis=dim)
            m.set(o, np.squeeze(part, axis=dim))


def _h_cat(m: LabelMode, func, args, kwargs, out):
    tensors = [t for t in args[0] if t.numel() > 0 or t.dim() > 1]
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % out.dim()
    labs = [m.lab(t) for t in tensors]
    if all(lab is None for lab in labs):
        return m.set(out, None)
    along = any(lab is not None and lab.shape[dim] > 1 for lab in labs)
    if along:  # channels concatenated: labels side by side; an unlabelled part gets labels of its own, pinned
        parts = []
        other = [max((lab.shape[i] if lab is not None else 1) for lab in labs) for i in range(out.dim())]
        for t, lab in zip(tensors, labs):
            shape = list(other)
            shape[dim] = t.shape[dim]
            if lab is None or lab.shape[dim] == 1 and t.shape[dim] > 1:
                fresh = m.uf.new(math.prod(shape)).reshape(shape)
                m.pin("concatenated with a tensor that has no channel identity", fresh)
                if lab is not None:
                    m._unite(np.broadcast_to(lab, shape), fresh, None)
                parts.append(fresh)
            else:
                parts.append(np.broadcast_to(lab, shape))
        return m.set(out, np.concatenate(parts, axis=dim))
    # concatenated along an unlabelled dim (sequence, batch): the other dims' labels unite
    result = None
    for t, lab in zip(tensors, labs):
        if lab is None:
            if t.numel() > 1:
                m.pin("concatenated with a tensor that has no channel identity", *(x for x in labs if x is not None))
            continue
        result = lab if result is None else m._unite(result, lab, None)
    m.set(out, result)


def _h_mm(m: LabelMode, func, args, kwargs, out):
    """mm / addmm / bmm / baddbmm: [.., n, k] @ [.., k, m]."""
    bias = None
    if func.overloadpacket in (aten.addmm, aten.baddbmm):
        bias, a, b = args[:3]
    else:
        a, b = args[:2]
    out_lab = _contract(m, a, b, out)
    if bias is not None:
        lb = m.lab(bias)
        if lb is not None:
            aligned = _align(lb, bias.shape, out.shape)
            out_lab = aligned if out_lab is None else m._unite(out_lab, aligned, out.shape)
    m.set(out, out_lab)


def _contract(m: LabelMode, a, b, out) -> np.ndarray | None:
    """Unite the contracted dim of ``a`` (last) and ``b`` (second last); the output's labels come
    from a weight's output dim, else from whichever operand's free dim carries labels."""
    va = m._param_view(a) if a not in m.labs else None
    vb = m._param_view(b) if b not in m.labs else None
    if va is not None and vb is not None:
        raise _Unsupported("two parameters multiplied")
    if vb is not None or va is not None:
        act, view, act_is_a = (a, vb, True) if vb is not None else (b, va, False)
        per_dim = m._view_labels(view)
        w_k = per_dim[-2] if act_is_a else per_dim[-1]   # the weight's contracted dim
        w_free = per_dim[-1] if act_is_a else per_dim[-2]
        lab = m.lab(act)
        k_dim = act.dim() - 1 if act_is_a else act.dim() - 2
        if w_k is not None:
            if lab is None or lab.shape[k_dim] == 1:
                m.pin("a layer reads a tensor with no channel identity (the model input)", w_k)
            else:
                shape = [1] * act.dim()
                shape[k_dim] = len(w_k)
                m._unite(lab, w_k.reshape(shape), None)
        if w_free is None:
            return None
        name, d = view.name, (view.dims[-1] if act_is_a else view.dims[-2])[0]
        m.producers.add((name, d))
        shape = [1] * out.dim()
        shape[-1 if act_is_a else -2] = len(w_free)
        return w_free.reshape(shape)
    la, lb = m.lab(a), m.lab(b)
    a_k = la is not None and la.shape[-1] > 1      # a's labels vary along the contracted dim
    b_k = lb is not None and lb.shape[-2] > 1
    a_n = la is not None and la.shape[-2] > 1      # ... and along its free dim
    b_m = lb is not None and lb.shape[-1] > 1
    if (a_k and a_n) or (b_k and b_m) or (a_n and b_m):
        raise _Unsupported("labels vary along several dims of a contraction")
    if a_k and b_k:  # a [.., 1, k] and b [.., k, 1]: unite along k and the batch dims
        m._unite(np.swapaxes(la, -1, -2), lb, None)
    elif a_k or b_k:
        m.pin("contracted with a tensor that has no channel identity", la if a_k else lb)
    if b_m:
        return lb if _fits(lb, out.shape) else None
    if a_n:
        return la if _fits(la, out.shape) else None
    return None


def _h_convolution(m: LabelMode, func, args, kwargs, out):
    x, w, bias = args[0], args[1], args[2]
    transposed = bool(args[6]) if len(args) > 6 else False
    groups = int(args[8]) if len(args) > 8 else 1
    view = m._param_view(w) if w not in m.labs else None
    if view is None:
        raise _Unsupported("a convolution whose weight is computed in forward")
    per_dim = m._view_labels(view)
    lab = m.lab(x)
    channels = x.shape[1]
    in_dim, out_dim = (0, 1) if transposed else (1, 0)
    depthwise = not transposed and groups > 1 and groups == channels and w.shape[0] == channels
    if depthwise:
        out_lab = None
        if lab is not None and lab.shape[1] > 1:
            m._unite(lab, per_dim[0].reshape([1, -1] + [1] * (x.dim() - 2)), None)
            out_lab = lab
        else:
            m.pin("a depthwise convolution on a tensor with no channel identity", per_dim[0])
            out_lab = per_dim[0].reshape([1, -1] + [1] * (x.dim() - 2))
            m.producers.add((view.name, view.dims[0][0]))
    elif groups > 1:
        m.pin("a grouped convolution: channels go in whole groups", lab, per_dim[0], per_dim[1])
        out_lab = per_dim[out_dim].reshape([1, -1] + [1] * (x.dim() - 2)) if per_dim[out_dim] is not None else None
        m.producers.add((view.name, view.dims[out_dim][0]))
    else:
        w_in = per_dim[in_dim]
        if lab is None or lab.shape[1] == 1:
            m.pin("a layer reads a tensor with no channel identity (the model input)", w_in)
        else:
            m._unite(lab, w_in.reshape([1, -1] + [1] * (x.dim() - 2)), None)
        out_lab = per_dim[out_dim].reshape([1, -1] + [1] * (x.dim() - 2))
        m.producers.add((view.name, view.dims[out_dim][0]))
    if isinstance(bias, torch.Tensor):
        bl = m._dim_labels(bias, 0)
        if bl is not None and out_lab is not None:
            m._unite(out_lab, bl.reshape(out_lab.shape[:1] + (-1,) + out_lab.shape[2:]), None)
    m.set(out, out_lab)


def _h_embedding(m: LabelMode, func, args, kwargs, out):
    w = args[0]
    view = m._param_view(w) if w not in m.labs else None
    if view is None:
        raise _Unsupported("an embedding whose table is computed in forward")
    per_dim = m._view_labels(view)
    m.producers.add((view.name, view.dims[1][0]))
    shape = [1] * out.dim()
    shape[-1] = len(per_dim[1])
    m.set(out, per_dim[1].reshape(shape))


def _h_layer_norm(m: LabelMode, func, args, kwargs, out):
    x, normalized = args[0], list(args[1])
    lab = m.lab(x)
    params = [p for p in args[2:4] if isinstance(p, torch.Tensor)]
    if len(normalized) == 1 and lab is not None:
        for p in params:
            pl = m._dim_labels(p, 0)
            if pl is not None:
                shape = [1] * x.dim()
                shape[-1] = len(pl)
                m._unite(lab, pl.reshape(shape), None)
    elif params:
        m.pin("a layer norm over several dims", *(m._dim_labels(p, 0) for p in params))
    outs = _tensors(out)
    m.set(outs[0], lab)
    for o in outs[1:]:
        m.set(o, None)


def _h_as_strided(m, func, args, kwargs, out):
    """``as_strided``/``as_strided_`` that keeps every element where it was (same sizes, same offset,
    the same stride on every dim longer than 1: a pool's [N, C, 1, 1] result restrided to
    channels-last) passes the labels; any other restride moves elements, and has no rule."""
    x, size, stride = args[0], list(args[1]), list(args[2])
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    keeps = (list(x.shape) == size and offset in (None, x.storage_offset())
             and all(s == t for n, s, t in zip(size, stride, x.stride()) if n > 1))
    if not keeps:
        raise _Unsupported("a restride that moves elements")
    m._same(args, out)


_HANDLERS = {
    aten.as_strided_: _h_as_strided, aten.as_strided: _h_as_strided,
    aten.permute: _h_permute, aten.transpose: _h_transpose, aten.t: _h_transpose, aten.numpy_T: _h_transpose,
    aten.expand: _h_expand, aten.unsqueeze: _h_reshape, aten.squeeze: _h_reshape, aten.flatten: _h_reshape,
    aten.unflatten: _h_reshape, aten.slice: _h_slice, aten.select: _h_select, aten.split: _h_split,
    aten.split_with_sizes: _h_split, aten.unbind: _h_unbind, aten.cat: _h_cat, aten.mm: _h_mm, aten.addmm: _h_mm,
    aten.bmm: _h_mm, aten.baddbmm: _h_mm, aten.convolution: _h_convolution, aten.embedding: _h_embedding,
    aten.native_layer_norm: _h_layer_norm,
}


# --- from labels to groups -------------------------------------------------------------------------

@dataclass
class Grouping:
    """Every channel group of a model, and what limited the analysis."""

    groups: list[ChannelGroup]
    unknown_ops: dict[str, int]
    param_shapes: dict[str, tuple]       # every parameter and buffer the forward read
    buffers: frozenset = frozenset()     # which of them are buffers (running statistics, caches)

    def group(self, gid: int) -> ChannelGroup:
        for g in self.groups:
            if g.id == gid:
                return g
        raise KeyError(gid)


def find_groups(model: torch.nn.Module, call, fake_mode) -> Grouping:
    """Run ``model`` once under ``LabelMode`` (on fake tensors, or in a direct run) and group its channels."""
    from ..load.recording import quiet

    mode = label_mode(model)
    with fake_mode, torch.no_grad(), mode, quiet():
        out = call(model)
    return grouping_of(mode, out, model)


def label_mode(model: torch.nn.Module) -> LabelMode:
    """A ``LabelMode`` that knows ``model``'s parameters and buffers (by storage)."""
    params: dict = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        params.setdefault(storage_key(t), name)
    return LabelMode(params, UnionFind())


def grouping_of(mode: LabelMode, out, model: torch.nn.Module) -> Grouping:
    """The channel groups ``mode`` found in a forward that returned ``out``."""
    from ..load.recording import output_tensors

    for t in output_tensors(out):
        mode.pin("reaches the model's output", mode.lab(t))
    grouping = _groups(mode)
    grouping.buffers = frozenset(name for name, _ in model.named_buffers(remove_duplicate=False))
    return grouping


class ChannelLabels:
    """The channel-group finder as a capture observer (``archscan.capture.Observer``): handed to
    the capture, it finds the groups in the capture's own run (``Captured.observed[key]``)."""

    key = "channel_groups"

    def mode(self, model: torch.nn.Module) -> LabelMode:
        return label_mode(model)

    def result(self, mode: LabelMode, output, model: torch.nn.Module) -> Grouping:
        return grouping_of(mode, output, model)


def _mix(x: np.ndarray, salt: int) -> np.ndarray:
    """A 64-bit mix of non-negative ints (splitmix64), for hashing class signatures; in place
    where it can be (a 70B model has tens of millions of them)."""
    z = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        z += np.uint64(salt)
        z *= np.uint64(0x9E3779B97F4A7C15)
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def _groups(mode: LabelMode) -> Grouping:
    """Classes (union-find roots) with the same members, each member with the same number of
    indices, form a group. Vectorised: a 70B model has millions of classes."""
    roots = mode.uf.roots()
    members = [(name, d) for name, dims in mode.param_labels.items() for d in range(len(dims))]
    arrays = [mode.param_labels[name][d] for name, d in members]
    if not arrays:
        return Grouping([], mode.unknown, mode.param_shapes)
    root = roots[np.concatenate(arrays)].astype(np.int32)  # labels fit in 31 bits; halves the memory
    del roots
    member = np.repeat(np.arange(len(members), dtype=np.int32), [len(a) for a in arrays])
    index = np.concatenate([np.arange(len(a), dtype=np.int32) for a in arrays])
    # elements are made per member in index order, so a stable sort by root keeps (member, index) order
    order = np.argsort(root, kind="stable")
    root, member, index = root[order], member[order], index[order]
    del order
    # runs of (root, member): one per member of each class, with its count of indices
    new_run = np.ones(len(root), dtype=bool)
    new_run[1:] = (root[1:] != root[:-1]) | (member[1:] != member[:-1])
    run_start = np.flatnonzero(new_run).astype(np.int32)
    del new_run
    run_count = np.diff(np.append(run_start, len(root))).astype(np.int32)
    run_root, run_member = root[run_start], member[run_start]
    # per class: a signature hash over its (member, count) runs, and whether a layer produces it
    new_class = np.ones(len(run_root), dtype=bool)
    new_class[1:] = run_root[1:] != run_root[:-1]
    class_start = np.flatnonzero(new_class)
    del new_class
    with np.errstate(over="ignore"):
        key = run_member.astype(np.int64) * 1_000_003 + run_count
        h1 = np.add.reduceat(_mix(key, 1), class_start)
        h2 = np.add.reduceat(_mix(key, 7), class_start)
        del key
    producer_ids = np.zeros(len(members), dtype=bool)
    for i, m in enumerate(members):
        producer_ids[i] = m in mode.producers
    produced = np.maximum.reduceat(producer_ids[run_member].astype(np.int8), class_start) > 0
    class_root = run_root[class_start]
    pinned_reason: dict[int, str] = {}
    for reason, labs in mode.pinned.items():
        for r in unique(mode.uf.find(np.concatenate(labs))) if labs else []:
            pinned_reason.setdefault(int(r), reason)
    keep = np.flatnonzero(produced)
    sig = np.stack([h1[keep], h2[keep]], axis=1)
    n_groups, which = unique_rows(sig)
    group_of_class = np.full(len(class_start), -1, dtype=np.int32)
    group_of_class[keep] = np.ravel(which)
    # every element with its class and group, sorted by (group, member, class, index): one pass
    elem_class = np.cumsum(np.r_[True, root[1:] != root[:-1]], dtype=np.int32) - 1
    del root
    elem_group = group_of_class[elem_class]
    live = np.flatnonzero(elem_group >= 0)
    g_e, c_e = elem_group[live], elem_class[live]
    del elem_group, elem_class
    m_e, i_e = member[live], index[live]
    del live
    # (group, member) as one key; the stable sort keeps the (class, index) order within it
    order = np.argsort(g_e.astype(np.int64) * len(members) + m_e, kind="stable")
    g_e, m_e, c_e, i_e = g_e[order], m_e[order], c_e[order], i_e[order]
    del order
    g_bounds = np.searchsorted(g_e, np.arange(n_groups + 1))
    first_class = np.full(n_groups, len(class_start), dtype=np.int64)  # group -> position of its first class
    np.minimum.at(first_class, which, keep)
    groups = []
    for g in range(n_groups):
        lo, hi = g_bounds[g], g_bounds[g + 1]
        first = int(first_class[g])
        start = class_start[first]
        stop = class_start[first + 1] if first + 1 < len(class_start) else len(run_root)
        sig_members, sig_counts = run_member[start:stop], run_count[start:stop]
        n_classes = int(hi - lo) // int(sig_counts.sum())
        indices, at = {}, lo
        for m_id, count in zip(sig_members.tolist(), sig_counts.tolist()):
            n = n_classes * count
            indices[members[m_id]] = i_e[at:at + n].reshape(n_classes, count)
            at += n
        first_producer = next((members[m] for m in sig_members.tolist() if producer_ids[m]), members[sig_members[0]])
        order_c = np.argsort(indices[first_producer][:, 0], kind="stable")  # channels in the producer's order
        indices = {k: v[order_c] for k, v in indices.items()}
        classes_here = unique(c_e[lo:hi])
        reason = next((pinned_reason[int(r)] for r in class_root[classes_here] if int(r) in pinned_reason), None)
        groups.append(ChannelGroup(
            id=0, members=[Member(members[m][0], members[m][1], len(mode.param_labels[members[m][0]][members[m][1]]))
                           for m in sig_members.tolist()],
            channels=n_classes, producers=sorted({members[m][0] for m in sig_members.tolist() if producer_ids[m]}),
            pinned=reason, indices=indices))
    groups.sort(key=lambda g: (g.producers[0] if g.producers else "", -g.channels))
    groups = _in_model_order(groups, list(mode.param_labels))
    for i, g in enumerate(groups):
        g.id = i
    return Grouping(groups, mode.unknown, mode.param_shapes)


def _in_model_order(groups: list[ChannelGroup], params: list[str]) -> list[ChannelGroup]:
    """Groups in the order their first producer runs."""
    rank = {p: i for i, p in enumerate(params)}
    return sorted(groups, key=lambda g: min((rank.get(p, 1 << 30) for p in g.producers), default=1 << 30))

