"""The CPU allocator as the oracle of peak memory: a real run under
``torch.profiler.profile(profile_memory=True)``, its allocation events summed in time order (not
``total_allocated``: that carries bytes of earlier profiling sessions), plus what was resident when
the run began (parameters, buffers, inputs and the optimizer's state)."""

from __future__ import annotations

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from archscan.memory.train import AMP, IMPLS, OPTIMIZERS
from archscan.load.recording import output_tensors


def _allocations_peak(prof) -> int:
    return _allocations_peak_and_end(prof)[0]


def _allocations_peak_and_end(prof, skip: tuple[str, ...] = ()) -> tuple[int, int]:
    """The highest running sum of a profile's CPU allocation events, and the sum at its end;
    ``skip``: allocations made inside ops whose names start so are left out (with their frees)."""
    events, stack = [], [(ev, False) for ev in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        ev, inside = stack.pop()
        if ev.tag == _EventType.Allocation and str(ev.extra_fields.device) == "cpu":
            events.append((ev.start_time_ns, ev.extra_fields.alloc_size, ev.extra_fields.ptr, inside))
        inside = inside or (bool(skip) and ev.name.startswith(skip))
        stack.extend((child, inside) for child in ev.children)
    kept, open_skipped = [], set()
    for t, size, ptr, inside in sorted(events):
        if size > 0 and inside:  # a block made inside a skipped op: it and its free are left out
            open_skipped.add(ptr)
            continue
        if size < 0 and ptr in open_skipped:
            open_skipped.discard(ptr)
            continue
        kept.append((t, size))
    events = kept
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return peak, live


def _resident(tensors) -> int:
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors if isinstance(t, torch.Tensor)}
    return sum(storages.values())


def forward_peak(model: torch.nn.Module, inputs: list) -> int:
    """Peak bytes of an inference forward (no_grad), after one warm-up forward."""
    with torch.no_grad():
        model(*inputs)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            model(*inputs)
    return _resident([*model.parameters(), *model.buffers(), *inputs]) + _allocations_peak(prof)


def training_step(model: torch.nn.Module, inputs: list, optimizer: str = "adamw", impl: str | None = None,
                  amp: str | None = None, set_to_none: bool = True, device_type: str = "cpu"):
    """(step, optimizer, parameters): one training step as archscan runs it (archscan.memory.train):
    forward (under autocast with ``amp``), loss = sum of the floating outputs that require grad,
    the outputs released before backward, optimizer step, zero_grad(set_to_none=...)."""
    cls, defaults = OPTIMIZERS[optimizer]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = getattr(torch.optim, cls)(params, **defaults, **IMPLS.get(impl or "", {}))

    def step():
        with torch.autocast(device_type, dtype=AMP[amp]) if amp else torch.autocast(device_type, enabled=False):
            output = model(*inputs)
        outs = [t for t in output_tensors(output) if t.is_floating_point() and t.requires_grad]
        loss = outs[0].sum()
        for t in outs[1:]:
            loss = loss + t.sum()
        del output, outs
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)

    return step, opt, params


def step_peak(model: torch.nn.Module, inputs: list, optimizer: str = "adamw", impl: str | None = None,
              amp: str | None = None, set_to_none: bool = True) -> int:
    """Peak bytes of a steady-state training step (``training_step``), after one warm-up step."""
    step, opt, params = training_step(model, inputs, optimizer, impl, amp, set_to_none)
    step()
    state = [v for s in opt.state.values() for v in s.values()]
    grads = [p.grad for p in params if p.grad is not None]
    resident = _resident([*model.parameters(), *model.buffers(), *inputs, *state, *grads])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    return resident + _allocations_peak(prof)


def op_scratch(fn) -> int:
    """The bytes the CPU allocator holds at its worst moment inside ``fn()`` beyond what ``fn``
    returns (after one warm-up call)."""
    fn()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    return _allocations_peak(prof) - _resident(output_tensors(result))
