"""Capture paths (fx, export, eager), invariants, and the scan API."""

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import archscan
from archscan.errors import ArchscanError


@pytest.mark.parametrize("target,inputs", [
    ("zoo:shufflenet_v2_x1_0", [(1, 3, 224, 224)]),
    ("zoo:vit_tiny", [(1, 3, 224, 224)]),
    ("zoo:llama_tiny", ["1,32:int64"]),
    ("Net", [(2, 3, 16, 16)]),
    ("DataBranch", [(1, 3, 8, 8)]),
    ("ShapeBranch", [(1, 3, 16, 16)]),
])
def test_per_layer_values_sum_to_totals(target, inputs, toy):
    target = target if target.startswith("zoo:") else f"{toy}:{target}"
    r = archscan.scan(target, inputs)
    t = r.totals
    for field in ("flops", "mac_bytes", "elem_ops", "read_bytes", "write_bytes", "weight_bytes"):
        assert sum(getattr(n, field) for n in r.nodes) == getattr(t, field), field
    assert t.mac_bytes == t.read_bytes + t.write_bytes
    assert sum(n.params for n in r.nodes) + t.unused_params == t.params
    root = r.module("")
    assert (root.flops, root.mac_bytes, root.params) == (t.flops, t.mac_bytes, t.params)
    # a module's subtree sum equals the sum of its children's plus its own direct nodes
    for m in r.modules:
        if m.path and m.nodes:
            inside = [n for n in r.nodes if n.module == m.path or n.module.startswith(m.path + ".")]
            assert sum(n.flops for n in inside) == m.flops


# Peak RSS of a subprocess, in KiB: Linux's VmHWM belongs to the new program, while ru_maxrss is kept
# across exec and so starts at the size of the pytest process that spawned it.
PEAK_KIB = ("next((int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM')), None) "
            "or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss")


def test_fx_capture_keeps_modules_whole(toy):
    r = archscan.scan(f"{toy}:Net", [(1, 3, 8, 8)])
    assert r.capture == "fx"
    assert [n.op for n in r.nodes] == ["Conv2d", "BatchNorm2d", "ReLU", "AdaptiveAvgPool2d", "torch.flatten", "Linear"]
    assert r.node("conv").source.endswith("toy.py:20")  # x = self.relu(self.bn(self.conv(x)))


@pytest.mark.parametrize("method, kind", [("auto", "eager"), ("export", "export")])
def test_shape_control_flow_is_recorded_or_exported(toy, method, kind):
    """fx cannot follow a branch on a shape: auto records one forward pass on fake tensors (no
    attention written by hand, so export is not needed); export, forced, counts the same."""
    r = archscan.scan(f"{toy}:ShapeBranch", [(1, 3, 16, 16)], capture_method=method)
    assert r.capture == kind
    if method == "auto":
        assert "fx failed" in r.capture_notes[0]
    # conv 3->4 1x1 at 16x16: 256*3*4 = 3072; the taken branch multiplies by 2 (element work)
    assert r.totals.flops == 3072
    assert any(n.category == "elementwise" and n.module == "" for n in r.nodes)
    assert r.module("conv").flops == 3072


def test_eager_fallback_on_tensor_control_flow(toy):
    r = archscan.scan(f"{toy}:DataBranch", [(1, 3, 8, 8)])
    assert r.capture == "eager"
    assert any("path" in note for note in r.capture_notes)
    # conv 64*3*4 = 768 + fc 4*2 = 8
    assert r.totals.flops == 776
    assert any(n.category == "host_sync" for n in r.nodes)  # the .item() behind `if`
    assert r.module("conv").flops == 768 and r.module("fc").flops == 8
    relu = [n for n in r.nodes if n.category == "activation"]
    assert relu and relu[0].inputs  # data flow rebuilt from tensor identity


def _mac_agrees(reports: dict, rel: float = 0.01) -> bool:
    macs = [r.totals.mac_bytes for r in reports.values()]
    return max(macs) <= (1 + rel) * min(macs)


def _fused_models():
    from toy import SelfAttention

    # attention: in-proj 2*10*64*64*3 + QK^T and AV 2*2*10*10*64 + out-proj 2*10*64*64 = 353280
    # encoder layer: attention + FFN 2*10*(64*256 + 256*64) = 655360 -> 1008640
    # (torch.fx cannot trace the encoder layers' mask canonicalisation: export and eager only)
    return [(SelfAttention(64, 4).eval(), 353_280, ("fx", "export", "eager")),
            (nn.TransformerEncoderLayer(64, 4, 256, batch_first=True), 1_008_640, ("export", "eager")),
            (nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 256, batch_first=True), 2, enable_nested_tensor=False),
             2 * 1_008_640, ("export", "eager"))]


@pytest.mark.parametrize("index", range(3))
def test_fused_fast_paths_are_costed_as_the_unfused_ops_by_every_capture(index):
    """nn.MultiheadAttention / TransformerEncoderLayer take a fused kernel in an eager no-grad run
    (_native_multi_head_attention, _transformer_encoder_layer_fwd) but not under torch.export:
    every capture costs the unfused ops, so FLOPs and MAC do not depend on the capture."""
    model, flops, methods = _fused_models()[index]
    reports = {m: archscan.scan(model, [(2, 10, 64)], capture_method=m, rules=[]) for m in methods}
    assert {m: r.totals.flops for m, r in reports.items()} == dict.fromkeys(reports, flops)
    assert _mac_agrees(reports), {m: r.totals.mac_bytes for m, r in reports.items()}
    assert all(r.uncounted == {} for r in reports.values())
    assert torch.backends.mha.get_fastpath_enabled()  # the caller's setting is back
    # torch's own counter misses the fused path of a real run entirely:
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model.eval()(torch.randn(2, 10, 64))
    assert fc.get_total_flops() == 0 or index == 2


