"""Extract every CUDA reduction op that allocated, with its allocations, from the H200 traces in
tests/gpu_truth (mem_*/trace.json.gz) into tests/gpu_truth/reductions.json, the table
tests/test_cuda_reduction.py checks ``archscan.memory.reduction`` against.

Each ``[memory]`` allocation on the GPU (Device Type 1, Bytes > 0) belongs to the innermost CPU op
on its thread whose span holds it. A reduction op's first allocation is its result; what follows is
the kernel's scratch (staging buffer, then semaphores). Identical cases (same trace, op, input,
dims and recorded blocks) are listed once with their count.

    python benchmarks/extract_reductions.py            # rewrites tests/gpu_truth/reductions.json
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
from collections import Counter, defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUTH = os.path.join(ROOT, "tests", "gpu_truth")

# the aten ops whose CUDA kernels run gpu_reduce_kernel (archscan.memory.reduction.OPS)
REDUCTIONS = {"aten::sum", "aten::mean", "aten::nansum", "aten::prod", "aten::amax", "aten::amin",
              "aten::var", "aten::std", "aten::all", "aten::any"}
# the profiler's "Input type" strings, as torch dtype names
DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
          "bool": "bool", "long int": "int64", "int": "int32"}
# ScalarType codes a recorded ``dtype=`` argument carries
SCALAR_TYPES = {"5": "float16", "6": "float32", "7": "float64", "15": "bfloat16", "4": "int64", "11": "bool"}


def _result_dtype(op: str, in_dtype: str, dtype_arg: str) -> str:
    if op in ("all", "any"):
        return "bool"
    if dtype_arg:
        return SCALAR_TYPES[dtype_arg]
    if op in ("sum", "prod", "nansum") and in_dtype in ("bool", "int32", "int64"):
        return "int64"
    return in_dtype


def _case(op_event: dict) -> dict | None:
    """The op's input, reduced dims and dtypes, or None where the trace did not record them."""
    a = op_event["args"]
    op = op_event["name"].removeprefix("aten::")
    shape, strides = a["Input Dims"][0], a["Input Strides"][0]
    in_dtype = DTYPES[a["Input type"][0]]
    concrete = a.get("Concrete Inputs", [])
    if len(a["Input Dims"]) == 1:            # sum(x), all(x): every dim
        dims, keepdim, dtype_arg = [], False, ""
    elif len(concrete) >= 3 and concrete[1].startswith("["):
        dims, keepdim = json.loads(concrete[1]), concrete[2] == "True"
        dtype_arg = concrete[3] if len(concrete) > 3 else ""
    else:
        return None
    return {"op": op, "shape": shape, "strides": strides, "dims": dims, "keepdim": keepdim,
            "in_dtype": in_dtype, "out_dtype": _result_dtype(op, in_dtype, dtype_arg)}


def extract(path: str, skipped: Counter) -> list[dict]:
    """The reduction ops of one trace that allocated on the GPU, each with its blocks in order."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    ops_by_tid = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op":
            ops_by_tid[e["tid"]].append(e)
    blocks = defaultdict(list)      # id(op event) -> bytes of each allocation, in time order
    allocs = [e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1
              and e["args"]["Bytes"] > 0]
    for m in sorted(allocs, key=lambda e: e["ts"]):
        around = [o for o in ops_by_tid[m["tid"]] if o["ts"] <= m["ts"] <= o["ts"] + o["dur"]]
        if around:
            inner = max(around, key=lambda o: (o["ts"], -o["dur"]))
            blocks[id(inner)].append(m["args"]["Bytes"])
    out = []
    for ops in ops_by_tid.values():
        for o in ops:
            if o["name"] not in REDUCTIONS or id(o) not in blocks:
                continue
            case = _case(o)
            if case is None:
                skipped[o["name"]] += 1
                continue
            recorded = blocks[id(o)]
            out.append({**case, "result": recorded[0], "scratch": recorded[1:]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(TRUTH, "reductions.json"))
    args = parser.parse_args()
    skipped: Counter = Counter()
    counts: Counter = Counter()
    for path in sorted(glob.glob(os.path.join(TRUTH, "mem_*", "trace.json.gz"))):
        trace = os.path.basename(os.path.dirname(path))
        for case in extract(path, skipped):
            counts[json.dumps({"trace": trace, **case})] += 1
    cases = [{**json.loads(key), "count": n} for key, n in counts.items()]
    cases.sort(key=lambda c: (c["trace"], c["op"], c["shape"], c["dims"], c["scratch"]))
    with open(args.out, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(c) for c in cases) + "\n]\n")
    print(f"{len(cases)} cases ({sum(counts.values())} ops) -> {os.path.relpath(args.out, ROOT)}")
    if skipped:
        print("skipped, arguments not recorded:", dict(skipped))


if __name__ == "__main__":
    main()
