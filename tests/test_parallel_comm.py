"""Collectives' time on named interconnects (archscan.parallel.comm): exact values with the arithmetic
in a comment, the choice between ring and tree, the span of a mesh dimension's groups, and one
published nccl-tests run as an oracle.

Convention: GB = 1e9 bytes; bandwidths per GPU and per direction; TOY's round figures give an
effective 50 GB/s inside a node and 5 GB/s per NIC (efficiency 0.5).
"""

import ast
import dataclasses
import math
import os

import pytest

from archscan.errors import ArchscanError
from archscan.parallel.comm import Interconnect, collective_time, group_span, interconnect_for

TOY = Interconnect("toy", gpus_per_node=8, intra_gbs=100.0, intra_latency_us=1.0, inter_gbs=10.0,
                   inter_latency_us=10.0, efficiency=0.5, source="round figures for the arithmetic")
KINDS = ["all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all"]


def seconds(kind, nbytes, group, ic=TOY, nodes=1):
    return collective_time(kind, nbytes, group, ic, nodes)["seconds"]


# ---- exact values -----------------------------------------------------------------------------------


def test_ring_all_gather_of_1_gib_on_8_h100s():
    r = collective_time("all_gather", 2**30, 8, interconnect_for("h100-nvlink"))
    # 7/8 * 2**30 = 939524096 bytes at 450e9 * 0.80 = 360 GB/s, plus 7 steps of 0.6 us
    assert r["seconds"] == pytest.approx(939_524_096 / 360e9 + 7 * 0.6e-6, rel=1e-12)
    assert r["bus_bytes"] == 939_524_096
    assert r["bandwidth_gbs"] == pytest.approx(360.0)
    assert r["latency_s"] == pytest.approx(4.2e-6)
    assert (r["algorithm"], r["link"]) == ("ring", "intra")


def test_reduce_scatter_across_two_nodes_uses_the_group_nics():
    r = collective_time("reduce_scatter", 16_000_000, 16, TOY, nodes=2)
    # 15/16 * 16e6 = 15e6 bytes at min(100, 8 NICs * 10) * 0.5 = 40 GB/s = 375 us;
    # 15 steps, 1 of them between nodes: 14 * 1 us + 10 us = 24 us
    assert r["seconds"] == pytest.approx(375e-6 + 24e-6, rel=1e-12)
    assert r["bandwidth_gbs"] == pytest.approx(40.0)
    assert (r["algorithm"], r["link"]) == ("ring", "inter")


def test_one_gpu_per_node_runs_at_one_nic():
    # fsdp over 8 nodes beside tp=8: 7/8 * 8e6 = 7e6 bytes at min(100, 1 NIC * 10) * 0.5 = 5 GB/s = 1.4 ms;
    # all 7 steps between nodes: 70 us
    assert seconds("all_gather", 8_000_000, 8, nodes=8) == pytest.approx(1.4e-3 + 70e-6, rel=1e-12)


def test_ring_all_reduce_inside_a_node():
    r = collective_time("all_reduce", 8_000_000, 8, TOY)
    # 2 * 7/8 * 8e6 = 14e6 bytes at 100 * 0.5 = 50 GB/s = 280 us; 2 * 7 steps of 1 us
    assert r["seconds"] == pytest.approx(280e-6 + 14e-6, rel=1e-12)
    assert r["bus_bytes"] == 14_000_000
    assert r["algorithm"] == "ring"


def test_broadcast_is_a_ring_pipeline():
    # 1e6 bytes at 50 GB/s = 20 us, 7 steps of 1 us
    assert seconds("broadcast", 1_000_000, 8) == pytest.approx(20e-6 + 7e-6, rel=1e-12)
    # across 2 nodes: 1e6 bytes at 40 GB/s = 25 us; 15 steps, 1 between nodes: 14 + 10 us
    assert seconds("broadcast", 1_000_000, 16, nodes=2) == pytest.approx(25e-6 + 24e-6, rel=1e-12)


