"""Each rule fires on a small positive model with the expected evidence and stays quiet on a negative one;
the guideline probes are ranked and flagged the way the ShuffleNetV2 paper measured them."""

import linecache

import pytest
import torch
import torch.fx
import torch.nn as nn

import archscan
from archscan.rules import RULES
from archscan.rules.guidelines import g1_lower_bound, g2_reference
from archscan.zoo.probes import TABLES


def findings(target, inputs, rule, **kw):
    r = archscan.scan(target, inputs, rules=[rule], **kw)
    assert all(f.rule == rule for f in r.findings)
    return r.findings


class Conv(nn.Module):
    def __init__(self, c1, c2, k=1, groups=1, stride=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, stride=stride, padding=k // 2, groups=groups, bias=False)

    def forward(self, x):
        return self.conv(x)


def test_g1_bound_is_eq1_for_pointwise():
    # Eq. 1: MAC >= 2*sqrt(hw*B) + B/hw; hw = 3136, c1 = c2 = 128 -> equality at 819200
    hw, c = 3136, 128
    assert g1_lower_bound(hw, hw, c, c, 1, 1) == pytest.approx(819_200)
    # Eq. 2 reference: dense conv with the same input and FLOPs as a g=2 conv c=180 -> c2 = 90
    assert g2_reference(hw, hw, 180, 180, 1, 2) == pytest.approx(3136 * 180 + 3136 * 90 + 180 * 90)


def test_g1_fires_on_unbalanced_conv():
    (f,) = findings(Conv(32, 192), [(1, 32, 28, 28)], "G1")
    # MAC = 784*(32+192) + 32*192 = 181760; bound = 2*sqrt(784*784*6144) + 6144 = 129048.7...
    assert f.evidence["mac_elements"] == 181_760
    assert f.evidence["ratio"] == pytest.approx(181_760 / (2 * (784 * 784 * 6144) ** 0.5 + 6144), rel=1e-3)
    assert f.module == "conv" and f.saving["mac_bytes"] > 0


def test_g1_quiet_on_balanced_conv():
    assert findings(Conv(64, 64), [(1, 64, 28, 28)], "G1") == ()


def test_g2_fires_on_group_conv_and_not_on_dense():
    (f,) = findings(Conv(128, 128, groups=8), [(1, 128, 28, 28)], "G2")
    assert f.severity == "warning" and f.evidence["groups"] == 8
    # extra = b*c2*(1 - 1/g) elements = 784*128*7/8 = 87808 -> bytes
    assert f.saving["mac_bytes"] == 87_808 * 4
    assert findings(Conv(128, 128), [(1, 128, 28, 28)], "G2") == ()


def test_g3_fires_on_fragmented_blocks():
    (f,) = findings("zoo:g3_parallel_4", ["1,128,56,56"], "G3")
    assert (f.evidence["fragments"], f.evidence["parallel"], f.evidence["series"]) == (4, 4, 1)
    assert f.severity == "warning" and len(f.evidence["blocks"]) == 10
    (s,) = findings("zoo:g3_series_4", ["1,64,56,56"], "G3")
    assert (s.evidence["series"], s.evidence["parallel"]) == (4, 1)
    assert findings("zoo:g3_fragment_1", ["1,128,56,56"], "G3") == ()


def test_g4_share_of_elementwise_work():
    (f,) = findings("zoo:g4_relu_shortcut", ["1,32,56,56"], "G4")
    r = archscan.scan("zoo:g4_relu_shortcut", ["1,32,56,56"], rules=[])
    elem = sum(n.mac_bytes for n in r.nodes if n.category in ("activation", "elementwise"))
    assert f.evidence["mac_share"] == pytest.approx(elem / r.totals.mac_bytes, abs=1e-4)
    assert f.evidence["flops_share"] == 0.0
    assert findings("zoo:g4_plain", ["1,32,56,56"], "G4") == ()


def test_fuse_conv_bn(toy):
    (f,) = findings(f"{toy}:Net", [(1, 3, 16, 16)], "fuse-conv-bn")
    assert f.evidence["pairs"] == [{"conv": "conv", "norm": "bn", "activation": "relu"}]
    r = archscan.scan(f"{toy}:Net", [(1, 3, 16, 16)], rules=[])
    assert f.saving["mac_bytes"] == r.node("bn").mac_bytes
    assert findings(f"{toy}:Mlp", [(2, 16)], "fuse-conv-bn") == ()


def test_fuse_conv_bn_needs_single_user():
    class TwoUsers(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 1)
            self.bn = nn.BatchNorm2d(8)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y

    assert findings(TwoUsers(), [(1, 3, 8, 8)], "fuse-conv-bn") == ()


def test_host_sync(toy):
    (f,) = findings(f"{toy}:ItemScale", [(4, 8)], "host-sync")
    assert f.evidence["ops"] == ["Tensor.item", "aten._local_scalar_dense"]  # the call and the op it runs
    assert f.source.endswith("toy.py:149")  # s = x.abs().max().item()
    (d,) = findings(f"{toy}:DataBranch", [(1, 3, 8, 8)], "host-sync")
    assert "also why the graph could not be captured" in d.message
    assert findings(f"{toy}:Net", [(1, 3, 8, 8)], "host-sync") == ()


class CountAfterABranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        if y.mean() > -10:  # the capture fails here
            y = y.relu()
        return y, torch.nonzero(y)  # a sync too, but not the capture's failure


def test_only_the_sync_a_capture_failed_on_claims_it():
    """The branch's value read is why fx and export failed (export names its line); the nonzero after
    it syncs as well but is not named by any failure, and does not claim to be the cause."""
    by_ops = {tuple(f.evidence["ops"]): f for f in findings(CountAfterABranch(), [(4, 8)], "host-sync")}
    branch, count = by_ops[("aten._local_scalar_dense",)], by_ops[("aten.nonzero",)]
    assert "also why the graph could not be captured" in branch.message and branch.evidence["capture"]
    assert "also why" not in count.message and count.evidence["capture"] == []


class FoldableBehindABranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return y.relu() if y.mean() > 0 else y  # export fails here


def test_fuse_finding_does_not_send_to_archscan_fuse_when_export_failed():
    """`archscan fuse` needs torch.export: where export failed in the same scan (a detection model's
    data-dependent code), the finding says how to fold by hand instead."""
    (f,) = findings(FoldableBehindABranch().eval(), [(1, 3, 8, 8)], "fuse-conv-bn")
    assert "`archscan fuse` writes" not in f.fix and "fuse_conv_bn_eval" in f.fix and "export" in f.fix
    (g,) = findings(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).eval(), [(1, 3, 8, 8)], "fuse-conv-bn")
    assert "`archscan fuse` writes" in g.fix


