"""Does a transformed model compute what the original did? Outputs compared on the same inputs.

For each output tensor: ``max_abs_err = max|fused - original|`` and ``max_rel_err = max_abs_err /
max|original|`` (relative to the output's largest magnitude: element-wise ratios blow up where an
output is near zero). It passes when ``max_abs_err <= atol + rtol * max|original|`` for every
float output and integer outputs are equal.

When it does not, the difference may be the original's own rounding rather than the fold's: a
badly conditioned model (a trained one whose batch norms have large scales over small running
variances, or subtract a large running mean from a conv output of about the same size) loses
digits in float32, and the fold, computed in float64, loses fewer. So both sides are then
compared with a float64 run of the original on the same inputs (``float64_outputs``), each error
relative to the reference's largest magnitude. The fold passes when, on every float output, its
error against the reference is within the tolerance or no larger than the original's own: it
adds no error the original does not already have. ``Check.drifted`` says which side is farther
from the reference. A model that does not run in float64 (it makes float32 tensors of its own
in forward) has no reference, and the direct comparison stands.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ArchscanError
from ..load.building import Call
from ..load.recording import output_tensors

# (rtol, atol) per dtype: a fold reorders one multiply per weight, so the error is a few ulps of the
# dtype amplified through the layers after it.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (1e-4, 1e-6),
    torch.float16: (1e-2, 1e-4),
    torch.bfloat16: (5e-2, 1e-3),
}


@dataclass(frozen=True)
class Check:
    """The comparison of a transformed model's outputs with the original's (and, when they differ
    beyond the tolerance, of both with a float64 run of the original)."""

    outputs: int
    max_abs_err: float
    max_rel_err: float
    rtol: float
    atol: float
    passed: bool
    dtype: str
    original_rel_err64: float | None = None  # max|original - float64| / max|float64|, worst output; None: not compared
    fused_rel_err64: float | None = None     # max|fused - float64| / max|float64|, worst output

    @property
    def drifted(self) -> str | None:
        """'original' or 'fused': the side farther from the float64 reference (None without one)."""
        if self.original_rel_err64 is None or self.fused_rel_err64 is None:
            return None
        return "fused" if self.fused_rel_err64 > self.original_rel_err64 else "original"

    def to_json(self) -> dict:
        out = dict(vars(self))
        if self.drifted is not None:
            out["drifted"] = self.drifted
        return out


def tolerance(dtype: torch.dtype, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    default_rtol, default_atol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


def _errors(reference: torch.Tensor, other: torch.Tensor) -> tuple[float, float] | None:
    """(max|other - reference|, max|reference|) over the finite elements; None when the two are
    not finite in the same places (inf where a float is out of range, or nan)."""
    r64, o64 = reference.detach().double().cpu(), other.detach().double().cpu()
    finite = torch.isfinite(r64)
    if not torch.equal(finite, torch.isfinite(o64)):
        return None
    if not finite.any():
        return 0.0, 0.0
    return (r64[finite] - o64[finite]).abs().max().item(), r64[finite].abs().max().item()


def _relative(err: float, scale: float) -> float:
    return err / scale if scale else (0.0 if err == 0 else float("inf"))


def compare(reference: tuple[torch.Tensor, ...], fused: tuple[torch.Tensor, ...],
            rtol: float | None = None, atol: float | None = None,
            exact: tuple[torch.Tensor, ...] | None = None) -> Check:
    """Compare two flattened outputs (see the module doc); ``exact``: the original's outputs in
    float64, which judge a difference beyond the tolerance."""
    if len(reference) != len(fused):
        raise ArchscanError(f"the transformed model returns {len(fused)} tensors, the original {len(reference)}")
    floats = [r for r in reference if r.is_floating_point()]
    dtype = floats[0].dtype if floats else torch.float32
    rtol, atol = tolerance(dtype, rtol, atol)
    worst_abs, worst_rel, passed = 0.0, 0.0, True
    for r, f in zip(reference, fused):
        if r.shape != f.shape:
            raise ArchscanError(f"the transformed model returns shape {tuple(f.shape)} where the original returns {tuple(r.shape)}")
        if not r.is_floating_point():
            passed &= bool(torch.equal(r, f.to(r.dtype)))
            continue
        found = _errors(r, f)
        if found is None:
            passed = False
            worst_abs = worst_rel = float("inf")
            continue
        err, scale = found
        worst_abs = max(worst_abs, err)
        worst_rel = max(worst_rel, _relative(err, scale))
        passed &= err <= atol + rtol * scale
    check = Check(len(reference), worst_abs, worst_rel, rtol, atol, passed, str(dtype).removeprefix("torch."))
    if passed or exact is None or worst_abs == float("inf"):  # inf and nan in other places are no rounding
        return check
    return _against_float64(check, reference, fused, exact)


def _against_float64(check: Check, reference, fused, exact) -> Check:
    """``check`` judged on the float64 reference (see the module doc)."""
    if len(exact) != len(reference) or any(e.shape != r.shape for e, r in zip(exact, reference)):
        return check  # forward took another path in float64: no reference for these outputs
    passed, original_err, fused_err = True, 0.0, 0.0
    for r, f, e in zip(reference, fused, exact):
        if not r.is_floating_point():
            passed &= bool(torch.equal(r, f.to(r.dtype)))
            continue
        of, ff = _errors(e, r), _errors(e, f)
        if of is None or ff is None:  # the float32 runs overflow where float64 does not: no verdict from it
            return check
        (o_err, scale), (f_err, _) = of, ff
        original_err = max(original_err, _relative(o_err, scale))
        fused_err = max(fused_err, _relative(f_err, scale))
        passed &= f_err <= max(check.atol + check.rtol * scale, o_err)
    return dataclasses.replace(check, passed=passed, original_rel_err64=original_err, fused_rel_err64=fused_err)


def _in_float64(x: Any) -> Any:
    """An input with its floating tensors in float64 (nested in lists, tuples, dicts and dataclasses)."""
    if isinstance(x, torch.Tensor):
        return x.double() if x.is_floating_point() else x
    if isinstance(x, dict):
        return {k: _in_float64(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(map(_in_float64, x)) if type(x) in (list, tuple) else x
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: _in_float64(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init})
    return x


def float64_outputs(model: torch.nn.Module, call: Call) -> tuple[torch.Tensor, ...] | None:
    """The original model's outputs computed in float64 on ``call``'s inputs (a copy of the model,
    its floating parameters and buffers in float64); None when it does not run so, or is float64
    already (it is its own reference)."""
    floats = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    if floats and all(t.dtype == torch.float64 for t in floats):
        return None
    try:
        exact = copy.deepcopy(model).double()
        with torch.no_grad():
            out = output_tensors(exact(*_in_float64(call.args), **_in_float64(call.kwargs)))
    except Exception:  # forward makes tensors of a fixed dtype, or the copy cannot be made
        return None
    return tuple(out)