def test_all_to_all_inside_a_node_and_across_two():
    r = collective_time("all_to_all", 8_000_000, 8, TOY)
    # 7/8 * 8e6 = 7e6 bytes to the 7 peers at 50 GB/s = 140 us; 7 steps of 1 us
    assert r["seconds"] == pytest.approx(140e-6 + 7e-6, rel=1e-12)
    assert (r["algorithm"], r["bus_bytes"]) == ("p2p", 7_000_000)
    r = collective_time("all_to_all", 16_000_000, 16, TOY, nodes=2)
    # over NVLink 7/16 * 16e6 = 7e6 bytes at 50 GB/s = 140 us, at once with 8/16 * 16e6 = 8e6 bytes
    # through the rank's own NIC at 10 * 0.5 = 5 GB/s = 1.6 ms; 7 peers at 1 us and 8 at 10 us = 87 us
    assert r["seconds"] == pytest.approx(1.6e-3 + 87e-6, rel=1e-12)
    assert r["bus_bytes"] == 15_000_000


# ---- ring or tree -----------------------------------------------------------------------------------


def test_all_reduce_of_a_small_message_over_many_nodes_takes_the_tree():
    r = collective_time("all_reduce", 1024, 512, TOY, nodes=64)
    # ring: 2 * 511 = 1022 steps, 2 * 63 = 126 between nodes: 896 * 1 + 126 * 10 = 2156 us
    # tree: 2 * (7 chain steps * 1 us + log2(64) = 6 levels * 10 us) = 134 us, and 2 * 1024 bytes
    #       through 8 NICs at 40 GB/s (the chain's 2 * 1024 bytes at 50 GB/s is faster)
    assert r["algorithm"] == "tree"
    assert r["seconds"] == pytest.approx(2048 / 40e9 + 134e-6, rel=1e-12)
    assert r["latency_s"] == pytest.approx(134e-6)


def test_all_reduce_of_a_large_message_over_many_nodes_takes_the_ring():
    r = collective_time("all_reduce", 1_000_000_000, 32, TOY, nodes=4)
    # ring: 2 * 31/32 * 1e9 = 1.9375e9 bytes at 40 GB/s = 48.4375 ms; 62 steps, 6 between nodes: 56 + 60 us
    # tree: 2e9 bytes through the NICs at 40 GB/s = 50 ms, slower
    assert r["algorithm"] == "ring"
    assert r["seconds"] == pytest.approx(48.4375e-3 + 116e-6, rel=1e-12)


def test_all_reduce_between_two_nodes_takes_the_tree():
    r = collective_time("all_reduce", 1_000_000_000, 16, TOY, nodes=2)
    # ring: 2 * 15/16 * 1e9 = 1.875e9 bytes at 40 GB/s = 46.875 ms
    # tree: each node sends 1e9 bytes through its NICs (25 ms at 40 GB/s) while its chain moves
    #       2e9 bytes at 50 GB/s = 40 ms; 2 * (7 * 1 + 1 * 10) = 34 us
    assert r["algorithm"] == "tree"
    assert r["seconds"] == pytest.approx(40e-3 + 34e-6, rel=1e-12)
    assert r["bandwidth_gbs"] == pytest.approx(50.0)


def test_all_reduce_inside_a_node_is_a_ring():
    for nbytes in (8, 1024, 2**30):
        assert collective_time("all_reduce", nbytes, 8, interconnect_for("h100"))["algorithm"] == "ring"


def test_nccl_tests_two_nodes_of_8_h100_with_8x200g():
    """Oracle: a published nccl-tests log (github.com/lessizzmore/create-a3mega-ztan-fork,
    ztan-NCCL-test-result): all_reduce_perf on 16 H100s in 2 Google Cloud A3 Mega nodes, NVLink inside
    and 8 NICs of 200 Gb/s (25 GB/s) per node, took 47,535 us for 8 GiB (busbw 339 GB/s)."""
    a3_mega = Interconnect("a3-mega", 8, 450.0, 0.6, 25.0, 2.7, efficiency=1.0, source="Google Cloud A3 Mega")
    r = collective_time("all_reduce", 8 * 2**30, 16, a3_mega, nodes=2)
    measured = 47_535e-6
    # a ring through the 8 NICs could not do it: 2 * 15/16 * 2**33 bytes at 200 GB/s = 80.5 ms
    assert 2 * 15 / 16 * 2**33 / 200e9 > 1.6 * measured
    # the tree sends 2**33 bytes through them: 42.9 ms at the datasheet's rate, 90% of the measured time
    assert r["algorithm"] == "tree"
    assert 0.85 * measured < r["seconds"] < measured


