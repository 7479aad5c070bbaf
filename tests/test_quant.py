"""--quant and --kv: bytes as stored against torchao's own quantized models, costs as the fused
kernels run them by hand, the decode step and the KV cache, the layers kept and bad input."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn as nn

import archscan
from archscan.cli import main
from archscan.load.building import build_real
from archscan.load.targets import to_target

pytest.importorskip("torchao")

from torchao.quantization import quantize_  # noqa: E402

from archscan.quant import parse_scheme  # noqa: E402
from archscan.quant.schemes import config  # noqa: E402

SCHEMES = ["int8", "w8a8", "fp8", "int4:g32"]


def stored_bytes(t: torch.Tensor) -> int:
    """The oracle: the bytes of a tensor's storages, a torchao subclass's inner tensors one by one."""
    if type(t) in (torch.Tensor, nn.Parameter):
        return t.untyped_storage().nbytes()
    names, _ = t.__tensor_flatten__()
    return sum(stored_bytes(getattr(t, n)) for n in names)


def quantized_for_real(name: str, kwargs: dict, scheme: str, chosen: set[str]) -> nn.Module:
    """The model built with real weights and quantized by torchao's quantize_ on the CPU, the
    layers archscan chose and no others."""
    model = build_real(to_target(name), kwargs, None)
    quantize_(model, config(parse_scheme(scheme)), filter_fn=lambda m, fqn: fqn in chosen)
    return model


MODELS = [("zoo:resnet18", [(1, 3, 64, 64)], {}),      # a CNN: its classifier
          ("zoo:vit_tiny", [(1, 3, 224, 224)], {}),    # a ViT: its MLPs (MultiheadAttention's projections stay)
          ("zoo:llama_tiny", ["1,16:int64"], {})]      # a decoder: every projection but the output


@pytest.mark.parametrize("name,inputs,kwargs", MODELS, ids=[m[0] for m in MODELS])
def test_bytes_as_stored_equal_torchaos_inner_storages(name, inputs, kwargs):
    for scheme in SCHEMES:
        report = archscan.scan(name, inputs, kwargs=kwargs, quant=scheme, profile=False, rules=[], recommend=False)
        q = report.quant
        chosen = {l["module"] for l in q["layers"] if "kept" not in l}
        assert chosen, (name, scheme)
        real = quantized_for_real(name, kwargs, scheme, chosen)
        modules = dict(real.named_modules())
        for layer in q["layers"]:
            weight = modules[layer["module"]].weight
            if layer["module"] in chosen:
                assert type(weight) is not nn.Parameter and type(weight) is not torch.Tensor  # torchao's subclass
                assert layer["stored_bytes"] == stored_bytes(weight), (name, scheme, layer["module"])
                assert sum(layer["parts"].values()) == layer["stored_bytes"]
            else:
                assert layer["stored_bytes"] == layer["weight_bytes"] == stored_bytes(weight)
        # the whole model's parameters as stored (param_bytes: parameters, not buffers), the quantized
        # ones by their inner storages
        total = sum(stored_bytes(t) for t in real.parameters())
        assert q["after"]["param_bytes"] == total, (name, scheme)
        assert q["before"]["param_bytes"] == report.totals.param_bytes


def test_int4_on_the_cpu_is_one_int8_per_weight_with_group_scales():
    """torchao's CPU int4 (IntxUnpackedToInt8Tensor): a byte per weight plus a float scale and an
    int8 zero point per group: more bytes than int8's, as stored (9.25 bits per weight at g32 in float32)."""
    q8 = archscan.scan("zoo:llama_tiny", ["1,16:int64"], quant="int8", profile=False, rules=[], recommend=False).quant
    q4 = archscan.scan("zoo:llama_tiny", ["1,16:int64"], quant="int4:g32", profile=False, rules=[], recommend=False).quant
    layer = next(l for l in q4["layers"] if "kept" not in l)
    n, k = layer["out_features"], layer["in_features"]
    assert layer["parts"] == {"qdata": n * k, "scale": n * (k // 32) * 4, "zero_point": n * (k // 32)}
    assert q4["bits_per_weight"] == pytest.approx(8 + 8 * 5 / 32)
    assert q4["after"]["param_bytes"] > q8["after"]["param_bytes"]
    assert q4["layout"] == "IntxUnpackedToInt8Tensor"


def test_int4_on_a_gpu_is_the_packed_layout_by_its_shapes():
    """On a named GPU, int4 is torchao's Int4Tensor: two weights a byte, a scale and a zero point
    per group in the model's dtype (bf16: 4.25 bits per weight at g128)."""
    report = archscan.scan("zoo:llama_tiny", ["1,1:int64"], dtype="bf16", quant="int4",
                           profile=archscan.measure.datasheet_profile("h100"), rules=[], recommend=False)
    q = report.quant
    layer = next(l for l in q["layers"] if "kept" not in l)
    n, k = layer["out_features"], layer["in_features"]
    assert layer["parts"] == {"qdata": n * k // 2, "scale": (k // 128) * n * 2, "zero_point": (k // 128) * n * 2}
    assert q["bits_per_weight"] == pytest.approx(4.25)
    assert q["layout"].startswith("Int4Tensor") and q["device"] == "h100"


def test_a_quantized_gemm_reads_the_stored_weight_once():
    """By hand: a weight-only GEMM's bytes are its activations, its output and the weight as stored;
    w8a8 adds the kernel that quantizes the activations and reads them as int8."""
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128),
                          nn.ReLU(), nn.Linear(128, 16))
    m, k, n = 8, 128, 128
    r = archscan.scan(model, [(m, 64)], quant="int8", profile=False, rules=[], recommend=False)
    layer = next(l for l in r.quant["layers"] if l["module"] == "2")
    stored = n * k + n * 4 + n  # int8 values, a float32 scale and an int8 zero point per row
    assert layer["stored_bytes"] == stored
    before = r.quant["before"]["mac_bytes"]
    saved = sum(l["weight_bytes"] - l["stored_bytes"] for l in r.quant["layers"])
    assert r.quant["after"]["mac_bytes"] == before - saved
    assert r.quant["after"]["flops"] == r.quant["before"]["flops"] == r.totals.flops

    w = archscan.scan(model, [(m, 64)], quant="w8a8", profile=False, rules=[], recommend=False).quant
    node = r.node([x.name for x in r.nodes if x.module == "2"][0])
    activations = m * k * 4
    assert node.read_bytes == activations + n * k * 4 + n * 4  # float32 activations, weight and bias
    expected_gemm = stored + n * 4 + m * k + node.write_bytes  # the weight as stored, the bias, int8 activations
    expected_quantize = activations + m * k + 4 * m
    quantized = [l for l in w["layers"] if "kept" not in l]
    assert {l["module"] for l in quantized} == {"2", "4"}
    # layer 2 and 4 have the same shapes: the forward's bytes change by twice one layer's change
    one = (node.mac_bytes - expected_gemm - expected_quantize)
    assert w["before"]["mac_bytes"] - w["after"]["mac_bytes"] == 2 * one
    assert w["after"]["kernels"] == w["before"]["kernels"] + 2  # a quantize kernel before each int8 GEMM


def test_kept_layers_say_why():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 100), nn.ReLU(), nn.Linear(100, 128),
                          nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 16))
    q = archscan.scan(model, [(8, 64)], quant="w8a8", profile=False, rules=[], recommend=False).quant
    why = {l["module"]: l.get("kept") for l in q["layers"]}
    assert why["0"].startswith("the first layer") and why["8"].startswith("the last layer")
    assert "multiples of 8" in why["2"] and "multiples of 8" in why["4"]
    assert why["6"] is None and q["quantized"] == 1
    # int8 weight-only takes any channel count; --keep keeps a layer by its path
    q = archscan.scan(model, [(8, 64)], quant="int8", keep=["6"], profile=False, rules=[], recommend=False).quant
    why = {l["module"]: l.get("kept") for l in q["layers"]}
    assert {m for m, w in why.items() if w is None} == {"2", "4"} and why["6"] == "kept by --keep"
    # the ends stay only when there is more to quantize than them
    two = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16))
    q = archscan.scan(two, [(8, 64)], quant="int8", profile=False, rules=[], recommend=False).quant
    assert q["quantized"] == 2


