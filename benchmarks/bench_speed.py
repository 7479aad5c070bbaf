"""Analysis speed: archscan against fvcore and torch's FlopCounterMode, side by side.

Each tool answers "how many multiply-adds, per layer" for the same model and input, in one
process, best of N runs. archscan builds the model on fake tensors and computes nothing;
fvcore needs real weights and a real (jit-traced) forward; FlopCounterMode runs a real forward
(its FLOPs only, no bytes, no graph).

    python benchmarks/bench_speed.py [--repeat 3] [--models resnet50,mobilenet_v2,vit_b_16]
    python benchmarks/bench_speed.py --scale      # llama3_70b at 1x2048 tokens, in a fresh process
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import time
import warnings

import torch

import archscan
from archscan import zoo


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def run_archscan(name: str) -> None:
    archscan.scan(f"zoo:{name}", [(1, 3, 224, 224)], recommend=False)  # the analysis fvcore does: no variants


def run_fvcore(name: str) -> None:
    from fvcore.nn import FlopCountAnalysis

    model = zoo.create_model(name).eval()  # fvcore needs real weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = FlopCountAnalysis(model, torch.randn(1, 3, 224, 224))
        analysis.unsupported_ops_warnings(False)
        analysis.uncalled_modules_warnings(False)
        analysis.by_module()


def run_flop_counter(name: str) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    model = zoo.create_model(name).eval()
    with FlopCounterMode(display=False), torch.no_grad():
        model(torch.randn(1, 3, 224, 224))


def speed(models: list[str], repeat: int) -> None:
    logging.disable(logging.WARNING)
    torch.set_num_threads(torch.get_num_threads())
    for name in models:  # warm-up: imports, first-call caches
        run_archscan(name)
    print(f"{'model':<14}{'archscan s':>12}{'fvcore s':>10}{'FlopCounterMode s':>19}{'fvcore/archscan':>17}{'FCM/archscan':>14}")
    for name in models:
        a = best_of(lambda: run_archscan(name), repeat)
        f = best_of(lambda: run_fvcore(name), repeat)
        c = best_of(lambda: run_flop_counter(name), repeat)
        print(f"{name:<14}{a:>12.2f}{f:>10.2f}{c:>19.2f}{f / a:>16.2f}x{c / a:>13.2f}x")
    print(f"(best of {repeat}; {torch.get_num_threads()} CPU threads; torch {torch.__version__})")


def scale_child() -> None:
    t = time.perf_counter()
    report = archscan.scan("zoo:llama3_70b", ["1,2048:int64"])
    seconds = time.perf_counter() - t
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_rss_mib": peak_mib, "params": report.totals.params,
                      "flops": report.totals.flops, "nodes": len(report.nodes)}))


def scale() -> None:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--scale-child"], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t
    data = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"llama3_70b, input 1x2048 int64: {data['params']:,} params, {data['flops']:,} multiply-adds, "
          f"{data['nodes']} nodes")
    print(f"  analysis {data['seconds']:.1f} s (process incl. imports {wall:.1f} s), peak RSS {data['peak_rss_mib']:.0f} MiB")
    print("  fvcore cannot run it: it needs the real 282 GB of fp32 weights and a real forward.")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="resnet50,mobilenet_v2,vit_b_16")
    ap.add_argument("--scale", action="store_true")
    ap.add_argument("--scale-child", action="store_true")
    args = ap.parse_args()
    if args.scale_child:
        scale_child()
    elif args.scale:
        scale()
    else:
        speed(args.models.split(","), args.repeat)