def test_all_captures_agree_on_a_plain_model(toy):
    reports = {m: archscan.scan(f"{toy}:Net", [(1, 3, 16, 16)], capture_method=m) for m in ("fx", "export", "eager")}
    flops = {m: r.totals.flops for m, r in reports.items()}
    params = {m: r.totals.params for m, r in reports.items()}
    assert len(set(flops.values())) == 1, flops
    assert len(set(params.values())) == 1
    assert {r.capture for r in reports.values()} == {"fx", "export", "eager"}


def test_scan_leaves_a_user_instance_untouched(toy):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    before = model[0].weight.detach().clone()
    r = archscan.scan(model, torch.randn(2, 4))
    assert r.totals.flops == 32
    assert type(model[0].weight.data) is torch.Tensor and torch.equal(model[0].weight.detach(), before)


def test_unused_parameters_are_reported(toy):
    r = archscan.scan(f"{toy}:Unused", [(2, 8)])
    assert r.totals.params == 72 + 9000
    assert r.totals.unused_params == 9000
    assert r.module("spare").params == 9000 and r.module("spare").nodes == 0


def test_70b_analysis_fits_in_2_gib():
    """Fake tensors: llama3_70b at 1x2048 tokens is analysed in a fresh process under 2 GiB peak RSS
    (its fp32 weights alone would take 263 GiB)."""
    import json
    import subprocess
    import sys

    code = ("import resource, json, archscan; r = archscan.scan('zoo:llama3_70b', ['1,2048:int64']); "
            "print(json.dumps({'params': r.totals.params, "
            f"'peak_kib': {PEAK_KIB}}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["params"] == 70_553_706_496
    assert data["peak_kib"] < 2 * 1024 * 1024


def test_scan_api_input_forms():
    a = archscan.scan("zoo:resnet18", (1, 3, 64, 64))
    b = archscan.scan("zoo:resnet18", ["1,3,64,64"])
    c = archscan.scan("zoo:resnet18", [torch.empty(1, 3, 64, 64)])
    assert a.totals == b.totals == c.totals
    with pytest.raises(ArchscanError):
        archscan.scan("zoo:resnet18", [])


@pytest.mark.parametrize("name,sync_op", [("ItemScale", "aten._local_scalar_dense"), ("NonZero", "aten.nonzero")])
def test_value_dependent_ops_fall_back_to_eager(toy, name, sync_op):
    r = archscan.scan(f"{toy}:{name}", [(4, 8)])
    assert r.capture == "eager"
    assert "needs tensor values" in r.capture_notes[0]
    syncs = [n for n in r.nodes if n.category == "host_sync"]
    assert [n.op for n in syncs] == [sync_op]
    assert r.totals.flops == 4 * 8 * 8


@pytest.mark.parametrize("name,spec", [("vit_tiny", "1,3,224,224"), ("shufflenet_v2_x0_5", "1,3,224,224"),
                                       ("llama_tiny", "1,32:int64"), ("vit_b_16", "1,3,224,224"),
                                       ("shufflenet_v1_g3_x1_0", "1,3,224,224"), ("g3_parallel_4", None)])
def test_all_captures_agree_on_zoo_models(name, spec):
    """fx (fake), export (fake) and eager (a real CPU run, fused attention paths) count the same."""
    # vit_b_16 runs nn.MultiheadAttention: its fused fast path is costed as the unfused ops everywhere
    from archscan import zoo

    specs = [spec] if spec else list(zoo.get_entry(name).default_input)
    totals = {m: archscan.scan(f"zoo:{name}", specs, capture_method=m, rules=[]).totals
              for m in ("fx", "export", "eager")}
    assert len({(t.flops, t.params, t.mac_bytes, t.unused_params) for t in totals.values()}) == 1, totals


def test_traced_graph_module_is_lazy_and_runs_as_the_model():
    """archscan.capture.graphmodule relies on torch's _LazyGraphModule: this fails when torch drops or
    changes it (the fallback, a plain GraphModule, still works but costs ~5 ms a trace)."""
    from archscan.capture import trace_fx
    from archscan.capture.graphmodule import LAZY

    assert LAZY is not None, "torch.fx._lazy_graph_module._LazyGraphModule is gone: see archscan/capture/graphmodule.py"
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4)).eval()
    x = torch.randn(2, 3, 8, 8)
    expected = model(x)
    gm = trace_fx(model)
    assert isinstance(gm, LAZY) and isinstance(gm, torch.fx.GraphModule)
    assert gm._needs_recompile(), "the lazy GraphModule generated its code at once: no time saved"
    assert torch.equal(gm(x), expected)  # forward compiles on first call
    assert not gm._needs_recompile() and "def forward" in gm.code


@pytest.mark.parametrize("options", [{}, {"train": True, "memory": "1GiB"}, {"decode": 32}],
                         ids=["scan", "train-memory", "decode"])
def test_the_constructor_runs_once_per_scan(options):
    """One build per scan: the capture, the inference memory, the training step, the budget's
    searches and the decode phases all copy it (``archscan.load.building.with_build``)."""
    from archscan import zoo

    calls = []

    def factory():
        calls.append(1)
        return zoo.create_model("llama_tiny")

    inputs = ["1,1:int64"] if "decode" in options else ["2,16:int64"]
    report = archscan.scan(factory, inputs, recommend=False, **options)
    assert len(calls) == 1
    assert report.totals.flops > 0
    if "train" in options:
        assert report.memory["budget"]["max_batch"] > 2 and report.training_step["memory"]["peak_bytes"] > 0
    if "decode" in options:
        assert report.kv_cache and report.phases["decode"]["flops"] > 0
