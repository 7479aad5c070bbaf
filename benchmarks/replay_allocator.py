"""The CUDA caching allocator simulator (``archscan.memory.allocator``) against an H200's recorded
runs (``tests/gpu_truth``): each memory configuration's measured run replayed from its start, the
peaks recorded beside the simulated ones, and how long the simulator takes.

For each configuration the start is the recorded snapshot rolled back to the resident blocks, in
the segments that hold one (the measured run began right after ``torch.cuda.empty_cache()``), and
the requests are the recorded trace's (``from_snapshot``). "rounded sum" is what counting blocks
as requests rounded to 512 bytes gives, without the allocator's whole unsplit blocks;
"expandable" is the simulator's reserved peak for the same requests under
``expandable_segments:True`` (a prediction: no run recorded it).

    python benchmarks/replay_allocator.py [--truth tests/gpu_truth] [--repeat 7]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

from tabulate import tabulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from archscan.memory.allocator import from_snapshot, rounded_sum_peak, simulate  # noqa: E402

KEYS = ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "segment.all.peak")



def fastest(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--truth", default=os.path.join(ROOT, "tests", "gpu_truth"))
    parser.add_argument("--repeat", type=int, default=7, help="timings: the fastest of this many runs")
    args = parser.parse_args()
    with open(os.path.join(args.truth, "summary.jsonl"), encoding="utf-8") as fh:
        records = {r["id"]: r for r in map(json.loads, fh)}
    env = records["env"]
    rows, traces = [], {}
    for name in sorted(n for n in records if n.startswith("mem_")):
        with gzip.open(os.path.join(args.truth, name, "snapshot.json.gz"), "rt", encoding="utf-8") as fh:
            initial, events = from_snapshot(json.load(fh))
        traces[name] = (initial, events)
        measured, replay = records[name]["stats"], simulate(events, initial=initial).stats
        rows.append([name.removeprefix("mem_"), f"{len(events):,}",
                     mib(measured[KEYS[0]]), mib(replay[KEYS[0]]), f"{replay[KEYS[0]] - measured[KEYS[0]]:+,}",
                     mib(measured[KEYS[1]]), mib(replay[KEYS[1]]), f"{replay[KEYS[1]] - measured[KEYS[1]]:+,}",
                     mib(rounded_sum_peak(events, initial)),
                     f"{measured[KEYS[2]]} / {replay[KEYS[2]]}",
                     mib(simulate(events, initial=initial, expandable_segments=True).stats[KEYS[0]])])
    print(f"{env['device']}, torch {env['torch']}, recorded {env['date'][:10]}; bytes in MiB, differences in bytes\n")
    print(tabulate(rows, headers=["configuration", "events", "reserved: GPU", "simulated", "difference",
                                  "allocated: GPU", "simulated", "difference", "rounded sum", "segments: GPU / sim.",
                                  "expandable"],
                   tablefmt="github", disable_numparse=True))

    largest = max(traces, key=lambda n: len(traces[n][1]))
    initial, events = traces[largest]
    seconds = fastest(lambda: simulate(events, initial=initial), args.repeat)
    print(f"\nthe largest trace ({largest}, {len(events):,} events): {seconds * 1e3:.1f} ms "
          f"(fastest of {args.repeat}, CPU time)")
    steps = -(-100_000 // len(events))  # the same step again and again, fresh keys each time
    many = [(op, step << 48 | key & ((1 << 48) - 1), size) for step in range(steps) for op, key, size in events]
    seconds = fastest(lambda: simulate(many, initial=initial), args.repeat)
    print(f"{steps} of its steps back to back, {len(many):,} events: {seconds:.3f} s "
          f"({seconds / len(many) * 1e6:.2f} µs an event)")


if __name__ == "__main__":
    main()
