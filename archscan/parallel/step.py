"""One rank's training step under a parallel plan, on fake tensors in a fake process group.

The model is built on the meta device, parallelized there by torch.distributed's own code
(``plans``), and materialised inside a fake mode; then ``archscan.memory.train``'s step runs on
it (forward, the loss, backward, the optimizer) with a tracker that also sees:

- **DTensor's ops down to the local tensors** that hold the bytes (``MemoryTracker`` lets a
  wrapper subclass run its op and sees what it runs);
- **storages resized in place**: FSDP2 frees a block's unsharded parameters by resizing their
  storage to 0 bytes and refills them before the next all-gather (``UntypedStorage.resize_``);
- **every collective** with its shapes: FSDP2's ``c10d._allgather_base_`` and
  ``_reduce_scatter_base_`` (``allreduce_`` across HSDP's replicas), DTensor's
  ``_c10d_functional`` all-gathers, reduce-scatters and all-reduces (tensor parallel);
- nothing of DTensor's sharding propagation, which runs ops on fake tensors to learn output
  shapes and allocates nothing on a real rank.

The peak is rank 0's. Under ``torch.chunk``'s sharding the first ranks hold the largest shards,
so rank 0 is the worst; the ranks are alike when every sharded dimension divides its mesh
dimension (``ranks_alike``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ..errors import ArchscanError
from ..load.building import build_meta, make_call
from ..load.targets import InputSpec, ModelTarget
from ..load.recording import first_tensor
from ..memory import summary
from ..memory.scratch import nbytes
from ..memory.tracker import CATEGORIES
from ..memory.train import (
    AMP,
    TrainOptions,
    _analysed_step,
    _costs,
    _restored,
    _StepTracker,
    check_trainable,
)
from .comm import bus_bytes, collective_size
from .plans import parallelize
from .spec import ParallelSpec
from .world import fake_world, group_of, mesh_groups

# bytes FSDP2 holds beyond the sharded parameters: parameters all-gathered for a block's forward
# and backward, and the flat buffers its collectives read and write
PARALLEL_CATEGORIES = (*CATEGORIES, "unsharded_params", "allgather_buffers", "reduce_scatter_buffers", "ddp_buckets")

# collective op -> (kind, which argument is the send buffer, which the receive buffer; None: the result)
_C10D = {
    "_allgather_base_": ("all_gather", 1, 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1, 0),
    "allreduce_": ("all_reduce", 0, 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 1, 0),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 0),
    "broadcast_": ("broadcast", 0, 0),
}
_FUNCTIONAL = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all", "broadcast": "broadcast",
}


class ParallelTracker(_StepTracker):
    """The training step's tracker, with FSDP2's buffers filed in categories of their own and
    every collective recorded: (kind, op, phase, module, group size, send bytes, receive bytes, dtype,
    mesh dimension)."""

    def __init__(self):
        super().__init__()
        self.categories = PARALLEL_CATEGORIES
        self.resize_category = "unsharded_params"
        self.collectives: list[tuple] = []
        self.group_dims: dict[str, str] = {}  # process group name -> mesh dimension (``world.mesh_groups``)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace = func.namespace
        if namespace in ("c10d", "_c10d_functional") and not self.paused:
            return self._collective(func, types, args, kwargs)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _collective(self, func, types, args, kwargs):
        name = func.overloadpacket.__name__
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func.namespace == "c10d":
            if name not in _C10D:
                return out
            kind, send_at, recv_at = _C10D[name]
            send, recv = first_tensor(args[send_at]), first_tensor(args[recv_at])
            size, group = next((g for g in (group_of(a) for a in args if isinstance(a, torch.ScriptObject)) if g[0]),
                               (None, None))
            self._label(kind, send, recv)
        else:
            if name not in _FUNCTIONAL:  # wait_tensor, ...
                return out
            kind = _FUNCTIONAL[name]
            send, recv = args[0], out
            size, group = group_of(args[-1]) if isinstance(args[-1], str) else (None, None)
        if send is None or recv is None:
            return out
        if size is None:
            size = max(recv.numel() // max(send.numel(), 1), send.numel() // max(recv.numel(), 1))
        self.collectives.append((kind, f"{func.namespace}.{name}", self.phase, self.where if isinstance(self.where, str) else "",
                                 size, nbytes(send), nbytes(recv), str(send.dtype).removeprefix("torch."),
                                 self.group_dims.get(group, "world")))
        return out

    def _label(self, kind: str, send: torch.Tensor, recv: torch.Tensor) -> None:
        """FSDP2's flat buffers: the all-gather's output (its input is a view of it), the reduce-scatter's input."""
        buffer = {"all_gather": recv, "reduce_scatter": send}.get(kind)
        record = self.record_of(buffer) if buffer is not None else None
        if record is not None and record.category in ("activations", "temporaries"):
            record.category = "allgather_buffers" if kind == "all_gather" else "reduce_scatter_buffers"


