"""Every ``apply:`` line a scan prints runs as printed and does what its recommendation said.

A few hand-made models (defined here; archscan loads this file as ``test_applied.py:Name``) are
scanned on the command line, and every recommendation's ``apply`` is run: the ``archscan ...``
commands as a shell would split them, in a temporary directory their ``-o`` files land in; the
Python lines of low precision and channels_last with the model and an input in scope. Then what
each command wrote is scanned (``archscan FILE.pt2``, its own analysis of the saved program) and
set against the promise: the batch norms folded and attentions rewritten that the reason counts,
the kernels, bytes and parameters the estimate says go (exact for folds, prune and a distilled
student's params and FLOPs; at least the estimate for an attention rewrite, whose kernel's own
outputs and the copies its output layout saves are not in it). A model whose export fails gets no
``archscan`` command it cannot run.
"""

import json
import re
import shlex
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

import archscan
from archscan.cli import main
from archscan.measure.predict import kernels
from archscan.recommend import NEEDS_EXPORT, RETRAINING

HERE = __file__


class ConvBNNet(nn.Module):
    """Three conv -> BN -> ReLU, the last one residual, then a classifier: three folds."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32)
        self.conv2, self.bn2 = nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)
        self.conv3, self.bn3 = nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        x = torch.relu(self.bn3(self.conv3(x)) + x)
        return self.fc(x.mean((2, 3)))


class SharedConv(nn.Module):
    """A stem conv -> BN (folds), then one conv applied twice, each call with its own BN: the
    weight is read by two calls, so neither of those norms folds. One fold, not three."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn_a, self.bn_b = nn.BatchNorm2d(16), nn.BatchNorm2d(16)

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        return self.bn_b(self.conv(torch.relu(self.bn_a(self.conv(x)))))


