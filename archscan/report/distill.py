"""Terminal text for ``archscan distill``: the student, its costs beside the teacher's, the layer mapping."""

from __future__ import annotations

from tabulate import tabulate

from .fuse import change_text
from .text import DEFAULT_WIDTH, input_text, shape_text, fmt_bytes, fmt_count, label_lines


def mapping_table(mapping) -> str:
    """Teacher module, student module, their output shapes and the adapter a feature loss needs."""
    rows = [[m.teacher or "(output)", m.student or "(output)", shape_text(m.teacher_shape), shape_text(m.student_shape),
             m.adapter or "-"] for m in mapping]
    return tabulate(rows, headers=["teacher", "student", "teacher shape", "student shape", "adapter"],
                    disable_numparse=True)


def distill_text(result, width: int = DEFAULT_WIDTH) -> str:
    """``DistillResult`` as aligned label/value lines (values wrapped at word boundaries to
    ``width``), then the layer mapping as a table."""
    inputs = ", ".join(input_text(i) for i in result.inputs)
    s, t, a = result.student, result.teacher, result.totals
    rows: list[tuple[str, str]] = [("model", result.model), ("inputs", inputs), ("student", f"{s.id}: {s.description}")]
    if s.why:
        rows.append(("why", s.why))
    rows.append(("params", f"{t['params']:,} -> {a['params']:,} ({a['params'] - t['params']:+,})"))
    rows.append(("FLOPs", change_text(t["flops"], a["flops"], fmt_count)))
    rows.append(("MAC", change_text(t["mac_bytes"], a["mac_bytes"], fmt_bytes)))
    rows.append(("kernels", change_text(t["kernels"], a["kernels"], str)))
    if "predicted_ms" in t and "predicted_ms" in a:
        rows.append(("latency", change_text(t["predicted_ms"], a["predicted_ms"], lambda ms: f"{ms:.3f} ms")
                     + " predicted (archscan calibrate's profile)"))
    mode = ("training mode: batch norms use batch statistics, dropout is on" if result.mode == "train"
            else "eval mode: batch norms use running statistics, dropout is off")
    batch = "any batch size" if result.dynamic_batch else "the batch size given only (the model fixes it)"
    rows.append(("program", f"random-init weights, {mode}; {batch}. The figures above are inference costs"))
    if result.path:
        rows.append(("saved", f"{result.path}  (load: torch.export.load({result.path!r}).module())"))
    if result.alternatives:
        shown = ", ".join(result.alternatives[:6]) + (f" (+{len(result.alternatives) - 6})" if len(result.alternatives) > 6 else "")
        rows.append(("others", f"{shown} (--student ID)"))
    lines = label_lines(rows, width)
    lines += ["", "layer mapping (feature distillation: teacher output <-> student output)", mapping_table(result.mapping)]
    return "\n".join(lines)
