"""The rules speak where their advice fits (issue #37): the ShuffleNetV2 guidelines on image conv
backbones, not on a sequence model's conv1d over its tokens nor on widths the data or the task
fixes; channel-align where aligning can pay; one host-sync finding per kind of sync; G4 in numbers
that carry information; source lines as the working directory sees them. One small model of each
kind, random weights; transformers models where they are the kind, skipped without transformers."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import archscan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def findings(model, inputs, *rules, **kw):
    return archscan.scan(model, inputs, rules=list(rules), recommend=False, **kw).findings


def by_rule(found, rule):
    return [f for f in found if f.rule == rule]


# --- sequence models: a depthwise conv1d over the tokens is not an image conv -----------------------

class MambaBlock(nn.Module):
    """Mamba's mixer (Gu & Dao 2023, arXiv:2312.00752): in_proj, a causal depthwise conv1d over the
    sequence, a selective scan (written as a loop over ``length`` steps), the gate, out_proj."""

    def __init__(self, d=64, state=8, k=4, length=16):
        super().__init__()
        inner = 2 * d
        self.in_proj = nn.Linear(d, 2 * inner)
        self.conv1d = nn.Conv1d(inner, inner, k, groups=inner, padding=k - 1)
        self.x_proj = nn.Linear(inner, 8 + 2 * state)
        self.dt_proj = nn.Linear(8, inner)
        self.A = nn.Parameter(-torch.rand(inner, state))
        self.out_proj = nn.Linear(inner, d)
        self.state, self.length = state, length

    def forward(self, x):                                                   # x: [b, l, d]
        h, gate = self.in_proj(x).transpose(1, 2).chunk(2, dim=1)            # [b, inner, l] each
        h = F.silu(self.conv1d(h)[..., :self.length]).transpose(1, 2)        # causal: the first l outputs
        dt, B, C = self.x_proj(h).split([8, self.state, self.state], dim=-1)
        dt = F.softplus(self.dt_proj(dt))
        decay = torch.exp(dt.unsqueeze(-1) * self.A)                         # [b, l, inner, state]
        s, ys = torch.zeros_like(decay[:, 0]), []
        for t in range(self.length):
            s = decay[:, t] * s + (dt[:, t] * h[:, t]).unsqueeze(-1) * B[:, t, None, :]
            ys.append((s * C[:, t, None, :]).sum(-1))
        return x + self.out_proj(torch.stack(ys, 1) * F.silu(gate.transpose(1, 2)))


class Mamba(nn.Module):
    def __init__(self, d=64, layers=2):
        super().__init__()
        self.layers = nn.Sequential(*[MambaBlock(d) for _ in range(layers)])

    def forward(self, x):
        return self.layers(x)


class Hybrid(nn.Module):
    """Attention and state-space layers in one stack (Jamba's pattern): tokens, an attention block,
    a Mamba block, the vocabulary head."""

    def __init__(self, vocab=100, d=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.attention = nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True)
        self.mamba = MambaBlock(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.mamba(self.attention(self.embed(tokens))))


class ConformerConv(nn.Module):
    """A Conformer's convolution module (Gulati et al. 2020, arXiv:2005.08100): pointwise conv1d to
    2d, GLU, depthwise conv1d, batch norm, SiLU, pointwise conv1d, on tokens kept [b, l, d]."""

    def __init__(self, d=64, k=15):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pointwise1 = nn.Conv1d(d, 2 * d, 1)
        self.depthwise = nn.Conv1d(d, d, k, padding=k // 2, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.pointwise2 = nn.Conv1d(d, d, 1)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        y = self.norm(x).transpose(1, 2)
        y = self.pointwise2(F.silu(self.bn(self.depthwise(F.glu(self.pointwise1(y), dim=1)))))
        x = x + y.transpose(1, 2)
        return x + self.ff(x)


class SignalNet(nn.Module):
    """A 1-D conv backbone over a raw signal (no tokens): the guidelines apply to it as to an image's."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv1d(1, 32, 9, stride=4, padding=4)
        self.expand = nn.Conv1d(32, 192, 1)
        self.dw = nn.Conv1d(192, 192, 9, padding=4, groups=192)
        self.project = nn.Conv1d(192, 32, 1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = x + self.project(F.relu(self.dw(F.relu(self.expand(x)))))
        return self.head(x.mean(-1))


@pytest.mark.parametrize("method", ["fx", "export", "eager"])
def test_no_guideline_on_a_state_space_models_causal_conv1d(method):
    """Before: 'depthwise conv: MAC is 1.94x that of a dense conv' (G2) on each layer's conv1d."""
    assert findings(Mamba(), [(1, 16, 64)], "G1", "G2", capture_method=method) == ()


def test_no_guideline_on_a_hybrid_attention_and_state_space_model():
    assert findings(Hybrid(), ["1,16:int64"], "G1", "G2") == ()


def test_no_guideline_on_a_conformers_convolution_module():
    """The transpose to [b, d, l] is upstream of the pointwise conv1d and the GLU before the
    depthwise one: the layout carries through them. Before: G2 on the depthwise conv1d, and G3
    '3 ConformerConv block(s) with 3 fragmented ops each' on a stack of them."""
    assert findings(ConformerConv(), [(2, 64, 64)], "G1", "G2") == ()
    assert findings(nn.Sequential(*[ConformerConv() for _ in range(3)]), [(2, 64, 64)], "G3") == ()


def test_a_1d_conv_backbone_over_a_signal_keeps_the_guidelines_but_not_channels_last():
    found = findings(SignalNet(), [(2, 1, 4096)], "G1", "G2", "channels-last")
    assert sorted((f.rule, f.module) for f in found) == [("G1", "expand"), ("G1", "project"), ("G2", "dw")]
    (g1,) = [f for f in found if f.module == "expand"]
    # 2 signals x 1024 positions: MAC = 2048*(32 + 192) + 32*192 = 464896 elements
    assert g1.evidence["mac_elements"] == 464_896


def test_no_guideline_on_transformers_mamba():
    transformers = pytest.importorskip("transformers")
    config = transformers.MambaConfig(vocab_size=100, hidden_size=32, state_size=8, num_hidden_layers=2,
                                      expand=2, conv_kernel=4, use_cache=False)
    report = archscan.scan(transformers.MambaModel(config).eval(), ["1,16:int64"], rules=["G1", "G2"])
    assert any(n.category == "depthwise_conv" for n in report.nodes)  # the causal conv1d is there
    assert report.findings == ()


def test_no_guideline_on_transformers_jamba():
    """Attention, Mamba and expert layers in one model: before, G2 on the Mamba layer's conv1d."""
    transformers = pytest.importorskip("transformers")
    config = transformers.JambaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
        attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, use_cache=False,
        use_mamba_kernels=False)
    assert findings(transformers.JambaModel(config).eval(), ["1,16:int64"], "G1", "G2") == ()


# --- widths the task fixes: a detection head's anchors x 4 -------------------------------------------

def conv_bn_relu(c1, c2, k=1, stride=1, groups=1):
    return nn.Sequential(nn.Conv2d(c1, c2, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(c2),
                         nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, c1, c2, expand, stride=1):
        super().__init__()
        hidden = c1 * expand
        self.expand = conv_bn_relu(c1, hidden)
        self.dw = conv_bn_relu(hidden, hidden, 3, stride, hidden)
        self.project = nn.Sequential(nn.Conv2d(hidden, c2, 1, bias=False), nn.BatchNorm2d(c2))
        self.residual = stride == 1 and c1 == c2

    def forward(self, x):
        y = self.project(self.dw(self.expand(x)))
        return x + y if self.residual else y


def prediction_block(c1, c2):
    """SSDlite's head on one map: a depthwise 3x3, then a 1x1 conv to the predictions."""
    return nn.Sequential(conv_bn_relu(c1, c1, 3, groups=c1), nn.Conv2d(c1, c2, 1))


class SSDLite(nn.Module):
    """SSDlite's shape (Sandler et al. 2018; torchvision's ssdlite320_mobilenet_v3_large): a MobileNet
    trunk, heads on a 672- and a 256-channel map with 6 anchors each (the 672->24 box regression),
    and the score-threshold postprocess: nonzero per class, then again to drop empty boxes."""

    def __init__(self, classes=5, anchors=6):
        super().__init__()
        self.stem = conv_bn_relu(3, 16, 3, 2)
        self.trunk = nn.Sequential(InvertedResidual(16, 24, 4, 2), InvertedResidual(24, 24, 3),
                                   InvertedResidual(24, 112, 4, 2), InvertedResidual(112, 112, 6))
        self.c4_expand = conv_bn_relu(112, 672)
        self.extra = nn.Sequential(conv_bn_relu(672, 128), conv_bn_relu(128, 128, 3, 2, 128), conv_bn_relu(128, 256))
        self.box_head = nn.ModuleList([prediction_block(672, anchors * 4), prediction_block(256, anchors * 4)])
        self.cls_head = nn.ModuleList([prediction_block(672, anchors * classes),
                                       prediction_block(256, anchors * classes)])
        self.classes = classes

    def forward(self, x):
        c4 = self.c4_expand(self.trunk(self.stem(x)))
        maps, n = [c4, self.extra(c4)], x.shape[0]
        boxes = torch.cat([h(m).permute(0, 2, 3, 1).reshape(n, -1, 4) for h, m in zip(self.box_head, maps)], 1)
        logits = torch.cat([h(m).permute(0, 2, 3, 1).reshape(n, -1, self.classes)
                            for h, m in zip(self.cls_head, maps)], 1)
        scores = F.softmax(logits, -1)[0]
        kept = []
        for label in range(1, self.classes):
            keep = torch.where(scores[:, label] > 0.01)[0]
            kept.append(boxes[0, keep])
        out = torch.cat(kept)
        return out[torch.where(out[:, 2] - out[:, 0] > 0)[0]]


@pytest.fixture(scope="module")
def ssdlite():
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)  # source lines relative to the working directory
        return archscan.scan(SSDLite(), [(1, 3, 160, 160)], recommend=False)


def test_no_g1_on_a_detection_heads_task_fixed_width(ssdlite):
    """Before: G1 warnings on box_head.0.1 (672->24, 28:1) and cls_head.0.1 (672->30); the trunk's
    and the extra layers' unbalanced 1x1 convs keep theirs."""
    g1 = {f.module for f in by_rule(ssdlite.findings, "G1")}
    assert not any(m.startswith(("box_head", "cls_head")) for m in g1)
    assert {"c4_expand.0", "extra.0.0", "trunk.3.expand.0", "trunk.3.project.0"} <= g1


def test_channel_align_says_a_heads_width_is_padded(ssdlite):
    """The 30 class scores per position (5 classes x 6 anchors) are the task's: pad and slice."""
    (f,) = by_rule(ssdlite.findings, "channel-align")
    assert [ssdlite.node(name).module for name in f.evidence["output_heads"]] == ["cls_head.0.1", "cls_head.1.1"]
    assert "pad its weight with zero rows and slice its output" in f.fix


def test_host_syncs_of_one_kind_are_one_finding_with_a_count(ssdlite):
    """Before: two findings 'host-device synchronisation in forward: aten.nonzero (...)', one per line."""
    (f,) = by_rule(ssdlite.findings, "host-sync")
    assert f.message.startswith("host-device synchronisation in forward at 2 places: aten.nonzero")
    assert f.saving["syncs"] == 5 and f.evidence["places"] == 2  # 4 classes, then the empty boxes
    assert [line.rpartition(":")[0] for line in f.evidence["at"]] == ["tests/test_rules_fit.py"] * 2


def _offsets(x):
    return x + torch.tensor([1.0, 2.0])  # made on the host, in a helper below forward


class HostWork(nn.Module):
    """Host tensors and syncs the capture sees below the graph: a helper's torch.tensor, a .tolist()."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        scale = max(x.abs().amax(0).tolist())
        return _offsets(self.fc(x)) * scale


def test_finding_texts_name_files_as_the_working_directory_sees_them(ssdlite, monkeypatch):
    """Every file a finding names below the working directory is named relative to it, as the
    capture's source lines are (archscan.load.frames.where)."""
    monkeypatch.chdir(ROOT)
    report = archscan.scan(HostWork(), [(4, 2)], recommend=False)
    assert {"host-sync", "host-tensor"} <= {f.rule for f in report.findings}
    for f in ssdlite.findings + report.findings:
        text = repr((f.module, f.message, f.evidence, f.fix, f.source))
        assert ROOT + os.sep not in text, (f.rule, text)
        assert f.source is None or f.source.startswith("tests/test_rules_fit.py:"), (f.rule, f.source)


class Stack(nn.Module):
    """A 12-band image through a stride-1 stem, an unbalanced 1x1 conv, and a 1x1 head to 24 outputs."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(12, 64, 1)
        self.expand = nn.Conv2d(64, 256, 1)
        self.head = nn.Conv2d(256, 24, 1)

    def forward(self, x):
        return self.head(F.relu(self.expand(F.relu(self.stem(x)))))


def test_g1_leaves_the_datas_and_the_tasks_widths_alone():
    """The stem reads the data's 12 bands, the head makes the task's 24 outputs: neither can be
    balanced. A model of one conv is a probe of that conv and keeps G1 (test_rules.py)."""
    assert [f.module for f in findings(Stack(), [(1, 12, 32, 32)], "G1")] == ["expand"]


# --- channel-align where aligning can pay ------------------------------------------------------------

class MoE(nn.Module):
    """Top-2 of 6 experts: the router's 6 outputs are the expert count; a 20-wide expert is not aligned."""

    def __init__(self, d=64, hidden=128, experts=6, k=2):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
                                     for _ in range(experts - 1))
        self.odd = nn.Sequential(nn.Linear(d, 20), nn.GELU(), nn.Linear(20, d))
        self.k = k

    def forward(self, x):                                                   # x: [tokens, d]
        weights, chosen = self.router(x).softmax(-1).topk(self.k, dim=-1)
        every = torch.stack([e(x) for e in [*self.experts, self.odd]], 1)    # [tokens, experts, d] (dense, for shapes)
        picked = every.gather(1, chosen[..., None].expand(-1, -1, x.shape[-1]))
        return (picked * weights[..., None]).sum(1)