class AttentionBN(nn.Module):
    """A patchifying conv -> BN, then one hand-written two-head attention over the 64 patches:
    ``archscan fuse`` folds the norm and rewrites the attention in one run."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 32, 4, stride=4, bias=False), nn.BatchNorm2d(32)
        self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x))).flatten(2).transpose(1, 2)  # [B, 64, 32]
        q, k, v = self.qkv(x).reshape(x.shape[0], -1, 3, 2, 16).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1) @ v
        return self.out(a.transpose(1, 2).reshape(x.shape[0], -1, 32))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class TinyResNet(nn.Module):
    """Two stages of two residual blocks: prune and distill recommendations (two of each) beside the folds."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.layer1 = nn.Sequential(Block(32), Block(32))
        self.down = nn.Sequential(nn.Conv2d(32, 64, 3, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.layer2 = nn.Sequential(Block(64), Block(64))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.layer2(self.down(self.layer1(self.stem(x)))).mean((2, 3)))


class Branchy(nn.Module):
    """conv -> BN, then a branch on the output's value: torch.export cannot capture it."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)

    def forward(self, x):
        y = self.bn(self.conv(x))
        if y.mean() > 0:
            return torch.relu(y)
        return y


INPUT = "1,3,32,32"


def _cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _scan(capsys, monkeypatch, name):
    """(report as JSON, the apply lines the text report prints), the terminal wide enough for one line each."""
    monkeypatch.setenv("COLUMNS", "10000")
    target = f"{HERE}:{name}"
    report = json.loads(_cli(capsys, target, "--input", INPUT, "--json"))
    text = _cli(capsys, target, "--input", INPUT)
    printed = [line.strip().removeprefix("apply: ") for line in text.splitlines() if line.strip().startswith("apply: ")]
    return report, printed


FOLDS, ATTENTIONS = r"fold (\d+) batch norm", r"(\d+) hand-written attention"


def _promised(rec: dict, pattern: str) -> int:
    """The count a reason promises: 'fold 3 batch norm(s)', '1 hand-written attention(s)'."""
    found = re.search(pattern, rec["reason"])
    return int(found.group(1)) if found else 0


def _program(capsys, path) -> dict:
    return json.loads(_cli(capsys, str(path), "--json"))


def _totals(report: dict) -> dict:
    """params, flops, mac_bytes and kernels of a JSON report, as ``report_totals`` counts them."""
    t = report["totals"]
    return {"params": t["params"], "flops": t["flops"], "mac_bytes": t["mac_bytes"],
            "kernels": sum(kernels(SimpleNamespace(aten_ops=n["aten_ops"])) for n in report["nodes"])}


def _count(report: dict, needle: str) -> int:
    return sum(1 for n in report["nodes"] if any(needle in op for op in n["aten_ops"]))


def _check_fuse(rec, original, saved):
    """The folds and rewrites the reason counts are in the saved program; the saving is what it measures."""
    assert _count(original, "batch_norm") - _count(saved, "batch_norm") == _promised(rec, FOLDS)
    assert _count(saved, "scaled_dot_product") - _count(original, "scaled_dot_product") == \
        _promised(rec, ATTENTIONS)
    before, after, promised = _totals(original), _totals(saved), rec["estimated_saving"]
    assert before["flops"] - after["flops"] == promised["flops"] == 0
    assert before["params"] - after["params"] == promised["params"]
    if _promised(rec, ATTENTIONS):  # SDPA's own outputs and the copies its layout saves come besides
        assert before["kernels"] - after["kernels"] >= promised["kernels"]
        assert before["mac_bytes"] - after["mac_bytes"] >= promised["mac_bytes"]
    else:
        assert before["kernels"] - after["kernels"] == promised["kernels"]
        assert before["mac_bytes"] - after["mac_bytes"] == promised["mac_bytes"]


def _check_prune(rec, original, saved):
    before, after = _totals(original), _totals(saved)
    assert {k: before[k] - after[k] for k in ("params", "flops", "mac_bytes", "kernels")} == \
        {k: rec["estimated_saving"][k] for k in ("params", "flops", "mac_bytes", "kernels")}


def _check_distill(rec, original, saved):
    # the student is saved in training mode: its batch norms also write their running statistics,
    # which its scan counts in the bytes moved; params and FLOPs are the inference figures
    before, after = _totals(original), _totals(saved)
    assert before["params"] - after["params"] == rec["estimated_saving"]["params"]
    assert before["flops"] - after["flops"] == rec["estimated_saving"]["flops"]


_CHECKS = {"fuse": _check_fuse, "sdpa": _check_fuse, "prune": _check_prune, "distill": _check_distill}


@pytest.mark.parametrize("name, folds, attentions", [
    ("ConvBNNet", 3, 0), ("SharedConv", 1, 0), ("AttentionBN", 1, 1), ("TinyResNet", 10, 0),
])
def test_every_apply_line_runs_and_keeps_its_promise(name, folds, attentions, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the -o files land here
    report, printed = _scan(capsys, monkeypatch, name)
    recs = report["recommendations"]
    assert printed == [r["apply"] for r in recs[:5]]  # one line each, as the report prints them
    (fuse,) = [r for r in recs if r["kind"] in ("fuse", "sdpa")]  # one archscan fuse run, one recommendation
    assert (_promised(fuse, FOLDS), _promised(fuse, ATTENTIONS)) == (folds, attentions)
    outputs = [shlex.split(r["apply"])[shlex.split(r["apply"]).index("-o") + 1] for r in recs if " -o " in r["apply"]]
    assert len(outputs) == len(set(outputs))  # no recommendation overwrites another's file
    kinds = [r["kind"] for r in recs]
    retraining = [k in RETRAINING for k in kinds]
    assert retraining == sorted(retraining)  # prune, distill, align after every change that keeps the model
    model, x = globals()[name]().eval(), torch.randn(*map(int, INPUT.split(",")))
    for rec in recs:
        line = rec["apply"]
        if line.startswith("archscan "):
            words = shlex.split(line)
            _cli(capsys, *words[1:])
            path = tmp_path / words[words.index("-o") + 1]
            assert path.is_file()
            _CHECKS[rec["kind"]](rec, report, _program(capsys, path))
        elif rec["kind"] in ("low-precision", "channels-last"):
            with torch.no_grad():
                exec(line, {"torch": torch, "model": model, "x": x})
        else:  # compile, hygiene fixes: code or words to apply in the model's source, no command
            assert "archscan" not in line.split()[0] and " -o " not in line
    if name == "TinyResNet":
        assert {"prune", "distill"} <= set(kinds)


def test_a_model_export_cannot_take_gets_no_command_that_fails(capsys, monkeypatch, tmp_path):
    """Branchy's export failed in the scan: the fold is still worth doing, by hand, and says why;
    it ranks below every change that applies; no archscan command is printed for it. Run anyway,
    ``archscan fuse`` fails as the scan said it would."""
    monkeypatch.chdir(tmp_path)
    report, printed = _scan(capsys, monkeypatch, "Branchy")
    assert any("export failed" in note for note in report["capture_notes"])
    recs = report["recommendations"]
    assert recs[-1]["kind"] == "fuse" and not any(r["kind"] in NEEDS_EXPORT for r in recs[:-1])
    fuse = recs[-1]
    assert fuse["reason"].startswith("archscan fuse cannot apply this here: torch.export failed")
    assert "fuse_conv_bn_eval" in fuse["apply"] and not fuse["apply"].startswith("archscan")
    assert fuse["estimated_saving"]["kernels"] == 1
    assert not [line for line in printed if line.startswith("archscan ")]
    assert main(["fuse", f"{HERE}:Branchy", "--input", INPUT, "-o", str(tmp_path / "never.pt2")]) != 0
    assert "torch.export could not export" in capsys.readouterr().err


def test_a_python_object_gets_python_that_runs(tmp_path, monkeypatch):
    """A model given as an object: the fuse recommendation is a Python call, and it runs as printed."""
    monkeypatch.chdir(tmp_path)
    model, inputs = ConvBNNet().eval(), [(1, 3, 32, 32)]
    (rec,) = [r for r in archscan.scan(model, inputs).recommendations if r.kind == "fuse"]
    scope = {"archscan": archscan, "model": model, "inputs": inputs}
    exec(rec.apply, scope)
    assert (tmp_path / "model-fused.pt2").is_file()
