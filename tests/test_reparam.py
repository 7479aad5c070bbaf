"""Train-time multi-branch blocks (RepVGG, MobileOne): found, their as-deployed totals equal to the
scan of the deployed model built by hand, the deployed convolution equal to the block numerically,
and no finding on blocks that are not reparameterizable (residual blocks, the zoo)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import archscan
from archscan.cli import main


class RepBlock(nn.Module):
    """RepVGG's train-time block (Ding et al. 2021): k×k convs with batch norms (MobileOne: several),
    a 1×1 conv with a batch norm, a batch-norm identity, summed, then ReLU."""

    def __init__(self, c, branches=1):
        super().__init__()
        self.convs = nn.ModuleList(nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))
                                   for _ in range(branches))
        self.scale = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))
        self.skip = nn.BatchNorm2d(c)

    def forward(self, x):
        out = self.skip(x) + self.scale(x)
        for conv in self.convs:
            out = out + conv(x)
        return F.relu(out)

    def deployed(self) -> nn.Conv2d:
        """The one 3×3 convolution with a bias this block is at inference (the norms folded)."""
        c = self.skip.num_features
        conv = nn.Conv2d(c, c, 3, padding=1)
        weight, bias = torch.zeros(c, c, 3, 3), torch.zeros(c)
        identity = torch.zeros(c, c, 3, 3)
        identity[range(c), range(c), 1, 1] = 1
        parts = [(seq[0].weight, seq[1]) for seq in self.convs]
        parts.append((F.pad(self.scale[0].weight, (1, 1, 1, 1)), self.scale[1]))
        parts.append((identity, self.skip))
        for w, bn in parts:
            std = (bn.running_var + bn.eps).sqrt()
            weight += w * (bn.weight / std).reshape(-1, 1, 1, 1)
            bias += bn.bias - bn.running_mean * bn.weight / std
        conv.weight.data, conv.bias.data = weight, bias
        return conv


class RepNet(nn.Module):
    def __init__(self, c=16, branches=1, blocks=3):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*[RepBlock(c, branches) for _ in range(blocks)])
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class Deployed(nn.Module):
    """RepNet as inference runs it: each block one 3×3 conv with a bias and its ReLU."""

    def __init__(self, net: RepNet):
        super().__init__()
        self.stem, self.head = net.stem, net.head
        self.blocks = nn.ModuleList(b.deployed() for b in net.blocks)

    def forward(self, x):
        x = self.stem(x)
        for conv in self.blocks:
            x = F.relu(conv(x))
        return self.head(x.mean((2, 3)))


def _randomized(net: RepNet) -> RepNet:
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(0.5, 2)
            m.bias.data.uniform_(-1, 1)
    return net.eval()


@pytest.mark.parametrize("branches", [1, 4], ids=["repvgg", "mobileone"])
def test_as_deployed_equals_the_deployed_model(branches):
    torch.manual_seed(0)
    net = _randomized(RepNet(branches=branches))
    deployed = Deployed(net).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # the oracle that such a block is one convolution: numerically
        torch.testing.assert_close(deployed(x), net(x), rtol=1e-4, atol=1e-4)
    report = archscan.scan(net, [(1, 3, 16, 16)], rules=["reparameterize"], recommend=False)
    (f,) = report.findings
    assert f.evidence["count"] == 3 and all(b["branches"] == branches + 2 for b in f.evidence["blocks"])
    oracle = archscan.scan(deployed, [(1, 3, 16, 16)], rules=[], recommend=False)
    assert f.evidence["as_deployed_flops"] == oracle.totals.flops  # conv FLOPs are multiply-adds: no bias term
    # bytes: the deployed convs read a bias each (16 floats) that the branch convs lack
    assert f.evidence["as_deployed_mac_bytes"] == oracle.totals.mac_bytes - 3 * 16 * 4
    built = report.totals.flops
    assert f.saving["flops"] == built - oracle.totals.flops
    assert f"as deployed the model takes {oracle.totals.flops / built:.0%}" in f.message


def test_recommended_with_the_models_own_call(capsys):
    class Switchable(RepNet):
        pass

    def switch_to_deploy(self):  # RepVGG's own method name
        pass

    RepBlock.switch_to_deploy = switch_to_deploy
    try:
        report = archscan.scan(Switchable(branches=2), [(1, 3, 16, 16)])
    finally:
        del RepBlock.switch_to_deploy
    (rec,) = [r for r in report.recommendations if r.kind == "reparameterize"]
    assert rec.apply == "[m.switch_to_deploy() for m in model.modules() if hasattr(m, 'switch_to_deploy')]"
    (f,) = [f for f in report.findings if f.rule == "reparameterize"]
    assert rec.estimated_saving["flops"] == f.saving["flops"] and rec.findings == ({"rule": f.rule, "module": f.module},)
    assert rec.target == ("blocks.0", "blocks.1", "blocks.2")


def test_cli_shows_the_deployed_totals(tmp_path, capsys):
    model = tmp_path / "rep_models.py"
    model.write_text(open(__file__).read())
    assert main([f"{model}:RepNet", "--input", "1,3,16,16", "--rules", "reparameterize"]) == 0
    out = capsys.readouterr().out
    assert "\ndeployed   " in out and "multi-branch" in out


class NormAct(nn.Module):
    """timm's BatchNormAct2d: a batch norm, then a dropout and an activation that are Identities."""

    def __init__(self, c):
        super().__init__()
        self.bn, self.drop, self.act = nn.BatchNorm2d(c), nn.Identity(), nn.Identity()

    def forward(self, x):
        return self.act(self.drop(self.bn(x)))


