"""Extract every convolution forward and backward, with the transient bytes it took from the caching
allocator, from the GPU traces in tests/gpu_truth (H200: mem_*/, H100: heldout-*/mem_*/) into
tests/gpu_truth/conv_workspaces.json, the table tests/test_cudnn_workspace.py checks
``archscan.memory.cudnn`` against; ``--replay`` also prints each run's reserved peak replayed with
the rule's workspaces in place of the recorded ones (``reserved_peaks``).

A case is one ``aten::convolution`` (forward) or ``aten::convolution_backward`` op: its input and
weight shapes, the layout torch hands cuDNN (``nhwc`` where the input or the weight is channels-last
strided), stride, padding, dilation, groups, dtype, bias, output mask (backward), and the backend
that ran it (``cudnn`` when an ``aten::cudnn_convolution`` ran under the forward, ``depthwise2d``
for torch's own ``aten::_conv_depthwise2d``; a backward takes its forward's).

Every ``[memory]`` event on the GPU (Device Type 1) inside the op's span on its thread belongs to it.
Allocations the op does not free are its results (forward: the output; backward: grad_input,
grad_weight, grad_bias in that order, grad_weight first in torch's depthwise kernel, the bias
gradient under ``aten::sum``). Allocations it frees
before it returns are transient: those made by the op itself, outside any child op, are cuDNN's
workspace (a backward's before its grad_weight exists belong to the input gradient, the rest to
the weight gradient); those under a child op (a layout copy, the bias gradient's reduction) are
listed apart in ``other``. Sizes are the requests, read from the allocator's own trace
(``snapshot.json.gz``, aligned with the profiler's allocations one to one by address); ``blocks``
keeps the recorded block sizes of the workspaces (a block can exceed its request by up to 1 MiB
when the allocator handed out a cached block whole).

The file holds ``cases`` (identical ones once, with their ``count``) and ``calls``: per run (its
folder under tests/gpu_truth) each workspace slot of its convolutions in order, ``[case index,
slot, ordinal of the result it follows, ordinals of the recorded workspaces]``, the ordinals
counting the run's allocations (``forward`` follows the output, ``input`` grad_input, ``weight``
grad_weight).

    python benchmarks/extract_conv_workspaces.py [--replay]   # rewrites tests/gpu_truth/conv_workspaces.json
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUTH = os.path.join(ROOT, "tests", "gpu_truth")
OUT = os.path.join(TRUTH, "conv_workspaces.json")
FOLDERS = {"H200": TRUTH, "H100": os.path.join(TRUTH, "heldout-h100-2026-11-26")}
# the profiler's "Input type" strings, as torch dtype names
DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16"}
MiB = 1 << 20
BACKENDS = {"aten::cudnn_convolution": "cudnn", "aten::_conv_depthwise2d": "depthwise2d",
            "aten::cudnn_convolution_transpose": "cudnn"}
# the ops between aten::convolution and the kernel's own allocations
PATH = {"aten::_convolution", *BACKENDS}


def _load(path: str) -> tuple[list[dict], list[dict]]:
    """The trace's CPU ops and its GPU memory events in time order, each allocation with its request
    and its ordinal among the run's allocations."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    with gzip.open(path.replace("trace.json.gz", "snapshot.json.gz")) as f:
        snapshot = json.load(f)["device_traces"][0]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    memory = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1),
                    key=lambda e: (e["ts"], e["args"]["Ev Idx"]))
    allocs = [m for m in memory if m["args"]["Bytes"] > 0]
    requests = [t for t in snapshot if t["action"] == "alloc"]
    if [m["args"]["Addr"] for m in allocs] != [t["addr"] for t in requests]:
        raise SystemExit(f"{path}: the profiler's allocations and the snapshot's differ")
    for i, (m, t) in enumerate(zip(allocs, requests)):
        m["request"], m["ordinal"] = t["size"], i
    return ops, memory


