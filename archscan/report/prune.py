"""Terminal text for ``archscan prune``: the channel groups, and what a cut did."""

from __future__ import annotations

import textwrap

from .text import DEFAULT_WIDTH, fmt_bytes, fmt_count, label_lines


def _modules(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" (+{len(names) - n})" if len(names) > n else "")


def groups_text(rows: list[dict], unknown: dict, width: int = DEFAULT_WIDTH) -> str:
    """One block per group: id, channels, layers and the first source line, then what each cut
    saves (or why the group stays)."""
    cuttable = sum(1 for r in rows if r["cuts"])
    lines = [f"{len(rows)} coupled channel groups, {cuttable} can be cut (kept channels rounded to multiples of 8; "
             "each cut counted alone, exactly)"]
    for r in rows:
        source = next((m["source"] for m in r["members"] if m.get("source")), None)
        head = (f"group {r['id']}: {r['channels']} channels; made by {_modules(r['producers'])}; "
                f"{len(r['members'])} layers: {_modules([m['module'] for m in r['members']], 4)}"
                + (f" ({source})" if source else ""))
        lines += textwrap.wrap(head, width, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
        if r["cuts"]:
            for c in r["cuts"]:
                ms = f", {c['ms']:.3f} ms predicted" if "ms" in c else ""
                pays = "" if c.get("pays", True) else "; will not pay: FLOPs fall, predicted time does not"
                lines.append(f"    cut {c['ratio']:g}: keep {c['kept']}, saves {fmt_count(c['params'])} params, "
                             f"{fmt_count(c['flops'])} FLOPs, {fmt_bytes(c['mac_bytes'])}{ms}{pays}")
        why = r.get("refused") or r.get("pinned") or (None if r["cuts"] else "too few channels to cut")
        if why:
            lines += textwrap.wrap(f"kept: {why}", width, initial_indent="    ", subsequent_indent="    ",
                                   break_long_words=False, break_on_hyphens=False)
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
    return "\n".join(label_lines(rows, width))