def test_host_tensor(toy):
    made, moved = findings(f"{toy}:HostTensor", [(4, 8)], "host-tensor")
    assert made.saving["copies"] == 2 and made.source.endswith("toy.py:173")
    assert moved.saving["copies"] == 1
    assert findings(f"{toy}:WithBuffer", [(4, 8)], "host-tensor") == ()


def test_unused_module(toy):
    (f,) = findings(f"{toy}:Unused", [(2, 8)], "unused-module")
    assert f.module == "spare" and f.saving == {"params": 9000, "bytes": 36000}
    assert findings(f"{toy}:Net", [(1, 3, 8, 8)], "unused-module") == ()


def test_inplace(toy):
    (f,) = findings(f"{toy}:Chain", [(4, 8)], "inplace")
    # sigmoid -> mul -> add: two temporaries (4*8 floats) each written and read once more
    assert f.evidence["count"] == 2 and f.saving["mac_bytes"] == 2 * 2 * 4 * 8 * 4
    assert findings(f"{toy}:Net", [(1, 3, 8, 8)], "inplace") == ()  # ReLU(inplace=True)


def test_low_precision(toy):
    (f,) = findings(f"{toy}:Net", [(1, 3, 8, 8)], "low-precision")
    assert f.evidence["image_input"] == [1, 3, 8, 8] and "uint8" in f.fix
    assert findings(f"{toy}:Net", [(1, 3, 8, 8)], "low-precision", dtype="bfloat16") == ()


def test_channel_align():
    (f,) = findings(Conv(16, 10), [(1, 16, 8, 8)], "channel-align")
    assert f.evidence["layers"] == [{"node": "conv", "in": 16, "out": 10}]
    assert findings(Conv(3, 16), [(1, 3, 8, 8)], "channel-align") == ()  # the RGB stem is exempt


def test_channels_last(toy):
    assert len(findings(f"{toy}:Net", [(1, 3, 8, 8)], "channels-last")) == 1
    assert findings(f"{toy}:Mlp", [(2, 16)], "channels-last") == ()


