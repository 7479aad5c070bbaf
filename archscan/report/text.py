"""Terminal text: the per-module and per-node tables, the totals block and the findings.

Every function that renders takes ``width``, the columns to fit (``terminal_width()`` in the CLI,
``DEFAULT_WIDTH`` otherwise): the module tree and the node table leave out their least important
columns until they fit, the findings table wraps its prose at word boundaries and stacks columns,
and a source ``file:line`` is shortened from the left, never split.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from dataclasses import dataclass, replace

from ..results import ModuleReport, Report, module_and_ancestors
from ..units import fmt_bytes, fmt_count

DEFAULT_WIDTH = 120  # columns when the output is not a terminal and COLUMNS is not set

def terminal_width() -> int:
    """Columns to fit: COLUMNS when set, else the terminal's width, else ``DEFAULT_WIDTH`` (a pipe, a file)."""
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns

def label_lines(rows: list[tuple[str, str]], width: int = DEFAULT_WIDTH) -> list[str]:
    """'label   value' lines, values wrapped at word boundaries under themselves (fuse, prune, distill)."""
    indent = max(len(label) for label, _ in rows) + 2
    lines = []
    for label, value in rows:
        wrapped = textwrap.wrap(value, max(20, width - indent), break_long_words=False, break_on_hyphens=False) or [""]
        lines += [f"{label:<{indent}}{wrapped[0]}"] + [" " * indent + more for more in wrapped[1:]]
    return lines

def input_text(i: dict, times: str = "×") -> str:
    """An input as the report's JSON holds it -> 'attention_mask=1×128 int64', 'images[0]=3×224×224
    float32'; a tensor in a nested positional input: 'input 0.pixels=2×8 float32'."""
    label = i.get("name") or (f"input {i['arg']}{i['path']}" if i.get("path") else "")
    return f"{label + '=' if label else ''}{times.join(map(str, i['shape']))} {i['dtype']}"

def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"

def shape_text(s) -> str:
    return "-" if s is None else "×".join(str(d) for d in s)

def module_table(report: Report, depth: int = 2, width: int = DEFAULT_WIDTH) -> str:
    """Modules down to ``depth`` as a tree (``├─``/``└─``), each with its subtree's costs, fitted to ``width``."""
    shown = [m for m in report.modules if m.depth <= depth and (m.nodes or m.params)]
    timed = bool(report.latency and report.latency.get("end_to_end_ms"))
    total_flops = report.totals.flops or 1
    rows = _tree(shown, report.model)
    columns = [
        _Column("module", [label for label, _ in rows]),
        _Column("type", [m.type for _, m in rows]),
        _Column("category", [m.category or "-" for _, m in rows]),
        _Column("params", [fmt_count(m.params) for _, m in rows], right=True),
        _Column("FLOPs", [fmt_count(m.flops) for _, m in rows], right=True),
        _Column("share", [f"{100 * m.flops / total_flops:.1f}%" for _, m in rows], right=True),
        _Column("MAC", [fmt_bytes(m.mac_bytes) for _, m in rows], right=True),
        _Column("elem ops", [fmt_count(m.elem_ops) for _, m in rows], right=True),
        _Column("FLOPs/B", [f"{m.intensity:.1f}" for _, m in rows], right=True),
        _Column("out shape", [shape_text(m.out_shape) for _, m in rows], right=True),
    ] + ([_Column("ms", [fmt_ms(m.latency_ms) for _, m in rows], right=True)] if timed else [])
    return _fitted_grid(columns, width, _MODULE_SQUEEZE)

def node_table(report: Report, limit: int | None = None, sort: str | None = None, width: int = DEFAULT_WIDTH) -> str:
    """Every node: op, module, category, costs, output shape (optionally the top ``limit`` by ``sort``),
    fitted to ``width``."""
    nodes = list(report.nodes)
    if sort:
        nodes.sort(key=lambda n: getattr(n, sort) or 0, reverse=True)
    if limit:
        nodes = nodes[:limit]
    columns = [
        _Column("node", [n.name for n in nodes]),
        _Column("op", [n.op for n in nodes], seps="._"),
        _Column("module", [n.module or "-" for n in nodes], seps="."),
        _Column("category", [n.category for n in nodes]),
        _Column("params", [fmt_count(n.params) for n in nodes], right=True),
        _Column("FLOPs", [fmt_count(n.flops) for n in nodes], right=True),
        _Column("MAC", [fmt_bytes(n.mac_bytes) for n in nodes], right=True),
        _Column("elem ops", [fmt_count(n.elem_ops) for n in nodes], right=True),
        _Column("FLOPs/B", [f"{n.intensity:.1f}" for n in nodes], right=True),
        _Column("out shape", [shape_text(n.out_shape) for n in nodes], right=True),
    ]
    if report.latency:
        columns += [
            _Column("ms", [fmt_ms(n.latency_ms) for n in nodes], right=True),
            _Column("pred ms", [fmt_ms(n.predicted_ms) for n in nodes], right=True),
            _Column("bound", [n.attrs.get("bound", "-") for n in nodes]),
            _Column("% roof", [f"{100 * n.attrs['achieved']:.0f}%" if "achieved" in n.attrs else "-" for n in nodes],
                    right=True),
        ]
    return _fitted_grid(columns, width, _NODE_SQUEEZE)

