"""What the transforms share: run a model on its example inputs, export it, save the program, and
time the original against the changed program, interleaved (``archscan fuse`` and ``archscan prune``;
``archscan distill`` saves with ``save_program`` too)."""

from __future__ import annotations

import dataclasses
import inspect
import io

from typing import Any

import torch
import torch.nn as nn

from ..load.building import Call, make_call
from ..capture import export_program
from ..errors import ArchscanError, CaptureError
from ..files import write_file
from ..load.frames import short
from ..measure.profile import device_name
from ..measure.timing import clock_for, time_ab
from ..load.recording import quiet


def run(model: nn.Module, call: Call, what: str) -> Any:
    """``model``'s output on ``call``'s inputs, without gradients; a failure is a ``CaptureError`` naming ``what``."""
    try:
        with torch.no_grad():
            return call(model)
    except Exception as exc:
        raise CaptureError(f"{what} failed on the example inputs: {short(exc)}") from exc


def export(model: nn.Module, call: Call, reference: Any = None, what: str = "the model",
           batch: Call | None = None) -> torch.export.ExportedProgram:
    """Export with forward's own output structure when export can keep it (a tensor, tuples, lists
    and dicts of them), else with the output flattened to a tuple of its tensors. With ``batch``
    (the inputs at batch 2 or more, ``batch_call``), the first dimension of every input is left
    dynamic where the model allows it (export specialises a batch of 1), so the saved program
    takes any batch; a model that fixes its batch is exported as given."""
    plain = isinstance(model, torch.fx.GraphModule) or plain_output(reference)
    if batch is not None:
        try:
            names = list(inspect.signature(model.forward).bind(*batch.args, **batch.kwargs).arguments)
            dim = torch.export.Dim("batch", min=1)
            shapes = {n: {0: dim} for n in names}
            with quiet():
                program = (torch.export.export(model, batch.args, batch.kwargs, strict=False, dynamic_shapes=shapes)
                           if plain else export_program(model, batch, shapes))
            program.example_inputs = (call.args, call.kwargs)
            return program
        except Exception:  # the model fixes its batch (or an input is not batch-first): as given
            pass
    try:
        with quiet():
            if plain:
                return torch.export.export(model, call.args, call.kwargs, strict=False)
            return export_program(model, call)
    except ArchscanError:
        raise
    except Exception as exc:
        raise CaptureError(f"torch.export could not export {what}: {short(exc)}",
                           hint="archscan fuse works on models torch.export can capture; "
                                "`archscan MODEL` shows which capture works") from exc


def batch_call(specs, dtype) -> Call | None:
    """The inputs at batch max(2, batch) for a dynamic-batch export (None when an input has no batch)."""
    if not specs or any(not s.shape for s in specs):
        return None
    return make_call([dataclasses.replace(s, shape=(max(2, s.shape[0]), *s.shape[1:])) for s in specs], dtype)


def plain_output(output: Any) -> bool:
    """A tensor, or tuples/lists/dicts of tensors only."""
    if isinstance(output, torch.Tensor):
        return True
    if type(output) in (tuple, list):
        return all(map(plain_output, output))
    if type(output) is dict:
        return all(map(plain_output, output.values()))
    return False


def save_program(program: torch.export.ExportedProgram, path: str) -> None:
    """``torch.export.save`` through ``archscan.files.write_file``: serialised in memory first
    (torch's archive writer aborts the process when the disk fills under it), then written
    whole or not at all; an earlier file at ``path`` is kept when anything fails."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    write_file(path, buffer.getbuffer(), "-o")


def latency_ab(model: nn.Module, changed: torch.export.ExportedProgram, call: Call, device: torch.device) -> dict:
    """End-to-end latency of the original model and the changed program on ``device``, timed
    interleaved: ``{"device", "device_name", "before_ms", "after_ms", spreads, "threads"}``."""
    clock = clock_for(device)
    on_device = Call(tuple(t.to(device) for t in call.args), {k: t.to(device) for k, t in call.kwargs.items()})
    model, program = model.to(device), changed.module().to(device)
    with torch.inference_mode():
        before, after = time_ab(lambda: on_device(model), lambda: on_device(program), clock)
    times = {}
    for name, stats in (("before", before), ("after", after)):
        times[f"{name}_ms"] = stats.median_ms
        times[f"{name}_spread"] = round(stats.spread, 4)
        times[f"{name}_unstable"] = stats.unstable
    return {"device": str(device), "device_name": device_name(device), **times,
            "threads": torch.get_num_threads() if device.type == "cpu" else None}
