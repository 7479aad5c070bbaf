"""The direct run (``archscan.capture.direct``) gives exactly the fake path's report, on every zoo model,
and gives way to the fake path where it cannot: values read, budgets, errors. Its shortcuts (matrix
products and convolutions by shape) are checked against the CPU kernels they stand in for."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import archscan
from archscan import capture, zoo
from archscan.capture import direct
from archscan.load.targets import ModelTarget, parse_input_spec, resolve_target
from archscan.prune import analyse, meta_copy
from archscan.prune.groups import ChannelLabels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIG = {"llama3_70b", "llama2_7b", "llama3_8b", "vit_h_14", "vit_l_16"}
aten = torch.ops.aten


def _answered(monkeypatch, name: str) -> list[bool]:
    """Which calls of ``capture.<name>`` gave a capture (True) or gave way (False)."""
    seen: list[bool] = []
    original = getattr(capture, name)

    def wrapped(*args, **kwargs):
        out = original(*args, **kwargs)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(capture, name, wrapped)
    return seen


@pytest.fixture
def spy(monkeypatch):
    """Which captures the direct run answered (True) or gave to the fake path (False)."""
    return _answered(monkeypatch, "_try_direct")


def _fake_only(monkeypatch):
    monkeypatch.setattr(direct, "MACS", 0)  # _direct_allowed is False: the fake path from the start


def _json(report, notes: bool = True) -> str:
    data = report.to_json()
    if not notes:  # the capture's own line says how it ran
        data["capture_notes"] = [n for n in data["capture_notes"] if "one forward pass recorded" not in n]
    # the memory timeline steps through the ops of the forward as it runs: nn.MultiheadAttention
    # takes its composite path op by op differently on CPU activations and on fake tensors (the
    # same tensors live at the peak, the same peak and breakdown, compared with the rest)
    if "memory" in data:  # none after a real eager capture
        data["memory"].pop("timeline")
    return json.dumps(data, sort_keys=True)


@pytest.mark.parametrize("name", [n for n in zoo.list_models() if n not in BIG])
def test_zoo_reports_identical_to_the_fake_path(name, spy, monkeypatch):
    """Whole reports: every node's costs, modules, findings, blocks; recommendations (pruned copies
    are counted in direct runs too) for the small models."""
    monkeypatch.setattr(direct, "SECONDS", 60.0)  # the time backstop depends on the machine's load, not the model
    inputs = list(zoo.get_entry(name).default_input)
    recommend = name in {"resnet18", "mobilenet_v2", "shufflenet_v2_x0_5", "vit_tiny", "llama_tiny"}
    direct_report = archscan.scan("zoo:" + name, inputs, profile=False, recommend=recommend)
    assert spy[0] is True, "the direct run gave way"
    _fake_only(monkeypatch)
    fake_report = archscan.scan("zoo:" + name, inputs, profile=False, recommend=recommend)
    assert _json(direct_report) == _json(fake_report)
    if recommend:
        assert any(r.kind == "prune" for r in direct_report.recommendations) or name == "llama_tiny"


def test_channel_groups_of_the_direct_run_equal_analyse():
    """The groups found during the capture are those ``analyse`` finds in a run of its own."""
    for name in ("mobilenet_v2", "resnet18", "shufflenet_v2_x0_5", "vit_tiny"):
        target = resolve_target("zoo:" + name)
        specs = [parse_input_spec(s) for s in target.default_inputs]
        captured = capture.capture(target, specs, observers=[ChannelLabels()])
        alone = analyse(target, specs, model=captured.model)
        grouping = captured.observed[ChannelLabels.key]
        key = lambda g: [(x.id, x.channels, x.pinned, x.producers, x.modules) for x in g.groups]  # noqa: E731
        assert key(grouping) == key(alone) and grouping.param_shapes == alone.param_shapes


class _ItemNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) * x.max().item()   # fx traces .item() as a call_method


class _Nonzero(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x)[torch.nonzero(x[:, 0])]  # an output shape the values decide


class _Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


@pytest.mark.parametrize("cls", [_ItemNet, _Nonzero])
def test_value_dependent_models_take_the_fake_path(cls, spy, monkeypatch):
    target = ModelTarget(cls.__name__, cls)
    report = archscan.scan(target, "2,8", profile=False, recommend=False)
    assert spy == [False]
    _fake_only(monkeypatch)
    assert _json(report) == _json(archscan.scan(ModelTarget(cls.__name__, cls), "2,8", profile=False, recommend=False))


def test_budget_gives_way_with_the_same_report(spy, monkeypatch):
    monkeypatch.setattr(direct, "MACS", 1)  # the first convolution that must run is over budget
    x = "1,3,32,32"
    channels_last = ModelTarget("cl", lambda: _ChannelsLast())
    report = archscan.scan(channels_last, x, profile=False, recommend=False)
    assert spy == [False]
    _fake_only(monkeypatch)
    assert _json(report) == _json(archscan.scan(ModelTarget("cl", lambda: _ChannelsLast()), x, profile=False,
                                                recommend=False))


def test_large_activations_give_way_with_the_same_report(spy, monkeypatch):
    """A large input makes large activations for real (the fake path's cost does not grow with
    them): past ``OUTPUT_BYTES`` the direct run stops, and the report is the fake path's."""
    monkeypatch.setattr(direct, "OUTPUT_BYTES", 4 << 20)  # resnet18 at batch 1 makes ~50 MiB
    report = archscan.scan("zoo:resnet18", "1,3,224,224", profile=False, recommend=False)
    assert spy == [False]
    _fake_only(monkeypatch)
    assert _json(report) == _json(archscan.scan("zoo:resnet18", "1,3,224,224", profile=False, recommend=False))