# ---- invariants -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["h100-nvlink", "a100", "h100-pcie", "h100-ethernet-100g", "gb200-nvl72"])
def test_seconds_are_bus_bytes_over_bandwidth_plus_latency(name):
    for kind in KINDS:
        for group, nodes in [(2, 1), (8, 1), (16, 2), (64, 8), (8, 8)]:
            r = collective_time(kind, 123_456_789, group, interconnect_for(name), nodes)
            transfer_s = r["bus_bytes"] / (r["bandwidth_gbs"] * 1e9)
            assert r["seconds"] == pytest.approx(transfer_s + r["latency_s"], rel=1e-12)
            assert r["seconds"] > r["latency_s"] > 0
            assert r["link"] == ("intra" if nodes == 1 else "inter")


def test_efficiency_divides_the_bandwidth():
    full = dataclasses.replace(TOY, efficiency=1.0)
    for kind in KINDS:
        for group, nodes in [(8, 1), (32, 4)]:
            runs = [collective_time(kind, 10**9, group, ic, nodes) for ic in (TOY, full)]
            transfer = [r["seconds"] - r["latency_s"] for r in runs]
            assert transfer[0] == pytest.approx(2 * transfer[1], rel=1e-12), kind


def test_a_group_of_one_or_no_bytes_costs_nothing():
    for kind in KINDS:
        for r in (collective_time(kind, 2**30, 1, TOY), collective_time(kind, 0, 8, TOY)):
            assert (r["seconds"], r["algorithm"], r["bus_bytes"], r["latency_s"]) == (0.0, "none", 0.0, 0.0), kind


# ---- group_span -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mesh,dim,per_node,span", [
    ({"fsdp": 8, "tp": 8}, "tp", 8, (1, 8)),                # ranks 0..7: one node
    ({"fsdp": 8, "tp": 8}, "fsdp", 8, (8, 1)),              # ranks 0, 8, ..., 56: one on each of 8 nodes
    ({"dp": 2, "fsdp": 4}, "fsdp", 8, (1, 4)),              # ranks 0..3
    ({"dp": 2, "fsdp": 4}, "dp", 8, (1, 2)),                # ranks 0, 4
    ({"fsdp": 16}, "fsdp", 8, (2, 8)),                      # ranks 0..15
    ({"dp": 4, "fsdp": 8, "tp": 2}, "fsdp", 8, (2, 4)),     # ranks 0, 2, ..., 14: 4 on each of nodes 0 and 1
    ({"dp": 4, "fsdp": 8, "tp": 2}, "dp", 8, (4, 1)),       # ranks 0, 16, 32, 48
    ({"fsdp": 18, "tp": 8}, "fsdp", 72, (2, 9)),            # NVL72: ranks 0, 8, ..., 136: 9 in each rack
    ({"a": 3, "b": 3}, "b", 8, (2, 2)),                     # uneven: ranks 6, 7 | 8 is the widest group
])
def test_group_span(mesh, dim, per_node, span):
    assert group_span(mesh, dim, per_node) == span


def test_group_span_feeds_collective_time():
    ic = interconnect_for("h100")
    nodes, _ = group_span({"fsdp": 8, "tp": 8}, "fsdp", ic.gpus_per_node)
    # one GPU per node: 7/8 * 2**30 bytes through its own NIC at 50 * 0.80 = 40 GB/s, 7 network steps of 2.7 us
    assert seconds("all_gather", 2**30, 8, ic, nodes) == pytest.approx(939_524_096 / 40e9 + 7 * 2.7e-6, rel=1e-12)


