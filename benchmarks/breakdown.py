"""Where a whole `archscan zoo:NAME --json` process spends its time, stage by stage.

The process runs as the console command does (``archscan.cli.entry``: the garbage collector off,
``torch._dynamo`` kept unloaded). Each stage's function is wrapped with a wall clock (the CPU's
with ``BREAKDOWN_CPU=1``), and every moment is given to the innermost
stage running then (so the stages add up to the whole process, imports included; the
recommendations' own captures of cut copies count as recommendations). One process per model,
run ``--runs`` times; the median of each stage.

    python benchmarks/breakdown.py [--runs 5] [--models resnet50,mobilenet_v2,vit_b_16]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

CLOCK = time.process_time if os.environ.get("BREAKDOWN_CPU") else time.perf_counter
START = CLOCK()

# stage -> (module, attribute): the innermost running stage gets the time
STAGES = [
    ("build on meta", "archscan.load.building", "with_build"),
    ("capture", "archscan.capture", "capture"),
    ("memory forward", "archscan.memory", "forward_memory"),
    ("report", "archscan.analysis", "build_report"),
    ("rules", "archscan.analysis", "check_rules"),
    ("recommendations", "archscan.recommend", "recommend"),
    ("JSON", "archscan.results", "Report.to_json"),
    ("JSON text", "archscan.cli", "report_json_text"),
]


def one(name: str) -> dict:
    """This process: the stages of one scan, in seconds."""
    import importlib

    import torch  # noqa: F401  (the floor: what every torch program pays)

    imported_torch = CLOCK()
    from archscan.cli import main

    spent: dict[str, float] = {}
    stack: list[list] = []  # [stage, start]

    def wrap(stage, fn):
        def timed(*args, **kwargs):
            if any(s == "recommendations" for s, _ in stack):  # its own captures of cut copies are its time
                return fn(*args, **kwargs)
            now = CLOCK()
            if stack:
                spent[stack[-1][0]] = spent.get(stack[-1][0], 0.0) + now - stack[-1][1]
            stack.append([stage, now])
            try:
                return fn(*args, **kwargs)
            finally:
                done = CLOCK()
                stage_, start = stack.pop()
                spent[stage_] = spent.get(stage_, 0.0) + done - start
                if stack:
                    stack[-1][1] = done
        return timed

    for stage, module, attr in STAGES:
        owner = importlib.import_module(module)
        path = attr.split(".")
        for part in path[:-1]:
            owner = getattr(owner, part)
        setattr(owner, path[-1], wrap(stage, getattr(owner, path[-1])))
    # the names the orchestrator and the CLI imported before the wrapping
    import archscan.analysis as analysis
    import archscan.api as api
    import archscan.cli as cli

    api.with_build = sys.modules["archscan.load.building"].with_build
    api.check_rules = analysis.check_rules
    api._recommend = sys.modules["archscan.recommend"].recommend
    analysis.capture = sys.modules["archscan.capture"].capture
    analysis.forward_memory = sys.modules["archscan.memory"].forward_memory
    cli.report_json_text = cli.report_json_text
    cli._CONSOLE = True  # as the console command runs (``cli.entry``): torch._dynamo kept unloaded, no collector
    gc.disable()
    before_scan = CLOCK()
    devnull = open(os.devnull, "w")
    stdout, sys.stdout = sys.stdout, devnull
    try:
        main([f"zoo:{name}", "--json"])
    finally:
        sys.stdout = stdout
    end = CLOCK()
    staged = sum(spent.values())
    return {"import torch": imported_torch - START, "other imports": before_scan - imported_torch,
            **spent, "the rest of the scan": end - before_scan - staged}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--models", default="resnet50,mobilenet_v2,vit_b_16")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    load = os.getloadavg()[0]
    print(f"# seconds per stage, median of {args.runs} fresh processes; load average {load:.2f}")
    rows = {}
    for name in args.models.split(","):
        runs = [json.loads(subprocess.run([sys.executable, __file__, "--one", name], check=True, capture_output=True,
                                          text=True).stdout.strip().splitlines()[-1]) for _ in range(args.runs)]
        rows[name] = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]}
    stages = list(next(iter(rows.values())))
    print("| stage | " + " | ".join(rows) + " |")
    print("|---|" + "---|" * len(rows))
    for stage in stages:
        print(f"| {stage} | " + " | ".join(f"{rows[m].get(stage, 0.0):.3f}" for m in rows) + " |")
    print("| **total** | " + " | ".join(f"{sum(rows[m].values()):.3f}" for m in rows) + " |")


if __name__ == "__main__":
    main()
