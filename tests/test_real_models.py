"""Models as users have them: Hugging Face-style decoders returning cache objects, forward hooks,
value-dependent paths, library package layouts. Runs without network or optional packages; the
real transformers models are checked when transformers is installed."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import archscan

HF_LIKE = os.path.join(os.path.dirname(__file__), "models", "hf_like.py")


# Peak RSS of a subprocess, in KiB: Linux's VmHWM belongs to the new program, while ru_maxrss is kept
# across exec and so starts at the size of the pytest process that spawned it.
PEAK_KIB = ("next((int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM')), None) "
            "or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss")


def _torch_multiply_adds(model: nn.Module, *inputs) -> int:
    """The oracle: torch.utils.flop_counter on a real run counts 2 per multiply-add (attention on
    the math backend: torch has no formula for the CPU flash kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        model.eval()(*inputs)
    return counter.get_total_flops() // 2


def _mac_within(reports, rel=0.01) -> bool:
    macs = [r.totals.mac_bytes for r in reports]
    return max(macs) <= (1 + rel) * min(macs)


@pytest.mark.parametrize("name", ["CacheDecoder", "CacheEncoderDecoder"])
def test_models_returning_cache_objects_stay_on_fake_tensors(name):
    """A DynamicCache output: the recording (auto's capture after fx) and export
    (archscan flattens outputs, which torch.export would reject) both take the model without a
    real run, and count what a real run counts."""
    import hf_like

    report = archscan.scan(f"{HF_LIKE}:{name}", ["2,16:int64"], rules=[])
    assert report.capture == "eager", report.capture_notes
    assert any("one forward pass recorded" in n for n in report.capture_notes)  # recorded, not run
    assert not any("for real" in n for n in report.capture_notes)
    assert report.totals.flops == _torch_multiply_adds(getattr(hf_like, name)(), torch.zeros(2, 16, dtype=torch.long))
    exported = archscan.scan(f"{HF_LIKE}:{name}", ["2,16:int64"], capture_method="export", rules=[])
    assert exported.capture == "export"
    assert exported.totals.flops == report.totals.flops and _mac_within([report, exported])


def test_llama_2_7b_sized_decoder_is_analysed_in_under_2_gib():
    """A 6.7B-parameter decoder (27 GB of float32 weights) with use_cache=True: analysed without
    its weights (meta or fake tensors) in a fresh process whose peak RSS stays under 2 GiB."""
    code = (f"import resource, archscan; r = archscan.scan({HF_LIKE + ':big_cache_decoder'!r}, ['1,128:int64']); "
            "import json; print(json.dumps({'params': r.totals.params, 'capture': r.capture, 'notes': r.capture_notes, "
            f"'peak_kib': {PEAK_KIB}}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    # embed + head 2*32000*4096; per layer 4*4096^2 + 2*4096*16384 + 16384 + 4096 + 2*2*4096
    assert data["params"] == 2 * 32000 * 4096 + 32 * (4 * 4096**2 + 2 * 4096 * 16384 + 16384 + 4096 + 4 * 4096)
    assert data["capture"] == "eager" and any("one forward pass recorded" in n for n in data["notes"])
    assert data["peak_kib"] < 2 * 1024 * 1024


def test_value_dependent_model_skips_export_and_runs_seeded(toy):
    """Export and the fake-tensor recording fail on `if y.abs().mean() > -1`, each saying why in
    words, and the real run uses seeded inputs the report names."""
    r = archscan.scan(f"{toy}:DataBranch", [(1, 3, 8, 8)], rules=[])
    assert r.capture == "eager"
    assert "export failed (the model needs tensor values at tests/models/toy.py:57" in r.capture_notes[0]
    assert "eager on fake tensors failed (the model needs tensor values" in r.capture_notes[0]
    assert "toy.py:57" in r.capture_notes[0]
    assert any("torch.manual_seed(0)" in n and "seeded random inputs" in n for n in r.capture_notes)


class ValueSized(nn.Module):
    """How much work runs depends on the input's values (like detection heads after NMS)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x[x.sum(-1) > 0])


def test_eager_captures_are_repeatable_and_leave_the_callers_rng_alone():
    instance = ValueSized()
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    flops = {archscan.scan(ValueSized, [(64, 8)], rules=[]).totals.flops for _ in range(3)}
    assert len(flops) == 1 and 0 < flops.pop() < 64 * 8 * 8
    assert torch.equal(torch.get_rng_state(), before)
    archscan.scan(instance, [(64, 8)], rules=[], measure=True)  # a user instance, measured too
    assert torch.equal(torch.get_rng_state(), before)


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv2d(3, 8, 3))
        self.old_norm = nn.utils.weight_norm(nn.Conv2d(8, 8, 1))  # a forward pre-hook computes the weight
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.old_norm(self.conv(x)).mean((2, 3)))


def test_user_forward_hooks_never_break_or_pollute_a_scan():
    model = Hooked()
    features = []
    model.conv.register_forward_hook(lambda m, i, o: features.append(o))
    model.fc.register_forward_pre_hook(lambda m, args: args[0].numpy() and None)
    handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: features.append(o))
    try:
        reports = [archscan.scan(model, [(1, 3, 10, 10)], capture_method=m, rules=[]) for m in ("fx", "export", "eager")]
        auto = archscan.scan(model, [(1, 3, 10, 10)], rules=[])
    finally:
        handle.remove()
    assert features == []
    # conv 8*8*8*3*9 = 13824, 1x1 conv 8*8*8*8 = 4096, fc 8*4 = 32
    assert {r.totals.flops for r in reports + [auto]} == {13824 + 4096 + 32}
    assert auto.capture == "fx"
    assert any("2 forward hook(s)" in n for n in auto.capture_notes)
    assert len(model.conv._forward_hooks) == 1 and len(model.fc._forward_pre_hooks) == 1  # the user's model keeps them


def test_source_lines_point_into_library_packages(tmp_path, monkeypatch):
    """A model defined in a library under site-packages (torchvision-style layout): findings name
    that library's file and line, not the caller's scan() line."""
    pkg = tmp_path / "site-packages" / "visionlib" / "models"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "tiny.py").write_text(textwrap.dedent("""\
        import torch.nn as nn


        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3, bias=False)
                self.bn = nn.BatchNorm2d(8)

            def forward(self, x):
                return self.bn(self.conv(x))


        def tiny():
            return Tiny()
        """))
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    r = archscan.scan("visionlib.models.tiny:tiny", [(1, 3, 8, 8)])
    fuse = [f for f in r.findings if f.rule == "fuse-conv-bn"]
    assert fuse and fuse[0].source.endswith(os.path.join("visionlib", "models", "tiny.py") + ":11"), fuse[0].source
    assert r.node("conv").source.endswith("tiny.py:11")


# --- the real thing, where transformers is installed ------------------------------------------------

def _hf_models():
    transformers = pytest.importorskip("transformers")
    small = dict(vocab_size=128)
    return {
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, **small)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **small)),
        "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **small)),
        "bart": lambda: transformers.BartForConditionalGeneration(transformers.BartConfig(
            d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, **small)),
    }


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "bart"])
def test_hugging_face_models_with_their_default_cache(name):
    factory = _hf_models()[name]
    report = archscan.scan(factory, ["2,16:int64"])
    assert report.capture == "eager" and "one forward pass recorded" in report.capture_notes[-1], report.capture_notes
    torch.manual_seed(0)
    assert report.totals.flops == _torch_multiply_adds(factory(), torch.zeros(2, 16, dtype=torch.long))
    assert not [f for f in report.findings if f.rule == "host-tensor" and f.severity == "warning"]


def test_named_inputs_reach_forward_by_keyword(capsys):
    """--input decoder_input_ids=1,8:int64: T5/BART-style keyword inputs, in every capture."""
    from archscan.cli import main

    import hf_like

    model = hf_like.CacheEncoderDecoder()
    ids, dec = torch.zeros(2, 16, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long)
    want = _torch_multiply_adds(model, ids, dec)
    assert want != _torch_multiply_adds(model, ids)  # the decoder length changes the count
    for method in ("auto", "fx", "export", "eager"):
        if method == "fx":
            continue  # the cache objects defeat symbolic tracing
        r = archscan.scan(model, ["2,16:int64", "decoder_input_ids=2,8:int64"], capture_method=method, rules=[])
        assert r.totals.flops == want, method
        assert r.inputs[1] == {"shape": [2, 8], "dtype": "int64", "name": "decoder_input_ids", "values": "zeros"}
    assert archscan.scan(model, {"input_ids": "2,16:int64", "decoder_input_ids": "2,8:int64"}).totals.flops == want
    code = main([f"{HF_LIKE}:CacheEncoderDecoder", "--input", "2,16:int64", "--input", "decoder_input_ids=2,8:int64",
                 "--json"])
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["totals"]["flops"] == want


def test_optional_arguments_not_given_keep_their_defaults():
    """fx traces forward arguments that are not passed as their defaults (mask=None stays None)."""

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x, mask=None):
            y = self.fc(x)
            return y if mask is None else y * mask

    plain = archscan.scan(Masked, [(2, 8)], rules=[])
    assert plain.capture == "fx" and plain.totals.flops == 2 * 8 * 8
    masked = archscan.scan(Masked, ["2,8", "mask=2,8"], rules=[])
    assert masked.capture == "fx" and masked.totals.elem_ops == plain.totals.elem_ops + 16


def test_output_tensors_are_found_in_any_container():
    """What forward returns only has to be flattened to its tensors: dicts, dataclasses, objects
    with __dict__ or __slots__, cycles, modules (skipped)."""
    from archscan.load.recording import output_tensors

    class Slots:
        __slots__ = ("a", "b")

        def __init__(self, a, b):
            self.a, self.b = a, b

    class One:
        __slots__ = "only"

    a, b, c = torch.ones(1), torch.zeros(2), torch.ones(3)
    one = One()
    one.only = c
    box = Slots(a, [b, {"k": one}])
    box.b.append(box)  # a cycle
    assert [t.shape for t in output_tensors((box, nn.Linear(2, 2), "text", 3))] == [a.shape, b.shape, c.shape]


def test_an_exported_program_is_a_target(tmp_path, capsys):
    """archscan program.pt2: the saved graph is the capture (module paths and types kept), its
    example inputs are the default --input, and it counts what the model counts."""
    from archscan.cli import main

    import toy

    model = toy.Net().eval()
    path = str(tmp_path / "net.pt2")
    torch.export.save(torch.export.export(model, (torch.randn(2, 3, 16, 16),)), path)
    direct = archscan.scan(model, [(2, 3, 16, 16)], rules=[])
    program = archscan.scan(path, [(2, 3, 16, 16)], rules=[])
    assert program.capture == "export"
    assert (program.totals.flops, program.totals.mac_bytes, program.totals.params) == \
        (direct.totals.flops, direct.totals.mac_bytes, direct.totals.params)
    assert program.module("conv").type == "Conv2d" and program.module("conv").flops == direct.module("conv").flops
    code = main([path, "--json"])  # no --input: the program's example inputs
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["inputs"] == [{"shape": [2, 3, 16, 16], "dtype": "float32"}]
    assert data["totals"]["flops"] == direct.totals.flops
    (tmp_path / "bad.pt2").write_text("not a program")
    assert main([str(tmp_path / "bad.pt2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an exported program" in err


@pytest.mark.parametrize("name, layers", [("gpt2", 2), ("llama", 2), ("bart", 6)])
def test_hugging_face_eager_attention_is_recommended_and_rewritten_to_sdpa(name, layers):
    factory = _hf_models()[name]

    def eager():
        model = factory()
        model.config._attn_implementation = "eager"  # the hand-written softmax(q @ k^T) @ v path
        return model

    report = archscan.scan(eager, ["1,16:int64"])
    rec = next(r for r in report.recommendations if r.kind == "sdpa")
    assert len(rec.target) == layers  # bart: 2 encoder, 2 decoder self- and 2 cross-attentions
    result = archscan.fuse(eager, ["1,16:int64"])
    assert len(result.attention) == layers and result.check.passed
    ops = {str(n.target) for n in result.program.graph.nodes}
    assert "aten.scaled_dot_product_attention.default" in ops and "aten.softmax.int" not in ops


@pytest.mark.parametrize("name, spec", [("bert", "2,16:int64"), ("llama", "1,16:int64")])
def test_hugging_face_students_load_with_torch_alone(name, spec, tmp_path):
    """distill's saved program holds plain tensors (no ModelOutput, no cache object): torch.export.load
    in a process that never imports transformers runs it; Llama keeps its default cache."""
    import subprocess
    import sys

    transformers = pytest.importorskip("transformers")
    factory = {
        "bert": lambda: transformers.BertModel(transformers.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=128)),
        "llama": _hf_models()["llama"],
    }[name]
    from archscan.distill import distill

    out = tmp_path / f"{name}-student.pt2"
    result = distill(factory, [spec], path=str(out))
    assert result.path == str(out) and out.exists()
    shape = [int(s) for s in spec.split(":")[0].split(",")]
    code = (f"import sys, torch; p = torch.export.load({str(out)!r}).module(); "
            f"y = p(torch.zeros({shape}, dtype=torch.long)); "
            "assert 'transformers' not in sys.modules; print(type(y).__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_mixtral_experts_count_by_hand_in_every_dtype(dtype):
    """Mixtral's experts run through torch's grouped GEMM in bf16 and, in float32 under export,
    through transformers' own ``grouped_mm_fallback`` op: both count T·k routed rows, exactly."""
    transformers = pytest.importorskip("transformers")
    b, t, h, heads, kv, inter, experts, k, vocab, layers = 2, 16, 64, 4, 2, 128, 4, 2, 128, 2
    config = transformers.MixtralConfig(
        hidden_size=h, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, num_local_experts=experts, num_experts_per_tok=k, vocab_size=vocab)
    report = archscan.scan(lambda: transformers.MixtralForCausalLM(config), f"{b},{t}:int64", dtype=dtype,
                           recommend=False, rules=[], train=True)
    d = h // heads
    per_layer = (b * t * (2 * h * h + 2 * h * kv * d)   # q, o; k, v (grouped-query heads)
                 + b * heads * t * t * d * 2            # Q K^T and A V, dense
                 + b * t * h * experts                  # the router
                 + b * t * k * 3 * h * inter)           # gate, up, down of the k experts each token meets
    # the rotary angles: transformers 5.17 takes inv_freq @ position_ids as a matmul (one row of
    # positions: t × d/2), later versions an outer product of no multiply-adds
    rotary = sum(n.flops for n in report.nodes if n.module.endswith("rotary_emb"))
    assert rotary in (0, t * d // 2)
    assert report.totals.flops == layers * per_layer + b * t * h * vocab + rotary
    assert not [op for op in report.uncounted if "mm" in op]
    # total vs active: one token uses k of each layer's E experts (Mixtral-8x7B: 46.7 G and 12.9 G)
    assert report.totals.active_params == report.totals.params - layers * (experts - k) * 3 * h * inter
    step = report.to_json()["training"]["phases"]
    grouped = [n for n in report.nodes if "grouped_mm" in n.op]
    assert grouped and sum(n.flops for n in grouped) == layers * b * t * k * 3 * h * inter
    assert step["backward"]["flops"] > 2 * report.totals.flops - 2 * b * t * h * vocab  # experts' gradients counted


def test_a_hugging_face_sliding_window_is_counted_as_executed():
    """Mistral builds its sliding-window mask from positions: over 32 tokens a window of 4 lets
    1 + 2 + 3 + 29 * 4 = 122 of the 1,024 query-key pairs through, in each capture."""
    transformers = pytest.importorskip("transformers")

    def mistral():
        return transformers.MistralForCausalLM(transformers.MistralConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=1000, sliding_window=4))

    dense = 2 * 2 * 4 * 32 * 32 * (16 + 16)  # layers * batch * heads * queries * keys * (q.k and p.v)
    for method in ("auto", "export"):
        report = archscan.scan(mistral, ["2,32:int64"], capture_method=method, rules=[])
        assert report.totals.flops - report.totals.executed_flops == dense - dense * 122 // 1024, method
    # --decode 16: the prefill's window counted too (58 of 256 pairs); Hugging Face's cache keeps the
    # last window - 1 tokens, so nothing grows per token: 3 tokens x 512 bytes are fixed per sequence
    report = archscan.scan(mistral, ["2,1:int64"], decode=16, rules=[], recommend=False)
    prefill, dense = report.phases["prefill"], 2 * 2 * 4 * 16 * 16 * (16 + 16)
    assert prefill["flops"] - prefill["executed_flops"] == dense - dense * 58 // 256
    per_token = 2 * 2 * 2 * 16 * 4  # layers * (keys, values) * KV heads * head dim * float32
    assert report.kv_cache["bytes_per_token"] == 0
    assert 3 * per_token <= report.kv_cache["fixed_bytes_per_sequence"] < 4 * per_token
