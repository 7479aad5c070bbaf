"""What every rule sees: the report, its networkx view and its building blocks."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import networkx as nx
import torch

from ..graph import Block, find_blocks, to_networkx
from ..results import Report


@lru_cache(maxsize=None)
def dtype_size(name: str | None) -> int:
    """Bytes per element of a dtype named like 'float32' (4 when unknown)."""
    dtype = getattr(torch, name, None) if name else None
    return torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else 4


@dataclass
class RuleContext:
    """Built once per report; rules read it and return findings."""

    report: Report
    graph: nx.DiGraph = field(init=False)
    blocks: list[Block] = field(init=False)

    def __post_init__(self):
        self.graph = to_networkx(self.report)
        self.blocks = find_blocks(self.report, self.graph)
        self._block_of = {name: b.name for b in self.blocks for name in b.nodes}

    def block_of(self, node: str) -> str | None:
        """The building block a node belongs to, if any."""
        return self._block_of.get(node)
