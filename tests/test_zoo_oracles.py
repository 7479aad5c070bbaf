"""Whole-model numbers against independent oracles and published figures.

* torch.utils.flop_counter.FlopCounterMode counts 2 FLOPs per multiply-add: we compare with
  its total / 2, run on the meta device (where scaled_dot_product_attention decomposes into
  bmm, which it counts). Agreement within 0.5% on every zoo model.
* Published multiply-adds (ShuffleNetV2 paper Tables 5/8, torchvision, ResNet/ViT papers),
  within 2% where the paper rounds.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import archscan
from archscan import zoo

BIG = {"llama2_7b", "llama3_8b", "llama3_70b", "vit_l_16"}

# name: (published multiply-adds, tolerance, where the figure comes from)
PUBLISHED = {
    "shufflenet_v2_x0_5": (41e6, 0.02, "ShuffleNetV2 Table 8"),
    "shufflenet_v2_x1_0": (146e6, 0.02, "ShuffleNetV2 Table 8"),
    "shufflenet_v2_x1_5": (299e6, 0.02, "ShuffleNetV2 Table 8"),
    "shufflenet_v2_x2_0": (591e6, 0.02, "ShuffleNetV2 Table 8"),
    "mobilenet_v2": (300e6, 0.02, "ShuffleNetV2 Table 8 / torchvision 300.8M"),
    "mobilenet_v2_140": (585e6, 0.02, "ShuffleNetV2 Table 8"),
    "shufflenet_v1_g3_x0_5": (38e6, 0.02, "ShuffleNetV2 Table 8"),
    "shufflenet_v1_g3_x1_0": (140e6, 0.02, "ShuffleNetV2 Table 8 (137M in ShuffleNetV1 Table 1)"),
    "shufflenet_v1_g3_x1_5": (292e6, 0.02, "ShuffleNetV2 Table 8"),
    "shufflenet_v1_g3_x2_0": (524e6, 0.02, "ShuffleNetV2 Table 8"),
    "shufflenet_v1_g1_x1_0": (143e6, 0.02, "ShuffleNetV1 Table 1"),
    "shufflenet_v1_g2_x1_0": (140e6, 0.02, "ShuffleNetV1 Table 1"),
    "shufflenet_v1_g4_x1_0": (133e6, 0.02, "ShuffleNetV1 Table 1"),
    "shufflenet_v1_g8_x1_0": (137e6, 0.02, "ShuffleNetV1 Table 1"),
    "mobilenet_v1": (569e6, 0.02, "ShuffleNetV2 Table 8 / MobileNetV1 Table 8"),
    "mobilenet_v1_050": (149e6, 0.02, "ShuffleNetV2 Table 8"),
    "resnet18": (1.8e9, 0.02, "ResNet paper / torchvision 1.814G"),
    "resnet50": (4.1e9, 0.02, "ResNet paper / torchvision 4.089G"),
    "vit_b_16": (17.56e9, 0.01, "torchvision 17.564G"),
}


def published_params():
    return {"resnet18": 11_689_512, "resnet50": 25_557_032, "mobilenet_v2": 3_504_872, "vit_b_16": 86_567_656,
            "shufflenet_v2_x1_0": 2_278_604, "llama2_7b": 6_738_415_616, "llama3_8b": 8_030_261_248,
            "llama3_70b": 70_553_706_496}


def flop_counter_macs(name: str, specs) -> int:
    with torch.device("meta"):
        model = zoo.create_model(name).eval()
        inputs = [torch.zeros(s.shape, dtype=s.dtype) if not s.dtype.is_floating_point else torch.randn(s.shape)
                  for s in specs]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*inputs)
    return counter.get_total_flops() // 2


@pytest.mark.parametrize("name", [n for n in zoo.list_models() if n not in BIG])
def test_flops_match_torch_flop_counter(name):
    entry = zoo.get_entry(name)
    report = archscan.scan(f"zoo:{name}", list(entry.default_input))
    specs = [archscan.InputSpec(tuple(i["shape"]), getattr(torch, i["dtype"])) for i in report.inputs]
    oracle = flop_counter_macs(name, specs)
    assert report.capture == "fx"
    assert report.totals.flops == pytest.approx(oracle, rel=0.005)
    assert report.uncounted == {}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_flops_match_published(name):
    published, tol, _source = PUBLISHED[name]
    report = archscan.scan(f"zoo:{name}", [(1, 3, 224, 224)])
    assert report.totals.flops == pytest.approx(published, rel=tol)


@pytest.mark.parametrize("name,params", sorted(published_params().items()))
def test_params_match_published(name, params):
    spec = "1,8:int64" if name.startswith("llama") else "1,3,224,224"
    report = archscan.scan(f"zoo:{name}", [spec])
    assert report.totals.params == params


def test_llama_70b_scale():
    """70B parameters on fake tensors; FLOPs = T * linear weights + attention (QK^T, AV)."""
    report = archscan.scan("zoo:llama3_70b", ["1,2048:int64"])
    t, d, layers = 2048, 8192, 80
    linear_weights = report.totals.params - 128256 * d - (2 * layers + 1) * d  # minus embedding and norms
    attention = layers * 2 * t * t * d
    assert report.totals.flops == t * linear_weights + attention == 147_837_069_295_616


def test_shufflenet_v2_beats_v1_and_mobilenet_v2_on_mac_per_flop():
    """The paper's premise in numbers: at similar FLOPs ShuffleNetV2 moves fewer bytes per FLOP."""
    v2 = archscan.scan("zoo:shufflenet_v2_x1_5", [(1, 3, 224, 224)]).totals
    mb2 = archscan.scan("zoo:mobilenet_v2", [(1, 3, 224, 224)]).totals
    assert v2.flops == pytest.approx(mb2.flops, rel=0.05)
    assert v2.mac_bytes < mb2.mac_bytes