def test_no_grad():
    model = nn.Sequential(nn.Linear(4, 4))
    assert len(findings(model, [(1, 4)], "no-grad")) == 1
    assert findings(model.eval(), [(1, 4)], "no-grad") == ()


class DenseMoE(nn.Module):
    """Every expert on every token, the top-k router's scores zero for the rest (Llama-4's layout)."""

    def __init__(self, h=16, n=32, experts=4, k=1):
        super().__init__()
        self.router, self.k = nn.Linear(h, experts, bias=False), k
        self.experts = nn.Parameter(torch.randn(experts, h, n))

    def forward(self, x):  # [T, h]
        logits = self.router(x)
        top, idx = torch.topk(logits, self.k, dim=1)
        scores = torch.full_like(logits, float("-inf")).scatter_(1, idx, top).sigmoid()
        rows = x.repeat(logits.shape[1], 1) * scores.t().reshape(-1, 1)
        return torch.bmm(rows.view(logits.shape[1], x.shape[0], -1), self.experts).sum(0)


def test_dense_experts():
    """Experts run on every token: E·T·h·n multiply-adds where routing k of E needs k/E of them."""
    (f,) = findings(DenseMoE(), [(8, 16)], "dense-experts")
    assert f.evidence["expert_flops"] == 4 * 8 * 16 * 32 and f.evidence["routed_flops"] == 8 * 16 * 32
    assert "4.0x" in f.message
    report = archscan.scan(DenseMoE(), [(8, 16)], recommend=False)
    assert report.totals.active_params == report.totals.params - 3 * 16 * 32
    dense = nn.Sequential(nn.Linear(16, 16))  # no router: a batched product of weights is not a mixture
    assert findings(dense, [(8, 16)], "dense-experts") == ()


def test_every_rule_has_a_test():
    tested = {"G1", "G2", "G3", "G4", "fuse-conv-bn", "reparameterize",  # reparameterize: tests/test_reparam.py
              "host-sync", "host-tensor", "unused-module", "inplace",
              "low-precision", "channel-align", "channels-last", "no-grad", "batch-size", "input-transfer",
              "decode-context", "dense-experts"}
    assert set(RULES) == tested


# --- the paper's probes -------------------------------------------------------------------------------

def block_mac(name):
    from archscan import zoo

    return archscan.scan(f"zoo:{name}", list(zoo.get_entry(name).default_input), rules=[]).totals.mac_bytes


@pytest.mark.parametrize("table", ["G1", "G2"])
def test_mac_ranks_rows_in_the_papers_speed_order(table):
    # Tables 1 and 2: rows are listed fastest first on GPU; MAC must grow down the table
    macs = [block_mac(name) for name in TABLES[table]]
    assert macs == sorted(macs) and len(set(macs)) == len(macs)


@pytest.mark.parametrize("table,rule,quiet", [("G1", "G1", "g1_ratio_1_1"), ("G2", "G2", "g2_groups_1"),
                                              ("G3", "G3", "g3_fragment_1"), ("G4", "G4", "g4_plain")])
def test_rules_flag_the_slow_rows_only(table, rule, quiet):
    from archscan import zoo

    for name in TABLES[table]:
        got = findings(f"zoo:{name}", list(zoo.get_entry(name).default_input), rule)
        assert (got == ()) == (name == quiet), (name, got)


# --- the paper's point, from the numbers ------------------------------------------------------------------

def g1g2(name):
    r = archscan.scan(f"zoo:{name}", [(1, 3, 224, 224)], rules=["G1", "G2"])
    return r.findings


def test_shufflenet_v2_has_fewer_g1_g2_findings_than_v1_and_mobilenet_v2():
    v2, v1, mb2 = (g1g2(n) for n in ("shufflenet_v2_x1_0", "shufflenet_v1_g3_x1_0", "mobilenet_v2"))
    assert len(v2) < len(v1) and len(v2) < len(mb2)
    excess = [sum(f.saving["mac_bytes"] for f in fs) for fs in (v2, v1, mb2)]
    assert excess[0] < excess[1] and excess[0] < excess[2]


