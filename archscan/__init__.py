"""archscan: why a PyTorch model is slow, and what to change.

    >>> import archscan
    >>> report = archscan.scan("zoo:shufflenet_v2_x1_0", [(1, 3, 224, 224)])
    >>> report.totals.flops        # multiply-adds

The names below are imported on first use, so ``archscan --help`` and usage errors do not
import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"scan": ".api", "fuse": ".api", "quantize": ".quant.apply", "ArchscanError": ".errors",
            "InputSpec": ".load.targets", "Finding": ".results",
            "ModuleReport": ".results", "NodeReport": ".results", "Report": ".results", "Totals": ".results"}

__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'archscan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
