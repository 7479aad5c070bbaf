"""One step under a mesh, with its time: the ``parallel`` section without a budget or a search."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ..errors import ArchscanError
from .spec import ParallelSpec


def interconnect_of(gpu, name: str | None = None):
    """The interconnect asked for by ``name``, or the usual one of ``gpu`` (its NVLink node); None
    where neither names one."""
    if name is None and gpu is None:
        return None
    from .comm import interconnect_for

    if name is not None:
        return interconnect_for(name)
    try:
        return interconnect_for(gpu.name)
    except Exception:
        return None


def run(target, specs: Sequence, options, spec: ParallelSpec, *, kwargs: dict | None = None, dtype=None,
        plan: Callable | None = None, plan_name: str | None = None, gpu=None, interconnect=None) -> dict:
    """One step under ``spec``: the section without a budget."""
    from .ddp import ddp_step
    from .step import parallel_step

    if spec.ddp > 1:
        if plan is not None:
            raise ArchscanError("--plan parallelizes with FSDP or tensor parallelism; ddp=N takes no plan",
                                hint="drop --plan, or use fsdp=N/tp=N with it")
        step = ddp_step(target, specs, options, spec, kwargs, dtype)
    else:
        step = parallel_step(target, specs, options, spec, kwargs, dtype, plan, plan_name)
    section = {**spec.to_json(), "micro_batch": [s.to_json() for s in specs], "options": options.to_json(), **step}
    ic = interconnect if interconnect is not None else interconnect_of(gpu)
    if gpu is not None and ic is not None:
        from .timing import step_time

        section["time"] = step_time(section, gpu, ic, spec.mesh)
        section["interconnect"] = dataclasses.asdict(ic)
    return section