def _channels_last(dims: list[int], strides: list[int]) -> bool:
    """c10's is_channels_last_strides_2d: a 4-d tensor whose strides order C, W, H, N innermost first
    (ambiguous ones, such as an N×C×1×1 contiguous tensor, are NCHW)."""
    if len(dims) != 4:
        return False
    smallest = 0
    for d in (1, 3, 2, 0):
        if dims[d] == 0 or strides[d] < smallest or (d == 0 and smallest == strides[1]):
            return False
        smallest = strides[d] * dims[d] if dims[d] > 1 else strides[d]
    return True


def _layout(x: tuple[list[int], list[int]], w: tuple[list[int], list[int]]) -> str:
    """'nhwc' where torch's cudnn_conv_suggest_memory_format picks ChannelsLast (the input or the
    weight is channels-last strided), else 'nchw'."""
    return "nhwc" if _channels_last(*x) or _channels_last(*w) else "nchw"


def _lists(concrete: list[str], first: int) -> tuple:
    """stride, padding, dilation, transposed, groups: the op's arguments from ``first`` on (stride,
    padding, dilation, transposed, output_padding, groups)."""
    stride, padding, dilation = (json.loads(concrete[first + i]) for i in range(3))
    return stride, padding, dilation, concrete[first + 3] == "True", int(concrete[first + 5])


def _inside(op: dict, ops_by_tid: dict, memory_by_tid: dict) -> list[tuple[dict, str]]:
    """The GPU memory events in the op's span, each with the outermost op under it that holds the
    event, '' where none does or only the ops that lead to the backend's kernel (``PATH``)."""
    end = op["ts"] + op["dur"]
    children = [o for o in ops_by_tid[op["tid"]]
                if o is not op and o["name"] not in PATH and op["ts"] <= o["ts"] and o["ts"] + o["dur"] <= end]
    out = []
    for m in memory_by_tid[op["tid"]]:
        if op["ts"] <= m["ts"] <= end:
            around = [o for o in children if o["ts"] <= m["ts"] <= o["ts"] + o["dur"]]
            outer = min(around, key=lambda o: (o["ts"], -o["dur"]))["name"] if around else ""
            out.append((m, outer))
    return out


def _split(events: list[tuple[dict, str]]) -> tuple[list[tuple[dict, str]], list[tuple[dict, str]]]:
    """(kept allocations, transient allocations) in time order; an address can be freed and handed
    out again inside the op."""
    live, transient_ids = {}, set()
    for m, _ in events:
        addr = m["args"]["Addr"]
        if m["args"]["Bytes"] > 0:
            live[addr] = id(m)
        elif addr in live:
            transient_ids.add(live.pop(addr))
    allocs = [(m, child) for m, child in events if m["args"]["Bytes"] > 0]
    return ([e for e in allocs if id(e[0]) not in transient_ids],
            [e for e in allocs if id(e[0]) in transient_ids])