def totals_lines(report: Report) -> list[str]:
    """The totals block: params, FLOPs, MAC, element ops, intensity, capture."""
    t = report.totals
    inputs = ", ".join(input_text(i) for i in report.inputs)
    lines = [
        f"model      {report.model}  (capture: {report.capture}, dtype {report.dtype}, input {inputs})",
        f"params     {fmt_count(t.params)} ({t.params:,}; {fmt_bytes(t.param_bytes)})"
        + (f", {fmt_count(t.unused_params)} unused for these inputs" if t.unused_params else "")
        + (f"; {fmt_count(t.active_params)} active per token (k of E experts)" if t.active_params is not None else ""),
        f"FLOPs      {fmt_count(t.flops)} multiply-adds ({t.flops:,})"
        + (f"; executed {fmt_count(t.executed_flops)} ({t.executed_flops:,}: masked attention computes only the "
           "query-key pairs its mask leaves)" if t.executed_flops is not None and t.executed_flops != t.flops else ""),
        f"MAC        {fmt_bytes(t.mac_bytes)} moved ({t.mac_bytes:,} bytes: {fmt_bytes(t.read_bytes)} read, "
        f"{fmt_bytes(t.write_bytes)} written, {fmt_bytes(t.weight_bytes)} of it weights)",
        f"elem ops   {fmt_count(t.elem_ops)} (element-wise, norm, activation, pooling; not in FLOPs)",
        f"intensity  {t.intensity:.1f} FLOPs/byte",
    ]
    deployed = next((f.evidence for f in report.findings if f.rule == "reparameterize"), None)
    if deployed:  # train-time multi-branch blocks: the model as inference runs it
        lines.insert(3, f"deployed   {fmt_count(deployed['as_deployed_flops'])} multiply-adds, "
                        f"{fmt_bytes(deployed['as_deployed_mac_bytes'])} moved once its {deployed['count']} multi-branch "
                        "block(s) are reparameterized into one convolution each (the reparameterize finding)")
    for note in report.capture_notes:
        lines.append(f"note       {note}")
    if report.uncounted:
        lines.append("uncounted  " + ", ".join(f"{op} ×{n}" for op, n in report.uncounted.items())
                     + "  (no FLOP formula; bytes counted)")
    return lines

SOURCE_WIDTH = 48  # the memory line's source: '…/models/llama/modeling_llama.py:175'


def _memory_line(label: str, memory: dict) -> str:
    at, where = memory["at_peak"], memory["peak_at"]
    parts = ", ".join(f"{fmt_bytes(v)} {k.replace('_', ' ')}" for k, v in at.items() if v)
    place = where.get("module") or where.get("node") or "(model)"
    # a library's source shortened as the findings' column shortens it (the JSON keeps the whole path)
    source = f" at {_abbrev(where['source'], SOURCE_WIDTH, '/')}" if where.get("source") else ""
    line = (f"{label}{fmt_bytes(memory['peak_bytes'])} peak ({parts}) in the {where['phase']}, "
            f"{where['op']} of {place}{source}")
    if memory.get("basis_note"):
        line += f"; {memory['basis_note']}"
    if memory.get("unmodelled_scratch"):  # a figure that may be low, said so
        line += ("; ops whose kernel's own scratch is not modelled (the peak may be higher): "
                 + ", ".join(f"{op} ×{n}" for op, n in memory["unmodelled_scratch"].items()))
    cuda = memory.get("cuda")
    if cuda:  # counted as a GPU runs it: the caching allocator's view beside the bytes live
        line += (f"; as {memory['execution']['name']} runs it, CUDA's caching allocator reserves "
                 f"{fmt_bytes(cuda['reserved_peak_bytes'])} (allocated {fmt_bytes(cuda['allocated_peak_bytes'])} "
                 f"+ {fmt_bytes(cuda['library_bytes'])} of library workspaces)")
    return line

