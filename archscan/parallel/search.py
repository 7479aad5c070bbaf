"""``--parallel auto:N``: the meshes of N GPUs that fit a memory budget, ranked by throughput.

Every mesh ``spec.meshes`` lists (FSDP over all, zero2, HSDP, DDP, each with tensor parallelism up
to one node's GPUs) is run at the given micro-batch per rank, first as it is, then, where it does
not fit, with every block under activation checkpointing. Those that fit are ranked by the
samples per second of the whole job: the micro-batch × the data-parallel ranks / the predicted
step time (overlapped), since a mesh with more tensor parallelism feeds fewer samples per step.
A mesh that cannot be made (no tensor-parallel plan, heads the degree does not divide) is listed
with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..errors import ArchscanError
from ..load.building import build_meta
from .plans import blocks
from .spec import meshes


def search(target, specs: Sequence, options, gpus: int, *, kwargs: dict | None = None, dtype=None, gpu=None,
           interconnect=None, budget=None, limit: int | None = None) -> dict:
    """The ``parallel`` section of ``auto:N``: ``candidates`` (each mesh tried, its peak, whether it
    fits, its times) and ``best``, the fitting one with the highest throughput."""
    from ..memory.budget import counted_bytes
    from .section import interconnect_of, run

    if budget is None:
        raise ArchscanError("--parallel auto:N searches the meshes that fit a memory budget",
                            hint="add --memory with a GPU or a size (e.g. --memory h100)")
    ic = interconnect if interconnect is not None else interconnect_of(gpu)
    per_node = ic.gpus_per_node if ic is not None else 8
    paths = tuple(path for path, _ in blocks(build_meta(target, kwargs or {}, specs)))
    micro = specs[0].shape[0] if specs and specs[0].shape else 1
    rows, no_tp = [], None
    for spec in meshes(gpus, per_node):
        if spec.tp > 1 and no_tp is not None:
            rows.append({"spec": str(spec), "skipped": no_tp})
            continue
        for checkpoint in ((), paths) if paths else ((),):
            step_options = dataclasses.replace(options, checkpoint=checkpoint)
            try:
                section = run(target, specs, step_options, spec, kwargs=kwargs, dtype=dtype, gpu=gpu, interconnect=ic)
            except ArchscanError as exc:
                reason = str(exc)
                if spec.tp > 1 and "no tensor-parallel plan" in reason:
                    no_tp = reason
                rows.append({"spec": str(spec), "skipped": reason})
                break
            peak = counted_bytes(section["memory"], budget, limit)
            time = section.get("time") or {}
            step_ms = time.get("overlapped_ms")
            out_of_memory = bool((section["memory"].get("cuda") or {}).get("out_of_memory"))
            row = {"spec": str(spec), "checkpoint": bool(checkpoint), "peak_bytes": peak, "fits": peak <= budget.bytes,
                   "out_of_memory": out_of_memory,
                   "step_ms": step_ms, "serial_ms": time.get("serial_ms"),
                   "samples_per_s": micro * spec.data_parallel / (step_ms / 1e3) if step_ms else None}
            rows.append(row)
            if row["fits"]:
                break  # checkpointing only costs time where the mesh fits already
    fitting = sorted((r for r in rows if r.get("fits")), key=lambda r: -(r["samples_per_s"] or 0))
    return {"spec": f"auto:{gpus}", "world_size": gpus, "budget": budget.to_json(),
            "micro_batch": [s.to_json() for s in specs], "candidates": rows,
            "ranked": [r["spec"] + (" + checkpointing" if r["checkpoint"] else "") for r in fitting],
            "best": fitting[0] if fitting else None,
            "ranked_by": "samples per second of the job (micro-batch × data-parallel ranks / overlapped step time)"
                         if gpu is not None else "nothing: no GPU to time on (give --memory or --device-profile a GPU)"}

