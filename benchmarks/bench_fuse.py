"""`archscan fuse` against torch.fx's own fuse: batch norms folded, error, bytes, kernels and latency.

For each model, the same randomised weights (random batch-norm statistics) go to both tools:
``torch.fx.experimental.optimization.fuse`` (module batch norms of fx-traceable models) and
``archscan.fuse`` (module and functional batch norms, hand-written attention, on the exported
graph). Latency: end to end, median of the timed runs, original vs each fused model, on the
device named (CPU by default), under inference_mode, each fused model timed interleaved with
the original (``archscan.measure.timing.time_ab``).

    python benchmarks/bench_fuse.py [--device cpu|cuda] [--input 1,3,224,224]
        [--models resnet50,mobilenet_v2,shufflenet_v2_x1_0,shufflenet_v1_g3_x1_0]
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import tempfile
import warnings

import torch
import torch.fx.experimental.optimization as fx_opt

import archscan
from archscan import zoo
from archscan.measure.profile import device_name
from archscan.measure.timing import clock_for, time_ab
from archscan.transform.weights import randomize_batch_norms

_BN = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)


def latency_ms(models, x, device) -> list[float]:
    """Median ms of each model, timed interleaved in pairs against the first (the original)."""
    x = x.to(device)
    models = [m.to(device) for m in models]
    out = []
    with torch.inference_mode():
        for other in models[1:]:
            base, stats = time_ab(lambda: models[0](x), lambda: other(x), clock_for(device))
            out.append((base.median_ms, stats.median_ms))
    return [sum(b for b, _ in out) / len(out)] + [ms for _, ms in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--input", default="1,3,224,224")
    parser.add_argument("--models", default="resnet50,mobilenet_v2,shufflenet_v2_x1_0,shufflenet_v1_g3_x1_0")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    device = torch.device(args.device)
    shape = tuple(int(d) for d in args.input.split(","))
    print(f"# {datetime.date.today()}, {device_name(device)}, torch {torch.__version__}, input {args.input}, "
          f"threads {torch.get_num_threads() if device.type == 'cpu' else '-'}")
    print("model | BNs | fx fuse left | archscan left | max rel err | MAC before -> after | kernels | "
          "original ms | fx fuse ms | archscan ms | archscan vs original | archscan vs fx fuse")
    print("|".join(["---"] * 12))
    tmp = tempfile.mkdtemp()
    for name in args.models.split(","):
        torch.manual_seed(0)
        model = zoo.create_model(name).eval()
        randomize_batch_norms(model)
        path = os.path.join(tmp, f"{name}.pt")
        torch.save(model.state_dict(), path)
        bns = sum(isinstance(m, _BN) for m in model.modules())
        ours = archscan.fuse(f"zoo:{name}", args.input, weights=path)
        fx_fused = fx_opt.fuse(model)
        fx_left = sum(isinstance(m, _BN) for m in fx_fused.modules())
        x = torch.randn(shape)
        base, fx_ms, our_ms = latency_ms([model, fx_fused, ours.program.module()], x, device)
        b, a = ours.before, ours.after
        print(f"{name} | {bns} | {fx_left} | {a['batch_norms']} | {ours.check.max_rel_err:.1e} | "
              f"{b['mac_bytes'] / 2**20:.1f} -> {a['mac_bytes'] / 2**20:.1f} MiB | {b['kernels']} -> {a['kernels']} | "
              f"{base:.2f} | {fx_ms:.2f} | {our_ms:.2f} | {base / our_ms:.2f}x | {fx_ms / our_ms:.2f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
