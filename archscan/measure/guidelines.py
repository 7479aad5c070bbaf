"""Reproduce the ShuffleNetV2 guideline benchmarks (Tables 1-4) on this device.

Each probe network of ``archscan.zoo.probes`` (56x56 input) is built with real weights and
timed end to end (on a GPU forward after forward, as the paper's throughput was measured:
``timing.time_back_to_back``); throughput is printed beside the paper's GTX 1080Ti and ARM/CPU figures,
and each table says whether its ordering holds here (Spearman rank correlation of this
device's throughput with the paper's column, and whether the fastest row is the same).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .predict import spearman
from .profile import device_name, resolve_device
from .timing import clock_for, time_back_to_back


@dataclass(frozen=True)
class ProbeResult:
    name: str
    throughput: float          # batches/s on GPU, images/s on CPU (as the paper reports)
    latency_ms: float
    spread: float
    paper_gpu: float
    paper_cpu: float


@dataclass(frozen=True)
class TableResult:
    table: str
    rows: tuple[ProbeResult, ...]
    spearman_gpu: float
    spearman_cpu: float
    same_fastest: bool
    cpu_label: str

    @property
    def ordering_holds(self) -> bool:
        """The paper's ordering holds when ranks agree (rho >= 0.8) with the column of this device kind."""
        return round(max(self.spearman_gpu, self.spearman_cpu), 6) >= 0.8 and self.same_fastest


def run_guidelines(device: str | None = None, scale: int = 1, batch: int | None = None,
                   tables: tuple[str, ...] = ("G1", "G2", "G3", "G4"), blocks: int = 10,
                   budget_ms: float = 1000.0, advance=None) -> tuple[str, list[TableResult]]:
    """Measure every probe of the chosen tables; returns (device description, results)."""
    from ..zoo import create_model, probes

    dev = resolve_device(device)
    batch = batch or (8 if dev.type == "cuda" else 1)
    clock = clock_for(dev)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    results = []
    for table in tables:
        rows = []
        for name in probes.TABLES[table]:
            from ..zoo import get_entry

            model = create_model(name, scale=scale, blocks=blocks).eval().to(dev)
            shape = [int(d) for d in get_entry(name).default_input[0].split(",")]
            # the width the probe was built with (scaling the default input's would miss a rounded
            # width: G3's two-conv series is round(c / sqrt 2) wide, 362 at x4, not 4 x 91)
            shape[0], shape[1] = batch, next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d)).in_channels
            x = torch.randn(shape, device=dev)
            with torch.inference_mode():
                stats = time_back_to_back(lambda: model(x), clock, warmup=5, min_repeats=10, budget_ms=budget_ms)
            per_s = 1e3 / stats.median_ms * (1 if dev.type == "cuda" else batch)
            paper = probes.PAPER[name]
            rows.append(ProbeResult(name, per_s, stats.median_ms, stats.spread,
                                    paper["gpu"][scale] if scale in paper["gpu"] else float("nan"),
                                    paper["cpu"][scale] if scale in paper["cpu"] else float("nan")))
            if advance is not None:
                advance()
        here = [r.throughput for r in rows]
        gpu, cpu = [r.paper_gpu for r in rows], [r.paper_cpu for r in rows]
        paper_col = gpu if dev.type == "cuda" else cpu
        same = max(range(len(rows)), key=here.__getitem__) == max(range(len(rows)), key=paper_col.__getitem__)
        results.append(TableResult(table, tuple(rows), spearman(here, gpu), spearman(here, cpu), same,
                                   probes.PAPER[rows[0].name]["cpu_label"]))
    return f"{dev} ({device_name(dev)}), batch {batch}, x{scale} channels", results
