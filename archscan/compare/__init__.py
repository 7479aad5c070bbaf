"""Several models side by side: a row each (schema ``archscan.compare/1``).

Every row is a ``Report`` summarised: params, FLOPs (multiply-adds), MAC, intensity, predicted
latency (with a device profile), measured latency and throughput (with ``measure``), FLOPs per
ms, the element-wise share of the bytes and the fragments of the building blocks (G3, G4), the
findings per rule and the top recommendation, with ratios against a baseline row. Models of equal
FLOPs that differ in speed show why in the same row: MAC, fragments, element-wise share.

Targets may be patterns over the zoo (``zoo:shufflenet_v2_*``); ``MODEL@INPUTS`` gives a model
inputs of its own (``my.py:Net@1,3,32,32``; several inputs of one model joined by ``;``).
Static analysis of a sweep runs in this process, one model after another; measured runs are one
model at a time on the device. A model that fails is a row with its error; the others still run.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import ArchscanError

SCHEMA = "archscan.compare/1"
GUIDELINES = ("G1", "G2", "G3", "G4")
# columns --sort takes, and whether larger is better (sorted first)
SORT_KEYS = {"model": False, "params": False, "flops": False, "mac_bytes": False, "intensity": True,
             "predicted_ms": False, "latency_ms": False, "throughput": True, "flops_per_ms": True,
             "elementwise_mac_share": False, "fragments": False, "nodes": False, "findings": False, "batch": False,
             "peak_bytes": False}
RATIO_KEYS = ("params", "flops", "mac_bytes", "predicted_ms", "latency_ms", "throughput", "peak_bytes")


@dataclass(frozen=True)
class Job:
    """One row to make: a target and its inputs (and the batch size it sweeps, if any)."""

    target: str
    inputs: tuple[str, ...]       # --input specs; empty: the zoo model's default
    batch: int | None = None
    error: str | None = None      # the target or its own inputs are wrong: a failed row, found before any work

    @property
    def label(self) -> str:
        return self.target if self.batch is None else f"{self.target} (batch {self.batch})"


@dataclass
class Comparison:
    """The rows (``to_json``) and the reports behind the rows that ran."""

    rows: list[dict]
    reports: list[dict] = field(default_factory=list)
    baseline: str | None = None
    sort: str | None = None
    device: str | None = None
    measured_at: str | None = None   # when the first model was timed (UTC, ISO 8601)

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if "error" in r]

    def to_json(self) -> dict:
        out = {"schema": SCHEMA, "baseline": self.baseline, "sort": self.sort, "device": self.device}
        if self.measured_at:
            out["measured_at"] = self.measured_at
        return {**out, "rows": self.rows}


def expand(targets: Sequence[str]) -> list[str]:
    """Zoo patterns (``zoo:shufflenet_v2_*``) become the zoo names they match, sorted; others stay."""
    from ..zoo._catalog import catalog

    out: list[str] = []
    for target in targets:
        model, at, inputs = target.partition("@")
        if model.startswith("zoo:") and any(c in model for c in "*?["):
            names = sorted(n for n in catalog() if fnmatch.fnmatchcase(n, model[4:]))
            if not names:
                raise ArchscanError(f"no zoo model matches {model!r}", hint="run `archscan zoo` to list the zoo")
            out += [f"zoo:{n}{at}{inputs}" for n in names]
        else:
            out.append(target)
    return out


def jobs(targets: Sequence[str], input_sets: Sequence[str] = (), batches: Sequence[int] = ()) -> list[Job]:
    """A job per model × input set × batch size. An input set is one ``--input``; several inputs of
    one model are joined by ``;`` (``'1,128:int64;attention_mask=1,128:int64'``). ``MODEL@SET``
    overrides the sets for that model. A batch size replaces the first dimension of every input.
    A wrong ``--input`` is an error; a wrong model (or its own inputs) is a job that fails."""
    from ..load.specs import check_arguments, split_input_spec

    for text in input_sets:
        for spec in text.split(";"):
            if spec.strip():
                split_input_spec(spec)
    out = []
    for target in expand(targets):
        model, _, own = target.partition("@")
        sets = [own] if own else list(input_sets) or [""]
        for text in sets:
            specs = tuple(s.strip() for s in text.split(";") if s.strip())
            try:
                check_arguments(model, list(specs), None)
                error = None
            except ArchscanError as exc:
                error = str(exc)
            out += [Job(model, specs, b, error) for b in batches] if batches else [Job(model, specs, None, error)]
    if not out:
        raise ArchscanError("nothing to compare", hint="name two or more models: archscan compare zoo:a zoo:b")
    return out


def with_batch(specs: Sequence[str], batch: int) -> list[str]:
    """The specs with their first dimension set to ``batch``."""
    from ..load.specs import spec_text, split_input_spec, split_values

    out = []
    for text in specs:
        shape, dtype, name = split_input_spec(text)
        out.append(spec_text((batch, *shape[1:]), dtype, name, split_values(text.strip())[1]))
    return out


def row(report, job: Job) -> dict:
    """The comparison row of one report."""
    from ..graph import elementwise_mac_bytes

    t = report.totals
    latency = report.latency or {}
    out = {"model": job.label, "target": job.target, "inputs": list(report.inputs), "batch": report.inputs[0]["shape"][0]
           if report.inputs and report.inputs[0].get("shape") else None,
           "params": t.params, "flops": t.flops, "mac_bytes": t.mac_bytes, "intensity": t.intensity,
           "nodes": len(report.nodes),
           "elementwise_mac_share": sum(elementwise_mac_bytes(n) for n in report.nodes) / t.mac_bytes if t.mac_bytes else 0.0,
           "fragments": sum(b["fragments"] for b in report.blocks if b["kind"] == "module"),
           "findings": _rule_counts(report)}
    if report.memory:
        out["peak_bytes"] = report.memory["peak_bytes"]  # the inference forward's peak (archscan.memory)
    if report.kv_cache:  # --decode: the cache and one decode step (archscan.llm.decode)
        decode, kv = report.phases["decode"], report.kv_cache
        at_32k = (kv.get("fixed_bytes_per_sequence", 0) + kv["bytes_per_token"] * 32768) * kv["batch"]
        out.update(kv_bytes_per_token=kv["bytes_per_token"], kv_bytes_32k=at_32k,
                   decode_bytes=decode["mac_bytes"], decode_flops=decode["flops"],
                   tokens_per_s={name: on["tokens_per_s"] for name, on in decode.get("on", {}).items()}
                   or ({decode["profile"]: decode["tokens_per_s"]} if decode.get("profile") else {}))
    if report.training_step:
        out["train_peak_bytes"] = report.training_step["memory"]["peak_bytes"]
    if latency.get("predicted_ms"):
        out["predicted_ms"] = latency["predicted_ms"]
    if latency.get("end_to_end_ms"):
        out["latency_ms"] = latency["end_to_end_ms"]
        if out["batch"]:
            out["throughput"] = out["batch"] / (latency["end_to_end_ms"] / 1e3)
    ms = out.get("latency_ms") or out.get("predicted_ms")
    if ms:
        out["flops_per_ms"] = t.flops / ms
    if report.recommendations:
        top = report.recommendations[0]
        out["top_recommendation"] = {"kind": top.kind, "reason": top.reason,
                                     "estimated_saving": dict(top.estimated_saving), "basis": top.basis}
    return out


# what a comparison's times are, by the key time_columns picks
TIME_BASIS = {"latency_ms": "measured latency", "predicted_ms": "predicted latency (calibrated roofline)",
              None: "no latency: run `archscan calibrate` for predictions, or add --measure"}


def time_columns(rows: list[dict]) -> tuple[bool, bool, str | None]:
    """Which time columns a table of ``rows`` has: (predicted, measured, the key its time ratio uses)."""
    predicted = any("predicted_ms" in r for r in rows)
    timed = any("latency_ms" in r for r in rows)
    return predicted, timed, "latency_ms" if timed else "predicted_ms" if predicted else None


def _rule_counts(report) -> dict[str, int]:
    counts = {rule: 0 for rule in GUIDELINES}
    for f in report.findings:
        counts[f.rule] = counts.get(f.rule, 0) + 1
    return counts


def add_ratios(rows: list[dict], baseline: str | None) -> str | None:
    """Each ok row's ``ratios`` against the baseline row (the first ok row unless named)."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return None
    if baseline is None:
        base = ok[0]
    else:
        matches = [r for r in ok if baseline in (r["model"], r["target"], r["target"].removeprefix("zoo:"))]
        if not matches:
            raise ArchscanError(f"--baseline {baseline!r} is not one of the compared models",
                                hint=f"use one of: {', '.join(r['model'] for r in ok)}")
        base = matches[0]
    for r in ok:
        r["ratios"] = {k: r[k] / base[k] for k in RATIO_KEYS if r.get(k) and base.get(k)}
    return base["model"]


