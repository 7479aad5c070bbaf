"""Terminal text: the per-module and per-node tables and the totals block."""

from __future__ import annotations

from tabulate import tabulate

from ..results import Report


def fmt_count(n: float | int | None, unit: str = "") -> str:
    """1234567 -> '1.23M' (SI prefixes, three significant digits)."""
    if n is None:
        return "-"
    n = float(n)
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}{unit}"
    return f"{n:.3g}{unit}" if n != int(n) else f"{int(n)}{unit}"


def fmt_bytes(n: float | int | None) -> str:
    """Bytes with binary prefixes: 1536 -> '1.5 KiB'."""
    if n is None:
        return "-"
    n = float(n)
    for div, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.3g} {suffix}"
    return f"{int(n)} B"


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _shape(s) -> str:
    return "-" if s is None else "×".join(str(d) for d in s)


def module_table(report: Report, depth: int = 2) -> str:
    """Modules down to ``depth``, indented, each with its subtree's costs."""
    rows = []
    total_flops = report.totals.flops or 1
    for m in report.modules:
        if m.depth > depth or (m.nodes == 0 and m.params == 0):
            continue
        name = "  " * m.depth + (m.path.rsplit(".", 1)[-1] if m.path else report.model)
        rows.append([
            name, m.type, m.category or "-", fmt_count(m.params), fmt_count(m.flops), f"{100 * m.flops / total_flops:.1f}%",
            fmt_bytes(m.mac_bytes), fmt_count(m.elem_ops), f"{m.intensity:.1f}", _shape(m.out_shape),
        ] + ([fmt_ms(m.latency_ms)] if report.latency and report.latency.get("end_to_end_ms") else []))
    headers = ["module", "type", "category", "params", "FLOPs", "share", "MAC", "elem ops", "FLOPs/B", "out shape"]
    if report.latency and report.latency.get("end_to_end_ms"):
        headers.append("ms")
    return tabulate(rows, headers=headers, disable_numparse=True, colalign=("left", "left", "left") + ("right",) * (len(headers) - 3))


def node_table(report: Report, limit: int | None = None, sort: str | None = None) -> str:
    """Every node: op, module, category, costs, output shape (optionally the top ``limit`` by ``sort``)."""
    nodes = list(report.nodes)
    if sort:
        nodes.sort(key=lambda n: getattr(n, sort) or 0, reverse=True)
    if limit:
        nodes = nodes[:limit]
    rows = [[n.name, n.op, n.module or "-", n.category, fmt_count(n.params), fmt_count(n.flops), fmt_bytes(n.mac_bytes),
             fmt_count(n.elem_ops), f"{n.intensity:.1f}", _shape(n.out_shape)]
            + ([fmt_ms(n.latency_ms), fmt_ms(n.predicted_ms), n.attrs.get("bound", "-"),
                f"{100 * n.attrs['achieved']:.0f}%" if "achieved" in n.attrs else "-"] if report.latency else [])
            for n in nodes]
    headers = ["node", "op", "module", "category", "params", "FLOPs", "MAC", "elem ops", "FLOPs/B", "out shape"]
    if report.latency:
        headers += ["ms", "pred ms", "bound", "% roof"]
    return tabulate(rows, headers=headers, disable_numparse=True,
                    colalign=("left",) * 4 + ("right",) * (len(headers) - 4))


def totals_lines(report: Report) -> list[str]:
    """The totals block: params, FLOPs, MAC, element ops, intensity, capture."""
    t = report.totals
    inputs = ", ".join(f"{'×'.join(map(str, i['shape']))} {i['dtype']}" for i in report.inputs)
    lines = [
        f"model      {report.model}  (capture: {report.capture}, dtype {report.dtype}, input {inputs})",
        f"params     {fmt_count(t.params)} ({t.params:,}; {fmt_bytes(t.param_bytes)})"
        + (f", {fmt_count(t.unused_params)} never used in forward" if t.unused_params else ""),
        f"FLOPs      {fmt_count(t.flops)} multiply-adds ({t.flops:,})",
        f"MAC        {fmt_bytes(t.mac_bytes)} moved ({t.mac_bytes:,} bytes: {fmt_bytes(t.read_bytes)} read, "
        f"{fmt_bytes(t.write_bytes)} written, {fmt_bytes(t.weight_bytes)} of it weights)",
        f"elem ops   {fmt_count(t.elem_ops)} (element-wise, norm, activation, pooling; not in FLOPs)",
        f"intensity  {t.intensity:.1f} FLOPs/byte",
    ]
    for note in report.capture_notes:
        lines.append(f"note       {note}")
    if report.uncounted:
        lines.append("uncounted  " + ", ".join(f"{op} ×{n}" for op, n in report.uncounted.items())
                     + "  (no FLOP formula; bytes counted)")
    return lines


