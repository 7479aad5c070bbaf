"""The comparison as a terminal table: a row per model, ratios against the baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tabulate import tabulate

from ..compare import GUIDELINES, TIME_BASIS, time_columns
from .text import fmt_bytes, fmt_count, label_lines


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


@dataclass(frozen=True)
class Column:
    """One column of the comparison, as every renderer shows it (the terminal, Markdown, HTML):
    its short and long headers, what kind of number it holds (how each renderer writes it) and
    how a row gives it."""

    short: str
    long: str
    kind: str  # "count", "bytes", "number", "ms", "ratio", "share", "int", "rate"
    get: Callable[[dict], Any]


def columns(comparison: dict) -> list[Column]:
    """The comparison's columns after the model's name: every figure the rows carry (peak memory,
    time, KV bytes and tokens/s on each GPU with --decode), so no renderer leaves one out."""
    rows = [r for r in comparison["rows"] if "error" not in r]
    predicted, timed, time_key = time_columns(rows)
    cols = [Column("params", "params", "count", lambda r: r["params"]),
            Column("FLOPs", "FLOPs", "count", lambda r: r["flops"]),
            Column("MAC", "MAC bytes", "bytes", lambda r: r["mac_bytes"]),
            Column("FLOPs/B", "FLOPs/B", "number", lambda r: r["intensity"])]
    if any("peak_bytes" in r for r in rows):
        cols.append(Column("peak mem", "peak memory", "bytes", lambda r: r.get("peak_bytes")))
    if predicted:
        cols.append(Column("pred ms", "predicted ms", "ms", lambda r: r.get("predicted_ms")))
    if timed:
        cols += [Column("ms", "ms", "ms", lambda r: r.get("latency_ms")),
                 Column("per s", "per s", "rate", lambda r: r.get("throughput"))]
    if timed or predicted:
        cols.append(Column("FLOPs/ms", "FLOPs/ms", "count", lambda r: r.get("flops_per_ms")))
    if any("kv_bytes_per_token" in r for r in rows):
        cols += [Column("KV/token", "KV bytes per token", "bytes", lambda r: r.get("kv_bytes_per_token")),
                 Column("KV@32k", "KV bytes at 32k tokens", "bytes", lambda r: r.get("kv_bytes_32k")),
                 Column("step bytes", "decode step bytes", "bytes", lambda r: r.get("decode_bytes"))]
        for gpu in dict.fromkeys(g for r in rows for g in r.get("tokens_per_s", {})):
            name = gpu.split(" (")[0]
            cols.append(Column(f"tok/s {name}", f"tokens/s on {name}", "rate",
                               lambda r, g=gpu: r.get("tokens_per_s", {}).get(g)))
    cols += [Column("elem MAC", "element-wise MAC", "share", lambda r: r["elementwise_mac_share"]),
             Column("frags", "fragments", "int", lambda r: r["fragments"]),
             *(Column(g, g, "int", lambda r, g=g: r["findings"].get(g, 0)) for g in GUIDELINES),
             Column("other", "other findings", "int",
                    lambda r: sum(v for k, v in r["findings"].items() if k not in GUIDELINES)),
             Column("x FLOPs", "x FLOPs", "ratio", lambda r: r.get("ratios", {}).get("flops")),
             Column("x MAC", "x MAC", "ratio", lambda r: r.get("ratios", {}).get("mac_bytes"))]
    if time_key:
        cols.append(Column(f"x {'ms' if timed else 'pred'}", f"x {'ms' if timed else 'predicted'}", "ratio",
                           lambda r: r.get("ratios", {}).get(time_key)))
    return cols


def _terminal(kind: str, value) -> str:
    if value is None:
        return "-"
    return {"count": fmt_count, "bytes": fmt_bytes, "number": lambda v: f"{v:.1f}", "ms": _ms,
            "ratio": lambda v: f"{v:.2f}x", "share": lambda v: f"{100 * v:.0f}%", "int": str,
            "rate": lambda v: f"{v:,.0f}"}[kind](value)


def compare_text(comparison: dict, width: int = 100) -> str:
    """The table, then each failed model's error and each model's top recommendation."""
    rows = comparison["rows"]
    time_key = time_columns(rows)[2]
    cols = columns(comparison)
    headers = ["model", *(c.short for c in cols)]
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["model"], "failed"] + [""] * (len(headers) - 2))
            continue
        table.append([r["model"], *(_terminal(c.kind, c.get(r)) for c in cols)])
    lines = [tabulate(table, headers=headers, disable_numparse=True, colalign=("left",) + ("right",) * (len(headers) - 1))]
    notes = [("baseline", comparison.get("baseline") or "-"), ("time", TIME_BASIS[time_key])]
    if comparison.get("device"):
        notes.append(("device", comparison["device"] + (f", measured {comparison['measured_at']}"
                                                        if comparison.get("measured_at") else "")))
    notes += [(r["model"], f"{r['top_recommendation']['kind']}: {r['top_recommendation']['reason']}")
              for r in rows if r.get("top_recommendation")]
    notes += [(r["model"], f"failed: {r['error']}") for r in rows if "error" in r]
    return "\n".join(lines + [""] + label_lines(notes, width))
