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


QUANT_HEADERS = ["", "parameters (bytes)", "weights read (bytes)", "bytes moved", "predicted ms", "served ms"]


def quant_rows(quant: dict) -> list[list]:
    """``--quant``/``--kv``: the forward's and (with ``--decode``) the decode step's figures before and
    after, as raw values (None where not predicted): [label, parameter bytes, weight bytes read, bytes
    moved, predicted ms, served ms]."""
    rows = []
    for label, side in (("forward", quant.get("before")), ("forward, quantized", quant.get("after"))):
        if side:
            rows.append([label, side["param_bytes"], side["weight_bytes"], side["mac_bytes"], side.get("predicted_ms"),
                         side.get("served_ms")])
    step = quant.get("decode")
    if step:
        for label, side in (("decode step", step["before"]), ("decode step, quantized", step["after"])):
            rows.append([label, None, side["weight_bytes"], side["mac_bytes"], side.get("predicted_ms"),
                         side.get("served_ms")])
    return rows


def kept_layers(quant: dict) -> list[tuple[str, list[str]]]:
    """(reason, module paths) of the layers ``--quant`` keeps in high precision, by reason."""
    out: dict[str, list[str]] = {}
    for layer in quant.get("layers", []):
        if "kept" in layer:
            out.setdefault(layer["kept"], []).append(layer["module"])
    return list(out.items())
