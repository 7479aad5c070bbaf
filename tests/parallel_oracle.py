"""The per-rank memory oracle of a parallel step: one process, torch.distributed's fake process
group, *real* tensors, the CPU allocator profiled as ``memory_oracle`` does.

The model is built and parallelized as archscan builds it (``build_parallel``: the same plan on
the meta device), then materialised on real CPU tensors with random weights, and stepped twice as
``memory_oracle.training_step`` steps a model: the first step makes the optimizer state and FSDP2's
buffers, the second is profiled. Its peak is every allocation event of the first profile summed
(what was live before the second step: weights, inputs, optimizer state) plus the second's
highest running sum. The fake group moves no data, which changes no allocation: on this
machine a real 4-rank gloo run gave every rank the same peak to the byte (``tests/parallel_gloo.py``).

DDP's reducer is C++ and does run on real tensors here; the fake group's all-reduce returns no
future value, so a comm hook answers with the bucket itself, as an in-place all-reduce leaves it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time

import torch
import torch.utils._pytree as pytree
from memory_oracle import _allocations_peak_and_end, training_step
from torch.multiprocessing.reductions import StorageWeakRef
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    is_traceable_wrapper_subclass,
)

from archscan.load.building import build_real, make_call
from archscan.parallel.spec import ParallelSpec
from archscan.parallel.step import build_parallel
from archscan.parallel.world import fake_world


@contextlib.contextmanager
def _profiled():
    """The CPU allocator's events, with Python's garbage collector held off: a collection inside
    would free an earlier test's tensors and count their bytes as this step's frees."""
    gc.collect()
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield prof
    finally:
        gc.enable()


def _init(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.normal_(0, 0.02)


def rank_peak(target, specs, spec: ParallelSpec, kwargs: dict | None = None, optimizer: str = "adamw",
              param_dtype: torch.dtype | None = None) -> tuple[int, list]:
    """(rank 0's peak bytes in a steady training step under ``spec``, the collectives' calls of
    that step: (op name, bytes of its first tensor argument)), in the fake process group."""
    with fake_world(spec) as mesh:
        return peak_in(mesh, target, specs, spec, kwargs, optimizer, fake_group=True, param_dtype=param_dtype)


def peak_in(mesh, target, specs, spec: ParallelSpec, kwargs: dict | None = None, optimizer: str = "adamw",
            fake_group: bool = False, skip: tuple[str, ...] = (), param_dtype: torch.dtype | None = None) -> tuple[int, list]:
    """``rank_peak`` in the process group that exists (a real gloo group under torchrun, or the
    fake one): this rank's peak and collectives."""
    calls: list = []
    torch.manual_seed(0)
    handed = _Handed(real=not fake_group)
    with _profiled() as first, handed:
        inputs = make_call(specs, None).tensors()
        if spec.ddp > 1:
            from torch.nn.parallel import DistributedDataParallel

            model = build_real(target, kwargs or {}, None, specs)
            model.train()
            model = DistributedDataParallel(model, **({"bucket_cap_mb": spec.bucket_mb} if spec.bucket_mb else {}))

            def answer(state, bucket):
                buffer = bucket.buffer()
                calls.append(("ddp.allreduce", buffer.numel() * buffer.element_size()))
                done = torch.futures.Future()
                done.set_result(buffer)
                return done

            if fake_group or os.environ.get("ARCHSCAN_GLOO_HOOK"):  # a real group all-reduces for itself
                model.register_comm_hook(None, answer)
        else:
            model, _ = build_parallel(target, specs, spec, mesh, kwargs, None, param_dtype=param_dtype)
            _init(model)
        step, _, _ = training_step(model, inputs, optimizer)
        step()
    before = _allocations_peak_and_end(first, skip, handed.freed_unseen(first))[1]
    calls.clear()
    with _profiled() as second, _Collectives(calls):
        step()
    return before + _allocations_peak_and_end(second, skip)[0], calls


COLLECTIVES = {"_allgather_base_", "_reduce_scatter_base_", "allreduce_", "broadcast_", "allgather_into_tensor_coalesced_",
               "reduce_scatter_tensor_coalesced_", "all_reduce", "all_reduce_", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_to_all_single", "broadcast"}


class _Handed(TorchDispatchMode):
    """The storages handed to collectives. In a real gloo group a worker thread holds them until
    it has finished; when it drops the last reference, the block is freed on a thread the profiler
    does not follow and no free event is recorded (3 MiB more before the profiled step, on one rank
    in some runs of four). Each collective is marked in the profile; ``freed_unseen`` gives, once
    every rank's collectives have drained, the blocks of those storages that are gone."""

    def __init__(self, real: bool):
        super().__init__()
        self.real = real
        self.handed: list[list[tuple[int, StorageWeakRef]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if any(is_traceable_wrapper_subclass(a) for a in flat):
            return NotImplemented
        if not (self.real and func.namespace == "c10d"):
            return func(*args, **(kwargs or {}))
        with record_function(f"{_HANDED}{len(self.handed)}"):
            out = func(*args, **(kwargs or {}))
        storages = [t.untyped_storage() for t in flat + [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]]
        self.handed.append([(s.data_ptr(), StorageWeakRef(s)) for s in storages if s.data_ptr()])
        return out

    def freed_unseen(self, prof) -> list[tuple[int, int]]:
        """(address, end of the collective's mark) of each handed storage that no longer exists."""
        if not self.handed:
            return []
        torch.distributed.barrier()  # every rank's collectives are done; their workers let go just after
        # a loaded machine delays a worker's letting go: wait until no handed storage has gone for
        # SETTLE seconds (the ones the program itself holds never go), at most WAIT
        gone, quiet_since, start = -1, time.monotonic(), time.monotonic()
        while time.monotonic() - start < WAIT:
            now = sum(ref.expired() for refs in self.handed for _, ref in refs)
            if now != gone:
                gone, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= SETTLE:
                break
            time.sleep(0.05)
        ends, stack = {}, list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            ev = stack.pop()
            if ev.name.startswith(_HANDED):
                ends[int(ev.name[len(_HANDED):])] = ev.end_time_ns
            stack.extend(ev.children)
        return [(ptr, ends[i]) for i, refs in enumerate(self.handed) for ptr, ref in refs if ref.expired()]


_HANDED = "oracle.handed#"
SETTLE, WAIT = 1.0, 10.0  # seconds without a handed storage going, and at most, before the books close


class _Collectives(TorchDispatchMode):
    """Records each collective of a real run: (op, bytes of its first tensor argument). A DTensor's
    ops are let through to DTensor itself, whose collectives come back here."""

    def __init__(self, calls: list):
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if any(is_traceable_wrapper_subclass(a) for a in flat):
            return NotImplemented
        if func.namespace in ("c10d", "_c10d_functional") and func.overloadpacket.__name__ in COLLECTIVES:
            self.calls.append((f"{func.namespace}.{func.overloadpacket.__name__}", flat[0].numel() * flat[0].element_size()))
        return func(*args, **(kwargs or {}))
