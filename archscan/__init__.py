"""archscan: why a PyTorch model is slow, and what to change.

    >>> import archscan
    >>> report = archscan.scan("zoo:shufflenet_v2_x1_0", [(1, 3, 224, 224)])
    >>> report.totals.flops        # multiply-adds
"""

from .api import scan
from .errors import ArchscanError
from .loading import InputSpec
from .results import Finding, ModuleReport, NodeReport, Report, Totals

__all__ = ["scan", "ArchscanError", "InputSpec", "Finding", "ModuleReport", "NodeReport", "Report", "Totals"]
__version__ = "0.1.0"
