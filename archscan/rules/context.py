"""What every rule sees: the report, its data flow, its building blocks, and where in the
model each layer sits (reading the data, making the output, over a sequence's tokens)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import torch

from ..graph import Block, DataFlow, find_blocks
from ..results import NodeReport, Report

# Layers: nodes whose weights set the width of what they make. Between two of them the width is
# the one the first made; the model's inputs and outputs have the width the task gives them.
LAYER_CATEGORIES = frozenset({"conv", "grouped_conv", "depthwise_conv", "linear", "matmul", "attention", "rnn",
                              "embedding"})
CONV_CATEGORIES = ("conv", "grouped_conv", "depthwise_conv")
_TRANSPOSES = ("transpose", "permute", "swapaxes", "swapdims", "movedim")


def is_layer(n: NodeReport) -> bool:
    """A conv, linear, matrix product, attention, recurrent cell or embedding."""
    return n.category in LAYER_CATEGORIES


def is_conv1d(n: NodeReport) -> bool:
    """A convolution over one dimension ([batch, channels, length])."""
    return n.category in CONV_CATEGORIES and len(n.attrs.get("kernel") or ()) == 1


def is_top_k(n: NodeReport) -> bool:
    """A top-k: a mixture of experts' router choosing k experts per token (as ``costs`` counts it)."""
    return any(op.startswith("aten.topk") for op in n.aten_ops) or n.op.rpartition(".")[2] == "topk"


@lru_cache(maxsize=None)
def dtype_size(name: str | None) -> int:
    """Bytes per element of a dtype named like 'float32' (4 when unknown)."""
    dtype = getattr(torch, name, None) if name else None
    return torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else 4


@dataclass
class RuleContext:
    """Built once per report; rules read it and return findings."""

    report: Report
    graph: DataFlow = field(init=False)
    blocks: list[Block] = field(init=False)

    def __post_init__(self):
        self.graph = DataFlow(self.report)
        self.blocks = find_blocks(self.report, self.graph)
        self._block_of = {name: b.name for b in self.blocks for name in b.nodes}

    def block_of(self, node: str) -> str | None:
        """The building block a node belongs to, if any."""
        return self._block_of.get(node)

    def reads_the_data(self, n: NodeReport) -> bool:
        """No layer lies between the model's inputs and this node: the width it reads is the data's
        (an image's 3 channels, a spectrogram's mel bins)."""
        return n.name not in self._after_a_layer

    def makes_the_output(self, n: NodeReport) -> bool:
        """No layer lies between this node and the model's outputs: the width it makes is the task's
        (classes, anchors x 4 box coordinates, a vocabulary), not a design choice."""
        return n.name not in self._before_a_layer

    def routes_experts(self, n: NodeReport) -> bool:
        """A layer whose output reaches a top-k before any other layer: a router, one column per expert."""
        return n.name in self._routers

    def over_tokens(self, n: NodeReport) -> bool:
        """A 1-D conv over the tokens of a sequence model (Mamba's causal conv1d, a Conformer's
        convolution module): the model keeps its tokens [batch, length, channels] for its linear
        layers and transposes them to [batch, channels, length] for the conv. Not an image conv."""
        return is_conv1d(n) and any(p in self._token_layout for p in self.graph.predecessors(n.name))

    def _marked(self, nodes, neighbours, start, carries) -> frozenset[str]:
        """The nodes a mark reaches along ``neighbours``: a node is marked when ``start(node)`` holds
        or a neighbour is marked and ``carries(neighbour)``. ``nodes`` in the order marks travel (the
        report's nodes run in execution order, each after its inputs)."""
        g, marked = self.graph, set()
        for n in nodes:
            if start(n) or any(m in marked and carries(g.nodes[m]["node"]) for m in neighbours(n.name)):
                marked.add(n.name)
        return frozenset(marked)

    @cached_property
    def _after_a_layer(self) -> frozenset[str]:
        """Nodes with a layer on some path from the inputs to them (the layer itself not counted)."""
        g = self.graph
        return self._marked(self.report.nodes, g.predecessors, lambda n: any(
            is_layer(g.nodes[p]["node"]) for p in g.predecessors(n.name)), lambda m: True)

    @cached_property
    def _before_a_layer(self) -> frozenset[str]:
        """Nodes with a layer on some path from them to the outputs (the node itself not counted)."""
        g = self.graph
        return self._marked(self.report.nodes[::-1], g.successors, lambda n: any(
            is_layer(g.nodes[s]["node"]) for s in g.successors(n.name)), lambda m: True)

    @cached_property
    def _routers(self) -> frozenset[str]:
        """Layers, and the ops after them, whose output reaches a top-k before another layer."""
        return self._marked(self.report.nodes[::-1], self.graph.successors, is_top_k, lambda m: not is_layer(m))

    @cached_property
    def _token_layout(self) -> frozenset[str]:
        """Nodes that hold tokens transposed between [batch, length, channels] and [batch, channels,
        length] since the last layer (1-D convs keep the layout they read)."""
        return self._marked(self.report.nodes, self.graph.predecessors, self._swaps_length_and_channels,
                            lambda m: not is_layer(m) or is_conv1d(m))

    def _swaps_length_and_channels(self, n: NodeReport) -> bool:
        """A transpose of a 3-D tensor's last two dimensions: [b, l, c] -> [b, c, l]. Only b and l are
        compared: a split's node records the shape of its first part ([b, l, c1]), the transpose may
        read another ([b, l, c2])."""
        if not n.inputs or n.inputs[0] not in self.graph or not any(t in n.op for t in _TRANSPOSES):
            return False
        shape, out = self.graph.nodes[n.inputs[0]]["node"].out_shape, n.out_shape
        return bool(shape and out) and len(shape) == len(out) == 3 and (out[0], out[2]) == (shape[0], shape[1])