def memory_lines(report: Report) -> list[str]:
    """Peak memory by tensor lifetime: the inference forward's, and with --train the step's and
    its phases' multiply-adds."""
    lines = [_memory_line("memory     ", report.memory)] if report.memory else []
    step = report.training_step
    if step:
        options = step["options"]
        lines.append(_memory_line("train mem  ", step["memory"]))
        ratio = step.get("backward_forward_ratio")
        loss = step.get("loss")
        lines.append(f"train step {options['optimizer']} ({options['impl']}"
                     + (f", autocast {options['amp']}" if options["amp"] else "") + ")"
                     + (f", loss {loss['kind']} ({loss['why']}; the output {loss['output']})" if loss else "")
                     + (f", backward/forward {ratio:.2f}" if ratio is not None else ""))
        lines.extend(_phase_table(step))
        why = [("" if w["flops"] < 0 else "+") + fmt_count(w["flops"]) + " "
               + (f"{', '.join(w['modules'][:3])}{' …' if len(w['modules']) > 3 else ''} ({w['reason']})"
                  if w["modules"] else w["reason"])
               for w in step.get("backward_forward_why", [])]
        if why and ratio is not None:
            lines.append("           not 2 × forward: " + "; ".join(why))
        saved = list(step.get("saved_for_backward", {}).items())[:3]
        if saved:
            lines.append("saved      for backward, most by: " + ", ".join(f"{m or '(model)'} {fmt_bytes(b)}" for m, b in saved))
    if report.parallel:
        from .parallel import parallel_lines

        lines += parallel_lines(report.parallel, _memory_line)
    return lines + budget_lines(report.memory or {}) + decode_lines(report)


def decode_lines(report: Report) -> list[str]:
    """--decode: the prefill, the decode step and the KV cache."""
    if not report.phases:
        return []
    kv, lines = report.kv_cache, []
    for name, p in report.phases.items():
        what = (f"{p['tokens']:,} tokens" if name == "prefill"
                else f"{p['tokens']:,} token(s) after {p['context']:,} cached")
        when = (f"; predicted {p['predicted_ms']:.3f} ms"
                + (" to the first token" if name == "prefill" else f", {p['tokens_per_s']:,.1f} tokens/s")
                + (f" as written, {p['served_ms']:.3f} ms" + ("" if name == "prefill" else
                                                               f", {p['served_tokens_per_s']:,.1f} tokens/s")
                   + " as served" if p.get("served_ms") else "")
                + f" on {p['profile']}") if p.get("predicted_ms") is not None else ""
        lines.append(f"{name:<10} {what}: {fmt_count(p['flops'])} multiply-adds"
                     + (f" ({fmt_count(p['executed_flops'])} executed)" if p["executed_flops"] != p["flops"] else "")
                     + f", {fmt_bytes(p['weight_bytes'])} of weights, {fmt_bytes(p['kv_read_bytes'])} KV read, "
                     f"{fmt_bytes(p['kv_written_bytes'])} KV written{when}")
    fixed = kv.get("fixed_bytes_per_sequence", 0)
    held = (f" + {fmt_bytes(fixed)} per sequence that does not grow with the context (a sliding window, a fixed-size "
            "cache)") if fixed and fixed >= kv["bytes_per_token"] else ""
    lines.append(f"kv cache   {fmt_bytes(kv['bytes_per_token'])} per token{held}: {fmt_bytes(kv['bytes'])} for "
                 f"{kv['tokens']:,} tokens x {kv['batch']} (the traced cache's {kv['tensors']} tensors)")
    grid = kv.get("grid") or []
    if grid:
        cells = ", ".join(f"{g['batch']}x{g['context'] // 1024}k {fmt_bytes(g['bytes'])}"
                          + (" (fits)" if g.get("fits") else " (does not fit)" if "fits" in g else "")
                          for g in grid if g["batch"] in (1, 32) and g["context"] in (8192, 131072))
        lines.append(f"kv grid    weights {fmt_bytes(kv['weights_bytes'])} + KV, batch x context: {cells}; "
                     "--json lists all")
    speed = kv.get("speed")
    if speed and speed["cells"]:
        contexts = sorted({g["context"] for g in speed["cells"]})
        shown = {contexts[0], contexts[-1]}  # the shortest and the longest the model takes
        cells = ", ".join(f"{g['batch']}x{g['context'] // 1024}k {_rate(g['tokens_per_s'])} tok/s "
                          + (f"({_rate(g['served_tokens_per_s'])} served) " if g.get("served_tokens_per_s") else "")
                          + f"(first token {_rate(g['ttft_ms'])} ms)"
                          for g in speed["cells"] if g["batch"] in (1, 32) and g["context"] in shown)
        served = " (as written, eager PyTorch; served: the kernels alone)" if any(
            g.get("served_tokens_per_s") for g in speed["cells"]) else ""
        lines.append(f"speed      on {speed['profile']}, batch x context{served}: {cells}; --json lists all")
    elif speed:
        lines.append(f"speed      no grid: {speed['why']}")
    return lines


def _before_after(before: dict, after: dict, key: str, unit: str, rate: bool = False) -> str | None:
    """'8.36 -> 5.39 ms (1.55x)' for one key of the two sides, or None when a side lacks it."""
    a, b = before.get(key), after.get(key)
    if not a or not b:
        return None
    return f"{_rate(a)} -> {_rate(b)} {unit} ({(b / a if rate else a / b):.2f}x)"


