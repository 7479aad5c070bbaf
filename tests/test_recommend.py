"""Recommendations: a model with one planted inefficiency gets that recommendation first, one per
kind; savings are exact sums of the nodes a change removes; ranking follows measured, then
predicted time, then bytes; the command that applies each names the model and inputs."""

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import archscan
from archscan.load.targets import input_specs, to_target
from archscan.measure import DeviceProfile
from archscan.recommend import RETRAINING, command_of, recommend
from archscan.rules import run_rules

BF16 = torch.bfloat16  # models in bf16 keep the low-precision recommendation out of the way


def first(model, inputs, **kw):
    report = archscan.scan(model, inputs, **kw)
    assert report.recommendations, "no recommendation"
    return report, report.recommendations[0]


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 64, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(64)

    def forward(self, x):
        return self.bn(self.conv(x))


class Attention(nn.Module):
    """softmax(q @ k^T / sqrt(d) + mask) @ v, written out."""

    def forward(self, q, k, v, mask):
        s = q @ k.transpose(-2, -1) / 8.0 + mask
        return F.softmax(s, dim=-1) @ v


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        y = self.fc(x)
        return torch.sigmoid(y * 2.0 + 1.0) * y


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(1024, 1024)

    def forward(self, x):
        return self.fc(x)


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


class Sync(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = self.fc(x)
        return y * float(y.abs().max().item())


class HostTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x) * torch.tensor([2.0], dtype=x.dtype)


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.head = nn.Linear(16, 1000)

    def forward(self, x):
        return self.fc(x)


class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(30, 30)

    def forward(self, x):
        return self.fc(x)


class Linear16(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x)


def test_fuse_first_with_exact_saving():
    report, rec = first(ConvBN().eval(), [(1, 8, 32, 32)], dtype=BF16)
    assert rec.kind == "fuse" and rec.target == ("bn",) and rec.basis == "mac"
    bn = report.node("bn")
    # the norm's bytes go; the conv gains a 64-element bf16 bias it reads: 64 * 2 bytes
    assert rec.estimated_saving["mac_bytes"] == bn.mac_bytes - 64 * 2
    # BN weight + bias (128) go, the conv's new bias (64) comes
    assert rec.estimated_saving["params"] == 128 - 64
    assert rec.estimated_saving["kernels"] == 1
    assert rec.findings == ({"rule": "fuse-conv-bn", "module": "conv"},)
    assert rec.apply == "archscan.fuse(model, inputs, path='model-fused.pt2')"  # a Python object: a Python call


def test_sdpa_first_and_compile_does_not_count_its_ops_twice():
    shapes = [(1, 4, 64, 32), (1, 4, 64, 32), (1, 4, 64, 32), (1, 1, 64, 64)]
    report, rec = first(Attention().eval(), shapes, dtype=BF16)
    assert rec.kind == "sdpa"
    # scores [1,4,64,64] bf16 = 32 KiB, written by matmul, div, add, softmax and each read once
    scores = 1 * 4 * 64 * 64 * 2
    assert rec.estimated_saving["mac_bytes"] == 2 * 4 * scores
    assert rec.estimated_saving["kernels"] == 4  # matmul, div, add, softmax, matmul -> one kernel
    assert "1×4×64×64" in rec.reason
    assert not any(r.kind == "compile" for r in report.recommendations)  # the chain is SDPA's


def test_compile_first_on_elementwise_chain():
    report, rec = first(Chain().eval(), [(4, 64)], dtype=BF16)
    assert rec.kind == "compile" and rec.apply == "model = torch.compile(model)"
    # links mul -> add -> sigmoid -> mul: three temporaries of 4*64 bf16 written and read once
    assert rec.estimated_saving["mac_bytes"] == 3 * 2 * 4 * 64 * 2
    assert rec.estimated_saving["kernels"] == 3
    assert {"rule": "inplace", "module": rec.findings[-1]["module"]} in rec.findings


def test_low_precision_first_on_float32_linear():
    report, rec = first(Wide().eval(), [(8, 1024)])
    assert rec.kind == "low-precision"
    assert rec.estimated_saving["mac_bytes"] == report.node("fc").mac_bytes // 2
    assert "--amp bf16" in rec.apply or "autocast" in rec.apply


