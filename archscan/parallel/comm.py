"""The time of torch.distributed's collectives on a named interconnect: NCCL's ring and tree on
datasheet bandwidths. A stated model, not a measurement, until checked on a multi-GPU node.

Conventions: GB = 1e9 bytes. A bandwidth is one GPU's, in one direction (an H100's "900 GB/s"
NVLink is 450 GB/s each way; a 400 Gb/s NIC is 50 GB/s). A group of ``n`` ranks spans ``m``
nodes with ``k = n // m`` of them on each; a "node" is one NVLink domain (72 GPUs on a GB200 NVL72).

**Bus bytes** are nccl-tests' (doc/PERFORMANCE.md): the bytes one rank sends for a collective of
``S`` bytes, so that bus bytes / time (its "busbw") is comparable with the link's bandwidth:

    all_gather (S: the gathered output), reduce_scatter (S: the input)   (n-1)/n * S
    all_reduce                                                          2(n-1)/n * S
    broadcast                                                           S
    all_to_all (S: one rank's send buffer)                              (n-1)/n * S

**Bandwidth**, each link's datasheet figure times the interconnect's ``efficiency`` (what NCCL
reaches on large messages; one figure for both links):

- A ring inside a node runs at ``intra_gbs``. A ring across nodes enters and leaves each node once
  per channel, and NCCL spreads its channels over the NICs of the node's GPUs (one NIC per GPU,
  rail-optimised), so the ``k`` NICs carry the node's share: min(intra_gbs, k * inter_gbs). This is
  NCCL's own tuning model (src/graph/tuning.cc): bus bandwidth = channels x bandwidth per channel.
- NCCL's tree all-reduce (a double binary tree between nodes, a chain inside each: NVIDIA's blog
  "Massively Scale Your Deep Learning Training with NCCL 2.4", 2019) moves 2 S along each node's
  chain (tuning.cc: algorithm bandwidth = bus bandwidth / 2), and each node sends 2 S through its
  NICs, or S between two nodes, where each of the two trees is one edge:
  time = max(2 S / intra, c S / (k * inter)), c = 1 for two nodes, else 2.
- all_to_all sends (k-1)/n of S to its node's peers over NVLink and (n-k)/n of S through its own
  NIC, both at once.

**Latency**, counted in steps as NCCL's tuning model counts them: a ring takes n-1 steps per pass
(two passes for all_reduce), m-1 of each pass between nodes; a tree 2((k-1) intra + log2(m) inter)
steps (log2 rounded down, the depth of a binary tree of m nodes); broadcast's pipeline n-1 steps,
m-1 between nodes; all_to_all one step per peer, (k-1) intra and (n-k) inter. The figure per step
is tuning.cc's ``hwLat`` for its LL protocol, which NCCL picks for the small messages where latency
counts: 0.6 us on NVLink, 1.0 us on PCIe, 2.7 us on the network (InfiniBand or RoCE alike);
TCP sockets without RDMA are assumed at 30 us.

all_reduce takes the faster of ring and tree, as NCCL does; the tree only across nodes (inside one
it is a chain, no faster than the ring). all_to_all is point-to-point ("p2p"); the others, a ring.

Left out: NCCL's fixed cost per call (tuning.cc's ``baseLat``, 6.6-14 us, and the kernel launch);
the bandwidth each protocol (LL, LL128, Simple) loses; NVLink SHARP (NVLS), which NCCL uses for
all_reduce on NVSwitch systems from Hopper on and which reduces in the switch (faster than the
ring); InfiniBand SHARP (CollNet); other groups' traffic on the same NICs; overlap with compute.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import ceil, prod
from typing import NamedTuple

from ..errors import ArchscanError

GB = 1e9  # bytes
US = 1e-6  # seconds


@dataclass(frozen=True)
class Interconnect:
    """A node of GPUs and the network between nodes, per GPU and per direction."""

    name: str
    gpus_per_node: int
    intra_gbs: float          # GB/s (1e9 bytes/s) per GPU, one direction, inside a node (NVLink/NVSwitch or PCIe)
    intra_latency_us: float   # per step of a ring inside a node
    inter_gbs: float          # GB/s per GPU, one direction, between nodes (each GPU's own NIC: rail-optimised)
    inter_latency_us: float   # per step of a ring between nodes
    efficiency: float         # fraction of the datasheet bandwidth NCCL reaches on large messages (nccl-tests' busbw)
    source: str               # the datasheets / measurements the figures come from


# Latency per step: NCCL src/graph/tuning.cc, hwLat for the ring and the LL protocol.
NVLINK_US, PCIE_US, NET_US = 0.6, 1.0, 2.7
TCP_US = 30.0  # assumed: NCCL's socket transport, a TCP round trip through the kernel on each side

# Efficiency, the all-reduce bus bandwidth nccl-tests reaches over the datasheet's, one figure for both
# links: InfiniBand comes nearer 0.9, so times across nodes err about 10% slow.
NVLINK_EFF = 0.80  # assumed: ~360 GB/s of 450 reported for 8 H100 SXM with NVLS off; taken for H200, B200, GB200 too
A100_EFF = 0.78    # NCCL's tuning model caps the A100's bus bandwidth at 235 GB/s (235/300 = 0.78)
PCIE_EFF = 0.70    # assumed: rings through PCIe switches and the host bridge

_BUSBW = "bus bandwidth: nccl-tests doc/PERFORMANCE.md; latencies: NCCL src/graph/tuning.cc (hwLat, LL)"

# (names, GPUs per node, intra GB/s, intra us, inter GB/s, inter us, efficiency, source); the first name
# of each line is the interconnect's own, the others are aliases: among them the names of
# archscan.devices.gpus, so that a GPU's name gives its usual node.
_TABLE = [
    (("h100-nvlink", "h100", "h100-sxm"), 8, 450.0, NVLINK_US, 50.0, NET_US, NVLINK_EFF,
     ("NVIDIA H100 Tensor Core GPU datasheet (SXM: NVLink 4, 900 GB/s per GPU both ways); NVIDIA DGX H100 user "
      f"guide (NVSwitch, 8x ConnectX-7 400 Gb/s NDR InfiniBand, one per GPU); {_BUSBW}")),
    (("h200-nvlink", "h200"), 8, 450.0, NVLINK_US, 50.0, NET_US, NVLINK_EFF,
     ("NVIDIA H200 Tensor Core GPU datasheet (SXM: NVLink 900 GB/s per GPU both ways); NVIDIA DGX H200 user "
      f"guide (8x ConnectX-7 400 Gb/s NDR InfiniBand, one per GPU); {_BUSBW}")),
    (("a100-nvlink", "a100", "a100-80gb", "a100-40gb"), 8, 300.0, NVLINK_US, 25.0, NET_US, A100_EFF,
     ("NVIDIA A100 Tensor Core GPU datasheet (SXM: NVLink 3, 600 GB/s per GPU both ways); NVIDIA DGX A100 user "
      f"guide (NVSwitch, 8x ConnectX-6 200 Gb/s HDR InfiniBand for compute, one per GPU); {_BUSBW}")),
    (("b200-nvlink", "b200"), 8, 900.0, NVLINK_US, 50.0, NET_US, NVLINK_EFF,
     ("NVIDIA HGX B200 / DGX B200 datasheets (NVLink 5, 1.8 TB/s per GPU both ways; 8x ConnectX-7 400 Gb/s, "
      f"one per GPU); {_BUSBW}")),
    (("gb200-nvl72", "gb200"), 72, 900.0, NVLINK_US, 50.0, NET_US, NVLINK_EFF,
     ("NVIDIA GB200 NVL72 datasheet (72 GPUs in one NVLink 5 domain, 1.8 TB/s per GPU both ways); between racks "
      f"one 400 Gb/s NIC per GPU (ConnectX-7, assumed); {_BUSBW}")),
    (("h100-pcie",), 8, 64.0, PCIE_US, 50.0, NET_US, PCIE_EFF,
     ("NVIDIA H100 Tensor Core GPU datasheet (PCIe: Gen5 x16, 128 GB/s both ways; NVLink bridges not assumed); "
      f"8 GPUs per node and one 400 Gb/s NIC per GPU assumed; {_BUSBW}")),
    (("h100-roce",), 8, 450.0, NVLINK_US, 50.0, NET_US, NVLINK_EFF,
     ("NVIDIA H100 datasheet (NVLink 900 GB/s per GPU both ways); one 400 GbE RoCE NIC per GPU (ConnectX-7), a "
      f"lossless fabric assumed to run as InfiniBand does (NCCL's tuning model has one network latency); {_BUSBW}")),
    (("h100-ethernet-100g",), 8, 450.0, NVLINK_US, 12.5 / 8, TCP_US, NVLINK_EFF,
     ("NVIDIA H100 datasheet (NVLink 900 GB/s per GPU both ways); one 100 Gb/s Ethernet port per node shared by its "
      f"8 GPUs (12.5 GB/s, 1.5625 per GPU), NCCL over TCP sockets without RDMA (latency assumed); {_BUSBW}")),
]

INTERCONNECTS: dict[str, Interconnect] = {alias: Interconnect(names[0], *rest) for names, *rest in _TABLE
                                          for alias in names}


def interconnect_for(name: str) -> Interconnect:
    """The interconnect of that name ('H100', 'h100_nvlink', 'gb200-nvl72'); case and ``_`` ignored.

    Raises:
        ArchscanError: no interconnect has that name; the message lists them.
    """
    ic = INTERCONNECTS.get(str(name).strip().lower().replace("_", "-").replace(" ", "-"))
    if ic is None:
        raise ArchscanError(f"unknown interconnect {name!r}", hint=f"one of: {', '.join(INTERCONNECTS)}")
    return ic


def group_span(mesh: dict[str, int], dim: str, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) a process group along mesh dimension `dim` spans. The mesh is
    row-major, outermost first, ranks numbered 0..world-1 and placed on nodes in order
    (gpus_per_node consecutive ranks per node). A group along dim with stride s (product of the
    sizes of the dims after it) and size k holds ranks r, r+s, ..., r+(k-1)s.

    The groups of one dimension run their collectives together, so where they lie unevenly on the
    nodes, the group spanning the most nodes is the one returned, with the most of its ranks on one
    node: ``{"fsdp": 8, "tp": 8}`` with 8 GPUs per node gives tp (1, 8) and fsdp (8, 1).

    Raises:
        ArchscanError: ``dim`` is not in the mesh, or a size is not a whole number ≥ 1.
    """
    if dim not in mesh:
        raise ArchscanError(f"the mesh {mesh} has no dimension {dim!r}", hint=f"one of: {', '.join(mesh) or 'none'}")
    for what, value in [*mesh.items(), ("gpus_per_node", gpus_per_node)]:
        if not _whole(value) or value < 1:
            raise ArchscanError(f"{what} = {value!r}: a size must be a whole number ≥ 1")
    sizes = list(mesh.values())
    at = list(mesh).index(dim)
    size, stride = sizes[at], prod(sizes[at + 1:])
    widest = (0, 0)
    for first in range(prod(sizes)):
        if (first // stride) % size:
            continue  # not the first rank of its group
        per_node: dict[int, int] = {}
        for rank in range(first, first + size * stride, stride):
            per_node[rank // gpus_per_node] = per_node.get(rank // gpus_per_node, 0) + 1
        widest = max(widest, (len(per_node), max(per_node.values())))
    return widest


class _Span(NamedTuple):
    ranks: int     # n
    nodes: int     # m
    per_node: int  # k = n // m


class _Way(NamedTuple):
    """One algorithm's estimate of a collective."""

    algorithm: str
    bus_bytes: float   # per rank
    transfer_s: float  # the bandwidth part
    latency_s: float


def collective_time(kind: str, nbytes: int, group: int, ic: Interconnect, nodes: int = 1) -> dict:
    """Seconds of one collective on a group of `group` ranks spread over `nodes` nodes.

    Args:
        kind: "all_gather" (nbytes = the OUTPUT size, the gathered whole), "reduce_scatter" (nbytes =
            the INPUT size, the whole before scattering), "all_reduce" (nbytes = the buffer),
            "broadcast", "all_to_all" (nbytes = one rank's send buffer).
        nbytes: bytes, as above.
        group: ranks in the process group.
        ic: the interconnect.
        nodes: nodes the group spans (``group_span``), its ranks spread evenly: ``group // nodes`` on each.

    Returns:
        ``seconds`` (= bus_bytes / bandwidth + latency_s); ``algorithm`` ("ring", "tree", "p2p" for
        all_to_all, or "none" for a group of one or no bytes); ``bus_bytes`` (what each rank sends
        under that algorithm); ``bandwidth_gbs`` (bus_bytes over the bandwidth part of the time,
        after efficiency: the link's bandwidth for a ring); ``latency_s``; ``link`` ("intra" inside
        one node, else "inter").

    Raises:
        ArchscanError: an unknown kind, negative bytes, a group < 1, or nodes that cannot hold it.
    """
    _check(kind, nbytes, group, ic, nodes)
    link = "intra" if nodes == 1 else "inter"
    if group == 1 or nbytes == 0:
        return {"seconds": 0.0, "algorithm": "none", "bus_bytes": 0.0, "bandwidth_gbs": 0.0, "latency_s": 0.0,
                "link": link}
    ways = _KINDS[kind](float(nbytes), _Span(group, nodes, group // nodes), ic)
    best = min(ways, key=lambda w: w.transfer_s + w.latency_s)  # ring first: it wins a tie
    return {"seconds": best.transfer_s + best.latency_s, "algorithm": best.algorithm, "bus_bytes": best.bus_bytes,
            "bandwidth_gbs": best.bus_bytes / best.transfer_s / GB, "latency_s": best.latency_s, "link": link}


def _ring(bus_bytes: float, passes: int, span: _Span, ic: Interconnect) -> _Way:
    """A ring moving ``bus_bytes`` per rank in ``passes`` trips round it (all_reduce: 2)."""
    gbs = ic.intra_gbs if span.nodes == 1 else min(ic.intra_gbs, span.per_node * ic.inter_gbs)
    steps, inter_steps = passes * (span.ranks - 1), passes * (span.nodes - 1)
    latency_us = (steps - inter_steps) * ic.intra_latency_us + inter_steps * ic.inter_latency_us
    return _Way("ring", bus_bytes, bus_bytes / (gbs * GB * ic.efficiency), latency_us * US)


def _tree(nbytes: float, span: _Span, ic: Interconnect) -> _Way:
    """NCCL's double binary tree between nodes, a chain inside each: reduce up, broadcast down."""
    rate = GB * ic.efficiency
    chain_s = 2 * nbytes / (ic.intra_gbs * rate) if span.per_node > 1 else 0.0
    node_out = nbytes if span.nodes == 2 else 2 * nbytes  # through each node's NICs
    nic_s = node_out / (span.per_node * ic.inter_gbs * rate)
    depth = span.nodes.bit_length() - 1  # log2 rounded down: NCCL's log2i
    latency_us = 2 * ((span.per_node - 1) * ic.intra_latency_us + depth * ic.inter_latency_us)
    return _Way("tree", 2 * nbytes, max(chain_s, nic_s), latency_us * US)


def collective_size(kind: str, send_bytes: int, recv_bytes: int) -> int:
    """The ``nbytes`` ``collective_time`` takes, from one call's buffers on a rank: an all-gather's
    output, the input of the others."""
    return recv_bytes if kind == "all_gather" else send_bytes


def bus_bytes(kind: str, nbytes: float, n: int) -> float:
    """What one rank sends for a collective of ``nbytes`` over ``n`` ranks: nccl-tests' bus bytes
    (the table in the module docstring)."""
    if n <= 1:
        return 0.0
    return {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(kind, (n - 1) / n) * nbytes


def _gather_or_scatter(nbytes: float, span: _Span, ic: Interconnect) -> list[_Way]:
    return [_ring(bus_bytes("all_gather", nbytes, span.ranks), 1, span, ic)]


def _all_reduce(nbytes: float, span: _Span, ic: Interconnect) -> list[_Way]:
    ring = _ring(bus_bytes("all_reduce", nbytes, span.ranks), 2, span, ic)
    return [ring, _tree(nbytes, span, ic)] if span.nodes > 1 else [ring]


def _broadcast(nbytes: float, span: _Span, ic: Interconnect) -> list[_Way]:
    return [_ring(bus_bytes("broadcast", nbytes, span.ranks), 1, span, ic)]


def _all_to_all(nbytes: float, span: _Span, ic: Interconnect) -> list[_Way]:
    n, k = span.ranks, span.per_node
    rate = GB * ic.efficiency
    transfer_s = max((k - 1) / n * nbytes / (ic.intra_gbs * rate), (n - k) / n * nbytes / (ic.inter_gbs * rate))
    latency_us = (k - 1) * ic.intra_latency_us + (n - k) * ic.inter_latency_us
    return [_Way("p2p", bus_bytes("all_to_all", nbytes, n), transfer_s, latency_us * US)]


# kind -> the algorithms NCCL may run it with
_KINDS: dict[str, Callable[[float, _Span, Interconnect], list[_Way]]] = {
    "all_gather": _gather_or_scatter,
    "reduce_scatter": _gather_or_scatter,
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "all_to_all": _all_to_all,
}


def _check(kind: str, nbytes: int, group: int, ic: Interconnect, nodes: int) -> None:
    """One clear error for what ``collective_time`` cannot answer."""
    if kind not in _KINDS:
        raise ArchscanError(f"unknown collective {kind!r}", hint=f"one of: {', '.join(_KINDS)}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not nbytes >= 0:
        raise ArchscanError(f"{kind} of {nbytes!r} bytes: the size must be a number of bytes ≥ 0")
    for what, value in (("group", group), ("nodes", nodes)):
        if not _whole(value) or value < 1:
            raise ArchscanError(f"{kind}: {what} = {value!r} must be a whole number ≥ 1")
    if nodes > group:
        raise ArchscanError(f"{kind}: a group of {group} ranks cannot span {nodes} nodes",
                            hint="nodes is how many nodes the group's ranks lie on (group_span)")
    if ceil(group / nodes) > ic.gpus_per_node:
        raise ArchscanError(f"{kind}: {group} ranks on {nodes} node(s) need more than {ic.name}'s "
                            f"{ic.gpus_per_node} GPUs per node", hint="give the nodes the group spans (group_span)")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