def quant_lines(quant: dict | None) -> list[str]:
    """--quant and --kv: the layers quantized and kept, the bytes, the time before and after."""
    if not quant:
        return []
    lines = []
    before, after = quant.get("before", {}), quant.get("after", {})
    if quant.get("scheme"):
        layers = quant["layers"]
        kept = [l for l in layers if "kept" in l]
        lines.append(f"quant      {quant['scheme']} as {quant['device']} stores it ({quant['layout']}): "
                     f"{quant['quantized']} linear layer(s) quantized"
                     + (f" at {quant['bits_per_weight']:.2f} bits per weight" if quant["bits_per_weight"] else "") + ", "
                     f"{len(kept)} kept; parameters {fmt_bytes(before['param_bytes'])} -> {fmt_bytes(after['param_bytes'])}, "
                     f"bytes moved {fmt_bytes(before['mac_bytes'])} -> {fmt_bytes(after['mac_bytes'])}")
        others = quant.get("not_linear") or {}
        if others:
            lines.append("not linear " + ", ".join(f"{name} {fmt_bytes(row['bytes'])}" for name, row in list(others.items())[:4])
                         + (f" (+{len(others) - 4} types)" if len(others) > 4 else "")
                         + " stay as they are: torchao's configs quantize nn.Linear only")
        if kept:
            reasons: dict[str, list[str]] = {}
            for l in kept:
                reasons.setdefault(l["kept"], []).append(l["module"])
            lines.append("kept       " + "; ".join(f"{', '.join(m[:3])}{f' (+{len(m) - 3})' if len(m) > 3 else ''}: {why}"
                                                   for why, m in reasons.items()))
        if quant.get("note"):
            lines.append(f"note       {quant['note']}")
        timed = [t for t in (_before_after(before, after, "served_ms", "ms as served"),
                             _before_after(before, after, "predicted_ms", "ms" + (" as written" if "served_ms" in before else "")))
                 if t]
        if timed:
            lines.append(f"quant time forward {', '.join(timed)}")
    step = quant.get("decode")
    if step:
        b, a = step["before"], step["after"]
        rates = [t for t in (_before_after(b, a, "served_tokens_per_s", "tokens/s as served", rate=True),
                             _before_after(b, a, "tokens_per_s", "tokens/s" + (" as written" if "served_tokens_per_s" in b else ""),
                                           rate=True)) if t]
        lines.append(f"quant step decode after {step['context']:,} cached: weights read {fmt_bytes(b['weight_bytes'])} -> "
                     f"{fmt_bytes(a['weight_bytes'])}, bytes moved {fmt_bytes(b['mac_bytes'])} -> {fmt_bytes(a['mac_bytes'])}"
                     + (f"; {', '.join(rates)}" if rates else ""))
    kv = quant.get("kv")
    if kv:
        lines.append(f"quant kv   {kv['scheme']}: {fmt_bytes(kv['bytes_per_token'])} -> "
                     f"{fmt_bytes(kv['bytes_per_token_after'])} per token ({kv['convention']})")
    return lines


def _rate(value: float | None) -> str:
    """A rate or a time to three significant digits, whole numbers with thousands separators."""
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _apart(a: int, b: int) -> tuple[str, str]:
    """Two byte counts shown with the digits that tell them apart (80 GiB and 80 GiB would not):
    as ``fmt_bytes`` writes them, else in GiB to 5 or 7 significant digits, else exactly."""
    if fmt_bytes(a) != fmt_bytes(b):
        return fmt_bytes(a), fmt_bytes(b)
    for digits in (5, 7):
        text = f"{a / 2**30:.{digits}g} GiB", f"{b / 2**30:.{digits}g} GiB"
        if text[0] != text[1]:
            return text
    return f"{a:,} bytes", f"{b:,} bytes"


