"""The ``parallel`` section as text: the mesh and its plan, rank 0's peak and what holds it, the
collectives by kind, mesh dimension and phase, the step's time, the budget and the search."""

from __future__ import annotations

from ..units import fmt_bytes


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f} ms" if x >= 1 else f"{x * 1e3:,.0f} µs"


def collective_groups(rows: list[dict]) -> list[dict]:
    """The collectives summed by (kind, mesh dimension, phase): calls, every call's buffers, the
    bytes on the wire per rank, time."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["kind"], r["mesh_dim"], r["phase"])
        g = out.setdefault(key, {"kind": r["kind"], "mesh_dim": r["mesh_dim"], "phase": r["phase"], "group_size": r["group_size"],
                                 "count": 0, "send_bytes": 0, "recv_bytes": 0, "wire_bytes": 0, "ms": None})
        g["count"] += r["count"]
        g["send_bytes"] += r["send_bytes"] * r["count"]
        g["recv_bytes"] += r["recv_bytes"] * r["count"]
        g["wire_bytes"] += r["wire_bytes"] * r["count"]
        if r.get("ms") is not None:
            g["ms"] = (g["ms"] or 0.0) + r["ms"]
    return list(out.values())


def _micro(section: dict) -> str:
    """One rank's micro-batch: its inputs' shapes."""
    return ", ".join("×".join(map(str, i["shape"])) for i in section["micro_batch"])


def parallel_lines(section: dict, memory_line) -> list[str]:
    """Lines for the terminal report; ``memory_line(label, memory)`` renders a peak as the rest of
    the report does."""
    if section.get("candidates") is not None:
        return _search_lines(section)
    micro = _micro(section)
    lines = [(f"parallel   {section['spec']} ({section['world_size']} ranks, {section['data_parallel']} data-parallel; "
             f"micro-batch {micro} per rank): {section['plan']}"),
             memory_line("rank 0     ", section["memory"])]
    lines.append("           " + ("every rank holds the same (each sharded dimension divides)" if section["ranks_alike"]
                                  else "rank 0 holds the largest shards (torch.chunk's order): the worst rank"))
    for g in collective_groups(section["collectives"]):
        lines.append(f"collective {g['kind']} over {g['mesh_dim']} ({g['group_size']}) in the {g['phase']}: ×{g['count']}, "
                     f"buffers {fmt_bytes(g['send_bytes'])} in, {fmt_bytes(g['recv_bytes'])} out; "
                     f"{fmt_bytes(g['wire_bytes'])} sent and received per rank (ring)"
                     + (f", {_ms(g['ms'])}" if g["ms"] is not None else ""))
    time = section.get("time")
    if time:
        lines.append(f"step time  {_ms(time['overlapped_ms'])} overlapped, {_ms(time['serial_ms'])} serial "
                     f"({time['gpu']}, {time['interconnect']}): compute {_ms(time['compute_ms'])}, "
                     f"communication {_ms(time['comm_ms'])}; {time['assumes']}")
    else:
        lines.append("step time  not predicted: name a GPU (--device-profile h100 or --memory h100)")
    budget = section.get("budget")
    if budget:
        found = budget.get("max_batch")
        lines.append(f"budget     {budget['label']}: the largest micro-batch per rank is {found}"
                     + (f" ({fmt_bytes(budget['peak_bytes_at_max'])} at it)" if found else ""))
    return lines


def _search_lines(section: dict) -> list[str]:
    micro = _micro(section)
    lines = [(f"parallel   {section['spec']}: meshes of {section['world_size']} GPUs at micro-batch {micro} per rank "
             f"in {section['budget']['label']}, ranked by {section['ranked_by']}")]
    for row in section["candidates"]:
        if "skipped" in row:
            lines.append(f"           {row['spec']}: skipped, {row['skipped']}")
            continue
        rate = f", {row['samples_per_s']:,.1f} samples/s" if row.get("samples_per_s") else ""
        lines.append(f"           {row['spec']}{' + checkpointing' if row['checkpoint'] else ''}: "
                     + ("runs out of memory (the simulated caching allocator)" if row.get("out_of_memory") else
                        f"{fmt_bytes(row['peak_bytes'])}, {'fits' if row['fits'] else 'does not fit'}")
                     + (f", step {_ms(row['step_ms'])}" if row.get("step_ms") else "") + rate)
    best = section.get("best")
    lines.append(f"best       {section['ranked'][0]}" if best else "best       no mesh of these fits: more GPUs, a "
                                                                  "smaller micro-batch or a larger budget")
    return lines
