"""The CPU allocator as the oracle of peak memory: a real run under
``torch.profiler.profile(profile_memory=True)``, its allocation events summed in time order (not
``total_allocated``: that carries bytes of earlier profiling sessions), plus what was resident when
the run began (parameters, buffers, inputs and the optimizer's state)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from archscan.memory.train import AMP, IMPLS, OPTIMIZERS, TrainOptions

# archscan's step with the oracle's default loop: the stand-in loss, the output released before backward
STAND_IN = {"loss": "sum", "release_output": True}


def stand_in(optimizer: str = "adamw", impl: str | None = None, amp: str | None = None, freeze=()) -> TrainOptions:
    return TrainOptions(optimizer, impl, amp, tuple(freeze), **STAND_IN)
from archscan.load.recording import output_tensors


def _allocations_peak(prof) -> int:
    return _allocations_peak_and_end(prof)[0]


def _allocations_peak_and_end(prof, skip: tuple[str, ...] = (), freed_unseen=()) -> tuple[int, int]:
    """The highest running sum of a profile's CPU allocation events, and the sum at its end;
    ``skip``: allocations made inside ops whose names start so are left out (with their frees).
    ``freed_unseen``: (address, time) of blocks known to be gone whose frees the profile may have
    missed (a block whose last reference a thread the profiler does not follow dropped has no free
    event): the block open at that address at that time, if it is open at the end, is closed there."""
    events, stack = [], [(ev, False) for ev in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        ev, inside = stack.pop()
        if ev.tag == _EventType.Allocation and str(ev.extra_fields.device) == "cpu":
            events.append((ev.start_time_ns, ev.extra_fields.alloc_size, ev.extra_fields.ptr, inside))
        inside = inside or (bool(skip) and ev.name.startswith(skip))
        stack.extend((child, inside) for child in ev.children)
    kept, open_skipped, open_at = [], set(), {}
    for t, size, ptr, inside in sorted(events):
        if size > 0 and inside:  # a block made inside a skipped op: it and its free are left out
            open_skipped.add(ptr)
            continue
        if size < 0 and ptr in open_skipped:
            open_skipped.discard(ptr)
            continue
        kept.append((t, size))
        if size > 0:
            open_at[ptr] = (t, size)
        else:
            open_at.pop(ptr, None)
    live = peak = 0
    for _, size in kept:
        live += size
        peak = max(peak, live)
    for ptr, when in set(freed_unseen):
        if ptr in open_at and open_at[ptr][0] <= when:
            live -= open_at.pop(ptr)[1]
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
                  amp: str | None = None, set_to_none: bool = True, device_type: str = "cpu", loss: str = "sum",
                  targets: torch.Tensor | None = None, release_output: bool = True, kwargs: dict | None = None):
    """(step, optimizer, parameters): one training step as a user's loop writes it: forward (under
    autocast with ``amp``), the loss, backward, optimizer step, zero_grad(set_to_none=...).

    ``loss``: "sum" (the sum of the floating outputs that require grad), "cross-entropy" (over the
    first output against ``targets``: [N, C] logits and [N] classes, or [N, T, V] and [N, T] next
    tokens), "mse" (the first output against ``targets``) or "model" (the model's own, ``kwargs``
    holding its labels). ``targets`` exist before the step, as a loop's batch does;
    ``release_output``: ``del output`` before backward, else the loop holds it to the end."""
    cls, defaults = OPTIMIZERS[optimizer]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = getattr(torch.optim, cls)(params, **defaults, **IMPLS.get(impl or "", {}))

    def step():
        with torch.autocast(device_type, dtype=AMP[amp]) if amp else torch.autocast(device_type, enabled=False):
            output = model(*inputs, **(kwargs or {}))
            if loss == "model":
                value = output.loss if hasattr(output, "loss") else output["loss"]
            else:
                outs = [t for t in output_tensors(output) if t.is_floating_point() and t.requires_grad]
                if loss == "cross-entropy" and outs[0].dim() == 3:
                    value = F.cross_entropy(outs[0].reshape(-1, outs[0].shape[-1]), targets.reshape(-1))
                elif loss == "cross-entropy":
                    value = F.cross_entropy(outs[0], targets)
                elif loss == "mse":
                    value = F.mse_loss(outs[0], targets)
                else:
                    value = outs[0].sum()
                    for t in outs[1:]:
                        value = value + t.sum()
                del outs
        if release_output:
            del output
        value.backward()
        del value
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)

    return step, opt, params


def step_peak(model: torch.nn.Module, inputs: list, optimizer: str = "adamw", impl: str | None = None,
              amp: str | None = None, set_to_none: bool = True, **loop) -> int:
    """Peak bytes of a steady-state training step (``training_step``; ``loop``: its loss, targets,
    ``release_output`` and keyword inputs), after one warm-up step."""
    step, opt, params = training_step(model, inputs, optimizer, impl, amp, set_to_none, **loop)
    step()
    state = [v for s in opt.state.values() for v in s.values()]
    grads = [p.grad for p in params if p.grad is not None]
    data = [*inputs, *(loop.get("kwargs") or {}).values(), loop.get("targets")]
    resident = _resident([*model.parameters(), *model.buffers(), *data, *state, *grads])
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


def read_cpu() -> bool:
    """Is this CPU one the CPU scratch entries were read on: oneDNN's AVX2 kernels?"""
    from archscan.memory.scratch import onednn_block
    return onednn_block() == 8 and torch.backends.mkldnn.is_available()


def named_off_the_read_cpu(memory: dict, miss: str) -> None:
    """A figure off the allocator's is allowed only on a CPU whose kernels the entries were not read
    on, and only where the report names the kernels it does not model."""
    assert not read_cpu() and memory.get("unmodelled_scratch"), miss
