"""Peak memory by tensor lifetime: which bytes are live at each moment of a run, on fake tensors.

A tensor's bytes are its storage's: they become live when the op that makes a new storage
returns and stop being live when nothing holds the storage any more (a weak reference's callback
on the storage fires: the last view, the autograd graph's saved tensor, the optimizer's state and
the Python variable are all gone). Views and in-place ops make no new storage. That is what the
allocator must hold, so the peak is comparable with the CPU allocator's events under
``torch.profiler.profile(profile_memory=True)`` (tests/test_memory.py). The CUDA caching
allocator rounds each block up (to 512 bytes), which ``torch.cuda.max_memory_allocated`` counts
and this does not.

Kernels that allocate scratch inside themselves (oneDNN's reorders on the CPU) are invisible at
the dispatcher: ``archscan.memory.scratch`` models them per op, as a transient spike on top of
the bytes live when the op returns.

Every byte live at a moment belongs to one category (``CATEGORIES``): ``params`` and ``inputs``
(and ``optimizer_state``) are registered before the run, ``grads`` are the storages that are a
parameter's ``.grad`` after the backward (from the moment they were made), ``activations`` are
made in the forward and ``temporaries`` everywhere else, a kernel's scratch among them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from ..costs import tensors_in
from ..costs.kernels import run_op
from ..load.recording import run_higher_order
from .scratch import as_the_kernel_returns, hidden_result_bytes, scratch_bytes, unmodelled_scratch

CATEGORIES = ("params", "grads", "optimizer_state", "activations", "temporaries", "inputs")
TIMELINE_POINTS = 400  # the timeline keeps at most this many points (each bin's highest moment)


@dataclass
class _Storage:
    nbytes: int
    category: str
    phase: str
    op: str
    where: Any  # what the run was at when it was made (an fx node, a module path, or None)
    shape: tuple[int, ...]
    dtype: str
    serial: int = 0  # unique over the run (a storage's address is not: a later storage may take it)


@dataclass
class Peak:
    """The worst moment of a run: the bytes live then, by category, and where the run was."""

    bytes: int = 0
    phase: str = ""
    op: str = ""
    where: Any = None
    scratch: int = 0                                         # a kernel's own scratch at that moment
    source: str | None = None                                # the model's source line then (file:line)
    by_category: dict[str, int] = field(default_factory=dict)
    largest: list[dict] = field(default_factory=list)         # the largest tensors live then
    unmodelled: dict[str, int] = field(default_factory=dict)  # ops run by then whose scratch no entry models


class MemoryTracker(TorchDispatchMode):
    """Follows every storage the ops of a run make, until it is freed; keeps the peak.

    Register what exists before the run (``register``: parameters, buffers, inputs, optimizer
    state); anything else an op reads that was not registered (a constant made outside the run)
    counts as an input. ``phase`` names the part of the run (forward, backward, optimizer) and
    ``where`` what runs now (the interpreter sets its fx node; the training step its module):
    both are kept with each storage and with the peak.
    """

    def __init__(self, scratch: Callable[..., int] | None = scratch_bytes, locate: Callable[[], str | None] | None = None):
        super().__init__()
        self.locate = locate  # called at each new peak: the model's source line running then
        self.live: dict[int, _Storage] = {}
        self.bytes = 0
        self.phase = "forward"
        self.where: Any = None
        self.peak = Peak()
        self.scratch = scratch
        self.unmodelled: dict[str, int] = {}  # op name -> calls so far whose kernel's scratch is not modelled
        self.ops = 0
        self.serials = 0
        # (made, storage, allocating ops so far, phase) in order: made True when made, False when freed
        self.log: list[tuple[bool, _Storage, int, str]] = []
        self._peak_at = 0  # the log's length at the peak
        self.called_at: dict[str, str | None] = {}  # module path -> the model's line that first called it
        self.phase_peaks: dict[str, int] = {}        # phase -> its highest live bytes
        self._watches: list[weakref.ref] = []  # one per storage made: its callback frees it
        self.hooks: list | None = None  # module hooks that tell it ``where`` (``module_hooks``), where a run has them
        self.paused = False  # ops run untracked while True (metadata propagation that allocates nothing for real)
        self.categories = CATEGORIES  # a stage may add its own (archscan.parallel: sharded parameters' buffers)
        self.resize_category: str | None = None  # the category of storages resized in place (None: kept)
        self._resized: dict[int, list[_Storage]] = {}  # storage key -> its records since it was first resized

    # --- storages -------------------------------------------------------------------------------------

    def register(self, tensors: Iterable[torch.Tensor], category: str, modules: Iterable[str] | None = None) -> None:
        """Count tensors that exist before the run (their storages, once each) as ``category``,
        each held by the module path ``modules`` gives for it (none when not given)."""
        where = self.where
        for t, module in zip(tensors, modules) if modules is not None else ((t, None) for t in tensors):
            self.where = module
            self._add(t, category, "before", "")
        self.where = where

    def _add(self, t: torch.Tensor, category: str, phase: str, op: str, nbytes: int | None = None) -> bool:
        """Track ``t``'s storage from now until it is freed; ``nbytes``: its bytes where the fake
        tensor does not show them (``scratch.hidden_result_bytes``)."""
        if _is_wrapper(t):  # a DTensor holds the bytes of its local tensor
            return any([self._add(u, category, phase, op) for u in _inner(t)])
        try:
            storage = t.untyped_storage()
        except Exception:  # a tensor subclass without storage (sparse, nested): not tracked
            return False
        key = storage._cdata
        if key in self.live:
            return False
        nbytes = storage.nbytes() if nbytes is None else nbytes
        self.serials += 1
        record = _Storage(nbytes, category, phase, op, self.where, tuple(t.shape), str(t.dtype).replace("torch.", ""),
                          self.serials)
        self.live[key] = record
        self.log.append((True, record, self.ops, phase))
        self.bytes += nbytes
        self._watches.append(weakref.ref(storage, lambda _, key=key: self._free(key)))
        return True

    def _free(self, key: int) -> None:
        self._resized.pop(key, None)
        gone = self.live.pop(key, None)
        if gone is not None:
            self.log.append((False, gone, self.ops, self.phase))
            self.bytes -= gone.nbytes

    def storage_keys(self, tensors: Iterable[torch.Tensor]) -> set[int]:
        return {t.untyped_storage()._cdata for t in local_tensors(tensors)}

    def serials_of(self, tensors: Iterable[torch.Tensor]) -> set[int]:
        """The serial numbers of the live storages of ``tensors``."""
        return {self.live[k].serial for k in self.storage_keys(tensors) if k in self.live}

    # --- the run ----------------------------------------------------------------------------------------

    supports_higher_order_operators = True  # torch.cond: its branch's ops, one by one (run_higher_order)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return run_higher_order(self, func, args, kwargs)
        if self.paused:
            return func(*args, **kwargs)
        if wrapped(args, kwargs):  # a DTensor (or another wrapper): its own ops on its local tensors come back here
            return NotImplemented
        for t in tensors_in((args, kwargs)):
            self._add(t, "inputs", "before", "")  # made outside the run and not registered: a constant
        out = run_op(func, args, kwargs)
        if self.scratch is not None:
            out = as_the_kernel_returns(func, out)
        made = self.phase == "forward" and "activations" or "temporaries"
        name = str(func.overloadpacket.__name__)
        hidden = hidden_result_bytes(func, args, out) if self.scratch is not None else {}
        new = [self._add(t, made, self.phase, name, hidden.get(id(t))) for t in tensors_in(out)]
        extra = self.scratch(func, args, kwargs, out) if self.scratch is not None else 0
        unmodelled = unmodelled_scratch(func, args) if self.scratch is not None else None
        if unmodelled is not None:
            self.unmodelled[unmodelled] = self.unmodelled.get(unmodelled, 0) + 1
        if any(new) or extra:  # the timeline's steps are the ops that allocate (others change nothing)
            self.ops += 1
        scratch = self._scratch(extra, func) if extra else None  # made and freed inside the kernel
        self._reached(name, extra)
        if scratch is not None:
            self.log.append((False, scratch, self.ops, self.phase))
        return out

    def resized(self, storage: torch.UntypedStorage) -> None:
        """A storage resized in place (``UntypedStorage.resize_``: FSDP2 frees and refills its
        unsharded parameters so): its old bytes freed and the new ones made, in the same category."""
        key = storage._cdata
        old = self.live.get(key)
        nbytes = storage.nbytes()
        if old is None or old.nbytes == nbytes:
            return
        self.log.append((False, old, self.ops, self.phase))
        self.serials += 1
        new = _Storage(nbytes, old.category, self.phase, old.op, self.where, old.shape, old.dtype, self.serials)
        chain = self._resized.setdefault(key, [old])
        chain.append(new)
        if self.resize_category is not None:  # every record of the storage, from its first one (shared with the log)
            for record in chain:
                record.category = self.resize_category
        self.live[key] = new
        self.log.append((True, new, self.ops, self.phase))
        self.bytes += nbytes - old.nbytes
        if nbytes > old.nbytes:
            self.ops += 1
            self._reached("resize_")

    def _reached(self, op: str, extra: int = 0) -> None:
        """The bytes live now, with ``extra`` bytes of a kernel's scratch: its phase's highest yet,
        the run's peak."""
        now = self.bytes + extra
        if now > self.phase_peaks.get(self.phase, 0):
            self.phase_peaks[self.phase] = now
        if now > self.peak.bytes:
            self._new_peak(op, extra)

    def _scratch(self, nbytes: int, func) -> _Storage:
        self.serials += 1
        record = _Storage(nbytes, "temporaries", self.phase, f"{func.overloadpacket.__name__} (kernel scratch)",
                          self.where, (), "", self.serials)
        self.log.append((True, record, self.ops, self.phase))
        return record

    def _new_peak(self, op: str, extra: int) -> None:
        self.peak = Peak(self.bytes + extra, self.phase, op, self.where, extra,
                         self.locate() if self.locate is not None and self.phase == "forward" else None,
                         unmodelled=dict(self.unmodelled))
        self._peak_at = len(self.log)  # what was live then is replayed from the log at the end

    def settle(self, grads: Iterable[torch.Tensor] = ()) -> Peak:
        """Close the books: storages that are (or were) a parameter's gradient count as grads;
        the peak's breakdown by category and its largest tensors."""
        self.mark_grads(grads)
        peak = self.peak
        by_category = dict.fromkeys(self.categories, 0)
        live = self.live_at(self._peak_at)
        for s in live:  # a kernel's scratch at the peak is in the log as a temporary
            by_category[s.category] += s.nbytes
        peak.by_category = by_category
        largest = sorted(live, key=lambda s: -s.nbytes)[:5]
        peak.largest = [{"bytes": s.nbytes, "category": s.category, "shape": list(s.shape),
                         "dtype": s.dtype, "phase": s.phase, "op": s.op, "where": s.where} for s in largest]
        return peak

    def live_at(self, moment: int) -> list[_Storage]:
        """The storages live after the first ``moment`` entries of the log."""
        live: dict[int, _Storage] = {}
        for made, record, _, _ in self.log[:moment]:
            if made:
                live[record.serial] = record
            else:
                live.pop(record.serial, None)
        return list(live.values())

    def mark_grads(self, grads: Iterable[torch.Tensor]) -> None:
        """Gradients live now (after backward): their storages count as grads, at every moment
        they were live (the records are shared with the peak's snapshot). A storage's key is its
        address, which a later storage may take: only live storages are marked."""
        for key in self.storage_keys(grads):
            if key in self.live:
                self.live[key].category = "grads"

    def timeline(self, points: int = TIMELINE_POINTS) -> list[dict]:
        """Live bytes over the run, by category (as settled: a gradient counts as one from the
        moment it is made), replayed from the log; at most ``points`` entries, each the highest
        moment of its stretch of the log (so the peak is always in it). ``op`` counts the ops that
        allocated so far."""
        moments, live = [], 0  # (bytes live, ops so far, phase, index in the log)
        for i, (made, record, ops, phase) in enumerate(self.log):
            live += record.nbytes if made else -record.nbytes
            if phase != "before":
                moments.append((live, ops, phase, i))
        step = max(1, -(-len(moments) // points))
        out, by_category, replayed = [], dict.fromkeys(self.categories, 0), 0
        for start in range(0, len(moments), step):  # the categories replayed up to each chosen moment only
            live, ops, phase, index = max(moments[start:start + step], key=lambda m: m[0])
            for made, record, _, _ in self.log[replayed:index + 1]:
                by_category[record.category] += record.nbytes if made else -record.nbytes
            replayed = index + 1
            out.append({"op": ops, "bytes": live, "phase": phase,
                        "by_category": {k: v for k, v in by_category.items() if v}})
        return out

    def record_of(self, t: torch.Tensor) -> _Storage | None:
        """The live record of ``t``'s storage (a DTensor's: its local tensor's), if it is followed."""
        return next((self.live.get(u.untyped_storage()._cdata) for u in local_tensors([t])), None)

    def close(self) -> None:
        """Stop following the storages (a weak reference dropped calls nothing back)."""
        self._watches.clear()


def wrapped(args, kwargs) -> bool:
    """Does an op take a wrapper tensor subclass (a DTensor) other than a fake tensor? Its
    ``__torch_dispatch__`` runs the op on the tensors it wraps, which is what allocates."""
    return any(_is_wrapper(t) for t in tensors_in((args, kwargs)))


_PLAIN = {FakeTensor, torch.Tensor, torch.nn.Parameter}


def _is_wrapper(t: torch.Tensor) -> bool:
    """A wrapper subclass (a DTensor), not a fake or plain tensor (checked first: they are most)."""
    return type(t) not in _PLAIN and is_traceable_wrapper_subclass(t)


def local_tensors(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors that hold storage: a DTensor's local tensor in its place."""
    out = []
    for t in tensors:
        if _is_wrapper(t):
            out.extend(local_tensors(_inner(t)))
        else:
            out.append(t)
    return out


def _inner(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a wrapper subclass holds (``__tensor_flatten__`` also names other things: a DTensor's mesh)."""
    return [u for u in (getattr(t, name) for name in t.__tensor_flatten__()[0]) if isinstance(u, torch.Tensor)]
