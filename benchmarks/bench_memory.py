"""The training step at scale, and against the tool a user would otherwise pick.

1. A Llama-3-70B-shaped decoder's training step at 1x2048 tokens with AdamW (``--train``): the
   whole ``archscan zoo:llama3_70b --train`` process, wall time and peak RSS (target: 15 s, 1.5 GB
   on a 2-core machine).
2. Small models, archscan's step beside torch's ``torch.distributed._tools.MemTracker`` on the
   same fake-tensor step and the CPU allocator's real peak (tests/memory_oracle.py): seconds each
   and the peaks.

    python benchmarks/bench_memory.py [--skip-scale] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def scale(runs: int) -> None:
    cmd = [sys.executable, "-c", "import sys; from archscan.cli import main; raise SystemExit(main(sys.argv[1:]))",
           "zoo:llama3_70b", "--input", "1,2048:int64", "--train", "--optimizer", "adamw", "--json"]
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        walls.append(time.perf_counter() - start)
        if out.returncode != 0:
            raise SystemExit(out.stderr)
    rss = [resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024]  # the largest child so far (KiB on Linux)
    import json

    data = json.loads(out.stdout)["training"]
    print(f"llama3_70b 1x2048 AdamW step: wall median {statistics.median(walls):.1f} s (min {min(walls):.1f}, "
          f"max {max(walls):.1f}), peak RSS {max(rss):.0f} MiB (runs: {runs})")
    mem = data["memory"]
    print(f"  peak {mem['peak_bytes'] / 2**30:.1f} GiB in the {mem['peak_at']['phase']} ({mem['peak_at']['op']} of "
          f"{mem['peak_at']['module']}); at the peak: "
          + ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in mem["at_peak"].items() if v))
    print(f"  multiply-adds: forward {data['phases']['forward']['flops']:.3e}, backward "
          f"{data['phases']['backward']['flops']:.3e} (ratio {data['backward_forward_ratio']:.2f})")


def small() -> None:
    import torch

    from archscan import zoo
    from archscan.load.targets import InputSpec, ModelTarget
    from archscan.memory.train import TrainOptions, train_step
    from memory_oracle import step_peak

    for name, spec in (("resnet18", (4, 3, 64, 64)), ("mobilenet_v2", (4, 3, 64, 64)), ("vit_tiny", (1, 3, 224, 224))):
        torch.manual_seed(0)
        want = step_peak(zoo.create_model(name), [torch.randn(spec)], "adamw")
        start = time.perf_counter()
        got = train_step(ModelTarget(name, None, instance=zoo.create_model(name)), [InputSpec(spec)], TrainOptions())
        ours = time.perf_counter() - start
        theirs, their_peak = _memtracker(name, spec)
        print(f"{name:13s} allocator {want / 2**20:8.2f} MiB | archscan {got['memory']['peak_bytes'] / 2**20:8.2f} MiB "
              f"in {ours:.2f} s | MemTracker {their_peak / 2**20 if their_peak else float('nan'):8.2f} MiB "
              f"in {theirs:.2f} s" if theirs is not None else "| MemTracker: not available")


def _memtracker(name: str, spec) -> tuple[float | None, int | None]:
    """torch's own tracker on the same fake-tensor step (AdamW), or (None, None) where it is missing."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from archscan import zoo

    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except Exception:
        return None, None
    with FakeTensorMode():
        model = zoo.create_model(name)
        x = torch.randn(spec)
        opt = torch.optim.AdamW(model.parameters())
        start = time.perf_counter()
        model(x).sum().backward()  # the optimizer's state exists after this step
        opt.step()
        opt.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        peak = max(tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {}).get("Total", 0), 0)
        return time.perf_counter() - start, peak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    small()
    if not args.skip_scale:
        scale(args.runs)


if __name__ == "__main__":
    main()