def test_weight_only_keeps_compute_bound_layers_on_a_gpu():
    """At 4,096 rows in bf16 a 1024x1024 GEMM is compute-bound on an H100: weight-only saves no time there."""
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)])
    h100 = archscan.measure.datasheet_profile("h100")
    big = archscan.scan(model, [(4096, 1024)], dtype="bf16", quant="int8", profile=h100, rules=[], recommend=False).quant
    small = archscan.scan(model, [(1, 1024)], dtype="bf16", quant="int8", profile=h100, rules=[], recommend=False).quant
    assert all("compute-bound at 4,096 rows" in l["kept"] for l in big["layers"][1:3])
    assert [l.get("kept") is None for l in small["layers"]] == [False, True, True, False]
    assert small["after"]["served_ms"] < small["before"]["served_ms"]


def test_decode_step_and_kv_cache_quantized():
    h100 = archscan.measure.datasheet_profile("h100")
    r = archscan.scan("zoo:llama_tiny", ["1,1:int64"], dtype="bf16", quant="int8", kv="int8", decode=64, profile=h100,
                      rules=[], recommend=False)
    q, step = r.quant, r.phases["decode"]
    saved = sum(l["weight_bytes"] - l["stored_bytes"] for l in q["layers"])
    # each quantized weight is read once in the step: the weights read fall by exactly what storing them saves
    assert q["decode"]["before"]["weight_bytes"] == step["weight_bytes"]
    assert q["decode"]["after"]["weight_bytes"] == step["weight_bytes"] - saved
    # the KV cache in one byte an element, from bf16's two
    assert q["kv"]["bytes_per_token_after"] * 2 == r.kv_cache["bytes_per_token"]
    kv_saved = step["kv_read_bytes"] // 2
    assert q["decode"]["after"]["mac_bytes"] == pytest.approx(step["mac_bytes"] - saved - kv_saved, abs=64)
    assert q["decode"]["served_speedup"] > 1
    # --kv alone: the weights as they are, the cache's bytes halved
    r = archscan.scan("zoo:llama_tiny", ["1,1:int64"], dtype="bf16", kv="fp8", decode=64, profile=h100, rules=[],
                      recommend=False)
    assert r.quant["decode"]["after"]["weight_bytes"] == r.phases["decode"]["weight_bytes"]
    assert "layers" not in r.quant