def sort_rows(rows: list[dict], key: str | None) -> None:
    """In place: by ``key`` (best first for rates, smallest first otherwise), failed rows last."""
    if key is None:
        return
    if key not in SORT_KEYS:
        raise ArchscanError(f"unknown --sort {key!r}", hint=f"use one of: {', '.join(SORT_KEYS)}")

    def value(r: dict):
        v = sum(r["findings"].values()) if key == "findings" else r.get(key)
        return (v is None, v if not SORT_KEYS[key] or v is None or isinstance(v, str) else -v)

    rows.sort(key=lambda r: ("error" in r, value(r) if "error" not in r else (True, 0)))


def compare(targets: Sequence[str], input_sets: Sequence[str] = (), batches: Sequence[int] = (), *,
            analyse: Callable[..., Any], measure=None, profile=None, baseline: str | None = None,
            sort: str | None = None, progress: Callable[[str, str], None] | None = None,
            debug: bool = False, decode: int | None = None, decode_on: Sequence[Any] = (),
            allow_pickle: bool = False) -> Comparison:
    """Analyse every model (``jobs``) and summarise each in a row.

    Args:
        targets: model targets or zoo patterns, each optionally ``MODEL@INPUTS``.
        analyse: what makes each model's ``Report``, called as ``archscan.scan`` is:
            ``analyse(target, specs, name=..., measure=..., profile=...)``. The caller hands it in
            (``archscan.api.compare`` hands ``archscan.scan``), so this module stands below the
            orchestrator.
        input_sets: ``--input`` values, one per set (inputs of a set joined by ``;``).
        batches: batch sizes to sweep (each replaces the first dimension of every input).
        measure: ``MeasureOptions`` to time each model (one at a time).
        profile: a ``DeviceProfile`` (or False for none; None: the cached profile of the device).
        baseline: the row the ratios are against (default: the first).
        sort: a ``SORT_KEYS`` column.
        progress: called with (model, phase) as the work goes.
        debug: raise a model's error instead of making it a row.
        decode, decode_on: one decode step after a cache of ``decode`` tokens (the inputs are the
            new tokens), predicted on ``profile`` and each of ``decode_on``: the rows gain KV bytes
            per token and at 32k tokens, the step's bytes and tokens/s per GPU.
        allow_pickle: a ``.pt2`` target may run code pickled inside it (``archscan.load.targets._load_program``).
    """
    from ..load.targets import resolve_target

    if sort is not None and sort not in SORT_KEYS:
        raise ArchscanError(f"unknown --sort {sort!r}", hint=f"use one of: {', '.join(SORT_KEYS)}")
    rows, reports = [], []
    for job in jobs(targets, input_sets, batches):
        if progress:
            progress(job.label, "measuring" if measure else "analysing")
        try:
            if job.error:
                raise ArchscanError(job.error)
            target = resolve_target(job.target, allow_pickle)
            specs = list(job.inputs) or list(target.default_inputs)
            if not specs:
                raise ArchscanError(f"{job.target} has no default input",
                                    hint=f"give it one: {job.target}@1,3,224,224 or --input 1,3,224,224")
            if job.batch is not None:
                specs = with_batch(specs, job.batch)
            extra = {"decode": decode, "decode_on": tuple(decode_on)} if decode is not None else {}
            report = analyse(target, specs, name=job.label, measure=measure, profile=profile, **extra)
        except (ArchscanError, MemoryError, RuntimeError) as exc:
            if debug:
                raise
            rows.append({"model": job.label, "target": job.target, "inputs": list(job.inputs),
                         "error": _error_text(exc)})
            continue
        rows.append(row(report, job))
        reports.append(report.to_json())
    base = add_ratios(rows, baseline)
    sort_rows(rows, sort)
    order = {r["model"]: i for i, r in enumerate(rows)}
    reports.sort(key=lambda rep: order.get(rep["model"], len(order)))
    device = next((_device(rep["latency"]) for rep in reports if rep.get("latency")), None)
    measured_at = next((rep["latency"]["measured_at"] for rep in reports if (rep.get("latency") or {}).get("measured_at")), None)
    return Comparison(rows, reports, base, sort, device, measured_at)


def _device(latency: dict) -> str | None:
    """Where the times come from: 'Intel(R) Xeon(R) Processor (cpu, 2 threads)' when measured,
    the profile's device name when predicted."""
    if latency.get("device_name"):
        threads = f", {latency['threads']} threads" if latency.get("threads") else ""
        return f"{latency['device_name']} ({latency['device']}{threads})"
    profile = latency.get("profile") or {}
    return f"{profile.get('name')} ({profile.get('device')})" if profile else None


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ArchscanError):
        return str(exc)
    from ..load.frames import short

    return short(exc)
