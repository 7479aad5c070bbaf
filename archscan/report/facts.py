"""What the HTML and Markdown reports (and their plots) read from a report's JSON dict, computed once here."""

from __future__ import annotations


def predicted_by_module(report: dict) -> dict[str, float]:
    """Predicted ms of every module path (and ``""``, the model): the sum over the nodes inside it."""
    out: dict[str, float] = {}
    for n in report.get("nodes", []):
        if n.get("predicted_ms"):
            parts = n["module"].split(".") if n.get("module") else []
            for k in range(len(parts) + 1):
                key = ".".join(parts[:k])
                out[key] = out.get(key, 0.0) + n["predicted_ms"]
    return out


def slowest_nodes(report: dict, limit: int) -> tuple[bool, str, list[dict]]:
    """(measured?, the time key, the ``limit`` slowest nodes): measured times where the nodes were
    timed, else the roofline's predictions."""
    timed = any(n.get("latency_ms") for n in report["nodes"])
    key = "latency_ms" if timed else "predicted_ms"
    return timed, key, sorted((n for n in report["nodes"] if n.get(key)), key=lambda n: -n[key])[:limit]
