"""The parallel step (archscan.parallel) beside its oracle, and at scale.

    python benchmarks/bench_parallel.py            # rank peaks beside the real-tensor run (tests/parallel_oracle.py)
    python benchmarks/bench_parallel.py --scale    # Llama-3-70B-shaped, fsdp=8,tp=8, 1×8192 tokens per rank:
                                                   # the step's seconds and the process's peak RSS, in a fresh process

Markdown tables on stdout, for docs/parallel.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def oracle_table() -> None:
    from archscan.load.targets import parse_input_spec, to_target
    from archscan.memory.train import TrainOptions
    from archscan.parallel import ParallelSpec, run
    from archscan.units import fmt_bytes
    from parallel_oracle import rank_peak
    from test_parallel import CASES

    print("| model | --parallel | micro-batch | archscan (fake tensors) | real tensors, fake group | ratio | archscan s |")
    print("|---|---|---|---|---|---|---|")
    for target, kwargs, spec, shape in CASES:
        t0 = time.perf_counter()
        ours = run(to_target(target), [parse_input_spec(shape)], TrainOptions(), ParallelSpec.parse(spec),
                   kwargs=kwargs)["memory"]["peak_bytes"]
        took = time.perf_counter() - t0
        truth, _ = rank_peak(to_target(target), [parse_input_spec(shape)], ParallelSpec.parse(spec), kwargs)
        name = target.rsplit(":", 1)[-1] + (f" {kwargs}" if kwargs else "")
        print(f"| {name} | `{spec}` | {shape} | {ours:,} ({fmt_bytes(ours)}) | {truth:,} | {ours / truth:.4f} | {took:.1f} |")


def scale(spec: str, shape: str) -> None:
    """One step in this process (run it in a fresh one: the RSS is the whole process's)."""
    t0 = time.perf_counter()
    from archscan.load.targets import parse_input_spec, to_target
    from archscan.memory.train import TrainOptions
    from archscan.parallel import ParallelSpec, run
    from archscan.units import fmt_bytes

    imported = time.perf_counter() - t0
    section = run(to_target("zoo:llama3_70b"), [parse_input_spec(shape)], TrainOptions(), ParallelSpec.parse(spec))
    took = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    memory = section["memory"]
    calls = sum(r["count"] for r in section["collectives"])
    print(f"| llama3_70b | `{spec}` | {shape} | {took:.1f} s ({imported:.1f} s imports) | {fmt_bytes(rss)} | "
          f"{fmt_bytes(memory['peak_bytes'])} in the {memory['peak_at']['phase']} | {calls:,} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", action="store_true")
    parser.add_argument("--one", nargs=2, metavar=("SPEC", "SHAPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        scale(*args.one)
    elif args.scale:
        print("| model | --parallel | per rank | the step (whole process) | peak RSS | rank 0's peak | collectives |")
        print("|---|---|---|---|---|---|---|")
        for spec, shape in (("fsdp=8,tp=8", "1,8192:int64"), ("fsdp=64", "1,8192:int64")):
            subprocess.run([sys.executable, __file__, "--one", spec, shape], check=True,
                           stderr=subprocess.DEVNULL)
    else:
        oracle_table()


if __name__ == "__main__":
    main()