def budget_lines(memory: dict) -> list[str]:
    """The memory budget's answers: the largest batch, the checkpointing plan, the what-ifs."""
    budget = memory.get("budget")
    if not budget:
        return []
    what = budget["for"]
    if budget.get("max_batch") is None:
        found = budget.get("reason", "no largest batch")
    elif budget["max_batch"] == 0:
        found = (f"even batch {budget.get('smallest', 1)} does not fit: its {what} peaks at "
                 f"{fmt_bytes(budget['next_peak_bytes'])}")
    else:
        at, nxt = _apart(budget["peak_bytes_at_max"], budget["next_peak_bytes"])
        ran_out = "runs out of memory" in (budget.get("counts") or "")  # on a GPU: the allocator's answer
        found = (f"largest batch {budget['max_batch']:,} ({what} peak {at}; "
                 f"{budget['max_batch'] + 1:,} " + ("runs out of memory" if ran_out else f"needs {nxt}") + "), "
                 + (f"affine in the batch: {fmt_bytes(budget['per_sample_bytes'])} per sample + "
                    f"{fmt_bytes(budget['fixed_bytes'])}" if budget["method"] == "affine"
                    else budget["method"] if ran_out
                    else f"{budget['method']}: {fmt_bytes(budget['per_sample_bytes'])} per sample there")
                 + f"; {budget['runs']} analyses"
                 + (f"; from batch {budget['smallest']} ({budget['smallest_why']})" if budget.get("smallest") else ""))
    lines = [f"budget     {budget['label']}: {found}" + (f"; counted by {budget['counts']}" if budget.get("counts") else "")]
    plan = memory.get("checkpoint_plan")
    if plan:
        if plan["fits"]:
            shown = ", ".join(plan["modules"][:4]) + (f" … ({len(plan['modules'])} modules)" if len(plan["modules"]) > 4 else "")
            lines.append(f"checkpoint {shown}: peak {fmt_bytes(plan['peak_bytes'])} (re-analysed), recompute "
                         f"+{fmt_count(plan['recompute_flops'])} multiply-adds"
                         + ("; with the KV cache off (model.config.use_cache = False: a recompute would fill it again)"
                            if plan.get("cache_off") else "")
                         + "; code in --json (memory.checkpoint_plan.code)")
        else:
            lines.append(f"checkpoint nothing fits {budget['label']}: {plan['reason']}"
                         + (f" (smallest peak {fmt_bytes(plan['smallest_peak_bytes'])})"
                            if plan["smallest_peak_bytes"] is not None else ""))
    ifs = [w for w in memory.get("what_ifs", []) if "peak_delta" in w]
    if ifs:
        def delta(w: dict) -> str:
            sign = "-" if w["peak_delta"] < 0 else "+"
            flops = f", {'+' if w['flops_delta'] > 0 else '-'}{fmt_count(abs(w['flops_delta']))} multiply-adds" if w["flops_delta"] else ""
            unread = " (kernels' scratch not modelled: may be higher)" if w.get("unmodelled_scratch") else ""
            return f"{w['change']} {sign}{fmt_bytes(abs(w['peak_delta']))}{flops}{unread}"
        lines.append("what if    peak " + "; ".join(delta(w) for w in sorted(ifs, key=lambda w: w["peak_delta"])))
    return lines

def _phase_table(step: dict) -> list[str]:
    """The step's multiply-adds and bytes moved per phase, the backward split by gradient."""
    b = step["backward"]
    rows = [(name, p["flops"], p["mac_bytes"]) for name, p in step["phases"].items() if p["ops"]]
    at = next((i for i, r in enumerate(rows) if r[0] == "backward"), None)
    if at is not None:
        rows[at + 1:at + 1] = [("  input gradients", b["input_grad_flops"], b.get("input_grad_bytes", 0)),
                               ("  weight gradients", b["weight_grad_flops"], b.get("weight_grad_bytes", 0))]
    width = max(len(r[0]) for r in rows)
    return [f"           {'phase':<{width}}  {'multiply-adds':>13}  {'bytes moved':>11}"] + [
        f"           {name:<{width}}  {fmt_count(flops):>13}  {fmt_bytes(mac):>11}" for name, flops, mac in rows]

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
        made = prof["created"]
        if lat.get("served_ms") is not None:  # the GPU time model: both predictions, labelled
            bound = "host-bound" if lat["host_ms"] > lat["served_ms"] else "GPU-bound"
            line = (f"predicted  {lat['predicted_ms']:.3f} ms as written (eager PyTorch, {bound}: host "
                    f"{lat['host_ms']:.3f} ms), {lat['served_ms']:.3f} ms as served (kernels alone: a CUDA graph "
                    f"or a compiled model), on {lat['execution_model']} (GPU time model, docs/gpu-time.md)")
        else:
            line = (f"predicted  {lat['predicted_ms']:.3f} ms from the roofline of {prof['name']} "
                    + (f"({made}; efficiencies in docs/measuring.md)" if made.startswith("datasheet")
                       else f"(calibrated {made[:10]})"))
        if lat.get("prediction_error") is not None:
            line += f"; {100 * lat['prediction_error']:+.0f}% against measured"
        lines.append(line)
        timed_step = (report.training_step or {}).get("time")
        if timed_step:
            lines.append(f"step time  {timed_step['predicted_ms']:.3f} ms as written ("
                         + ", ".join(f"{name} {p['predicted_ms']:.3f}" for name, p in timed_step["phases"].items()
                                     if p["predicted_ms"])
                         + f"), {timed_step['served_ms']:.3f} ms as served, on {timed_step['execution_model']}")
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

