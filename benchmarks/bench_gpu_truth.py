"""archscan's GPU memory model against the GPU truth of tests/gpu_truth, on the CPU: per recorded
configuration, archscan's peak (bytes live), the simulated caching allocator's allocated and
reserved peaks, beside what the GPU's allocator recorded; then the largest batches for a budget.

    python benchmarks/bench_gpu_truth.py [--torchvision] [--markdown]

The GPU's own peak is ``allocated_bytes.all.peak`` less what was resident before the run plus the
run's own tensors (``own_bytes``), which is what archscan counts (tests/test_gpu_memory.py). With
``--torchvision`` the held-out torchvision models (ConvNeXt-T, EfficientNet-B0, Swin-T) are
analysed too: torchvision must import (it does not beside the CPU build of torch from PyPI).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu_truth"))

TORCHVISION = {  # held-out torchvision configurations: id -> (factory, input, training step)
    "mem_convnext_tiny_train_b32": ("convnext_tiny", "32,3,224,224", True),
    "mem_efficientnet_b0_fwd_b256": ("efficientnet_b0", "256,3,224,224", False),
    "mem_efficientnet_b0_train_b64": ("efficientnet_b0", "64,3,224,224", True),
    "mem_swin_t_train_b16": ("swin_t", "16,3,224,224", True),
}
TORCHVISION_BATCH = {"maxbatch_convnext_tiny_train_12gib": ("convnext_tiny", "1,3,224,224", True),
                     "maxbatch_efficientnet_b0_fwd_24gib": ("efficientnet_b0", "1,3,224,224", False)}


def truth(folder: str) -> dict:
    with open(os.path.join(ROOT, "tests", "gpu_truth", folder, "summary.jsonl")) as fh:
        return {r["id"]: r for r in map(json.loads, fh)}


def torchvision_target(name: str) -> str:
    """A model file of one torchvision factory, for archscan to load."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "archscan_torchvision_models.py")
    with open(path, "w") as fh:
        fh.write("".join(f"def {n}():\n    import torchvision\n    return torchvision.models.{n}()\n\n"
                         for n in ("convnext_tiny", "efficientnet_b0", "swin_t")))
    return f"{path}:{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchvision", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    os.chdir(ROOT)
    import archscan
    import models
    from archscan.memory.train import TrainOptions

    cases = [(cid, "", "h200", c) for cid, c in models.MEMORY_CASES.items()]
    cases += [(cid, models.HELDOUT, "h100", c) for cid, c in models.HELDOUT_MEMORY_CASES.items()]
    if args.torchvision:
        cases += [(cid, models.HELDOUT, "h100", (torchvision_target(f), inp, None, None, train))
                  for cid, (f, inp, train) in TORCHVISION.items()]
    rows = ["| configuration | GPU | set | archscan peak / GPU | simulated allocated / GPU | simulated reserved / GPU "
            "reserved | s |", "|---|---|---|---|---|---|---|"]
    for cid, folder, gpu_name, (target, inp, dtype, amp, train) in cases:
        record = truth(folder)[cid]
        t0 = time.perf_counter()
        report = archscan.scan(target, inp, dtype=dtype, rules=[], recommend=False, execution=gpu_name,
                               train=TrainOptions(amp=amp) if train else None)
        memory = report.training_step["memory"] if train else report.memory
        own = record["stats"]["allocated_bytes.all.peak"] - record["resident_bytes"] + record["own_bytes"]
        reserved = record["stats"]["reserved_bytes.all.peak"]
        gib = 1 << 30
        rows.append(f"| {cid} | {gpu_name} | {'held out' if folder else 'recorded'} | "
                    f"{memory['peak_bytes'] / gib:.3f} / {own / gib:.3f} GiB ({memory['peak_bytes'] / own:.3f}) | "
                    f"{memory['cuda']['allocated_peak_bytes'] / own:.3f} | "
                    f"{memory['cuda']['reserved_peak_bytes'] / gib:.2f} / {reserved / gib:.2f} GiB "
                    f"({memory['cuda']['reserved_peak_bytes'] / reserved:.3f}) | {time.perf_counter() - t0:.1f} |")
        print(rows[-1], flush=True)
    batches = {cid: (t, inp, train) for cid, (t, inp, train) in models.HELDOUT_BATCH_CASES.items()}
    if args.torchvision:
        batches.update({cid: (torchvision_target(f), inp, train) for cid, (f, inp, train) in TORCHVISION_BATCH.items()})
    rows += ["", "| budget search | budget | archscan (reserved, h100) | archscan (CPU model) | true largest | "
             "smallest that ran out |", "|---|---|---|---|---|---|"]
    for cid, (target, inp, train) in batches.items():
        record = truth(models.HELDOUT)[cid]
        found = {ex: archscan.scan(target, inp, rules=[], recommend=False, execution=ex, memory=record["budget_bytes"],
                                   train=TrainOptions() if train else None).memory["budget"]["max_batch"]
                 for ex in ("h100", "cpu")}
        rows.append(f"| {cid} | {record['budget_bytes'] / (1 << 30):g} GiB | {found['h100']} | {found['cpu']} | "
                    f"{record['largest']} | {record['smallest_oom']} |")
        print(rows[-1], flush=True)
    if args.markdown:
        print("\n".join(rows))


if __name__ == "__main__":
    main()