def test_cli_text_and_json(capsys):
    assert main(["zoo:llama_tiny", "--input", "1,1:int64", "--dtype", "bf16", "--quant", "int4", "--decode", "64",
                 "--device-profile", "h100"]) == 0
    out = capsys.readouterr().out
    assert "quant      int4:g128 as h100 stores it (Int4Tensor (packed, mslk))" in out
    assert "kept       output: the last layer" in out
    assert "quant step decode after 64 cached" in out and "tokens/s as served" in out
    assert main(["zoo:llama_tiny", "--input", "1,8:int64", "--quant", "fp8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["quant"]["scheme"] == "fp8" and data["quant"]["layout"] == "Float8Tensor"
    assert data["quant"]["not_linear"]["Embedding"]["modules"] == 1


@pytest.mark.parametrize("args,message", [
    (["--quant", "int3"], "unknown quantization scheme 'int3'"),
    (["--quant", "int4:g48"], "int4 group size 48"),
    (["--kv", "int8"], "--kv quantizes the KV cache of a decode step"),
    (["--kv", "int2", "--decode", "8"], "unknown KV-cache scheme"),
    (["--keep", "output"], "--keep names the layers --quant leaves"),
    (["--quant", "int8", "--keep", "nothing.here"], "--keep nothing.here matches no linear layer"),
    (["--quant", "int8", "--train"], "--quant analyses inference; --train a training step"),
])
def test_bad_quant_options_are_one_line(args, message, capsys):
    assert main(["zoo:llama_tiny", "--input", "1,8:int64", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_nothing_to_quantize(tmp_path, capsys):
    f = tmp_path / "convs.py"
    f.write_text("import torch.nn as nn\nclass Net(nn.Sequential):\n"
                 "    def __init__(self):\n        super().__init__(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))\n")
    assert main([f"{f}:Net", "--input", "1,3,16,16", "--quant", "int8"]) == 2
    err = capsys.readouterr().err
    assert "has nothing to quantize as int8: it has no nn.Linear layer" in err


def test_without_torchao_one_line_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    assert main(["zoo:llama_tiny", "--input", "1,8:int64", "--quant", "int8"]) == 2
    err = capsys.readouterr().err
    assert "quantization needs torchao" in err and "archscan[quant]" in err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_layout_from_shapes_equals_torchaos(dtype):
    """The recommendation counts int8 from the layout's shapes (no torchao needed): the same bytes."""
    from archscan.quant import inner_bytes
    from archscan.quant.schemes import int8_bytes

    for n, k in ((32, 64), (100, 24), (4096, 11008)):
        with torch.device("meta"):
            layer = nn.Linear(k, n, dtype=dtype)
        quantize_(layer, config(parse_scheme("int8")))
        assert inner_bytes(layer.weight) == int8_bytes(n, k)


def test_quantize_is_recommended_where_weights_bound_the_time():
    h100 = archscan.measure.datasheet_profile("h100")
    wide = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(6)])
    r = archscan.scan(wide, [(1, 2048)], dtype="bf16", profile=h100)
    rec = next(r for r in r.recommendations if r.kind == "quantize")
    q = archscan.scan(wide, [(1, 2048)], dtype="bf16", profile=h100, quant="int8", rules=[], recommend=False).quant
    # the saving is what --quant int8 counts
    assert rec.estimated_saving["mac_bytes"] == q["before"]["mac_bytes"] - q["after"]["mac_bytes"]
    assert rec.estimated_saving["ms"] == pytest.approx(q["before"]["served_ms"] - q["after"]["served_ms"])
    assert rec.apply == "archscan.quantize(model, inputs, scheme='int8', path='model-int8.pt2')"
    assert set(rec.target) == {l["module"] for l in q["layers"] if "kept" not in l}
    # ranked after the changes that keep what the model computes
    kinds = [x.kind for x in r.recommendations]
    assert all(kinds.index(k) < kinds.index("quantize") for k in ("compile", "fuse") if k in kinds)
    # at 4,096 rows the same layers are bound by their multiply-adds: nothing to recommend
    r = archscan.scan(wide, [(4096, 2048)], dtype="bf16", profile=h100)
    assert not [x for x in r.recommendations if x.kind == "quantize"]


def test_markdown_and_html_reports_carry_the_quantization(tmp_path):
    h100 = archscan.measure.datasheet_profile("h100")
    r = archscan.scan("zoo:llama_tiny", ["1,1:int64"], dtype="bf16", quant="int8", kv="int8", decode=64, profile=h100,
                      rules=[], recommend=False)
    from archscan.report.html import report_html
    from archscan.report.markdown import report_markdown

    data = r.to_json()
    md = report_markdown(data)
    q = r.quant
    assert "## Quantization" in md
    assert f"| forward, quantized | {q['after']['param_bytes']:,} | {q['after']['weight_bytes']:,} |" in md
    assert f"| decode step, quantized | - | {q['decode']['after']['weight_bytes']:,} |" in md
    assert "- kept: output: the last layer" in md
    html = report_html(data)
    assert 'id="quant"' in html and "the last layer" in html
    assert "## Quantization" not in report_markdown(archscan.scan("zoo:llama_tiny", ["1,8:int64"], rules=[]).to_json())


def test_int4_on_the_cpu_says_which_layout_and_where_the_packed_one_runs(capsys):
    q = archscan.scan("zoo:llama_tiny", ["1,16:int64"], quant="int4", profile=False, rules=[], recommend=False).quant
    assert "IntxUnpackedToInt8Tensor" in q["note"] and "--device-profile h100" in q["note"]
    h100 = archscan.measure.datasheet_profile("h100")
    assert "note" not in archscan.scan("zoo:llama_tiny", ["1,1:int64"], quant="int4", profile=h100, rules=[],
                                       recommend=False).quant
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    result = archscan.quantize(model, [(4, 64)], scheme="int4:g32")
    assert any("IntxUnpackedToInt8Tensor" in note for note in result.notes)
