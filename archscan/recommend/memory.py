"""Recommendations that free memory, from the analysed budget (``report.memory``'s ``budget``,
``checkpoint_plan`` and ``what_ifs``, made by ``archscan.memory.budget``): each carries the bytes
it takes off the peak (``estimated_saving["peak_bytes"]``; negative where it adds) and what it
costs, and every figure is a re-analysed peak (basis ``analysed``), so each is verified."""

from __future__ import annotations

import re

from ..results import Recommendation
from ..units import fmt_bytes, fmt_count

_WHAT_IFS = {  # what-if change (its start) -> recommendation kind
    "fused optimizer": "fused-optimizer",
    "bf16 autocast": "amp",
    "activations in place": "in-place",
}


def _saving(peak_bytes: int, flops: int = 0) -> dict:
    return {"mac_bytes": 0, "flops": int(flops), "params": 0, "kernels": 0, "peak_bytes": int(peak_bytes)}


def memory_recommendations(ctx) -> list[Recommendation]:
    memory = ctx.report.memory or {}
    budget = memory.get("budget")
    if not budget:
        return []
    out = []
    current = ctx.report.inputs[0]["shape"][0] if ctx.report.inputs and ctx.report.inputs[0]["shape"] else None
    best = budget.get("max_batch")
    if best and best != current:
        at, nxt = budget["peak_bytes_at_max"], budget["next_peak_bytes"]
        out.append(Recommendation(
            kind="batch-size", target=("",),
            reason=f"the largest batch whose {budget['for']} fits {budget['label']} is {best:,} (peak {fmt_bytes(at)}; "
                   f"{best + 1:,} needs {fmt_bytes(nxt)}), against {current:,} now: "
                   + ("a larger batch fills the memory and the device" if best > current else
                      "the batch asked for does not fit"),
            estimated_saving=_saving(0), basis="analysed", apply=_with_batch(ctx, best), verified=True))
    step_peak = (ctx.report.training_step or {}).get("memory", {}).get("peak_bytes")
    plan = memory.get("checkpoint_plan")
    if plan and plan.get("fits") and plan["modules"] and step_peak:
        count = len(plan["modules"])
        out.append(Recommendation(
            kind="checkpoint", target=tuple(plan["modules"]),
            reason=f"checkpoint {count} module{'s' if count > 1 else ''} ({', '.join(plan['modules'][:3])}"
                   f"{' …' if count > 3 else ''}) so the training step fits {budget['label']}: peak "
                   f"{fmt_bytes(step_peak)} -> {fmt_bytes(plan['peak_bytes'])} (re-analysed with them under "
                   f"torch.utils.checkpoint), for {fmt_count(plan['recompute_flops'])} multiply-adds of recompute",
            estimated_saving=_saving(step_peak - plan["peak_bytes"], -plan["recompute_flops"]), basis="analysed",
            apply=plan["code"],
            verified=True))
    for w in memory.get("what_ifs", []):
        kind = next((k for change, k in _WHAT_IFS.items() if w["change"].startswith(change)), None)
        if kind is None or w.get("peak_delta", 0) >= 0:
            continue
        out.append(Recommendation(
            kind=kind, target=("",),
            reason=f"{w['change']}: the training step's peak {fmt_bytes(step_peak)} -> "
                   f"{fmt_bytes(w['peak_bytes'])} (re-analysed)"
                   + (f", {'+' if w['flops_delta'] > 0 else '-'}{fmt_count(abs(w['flops_delta']))} multiply-adds"
                      if w["flops_delta"] else ""),
            estimated_saving=_saving(-w["peak_delta"], -w["flops_delta"]), basis="analysed",
            apply=_train_flag(ctx, w["apply"]), verified=True))
    return out


def _with_batch(ctx, batch: int) -> str:
    """The scan at ``batch`` (the first dimension of every input)."""
    if not ctx.command:
        return f"archscan.scan(model, inputs with batch {batch})"
    return "archscan " + re.sub(r"(--input (?:\w+=)?)(\d+)", lambda m: f"{m.group(1)}{batch}", ctx.command) + _train_flags(ctx)


def _train_flag(ctx, flag: str) -> str:
    """The scan again with ``flag`` in place of the option of that name ('--optimizer adamw:fused')."""
    if not flag.startswith("--") or not ctx.command:
        return flag
    words = _drop_option(_train_flags(ctx).split(), flag.split()[0])
    return " ".join(["archscan", ctx.command, *words, flag])


def _drop_option(words: list[str], option: str) -> list[str]:
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w == option:
            skip = True
            continue
        out.append(w)
    return out


def _train_flags(ctx) -> str:
    """--train and its options as the report's step was analysed, and the budget."""
    step = ctx.report.training_step
    budget = (ctx.report.memory or {}).get("budget", {})
    flags = []
    if step:
        o = step["options"]
        flags += ["--train", "--optimizer", o["optimizer"] + (f":{o['impl']}" if o["impl"] != "default" else "")]
        flags += [f"--amp {o['amp']}"] if o.get("amp") else []
        flags += [f"--freeze {f}" for f in o.get("freeze", [])]
    if budget:
        flags += ["--memory", _size_flag(budget)]
    return (" " + " ".join(flags)) if flags else ""


def _size_flag(budget: dict) -> str:
    """The budget as ``--memory`` reads it: the GPU's name, the size as given, or its bytes."""
    from ..errors import ArchscanError
    from ..memory.budget import parse_budget

    if budget.get("gpu"):
        return budget["gpu"]
    label = budget["label"]
    word = label.split(" (")[-1].rstrip(")") if "(" in label else label.replace(" ", "")
    try:
        return word if parse_budget(word).bytes == budget["bytes"] else f"{budget['bytes']}B"
    except ArchscanError:
        return f"{budget['bytes']}B"
