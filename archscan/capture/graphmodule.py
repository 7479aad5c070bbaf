"""``graph_module(root, graph, name)``: a ``torch.fx.GraphModule`` whose Python code is generated
on first use.

The analysis interprets a traced graph node by node and never calls it, while a plain
GraphModule generates and compiles forward's source as it is made: ~5 ms a trace, and a scan
with recommendations traces MobileNetV2 three times. torch's own lazy GraphModule
(``torch.fx._lazy_graph_module._LazyGraphModule``, which torch.compile uses since torch 2.3)
defers that until ``forward``, ``code`` or ``recompile`` is asked for; where a torch lacks it, a
plain GraphModule is made (same graph, same results). ``tests/test_capture.py`` fails loudly
when torch drops or changes it.
"""

from __future__ import annotations

import torch
import torch.fx

try:  # a torch internal, used here only
    from torch.fx._lazy_graph_module import _LazyGraphModule as LAZY
except ImportError:  # pragma: no cover - not in the declared torch range
    LAZY = None


def graph_module(root: torch.nn.Module, graph: torch.fx.Graph, name: str) -> torch.fx.GraphModule:
    """``torch.fx.GraphModule(root, graph, name)``, lazy where torch can be."""
    return (LAZY or torch.fx.GraphModule)(root, graph, name)