def latency_lines(report: Report) -> list[str]:
    """Measured and predicted latency: end to end, per-layer sum and the gap, roofline fit."""
    lat = report.latency
    if not lat:
        return []
    lines = []
    if lat.get("end_to_end_ms") is not None:
        e2e = lat["end_to_end"]
        where = f"{lat['device']} ({lat['device_name']}" + (f", {lat['threads']} threads" if lat.get("threads") else "") + ")"
        extras = ", ".join(x for x in (f"amp {lat['amp']}" if lat.get("amp") else "",
                                        "channels_last" if lat.get("channels_last") else "") if x)
        lines.append(f"latency    {lat['end_to_end_ms']:.3f} ms end to end on {where}"
                     + (f" [{extras}]" if extras else "")
                     + f", median of {e2e['repeats']}, spread {100 * e2e['spread']:.1f}%"
                     + (f"; {lat['throughput_per_s']:.1f} items/s" if lat.get("throughput_per_s") else ""))
        if lat.get("per_layer_sum_ms") is not None:
            what = "leaf modules" if lat.get("per_layer_note") else "nodes"
            lines.append(f"per layer  {lat['per_layer_sum_ms']:.3f} ms summed over {lat['timed_nodes']} {what}; "
                         f"gap {lat['gap_ms']:+.3f} ms ({100 * lat['gap_fraction']:+.1f}%): {lat['gap_explained']}")
        if lat.get("per_layer_note"):
            lines.append(f"           {lat['per_layer_note']}")
        sweep = lat.get("sweep") or {}
        if sweep.get("batches"):
            lines.append("batches    " + ", ".join(
                f"{b['batch']}: {b['per_s']:.1f}/s" if "per_s" in b else f"{b['batch']}: failed ({b['failed']})"
                for b in sweep["batches"]))
        if "channels_last_ms" in sweep:
            lines.append(f"chan-last  {sweep['channels_last_ms']:.3f} ms end to end in channels_last")
        for c in sweep.get("input_copies", []):
            lines.append(f"input copy {fmt_bytes(c['bytes'])}: {c['pageable_ms']:.3f} ms pageable, {c['pinned_ms']:.3f} ms pinned")
    if lat.get("predicted_ms") is not None:
        prof = lat["profile"]
        line = f"predicted  {lat['predicted_ms']:.3f} ms from the roofline of {prof['name']} (calibrated {prof['created'][:10]})"
        if lat.get("prediction_error") is not None:
            line += f"; {100 * lat['prediction_error']:+.0f}% against measured"
        lines.append(line)
        timed = [n for n in report.nodes if n.latency_ms and n.predicted_ms and n.category != "view"]
        if timed:
            worst = sorted(timed, key=lambda n: n.predicted_ms / n.latency_ms)[:3]
            lines.append("below roof " + ", ".join(
                f"{n.module or n.name} {100 * n.predicted_ms / n.latency_ms:.0f}% of roofline ({n.latency_ms:.3f} ms)"
                for n in worst))
    return lines


def fmt_saving(saving: dict) -> str:
    """{'mac_bytes': 1048576, 'kernels': 3} -> '1 MiB, 3 kernels'."""
    parts = []
    for key, value in saving.items():
        if key.startswith("share") or value in (None, 0, {}):
            continue
        if key.endswith("bytes") or key == "bytes":
            parts.append(fmt_bytes(value))
        elif key == "flops_share":
            parts.append(f"{100 * value:.0f}% of FLOPs")
        else:
            parts.append(f"{fmt_count(value)} {key}")
    return ", ".join(parts) or "-"


def findings_table(report: Report, limit: int = 20) -> str:
    """Findings, most severe and largest saving first: rule, where, evidence, saving, fix."""
    if not report.findings:
        return "findings   none"
    # Identical findings on several layers (say, every depthwise conv) read as one row; JSON keeps each.
    groups: dict[tuple, list] = {}
    for f in report.findings:
        groups.setdefault((f.rule, f.severity, f.message, f.fix), []).append(f)
    rows = []
    for (rule, severity, message, fix), same in list(groups.items())[:limit]:
        first = same[0]
        where = (first.module or "(model)") + (f" (+{len(same) - 1} like it)" if len(same) > 1 else "")
        if first.source:
            where += f"\n{first.source}"
        saving = {k: sum(f.saving.get(k, 0) for f in same) if all(isinstance(f.saving.get(k), (int, float)) for f in same)
                  else v for k, v in first.saving.items()}
        rows.append([severity, rule, where, message, fmt_saving(saving), fix])
    table = tabulate(rows, headers=["severity", "rule", "where", "finding", "saving", "fix"],
                     maxcolwidths=[None, None, 30, 50, 16, 50], disable_numparse=True)
    more = len(groups) - limit
    counts = {}
    for f in report.findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    summary = "findings   " + ", ".join(f"{n} {sev}" for sev, n in counts.items())
    return "\n".join([table] + ([f"... and {more} more (--json lists all)"] if more > 0 else []) + [summary])


def render_text(report: Report, depth: int = 2, per_node: bool = False, findings: bool = True) -> str:
    """The full terminal report."""
    parts = [node_table(report) if per_node else module_table(report, depth), "", *totals_lines(report),
             *latency_lines(report)]
    if findings:
        parts += ["", findings_table(report)]
    return "\n".join(parts)
