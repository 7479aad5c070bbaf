"""Scan time against graph size: a deep stack of small residual steps (four ops each, the shape of
a state-space or RWKV model's long graph), scanned with ``archscan.scan`` and run for real under
``torch.utils.flop_counter.FlopCounterMode`` (what a user would otherwise run to count it).
Linear growth keeps the ratio flat; a quadratic step shows as a ratio that climbs with the size.

    python benchmarks/bench_graph_size.py --sizes 500 1000 2000 4000
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import archscan


class Deep(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(16) for _ in range(n))

    def forward(self, x):
        for norm in self.norms:
            x = x + torch.sigmoid(norm(x)) * 0.5
        return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000, 4000])
    args = parser.parse_args()
    archscan.scan(Deep(4), (2, 16))  # imports and first-call costs out of the way
    print(f"{'steps':>6} {'nodes':>6} {'archscan s':>10} {'FlopCounterMode s':>17} {'ratio':>6}")
    for n in args.sizes:
        model = Deep(n)
        start = time.perf_counter()
        report = archscan.scan(model, (2, 16))
        scan_s = time.perf_counter() - start
        start = time.perf_counter()
        with FlopCounterMode(display=False):
            model(torch.randn(2, 16))
        real_s = time.perf_counter() - start
        print(f"{n:>6} {len(report.nodes):>6} {scan_s:>10.2f} {real_s:>17.2f} {scan_s / real_s:>6.1f}")


if __name__ == "__main__":
    main()