def test_channel_align_leaves_a_routers_expert_count_alone():
    """Before: the router listed beside the 20-wide expert; a router's width is its number of experts."""
    (f,) = findings(MoE(), [(32, 64)], "channel-align")
    assert [layer["node"] for layer in f.evidence["layers"]] == ["odd_0", "odd_2"]


def test_channel_align_quiet_where_aligning_cannot_pay():
    """A 10-class output layer doing 0.04% of the FLOPs: before, 'channel-align ... (0% of FLOPs)'."""
    net = nn.Sequential(nn.Conv2d(16, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(64, 10))
    assert findings(net, [(1, 16, 32, 32)], "channel-align") == ()


def test_channel_align_quiet_on_a_transformers_mixtral_router():
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=6,
                                        num_experts_per_tok=2, use_cache=False)
    assert findings(transformers.MixtralModel(config).eval(), ["1,16:int64"], "channel-align") == ()


# --- G4 in numbers that carry information ------------------------------------------------------------

class Bottleneck(nn.Module):
    def __init__(self, c=32):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return F.relu(self.conv2(F.relu(self.conv1(x))) + x)


def test_g4_says_the_share_of_bytes_and_kernels_not_a_zero_share_of_flops():
    """Kernels: conv, relu, conv, add, relu: 3 of 5 element-wise. Element-wise ops count no
    multiply-adds, so '0.0% of the FLOPs' said nothing."""
    (f,) = findings(Bottleneck(), [(1, 32, 56, 56)], "G4")
    assert f.evidence["elementwise_kernels"] == 3 and f.evidence["kernel_share"] == 0.6
    assert "launch 60% of the kernels; FLOPs (multiply-adds) count none of it" in f.message
    assert "0.0%" not in f.message


def test_g4_names_the_flops_depthwise_convs_bring():
    (f,) = findings("zoo:mobilenet_v2", [(1, 3, 224, 224)], "G4")
    assert f.evidence["flops_share"] > 0 and f"{100 * f.evidence['flops_share']:.1f}% of the FLOPs (their depthwise convs)" \
        in f.message
