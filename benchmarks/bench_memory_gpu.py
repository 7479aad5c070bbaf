"""archscan's peak memory against the CUDA caching allocator's: ``torch.cuda.max_memory_allocated``
over a real inference forward and a real training step (AdamW, torch's foreach implementation,
which is the default on a GPU), float32, on the GPU at hand.

    python benchmarks/bench_memory_gpu.py measure --out DIR    # on the GPU: the allocator's peaks
    python benchmarks/bench_memory_gpu.py report DIR           # anywhere: archscan's beside them

The forward runs under ``torch.no_grad()`` after one warm-up forward, the step after one warm-up
step (so the optimizer's state and the gradients are resident, as archscan counts them), each
with the peak statistics reset just before. ``max_memory_allocated`` counts every live block:
parameters, buffers, inputs, optimizer state, and also what the CUDA libraries take from the
caching allocator (the cuBLAS workspace, cuDNN's convolution workspaces), which archscan's
analysis of the model's own tensors does not; and the allocator rounds each block up to 512 bytes.
``library_bytes`` is what those libraries keep once used, measured before any model and taken
off the allocator's peak in the report; ``resident_bytes`` is what was allocated just before the
measured run, so ``peak - resident`` is what the run itself added (archscan's counterpart: its
peak less the parameters, inputs and optimizer state it counts at the peak).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

# (zoo model, input, whether the training step is measured too)
CASES = [("resnet50", "8,3,224,224", True), ("mobilenet_v2", "8,3,224,224", True),
         ("shufflenet_v2_x1_0", "8,3,224,224", True), ("vit_b_16", "8,3,224,224", True),
         ("llama_tiny", "4,128:int64", True)]
SMALL_CASES = [("resnet18", "2,3,64,64", True), ("llama_tiny", "1,16:int64", True)]
OPTIMIZER, IMPL = "adamw", "foreach"


def _inputs(spec: str, device) -> list:
    from archscan.load.targets import parse_input_spec
    s = parse_input_spec(spec)
    if s.dtype.is_floating_point:
        return [torch.randn(s.shape, device=device, dtype=s.dtype)]
    return [torch.randint(0, 1000, s.shape, device=device, dtype=s.dtype)]


def _forward_peak(model, inputs, device) -> dict:
    model.eval()
    with torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize(device)
        resident = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = model(*inputs)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        del out
    return {"peak_bytes": peak, "resident_bytes": resident}


def _step_peak(model, inputs, device) -> dict:
    from memory_oracle import training_step  # tests/: the step as archscan.memory.train runs it

    model.train()
    step, _, _ = training_step(model, inputs, OPTIMIZER, IMPL, device_type="cuda")
    step()
    torch.cuda.synchronize(device)
    resident = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return {"peak_bytes": torch.cuda.max_memory_allocated(device), "resident_bytes": resident}


def _library_bytes(device) -> int:
    """What the CUDA libraries keep in the caching allocator once used (cuBLAS's and cuBLASLt's
    workspaces), before any model: a float32 matmul, a bf16 one, a convolution and its backward."""
    import torch.nn.functional as F
    a = torch.randn(64, 64, device=device, requires_grad=True)
    (a @ a).sum().backward()
    (a.bfloat16() @ a.bfloat16()).sum()
    x = torch.randn(1, 8, 16, 16, device=device, requires_grad=True)
    F.conv2d(x, torch.randn(8, 8, 3, 3, device=device)).sum().backward()
    del a, x
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def measure(args) -> None:
    from zoo import create_model

    device = torch.device("cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "small": args.small,
              "optimizer": OPTIMIZER, "impl": IMPL, "cudnn_benchmark": torch.backends.cudnn.benchmark, "cases": []}
    result["library_bytes"] = _library_bytes(device)
    torch.manual_seed(0)
    for name, spec, train in (SMALL_CASES if args.small else CASES):
        model = create_model(name).to(device)
        inputs = _inputs(spec, device)
        row = {"model": name, "input": spec, "forward": _forward_peak(model, inputs, device)}
        if train:
            row["train"] = _step_peak(model, inputs, device)
        result["cases"].append(row)
        print(name, spec, {k: v for k, v in row.items() if isinstance(v, dict)}, flush=True)
        (out / "measured.json").write_text(json.dumps(result, indent=1))
        del model, inputs
        torch.cuda.empty_cache()


def report(args) -> None:
    import archscan
    from archscan.memory.train import TrainOptions

    folder = Path(args.dir)
    measured = json.loads((folder / "measured.json").read_text())
    library = measured.get("library_bytes", 0)
    rows = []
    for case in measured["cases"]:
        train = TrainOptions(optimizer=measured["optimizer"], impl=measured["impl"]) if "train" in case else None
        rep = archscan.scan(f"zoo:{case['model']}", case["input"], rules=[], recommend=False, train=train)
        data = rep.to_json()
        phases = [("forward", data["memory"])] + ([("train", data["training"]["memory"])] if train else [])
        for phase, mem in phases:
            real, at = case[phase], mem["at_peak"]
            resident = at["params"] + at["inputs"] + at.get("optimizer_state", 0)
            rows.append({"model": case["model"], "input": case["input"], "phase": phase,
                         "archscan": mem["peak_bytes"], "allocator": real["peak_bytes"] - library,
                         "archscan_added": mem["peak_bytes"] - resident,
                         "allocator_added": real["peak_bytes"] - real["resident_bytes"]})
    (folder / "compared.json").write_text(json.dumps(rows, indent=1))
    mib = 2 ** 20
    lines = [f"Measured on {measured['device']} (torch {measured['torch']}), {measured['date'][:10]}, float32, "
             f"AdamW ({measured['impl']}); archscan's peaks on fake tensors (torch {torch.__version__}). The CUDA "
             f"libraries' workspaces ({library / mib:,.1f} MiB, measured before any model) are taken off the "
             "allocator's peak. `python benchmarks/bench_memory_gpu.py measure` then `report`.", "",
             "| model | input | run | archscan peak | allocator peak | difference | added by the run: archscan "
             "| allocator | difference |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff, added = r["allocator"] - r["archscan"], r["allocator_added"] - r["archscan_added"]
        lines.append(f"| {r['model']} | {r['input']} | {r['phase']} | {r['archscan'] / mib:,.1f} MiB | "
                     f"{r['allocator'] / mib:,.1f} MiB | {diff / mib:+,.1f} MiB ({diff / r['archscan']:+.1%}) | "
                     f"{r['archscan_added'] / mib:,.1f} MiB | {r['allocator_added'] / mib:,.1f} MiB | "
                     f"{added / mib:+,.1f} MiB |")
    (folder / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--small", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("dir")
    args = parser.parse_args()
    (measure if args.cmd == "measure" else report)(args)


if __name__ == "__main__":
    main()
