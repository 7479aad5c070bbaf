"""The annotated graph's data flow, and the building blocks the guidelines talk about.

``DataFlow(report)`` holds the report's nodes and their edges (one class, as STYLE.md
asks): what the rules walk (``nodes[name]["node"]``, successors, predecessors, out-degree), in
plain dicts. networkx, whose import alone is a tenth of a second of every scan, is imported only
for the post-dominators of fork/join regions (``to_networkx``). ``find_blocks`` finds building
blocks two ways:

* **module units** — a non-container module that sits in a container (``Sequential``,
  ``ModuleList``): ResNet's ``Bottleneck``, ShuffleNet's units, a ViT encoder block;
* **fork/join regions** — when a model has no such modules: from a fork to its immediate
  post-dominator (where the branches meet again). A fork is any node with several users: a
  layer's output, and also a model input or attribute (placeholder, get_attr) that several
  nodes read — an inception block on the input ``x`` — which report nodes name in
  ``attrs["shared_inputs"]``, since inputs and attributes are not report nodes themselves.

For each block, the ShuffleNetV2 paper's "fragmented operators" (G3) are its convolution and
pooling ops; ``series`` is the longest chain of them and ``parallel`` the largest set that
can run side by side (the width of their reachability order, by Dilworth's theorem: the
fragments less a maximum matching of the reachability relation).
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..results import NodeReport, Report, module_and_ancestors

if TYPE_CHECKING:
    import networkx as nx

FRAGMENT_CATEGORIES = frozenset({"conv", "grouped_conv", "depthwise_conv", "pooling"})
ELEMENTWISE_CATEGORIES = frozenset({"activation", "elementwise", "norm"})  # + depthwise conv for G4


class DataFlow:
    """The report's nodes keyed by name (``nodes[name]["node"]`` is the NodeReport) and the edges of
    data flow between them, in the report's order (a topological one: a node reads only earlier
    nodes). Edges are distinct: a node reading one input twice has it once among its predecessors."""

    def __init__(self, report: Report):
        self.nodes: dict[str, dict] = {n.name: {"node": n, "category": n.category} for n in report.nodes}
        self._succ: dict[str, list[str]] = {name: [] for name in self.nodes}
        self._pred: dict[str, list[str]] = {name: [] for name in self.nodes}
        for n in report.nodes:
            for src in dict.fromkeys(n.inputs):
                if src in self.nodes:
                    self._succ[src].append(n.name)
                    self._pred[n.name].append(src)

    def __contains__(self, name) -> bool:
        return name in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def successors(self, name: str) -> list[str]:
        return self._succ[name]

    def predecessors(self, name: str) -> list[str]:
        return self._pred[name]

    def out_degree(self, name: str) -> int:
        return len(self._succ[name])

    def number_of_nodes(self) -> int:
        return len(self.nodes)


def to_networkx(g: DataFlow) -> nx.DiGraph:
    """``g`` as a networkx ``DiGraph`` (node data ``node`` and ``category``), for its algorithms."""
    import networkx as nx

    out = nx.DiGraph()
    for name, data in g.nodes.items():
        out.add_node(name, **data)
    out.add_edges_from((src, dst) for src, users in g._succ.items() for dst in users)
    return out


@dataclass(frozen=True)
class Block:
    """One building block and its fragmentation."""

    name: str             # module path, or "fork..join" for a region
    type: str
    kind: str             # "module" or "region"
    nodes: tuple[str, ...]
    fragments: int        # convolution and pooling ops (ShuffleNetV2, G3)
    series: int           # longest chain of fragmented ops
    parallel: int         # most fragmented ops that can run at once
    flops: int
    mac_bytes: int
    elementwise_mac_bytes: int
    elementwise_flops: int

    def to_json(self) -> dict:
        """The block without its node list (JSON ``blocks``)."""
        return {"name": self.name, "type": self.type, "kind": self.kind, "nodes": len(self.nodes),
                "fragments": self.fragments, "series": self.series, "parallel": self.parallel, "flops": self.flops,
                "mac_bytes": self.mac_bytes, "elementwise_mac_bytes": self.elementwise_mac_bytes}

    @property
    def signature(self) -> tuple:
        return (self.type, self.fragments, self.series, self.parallel)


def _is_fragment(n: NodeReport) -> bool:
    return n.category in FRAGMENT_CATEGORIES


def is_elementwise(n: NodeReport) -> bool:
    """Element-wise work as the paper counts it (G4): activations, adds, norms, depthwise convs."""
    return n.category in ELEMENTWISE_CATEGORIES or n.category == "depthwise_conv"


def elementwise_mac_bytes(n: NodeReport) -> int:
    """Bytes a node moves doing element-wise work, from its per-category breakdown when it has one."""
    by_category = n.attrs.get("mac_by_category")
    if by_category:
        return sum(v for k, v in by_category.items() if k in ELEMENTWISE_CATEGORIES or k == "depthwise_conv")
    return n.mac_bytes if is_elementwise(n) else 0


def fragmentation(g: DataFlow, names: list[str]) -> tuple[int, int, int]:
    """(fragments, longest chain, width) of the fragmented ops among ``names`` (in topological order)."""
    inside = set(names)
    frags = [n for n in names if _is_fragment(g.nodes[n]["node"])]
    if not frags:
        return 0, 0, 0
    is_frag = set(frags)
    reach = {f: [h for h in _descendants(g, f, inside) if h in is_frag] for f in frags}
    # longest chain: DP over the fragments in topological order
    longest = {f: 1 for f in frags}
    for f in frags:
        for h in reach[f]:
            longest[h] = max(longest[h], longest[f] + 1)
    # width = |frags| - maximum matching in the comparability bipartite graph (Dilworth)
    return len(frags), max(longest.values()), len(frags) - _matching_size(frags, reach)


def _descendants(g: DataFlow, start: str, inside: set[str]) -> set[str]:
    """The nodes of ``inside`` reachable from ``start`` through nodes of ``inside``."""
    seen, todo = set(), [start]
    while todo:
        for n in g.successors(todo.pop()):
            if n in inside and n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def _matching_size(left: list[str], edges: dict[str, list[str]]) -> int:
    """The size of a maximum matching of the bipartite graph ``left`` → ``edges[left]`` (Kuhn's
    augmenting paths, walked with an explicit stack: a block's fragments are few, a graph's may not be)."""
    owner: dict[str, str] = {}  # right node -> the left node matched to it
    size = 0
    for root in left:
        seen: set[str] = set()
        stack = [(root, iter(edges[root]))]
        path: list[tuple[str, str]] = []  # (left, right) steps of the path being tried
        found = False
        while stack and not found:
            u, candidates = stack[-1]
            for v in candidates:
                if v in seen:
                    continue
                seen.add(v)
                path.append((u, v))
                if v not in owner:
                    found = True
                else:
                    stack.append((owner[v], iter(edges[owner[v]])))
                break
            else:  # no way on from u: step back
                stack.pop()
                if path:
                    path.pop()
        if found:
            for u, v in path:
                owner[v] = u
            size += 1
    return size


def _block(g: DataFlow, name: str, type_: str, kind: str, names: list[str]) -> Block:
    nodes = [g.nodes[n]["node"] for n in names]
    fragments, series, parallel = fragmentation(g, names)
    return Block(name, type_, kind, tuple(names), fragments, series, parallel,
                 sum(n.flops for n in nodes), sum(n.mac_bytes for n in nodes),
                 sum(elementwise_mac_bytes(n) for n in nodes), sum(n.flops for n in nodes if is_elementwise(n)))


_JOIN = re.compile(r"(^|\.|_)(i?add|add_|cat|concat|stack|mul|sub)(\.|_|$)")


def module_units(report: Report) -> list[tuple[str, str]]:
    """(path, type) of the building blocks: the innermost repeated units, whatever the nesting.

    A unit is a non-container module whose parent is a container (a ``Sequential``/``ModuleList``
    item, or a container root's). Where a unit holds two or more units of one type that join
    branches themselves (a residual add, a concatenation: a stage of blocks, timm's ``*Stage``, a
    UNet's down block), those inner units are the blocks instead, so the same residual blocks are
    the building blocks whether a model nests them in stages or lists them flat. A unit whose
    inner units are plain chains (a conv-norm-activation inside an inverted residual) stays whole.
    """
    mods = {m.path: m for m in report.modules}
    candidates = []
    for m in report.modules:
        if not m.path or m.container or m.builtin or m.nodes == 0:
            continue
        parent = m.path.rsplit(".", 1)[0] if "." in m.path else ""
        if parent in mods and mods[parent].container:
            candidates.append((m.path, m.type))
    types = dict(candidates)
    joins = set()  # the modules (and their ancestors) holding a node that joins two values
    for n in report.nodes:
        if len(n.inputs) >= 2 and _JOIN.search(n.op):
            joins.update(module_and_ancestors(n.module))

    def directly_under(path: str) -> list[str]:
        """The outermost candidates strictly inside ``path``."""
        inside = [p for p in types if p.startswith(path + ".")]
        return [p for p in inside if not any(q in types for q in module_and_ancestors(p)[:-1] if q.startswith(path + "."))]

    def innermost(path: str) -> list[str]:
        inner = directly_under(path)
        by_type: dict[str, list[str]] = {}
        for p in inner:
            by_type.setdefault(types[p], []).append(p)
        repeated = [p for group in by_type.values() if len(group) >= 2 and all(q in joins for q in group) for p in group]
        if not repeated:
            return [path]
        return [q for p in sorted(repeated, key=list(types).index) for q in innermost(p)]

    outermost = [p for p, _ in candidates if not any(q in types for q in module_and_ancestors(p)[:-1])]
    return [(p, types[p]) for path in outermost for p in innermost(path)]


def with_shared_inputs(g: DataFlow) -> nx.DiGraph:
    """``g`` as a networkx graph plus the model inputs and attributes that several nodes read
    (``shared_inputs``), as nodes of their own with an edge to each reader, so forks there are
    seen like any other."""
    full = to_networkx(g)
    full.add_edges_from((src, n) for n, data in g.nodes.items()
                        for src in (data["node"].attrs.get("shared_inputs") or ()) if src not in g)
    return full


def fork_join_regions(g: DataFlow) -> list[tuple[str, str, list[str]]]:
    """(fork, join, nodes) for every node with several users, model inputs and attributes that
    several nodes read included: the nodes after the fork up to and including the join, where its
    branches meet again (its immediate post-dominator). The fork itself is not in ``nodes``."""
    import networkx as nx

    g = with_shared_inputs(g)
    if g.number_of_nodes() == 0:
        return []
    sink = "__sink__"
    rev = g.reverse(copy=True)
    for n in g.nodes:
        if g.out_degree(n) == 0:
            rev.add_edge(sink, n)
    ipdom = nx.immediate_dominators(rev, sink)
    regions = []
    for f in nx.topological_sort(g):
        if g.out_degree(f) < 2 or f not in ipdom:
            continue
        join = ipdom[f]
        if join == sink:
            continue
        between = _reached_before(g, f, join)  # the fork feeds the block
        order = [n for n in nx.topological_sort(g.subgraph(between))]
        regions.append((f, join, order))
    return regions


def _reached_before(g, fork: str, join: str) -> set[str]:
    """The nodes after ``fork`` up to and including ``join``, its post-dominator: every path from
    the fork passes the join, so a walk that does not go past the join stays between the two
    (descendants of the fork that are ancestors of the join), in the region's size, not the graph's."""
    seen, todo = {join}, [fork]
    while todo:
        for n in g.successors(todo.pop()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def find_blocks(report: Report, g: DataFlow | None = None) -> list[Block]:
    """Building blocks: module units when the model has them, fork/join regions otherwise."""
    g = g if g is not None else DataFlow(report)
    units = module_units(report)
    if units:
        members: dict[str, list[str]] = {path: [] for path, _ in units}
        for n in report.nodes:  # each node once, up its module path: linear in nodes x depth
            for path in module_and_ancestors(n.module):
                if path in members:
                    members[path].append(n.name)
        return [_block(g, path, type_, "module", members[path]) for path, type_ in units]
    return [_block(g, f"{f}..{j}", "region", "region", names) for f, j, names in fork_join_regions(g)]
