"""Does a transformed model compute what the original did? Outputs compared on the same inputs.

For each output tensor: ``max_abs_err = max|fused - original|`` and ``max_rel_err = max_abs_err /
max|original|`` (relative to the output's largest magnitude: element-wise ratios blow up where an
output is near zero). It passes when ``max_abs_err <= atol + rtol * max|original|`` for every
float output and integer outputs are equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ArchscanError

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
    """The comparison of a transformed model's outputs with the original's."""

    outputs: int
    max_abs_err: float
    max_rel_err: float
    rtol: float
    atol: float
    passed: bool
    dtype: str

    def to_json(self) -> dict:
        return dict(vars(self))


def tolerance(dtype: torch.dtype, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    default_rtol, default_atol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


def compare(reference: tuple[torch.Tensor, ...], fused: tuple[torch.Tensor, ...],
            rtol: float | None = None, atol: float | None = None) -> Check:
    """Compare two flattened outputs (see the module doc)."""
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
        r64, f64 = r.detach().double().cpu(), f.detach().double().cpu()
        finite = torch.isfinite(r64)
        if not torch.equal(finite, torch.isfinite(f64)):
            passed = False
            worst_abs = worst_rel = float("inf")
            continue
        if not finite.any():
            continue
        err = (r64[finite] - f64[finite]).abs().max().item()
        scale = r64[finite].abs().max().item()
        worst_abs = max(worst_abs, err)
        worst_rel = max(worst_rel, err / scale if scale else (0.0 if err == 0 else float("inf")))
        passed &= err <= atol + rtol * scale
    return Check(len(reference), worst_abs, worst_rel, rtol, atol, passed, str(dtype).removeprefix("torch."))