def findings_table(report: Report, limit: int = 20, width: int = DEFAULT_WIDTH) -> str:
    """Findings, most severe and largest saving first: severity, rule, where, finding, saving, fix.

    Fitted to ``width``: the first layout of ``_FINDING_LAYOUTS`` whose prose columns get at least
    ``_PROSE_MIN`` characters; narrower ones stack the saving and fix under the finding and the
    severity under the rule. Prose wraps at word boundaries; a source ``file:line`` is never split.
    """
    if not report.findings:
        return "findings   none"
    # Identical findings on several layers (say, every depthwise conv) read as one row; JSON keeps each.
    groups: dict[tuple, list] = {}
    for f in report.findings:
        groups.setdefault((f.rule, f.severity, f.message, f.fix), []).append(f)
    rows = []
    for (rule, severity, message, fix), same in list(groups.items())[:limit]:
        first = same[0]
        saving = {k: sum(f.saving.get(k, 0) for f in same) if all(isinstance(f.saving.get(k), (int, float)) for f in same)
                  else v for k, v in first.saving.items()}
        rows.append({"severity": severity, "rule": rule, "module": first.module or "(model)",
                     "like": f"(+{len(same) - 1} like it)" if len(same) > 1 else "", "source": first.source or "",
                     "finding": message, "saving": fmt_saving(saving), "fix": fix})
    table = _findings_grid(rows, width)
    more = len(groups) - limit
    counts = {}
    for f in report.findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    summary = "findings   " + ", ".join(f"{n} {sev}" for sev, n in counts.items())
    return "\n".join([table] + ([f"... and {more} more (--json lists all)"] if more > 0 else []) + [summary])

def render_text(report: Report, depth: int = 2, per_node: bool = False, findings: bool = True,
                width: int = DEFAULT_WIDTH) -> str:
    """The full terminal report, every line fitted to ``width`` columns (``terminal_width()`` in the CLI)."""
    table = node_table(report, width=width) if per_node else module_table(report, depth, width=width)
    parts = [table, "", *_hang(totals_lines(report) + memory_lines(report) + latency_lines(report)
                               + quant_lines(report.quant), width)]
    if findings:
        parts += ["", findings_table(report, width=width)]
    if findings and report.recommendations:
        parts += ["", *recommendation_lines(report, width=width)]
    return "\n".join(parts)

_BASIS = {"measured": "measured", "predicted": "roofline prediction", "mac": "bytes moved; no time estimate",
          "analysed": "peak re-analysed"}

def fmt_recommendation_says(saving: dict, basis: str, verified: bool | None) -> str:
    """'saves 1.200 ms, 19 MiB (measured; verified)', or 'saving not estimated'."""
    text = fmt_recommendation_saving(saving)
    return f"saves {text} ({_BASIS.get(basis, basis)}{'; verified' if verified else ''})" if text else "saving not estimated"

def fmt_recommendation_saving(saving: dict) -> str:
    """{'ms': 1.2, 'mac_bytes': ..., 'kernels': 20} -> '1.200 ms, 19 MiB, 20 kernels'."""
    parts = [f"{saving['ms']:.3f} ms"] if saving.get("ms") else []
    if saving.get("mac_bytes"):
        parts.append(fmt_bytes(saving["mac_bytes"]))
    if saving.get("peak_bytes"):
        parts.append(f"{fmt_bytes(saving['peak_bytes'])} off the peak" if saving["peak_bytes"] > 0
                     else f"{fmt_bytes(-saving['peak_bytes'])} more at the peak")
    for key in ("kernels", "params", "flops"):
        if saving.get(key, 0) > 0:
            parts.append(f"{fmt_count(saving[key])} {key}")
        elif saving.get(key, 0) < 0:
            parts.append(f"costs {fmt_count(-saving[key])} {'multiply-adds' if key == 'flops' else key}")
    return ", ".join(parts)

def recommendation_lines(report: Report, limit: int = 5, width: int = DEFAULT_WIDTH) -> list[str]:
    """The top ``limit`` recommendations, numbered: kind, saving and basis, reason, the command that applies it."""
    recs = report.recommendations
    head = f"recommendations (top {min(limit, len(recs))} of {len(recs)}, by time saved, else bytes; retraining last"
    head += "; --json lists all)" if len(recs) > limit else ")"
    lines = _wrap_prose(head, width)
    for i, r in enumerate(recs[:limit], 1):
        says = fmt_recommendation_says(r.estimated_saving, r.basis, r.verified)
        body = _wrap_prose(f"{r.kind}: {says}. {r.reason}", width - 3)
        lines += [f"{i}. {body[0]}"] + ["   " + line for line in body[1:]]
        for i, code in enumerate(r.apply.split("\n")):  # a recommendation's code may be several lines
            lines += ["   " + line for line in _wrap_prose(("apply: " if i == 0 else "       ") + code, width - 3)]
    return lines

# --- fitting the tables to a width -----------------------------------------------------------------

_GAP = "  "  # between columns