@pytest.mark.parametrize("mesh,dim,per_node,words", [
    ({"fsdp": 8}, "tp", 8, "no dimension 'tp'"),
    ({"fsdp": 0}, "fsdp", 8, "fsdp = 0"),
    ({"fsdp": 8}, "fsdp", 0, "gpus_per_node = 0"),
])
def test_group_span_refuses(mesh, dim, per_node, words):
    with pytest.raises(ArchscanError, match=words):
        group_span(mesh, dim, per_node)


# ---- the named interconnects ------------------------------------------------------------------------


@pytest.mark.parametrize("name,gpus,intra,inter", [
    ("h100-nvlink", 8, 450.0, 50.0),          # NVLink 4: 900 GB/s both ways; 400 Gb/s NDR per GPU
    ("h200-nvlink", 8, 450.0, 50.0),
    ("a100-nvlink", 8, 300.0, 25.0),          # NVLink 3: 600 GB/s both ways; 200 Gb/s HDR per GPU
    ("b200-nvlink", 8, 900.0, 50.0),          # NVLink 5: 1.8 TB/s both ways
    ("gb200-nvl72", 72, 900.0, 50.0),
    ("h100-pcie", 8, 64.0, 50.0),             # PCIe Gen5 x16: 128 GB/s both ways
    ("h100-roce", 8, 450.0, 50.0),
    ("h100-ethernet-100g", 8, 450.0, 1.5625),  # 100 Gb/s = 12.5 GB/s per node, shared by 8 GPUs
])
def test_datasheet_figures_per_gpu_and_direction(name, gpus, intra, inter):
    ic = interconnect_for(name)
    assert (ic.name, ic.gpus_per_node, ic.intra_gbs, ic.inter_gbs) == (name, gpus, intra, inter)
    assert 0 < ic.efficiency <= 1
    assert "datasheet" in ic.source and "nccl-tests" in ic.source


def test_interconnect_for_reads_names_as_users_type_them():
    typed = {"h100": "h100-nvlink", "H100": "h100-nvlink", "h100_NVLink": "h100-nvlink", "a100": "a100-nvlink",
             "b200": "b200-nvlink", "h200": "h200-nvlink", " GB200-NVL72 ": "gb200-nvl72",
             # archscan.devices.gpus's names
             "h100-sxm": "h100-nvlink", "a100-80gb": "a100-nvlink", "a100-40gb": "a100-nvlink",
             "h100-pcie": "h100-pcie"}
    assert {name: interconnect_for(name).name for name in typed} == typed


def test_h200_has_the_h100_figures_under_its_own_name():
    h100, h200 = interconnect_for("h100"), interconnect_for("h200")
    assert h200.name == "h200-nvlink"
    assert dataclasses.replace(h200, name=h100.name, source=h100.source) == h100


def test_unknown_interconnect_lists_the_names():
    with pytest.raises(ArchscanError, match="unknown interconnect 'h100-nvl144'") as err:
        interconnect_for("h100-nvl144")
    for name in ("h100-nvlink", "a100-nvlink", "b200-nvlink", "gb200-nvl72", "h100-pcie", "h100-roce",
                 "h100-ethernet-100g"):
        assert name in str(err.value)


# ---- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,words", [
    (("allreduce", 1024, 8), r"unknown collective 'allreduce' \(one of: all_gather, reduce_scatter, all_reduce"),
    (("all_reduce", -1, 8), "-1 bytes"),
    (("all_reduce", math.nan, 8), "nan bytes"),
    (("all_reduce", 1024, 0), "group = 0"),
    (("all_reduce", 1024, True), "group = True"),
    (("all_reduce", 1024, 8, 0), "nodes = 0"),
    (("all_reduce", 1024, 4, 8), "a group of 4 ranks cannot span 8 nodes"),
    (("all_reduce", 1024, 9, 1), "9 ranks on 1 node"),
])
def test_bad_input_is_refused_in_one_line(args, words):
    kind, nbytes, group, *nodes = args
    with pytest.raises(ArchscanError, match=words):
        collective_time(kind, nbytes, group, TOY, *nodes)


def test_comm_imports_only_the_standard_library_and_errors():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "archscan", "parallel", "comm.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = {("." * n.level) + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    found |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert found <= {"__future__", "collections.abc", "dataclasses", "math", "typing", "..errors", "..units"}, found