def extract(path: str, gpu: str) -> tuple[list[dict], list[dict]]:
    """The convolution forwards and backwards of one trace, each with its results and transients,
    and where each sits among the trace's allocations: per workspace slot (``forward``, ``input``,
    ``weight``) the ordinal of the result it follows and those of its recorded workspaces."""
    ops, memory = _load(path)
    ops_by_tid, memory_by_tid = defaultdict(list), defaultdict(list)
    for o in ops:
        ops_by_tid[o["tid"]].append(o)
    for m in memory:
        memory_by_tid[m["tid"]].append(m)
    trace = os.path.basename(os.path.dirname(path))
    out, places, backend_of = [], [], {}
    for o in sorted(ops, key=lambda o: o["ts"]):
        a = o["args"]
        if o["name"] not in ("aten::convolution", "aten::convolution_backward"):
            continue
        forward = o["name"] == "aten::convolution"
        dims, strides, types, concrete = a["Input Dims"], a["Input Strides"], a["Input type"], a["Concrete Inputs"]
        x, w = (dims[0], dims[1]) if forward else (dims[1], dims[2])
        x_strides, w_strides = (strides[0], strides[1]) if forward else (strides[1], strides[2])
        stride, padding, dilation, transposed, groups = _lists(concrete, 3 if forward else 4)
        case = {"gpu": gpu, "trace": trace, "pass": "forward" if forward else "backward",
                "x": x, "w": w, "layout": _layout((x, x_strides), (w, w_strides)), "stride": stride,
                "padding": padding, "dilation": dilation, "groups": groups, "transposed": transposed,
                "dtype": DTYPES[types[0]], "bias": bool(dims[2]) if forward else concrete[3] != "[0]"}
        key = json.dumps([x, w, case["layout"], stride, padding, dilation, groups, transposed])
        kept, transient = _split(_inside(o, ops_by_tid, memory_by_tid))
        workspace = [m for m, child in transient if not child]
        if forward:
            end = o["ts"] + o["dur"]
            backend = [BACKENDS[c["name"]] for c in ops_by_tid[o["tid"]]
                       if c["name"] in BACKENDS and o["ts"] <= c["ts"] <= end]
            case["backend"] = backend_of[key] = backend[0] if backend else "other"
            case["output"] = [m["request"] for m, _ in kept]
            case["workspace"] = [m["request"] for m in workspace]
            slots = {"forward": (kept[0][0], workspace)}
        else:
            mask = json.loads(concrete[10].lower())
            case["output_mask"] = mask
            case["backend"] = backend_of.get(key, "unknown")
            grads = [m for m, child in kept if child != "aten::sum"]
            names = [n for n, wanted in zip(("input", "weight"), mask) if wanted]
            if case["backend"] == "depthwise2d":
                names.reverse()                 # torch's depthwise backward makes grad_weight first
            if len(grads) != len(names):
                raise SystemExit(f"{trace}: {len(grads)} gradients for mask {mask} of {x} {w}")
            for name, m in zip(names, grads):
                case[f"grad_{name}"] = m["request"]
            case["grad_bias"] = next((m["request"] for m, child in kept if child == "aten::sum"), None)
            weight_from = grads[-1]["ts"] if mask[1] else float("inf")
            by_slot = {"input": [m for m in workspace if m["ts"] < weight_from],
                       "weight": [m for m in workspace if m["ts"] >= weight_from]}
            case["workspace_input"] = [m["request"] for m in by_slot["input"]]
            case["workspace_weight"] = [m["request"] for m in by_slot["weight"]]
            slots = {name: (m, by_slot[name]) for name, m in zip(names, grads)}
        case["blocks"] = [m["args"]["Bytes"] for m in workspace]
        case["other"] = [[child, m["request"]] for m, child in transient if child]
        out.append(case)
        places.append({slot: (anchor["ordinal"], [m["ordinal"] for m in ws]) for slot, (anchor, ws) in slots.items()})
    return out, places


def rule_workspaces(case: dict) -> dict[str, int]:
    """archscan.memory.cudnn's workspace for each slot of a case."""
    import torch

    from archscan.memory.cudnn import conv_backward_workspaces, conv_workspace

    args = (case["x"], case["w"], case["stride"], case["padding"], case["dilation"], case["groups"],
            getattr(torch, case["dtype"]))
    channels_last = case["layout"] == "nhwc"
    if case["pass"] == "forward":
        return {"forward": conv_workspace(*args, channels_last=channels_last)}
    return dict(zip(("input", "weight"), conv_backward_workspaces(
        *args, backward_mask=case["output_mask"], channels_last=channels_last)))