@dataclass(frozen=True)
class _Column:
    """One table column: its header and one cell per row (a cell may hold several lines)."""

    header: str
    cells: list[str]
    right: bool = False     # numbers align right
    seps: str | None = None  # a dotted name, abbreviated from the left before these characters when narrow

# Squeeze steps, tried in order while a table is wider than the terminal: (header, None) leaves the
# column out, (header, n) abbreviates its names to n characters. The order is the columns' importance,
# least first: values that others imply go first (category from type, share from FLOPs, FLOPs/B from
# FLOPs and MAC); the name, FLOPs and the measured ms always stay.
_MODULE_SQUEEZE = (("category", None), ("elem ops", None), ("share", None), ("FLOPs/B", None),
                   ("out shape", None), ("params", None), ("type", None), ("MAC", None))
_NODE_SQUEEZE = (("category", None), ("elem ops", None), ("FLOPs/B", None), ("% roof", None), ("bound", None),
                 ("params", None), ("op", 24), ("module", 24), ("out shape", None), ("pred ms", None),
                 ("op", 16), ("module", 16), ("module", None), ("op", None), ("MAC", None))

# Findings layouts, widest first; each column stacks the fields named, one under the other.
_FINDING_LAYOUTS = (
    (("severity",), ("rule",), ("where",), ("finding",), ("saving",), ("fix",)),
    (("severity",), ("rule",), ("where",), ("finding", "saving", "fix")),
    (("rule", "severity"), ("where",), ("finding", "saving", "fix")),
)
_PROSE = {"finding", "fix"}    # columns that take the width the others leave, wrapped at word boundaries
_PROSE_MIN, _PROSE_MAX, _SAVING_MAX = 40, 60, 16

def _tree(modules: list[ModuleReport], model: str) -> list[tuple[str, ModuleReport]]:
    """Modules in tree order, each with its label: the model's name, then '├─ layer1', '│  └─ 0', ..."""
    paths = {m.path for m in modules}
    children: dict[str | None, list[ModuleReport]] = {}
    for m in modules:  # a module hangs under its nearest ancestor in the table
        parent = next((p for p in reversed(module_and_ancestors(m.path)[:-1]) if p in paths), None) if m.path else None
        children.setdefault(parent, []).append(m)
    rows: list[tuple[str, ModuleReport]] = []

    def walk(m: ModuleReport, label: str, prefix: str) -> None:  # prefix: what the rows below m start with
        rows.append((label, m))
        kids = children.get(m.path, [])
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            name = kid.path[len(m.path) + 1:] if m.path else kid.path
            walk(kid, prefix + ("└─ " if last else "├─ ") + name, prefix + ("   " if last else "│  "))

    for top in children.get(None, []):
        walk(top, top.path, "")
    # the model's name (also in the totals) is shortened to the tree's width: '…/models/net.py:Net'
    width = max([24] + [len(label) for label, m in rows if m.path])
    return [(label if m.path else _abbrev(model, width, "/"), m) for label, m in rows]

def _fitted_grid(columns: list[_Column], width: int, squeeze: tuple) -> str:
    """The table after as many ``squeeze`` steps as it takes to fit ``width``, naming the columns left out."""
    columns = list(columns)
    left_out = []
    for header, cap in squeeze:
        if _grid_width(columns) <= width:
            break
        i = next((i for i, c in enumerate(columns) if c.header == header), None)
        if i is None:
            continue
        if cap is None:
            left_out.append(columns.pop(i).header)
        else:
            columns[i] = replace(columns[i], cells=[_abbrev(cell, cap, columns[i].seps) for cell in columns[i].cells])
    lines = _grid(columns)
    if left_out:
        lines += textwrap.wrap(f"(left out to fit {width} columns: {', '.join(left_out)}; --json has every value)", width)
    return "\n".join(lines)

