"""Fidelity of measurement and prediction, against the targets archscan sets itself.

For each model: per-layer sum against end-to-end time, run-to-run spread of the end-to-end
median over independent runs, Spearman rank correlation between predicted and measured
per-node latency, and the end-to-end prediction error. The device is calibrated first (or its
cached profile used). Cross-checks: the end-to-end time against torch.utils.benchmark.Timer,
and how well FLOPs alone or MAC alone rank the layers, against the roofline. Results go to stdout and to reports/fidelity-<device>-<date>.{md,json}.

    python benchmarks/bench_fidelity.py [--device cpu|cuda] [--models resnet50,mobilenet_v2] [--runs 3]

Targets (GPU): per-layer sum within 10% of end to end, spread < 3%, Spearman >= 0.9,
end-to-end prediction within 25%. CPU: Spearman >= 0.8.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics

import torch

import archscan
from archscan.measure import MeasureOptions, calibrate, load_profile, resolve_device, save_profile
from archscan.measure.predict import fidelity, spearman


def run(models: list[str], device_name: str | None, runs: int, recalibrate: bool) -> dict:
    device = resolve_device(device_name)
    profile = None if recalibrate else load_profile(device)
    if profile is None:
        profile = calibrate(device)
        save_profile(profile)
    results = {"device": str(device), "device_name": profile.name, "threads": profile.threads,
               "torch": torch.__version__, "date": dt.date.today().isoformat(), "models": {}}
    for name in models:
        reports = [archscan.scan(f"zoo:{name}", [(1, 3, 224, 224)], rules=[], profile=profile,
                                 measure=MeasureOptions(device=str(device), progress=False)) for _ in range(runs)]
        e2e = [r.latency["end_to_end_ms"] for r in reports]
        med = statistics.median(e2e)
        best = reports[e2e.index(sorted(e2e)[len(e2e) // 2])]
        fit = fidelity(best)
        timed = [n for n in best.nodes if n.latency_ms is not None and n.category != "view"]
        measured = [n.latency_ms for n in timed]
        reference = torch_timer_ms(name, device)
        results["models"][name] = {
            "torch_timer_ms": reference,
            "e2e_vs_torch_timer": med / reference - 1,
            "spearman_flops_only": spearman([n.flops for n in timed], measured),
            "spearman_mac_only": spearman([n.mac_bytes for n in timed], measured),
            "end_to_end_ms": e2e,
            "run_to_run_spread": (max(e2e) - min(e2e)) / med,
            "per_layer_sum_ms": best.latency["per_layer_sum_ms"],
            "per_layer_vs_e2e": best.latency["per_layer_sum_ms"] / best.latency["end_to_end_ms"] - 1,
            "predicted_ms": best.latency["predicted_ms"],
            "prediction_error": best.latency["prediction_error"],
            "spearman": fit["spearman"],
            "nodes": fit["nodes"],
            "furthest_below_roofline": fit["furthest_below_roofline"][:3],
        }
    return results


def torch_timer_ms(name: str, device) -> float:
    """The same forward timed by torch.utils.benchmark.Timer (what a user would otherwise reach for)."""
    from torch.utils.benchmark import Timer

    from archscan import zoo

    model = zoo.create_model(name).eval().to(device)
    x = torch.randn(1, 3, 224, 224, device=device)
    with torch.inference_mode():
        m = Timer("model(x)", globals={"model": model, "x": x}, num_threads=torch.get_num_threads()).blocked_autorange(
            min_run_time=2.0)
    return m.median * 1e3


def to_markdown(res: dict) -> str:
    gpu = res["device"].startswith("cuda")
    lines = [f"# Measurement fidelity on {res['device']} ({res['device_name']})", "",
             f"Date {res['date']}, torch {res['torch']}"
             + (f", {res['threads']} CPU threads" if res.get("threads") else "")
             + ". Produced by `python benchmarks/bench_fidelity.py`.", "",
             "| model | end to end (ms, runs) | run-to-run spread | per-layer sum vs end to end | Spearman (nodes) | predicted vs measured |",
             "|---|---|---|---|---|---|"]
    for name, m in res["models"].items():
        lines.append(f"| {name} | {', '.join(f'{x:.2f}' for x in m['end_to_end_ms'])} | {100 * m['run_to_run_spread']:.1f}% | "
                     f"{100 * m['per_layer_vs_e2e']:+.1f}% | {m['spearman']:.3f} ({m['nodes']}) | "
                     f"{100 * m['prediction_error']:+.0f}% |")
    lines += ["", "Cross-checks: end to end against `torch.utils.benchmark.Timer` on the same forward; "
              "per-node rank correlation of FLOPs alone and of MAC alone with the measured latency, "
              "beside the roofline's (Spearman above).", "",
              "| model | archscan end to end | torch Timer | ratio | Spearman FLOPs only | Spearman MAC only | Spearman roofline |",
              "|---|---|---|---|---|---|---|"]
    for name, m in res["models"].items():
        lines.append(f"| {name} | {statistics.median(m['end_to_end_ms']):.2f} ms | {m['torch_timer_ms']:.2f} ms | "
                     f"{1 + m['e2e_vs_torch_timer']:.3f} | {m['spearman_flops_only']:.3f} | {m['spearman_mac_only']:.3f} | "
                     f"{m['spearman']:.3f} |")
    lines += ["", "Targets: " + ("per-layer sum within 10%, spread under 3%, Spearman >= 0.9, prediction within 25% (GPU)."
                                 if gpu else "Spearman >= 0.8 (CPU); the GPU targets are listed for comparison: "
                                             "per-layer sum within 10%, spread under 3%, prediction within 25%.")]
    lines += ["", "Nodes furthest below their roofline (achieved = predicted / measured):", ""]
    for name, m in res["models"].items():
        worst = ", ".join(f"{w['module'] or w['node']} {100 * w['achieved']:.0f}%" for w in m["furthest_below_roofline"])
        lines.append(f"- {name}: {worst}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--device")
    ap.add_argument("--models", default="resnet50,mobilenet_v2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--recalibrate", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "reports"))
    args = ap.parse_args()
    res = run(args.models.split(","), args.device, args.runs, args.recalibrate)
    md = to_markdown(res)
    print(md)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"fidelity-{res['device'].replace(':', '')}-{res['date']}")
    with open(stem + ".md", "w") as fh:
        fh.write(md)
    with open(stem + ".json", "w") as fh:
        json.dump(res, fh, indent=1)
