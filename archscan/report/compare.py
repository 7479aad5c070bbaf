"""The comparison as a terminal table: a row per model, ratios against the baseline."""

from __future__ import annotations

from tabulate import tabulate

from ..compare import GUIDELINES, TIME_BASIS, time_columns
from .text import fmt_bytes, fmt_count, label_lines


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ratio(r: dict, key: str) -> str:
    value = r.get("ratios", {}).get(key)
    return "-" if value is None else f"{value:.2f}x"


def compare_text(comparison: dict, width: int = 100) -> str:
    """The table, then each failed model's error and each model's top recommendation."""
    rows = comparison["rows"]
    predicted, timed, time_key = time_columns(rows)
    memory = any("peak_bytes" in r for r in rows)
    headers = ["model", "params", "FLOPs", "MAC", "FLOPs/B"] + (["peak mem"] if memory else [])
    headers += ["pred ms"] if predicted else []
    headers += ["ms", "per s"] if timed else []
    headers += ["FLOPs/ms"] if timed or predicted else []
    gpus = list(dict.fromkeys(g for r in rows for g in r.get("tokens_per_s", {})))
    decoding = any("kv_bytes_per_token" in r for r in rows)
    headers += ["KV/token", "KV@32k", "step bytes"] + [f"tok/s {g.split(' (')[0]}" for g in gpus] if decoding else []
    headers += ["elem MAC", "frags", *GUIDELINES, "other", "x FLOPs", "x MAC"]
    headers += [f"x {'ms' if timed else 'pred'}"] if time_key else []
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["model"], "failed"] + [""] * (len(headers) - 2))
            continue
        cells = [r["model"], fmt_count(r["params"]), fmt_count(r["flops"]), fmt_bytes(r["mac_bytes"]),
                 f"{r['intensity']:.1f}"]
        cells += [fmt_bytes(r["peak_bytes"]) if "peak_bytes" in r else "-"] if memory else []
        cells += [_ms(r.get("predicted_ms"))] if predicted else []
        cells += [_ms(r.get("latency_ms")), _ms(r.get("throughput"))] if timed else []
        cells += [fmt_count(r.get("flops_per_ms"))] if timed or predicted else []
        if decoding:
            cells += ([fmt_bytes(r["kv_bytes_per_token"]), fmt_bytes(r["kv_bytes_32k"]), fmt_bytes(r["decode_bytes"])]
                      if "kv_bytes_per_token" in r else ["-"] * 3)
            cells += [f"{r['tokens_per_s'][g]:,.0f}" if r.get("tokens_per_s", {}).get(g) else "-" for g in gpus]
        other = sum(v for k, v in r["findings"].items() if k not in GUIDELINES)
        cells += [f"{100 * r['elementwise_mac_share']:.0f}%", str(r["fragments"]),
                  *(str(r["findings"].get(g, 0)) for g in GUIDELINES), str(other),
                  _ratio(r, "flops"), _ratio(r, "mac_bytes")]
        cells += [_ratio(r, time_key)] if time_key else []
        table.append(cells)
    lines = [tabulate(table, headers=headers, disable_numparse=True, colalign=("left",) + ("right",) * (len(headers) - 1))]
    notes = [("baseline", comparison.get("baseline") or "-"), ("time", TIME_BASIS[time_key])]
    if comparison.get("device"):
        notes.append(("device", comparison["device"] + (f", measured {comparison['measured_at']}"
                                                        if comparison.get("measured_at") else "")))
    notes += [(r["model"], f"{r['top_recommendation']['kind']}: {r['top_recommendation']['reason']}")
              for r in rows if r.get("top_recommendation")]
    notes += [(r["model"], f"failed: {r['error']}") for r in rows if "error" in r]
    return "\n".join(lines + [""] + label_lines(notes, width))