@contextlib.contextmanager
def distributed_runtime(tracker):
    """Storages resized in place reach the tracker; DTensor's shape propagation runs untracked."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    resize = torch.UntypedStorage.resize_
    propagate = ShardingPropagator._propagate_tensor_meta_non_cached

    def resize_(storage, size):
        out = resize(storage, size)
        tracker.resized(storage)
        return out

    def propagate_untracked(self, op_schema):
        paused, tracker.paused = tracker.paused, True
        try:
            return propagate(self, op_schema)
        finally:
            tracker.paused = paused

    torch.UntypedStorage.resize_ = resize_
    ShardingPropagator._propagate_tensor_meta_non_cached = propagate_untracked
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = resize
        ShardingPropagator._propagate_tensor_meta_non_cached = propagate


def build_parallel(target: ModelTarget, specs: Sequence[InputSpec], spec: ParallelSpec, mesh,
                   kwargs: dict | None, dtype: torch.dtype | None, user_plan: Callable | None = None,
                   plan_name: str | None = None, fake_mode: FakeTensorMode | None = None,
                   param_dtype: torch.dtype | None = None) -> tuple[nn.Module, str]:
    """The model built on the meta device, parallelized, and materialised on fake CPU tensors
    (``fake_mode``; real ones when None: the oracle's run); ``param_dtype``: FSDP2's mixed precision."""
    model = build_meta(target, kwargs or {}, specs)
    if dtype is not None:
        model.to(dtype)
    model, applied = parallelize(model, mesh, spec, user_plan, plan_name, param_dtype)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        model.to_empty(device="cpu")
    return model, applied


def ranks_alike(model: nn.Module) -> bool:
    """Does every rank hold the same shapes (every sharded dimension divides its mesh dimension)?"""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Shard

    for p in model.parameters():
        if isinstance(p, DTensor):
            for dim_size, placement in zip(p.device_mesh.shape, p.placements):
                if isinstance(placement, Shard) and p.shape[placement.dim] % dim_size:
                    return False
    return True


def parallel_step(target: ModelTarget, specs: Sequence[InputSpec], options: TrainOptions, spec: ParallelSpec,
                  kwargs: dict | None = None, dtype: torch.dtype | None = None,
                  user_plan: Callable | None = None, plan_name: str | None = None) -> dict:
    """Rank 0's training step under ``spec`` (FSDP2, HSDP, TP and their meshes): the JSON of its
    memory, its costs and its collectives (``collectives``: one row per op, phase and shape)."""
    check_trainable(target)
    param_dtype = None
    if options.amp and (spec.fsdp > 1 or spec.dp > 1) and user_plan is None:  # FSDP2's mixed precision, not autocast
        param_dtype, options = AMP[options.amp], dataclasses.replace(options, amp=None)
    with fake_world(spec) as mesh:
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        model, applied = build_parallel(target, specs, spec, mesh, kwargs, dtype, user_plan, plan_name, fake_mode,
                                        param_dtype)
        tracker = ParallelTracker()
        tracker.group_dims = mesh_groups(mesh)
        with _restored(model):
            tracker, grads = _analysed_step(model, make_call(specs, dtype, fake_mode), options, fake_mode, target,
                                            "on fake tensors", tracker=tracker, runtime=distributed_runtime)
        alike = ranks_alike(model)
    return step_section(tracker, grads, applied, alike)


def step_section(tracker: ParallelTracker, grads: list, plan: str, alike: bool) -> dict:
    """Rank 0's settled step as the ``parallel`` section holds it: the plan, its memory, its
    collectives grouped, its costs per phase."""
    costs = _costs(tracker, grad_keys=tracker.serials_of(grads))
    return {"plan": plan, "rank": 0, "ranks_alike": alike, "worst_rank": 0, "memory": summary(tracker),
            "collectives": collective_rows(tracker.collectives),
            "phases": costs["phases"], "uncounted": costs["uncounted"], "op_classes": costs["op_classes"]}


def wire_bytes(kind: str, send: int, recv: int, group: int) -> int:
    """Bytes one rank sends (and receives) for one call under NCCL's ring algorithm: (n−1)/n of the
    whole for an all-gather (its output), a reduce-scatter (its input) or an all-to-all; 2(n−1)/n of
    the buffer for an all-reduce; the buffer once for a broadcast (``comm.bus_bytes``)."""
    return round(bus_bytes(kind, collective_size(kind, send, recv), group))


def collective_rows(collectives: list[tuple]) -> list[dict]:
    """The collectives grouped by (kind, op, phase, group size, shapes): count and bytes per rank.
    ``send_bytes``/``recv_bytes``: one call's buffers on this rank (an all-gather's input and
    output); ``wire_bytes``: what one call sends over this rank's link (``wire_bytes``)."""
    rows: dict[tuple, dict] = {}
    for kind, op, phase, module, size, send, recv, dtype, dim in collectives:
        key = (kind, op, phase, size, send, recv, dtype, dim)
        row = rows.setdefault(key, {"kind": kind, "op": op, "phase": phase, "mesh_dim": dim, "group_size": size,
                                    "dtype": dtype, "send_bytes": send, "recv_bytes": recv,
                                    "wire_bytes": wire_bytes(kind, send, recv, size), "count": 0, "modules": []})
        row["count"] += 1
        if module and module not in row["modules"] and len(row["modules"]) < 4:
            row["modules"].append(module)
    return list(rows.values())


def check_parallel_options(spec: ParallelSpec, train: bool) -> None:
    """``--parallel`` is about a training step: one line when it is asked without ``--train``."""
    if not train:
        raise ArchscanError("--parallel analyses a training step and needs --train",
                            hint="inference parallelism (serving a model over GPUs) is not modelled")
