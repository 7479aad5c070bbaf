"""Whole processes, as a user waits for them: `archscan zoo:NAME --json` against fvcore's
FlopCountAnalysis script and torch's FlopCounterMode on meta tensors, each a fresh process.

The commands run interleaved (A B C A B C ...) so drift of the machine lands on all of them;
each figure is the median of ``--runs`` wall-clock times, and the ratios are archscan's median
over the other tool's. The floor, `python -c "import torch"`, runs among them and archscan's
ratio to it is printed too: a slow hour (a slow disk, a loaded machine) makes every process pay
a large fixed cost, which flatters the ratios to the other tools but not the one to the floor.
The machine's load average is printed before and after. A second table gives the same
processes' CPU seconds (user + system, from ``getrusage``): a disk that keeps a process waiting
adds to its wall time, not to its CPU time, so that table holds in a slow hour too.

Every command runs with Python's default bytecode cache (``PYTHONDONTWRITEBYTECODE`` removed
from its environment) after one warm-up run, as on a user's machine: a ``pip install`` compiles
the installed packages, and an editable install writes its caches on the first run. Where the
variable is set, Python compiles archscan's modules (and the zoo's) from source in every
process, about 0.1 s: ``--keep-env`` measures that.

    python benchmarks/bench_startup.py [--runs 5] [--models resnet50,mobilenet_v2,vit_b_16]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FVCORE = """
import sys, torch
from fvcore.nn import FlopCountAnalysis
from archscan import zoo
model = zoo.create_model(sys.argv[1]).eval()
with torch.no_grad():
    print(FlopCountAnalysis(model, torch.randn(1, 3, 224, 224)).unsupported_ops_warnings(False).total())
"""

FLOP_COUNTER = """
import sys, torch
from torch.utils.flop_counter import FlopCounterMode
from archscan import zoo
with torch.device("meta"):
    model = zoo.create_model(sys.argv[1]).eval()
    x = torch.randn(1, 3, 224, 224)
with FlopCounterMode(display=False) as counter, torch.no_grad():
    model(x)
print(counter.get_total_flops() // 2)
"""


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wall(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one process."""
    start, cpu = time.perf_counter(), _children_cpu()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=ENV)
    return time.perf_counter() - start, _children_cpu() - cpu


def row(name: str, med: dict) -> str:
    return (f"{name} | {med['floor']:.2f} | {med['archscan']:.2f} | {med['fvcore']:.2f} | {med['counter']:.2f} | "
            f"{med['archscan'] / med['floor']:.2f}x | {med['archscan'] / med['fvcore']:.2f}x | "
            f"{med['archscan'] / med['counter']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--models", default="resnet50,mobilenet_v2,vit_b_16")
    parser.add_argument("--keep-env", action="store_true", help="keep PYTHONDONTWRITEBYTECODE if it is set")
    args = parser.parse_args()
    if args.keep_env:
        ENV.update(os.environ)
    archscan = shutil.which("archscan") or os.path.join(os.path.dirname(sys.executable), "archscan")
    floor = [sys.executable, "-c", "import torch"]
    cache = "off (PYTHONDONTWRITEBYTECODE)" if ENV.get("PYTHONDONTWRITEBYTECODE") else "on"
    print(f"# whole processes, median of {args.runs} interleaved runs (wall s); python {sys.version.split()[0]}; "
          f"bytecode cache {cache}; load average {os.getloadavg()[0]:.2f} (1 min) before")
    header = ("model | import torch | archscan | fvcore | FlopCounterMode (meta) | archscan / import torch | "
              "archscan / fvcore | archscan / FlopCounterMode\n" + "|".join(["---"] * 8))
    print(header)
    cpu_rows = []
    for name in args.models.split(","):
        commands = {
            "floor": floor,
            "archscan": [archscan, f"zoo:{name}", "--json"],
            "fvcore": [sys.executable, "-c", FVCORE, name],
            "counter": [sys.executable, "-c", FLOP_COUNTER, name],
        }
        for cmd in commands.values():  # warm the page cache
            wall(cmd)
        times: dict[str, list[float]] = {k: [] for k in commands}
        cpu: dict[str, list[float]] = {k: [] for k in commands}
        for _ in range(args.runs):
            for key, cmd in commands.items():
                w, c = wall(cmd)
                times[key].append(w)
                cpu[key].append(c)
        print(row(name, {k: statistics.median(v) for k, v in times.items()}))
        cpu_rows.append(row(name, {k: statistics.median(v) for k, v in cpu.items()}))
        sys.stdout.flush()
    print(f"# load average {os.getloadavg()[0]:.2f} (1 min) after")
    print(f"# the same processes' CPU seconds (user + system), median of {args.runs}")
    print(header)
    print("\n".join(cpu_rows))


if __name__ == "__main__":
    main()
