"""Terminal text for ``archscan prune``: the channel groups, and what a cut did."""

from __future__ import annotations

import textwrap

from .text import DEFAULT_WIDTH, fmt_bytes, fmt_count


def _lines(rows: list[tuple[str, str]], width: int) -> str:
    indent = max(len(label) for label, _ in rows) + 2
    out = []
    for label, value in rows:
        wrapped = textwrap.wrap(value, max(20, width - indent), break_long_words=False, break_on_hyphens=False) or [""]
        out += [f"{label:<{indent}}{wrapped[0]}"] + [" " * indent + more for more in wrapped[1:]]
    return "\n".join(out)


def _modules(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" (+{len(names) - n})" if len(names) > n else "")


def groups_text(rows: list[dict], ratio: float, unknown: dict, width: int = DEFAULT_WIDTH) -> str:
    """One block per group: id, channels, what a cut at ``ratio`` keeps, its layers, or why it stays."""
    lines = [f"{len(rows)} coupled channel groups ({sum(1 for r in rows if r['kept_at_ratio'] is not None)} can be cut; "
             f"kept channels at --ratio {ratio:g} rounded to multiples of 8)"]
    for r in rows:
        if r["kept_at_ratio"] is not None:
            status = f"{r['channels']} -> {r['kept_at_ratio']} channels"
        elif r["pinned"]:
            status = f"{r['channels']} channels, kept: {r['pinned']}"
        else:
            status = f"{r['channels']} channels, too few to cut"
        produced = _modules(r["producers"])
        lines += textwrap.wrap(f"group {r['id']}: {status}; made by {produced}; {len(r['members'])} layers: "
                               f"{_modules([m['module'] for m in r['members']], 4)}", width,
                               subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
    if unknown:
        lines.append("ops without a channel rule (their channels are kept): "
                     + ", ".join(f"{op} x{n}" for op, n in unknown.items()))
    return "\n".join(lines)


def _change(key: str, result, fmt) -> str:
    b, a, p = result.before[key], result.after[key], result.predicted[key]
    pct = f" ({100 * (a - b) / b:+.1f}%)" if b else ""
    exact = "as predicted" if a == p else f"predicted {fmt(p)}"
    return f"{fmt(b)} -> {fmt(a)}{pct}, {exact}"


def prune_text(result, width: int = DEFAULT_WIDTH) -> str:
    rows = [("model", result.model)]
    how = ("importance from the weights (filter L2 norms + norm gammas, summed over each group)"
           if result.importance == "weights" else
           "structural only (no --weights): the last channels of each group are cut")
    rows.append(("channels", how))
    cut = ", ".join(f"{g['id']}: {g['channels']}->{g['kept']}" for g in result.groups)
    rows.append(("cut", f"{len(result.groups)} group(s) at --ratio {result.ratio:g}: {cut}"))
    for i, left in enumerate(result.left_out[:3]):
        rows.append(("left out" if i == 0 else "", f"group {left['id']}: {left['why']}"))
    if len(result.left_out) > 3:
        rows.append(("", f"(+{len(result.left_out) - 3} more groups left out; --json lists them)"))
    rows.append(("params", _change("params", result, lambda x: f"{x:,}")))
    rows.append(("FLOPs", _change("flops", result, fmt_count)))
    rows.append(("MAC", _change("mac_bytes", result, fmt_bytes)))
    rows.append(("kernels", f"{result.before['kernels']} -> {result.after['kernels']}"))
    if result.latency:
        lat = result.latency
        speed = lat["before_ms"] / lat["after_ms"] if lat["after_ms"] else 0.0
        rows.append(("latency", f"{lat['before_ms']:.3f} ms -> {lat['after_ms']:.3f} ms ({speed:.2f}x) on "
                                f"{lat['device']} ({lat['device_name']})"))
    if result.path:
        rows.append(("saved", f"{result.path}  (load: torch.export.load({result.path!r}).module())"))
    return _lines(rows, width)
