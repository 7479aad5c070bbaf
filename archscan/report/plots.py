"""Plots for the HTML reports, as inline SVG strings (matplotlib, imported only here and only when
a report is asked for: a plain scan never loads it).

Every plot takes the JSON dict of a report (``archscan.report/1``) or a comparison
(``archscan.compare/1``) and returns ``<svg>...</svg>`` text, or None when the report holds nothing
to plot. The SVG is deterministic: text stays text (``svg.fonttype: none``), element ids come from a
fixed salt and no date is written, so the same report gives the same bytes.

Units follow the report: FLOPs are multiply-adds, the device's peak is multiply-adds per second
(``latency.profile.peak_flops``), bandwidth is bytes per second.
"""

from __future__ import annotations

import io
import re

from ..results import CATEGORIES
from .facts import predicted_by_module

_RC = {"svg.fonttype": "none", "svg.hashsalt": "archscan", "font.size": 9, "font.family": "sans-serif",
       "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3}
# one colour per cost category, fixed so a category looks the same in every report
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#aaaaaa", "#555555")
COLOURS = dict(zip(CATEGORIES, _PALETTE))


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # no pyplot: no backend, no global state

    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig) -> str:
    """The figure as an ``<svg>`` element to inline in HTML: no XML prolog, no metadata block."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    # scale with the page: drop the fixed size, keep the viewBox
    return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 class="plot" role="img"', text, count=1)


def _styled(build):
    """Run ``build`` under the report style (fonts, grid) so text metrics match what is saved."""
    import matplotlib

    with matplotlib.rc_context(_RC):
        return _svg(build())


def roofline_svg(report: dict) -> str | None:
    """Each node as a point (arithmetic intensity, attained multiply-adds per second) coloured by
    category, against the device's roofline: bandwidth × intensity up to the peak. Attained is
    measured where the node was timed, else the roofline prediction; with neither, the points are
    the nodes' work (FLOPs) against their intensity. Nodes without multiply-adds have no intensity
    and are counted in the caption instead."""
    nodes = [n for n in report.get("nodes", []) if n.get("flops") and n.get("mac_bytes")]
    if not nodes:
        return None
    latency = report.get("latency") or {}
    profile = latency.get("profile")
    timed = any(n.get("latency_ms") for n in nodes)

    def attained(n: dict) -> float | None:
        ms = n.get("latency_ms") if timed else n.get("predicted_ms")
        return n["flops"] / (ms / 1e3) if ms else None

    def build():
        fig = _figure(7.5, 4.2)
        ax = fig.add_subplot()
        ax.set_xscale("log")
        ax.set_yscale("log")
        by_cat: dict[str, list[tuple[float, float]]] = {}
        for n in nodes:
            y = attained(n) if profile or timed else n["flops"]
            if y:
                by_cat.setdefault(n["category"], []).append((n["flops"] / n["mac_bytes"], y))
        for cat in sorted(by_cat, key=lambda c: CATEGORIES.index(c) if c in CATEGORIES else len(CATEGORIES)):
            xs, ys = zip(*by_cat[cat])
            ax.scatter(xs, ys, s=14, alpha=0.75, color=COLOURS.get(cat, "#555555"), label=f"{cat} ({len(xs)})",
                       edgecolors="none")
        xs = [n["flops"] / n["mac_bytes"] for n in nodes]
        if profile:
            peak = profile["peak_flops"].get(report.get("dtype") or "float32") or max(profile["peak_flops"].values())
            bw = profile["bandwidth"]
            lo, hi = min(xs + [peak / bw]) / 2, max(xs + [peak / bw]) * 2
            ax.plot([lo, peak / bw, hi], [bw * lo, peak, peak], color="black", linewidth=1.2,
                    label=f"roofline ({peak / 1e9:.0f} G multiply-adds/s, {bw / 1e9:.1f} GB/s)")
            ax.set_title(f"{profile.get('name') or profile.get('device')}: "
                         + ("measured" if timed else "predicted") + " per node", fontsize=10)
        else:
            ax.set_title("no device profile: FLOPs of each node against its intensity", fontsize=10)
        ax.set_xlabel("arithmetic intensity (multiply-adds per byte moved)")
        ax.set_ylabel("multiply-adds per second" if profile or timed else "multiply-adds")
        ax.legend(fontsize=7, loc="lower right", frameon=False)
        return fig

    return _styled(build)


def latency_svg(report: dict, limit: int = 16) -> str | None:
    """Time per top-level module, measured beside predicted (horizontal bars, the slowest first);
    None without latency. Modules below the first level are summed into their parent."""
    modules = [m for m in report.get("modules", []) if m.get("depth") == 1]
    predicted = predicted_by_module(report)
    rows = [(m["path"], m.get("latency_ms"), predicted.get(m["path"])) for m in modules]
    rows = [r for r in rows if r[1] or r[2]]
    if not rows:
        return None
    rows.sort(key=lambda r: -(r[1] or r[2] or 0))
    rest = rows[limit:]
    rows = rows[:limit]
    if rest:
        rows.append((f"{len(rest)} more", sum(r[1] or 0 for r in rest) or None, sum(r[2] or 0 for r in rest) or None))

    def build():
        fig = _figure(7.5, 0.9 + 0.28 * len(rows))
        ax = fig.add_subplot()
        ys = range(len(rows))
        measured = any(r[1] for r in rows)
        guessed = any(r[2] for r in rows)
        height = 0.4 if measured and guessed else 0.7
        if measured:
            ax.barh([y - height / 2 * guessed for y in ys], [r[1] or 0 for r in rows], height=height,
                    color="#1f77b4", label="measured")
        if guessed:
            ax.barh([y + height / 2 * measured for y in ys], [r[2] or 0 for r in rows], height=height,
                    color="#ff7f0e", label="predicted (roofline)")
        ax.set_yticks(list(ys), [r[0] for r in rows])
        ax.invert_yaxis()
        ax.set_xlabel("ms")
        ax.legend(fontsize=7, loc="lower right", frameon=False)
        return fig

    return _styled(build)


MEMORY_COLOURS = {"params": "#1f77b4", "grads": "#ff7f0e", "optimizer_state": "#2ca02c", "activations": "#d62728",
                  "temporaries": "#9467bd", "inputs": "#8c564b",
                  # a parallel step's own (archscan.parallel): FSDP2's gathered parameters and flat buffers, DDP's buckets
                  "unsharded_params": "#17becf", "allgather_buffers": "#bcbd22", "reduce_scatter_buffers": "#e377c2",
                  "ddp_buckets": "#7f7f7f"}


def memory_svg(memory: dict | None, title: str) -> str | None:
    """Live bytes over a run (``memory.timeline``), stacked by category, the peak marked; None
    without a timeline."""
    rows = (memory or {}).get("timeline") or []
    if not rows:
        return None
    categories = [c for c in MEMORY_COLOURS if any(r["by_category"].get(c) for r in rows)]

    def build():
        fig = _figure(7.5, 2.8)
        ax = fig.add_subplot()
        xs = list(range(len(rows)))
        scale = 2 ** 20
        ax.stackplot(xs, [[r["by_category"].get(c, 0) / scale for r in rows] for c in categories],
                     labels=[c.replace("_", " ") for c in categories],
                     colors=[MEMORY_COLOURS[c] for c in categories], linewidth=0)
        ax.axhline(memory["peak_bytes"] / scale, color="#333333", linewidth=0.8, linestyle="--")
        for i in range(1, len(rows)):  # where a phase starts
            if rows[i]["phase"] != rows[i - 1]["phase"]:
                ax.axvline(i, color="#777777", linewidth=0.6)
                ax.text(i, memory["peak_bytes"] / scale, f" {rows[i]['phase']}", fontsize=7, va="top")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("ops that allocate (in order)")
        ax.set_ylabel("MiB live")
        ax.set_xticks([])
        ax.legend(fontsize=7, loc="upper left", frameon=False, ncols=3)
        return fig

    return _styled(build)


def compare_svg(comparison: dict) -> str | None:
    """One point per model: FLOPs against measured latency (else predicted, else MAC), labelled.
    Equal FLOPs at different heights is the ShuffleNetV2 paper's point."""
    rows = [r for r in comparison.get("rows", []) if "error" not in r]
    if not rows:
        return None
    key, label = next(((k, lab) for k, lab in (("latency_ms", "measured latency (ms)"),
                                                  ("predicted_ms", "predicted latency (ms, roofline)"))
                       if all(r.get(k) for r in rows)), ("mac_bytes", "memory access (MiB moved)"))
    scale = 2**20 if key == "mac_bytes" else 1

    def build():
        fig = _figure(7.5, 4.2)
        ax = fig.add_subplot()
        points = [(r["flops"] / 1e6, r[key] / scale, r["model"].removeprefix("zoo:")) for r in rows]
        for i, (x, y, _) in enumerate(points):
            ax.scatter([x], [y], s=28, color=_PALETTE[i % len(_PALETTE)], zorder=3)
        right, top = max(p[0] for p in points) * 1.3, max(p[1] for p in points) * 1.15
        ax.set_xlim(0, right)
        ax.set_ylim(0, top)
        for (x, y, name), (lx, ly) in zip(points, _label_positions([(x / right, y / top) for x, y, _ in points])):
            moved = abs(ly - (y / top + 0.015)) > 1e-9
            ax.annotate(name, (x, y), xytext=(lx, ly), textcoords="axes fraction", fontsize=7, va="bottom",
                        arrowprops={"arrowstyle": "-", "color": "#999999", "linewidth": 0.6} if moved else None)
        ax.set_xlabel("MFLOPs (multiply-adds)")
        ax.set_ylabel(label)
        return fig

    return _styled(build)


def _label_positions(points: list[tuple[float, float]], width: float = 0.22, height: float = 0.045) -> list[tuple[float, float]]:
    """Label corners (axes fractions) beside each point, moved down past labels placed before them
    so that labels of points at equal FLOPs and time do not print over each other."""
    placed: list[tuple[float, float]] = []
    order = sorted(range(len(points)), key=lambda i: (-points[i][1], points[i][0]))
    out: dict[int, tuple[float, float]] = {}
    for i in order:
        x, y = points[i][0] + 0.01, points[i][1] + 0.015
        while any(abs(x - px) < width and abs(y - py) < height for px, py in placed):
            y -= height
        placed.append((x, y))
        out[i] = (x, y)
    return [out[i] for i in range(len(points))]