def _findings_grid(rows: list[dict], width: int) -> str:
    """The findings in the widest of ``_FINDING_LAYOUTS`` whose prose columns still get ``_PROSE_MIN`` characters."""
    where = max(24, min(36, width // 4))
    # the where column is at least as wide as its longest file:line, which is never split
    caps = {"where": max([where] + [len(_abbrev(row["source"], where, "/")) for row in rows]), "saving": _SAVING_MAX}
    for layout in _FINDING_LAYOUTS:
        fixed = {fields: [_finding_cell(row, fields, caps.get(fields[0], width)) for row in rows]
                 for fields in layout if not _PROSE & set(fields)}
        prose = [fields for fields in layout if fields not in fixed]
        fixed_width = sum(_cell_width(fields[0], *cells) for fields, cells in fixed.items())
        left = width - fixed_width - len(_GAP) * (len(layout) - 1)
        prose_width = min(_PROSE_MAX, left // len(prose))
        if prose_width >= _PROSE_MIN:
            break
    prose_width = max(prose_width, 12)  # the narrowest layout takes what is left, however little
    columns = [_Column(fields[0], fixed.get(fields) or [_finding_cell(row, fields, prose_width) for row in rows])
               for fields in layout]
    return "\n".join(_grid(columns))

def _finding_cell(row: dict, fields: tuple[str, ...], width: int) -> str:
    """One findings cell: ``fields`` stacked, each wrapped to ``width``; stacked ones after the first are labelled."""
    lines = []
    for i, field in enumerate(fields):
        text = row.get(field, "")
        if i and field in ("saving", "fix"):  # stacked under the finding: labelled, and left out when empty
            if text in ("", "-"):
                continue
            text = f"{field}: {text}"
        lines += _FIELD_LINES[field](row, text, width)
    return "\n".join(lines)

def _where_lines(row: dict, _text: str, width: int) -> list[str]:
    """Module path (wrapped after dots) with '(+N like it)', then the source 'file:line', whole, shortened from the left."""
    module = " ".join(x for x in (row["module"], row["like"]) if x)
    lines = [module] if len(module) <= width else _wrap_at(row["module"], width, ".") + ([row["like"]] if row["like"] else [])
    return lines + ([_abbrev(row["source"], width, "/")] if row["source"] else [])

_FIELD_LINES = {
    "severity": lambda row, text, width: [text],
    "rule": lambda row, text, width: [text],
    "where": _where_lines,
    "finding": lambda row, text, width: _wrap_prose(text, width),
    "saving": lambda row, text, width: _wrap_at(text, width, ", "),
    "fix": lambda row, text, width: _wrap_prose(text, width),
}

def _grid(columns: list[_Column]) -> list[str]:
    """Aligned rows under the headers and a dashed rule; a cell of several lines makes its row that tall.

    Not tabulate: it strips the tree's leading spaces and pads the headers."""
    widths = [_cell_width(c.header, *c.cells) for c in columns]

    def line(parts: list[str]) -> str:
        return _GAP.join(p.rjust(w) if c.right else p.ljust(w) for p, w, c in zip(parts, widths, columns)).rstrip()

    lines = [line([c.header for c in columns]), line(["-" * w for w in widths])]
    for row in zip(*(c.cells for c in columns)):
        cell_lines = [cell.split("\n") for cell in row]
        for k in range(max(len(cl) for cl in cell_lines)):
            lines.append(line([cl[k] if k < len(cl) else "" for cl in cell_lines]))
    return lines

def _grid_width(columns: list[_Column]) -> int:
    return sum(_cell_width(c.header, *c.cells) for c in columns) + len(_GAP) * (len(columns) - 1)

def _cell_width(*cells: str) -> int:
    return max(len(line) for cell in cells for line in cell.split("\n"))

def _abbrev(text: str, width: int, seps: str | None) -> str:
    """'a/b/c/d.py:12' -> '…/c/d.py:12': the whole trailing parts, split before any of ``seps``, that fit
    ``width``; the last part is never cut."""
    if seps is None or len(text) <= width:
        return text
    *parts, tail = re.split(f"(?=[{re.escape(seps)}])", text)
    for part in reversed(parts):
        if len("…" + part + tail) > width:
            break
        tail = part + tail
    return "…" + tail if parts else text

def _wrap_at(text: str, width: int, sep: str) -> list[str]:
    """Lines of at most ``width`` characters broken only after ``sep``; a longer piece stays whole."""
    *pieces, last = text.split(sep)
    lines = [""]
    for piece in [p + sep for p in pieces] + [last]:
        if lines[-1] and len(lines[-1] + piece.rstrip()) > width:
            lines.append("")
        lines[-1] += piece
    return [line.rstrip() for line in lines]

def _wrap_prose(text: str, width: int) -> list[str]:
    """Words wrapped to ``width``; a word longer than that (a dotted call, a path) is broken after its dots or slashes."""
    lines = [""]
    for word in text.split():
        pieces = _wrap_at(word, width, "/" if "/" in word else ".") if len(word) > width else [word]
        for i, piece in enumerate(pieces):
            glue = " " if lines[-1] and i == 0 else ""  # the pieces of one word join without a space
            if lines[-1] and len(lines[-1] + glue + piece) > width:
                lines.append("")
                glue = ""
            lines[-1] += glue + piece
    return [line for line in lines if line]

_UNIT_SPACE = re.compile(r"(?<=\d) (?=(?:[KMGT]iB|B|ms)\b)")  # between a number and its unit

def _hang(lines: list[str], width: int) -> list[str]:
    """'label      text' lines wrapped at word boundaries, continuation lines under the text."""
    out = []
    for line in lines:
        line = _UNIT_SPACE.sub("\xa0", line)  # '1.32 KiB' stays on one line: textwrap breaks at ASCII spaces only
        out += [part.replace("\xa0", " ") for part in textwrap.wrap(
            line, width, subsequent_indent=" " * 11, break_long_words=False, break_on_hyphens=False)] or [""]
    return out
