"""Markdown reports (GitHub-flavoured tables): for a pull request, a wiki page or a review.

Pure functions over the JSON dicts (``archscan.report/1``, ``archscan.compare/1``). Counts are the
JSON's exact integers (with thousands separators: ``2,278,604``), times are milliseconds to three
decimals, so every number can be checked against the JSON (``tests/test_reports.py`` does).
"""

from __future__ import annotations

from ..compare import GUIDELINES, time_columns
from .compare import columns
from .facts import QUANT_HEADERS, kept_layers, quant_rows, slowest_nodes
from .text import fmt_recommendation_saving, fmt_recommendation_says, fmt_saving, input_text


def report_markdown(report: dict, depth: int = 2) -> str:
    """One model: summary, modules to ``depth``, latency, findings, recommendations, blocks."""
    parts = [f"# archscan: `{report['model']}`", "", *_summary(report), ""]
    parts += ["## Modules", "", *_modules(report, depth), ""]
    parts += ["## Latency", "", *_latency(report), ""]
    if report.get("quant"):
        parts += ["## Quantization", "", *_quant(report["quant"]), ""]
    parts += ["## Findings", "", *_findings(report), ""]
    parts += ["## Recommendations", "", *_recommendations(report), ""]
    parts += ["## Blocks (G3)", "", *_blocks(report)]
    return "\n".join(parts).rstrip() + "\n"


def _quant(quant: dict) -> list[str]:
    """--quant and --kv: the scheme and layout, before and after, the layers kept and why."""
    lines = []
    if quant.get("scheme"):
        lines += [f"`{quant['scheme']}` as {_cell(quant['device'])} stores it ({_cell(quant['layout'])}): "
                  f"{quant['quantized']} linear layers quantized, {quant['kept']} kept"
                  + (f", {quant['bits_per_weight']:.2f} bits per weight" if quant.get("bits_per_weight") else "") + ".", ""]
    rows = [[_cell(r[0])] + [_int(v) for v in r[1:4]] + [_ms(v) for v in r[4:]] for r in quant_rows(quant)]
    if rows:
        lines += _table(QUANT_HEADERS, rows, right=range(1, 6)) + [""]
    for why, modules in kept_layers(quant):
        lines.append(f"- kept: {_cell(', '.join(modules[:5]))}{f' (+{len(modules) - 5})' if len(modules) > 5 else ''}: "
                     f"{_cell(why)}")
    if quant.get("kv"):
        kv = quant["kv"]
        lines.append(f"- KV cache `{kv['scheme']}`: {_int(kv['bytes_per_token'])} -> {_int(kv['bytes_per_token_after'])} "
                     f"bytes per token ({_cell(kv['convention'])})")
    return lines


def compare_markdown(comparison: dict, reports: list[dict]) -> str:
    """A comparison: the table (ratios against the baseline), failures, then each model's summary."""
    rows = comparison["rows"]
    parts = [f"# archscan compare: {len(rows)} models", ""]
    parts += [f"- baseline: `{comparison.get('baseline') or '-'}`"]
    if comparison.get("device"):
        parts += [f"- device: {_cell(comparison['device'])}"]
    if comparison.get("measured_at"):
        parts += [f"- measured: {comparison['measured_at']}"]
    parts += ["", *_compare_table(comparison), ""]
    tops = [r for r in rows if r.get("top_recommendation")]
    if tops:
        parts += ["Top recommendations:", ""] + [f"- `{r['model']}`: {_cell(r['top_recommendation']['reason'])}"
                                                 for r in tops] + [""]
    for r in rows:
        if "error" in r:
            parts += [f"- `{r['model']}` failed: {_cell(r['error'])}"]
    by_model = {rep["model"]: rep for rep in reports}
    for r in rows:
        rep = by_model.get(r["model"])
        if rep is not None:
            parts += ["", f"## `{r['model']}`", "", *_summary(rep)]
    return "\n".join(parts).rstrip() + "\n"


def _cell(text) -> str:
    """Text safe inside a table cell: no pipe, no line break."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _int(n) -> str:
    return "-" if n is None else f"{n:,}"


def _ms(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _table(headers: list[str], rows: list[list[str]], right: range = range(0)) -> list[str]:
    """A GFM table; the columns in ``right`` (numbers) are right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    return ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"] + [
        "| " + " | ".join(cells) + " |" for cells in rows]


def _summary(report: dict) -> list[str]:
    t = report["totals"]
    rows = [["input", _cell(", ".join(input_text(i, "x") for i in report["inputs"]))],
            ["capture", f"{report['capture']}, dtype {report['dtype']}"],
            ["params", f"{_int(t['params'])} ({_int(t['param_bytes'])} bytes)"
             + (f", {_int(t['unused_params'])} unused for these inputs" if t.get("unused_params") else "")],
            ["FLOPs (multiply-adds)", _int(t["flops"])],
            ["MAC (bytes moved)", f"{_int(t['mac_bytes'])} ({_int(t['read_bytes'])} read, {_int(t['write_bytes'])} "
                                  f"written, {_int(t['weight_bytes'])} weights)"],
            ["elem ops", _int(t["elem_ops"])],
            ["intensity (FLOPs/B)", f"{t['arithmetic_intensity']:.2f}"]]
    lat = report.get("latency") or {}
    if lat.get("end_to_end_ms") is not None:
        rows.append(["latency ms", f"{_ms(lat['end_to_end_ms'])} end to end on {_cell(lat['device_name'])} "
                                   f"({lat['device']}), median of {lat['end_to_end']['repeats']}"
                     + (f", measured {lat['measured_at']}" if lat.get("measured_at") else "")])
        if lat.get("throughput_per_s"):
            rows.append(["throughput /s", f"{lat['throughput_per_s']:.1f}"])
    if lat.get("predicted_ms") is not None:
        prof = lat["profile"]
        rows.append(["predicted ms", f"{_ms(lat['predicted_ms'])} (roofline of {_cell(prof['name'])}, calibrated "
                                     f"{prof['created'][:10]})"])
    counts: dict[str, int] = {}
    for f in report["findings"]:
        counts[f["rule"]] = counts.get(f["rule"], 0) + 1
    rows.append(["findings", ", ".join(f"{rule} {n}" for rule, n in counts.items()) or "none"])
    if report["recommendations"]:
        top = report["recommendations"][0]
        rows.append(["first step", _cell(f"{top['kind']}: {top['reason']}")])
    rows += [["warning", _cell(w)] for w in report.get("warnings", [])]
    return _table(["", ""], rows)