def test_blocks_from_fork_join_regions_when_there_are_no_module_units():
    from archscan.graph import find_blocks

    class Flat(nn.Module):
        """Three parallel convs on one input, joined by a sum: one region, width 3."""

        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = (nn.Conv2d(8, 8, 1) for _ in range(3))
            self.d = nn.Conv2d(8, 8, 1)

        def forward(self, x):
            y = self.d(x)
            return self.a(y) + self.b(y) + self.c(y)

    r = archscan.scan(Flat(), [(1, 8, 8, 8)], rules=[])
    (block,) = find_blocks(r)
    assert block.kind == "region" and block.name == "d..add_1"
    assert (block.fragments, block.series, block.parallel) == (3, 1, 3)
    (f,) = findings(Flat(), [(1, 8, 8, 8)], "G3")
    assert f.severity == "warning" and f.evidence["parallel"] == 3



@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "shufflenet_v2_x1_0", "shufflenet_v1_g3_x1_0", "vit_b_16"])
def test_block_fragmentation_equals_networkx(name):
    """Each block's fragments, longest chain and width (fragments less a maximum matching of the
    reachability relation, Dilworth) against networkx's descendants, topological order and
    Hopcroft-Karp matching on the same nodes."""
    import networkx as nx

    from archscan.graph import FRAGMENT_CATEGORIES, DataFlow, find_blocks, to_networkx

    report = archscan.scan(f"zoo:{name}", [(1, 3, 224, 224)], rules=[], recommend=False)
    g = to_networkx(DataFlow(report))
    blocks = find_blocks(report)
    assert blocks and any(b.parallel > 1 or b.series > 1 for b in blocks) or name == "vit_b_16"
    for b in blocks:
        frags = [n for n in b.nodes if g.nodes[n]["category"] in FRAGMENT_CATEGORIES]
        sub = g.subgraph(b.nodes)
        reach = {f: nx.descendants(sub, f) & set(frags) for f in frags}
        longest = {f: 1 for f in frags}
        for f in (n for n in nx.topological_sort(sub) if n in reach):
            for h in reach[f]:
                longest[h] = max(longest[h], longest[f] + 1)
        bip = nx.Graph()
        bip.add_nodes_from(("a", f) for f in frags)
        bip.add_nodes_from(("b", f) for f in frags)
        bip.add_edges_from((("a", f), ("b", h)) for f in frags for h in reach[f])
        matched = len(nx.bipartite.hopcroft_karp_matching(bip, top_nodes=[("a", f) for f in frags])) // 2
        expected = (len(frags), max(longest.values()), len(frags) - matched) if frags else (0, 0, 0)
        assert (b.fragments, b.series, b.parallel) == expected, b.name


def test_matching_equals_hopcroft_karp_on_random_orders():
    """The width's maximum matching on random reachability relations (long augmenting paths
    included) equals networkx's Hopcroft-Karp."""
    import random

    import networkx as nx

    from archscan.graph import _matching_size

    rng = random.Random(0)
    for trial in range(200):
        n = rng.randint(1, 60)
        p = rng.choice([0.02, 0.1, 0.3, 0.7])
        left = [str(i) for i in range(n)]
        edges = {str(i): [str(j) for j in range(i + 1, n) if rng.random() < p] for i in range(n)}
        bip = nx.Graph()
        bip.add_nodes_from(("a", u) for u in left)
        bip.add_nodes_from(("b", u) for u in left)
        bip.add_edges_from((("a", u), ("b", v)) for u in left for v in edges[u])
        expected = len(nx.bipartite.hopcroft_karp_matching(bip, top_nodes=[("a", u) for u in left])) // 2
        assert _matching_size(left, edges) == expected, trial


class InceptionBlock(nn.Module):
    """A model that is one inception-like block: the input x forks into four branches, joined by cat."""

    def __init__(self, c=16):
        super().__init__()
        self.b1 = nn.Conv2d(c, 8, 1)
        self.b2 = nn.Sequential(nn.Conv2d(c, 8, 1), nn.Conv2d(8, 8, 3, padding=1))
        self.b3 = nn.Sequential(nn.Conv2d(c, 4, 1), nn.Conv2d(4, 8, 5, padding=2))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(c, 8, 1))

    def forward(self, x):
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


@pytest.mark.parametrize("method", ["fx", "export", "eager"])
def test_g3_finds_a_block_that_forks_at_the_model_input(method):
    from archscan.graph import find_blocks

    r = archscan.scan(InceptionBlock(), [(1, 16, 8, 8)], capture_method=method, rules=["G3"])
    (block,) = find_blocks(r)
    # 1x1 | 1x1 -> 3x3 | 1x1 -> 5x5 | pool -> 1x1: 7 fragmented ops, 2 in series, 4 in parallel
    assert block.name.endswith("..cat") or block.name.endswith("..cat_default")
    assert (block.fragments, block.series, block.parallel) == (7, 2, 4)
    (f,) = r.findings
    assert f.severity == "warning" and f.evidence["blocks"] == [block.name] and f.evidence["parallel"] == 4