def test_channels_last_first_on_conv_model():
    _, rec = first(Conv().eval(), [(1, 16, 32, 32)], dtype=BF16)
    assert rec.kind == "channels-last" and rec.basis == "mac"
    assert "channels_last" in rec.apply and "not measured" in rec.reason


@pytest.mark.parametrize("model, inputs, kind", [
    (Sync().eval(), [(2, 16)], "host-sync"),
    (HostTensor().eval(), [(2, 16)], "buffer"),
    (Unused().eval(), [(2, 16)], "remove-unused"),
    (Odd().eval(), [(2, 30)], "align"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_finding_kinds_first(model, inputs, kind):
    report, rec = first(model, inputs, dtype=BF16)
    assert rec.kind == kind
    assert rec.findings and rec.findings[0]["rule"] in {f.rule for f in report.findings}


def test_unused_saves_the_parameters():
    _, rec = first(Unused().eval(), [(2, 16)], dtype=BF16)
    assert rec.estimated_saving["params"] == 16 * 1000 + 1000


def test_eval_first_on_a_module_in_train_mode():
    _, rec = first(Linear16().train(), [(2, 16)], dtype=BF16)
    assert rec.kind == "eval" and "eval()" in rec.apply


def test_pin_memory_from_a_measured_sweep():
    report = archscan.scan(Linear16(), [(2, 16)], dtype=BF16, rules=[])
    sweep = {"input_copies": [{"input": 0, "pageable_ms": 1.0, "pinned_ms": 0.25}]}
    report = dataclasses.replace(report, latency={"device": "cuda:0", "end_to_end_ms": 2.0, "sweep": sweep})
    report = recommend(run_rules(report))
    rec = report.recommendations[0]
    assert rec.kind == "pin-memory" and rec.basis == "measured" and rec.estimated_saving["ms"] == pytest.approx(0.75)


def test_no_recommendations_when_nothing_to_change():
    report = archscan.scan(Linear16().eval(), [(2, 16)], dtype=BF16)
    assert report.recommendations == ()


def _profile(**kw):
    base = dict(device="cpu", name="test", threads=None, peak_flops={"float32": 1e9, "bfloat16": 2e9},
                bandwidth=1e9, launch_overhead_ms=0.01, created="now", torch_version=torch.__version__)
    return DeviceProfile(**{**base, **kw})


def test_predicted_basis_is_the_removed_nodes_roofline():
    report = archscan.scan(ConvBN().eval(), [(1, 8, 32, 32)], dtype=BF16, profile=_profile())
    rec = next(r for r in report.recommendations if r.kind == "fuse")
    bn = report.node("bn")
    assert rec.basis == "predicted"
    # 1 GB/s: the norm's bytes in ms, plus one launch of 0.01 ms
    assert rec.estimated_saving["ms"] == pytest.approx(bn.mac_bytes / 1e9 * 1e3 + 0.01)
    assert rec.estimated_saving["ms"] == pytest.approx(bn.predicted_ms)


def test_measured_basis_ranks_before_bytes():
    report = archscan.scan(ConvBN().eval(), [(1, 8, 32, 32)], dtype=BF16, rules=None, profile=False)
    nodes = tuple(dataclasses.replace(n, latency_ms=0.5 if n.name == "bn" else 0.1) for n in report.nodes)
    report = recommend(dataclasses.replace(report, nodes=nodes))
    rec = report.recommendations[0]
    assert rec.kind == "fuse" and rec.basis == "measured" and rec.estimated_saving["ms"] == 0.5
    timed = [r for r in report.recommendations if "ms" in r.estimated_saving]
    untimed = [r for r in report.recommendations if "ms" not in r.estimated_saving]
    assert report.recommendations[:len(timed)] == tuple(timed) and untimed == list(report.recommendations[len(timed):])


def test_ranking_by_bytes_without_time():
    class Both(nn.Module):  # a small conv-bn and a wide unused head, in float32
        def __init__(self):
            super().__init__()
            self.body = ConvBN()
            self.fc = nn.Linear(64, 4096)

        def forward(self, x):
            return self.fc(self.body(x).mean((2, 3)))

    report = archscan.scan(Both().eval(), [(1, 8, 32, 32)])
    recs = report.recommendations
    retraining = [r.kind in RETRAINING for r in recs]
    assert retraining == sorted(retraining) and any(retraining)  # a prune: after every change that keeps the model
    for tier in (False, True):  # within a tier, by bytes
        saved = [r.estimated_saving.get("mac_bytes", 0) for r in recs if (r.kind in RETRAINING) == tier]
        assert saved == sorted(saved, reverse=True)
    assert all(r.basis == "mac" for r in recs)


def test_command_names_the_target_and_inputs():
    report = archscan.scan("zoo:resnet18", ["1,3,64,64"], name="zoo:resnet18")
    assert command_of(report) == "zoo:resnet18 --input 1,3,64,64"
    rec = next(r for r in report.recommendations if r.kind == "fuse")
    assert rec.apply == "archscan fuse zoo:resnet18 --input 1,3,64,64 -o resnet18-fused.pt2"
    assert rec.estimated_saving["kernels"] == 20 and len(rec.target) == 20


def test_command_keeps_named_and_integer_inputs():
    report = archscan.scan("zoo:llama_tiny", {"tokens": "1,16:int64"}, name="zoo:llama_tiny", rules=[])
    assert command_of(report) == "zoo:llama_tiny --input tokens=1,16:int64"


def test_json_and_text_carry_recommendations(capsys):
    from archscan.cli import main

    assert main(["zoo:mobilenet_v2", "--input", "1,3,64,64"]) == 0
    out = capsys.readouterr().out
    assert "recommendations (top" in out and "1. " in out and "apply: archscan fuse zoo:mobilenet_v2" in out
    assert main(["zoo:mobilenet_v2", "--input", "1,3,64,64", "--json"]) == 0
    import json

    recs = json.loads(capsys.readouterr().out)["recommendations"]
    assert {"kind", "target", "reason", "estimated_saving", "basis", "apply", "findings"} <= set(recs[0])
    fuse = next(r for r in recs if r["kind"] == "fuse")
    assert fuse["estimated_saving"]["kernels"] == 52


def test_measure_verifies_the_fusion():
    report = archscan.scan("zoo:resnet18", ["1,3,32,32"], name="zoo:resnet18", measure=True)
    rec = next(r for r in report.recommendations if r.kind == "fuse")
    assert rec.verified is True
    saved = rec.measured_saving
    # applied for real: exactly the bytes, kernels and parameters estimated from the graph
    assert (saved["mac_bytes"], saved["kernels"], saved["params"]) == (
        rec.estimated_saving["mac_bytes"], rec.estimated_saving["kernels"], rec.estimated_saving["params"])
    assert "ms" in saved and saved["device"] == "cpu"


class TiedAcross(nn.Module):
    """stem conv -> BN folds; convs a and b hold one weight (tied), each with its own BN: neither
    of those folds (``archscan fuse`` keeps a norm after a weight another call reads)."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.a, self.b = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.b.weight = self.a.weight
        self.bn_a, self.bn_b = nn.BatchNorm2d(8), nn.BatchNorm2d(8)

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        return self.bn_b(self.b(torch.relu(self.bn_a(self.a(x)))))


class CalledTwice(TiedAcross):
    """The same, with one conv module called twice."""

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        return self.bn_b(self.a(torch.relu(self.bn_a(self.a(x)))))


@pytest.mark.parametrize("model", [TiedAcross, CalledTwice])
@pytest.mark.parametrize("capture", ["fx", "eager", "export"])
def test_fuse_promises_the_folds_fuse_makes(model, capture):
    from archscan.transform import fuse

    report = archscan.scan(model().eval(), [(1, 3, 8, 8)], capture_method=capture)
    assert report.capture == capture
    (rec,) = [r for r in report.recommendations if r.kind == "fuse"]
    assert rec.reason.startswith("fold 1 batch norm(s)") and "2 more stay" in rec.reason
    assert rec.target == ("bn0",) and rec.estimated_saving["kernels"] == 1
    assert rec.estimated_saving["params"] == 2 * 8 - 8  # bn0's weight and bias go, the stem's new bias comes
    done = fuse(to_target(model), input_specs("1,3,8,8"))
    assert [f.norm for f in done.folded] == ["bn0"] and len(done.kept) == 2
    assert done.before["kernels"] - done.after["kernels"] == rec.estimated_saving["kernels"]
    assert done.before["params"] - done.after["params"] == rec.estimated_saving["params"]


def test_one_fuse_run_is_one_recommendation():
    """A conv-bn and a hand-written attention: archscan fuse does both in one run, so one
    recommendation saves both, with one command and no "(or call ...)" after it."""

    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.attention = ConvBN(), Attention()

        def forward(self, x, q, k, v, mask):
            return self.body(x).mean(), self.attention(q, k, v, mask)

    shapes = [(1, 8, 32, 32), (1, 4, 64, 32), (1, 4, 64, 32), (1, 4, 64, 32), (1, 1, 64, 64)]
    report = archscan.scan(Both().eval(), shapes, dtype=BF16)
    (rec,) = [r for r in report.recommendations if r.kind in ("fuse", "sdpa")]
    alone = [first(ConvBN().eval(), [(1, 8, 32, 32)], dtype=BF16)[1],
             first(Attention().eval(), shapes[1:], dtype=BF16)[1]]
    assert rec.kind == "fuse" and rec.target == ("body.bn", "attention")
    for key in ("mac_bytes", "kernels", "params"):
        assert rec.estimated_saving[key] == sum(r.estimated_saving[key] for r in alone)
    assert "fold 1 batch norm(s)" in rec.reason and "1 hand-written attention(s)" in rec.reason
    assert rec.apply == "archscan.fuse(model, inputs, path='model-fused.pt2')"


def test_two_recommendations_never_write_one_file():
    from archscan.recommend import _distinct_outputs
    from archscan.results import Recommendation

    def rec(apply):
        return Recommendation("prune", ("",), "a cut", {}, "mac", apply)

    applied = [r.apply for r in _distinct_outputs([
        rec("archscan prune net.py:Net --group 1 -o Net-pruned.pt2"),
        rec("archscan prune net.py:Net --group 2 -o Net-pruned.pt2"),
        rec("archscan prune 'my net.py:Net' --group 3 -o 'my net-pruned.pt2'"),
        rec("archscan prune 'my net.py:Net' --group 4 -o 'my net-pruned.pt2'"),
        rec("prune(model, inputs, group_ids=[1], path='model-pruned.pt2')"),
        rec("prune(model, inputs, group_ids=[2], path='model-pruned.pt2')"),
        rec("model = torch.compile(model)"),
    ])]
    assert applied == [
        "archscan prune net.py:Net --group 1 -o Net-pruned.pt2",
        "archscan prune net.py:Net --group 2 -o Net-pruned-2.pt2",
        "archscan prune 'my net.py:Net' --group 3 -o 'my net-pruned.pt2'",
        "archscan prune 'my net.py:Net' --group 4 -o 'my net-pruned-2.pt2'",
        "prune(model, inputs, group_ids=[1], path='model-pruned.pt2')",
        "prune(model, inputs, group_ids=[2], path='model-pruned-2.pt2')",
        "model = torch.compile(model)",
    ]


def test_export_failure_is_read_from_the_capture_notes():
    from archscan.recommend import export_failure

    def notes(*lines):
        return dataclasses.replace(archscan.scan(Linear16().eval(), [(2, 16)], rules=[], recommend=False),
                                   capture_notes=lines)

    assert export_failure(notes()) is None
    assert export_failure(notes("fx failed (x); export failed (the model needs tensor values at m.py:4 (in f))",
                                "eager capture: ...")) == "the model needs tensor values at m.py:4 (in f)"
    assert export_failure(notes("fx failed (x); export failed (graph did not run: y)")) is None  # export itself worked


def test_a_decode_runs_low_precision_check_is_a_decode_step(capsys):
    """After --decode, the bf16 check analyses the same step in bf16 (a measurement would time a
    forward of the new tokens without their cache); the command it prints runs."""
    import json
    import shlex

    from archscan.cli import main

    assert main(["zoo:llama_tiny", "--input", "1,1:int64", "--decode", "64", "--device-profile", "h100", "--json"]) == 0
    rec = next(r for r in json.loads(capsys.readouterr().out)["recommendations"] if r["kind"] == "low-precision")
    command = rec["reason"].split("analyse the step in it: ", 1)[1]
    assert "--measure" not in command and "--decode 64 --dtype bf16 --device-profile h100" in command
    assert main(shlex.split(command)[1:]) == 0
    assert "decode     " in capsys.readouterr().out