class TimmStyleBlock(nn.Module):
    """MobileOne as timm writes it: the sum starts at ``0`` and grows in place (``out += conv(x)``),
    each branch's norm ends in Identities, the identity branch is added after a drop path."""

    def __init__(self, cin, cout, branches):
        super().__init__()
        self.convs = nn.ModuleList(nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), NormAct(cout))
                                   for _ in range(branches))
        self.scale = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), NormAct(cout))
        self.identity = NormAct(cout) if cin == cout else None
        self.drop_path = nn.Identity()

    def forward(self, x):
        out = 0
        out += self.scale(x)
        for conv in self.convs:
            out += conv(x)
        out = self.drop_path(out)
        if self.identity is not None:
            out = out + self.identity(x)
        return F.relu(out)


class TimmStyleNet(nn.Module):
    """A stem block that reads the model's input directly, then three blocks."""

    def __init__(self, c=16, branches=4):
        super().__init__()
        self.stem = TimmStyleBlock(3, c, 1)
        self.blocks = nn.Sequential(*[TimmStyleBlock(c, c, branches) for _ in range(3)])
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def test_timm_style_blocks_are_found():
    """In-place sums from 0, Identities after the norms, a stem on the model's input: the four blocks
    found, as deployed the multiply-adds of one 3×3 convolution each (timm's mobileone_s0: 1,051,935,232
    as built, 275,110,400 as deployed, equal to timm.utils.reparameterize_model's)."""
    report = archscan.scan(TimmStyleNet(), [(1, 3, 16, 16)], rules=["reparameterize"], recommend=False)
    (f,) = report.findings
    assert f.evidence["count"] == 4
    plain = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), *[nn.Conv2d(16, 16, 3, padding=1) for _ in range(3)])
    head = 16 * 10
    assert f.evidence["as_deployed_flops"] == archscan.scan(plain, [(1, 3, 16, 16)], rules=[], recommend=False).totals.flops + head


def test_timm_mobileone_as_deployed_equals_timms_reparameterized_model():
    timm = pytest.importorskip("timm")
    model = timm.create_model("mobileone_s0")
    (f,) = archscan.scan(model, [(1, 3, 224, 224)], rules=["reparameterize"], recommend=False).findings
    deployed = archscan.scan(timm.utils.reparameterize_model(model), [(1, 3, 224, 224)], rules=[], recommend=False)
    assert f.evidence["as_deployed_flops"] == deployed.totals.flops


class Residual(nn.Module):
    """A ResNet basic block: its branch is two convolutions deep, so it is no branch sum."""

    def __init__(self, c=16):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)
        self.down = nn.Sequential(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))

    def forward(self, x):
        return self.b(F.relu(self.a(x))) + self.down(x)


class TwoInputs(nn.Module):
    """Convolutions of two different tensors, summed (a feature pyramid's lateral): not one conv."""

    def __init__(self, c=16):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 1)

    def forward(self, x, y):
        return self.a(x) + self.b(y)


@pytest.mark.parametrize("model,inputs", [
    (Residual(), [(1, 16, 8, 8)]),
    (TwoInputs(), [(1, 16, 8, 8), (1, 16, 8, 8)]),
], ids=["residual", "two-inputs"])
def test_not_reparameterizable(model, inputs):
    assert not archscan.scan(model, inputs, rules=["reparameterize"], recommend=False).findings


@pytest.mark.parametrize("name,inputs", [("zoo:resnet18", (1, 3, 64, 64)), ("zoo:mobilenet_v2", (1, 3, 64, 64)),
                                         ("zoo:shufflenet_v2_x1_0", (1, 3, 64, 64)), ("zoo:vit_tiny", (1, 3, 224, 224)),
                                         ("zoo:llama_tiny", "1,16:int64")])
def test_no_finding_on_the_zoo(name, inputs):
    assert not archscan.scan(name, [inputs], rules=["reparameterize"], recommend=False).findings
