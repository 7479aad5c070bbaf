"""DistributedDataParallel, modelled on one device's step: DDP's reducer is C++ and does not run
on fake tensors, so its memory and collectives are added to the single-device step.

- **Buckets**: when the model is wrapped, the reducer allocates one flat gradient buffer per
  bucket, for the whole run: together as many bytes as the trainable parameters (per dtype).
  ``gradient_as_bucket_view=False`` (the default) keeps each ``.grad`` a tensor of its own, so
  the step's gradients stay as they are and the buckets come on top (``ddp_buckets``).
- **Collectives**: one all-reduce per bucket in the backward. After the first iteration the
  reducer rebuilds its buckets in the order the gradients became ready, each closed once it
  reaches its cap: ``bucket_cap_mb``, or by default 25 MiB after a first bucket of
  ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB); ``dist._compute_bucket_assignment_by_size`` (torch's own
  function) assigns them here on the gradients in the order the step made them. Each forward
  also broadcasts the module's buffers from rank 0 (``broadcast_buffers=True``), coalesced in
  250 MiB chunks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..load.building import make_call
from ..load.targets import InputSpec, ModelTarget
from ..memory.scratch import nbytes
from ..memory.train import TrainOptions, _analysed_step, _restored, check_trainable, fake_model, under
from .spec import ParallelSpec
from .step import ParallelTracker, step_section

BROADCAST_BUCKET_BYTES = 250 * 2**20  # DDP's broadcast_bucket_size for buffers


def bucket_bytes(params: Sequence[torch.Tensor], cap_mb: float | None) -> list[int]:
    """The bytes of each bucket of ``params`` (in the order their gradients become ready), as the
    reducer rebuilds them: with DDP's default cap (``cap_mb`` None) the first capped at 1 MiB and
    the rest at 25 MiB; with a cap given, every bucket at it."""
    import torch.distributed as dist

    cap = int((cap_mb if cap_mb is not None else 25) * 2**20)
    caps = [dist._DEFAULT_FIRST_BUCKET_BYTES, cap] if cap_mb is None else [cap]
    buckets, _ = dist._compute_bucket_assignment_by_size(list(params), caps)
    return [sum(nbytes(params[i]) for i in bucket) for bucket in buckets]


def ddp_step(target: ModelTarget, specs: Sequence[InputSpec], options: TrainOptions, spec: ParallelSpec,
             kwargs: dict | None = None, dtype: torch.dtype | None = None) -> dict:
    """Rank 0's step under DDP: the single-device step with the buckets, and DDP's collectives."""
    check_trainable(target)
    model = fake_model(target, specs, kwargs, dtype)
    fake_mode: FakeTensorMode = next(t.fake_mode for t in model.parameters())
    trainable = [p for name, p in model.named_parameters()  # what --freeze leaves (the step freezes inside itself)
                 if p.requires_grad and not any(under(name, prefix) for prefix in options.freeze)]
    by_dtype: dict[torch.dtype, int] = {}
    for p in trainable:
        by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + p.numel()
    with fake_mode:
        buckets = [torch.empty(n, dtype=d) for d, n in by_dtype.items()]  # one flat buffer per dtype: the same bytes
    tracker = ParallelTracker()
    tracker.register(buckets, "ddp_buckets")
    ready: list[torch.Tensor] = []  # the parameters in the order their gradients were accumulated (DDP's hooks fire so)
    hooks = [p.register_post_accumulate_grad_hook(ready.append) for p in trainable]
    try:
        with _restored(model):
            tracker, grads = _analysed_step(model, make_call(specs, dtype, fake_mode), options, fake_mode, target,
                                            "on fake tensors", tracker=tracker)
    finally:
        for h in hooks:
            h.remove()
    for size in bucket_bytes(ready, spec.bucket_mb):
        tracker.collectives.append(("all_reduce", "ddp.allreduce (bucket)", "backward", "", spec.ddp, size, size,
                                    str(ready[0].dtype).removeprefix("torch."), "ddp"))
    buffers = sum(nbytes(b) for b in model.buffers())
    while buffers > 0:
        chunk = min(buffers, BROADCAST_BUCKET_BYTES)
        tracker.collectives.append(("broadcast", "ddp.broadcast (buffers)", "forward", "", spec.ddp, chunk, chunk, "mixed",
                                    "ddp"))
        buffers -= chunk
    del buckets
    buckets_said = "buckets of 25 MiB (the first of 1 MiB)" if spec.bucket_mb is None else f"buckets of {spec.bucket_mb:g} MiB"
    return step_section(tracker, grads, f"DDP, {buckets_said}, modelled on one device's step", alike=True)

