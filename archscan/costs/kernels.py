"""Running an op under archscan's dispatch modes where torch's fake (meta) kernel refuses what the
real CPU kernel runs.

``aten._grouped_mm`` (the experts' GEMMs of mixture-of-experts models, ``F.grouped_mm``): torch's
meta kernel insists on bfloat16 inputs while the CPU kernel runs float32 too, so a float32 MoE
model would not run on fake tensors at all. The result is then made from its shape
(``registry.grouped_mm_shape``). Each mode that executes ops calls ``run_op``; the innermost one
meets the refusal and answers it, and the modes above see an ordinary result.
"""

from __future__ import annotations

import torch

from .registry import grouped_mm_shape

aten = torch.ops.aten
_GROUPED_MM = getattr(aten, "_grouped_mm", None)


def run_op(func, args: tuple, kwargs: dict):
    """``func(*args, **kwargs)``, with the result of an op the fake kernel refuses made from its shape."""
    try:
        return func(*args, **kwargs)
    except RuntimeError:
        if _GROUPED_MM is None or func.overloadpacket is not _GROUPED_MM:
            raise
        a, b = args[:2]
        offs = args[2] if len(args) > 2 else kwargs.get("offs")
        shape = grouped_mm_shape(a, b, offs)
        if shape is None or a.dtype != b.dtype:
            raise
        out_dtype = (args[4] if len(args) > 4 else kwargs.get("out_dtype")) or a.dtype
        return a.new_empty(shape, dtype=out_dtype)
