"""Timing done right: warm-up, device synchronisation, enough repeats for a stable median.

A ``Clock`` hides the device: ``CpuClock`` reads ``time.perf_counter_ns``; ``CudaClock`` records
CUDA events around the work and synchronises on the end event. Tests pass a fake clock.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch


@dataclass(frozen=True)
class TimingStats:
    """Milliseconds per call over ``repeats`` calls."""

    median_ms: float
    p25_ms: float
    p75_ms: float
    min_ms: float
    repeats: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.p75_ms - self.p25_ms) / self.median_ms if self.median_ms else 0.0

    def to_json(self) -> dict:
        return {"median_ms": self.median_ms, "p25_ms": self.p25_ms, "p75_ms": self.p75_ms,
                "min_ms": self.min_ms, "repeats": self.repeats, "spread": self.spread}


class Clock(Protocol):
    def start(self) -> object: ...
    def stop(self, token: object) -> float: ...
    def sync(self) -> None: ...


class CpuClock:
    """Wall time of the calling thread (CPU work is synchronous)."""

    def start(self) -> int:
        return time.perf_counter_ns()

    def stop(self, token: int) -> float:
        return (time.perf_counter_ns() - token) / 1e6

    def sync(self) -> None:
        pass


class CudaClock:
    """CUDA events on the current stream; ``stop`` waits for the end event."""

    def __init__(self, device: torch.device):
        self.device = device

    def start(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def stop(self, token) -> float:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return token.elapsed_time(end)

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)


def clock_for(device: torch.device) -> Clock:
    return CudaClock(device) if device.type == "cuda" else CpuClock()


def summarize(samples: list[float]) -> TimingStats:
    """Median and quartiles of timing samples (ms)."""
    if not samples:
        raise ValueError("no timing samples")
    s = sorted(samples)
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25, p75 = s[0], s[-1]
    return TimingStats(statistics.median(s), p25, p75, s[0], len(s))


def time_fn(fn: Callable[[], object], clock: Clock, *, warmup: int = 3, min_repeats: int = 5,
            max_repeats: int = 200, budget_ms: float = 50.0) -> TimingStats:
    """Time ``fn`` after ``warmup`` calls: at least ``min_repeats`` calls, more while under ``budget_ms``."""
    for _ in range(warmup):
        fn()
    clock.sync()
    samples: list[float] = []
    total = 0.0
    while len(samples) < min_repeats or (total < budget_ms and len(samples) < max_repeats):
        token = clock.start()
        fn()
        ms = clock.stop(token)
        samples.append(ms)
        total += ms
    return summarize(samples)
