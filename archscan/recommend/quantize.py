"""The ``quantize`` recommendation: int8 weight-only quantization where the weights' bytes bound the
time (a decode step, small-batch inference), with the bytes and time it saves and the
``archscan quantize`` line that applies it.

The saving is counted as ``--quant int8`` counts it (``archscan.quant``): the linear layers it would
quantize (the first and last stay, and those it cannot take), each reading its weight as stored
(int8 values with a scale and a zero point per row, from the layout's shapes: no torchao needed to
recommend it), predicted on the scan's profile when there is one. It is proposed when it takes at
least ``SHARE`` of the forward's bytes off and, with a profile, of its predicted time, and at least
``LEAST`` bytes of weights: a model whose time is its multiply-adds or its launches gains nothing
from weight-only quantization, and weights a cache holds cost little to read. Outputs change (by the drift ``archscan quantize`` reports), so it
ranks after every change that keeps what the model computes."""

from __future__ import annotations

import shlex

from ..errors import ArchscanError
from ..measure.gpu import gpu_of
from ..quant.analyse import plan_layers, quantized, rewrite, times
from ..quant.schemes import Scheme
from ..results import Recommendation
from ..units import fmt_bytes

SHARE = 0.10  # the least share of the forward's bytes the recommendation must take off
LEAST = 1 << 20  # the least weight bytes it must save: smaller weights stay in a cache, their reads cost little


def quantize_recommendations(ctx) -> list[Recommendation]:
    report = ctx.report
    if ctx.model is None or not report.totals.mac_bytes or report.dtype not in ("float32", "bfloat16", "float16"):
        return []
    scheme = Scheme("int8")
    gpu = gpu_of(ctx.profile) if ctx.profile is not None else None
    try:
        layers = plan_layers(ctx.model, report, scheme, gpu=gpu, profile=ctx.profile, formula=True)
    except ArchscanError:
        return []
    chosen = quantized(layers)
    if not chosen:
        return []
    after = rewrite(report.nodes, chosen, scheme)
    saved = report.totals.mac_bytes - sum(n.mac_bytes for n in after)
    stored = sum(s for _, s in chosen.values())
    held = sum(w for w, _ in chosen.values())
    if saved < SHARE * report.totals.mac_bytes or held - stored < LEAST:
        return []
    saving: dict = {"mac_bytes": int(saved), "flops": 0, "params": 0, "kernels": 0, "param_bytes": int(held - stored)}
    basis = "mac"
    was, now = times(report.nodes, gpu, ctx.profile), times(after, gpu, ctx.profile)
    key = "served_ms" if "served_ms" in was else "predicted_ms"
    if key in was:
        saving["ms"], basis = max(0.0, was[key] - now[key]), "predicted"
        if saving["ms"] < SHARE * was[key]:  # launches or multiply-adds bound it: the bytes saved buy no time
            return []
    share = saved / report.totals.mac_bytes
    served = " as served (compiled or a CUDA graph: eager PyTorch's host time hides it)" if key == "served_ms" else ""
    decode = (report.phases or {}).get("decode")
    where = f"the decode step after {decode['context']:,} cached tokens" if decode else "this forward"
    if ctx.command:
        apply = f"archscan quantize {ctx.command} --scheme int8 -o {shlex.quote(_output(report.model))}"
        check = f"archscan {ctx.command} --quant int8" + (f" --decode {decode['context']}" if decode else "")
    else:
        apply = "archscan.quantize(model, inputs, scheme='int8', path='model-int8.pt2')"
        check = "archscan.scan(model, inputs, quant='int8')"
    return [Recommendation(
        kind="quantize", target=tuple(chosen),
        reason=f"reading weights bounds {where}: int8 weight-only quantization of {len(chosen)} linear layer(s) "
               f"stores {fmt_bytes(held)} of weights in {fmt_bytes(stored)} and moves {share:.0%} fewer bytes"
               + (f", {saving['ms'] / was[key]:.0%} less time{served}" if "ms" in saving else "") + "; "
               f"outputs change: check the drift `archscan quantize` reports on trained weights (--weights); "
               f"int4 and the kept layers: {check}",
        estimated_saving=saving, basis=basis, apply=apply,
    )]


def _output(model: str) -> str:
    from ..load.targets import output_path

    return output_path(model, "int8")


__all__ = ["LEAST", "SHARE", "quantize_recommendations"]
