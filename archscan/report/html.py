"""Self-contained HTML reports: one file, inline CSS and inline SVG plots, no script, no request
to anywhere (it opens from disk, offline). Pure functions over the JSON dicts (``archscan.report/1``,
``archscan.compare/1``): the same dict gives the same bytes.

A single model's page has the sections ``summary``, ``modules``, ``roofline``, ``latency``,
``findings``, ``recommendations`` and ``blocks``; a comparison's has ``summary``, ``table``,
``scatter`` and ``model-1``... (each model's summary). Numbers are shown with SI or binary
prefixes; hovering a cell shows the exact value the JSON holds.
"""

from __future__ import annotations

from html import escape

from .. import __version__
from ..compare import GUIDELINES, TIME_BASIS, time_columns
from . import plots
from .compare import columns
from .facts import QUANT_HEADERS, kept_layers, predicted_by_module, quant_rows, slowest_nodes
from .text import fmt_bytes, fmt_count, fmt_recommendation_saving, fmt_recommendation_says, fmt_saving, input_text

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1b1f24;background:#fff}
header{background:#24292f;color:#fff;padding:14px 28px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#c9d1d9;font-size:13px}
nav{display:flex;flex-wrap:wrap;gap:2px 16px;padding:8px 28px;border-bottom:1px solid #d0d7de;background:#f6f8fa}
nav.sticky{position:sticky;top:0;z-index:1}
nav a{color:#0969da;text-decoration:none;white-space:nowrap}
main{padding:0 28px 40px;max-width:1200px}
section{margin-top:26px}h2{font-size:17px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{padding:3px 9px;border-bottom:1px solid #eaeef2;text-align:left;vertical-align:top}
th{background:#f6f8fa}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.model td{font-weight:600}td.indent1{padding-left:22px}td.indent2{padding-left:40px}
dl{display:grid;grid-template-columns:max-content auto;gap:3px 16px;margin:8px 0}dt{color:#57606a}dd{margin:0}
code{background:#f6f8fa;padding:1px 4px;border-radius:3px;font-size:12px;word-break:break-all}
.error{color:#cf222e}.warning{color:#9a6700}.info{color:#57606a}.note{color:#57606a;font-size:13px}
div.wide{overflow-x:auto}td.prose{min-width:260px}
svg.plot{width:100%;max-width:900px;height:auto;display:block}
ol li{margin-bottom:8px}
"""


def report_html(report: dict) -> str:
    """The page of one model's report."""
    sections = [
        ("summary", "Summary", _summary(report)),
        ("modules", "Modules", _modules(report)),
        ("roofline", "Roofline", _plot(plots.roofline_svg(report), _roofline_note(report))),
        ("latency", "Latency", _latency(report)),
        ("memory", "Memory", _memory(report)),
        *([("quant", "Quantization", _quant(report["quant"]))] if report.get("quant") else []),
        ("findings", f"Findings ({len(report['findings'])})", _findings(report)),
        ("recommendations", f"Recommendations ({len(report['recommendations'])})", _recommendations(report)),
        ("blocks", "Blocks (G3)", _blocks(report)),
    ]
    return _page(f"archscan: {report['model']}", _subtitle(report), sections)


def _quant(quant: dict) -> str:
    """--quant and --kv: the scheme and layout, before and after, the layers kept and why."""
    parts = []
    if quant.get("scheme"):
        parts.append(f"<p>{escape(quant['scheme'])} as {escape(quant['device'])} stores it ({escape(quant['layout'])}): "
                     f"{quant['quantized']} linear layers quantized, {quant['kept']} kept"
                     + (f", {quant['bits_per_weight']:.2f} bits per weight" if quant.get("bits_per_weight") else "")
                     + ".</p>")
    rows = [[escape(r[0])] + [_num(fmt_bytes(v), v) if v is not None else _num("-") for v in r[1:4]]
            + [_num(_ms(v)) for v in r[4:]] for r in quant_rows(quant)]
    if rows:
        parts.append(_table(QUANT_HEADERS, rows, numeric={1, 2, 3, 4, 5}))
    kept = kept_layers(quant)
    if kept:
        parts.append("<ul>" + "".join(f"<li>kept: {escape(', '.join(m[:5]))}{f' (+{len(m) - 5})' if len(m) > 5 else ''}: "
                                      f"{escape(why)}</li>" for why, m in kept) + "</ul>")
    if quant.get("kv"):
        kv = quant["kv"]
        parts.append(f"<p>KV cache {escape(kv['scheme'])}: {fmt_bytes(kv['bytes_per_token'])} to "
                     f"{fmt_bytes(kv['bytes_per_token_after'])} per token ({escape(kv['convention'])}).</p>")
    return "\n".join(parts)


def _memory(report: dict) -> str:
    """The inference forward's live bytes and, with --train, the training step's."""
    parts = []
    spread = report.get("parallel") or {}
    for memory, title in ((report.get("memory"), "Inference forward"),
                          ((report.get("training") or {}).get("memory"), "Training step"),
                          (spread.get("memory"), f"Rank 0 of {spread.get('spec')}: its training step")):
        if not memory:
            continue
        where = memory["peak_at"]
        place = escape(where.get("module") or where.get("node") or "(model)")
        source = f" at {escape(where['source'])}" if where.get("source") else ""
        note = (f"{title}: peak {fmt_bytes(memory['peak_bytes'])} in the {escape(where['phase'])}, "
                f"{escape(where['op'])} of {place}{source}; at the peak "
                + ", ".join(f"{fmt_bytes(v)} {escape(k.replace('_', ' '))}" for k, v in memory["at_peak"].items() if v))
        parts.append(_plot(plots.memory_svg(memory, title), note))
    if spread.get("collectives"):
        from .parallel import collective_groups

        rows = [[escape(g["kind"]), escape(f"{g['mesh_dim']} ({g['group_size']})"), escape(g["phase"]), _num(f"{g['count']:,}"),
                 _num(fmt_bytes(g["wire_bytes"])), _num(_ms(g["ms"]))] for g in collective_groups(spread["collectives"])]
        parts.append(_table(["collective", "over", "phase", "calls", "sent and received per rank (ring)", "time"], rows,
                            numeric={3, 4, 5}))
    return "\n".join(parts) or "<p>No memory figure: the capture ran the model for real.</p>"


def compare_html(comparison: dict, reports: list[dict]) -> str:
    """The page of a comparison: the table, the FLOPs-vs-time scatter and each model's summary."""
    rows = comparison["rows"]
    by_model = {r["model"]: r for r in reports}
    sections = [("summary", "Summary", _compare_summary(comparison)),
                ("table", "Models side by side", _compare_table(comparison)),
                ("scatter", f"FLOPs against {_axis(comparison)}", _plot(plots.compare_svg(comparison),
                                                                          _scatter_note(comparison)))]
    for i, row in enumerate(rows, 1):
        report = by_model.get(row["model"])
        if report is None:
            body = f'<p class="error">failed: {escape(row.get("error", "no report"))}</p>'
        else:
            body = _summary(report) + _top_findings(report)
        sections.append((f"model-{i}", escape(row["model"]), body))
    models = ", ".join(r["model"] for r in rows[:4]) + (f" and {len(rows) - 4} more" if len(rows) > 4 else "")
    return _page(f"archscan compare: {models}", f"{len(rows)} models · archscan.compare/1", sections)


# --- page ----------------------------------------------------------------------------------------

def _page(title: str, subtitle: str, sections: list[tuple[str, str, str]]) -> str:
    links = "".join(f'<a href="#{sid}">{heading}</a>' for sid, heading, _ in sections)
    nav = f'<nav class="sticky">{links}</nav>' if len(sections) <= 9 else f"<nav>{links}</nav>"  # a long one would cover the page
    body = "\n".join(f'<section id="{sid}">\n<h2>{heading}</h2>\n{content}\n</section>' for sid, heading, content in sections)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            f"<header><h1>{escape(title)}</h1><p>{escape(subtitle)}</p></header>\n{nav}\n"
            f"<main>\n{body}\n</main>\n"
            f'<footer class="note" style="padding:0 28px 20px">archscan {escape(__version__)}</footer>\n'
            "</body>\n</html>\n")


def _subtitle(report: dict) -> str:
    inputs = ", ".join(input_text(i) for i in report["inputs"])
    parts = [f"input {inputs}", f"capture {report['capture']}", f"dtype {report['dtype']}", report["schema"]]
    lat = report.get("latency") or {}
    if lat.get("end_to_end_ms") is not None:
        parts.append(f"measured on {lat['device_name']} ({lat['device']}) {lat.get('measured_at', '')[:10]}".rstrip())
    elif lat.get("profile"):
        prof = lat["profile"]
        parts.append(f"predicted for {prof['name']} (calibrated {prof['created'][:10]})")
    return " · ".join(parts)


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset(), row_class=None) -> str:
    head = "".join(f'<th class="num">{h}</th>' if i in numeric else f"<th>{h}</th>" for i, h in enumerate(headers))
    body = []
    for k, cells in enumerate(rows):
        cls = f' class="{row_class[k]}"' if row_class and row_class[k] else ""
        body.append(f"<tr{cls}>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells) + "</tr>")
    return (f'<div class="wide"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n' + "\n".join(body)
            + "\n</tbody>\n</table></div>")


def _num(text: str, exact=None) -> str:
    """A right-aligned cell; ``exact`` (the JSON's value) shows on hover."""
    title = f' title="{escape(str(exact))}"' if exact is not None else ""
    return f'<td class="num"{title}>{escape(text)}</td>'


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _dl(items: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _plot(svg: str | None, note: str) -> str:
    return (svg or "") + f'\n<p class="note">{note}</p>'


# --- one model -----------------------------------------------------------------------------------

def _summary(report: dict) -> str:
    t = report["totals"]
    items = [
        ("model", f"<code>{escape(report['model'])}</code>"),
        ("input", escape(", ".join(input_text(i) for i in report["inputs"]))),
        ("capture", escape(f"{report['capture']}, dtype {report['dtype']}")),
        ("params", f"{fmt_count(t['params'])} ({t['params']:,}; {fmt_bytes(t['param_bytes'])})"
         + (f", {fmt_count(t['unused_params'])} unused for these inputs" if t.get("unused_params") else "")),
        ("FLOPs", f"{fmt_count(t['flops'])} multiply-adds ({t['flops']:,})"),
        ("MAC", f"{fmt_bytes(t['mac_bytes'])} moved ({t['mac_bytes']:,} bytes: {fmt_bytes(t['read_bytes'])} read, "
                f"{fmt_bytes(t['write_bytes'])} written, {fmt_bytes(t['weight_bytes'])} of it weights)"),
        ("elem ops", f"{fmt_count(t['elem_ops'])} (element-wise, norm, activation, pooling; not in FLOPs)"),
        ("intensity", f"{t['arithmetic_intensity']:.2f} multiply-adds per byte"),
    ]
    lat = report.get("latency") or {}
    if lat.get("end_to_end_ms") is not None:
        e2e = lat["end_to_end"]
        threads = f", {lat['threads']} threads" if lat.get("threads") else ""
        items.append(("latency", escape(
            f"{lat['end_to_end_ms']:.3f} ms end to end on {lat['device_name']} ({lat['device']}{threads}), median of "
            f"{e2e['repeats']}, spread {100 * e2e['spread']:.1f}%"
            + (f"; {lat['throughput_per_s']:.1f} items/s" if lat.get("throughput_per_s") else "")
            + (f"; measured {lat['measured_at']}" if lat.get("measured_at") else ""))))
    if lat.get("predicted_ms") is not None:
        prof = lat["profile"]
        err = lat.get("prediction_error")
        items.append(("predicted", escape(
            f"{lat['predicted_ms']:.3f} ms from the roofline of {prof['name']} (calibrated {prof['created'][:10]})"
            + (f"; {100 * err:+.0f}% against measured" if err is not None else ""))))
    counts: dict[str, int] = {}
    for f in report["findings"]:
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    items.append(("findings", escape(", ".join(f"{n} {s}" for s, n in counts.items()) or "none")))
    if report["recommendations"]:
        top = report["recommendations"][0]
        items.append(("first step", f"<b>{escape(top['kind'])}</b>: {escape(top['reason'])}"))
    for note in report.get("capture_notes", []):
        items.append(("note", escape(note)))
    if report.get("uncounted"):
        items.append(("uncounted", escape(", ".join(f"{op} ×{n}" for op, n in report["uncounted"].items())
                                          + " (no FLOP formula; bytes counted)")))
    for w in report.get("warnings", []):
        items.append(("warning", f'<span class="warning">{escape(w)}</span>'))
    return _dl(items)


def _modules(report: dict, depth: int = 2) -> str:
    """The module tree to ``depth`` with measured and predicted time per module."""
    predicted = predicted_by_module(report)
    total = report["totals"]["flops"] or 1
    timed = any(m.get("latency_ms") is not None for m in report["modules"])
    headers = ["module", "type", "params", "FLOPs", "share", "MAC", "FLOPs/B"]
    headers += ["ms"] if timed else []
    headers += ["predicted ms"] if predicted else []
    headers += ["out shape"]
    rows, classes = [], []
    shown = [m for m in report["modules"] if m["depth"] <= depth]
    for m in shown:
        name = m["path"] or report["model"]
        cells = [f'<td class="indent{m["depth"]}">{escape(name)}</td>' if m["depth"] else escape(name),
                 escape(m["type"]), _num(fmt_count(m["params"]), m["params"]), _num(fmt_count(m["flops"]), m["flops"]),
                 _num(f"{100 * m['flops'] / total:.1f}%"), _num(fmt_bytes(m["mac_bytes"]), m["mac_bytes"]),
                 _num(f"{m['flops'] / m['mac_bytes']:.1f}" if m["mac_bytes"] else "-")]
        cells += [_num(_ms(m.get("latency_ms")), m.get("latency_ms"))] if timed else []
        cells += [_num(_ms(predicted.get(m["path"])), predicted.get(m["path"]))] if predicted else []
        cells += [escape(_shape(m.get("out_shape")))]
        rows.append(cells)
        classes.append("model" if m["depth"] == 0 else "")
    deeper = len(report["modules"]) - len(shown)
    note = (f'<p class="note">{deeper} deeper modules not shown: <code>archscan MODEL --depth N</code> or '
            "<code>--json</code> lists them all.</p>" if deeper else "")
    numeric = set(range(2, len(headers) - 1))
    return _table(headers, rows, numeric, classes) + note


def _shape(shape) -> str:
    if not shape:
        return "-"
    if isinstance(shape[0], list):
        return ", ".join(_shape(s) for s in shape)
    return "×".join(map(str, shape))


def _roofline_note(report: dict) -> str:
    zero = [n for n in report["nodes"] if not n.get("flops") and n.get("mac_bytes") and n.get("category") != "view"]
    moved = sum(n["mac_bytes"] for n in zero)
    lat = report.get("latency") or {}
    basis = ("Points are measured per-node times." if lat.get("end_to_end_ms") is not None
             else "Points are the roofline's predictions (add --measure for measured times)." if lat.get("profile")
             else "No device profile: run <code>archscan calibrate</code> to draw the device's roofline.")
    prof = lat.get("profile")
    if prof and lat.get("end_to_end_ms") is not None:
        peak = prof["peak_flops"].get(report["dtype"]) or max(prof["peak_flops"].values())
        above = sum(1 for n in report["nodes"] if n.get("flops") and n.get("mac_bytes") and n.get("latency_ms")
                    and n["flops"] / (n["latency_ms"] / 1e3) > min(peak, prof["bandwidth"] * n["flops"] / n["mac_bytes"]))
        if above:
            basis += (f" {above} above the roof read their data from cache, faster than the calibrated memory "
                      "bandwidth.")
    return (f"{basis} {len(zero)} nodes with no multiply-adds (element-wise, norm, pooling, copies) have no intensity "
            f"and are not drawn; they move {escape(fmt_bytes(moved))}.")


def _latency(report: dict, limit: int = 15) -> str:
    lat = report.get("latency") or {}
    if not lat:
        return ('<p class="note">No latency: add <code>--measure</code> to time every layer, or run '
                "<code>archscan calibrate</code> once so scans predict it from the device's roofline.</p>")
    parts = [_plot(plots.latency_svg(report), "Time per top-level module: measured (blue) beside the roofline's "
                   "prediction (orange).")]
    if lat.get("per_layer_sum_ms") is not None:
        text = (f"per layer {lat['per_layer_sum_ms']:.3f} ms summed over {lat['timed_nodes']} nodes; gap "
                f"{lat['gap_ms']:+.3f} ms ({100 * lat['gap_fraction']:+.1f}%): {lat['gap_explained']}")
        parts.append(f'<p class="note">{escape(text)}</p>')
    timed, key, nodes = slowest_nodes(report, limit)
    if nodes:
        headers = ["node", "module", "category", "ms" if timed else "predicted ms"]
        headers += ["predicted ms", "% of roofline"] if timed else []
        headers += ["bound"]
        rows = []
        for n in nodes:
            cells = [escape(n["name"]), escape(n.get("module") or ""), escape(n["category"]), _num(_ms(n[key]), n[key])]
            if timed:
                pred = n.get("predicted_ms")
                cells += [_num(_ms(pred), pred), _num(f"{100 * pred / n[key]:.0f}%" if pred else "-")]
            cells += [escape(str(n.get("attrs", {}).get("bound", "-")))]
            rows.append(cells)
        parts.append(f"<p>The {len(nodes)} slowest nodes ({'measured' if timed else 'predicted'}):</p>"
                     + _table(headers, rows, set(range(3, len(headers) - 1))))
    return "\n".join(parts)


def _findings(report: dict) -> str:
    if not report["findings"]:
        return "<p>No findings.</p>"
    rows = [[f'<span class="{escape(f["severity"])}">{escape(f["severity"])}</span>', escape(f["rule"]),
             escape(f.get("module") or "(model)") + (f'<br><span class="note">{escape(f["source"])}</span>' if f.get("source") else ""),
             f'<td class="prose">{escape(f["message"])}</td>', escape(fmt_saving(f.get("saving") or {})),
             f'<td class="prose">{escape(f.get("fix") or "")}</td>']
            for f in report["findings"]]
    return _table(["severity", "rule", "where", "finding", "saving", "fix"], rows)


def _recommendations(report: dict) -> str:
    if not report["recommendations"]:
        return "<p>No recommendations.</p>"
    items = []
    for r in report["recommendations"]:
        says = fmt_recommendation_says(r.get("estimated_saving") or {}, r["basis"], r.get("verified"))
        items.append(f"<li><b>{escape(r['kind'])}</b>: {escape(says)}. {escape(r['reason'])}"
                     f"<br>apply: <code>{escape(r['apply'])}</code></li>")
    return "<ol>\n" + "\n".join(items) + "\n</ol>"


def _blocks(report: dict) -> str:
    blocks = report.get("blocks") or []
    if not blocks:
        return "<p>No building blocks found (no repeated module with branches or convolutions).</p>"
    rows = [[escape(b["name"]), escape(b["type"]), escape(b["kind"]), _num(str(b["nodes"])), _num(str(b["fragments"])),
             _num(str(b["series"])), _num(str(b["parallel"])), _num(fmt_count(b["flops"]), b["flops"]),
             _num(fmt_bytes(b["mac_bytes"]), b["mac_bytes"]),
             _num(f"{100 * b['elementwise_mac_bytes'] / b['mac_bytes']:.0f}%" if b["mac_bytes"] else "-")]
            for b in blocks]
    return ('<p class="note">Fragments are the convolutions and poolings of a block (ShuffleNetV2 G3: fewer, larger '
            "operators keep a device busy); series and parallel count them along the longest path and across its "
            "widest point. Element-wise is the share of the block's bytes moved by element-wise ops (G4).</p>"
            + _table(["block", "type", "kind", "nodes", "fragments", "series", "parallel", "FLOPs", "MAC",
                      "element-wise"], rows, set(range(3, 10))))


def _top_findings(report: dict, limit: int = 5) -> str:
    recs = report["recommendations"][:3]
    parts = []
    if recs:
        parts.append("<p>Top recommendations:</p><ol>" + "".join(
            f"<li><b>{escape(r['kind'])}</b>: {escape(r['reason'])}</li>" for r in recs) + "</ol>")
    worst = [f for f in report["findings"] if f["severity"] != "info"][:limit]
    if worst:
        parts.append("<p>Findings:</p><ul>" + "".join(
            f"<li>{escape(f['rule'])} at {escape(f.get('module') or '(model)')}: {escape(f['message'])}</li>"
            for f in worst) + "</ul>")
    return "\n".join(parts)


# --- comparison ----------------------------------------------------------------------------------

def _basis(comparison: dict) -> tuple[str | None, str]:
    key = time_columns(comparison["rows"])[2]
    return key, TIME_BASIS[key]


def _compare_summary(comparison: dict) -> str:
    rows = comparison["rows"]
    failed = [r for r in rows if "error" in r]
    items = [("models", escape(f"{len(rows)}" + (f", {len(failed)} failed" if failed else ""))),
             ("baseline", escape(comparison.get("baseline") or "-")),
             ("time", escape(_basis(comparison)[1]))]
    if comparison.get("device"):
        items.append(("device", escape(comparison["device"])))
    if comparison.get("measured_at"):
        items.append(("measured", escape(comparison["measured_at"])))
    if comparison.get("sort"):
        items.append(("sorted by", escape(comparison["sort"])))
    for r in failed:
        items.append((r["model"], f'<span class="error">failed: {escape(r["error"])}</span>'))
    return _dl(items)


def _compare_table(comparison: dict) -> str:
    """The terminal's columns (``report.compare.columns``), then each model's top recommendation."""
    cols = columns(comparison)
    headers = ["model", *(c.long.replace("x ", "× ", 1) if c.kind == "ratio" else c.long for c in cols),
               "top recommendation"]
    table = []
    for r in comparison["rows"]:
        if "error" in r:
            table.append([escape(r["model"]), f'<td colspan="{len(headers) - 1}" class="error">failed: {escape(r["error"])}</td>'])
            continue
        top = r.get("top_recommendation")
        saving = fmt_recommendation_saving(top.get("estimated_saving") or {}) if top else ""
        table.append([escape(r["model"]), *(_num(_shown(c.kind, c.get(r)), c.get(r)) for c in cols),
                      f'<td class="prose" title="{escape(top["reason"])}"><b>{escape(top["kind"])}</b>'
                      + (f": saves {escape(saving)}" if saving else "") + "</td>" if top else "-"])
    return (_table(headers, table, set(range(1, len(headers) - 1)))
            + '<p class="note">Ratios are against the baseline. Element-wise MAC is the share of the bytes moved by '
              "element-wise ops (G4); fragments counts the convolutions and poolings inside building blocks (G3); "
              "G1–G4 count each guideline's findings, other the tuning rules'.</p>")


def _shown(kind: str, value) -> str:
    if value is None:
        return "-"
    return {"count": fmt_count, "bytes": fmt_bytes, "number": lambda v: f"{v:.1f}", "ms": _ms,
            "ratio": _ratio, "share": lambda v: f"{100 * v:.0f}%", "int": str, "rate": lambda v: f"{v:,.0f}"}[kind](value)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}×"


def _axis(comparison: dict) -> str:
    """What the scatter's other axis shows: measured or predicted time, else the bytes moved."""
    key = _basis(comparison)[0]
    return "measured time" if key == "latency_ms" else "predicted time" if key else "bytes moved"


def _scatter_note(comparison: dict) -> str:
    key, basis = _basis(comparison)
    what = basis if key else "bytes moved (no latency: add --measure, or run archscan calibrate)"
    return (f"One point per model: FLOPs against {escape(what)}. Models of equal FLOPs at different heights "
            "are the ShuffleNetV2 paper's point: FLOPs alone do not say how fast a model runs.")
