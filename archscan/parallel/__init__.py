"""Parallel: a training step spread over GPUs, as torch.distributed's own code runs it on fake tensors.

Takes a model target, one rank's micro-batch (``InputSpec``s), the step's ``TrainOptions`` and a
``ParallelSpec`` (``--parallel fsdp=8,tp=8``); gives the JSON ``parallel`` section: the plan
applied, rank 0's peak and its breakdown (sharded and unsharded parameters, FSDP2's all-gather and
reduce-scatter buffers, gradients, DDP's buckets, optimizer state, activations, temporaries),
every collective with its bytes per rank, their times on a named interconnect and the step's; with
a budget, the largest micro-batch per rank that fits, and with ``auto:N`` the meshes of N GPUs
that fit, ranked by step time.

Modules, in the order data flows: ``spec.py`` (the words of ``--parallel``, no torch),
``world.py`` (the fake process group and the device mesh), ``plans.py`` (FSDP2 and tensor-parallel
plans applied on the meta device, or the user's), ``step.py`` (the step on fake tensors, its
collectives), ``ddp.py`` (DistributedDataParallel's buckets, modelled on one device's step),
``comm.py`` (interconnects and collectives' times), ``timing.py`` (the step's time), ``section.py`` (one
step and its time), ``search.py`` (``auto:N``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .section import interconnect_of, run
from .spec import ParallelSpec

__all__ = ["ParallelSpec", "analyse", "interconnect_of", "run"]


def analyse(target, specs: Sequence, options, spec: ParallelSpec, *, kwargs: dict | None = None, dtype=None,
            plan: Callable | None = None, plan_name: str | None = None, gpu=None, interconnect=None,
            budget=None, limit: int | None = None) -> dict:
    """The ``parallel`` section (see the module docstring). ``gpu``: a ``devices.gpus.GPU`` with
    datasheet figures, for the time; ``interconnect``: a ``comm.Interconnect`` (None: the GPU's
    own); ``budget``/``limit``: a ``memory.budget.Budget`` and the simulated allocator's limit
    (``memory.budget.on_execution``), for the largest micro-batch or the search."""
    if spec.auto:
        from .search import search

        return search(target, specs, options, spec.auto, kwargs=kwargs, dtype=dtype, gpu=gpu,
                      interconnect=interconnect, budget=budget, limit=limit)
    section = run(target, specs, options, spec, kwargs=kwargs, dtype=dtype, plan=plan, plan_name=plan_name,
                  gpu=gpu, interconnect=interconnect)
    if budget is not None:
        from ..memory import budget as mb

        def peak_of(batch: int) -> int:
            got = run(target, mb.batched(specs, batch), options, spec, kwargs=kwargs, dtype=dtype, plan=plan,
                      plan_name=plan_name)
            return mb.counted_bytes(got["memory"], budget, limit)

        section["budget"] = {**budget.to_json(), "for": "one rank's micro-batch", **mb.largest_batch(peak_of, budget.bytes)}
    return section
