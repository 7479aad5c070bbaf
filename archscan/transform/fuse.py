"""``archscan fuse``: fold batch norms, rewrite hand-written attention to SDPA, verify, save ``.pt2``.

The model is built with real weights (``--weights``; an instance's own when its batch norms carry
statistics; else random ones with random batch-norm
statistics), exported with ``torch.export`` (non-strict), transformed on the exported graph
(``fold.py``, ``attention.py``), exported again, and compared with the original on the same
random inputs (``verify.py``; beyond the tolerance, both against a float64 run of the original,
which says whether the fold or the original's own rounding drifted). Only a program that
passes is saved; ``torch.export.load(path)
.module()`` runs it with plain torch.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..analysis import analyse
from ..load.building import build_real, make_call, strip_user_hooks
from ..capture import capture_context
from ..errors import VerifyError
from ..load.targets import InputSpec, ModelTarget, output_path  # noqa: F401  (output_path: archscan.transform's API)
from ..measure.predict import report_totals
from ..load.recording import output_tensors
from .attention import Rewrite, rewrite_attention, unmatched
from .fold import Fold, Kept, fold_batch_norms
from .programs import batch_call, export, latency_ab, plain_output, run, save_program
from .verify import Check, compare, float64_outputs
from .weights import fresh_batch_norms, load_weights, randomize_batch_norms


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
    attention_left: tuple[tuple[str, str], ...] = ()  # (module, why) of softmaxes between matmuls not rewritten
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
            "attention_left": [{"module": m, "why": why} for m, why in self.attention_left],
            "check": self.check.to_json(), "before": self.before, "after": self.after,
            "outputs_flattened": self.outputs_flattened,
            **({"latency": self.latency} if self.latency is not None else {}),
        }


def fuse(target: ModelTarget, specs: Sequence[InputSpec], *, kwargs: dict | None = None,
         dtype: torch.dtype | None = None, weights: str | None = None, path: str | None = None,
         attention: bool = True, rtol: float | None = None, atol: float | None = None,
         device: torch.device | None = None) -> FuseResult:
    """Fold batch norms (and rewrite attention), verify against the original, save to ``path``.

    With the default tolerance, outputs that differ beyond it are judged on a float64 run of the
    original: the fold passes when it is within the tolerance of it, or no farther from it than
    the original (``verify.py``). A tolerance given (``rtol``, ``atol``) bounds the difference
    from the original itself.

    Raises:
        VerifyError: the fused outputs differ beyond the tolerance (nothing is saved).
        CaptureError: the model cannot be built, run or exported.
    """
    with capture_context():
        model = build_real(target, kwargs or {}, dtype, specs)
        strip_user_hooks(model)
        if weights is not None:
            load_weights(model, weights)
        elif fresh_batch_norms(model):
            randomize_batch_norms(model)
        else:  # trained statistics (an instance, a factory that loads weights): the model as given is the reference
            weights = "the model's own weights (its batch norms carry statistics)"
        model.eval()
        call = make_call(specs, dtype)
        output = run(model, call, "the original model")
        reference = output_tensors(output)
        batch = batch_call(specs, dtype)  # the saved program takes any batch where the model allows it
        original = export(model, call, output, batch=batch)
        with warnings.catch_warnings():  # the program's tree specs warn about their own deprecations
            warnings.simplefilter("ignore", FutureWarning)
            gm = copy.deepcopy(original.module())
        folds = fold_batch_norms(gm)
        rewrites = rewrite_attention(gm) if attention else ()
        left = unmatched(gm) if attention else ()
        fused = export(gm, call, what="the fused graph", batch=batch)
        outputs = output_tensors(run(fused.module(), call, "the fused program"))
        check = compare(reference, outputs, rtol, atol)
        if not check.passed and rtol is None and atol is None:  # the original's rounding or the fold's: float64 decides
            check = compare(reference, outputs, exact=float64_outputs(model, call))
    before, after = program_totals(original, specs), program_totals(fused, specs)
    result = FuseResult(target.name, tuple(s.to_json() for s in specs), folds.folded, folds.kept, rewrites,
                        check, weights, before, after, program=fused, outputs_flattened=not plain_output(output),
                        attention_left=left)
    if not check.passed:
        error = VerifyError(
            f"the fused model differs from the original: max abs error {check.max_abs_err:.3g} "
            f"(relative {check.max_rel_err:.3g}) is above the {check.dtype} tolerance "
            f"(rtol {check.rtol:g}, atol {check.atol:g}){_against_float64(check)}; nothing was saved",
            hint="pass --rtol/--atol to accept it, or report the model")
        error.result = result
        raise error
    if device is not None:
        result = dataclasses.replace(result, latency=latency_ab(model, fused, call, device))
    if path is not None:
        save_program(fused, path)
        result = dataclasses.replace(result, path=path)
    return result


def _against_float64(check: Check) -> str:
    """What the float64 run of the original said about a failed check ('' when there was none)."""
    if check.drifted is None:
        return ""
    if check.drifted == "fused":
        return (f", and the fused program is farther from a float64 run of the original (relative error "
                f"{check.fused_rel_err64:.3g}) than the original is ({check.original_rel_err64:.3g}): the fold lost precision")
    return (f", and on an output the fused program is farther from a float64 run of the original than the original "
            f"is (worst relative errors: fused {check.fused_rel_err64:.3g}, original {check.original_rel_err64:.3g})")


def program_totals(program: torch.export.ExportedProgram, specs: Sequence[InputSpec]) -> dict:
    """Static totals of an exported program (archscan's own analysis of its graph)."""
    report = analyse(ModelTarget("program", None, instance=program.module(), program=True), specs, memory=False)
    return {**report_totals(report),
            "batch_norms": sum(1 for n in report.nodes if any("batch_norm" in op for op in n.aten_ops))}