class _ChannelsLast(nn.Module):
    """A convolution on a channels-last input is computed (not by shape): the budget counts it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return self.conv(x.contiguous(memory_format=torch.channels_last))


def test_model_errors_are_the_same_error(spy, monkeypatch):
    """A model that rejects its input says so once, as the fake path says it."""
    with pytest.raises(archscan.ArchscanError) as direct_error:
        archscan.scan(ModelTarget("p", _Plain), "1,4,32,32", profile=False)
    _fake_only(monkeypatch)
    with pytest.raises(archscan.ArchscanError) as fake_error:
        archscan.scan(ModelTarget("p", _Plain), "1,4,32,32", profile=False)
    assert "layer 'conv' (Conv2d)" in str(direct_error.value) and "4" in str(direct_error.value)
    assert str(direct_error.value).split(":")[0] == str(fake_error.value).split(":")[0]


def test_no_sympy_distributed_or_dynamo_in_a_direct_scan():
    """As the console runs it (archscan.capture.nocompile installed): nothing of the fake machinery loads."""
    code = ("import sys, archscan\nfrom archscan.capture import direct, nocompile\nassert nocompile.install()\n"
            "direct.SECONDS = 60.0\n"  # the time backstop depends on the machine's load
            "archscan.scan('zoo:resnet18', '1,3,224,224', profile=False)\n"
            "print(sorted(m for m in ('sympy', 'torch.distributed.tensor', 'torch._dynamo.eval_frame', "
            "'torch.fx.experimental.symbolic_shapes') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def _conv_cases():
    for dims, (cin, cout, groups), k, s, p, d, transposed in itertools.product(
            (1, 2, 3), ((4, 8, 1), (6, 6, 6), (6, 9, 3)), (1, 3), (1, 2), (0, 1), (1, 2), (False, True)):
        yield dims, cin, cout, groups, k, s, p, d, transposed


def test_convolution_by_shape_matches_the_cpu_kernel():
    checked = 0
    for dims, cin, cout, groups, k, s, p, d, transposed in _conv_cases():
        x = torch.randn([1, cin] + [5] * dims)
        w = torch.randn(([cin, cout // groups] if transposed else [cout, cin // groups]) + [k] * dims)
        args = (x, w, torch.randn(cout), [s] * dims, [p] * dims, [d] * dims, transposed, [0] * dims, groups)
        try:
            real = aten.convolution.default(*args)
        except RuntimeError:
            assert direct._conv(args, {}) is None or min(direct._conv(args, {})) <= 0
            continue
        shape = direct._conv(args, {})
        assert shape == tuple(real.shape), args[3:]
        assert torch.zeros(shape).stride() == real.stride()
        checked += 1
    assert checked > 200
    x = torch.randn(1, 4, 5, 5).contiguous(memory_format=torch.channels_last)
    assert direct._conv((x, torch.randn(8, 4, 3, 3), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {}) is None


def test_matrix_products_by_shape_match_the_cpu_kernel():
    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    for func, args in [(aten.mm.default, (a, b)), (aten.addmm.default, (c, a, b)), (aten.addmm.default, (c[None], a, b)),
                       (aten.mm.default, (a, b.t().contiguous().t())),
                       (aten.bmm.default, (torch.randn(2, 3, 4), torch.randn(2, 4, 5))),
                       (aten.baddbmm.default, (torch.randn(2, 1, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5)))]:
        real = func(*args)
        shape = direct._SHAPES[func](args, {})
        assert shape == tuple(real.shape) and torch.zeros(shape).stride() == real.stride()
    assert direct._SHAPES[aten.mm.default]((a, torch.randn(3, 5)), {}) is None   # the kernel refuses it: it runs
    assert direct._SHAPES[aten.mm.default]((a, b.double()), {}) is None


def test_value_ops_stop_the_run():
    with pytest.raises(direct.Stop), direct.Direct():
        torch.ones(3).nonzero()
    with pytest.raises(direct.Stop), direct.Direct():
        torch.ones(3).sum().item()


def test_weights_read_as_zeros_cost_no_memory_of_their_own():
    w = torch.empty(64, 32, device="meta")
    z1, z2 = direct.zeros_like_meta(w), direct.zeros_like_meta(w.t())
    assert z1.shape == (64, 32) and z2.stride() == (1, 32) and not z1.any()
    assert z1.untyped_storage().data_ptr() == z2.untyped_storage().data_ptr()


def test_ops_that_write_a_weight_leave_the_shared_zeros_alone():
    w = torch.empty(4, device="meta")
    with direct.Direct():
        torch.ops.aten.add_.Tensor(w, torch.ones(4))   # an in-place update of a buffer, in forward
        torch.nn.functional.batch_norm(torch.randn(2, 4), w, w, training=True)  # running statistics
    assert not direct.zeros_like_meta(w).any()


def test_module_copy_matches_deepcopy():
    """meta_copy's fast path copies what deepcopy copies; a module reached outside _modules makes it
    fall back to deepcopy."""
    model = resolve_target("zoo:mobilenet_v2").build({}).to("meta")
    copy_ = meta_copy(model)
    assert [n for n, _ in copy_.named_modules()] == [n for n, _ in model.named_modules()]
    assert all(a is not b for a, b in zip(copy_.modules(), model.modules()))
    assert all(p.is_meta and p is not q for p, q in zip(copy_.parameters(), model.parameters()))
    object.__setattr__(model.features[0], "shortcut", model.features[1])  # a module outside _modules
    copy_ = meta_copy(model)
    assert copy_.features[0].__dict__["shortcut"] is copy_.features[1]


def test_direct_run_leaves_the_meta_model_untouched():
    target = resolve_target("zoo:resnet18")
    specs = [parse_input_spec(s) for s in target.default_inputs]
    captured = capture.capture(target, specs)
    assert captured.kind == "fx" and captured.fake
    assert all(t.is_meta for t in [*captured.model.parameters(), *captured.model.buffers()])


# --- the eager recording in a direct run ------------------------------------------------------------

MODELS = os.path.join(ROOT, "tests", "models")


@pytest.fixture
def recorded(monkeypatch):
    """Which captures the recording in a direct run answered (True) or gave to the fake path."""
    return _answered(monkeypatch, "_record_direct")


def _hf(name: str):
    transformers = pytest.importorskip("transformers")
    small = dict(vocab_size=128)
    configs = {
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, **small)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            **small)),
        "mistral_window": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            sliding_window=4, **small)),
        "bart": lambda: transformers.BartForConditionalGeneration(transformers.BartConfig(
            d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, **small)),
        "mamba": lambda: transformers.MambaForCausalLM(transformers.MambaConfig(
            hidden_size=64, num_hidden_layers=2, state_size=8, **small)),
        "rwkv": lambda: transformers.RwkvForCausalLM(transformers.RwkvConfig(
            hidden_size=64, num_hidden_layers=2, context_length=64, **small)),
    }
    return configs[name]


RECORDED = [  # models fx cannot trace: (target, inputs)
    (f"{MODELS}/toy.py:ShapeBranch", ["1,3,16,16"]),
    (f"{MODELS}/hf_like.py:CacheDecoder", ["2,16:int64"]),
    (f"{MODELS}/hf_like.py:CacheEncoderDecoder", ["2,16:int64"]),
    (f"{MODELS}/new_users.py:SlidingWindowAttention", ["2,16,32"]),
    (f"{MODELS}/new_users.py:WideKeyAttention", ["2,16,32"]),
    (f"{MODELS}/new_users.py:DeviceArguments", ["2,8"]),
] + [(name, ["2,16:int64"]) for name in ("gpt2", "llama", "mistral_window", "mamba", "rwkv", "bart")]
GIVES_WAY = {"bart"}  # reads a constant's value (.item()), which fake tensors give and a direct run does not


@pytest.mark.parametrize("target, inputs", RECORDED, ids=[t.rpartition(":")[2] for t, _ in RECORDED])
def test_recordings_in_a_direct_run_equal_the_fake_recording(target, inputs, recorded, monkeypatch):
    """The recording with the weights on the meta device gives the fake path's whole report
    (nodes, memory, findings, recommendations): the same ops in the same order, moves between the
    meta device and the CPU being no ops, as on fake tensors. Where it gives way, the report is
    the fake path's."""
    model = target if ":" in target else _hf(target)
    report = archscan.scan(model, inputs, profile=False)
    assert recorded == [target not in GIVES_WAY]
    assert any("weights on the meta device" in n for n in report.capture_notes) == (target not in GIVES_WAY)
    _fake_only(monkeypatch)
    fake = archscan.scan(model if ":" in target else _hf(target), inputs, profile=False)
    assert any("on fake tensors" in n for n in fake.capture_notes)
    assert _json(report, notes=False) == _json(fake, notes=False)


