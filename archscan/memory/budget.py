"""Memory budgets: the largest batch whose peak fits, activation-checkpointing plans, what-ifs.

Every figure here is a peak that was analysed, never one extrapolated and left unchecked:

* **The largest batch** (``largest_batch``): the peak is affine in the batch for most models, so
  batches 1, 2 and 3 give its slope and intercept and the answer; the answer and the answer + 1
  are then analysed (the first must fit, the second must not). A model whose peak is not affine
  (or whose check fails) is searched instead: doubling, then bisection.
* **Checkpoint plans** (``checkpoint_plan``): the candidates are the blocks of the model's
  repeated runs (``blocks``), each with the bytes it frees at the peak (what its forward saved for
  the backward, less its output, which the next block keeps) and the multiply-adds its recompute
  costs. Plans are prefixes of one order, most bytes freed per multiply-add first, so a larger
  budget never gets more recompute; the plan is the shortest prefix whose peak, re-analysed with
  those modules under ``torch.utils.checkpoint`` (non-reentrant), fits.
* **What-ifs** (``what_ifs``): the step re-analysed with one change each, with its exact deltas.

The functions take the analysis as a callable (``peak_of(batch)``, ``step(options, dtype,
specs)``): the orchestrator decides how a figure is made (fake tensors; the captured graph).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch
import torch.nn as nn

from ..errors import ArchscanError
from ..devices.gpus import GPUS, gpu
from ..load.targets import InputSpec
from ..units import fmt_bytes
from .gpu import CONTEXT_BYTES, current, usable_bytes
from .train import TrainOptions

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
MAX_BATCH = 1 << 40  # past this the peak is taken not to grow with the batch


@dataclass(frozen=True)
class Budget:
    """A memory budget: its bytes and how the user named it ('80 GiB (h100)', '24 GB')."""

    bytes: int
    label: str
    gpu: str | None = None  # the GPU whose whole memory it is ('h100'), when named so

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "label": self.label, **({"gpu": self.gpu} if self.gpu else {})}


def on_execution(budget: Budget) -> tuple[Budget, int | None, str]:
    """The budget as the current execution model counts it: (the budget, the limit the simulated
    caching allocator reserves under or None, what a peak is measured by). On a GPU a budget is
    about the reserved peak (what runs out of memory); a GPU's whole memory is what CUDA reports
    less the CUDA context. On the CPU, about the bytes live."""
    execution = current()
    if not execution.is_gpu:
        return budget, None, "peak bytes live (the CPU's kernels)"
    if budget.gpu is not None and budget.gpu == execution.name:
        usable = usable_bytes(execution)
        budget = Budget(usable + CONTEXT_BYTES, f"{fmt_bytes(usable + CONTEXT_BYTES)} ({budget.gpu}, as CUDA reports it)",
                        budget.gpu)
        return budget, usable, (f"whether CUDA's caching allocator (simulated, {execution.name}) runs out of memory in "
                                f"the budget less {fmt_bytes(CONTEXT_BYTES)} of CUDA context; peaks allocated")
    return budget, budget.bytes, (f"whether CUDA's caching allocator (simulated, {execution.name}) runs out of memory "
                                  "in the budget; peaks allocated")


def counted_bytes(memory: dict, budget: Budget, limit: int | None) -> int:
    """A run's peak against ``budget`` (``on_execution``): the bytes live on the CPU. On a GPU
    whether it runs decides: where the simulated caching allocator runs out of memory under the
    limit, more than the budget (its reserved peak, at least the budget + 1); where it does not,
    its allocated peak with the libraries' workspaces (and the context), which grows with the
    batch where the reserved segments step."""
    cuda = memory.get("cuda")
    if cuda is None or limit is None:
        return memory["peak_bytes"]
    context = budget.bytes - limit
    if cuda.get("out_of_memory"):
        return max(cuda["reserved_peak_bytes"] + context, budget.bytes + 1)
    return min(cuda["allocated_peak_bytes"] + cuda["library_bytes"] + context, budget.bytes)


def parse_budget(text: str) -> Budget:
    """'80GiB', '24GB', '1.5TB', '512MiB' (GB = 10⁹ bytes, GiB = 2³⁰), or a GPU name from
    ``archscan.devices.gpus`` ('h100', 'a100-40gb', 'l4')."""
    named = gpu(text)
    if named is not None:
        return Budget(named.memory_bytes, f"{named.memory_bytes / (1 << 30):g} GiB ({named.name})", named.name)
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", text or "")
    if not found or found.group(2).lower() not in _UNITS:
        names = ", ".join(sorted({g.name for g in GPUS.values()}))
        raise ArchscanError(f"cannot read --memory {text!r}",
                            hint=f"give a size with its unit (80GiB, 24GB, 512MiB) or a GPU: {names}")
    size = int(float(found.group(1)) * _UNITS[found.group(2).lower()])
    if size <= 0:
        raise ArchscanError(f"--memory {text!r} is no memory at all", hint="give a size above zero: 80GiB, 24GB")
    return Budget(size, f"{found.group(1)} {found.group(2)}")


def batched(specs: Sequence[InputSpec], batch: int) -> list[InputSpec]:
    """The inputs with their first dimension (the batch) set to ``batch``."""
    return [replace(s, shape=(batch, *s.shape[1:])) for s in specs]


def check_batchable(specs: Sequence[InputSpec]) -> None:
    """One line, before any analysis, when an input has no dimension for the batch to grow."""
    flat = [i for i, s in enumerate(specs, 1) if not s.shape]
    if not specs or flat:
        raise ArchscanError(
            "--memory grows the batch, the first dimension of every input, and "
            + (f"input {flat[0]} is a scalar" if flat else "the model takes no input"),
            hint="give each input its batch dimension (--input 1,3,224,224)")


def check_weights_fit(weights_bytes: int, budget: Budget, what: str = "the parameters") -> None:
    if weights_bytes > budget.bytes:
        raise ArchscanError(f"{what} alone need {fmt_bytes(weights_bytes)}, more than the budget of {budget.label}",
                            hint="give a larger --memory, or a lower --dtype (bf16 halves the weights)")


def largest_batch(peak_of: Callable[[int], int | tuple[int, dict]], budget: int) -> dict:
    """The largest batch whose peak fits in ``budget`` bytes (``peak_of(batch)``: the peak, or the
    peak and each phase's peak, whose lines give a better first guess where the peak moves from
    one phase to another): ``{"max_batch", "peak_bytes_at_max",
    "next_peak_bytes" (the batch after it), "method" ("affine" | "search"), "per_sample_bytes" and
    "fixed_bytes" (when affine), "runs"}``; ``max_batch`` 0 when the smallest batch does not fit, None
    when the peak does not grow with the batch. The smallest batch is 1, or 2 where the model
    cannot run one sample (a training step's batch norm needs more than one value per channel):
    ``smallest`` and ``smallest_why`` say so."""
    peaks: dict[int, int] = {}
    phases: dict[int, dict] = {}

    def peak(batch: int) -> int:
        if batch not in peaks:
            got = peak_of(batch)
            peaks[batch], phases[batch] = got if isinstance(got, tuple) else (got, {})
        return peaks[batch]

    first, why = 1, None
    try:
        peak(1)
    except ArchscanError as exc:  # one sample does not run: the search starts at two, or fails as two does
        first, why = 2, str(exc)
    p1, p2, p3 = peak(first), peak(first + 1), peak(first + 2)
    slope = p2 - p1
    affine = slope > 0 and p3 - p2 == slope
    smallest = {"smallest": first, "smallest_why": f"batch 1 does not run: {why}"} if why else {}

    def answer(batch: int, method: str) -> dict:
        nxt = peak(max(batch, first - 1) + 1)
        return {"max_batch": batch, "peak_bytes_at_max": peaks.get(batch), "next_peak_bytes": nxt, "method": method,
                "per_sample_bytes": nxt - peaks[batch] if batch else slope,
                **({"fixed_bytes": p1 - slope * first} if method == "affine" else {}), "runs": len(peaks), **smallest}

    if p1 > budget:
        return answer(0, "affine" if affine else "search")
    if p3 <= p1:
        return {"max_batch": None, "peak_bytes_at_max": None, "method": "search", "runs": len(peaks),
                "reason": "the peak does not grow with the batch"}
    # From the line through batches 2 and 3, Newton steps on the local slope: exact at once where the
    # peak is affine, a few steps where it is piecewise affine (the peak moves to another layer as the
    # batch grows, or a kernel's scratch changes with it)
    third, second = first + 2, first + 1
    lines = [(phases[third][k], phases[third][k] - phases[second][k]) for k in phases[third] if k in phases[second]] \
        or [(p3, p3 - p2)]
    guess = max(first, min((third + (budget - at) // slope for at, slope in lines if slope > 0), default=third))
    for step in range(8):
        if guess > MAX_BATCH:
            break
        if peak(guess) <= budget < peak(guess + 1):
            return answer(guess, "affine" if affine and step == 0 else "piecewise")
        local = peak(guess + 1) - peak(guess)
        nxt = max(first, guess + (budget - peak(guess)) // local) if local > 0 else guess
        if nxt == guess:
            break
        guess = nxt
    fits = max(b for b, p in peaks.items() if p <= budget)
    over = min((b for b, p in peaks.items() if p > budget and b > fits), default=None)
    while over is None:
        trial = fits * 2
        if trial > MAX_BATCH:
            return {"max_batch": None, "peak_bytes_at_max": None, "method": "search", "runs": len(peaks),
                    "reason": f"the peak stays under the budget past a batch of {MAX_BATCH:,}"}
        if peak(trial) <= budget:
            fits = trial
        else:
            over = trial
    while over - fits > 1:
        mid = (fits + over) // 2
        if peak(mid) <= budget:
            fits = mid
        else:
            over = mid
    return answer(fits, "search")


# --- checkpoint plans ------------------------------------------------------------------------------

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def blocks(model: nn.Module) -> tuple[list[str], list[str]]:
    """(blocks, stages): the members of the model's outermost repeated runs — two or more
    consecutive children of one class that have children of their own (not a generic container) —
    and the modules with a forward of their own that hold such runs (a ResNet's ``layer1``)."""
    found, stages = [], []

    def walk(module: nn.Module, path: str) -> None:
        children = list(module.named_children())
        i, in_run = 0, set()
        while i < len(children):
            j = i
            cls = type(children[i][1])
            while j + 1 < len(children) and type(children[j + 1][1]) is cls:
                j += 1
            if j > i and not issubclass(cls, _CONTAINERS) and any(True for _ in children[i][1].children()):
                for name, _ in children[i:j + 1]:
                    found.append(f"{path}.{name}" if path else name)
                    in_run.add(name)
                if path and not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
                    stages.append(path)
            i = j + 1
        for name, child in children:
            if name not in in_run:
                walk(child, f"{path}.{name}" if path else name)

    walk(model, "")
    return found, sorted(set(stages), key=stages.index)


def candidates(model: nn.Module, step: dict) -> list[dict]:
    """Each block and stage with ``freed_bytes`` (what its forward saved for the backward, less
    its output, which the module after it keeps) and ``recompute_flops`` (its forward's
    multiply-adds), from the analysed ``step`` (``train_step``'s result)."""
    saved, outputs, modules = step["saved_for_backward"], step.get("saved_outputs", {}), step["modules"]
    block_paths, stage_paths = blocks(model)

    def under(path: str, table: dict) -> int:
        return sum(v for m, v in table.items() if m == path or m.startswith(path + "."))

    rows = []
    for kind, paths in (("block", block_paths), ("stage", stage_paths)):
        for path in paths:
            freed = under(path, saved) - outputs.get(path, 0)
            flops = sum(v["forward"] for m, v in modules.items() if m == path or m.startswith(path + "."))
            rows.append({"module": path, "kind": kind, "freed_bytes": max(freed, 0), "recompute_flops": flops})
    return rows


def _predicted(step: dict, chosen: list[dict]) -> int:
    """The peak with ``chosen`` checkpointed, as the saved bytes go: the forward/backward peak less
    what they free, plus one block's recomputed activations; never below the optimizer's peak."""
    phases = step.get("phase_peaks", {})
    peak = step["memory"]["peak_bytes"]
    if step["memory"]["peak_at"]["phase"] == "optimizer" or not chosen:
        return peak
    freed = [c["freed_bytes"] for c in chosen]
    return max(phases.get("optimizer", 0), peak - sum(freed) + max(freed))


def checkpoint_plan(step: dict, rows: list[dict], budget: int,
                    analyse: Callable[[tuple[str, ...]], dict], max_runs: int = 8,
                    count: Callable[[dict], int] = lambda memory: memory["peak_bytes"]) -> dict:
    """The plan that fits ``budget`` with the least recompute: the shortest prefix of the blocks
    (most bytes freed per multiply-add first) whose re-analysed peak (``analyse(paths)`` returns
    the step with those modules checkpointed) fits. When none does: the smallest peak reached, by
    every block or by every stage. ``count`` measures a step's ``memory`` against the budget
    (``counted_bytes`` on a GPU: the reserved peak; the bytes live by default)."""
    order = sorted((r for r in rows if r["kind"] == "block" and r["freed_bytes"] > 0),
                   key=lambda r: (-r["freed_bytes"] / max(r["recompute_flops"], 1), rows.index(r)))
    tried: dict[int, dict] = {}

    def run(k: int) -> dict:
        if k not in tried:
            tried[k] = analyse(tuple(r["module"] for r in order[:k]))
        return tried[k]

    def fits(k: int) -> bool:
        return count(run(k)["memory"]) <= budget

    def plan(k: int) -> dict:
        got = run(k)
        return {"modules": [r["module"] for r in order[:k]], "peak_bytes": count(got["memory"]),
                "recompute_flops": got["phases"]["recompute"]["flops"], "budget_bytes": budget, "fits": True,
                "runs": len(tried), **_cache_off(got)}

    if order:
        k = next((k for k in range(1, len(order) + 1) if _predicted(step, order[:k]) <= budget), len(order))
        while len(tried) < max_runs:
            if fits(k):
                if k == 1 or (k - 1 in tried and not fits(k - 1)):
                    return plan(k)
                k -= 1
            elif k == len(order) or (k + 1 in tried and fits(k + 1)):
                break
            else:
                k += 1
        good = [k for k in tried if fits(k)]
        if good:
            return plan(min(good))
    smallest = [count(run(len(order))["memory"])] if order else []
    stages = tuple(r["module"] for r in rows if r["kind"] == "stage")
    if stages:
        by_stage = analyse(stages)
        smallest.append(count(by_stage["memory"]))
        if count(by_stage["memory"]) <= budget:
            return {"modules": list(stages), "peak_bytes": count(by_stage["memory"]),
                    "recompute_flops": by_stage["phases"]["recompute"]["flops"], "budget_bytes": budget,
                    "fits": True, "runs": len(tried) + 1, **_cache_off(by_stage)}
    least = min(smallest, default=count(step["memory"]))
    return no_plan(budget, "no checkpointing fits: the peak is in the optimizer step"
                   if step["memory"]["peak_at"]["phase"] == "optimizer"
                   else f"checkpointing every block{' or stage' if stages else ''} reaches {fmt_bytes(least)} at best",
                   least, len(tried) + bool(stages))


def no_plan(budget: int, reason: str, smallest: int | None = None, runs: int | None = None) -> dict:
    """A checkpoint plan that does not fit ``budget`` and why: the smallest peak reached and the
    analyses run, where known (None when the checkpointed step could not run)."""
    return {"modules": [], "peak_bytes": None, "recompute_flops": 0, "budget_bytes": budget, "fits": False,
            "smallest_peak_bytes": smallest, "runs": runs, "reason": reason}


def _cache_off(step: dict) -> dict:
    """``{"cache_off": True}`` where the checkpointed step ran with the model's KV cache off
    (``archscan.memory.train.caches_in_forward``), else {}."""
    return {"cache_off": True} if step.get("cache_off") else {}


def checkpoint_code(paths: Sequence[str], cache_off: bool = False) -> str:
    """The Python that applies a plan to ``model``, as archscan analysed it: two lines, and a third
    that turns off a cache the model makes in forward (``cache_off``: each recompute would fill it
    again, as transformers' own gradient checkpointing knows)."""
    listed = ", ".join(repr(p) for p in paths)
    return ("import functools, torch.utils.checkpoint as cp\n"
            + ("model.config.use_cache = False  # a recompute would fill the KV cache again\n" if cache_off else "")
            + f"for path in [{listed}]: m = model.get_submodule(path); "
            "m.forward = functools.partial(cp.checkpoint, m.forward, use_reentrant=False)")


# --- what-ifs --------------------------------------------------------------------------------------

def what_ifs(step: dict, options: TrainOptions, dtype: torch.dtype | None, specs: Sequence[InputSpec],
             run: Callable[[TrainOptions, torch.dtype | None, Sequence[InputSpec]], dict], model: nn.Module,
             rows: Sequence[dict] = ()) -> list[dict]:
    """The step re-analysed with one change each: ``{"change", "peak_bytes", "peak_delta",
    "flops_delta", "apply"}`` (``error`` instead when the change does not run), with the changed
    step's ``unmodelled_scratch`` where it ran kernels whose scratch is not modelled."""
    base_peak = step["memory"]["peak_bytes"]
    base_flops = sum(p["flops"] for p in step["phases"].values())
    changes: list[tuple[str, TrainOptions, torch.dtype | None, Sequence[InputSpec], str]] = []
    if options.amp is None:
        changes.append(("bf16 autocast", replace(options, amp="bf16"), dtype, specs, "--amp bf16"))
    if dtype in (None, torch.float32):
        changes.append(("bf16 parameters", options, torch.bfloat16, specs, "--dtype bf16"))
    for impl in ("for-loop", "foreach", "fused"):
        if impl != (options.impl or "foreach"):
            changes.append((f"{impl} optimizer", replace(options, impl=impl), dtype, specs,
                            f"--optimizer {options.optimizer}:{impl}"))
    if options.set_to_none:
        changes.append(("zero_grad(set_to_none=False)", replace(options, set_to_none=False), dtype, specs,
                        "optimizer.zero_grad(set_to_none=False)"))
    prefix = _half_prefix(model, rows, options.freeze)
    if prefix:
        flags = " ".join(f"--freeze {p}" for p in prefix)
        changes.append((f"freeze {prefix[0]} … {prefix[-1]} ({len(prefix)} modules, half the parameters)" if len(prefix) > 1
                        else f"freeze {prefix[0]}", replace(options, freeze=options.freeze + tuple(prefix)), dtype, specs, flags))
    batch = specs[0].shape[0] if specs and specs[0].shape else 1
    if batch >= 2 and batch % 2 == 0:
        changes.append((f"gradient accumulation: 2 steps of batch {batch // 2}", replace(options, set_to_none=False),
                        dtype, batched(specs, batch // 2), f"--input batch {batch // 2}, 2 accumulation steps"))
    if not options.inplace and any(getattr(m, "inplace", None) is False for m in model.modules()):
        changes.append(("activations in place", replace(options, inplace=True), dtype, specs,
                        "[setattr(m, 'inplace', True) for m in model.modules() if getattr(m, 'inplace', None) is False]"))
    out = []
    for change, opts, dt, sp, apply in changes:
        try:
            got = run(opts, dt, sp)
        except ArchscanError as exc:
            out.append({"change": change, "error": str(exc), "apply": apply})
            continue
        peak = got["memory"]["peak_bytes"]
        flops = sum(p["flops"] for p in got["phases"].values())
        steps = batch // sp[0].shape[0] if sp and sp[0].shape else 1  # micro-steps of a smaller batch: each a
        optimizer = got["phases"]["optimizer"]["flops"]             # forward and backward, one optimizer step
        flops = steps * (flops - optimizer) + optimizer
        out.append({"change": change, "peak_bytes": peak, "peak_delta": peak - base_peak,
                    "flops_delta": flops - base_flops, "apply": apply,
                    **({"unmodelled_scratch": got["memory"]["unmodelled_scratch"]}
                       if got["memory"].get("unmodelled_scratch") else {})})
    return out


def _half_prefix(model: nn.Module, rows: Sequence[dict], frozen: Sequence[str]) -> list[str]:
    """The module paths, in forward's definition order, from the first until half the trainable
    parameters: the blocks of the repeated runs, and the other modules beside them."""
    block_paths = {r["module"] for r in rows if r["kind"] == "block"}

    def units(path: str, module: nn.Module) -> list[str]:
        if path in block_paths or not any(b.startswith(path + ".") or not path for b in block_paths):
            return [path]
        return [u for name, child in module.named_children() for u in units(f"{path}.{name}" if path else name, child)]

    counts = {u: sum(p.numel() for p in model.get_submodule(u).parameters() if p.requires_grad) for u in units("", model)}
    counts = {u: n for u, n in counts.items() if n and not any(u == f or u.startswith(f + ".") for f in frozen)}
    total, taken, out = sum(counts.values()), 0, []
    for unit, n in counts.items():
        if taken + n > total / 2 and out:
            break
        out.append(unit)
        taken += n
    return out if len(out) < len(counts) else []


__all__ = ["Budget", "parse_budget", "on_execution", "counted_bytes", "batched", "check_batchable", "check_weights_fit", "largest_batch", "blocks",
           "candidates", "checkpoint_plan", "checkpoint_code", "no_plan", "what_ifs"]

