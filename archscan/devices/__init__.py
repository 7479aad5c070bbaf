"""What a device can hold: free memory, read before anything large is allocated there.

Below every stage that allocates for real: the capture's eager fallback checks that a real run
fits, and the measurement checks the device before it times anything.

Modules: this ``__init__`` (free memory, short-of messages), ``gpus`` (named GPUs' memory for
``--memory h100``). The datasheet profiles that predict time live with the measurement
(``archscan.measure.profile``).
"""

from __future__ import annotations

import torch


def available_bytes(device: torch.device) -> int | None:
    """Free memory on the device (CPU: MemAvailable), or None when it cannot be told."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def short_of(need: int, device: torch.device = torch.device("cpu")) -> int | None:
    """The device's free bytes when ``need`` is more than half of them (a real run would crowd it
    out: say so before allocating), else None (it fits, or the free memory cannot be told)."""
    free = available_bytes(device)
    return free if free is not None and need > 0.5 * free else None