def test_moves_to_the_weights_device_are_no_ops(recorded):
    """``x.to(self.weight.device)`` and ``w.to(x.device)`` change nothing on fake tensors: no
    op, no device-move finding, no copy's memory; a cast beside a move stays a cast."""
    report = archscan.scan(f"{MODELS}/new_users.py:DeviceArguments", ["2,8"], profile=False)
    assert recorded == [True]
    assert [n.aten_ops for n in report.nodes if "_to_copy" in n.op] == [("aten._to_copy.default",)] * 2  # half, float
    assert not [f for f in report.findings if f.rule == "host-tensor"]
    assert not any(n.attrs.get("device_move") for n in report.nodes)


class _ToList(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[0] != 2:  # keeps torch.fx out
            raise ValueError("batch of 2")
        return self.fc(x) * len(x[:, 0].tolist())  # reads values without an op the direct run could stop


class _Item(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[0] != 2:
            raise ValueError("batch of 2")
        return self.fc(x) * x.abs().max().item()


@pytest.mark.parametrize("cls", [_ToList, _Item])
def test_recordings_that_read_values_take_the_fake_path(cls, recorded, monkeypatch):
    """A value read in forward (``.tolist()``, which dispatches no op, or ``.item()``) is not
    taken from a direct run's zeros: the fake path decides (here: a real run), as without it."""
    report = archscan.scan(ModelTarget(cls.__name__, cls), "2,8", profile=False, recommend=False)
    assert recorded == [False]
    _fake_only(monkeypatch)
    assert _json(report) == _json(archscan.scan(ModelTarget(cls.__name__, cls), "2,8", profile=False, recommend=False))


def test_a_recording_over_its_byte_budget_gives_way(recorded, monkeypatch):
    monkeypatch.setattr(direct, "RECORDING_OUTPUT_BYTES", 1024)
    target = f"{MODELS}/toy.py:ShapeBranch"
    report = archscan.scan(target, ["1,3,16,16"], profile=False, recommend=False)
    assert recorded == [False] and any("on fake tensors" in n for n in report.capture_notes)
    _fake_only(monkeypatch)
    assert _json(report) == _json(archscan.scan(target, ["1,3,16,16"], profile=False, recommend=False))


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "vit_tiny", "llama_tiny"])
def test_instances_take_the_direct_run_with_the_fake_paths_report(name, spy, monkeypatch):
    """A module handed over built on the CPU (``archscan.scan(model, ...)``) is copied with its weights on
    the meta device and captured in a direct run, with the fake path's whole report; its own
    weights and mode are left as they were."""
    inputs = list(zoo.get_entry(name).default_input)
    model = resolve_target("zoo:" + name).build({})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = archscan.scan(model, inputs, profile=False, recommend=False)
    assert spy == [True] and model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    _fake_only(monkeypatch)
    assert _json(report) == _json(archscan.scan(model, inputs, profile=False, recommend=False))


def test_instances_in_other_dtypes_or_with_lazy_modules_take_the_fake_path(spy):
    half = nn.Sequential(nn.Linear(8, 8)).to(torch.bfloat16)
    lazy = nn.Sequential(nn.LazyLinear(8))
    archscan.scan(half, "2,8", dtype="bf16", profile=False, recommend=False)
    archscan.scan(lazy, "2,8", profile=False, recommend=False)
    assert spy == []  # no direct run was tried


def test_a_recorded_instance_equals_the_fake_recording(recorded, monkeypatch):
    model = _hf("mamba")().eval()
    report = archscan.scan(model, ["2,16:int64"], profile=False)
    assert recorded == [True]
    _fake_only(monkeypatch)
    assert _json(report, notes=False) == _json(archscan.scan(model, ["2,16:int64"], profile=False), notes=False)
