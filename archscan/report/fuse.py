"""Terminal text for ``archscan fuse``: what was folded, what was kept and why, the check, the savings."""

from __future__ import annotations

from collections import defaultdict

from .text import DEFAULT_WIDTH, input_text, fmt_bytes, label_lines


def change_text(before: float, after: float, fmt) -> str:
    if not before:
        return f"{fmt(before)} -> {fmt(after)}"
    return f"{fmt(before)} -> {fmt(after)} ({100 * (after - before) / before:+.1f}%)"


def fuse_text(result, width: int = DEFAULT_WIDTH) -> str:
    """``FuseResult`` as aligned label/value lines, values wrapped at word boundaries to ``width``."""
    inputs = ", ".join(input_text(i) for i in result.inputs)
    weights = result.weights or "random weights with random batch-norm statistics (pass --weights for yours)"
    rows: list[tuple[str, str]] = [("model", result.model), ("inputs", inputs), ("weights", weights)]
    by_kind = ", ".join(f"{kind} {n}" for kind, n in sorted(result.folded_by_kind.items()))
    with_act = sum(1 for f in result.folded if f.activation)
    folded = f"{len(result.folded)} batch norm(s)" + (f": {by_kind}" if by_kind else "")
    if with_act:
        folded += (f"; {with_act} followed by an activation, which stays its own op (no core aten op "
                   "fuses it: torch.compile on the loaded module does)")
    rows.append(("folded", folded))
    if result.kept:
        why: dict[str, list[str]] = defaultdict(list)
        for k in result.kept:
            why[k.reason].append(k.norm)
        for i, (reason, norms) in enumerate(why.items()):
            shown = ", ".join(norms[:4]) + (f" (+{len(norms) - 4})" if len(norms) > 4 else "")
            rows.append(("kept" if i == 0 else "", f"{len(norms)}: {shown}: {reason}"))
    else:
        rows.append(("kept", "0 batch norms"))
    attention = f"{len(result.attention)} hand-written attention(s) rewritten to scaled_dot_product_attention"
    if result.attention:
        attention += ": " + ", ".join(r.module for r in result.attention[:4]) + (" ..." if len(result.attention) > 4 else "")
    if result.attention_left:
        attention += f"; {len(result.attention_left)} left as written: " + "; ".join(
            f"{m or '(model)'}: {why}" for m, why in result.attention_left[:3]) + (" ..." if len(result.attention_left) > 3 else "")
    rows.append(("attention", attention))
    c = result.check
    rows.append(("check", f"max abs error {c.max_abs_err:.2g}, max relative {c.max_rel_err:.2g} over {c.outputs} output(s) "
                          f"({c.dtype}: rtol {c.rtol:g}, atol {c.atol:g}): {'passed' if c.passed else 'FAILED'}"
                          + (f"; judged on a float64 run of the original: fused {c.fused_rel_err64:.2g}, original "
                             f"{c.original_rel_err64:.2g} (the {c.drifted} drifted)" if c.drifted else "")))
    b, a = result.before, result.after
    rows.append(("MAC", change_text(b["mac_bytes"], a["mac_bytes"], fmt_bytes)))
    rows.append(("kernels", change_text(b["kernels"], a["kernels"], str)))
    rows.append(("params", f"{b['params']:,} -> {a['params']:,} ({a['params'] - b['params']:+,})"))
    if result.latency:
        lat = result.latency
        speed = lat["before_ms"] / lat["after_ms"] if lat["after_ms"] else 0.0
        unstable = " (unstable timings: spread above 25%)" if lat["before_unstable"] or lat["after_unstable"] else ""
        rows.append(("latency", f"{lat['before_ms']:.3f} ms -> {lat['after_ms']:.3f} ms ({speed:.2f}x) on "
                                f"{lat['device']} ({lat['device_name']}){unstable}"))
    if result.outputs_flattened:
        rows.append(("outputs", "forward returns an object torch.export cannot keep: the program returns its tensors "
                                "as a flat tuple, in the order archscan.load.recording.output_tensors lists them"))
    if result.path:
        rows.append(("saved", f"{result.path}  (load: torch.export.load({result.path!r}).module())"))
    elif not c.passed:
        rows.append(("saved", "nothing: the check failed"))
    return "\n".join(label_lines(rows, width))
