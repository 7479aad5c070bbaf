"""``archscan fuse``: fold batch norms, rewrite hand-written attention to SDPA, verify, save ``.pt2``.

The model is built with real weights (``--weights``, or random ones with random batch-norm
statistics), exported with ``torch.export`` (non-strict), transformed on the exported graph
(``fold.py``, ``attention.py``), exported again, and compared with the original on the same
random inputs (``verify.py``). Only a program that passes is saved; ``torch.export.load(path)
.module()`` runs it with plain torch.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn as nn

from ..building import Call, build_real, make_call
from ..capture import _capture_context, export_program, strip_user_hooks
from ..errors import ArchscanError, CaptureError, VerifyError
from ..frames import short
from ..loading import InputSpec, ModelTarget, output_path  # noqa: F401  (output_path: archscan.transform's API)
from ..recording import output_tensors, quiet
from .attention import Rewrite, rewrite_attention
from .fold import Fold, Kept, fold_batch_norms
from .verify import Check, compare
from .weights import load_weights, randomize_batch_norms


@dataclass(frozen=True)
class FuseResult:
    """What ``fuse`` did, checked and (optionally) measured."""

    model: str
    inputs: tuple[dict, ...]
    folded: tuple[Fold, ...]
    kept: tuple[Kept, ...]
    attention: tuple[Rewrite, ...]
    check: Check
    weights: str | None            # the checkpoint, or None for random weights
    before: dict                   # static totals of the original program: mac_bytes, flops, params, kernels
    after: dict                    # the same for the fused program
    latency: dict | None = None    # {"device", "before_ms", "after_ms", spreads} with --measure
    path: str | None = None        # where the program was saved
    outputs_flattened: bool = False  # forward returns an object export cannot keep: the program returns its tensors
    program: Any = field(default=None, repr=False, compare=False)  # the fused ExportedProgram

    @property
    def folded_by_kind(self) -> dict[str, int]:
        return dict(Counter(f.kind for f in self.folded))

    def to_json(self) -> dict:
        return {
            "schema": "archscan.fuse/1", "model": self.model, "inputs": list(self.inputs),
            "weights": self.weights, "path": self.path,
            "folded": [vars(f) for f in self.folded], "folded_by_kind": self.folded_by_kind,
            "kept": [vars(k) for k in self.kept], "attention": [vars(r) for r in self.attention],
            "check": self.check.to_json(), "before": self.before, "after": self.after,
            "outputs_flattened": self.outputs_flattened,
            **({"latency": self.latency} if self.latency is not None else {}),
        }


def fuse(target: ModelTarget, specs: Sequence[InputSpec], *, kwargs: dict | None = None,
         dtype: torch.dtype | None = None, weights: str | None = None, path: str | None = None,
         attention: bool = True, rtol: float | None = None, atol: float | None = None,
         device: torch.device | None = None) -> FuseResult:
    """Fold batch norms (and rewrite attention), verify against the original, save to ``path``.

    Raises:
        VerifyError: the fused outputs differ beyond the tolerance (nothing is saved).
        CaptureError: the model cannot be built, run or exported.
    """
    with _capture_context():
        model = build_real(target, kwargs or {}, dtype, specs)
        strip_user_hooks(model)
        if weights is not None:
            load_weights(model, weights)
        else:
            randomize_batch_norms(model)
        model.eval()
        call = make_call(specs, dtype)
        output = _run(model, call, "the original model")
        reference = output_tensors(output)
        original = _export(model, call, output)
        with warnings.catch_warnings():  # the program's tree specs warn about their own deprecations
            warnings.simplefilter("ignore", FutureWarning)
            gm = copy.deepcopy(original.module())
        folds = fold_batch_norms(gm)
        rewrites = rewrite_attention(gm) if attention else ()
        fused = _export(gm, call, what="the fused graph")
        check = compare(reference, output_tensors(_run(fused.module(), call, "the fused program")), rtol, atol)
    before, after = program_totals(original, specs), program_totals(fused, specs)
    result = FuseResult(target.name, tuple(s.to_json() for s in specs), folds.folded, folds.kept, rewrites,
                        check, weights, before, after, program=fused, outputs_flattened=not _plain_output(output))
    if not check.passed:
        error = VerifyError(
            f"the fused model differs from the original: max abs error {check.max_abs_err:.3g} "
            f"(relative {check.max_rel_err:.3g}) is above the {check.dtype} tolerance "
            f"(rtol {check.rtol:g}, atol {check.atol:g}); nothing was saved",
            hint="pass --rtol/--atol to accept it, or report the model")
        error.result = result
        raise error
    if device is not None:
        result = _with_latency(result, model, fused, call, device)
    if path is not None:
        save_program(fused, path)
        result = dataclasses.replace(result, path=path)
    return result


def _run(model: nn.Module, call: Call, what: str) -> Any:
    try:
        with torch.no_grad():
            return call(model)
    except Exception as exc:
        raise CaptureError(f"{what} failed on the example inputs: {short(exc)}") from exc


def _export(model: nn.Module, call: Call, reference: tuple | None = None,
            what: str = "the model") -> torch.export.ExportedProgram:
    """Export with forward's own output structure when export can keep it (a tensor, tuples, lists
    and dicts of them), else with the output flattened to a tuple of its tensors."""
    try:
        with quiet():
            if isinstance(model, torch.fx.GraphModule) or _plain_output(reference):
                return torch.export.export(model, call.args, call.kwargs, strict=False)
            return export_program(model, call)
    except ArchscanError:
        raise
    except Exception as exc:
        raise CaptureError(f"torch.export could not export {what}: {short(exc)}",
                           hint="archscan fuse works on models torch.export can capture; "
                                "`archscan MODEL` shows which capture works") from exc


def _plain_output(output: Any) -> bool:
    """A tensor, or tuples/lists/dicts of tensors only."""
    if isinstance(output, torch.Tensor):
        return True
    if type(output) in (tuple, list):
        return all(map(_plain_output, output))
    if type(output) is dict:
        return all(map(_plain_output, output.values()))
    return False


def save_program(program: torch.export.ExportedProgram, path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ArchscanError(f"cannot save to {path}: no directory {parent}", hint="create it, or pick another -o path")
    try:
        torch.export.save(program, path)
    except OSError as exc:
        raise ArchscanError(f"cannot save to {path}: {exc.strerror or exc}") from None


def program_totals(program: torch.export.ExportedProgram, specs: Sequence[InputSpec]) -> dict:
    """Static totals of an exported program (archscan's own analysis of its graph)."""
    from ..api import scan
    from ..measure.predict import report_totals

    report = scan(ModelTarget("program", None, instance=program.module(), program=True), specs, rules=[],
                  profile=False, recommend=False)
    return {**report_totals(report),
            "batch_norms": sum(1 for n in report.nodes if any("batch_norm" in op for op in n.aten_ops))}


def _with_latency(result: FuseResult, model: nn.Module, fused: torch.export.ExportedProgram, call: Call,
                  device: torch.device) -> FuseResult:
    """End-to-end latency of the original and the fused program on ``device``, timed interleaved."""
    from ..measure.timing import clock_for, time_ab

    clock = clock_for(device)
    on_device = Call(tuple(t.to(device) for t in call.args), {k: t.to(device) for k, t in call.kwargs.items()})
    model, program = model.to(device), fused.module().to(device)
    with torch.inference_mode():
        before, after = time_ab(lambda: on_device(model), lambda: on_device(program), clock)
    times = {}
    for name, stats in (("before", before), ("after", after)):
        times[f"{name}_ms"] = stats.median_ms
        times[f"{name}_spread"] = round(stats.spread, 4)
        times[f"{name}_unstable"] = stats.unstable
    from ..measure.profile import device_name

    latency = {"device": str(device), "device_name": device_name(device), **times,
               "threads": torch.get_num_threads() if device.type == "cpu" else None}
    return dataclasses.replace(result, latency=latency)