def _modules(report: dict, depth: int) -> list[str]:
    timed = any(m.get("latency_ms") is not None for m in report["modules"])
    headers = ["module", "type", "params", "FLOPs", "MAC bytes"] + (["ms"] if timed else []) + ["out shape"]
    rows = []
    for m in report["modules"]:
        if m["depth"] > depth:
            continue
        name = ("&nbsp;&nbsp;" * m["depth"]) + f"`{m['path']}`" if m["path"] else f"**`{report['model']}`**"
        cells = [name, m["type"], _int(m["params"]), _int(m["flops"]), _int(m["mac_bytes"])]
        cells += [_ms(m.get("latency_ms"))] if timed else []
        shape = m.get("out_shape") or []
        cells += [_cell(", ".join("x".join(map(str, s)) for s in shape) if shape and isinstance(shape[0], list)
                        else "x".join(map(str, shape)) or "-")]
        rows.append(cells)
    return _table(headers, rows, range(2, len(headers) - 1))


def _latency(report: dict, limit: int = 10) -> list[str]:
    lat = report.get("latency") or {}
    if not lat:
        return ["No latency: add `--measure`, or run `archscan calibrate` once for predictions."]
    lines = []
    if lat.get("per_layer_sum_ms") is not None:
        lines += [f"Per layer {_ms(lat['per_layer_sum_ms'])} ms over {lat['timed_nodes']} nodes; gap "
                  f"{lat['gap_ms']:+.3f} ms: {lat['gap_explained']}.", ""]
    timed, key, nodes = slowest_nodes(report, limit)
    headers = ["node", "module", "category", "ms" if timed else "predicted ms"] + (["predicted ms"] if timed else [])
    rows = [[f"`{n['name']}`", f"`{n.get('module') or ''}`", n["category"], _ms(n[key])]
            + ([_ms(n.get("predicted_ms"))] if timed else []) for n in nodes]
    return lines + [f"The {len(nodes)} slowest nodes:", ""] + _table(headers, rows, range(3, len(headers)))


def _findings(report: dict) -> list[str]:
    if not report["findings"]:
        return ["None."]
    rows = [[f["severity"], f["rule"], _cell(f"`{f.get('module') or '(model)'}`"), _cell(f["message"]),
             _cell(fmt_saving(f.get("saving") or {})), _cell(f.get("fix") or "")] for f in report["findings"]]
    return _table(["severity", "rule", "where", "finding", "saving", "fix"], rows)


def _recommendations(report: dict) -> list[str]:
    if not report["recommendations"]:
        return ["None."]
    lines = []
    for i, r in enumerate(report["recommendations"], 1):
        says = fmt_recommendation_says(r.get("estimated_saving") or {}, r["basis"], r.get("verified"))
        lines += [f"{i}. **{r['kind']}**: {says}. {r['reason']}", f"   `{r['apply']}`"]
    return lines


def _blocks(report: dict) -> list[str]:
    blocks = report.get("blocks") or []
    if not blocks:
        return ["None."]
    rows = [[f"`{b['name']}`", b["type"], b["kind"], str(b["nodes"]), str(b["fragments"]), str(b["series"]),
             str(b["parallel"]), _int(b["flops"]), _int(b["mac_bytes"]), _int(b["elementwise_mac_bytes"])] for b in blocks]
    return _table(["block", "type", "kind", "nodes", "fragments", "series", "parallel", "FLOPs", "MAC bytes",
                   "element-wise bytes"], rows, range(3, 10))


def _compare_table(comparison: dict) -> list[str]:
    """The terminal's columns (``report.compare.columns``), every figure written out, then each
    model's top recommendation."""
    cols = columns(comparison)
    headers = ["model", *(c.long for c in cols), "top recommendation"]
    out = []
    for r in comparison["rows"]:
        if "error" in r:
            out.append([f"`{r['model']}`", "failed"] + [""] * (len(headers) - 2))
            continue
        top = r.get("top_recommendation")
        saving = fmt_recommendation_saving(top.get("estimated_saving") or {}) if top else ""
        out.append([f"`{r['model']}`", *(_written(c.kind, c.get(r)) for c in cols),
                    (top["kind"] + (f": saves {saving}" if saving else "")) if top else "-"])
    return _table(headers, out, range(1, len(headers) - 1))


def _written(kind: str, value) -> str:
    if value is None:
        return "-"
    return {"count": lambda v: f"{v:,.0f}", "bytes": _int, "int": _int, "number": lambda v: f"{v:.2f}", "ms": _ms,
            "ratio": lambda v: f"{v:.2f}", "share": lambda v: f"{100 * v:.1f}%", "rate": lambda v: f"{v:,.0f}"}[kind](value)