def test_g3_finds_a_block_that_forks_at_an_attribute():
    from archscan.graph import find_blocks

    class SharedQuery(nn.Module):
        """One learned tensor (a get_attr in the graph) read by two parallel convs."""

        def __init__(self):
            super().__init__()
            self.query = nn.Parameter(torch.zeros(1, 8, 4, 4))
            self.a, self.b = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1)

        def forward(self, x):
            return x + self.a(self.query) + self.b(self.query)

    r = archscan.scan(SharedQuery(), [(1, 8, 4, 4)], rules=[])
    (block,) = find_blocks(r)
    assert block.name == "query..add_1" and (block.fragments, block.series, block.parallel) == (2, 1, 2)


class RelativePositionBias(nn.Module):
    """Swin/BEiT/MaxViT style: a registered index buffer viewed in forward. fx does not proxy buffers,
    so it runs ``index.view(-1)`` while tracing and bakes the view in as a ``_tensor_constant``."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(16, 2))
        self.register_buffer("index", torch.arange(16).view(4, 4))

    def forward(self, x):
        return x + self.table[self.index.view(-1)].view(4, 4, 2).sum(-1)


def test_host_tensor_quiet_on_buffer_views_fx_bakes_in():
    gm = torch.fx.symbolic_trace(RelativePositionBias())
    assert any(str(n.target).startswith("_tensor_constant") for n in gm.graph.nodes)  # what used to be flagged
    for target in (RelativePositionBias(), RelativePositionBias):  # a copied instance, and built on meta
        for method in ("fx", "export", "eager"):
            assert findings(target, [(4, 4)], "host-tensor", capture_method=method) == (), (target, method)


class DeviceTensor(nn.Module):
    def forward(self, x):
        return x + torch.tensor([1.0, 2.0], device=x.device)


class DeviceTensorOverTwoLines(nn.Module):
    def forward(self, x):
        offset = torch.tensor(
            [1.0, 2.0], device=x.device)
        return x + offset


class HostTensorPerCall(nn.Module):
    def forward(self, x):
        return x + torch.tensor([1.0, 2.0])


@pytest.mark.parametrize("method", ["fx", "export", "eager"])
def test_host_tensor_quiet_when_the_factory_passes_a_device(method):
    # export and eager record torch.tensor(...) as lift_fresh, without its device=: the source line has it
    assert findings(DeviceTensor(), [(4, 2)], "host-tensor", capture_method=method) == ()
    assert findings(DeviceTensorOverTwoLines(), [(4, 2)], "host-tensor", capture_method=method) == ()
    (f,) = findings(HostTensorPerCall(), [(4, 2)], "host-tensor", capture_method=method)
    assert f.severity == "warning" and f.saving["copies"] == 1
    path, _, line = f.source.rpartition(":")
    assert "torch.tensor([1.0, 2.0])" in linecache.getline(path, int(line))


def _offset(x):
    return torch.tensor([1.0, 2.0], device=x.device)


class HelperMadeTensor(nn.Module):
    """The tensor is made in a helper, as Hugging Face cache code does; a number is written in place."""

    def forward(self, x):
        y = x + _offset(x)
        y[:, 0] = 5.0  # torch wraps the number as a 0-dim tensor: kernels take it as a scalar
        return y


def _host_offset(x):
    return torch.tensor([1.0, 2.0])  # no device=: made on the host every call


class HelperMadeHostTensor(nn.Module):
    def forward(self, x):
        y = x + _host_offset(x).to(x.device)
        y[:, 0] = 5.0
        return y


@pytest.mark.parametrize("method", ["eager", "export"])  # fx cannot trace y[:, 0] =
def test_host_tensor_made_in_a_helper(method):
    # export's stack traces stop at forward; the call the helper made decides, and is the line named
    assert findings(HelperMadeTensor(), [(4, 2)], "host-tensor", capture_method=method) == ()
    (f,) = [f for f in findings(HelperMadeHostTensor(), [(4, 2)], "host-tensor", capture_method=method)
            if f.severity == "warning"]
    path, _, line = f.source.rpartition(":")
    assert "no device=" in linecache.getline(path, int(line)) and f.saving["copies"] == 1


# --- rules that read measurements (--measure --sweep); fed recorded numbers here -----------------------

def with_latency(report, **sweep):
    import dataclasses

    latency = {"device": "cuda:0", "end_to_end_ms": 10.0, "sweep": sweep}
    return dataclasses.replace(report, latency=latency)


def run(report, rule):
    from archscan.rules import run_rules

    return run_rules(report, [rule]).findings


@pytest.fixture(scope="module")
def conv_report():
    return archscan.scan(Conv(16, 16, k=3), [(1, 16, 8, 8)], rules=[])


def test_batch_size(conv_report):
    grows = [{"batch": 1, "per_s": 100.0}, {"batch": 2, "per_s": 190.0}, {"batch": 4, "per_s": 300.0},
             {"batch": 8, "per_s": 310.0}]
    (f,) = run(with_latency(conv_report, batches=grows), "batch-size")
    assert f.saving["throughput_gain"] == 3.1 and "past batch 8" in f.message
    flat = [{"batch": 1, "per_s": 100.0}, {"batch": 2, "per_s": 105.0}, {"batch": 4, "failed": "out of memory"}]
    assert run(with_latency(conv_report, batches=flat), "batch-size") == ()
    assert run(conv_report, "batch-size") == ()  # not measured: nothing to say


def test_input_transfer(conv_report):
    slow = [{"bytes": 602112, "pageable_ms": 0.30, "pinned_ms": 0.10}]
    (f,) = run(with_latency(conv_report, input_copies=slow), "input-transfer")
    assert f.saving["latency_ms"] == pytest.approx(0.2)
    same = [{"bytes": 602112, "pageable_ms": 0.10, "pinned_ms": 0.095}]
    assert run(with_latency(conv_report, input_copies=same), "input-transfer") == ()


def test_channels_last_measured(conv_report):
    (f,) = run(with_latency(conv_report, channels_last_ms=8.0), "channels-last")
    assert f.severity == "warning" and f.saving["latency_ms"] == pytest.approx(2.0)
    assert run(with_latency(conv_report, channels_last_ms=12.0), "channels-last") == ()  # slower: quiet


def test_g4_sees_element_wise_work_inside_a_whole_torch_nn_leaf():
    """fx keeps nn.TransformerDecoderLayer as one node; its layer norms, adds and ReLU still count for G4."""

    class Dec(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerDecoderLayer(32, 4, 64, batch_first=True)

        def forward(self, x, memory):
            return self.layer(x, memory)

    shares = {}
    for method in ("fx", "eager"):
        r = archscan.scan(Dec(), [(2, 10, 32), (2, 7, 32)], capture_method=method, rules=["G4"])
        (f,) = r.findings
        shares[method] = f.evidence["mac_share"]
    fx = archscan.scan(Dec(), [(2, 10, 32), (2, 7, 32)], capture_method="fx", rules=[])
    assert {"norm", "elementwise"} <= set(fx.node("layer").attrs["mac_by_category"])
    assert shares["fx"] == pytest.approx(shares["eager"], abs=0.02)


def test_decode_context_reads_the_decode_step():
    """decode-context: the step's GEMMs over every cached token against the rest of the step (the
    run behind it: tests/test_new_users.py); quiet without --decode or without such GEMMs."""
    import dataclasses

    report = archscan.scan(nn.Linear(4, 4), [(2, 4)], rules=[])
    assert run(report, "decode-context") == ()
    step = {"context": 2048, "tokens": 1, "flops": 2_100 + 41, "mac_bytes": 0}
    assert run(dataclasses.replace(report, phases={"decode": step}), "decode-context") == ()
    gemms = {"flops": 2_100, "ops": 61, "rows": 2049, "at": ["m.py:416"], "modules": ["a.kv_b_proj"] * 61}
    (f,) = run(dataclasses.replace(report, phases={"decode": {**step, "context_gemms": gemms}}), "decode-context")
    assert f.severity == "warning" and f.module == "a.kv_b_proj (+60)" and f.source == "m.py:416"
    assert f.evidence["rest_flops"] == 41 and "2,049 cached tokens" in f.message and "(51.2x)" in f.message
    small = {**gemms, "flops": 40}
    (f,) = run(dataclasses.replace(report, phases={"decode": {**step, "flops": 81, "context_gemms": small}}),
               "decode-context")
    assert f.severity == "info"