def reserved_peaks(run: str, cases: list[dict], calls: list[list]) -> tuple[int, int, int]:
    """A run's reserved peak replayed by archscan's allocator from its snapshot
    (``allocator.from_snapshot``): as recorded, without cuDNN's workspaces, and with the rule's in
    their place (each where the recorded one was, or right after the result it follows)."""
    from archscan.memory.allocator import from_snapshot, simulate

    with gzip.open(os.path.join(TRUTH, run, "snapshot.json.gz")) as f:
        initial, events = from_snapshot(json.load(f))
    at = [i for i, e in enumerate(events) if e[0] == "alloc"]        # allocation ordinal -> event
    drop, after = set(), defaultdict(list)                          # events; event -> sizes put after it
    rules = {}
    for case_index, slot, anchor, recorded in calls:
        if case_index not in rules:
            rules[case_index] = rule_workspaces(cases[case_index])
        for ordinal in recorded:
            i = at[ordinal]
            drop.add(i)
            drop.add(next(j for j in range(i + 1, len(events)) if events[j][:2] == ("free", events[i][1])))
        after[at[recorded[0]] if recorded else at[anchor]].append(rules[case_index][slot])
    without, ruled = [], []
    for i, e in enumerate(events):
        if i not in drop:
            without.append(e)
            ruled.append(e)
        for n, size in enumerate(after.get(i, ())):
            ruled += [("alloc", ("cudnn", i, n), size), ("free", ("cudnn", i, n), size)]
    peak = "reserved_bytes.all.peak"
    return (simulate(events, initial=initial).stats[peak], simulate(without, initial=initial).stats[peak],
            simulate(ruled, initial=initial).stats[peak])


def load(path: str = OUT) -> tuple[list[dict], dict[str, list[list]]]:
    """The table's cases and calls (the module's docstring says what they hold)."""
    with open(path) as f:
        table = json.load(f)
    return table["cases"], table["calls"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--replay", action="store_true",
                        help="print each run's reserved peak replayed with, without and with the rule's workspaces")
    args = parser.parse_args()
    cases, index, calls = [], {}, {}
    for gpu, folder in FOLDERS.items():
        for path in sorted(glob.glob(os.path.join(folder, "mem_*", "trace.json.gz"))):
            run = os.path.relpath(os.path.dirname(path), TRUTH)
            found, places = extract(path, gpu)
            for case, place in zip(found, places):
                key = json.dumps(case)
                if key not in index:
                    index[key] = len(cases)
                    cases.append({**case, "count": 0})
                cases[index[key]]["count"] += 1
                calls.setdefault(run, []).extend(
                    [index[key], slot, anchor, recorded] for slot, (anchor, recorded) in place.items())
    with open(args.out, "w") as f:
        f.write('{"cases": [\n' + ",\n".join(json.dumps(c) for c in cases) + '\n],\n"calls": {\n'
                + ",\n".join(f"{json.dumps(run)}: {json.dumps(c)}" for run, c in calls.items()) + "\n}}\n")
    print(f"{len(cases)} cases ({sum(c['count'] for c in cases)} calls) -> {os.path.relpath(args.out, ROOT)}")
    if args.replay:
        sys.path.insert(0, ROOT)
        measured = {}
        for folder in FOLDERS.values():
            with open(os.path.join(folder, "summary.jsonl")) as f:
                for r in map(json.loads, f):
                    measured[os.path.relpath(os.path.join(folder, r["id"]), TRUTH)] = r.get("stats", {})
        print("\nreserved peak, MiB: the GPU's; replayed as recorded, without cuDNN's workspaces, with the rule's")
        for run, run_calls in calls.items():
            recorded, without, ruled = reserved_peaks(run, cases, run_calls)
            gpu = measured[run]["reserved_bytes.all.peak"]
            print(f"{run:55s} {gpu / MiB:8.1f} {recorded / MiB:8.1f} {without / MiB:8.1f} {ruled / MiB:8.1f}"
                  f"  ({(without - gpu) / gpu:+.1%}, {(ruled - gpu) / gpu:+.1%})")


if __name__ == "__main__":
    main()
