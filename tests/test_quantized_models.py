"""Models that are already quantized, counted as they are: torch.ao's dynamic (``quantize_dynamic``)
and static (QuantStub/DeQuantStub, ``prepare``, calibrate, ``convert``) quantized layers, whose
weights are packed in TorchScript objects, and torchao's tensor-subclass weights (``quantize_``).

Oracles: the float model the quantized one was made from (its parameter count; its multiply-adds
by ``torch.utils.flop_counter.FlopCounterMode``, 2 per multiply-add), the bytes torch itself holds
(a quantized tensor's ``int_repr()``, its scales and zero points; a subclass's inner tensors'
``untyped_storage().nbytes()``), and hand formulas on tiny shapes."""

import copy
import textwrap
import warnings

import pytest
import torch
import torch.ao.quantization as tq
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import archscan
from archscan.cli import main
from archscan.costs.quantized import int_mm_flops, quantized_conv_flops, quantized_linear_flops, quantized_rnn_flops

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's deprecation of quantized tensors


class MLP(nn.Module):
    def __init__(self, k: int = 64, hidden: int = 128, n: int = 10):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(k, hidden), nn.ReLU(), nn.Linear(hidden, n)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ConvNet(nn.Module):
    """Eager-mode static quantization: quantize the input, run int8 layers, dequantize the output."""

    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv, self.relu, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = self.relu(self.conv(self.quant(x)))
        return self.dequant(self.fc(torch.flatten(x, 1)))


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.fc = nn.LSTM(16, 32, num_layers=2, batch_first=True), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc(self.lstm(x)[0])


def _float_multiply_adds(model: nn.Module, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval()(x)
    return counter.get_total_flops() // 2


def _float_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _qtensor_bytes(w: torch.Tensor) -> int:
    """A quantized tensor as torch holds it: its int8 values, its scales (float64) and zero points (int64)."""
    if w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        return w.int_repr().nbytes + w.q_per_channel_scales().nbytes + w.q_per_channel_zero_points().nbytes
    return w.int_repr().nbytes + torch.tensor(w.q_scale(), dtype=torch.float64).nbytes \
        + torch.tensor(w.q_zero_point(), dtype=torch.int64).nbytes


def _linear_packed_bytes(layer: nn.Module) -> int:
    w, b = layer.weight(), layer.bias()
    return _qtensor_bytes(w) + (b.nbytes if b is not None else 0)


def _subclass_bytes(t: torch.Tensor) -> int:
    """A torchao weight's inner tensors' storages, to the byte."""
    names, _ = t.__tensor_flatten__()
    return sum(getattr(t, name).untyped_storage().nbytes() for name in names)


def _node(report, module: str):
    found = [n for n in report.nodes if n.module == module and n.flops]
    assert len(found) == 1, [(n.name, n.module, n.flops) for n in report.nodes]
    return found[0]


def _dynamic(model: nn.Module, layers=frozenset({nn.Linear})) -> nn.Module:
    torch.manual_seed(0)
    return tq.quantize_dynamic(model.eval(), set(layers), dtype=torch.qint8)


def _static(model: nn.Module) -> nn.Module:
    model = copy.deepcopy(model).eval()
    model.qconfig = tq.get_default_qconfig("x86")
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(2, 3, 8, 8))
    return tq.convert(model, inplace=True)


# --- the formulas, by hand ------------------------------------------------------------------------------

def test_quantized_formulas_on_tiny_shapes():
    assert quantized_linear_flops((4, 64), (4, 128)) == 4 * 64 * 128  # M*K*N = 32768
    assert quantized_linear_flops((2, 5, 32), (2, 5, 4)) == 2 * 5 * 32 * 4  # 1280
    # [2, 8, 8, 8] = conv([2, 3, 8, 8], W [8, 3, 3, 3]): 2*8*64 outputs * 3*9 = 27648
    assert quantized_conv_flops((8, 3, 3, 3), (2, 8, 8, 8)) == 27648
    # transposed W [ci=4, co=2, 3, 3] on [1, 4, 5, 5]: every input position meets the whole kernel, 25 * 72 = 1800
    assert quantized_conv_flops((4, 2, 3, 3), (1, 2, 7, 7), transposed=True, x=(1, 4, 5, 5)) == 1800
    # 2x5 tokens through w_ih [128, 16] and w_hh [128, 32]: 10 * (2048 + 4096) = 61440
    assert quantized_rnn_flops((2, 5, 16), ((128, 16), (128, 32))) == 61440
    assert int_mm_flops((4, 64), (64, 128)) == 32768


# --- torch.ao: dynamic quantization ---------------------------------------------------------------------

def test_quantize_dynamic_linear_counts_as_its_float_layers():
    x = torch.randn(4, 64)
    float_model = MLP().eval()
    q = _dynamic(copy.deepcopy(float_model))
    report = archscan.scan(q, [tuple(x.shape)], rules=None)
    t = report.totals
    assert t.params == _float_params(float_model) == 64 * 128 + 128 + 128 * 10 + 10  # 9610
    # fc1 4*64*128 = 32768, fc2 4*128*10 = 5120: the float model's, by torch's counter
    assert t.flops == _float_multiply_adds(float_model, x) == 32768 + 5120
    stored = _linear_packed_bytes(q.fc1) + _linear_packed_bytes(q.fc2)
    # per tensor: 8192 int8 + 16 (scale, zero point) + 512 bias; 1280 + 16 + 40
    assert t.param_bytes == stored == 8720 + 1336
    fc1 = _node(report, "fc1")
    assert fc1.flops == 32768 and fc1.category == "linear" and fc1.params == 8320
    assert fc1.weight_bytes == _linear_packed_bytes(q.fc1) == 8720  # the weight read at its stored bytes
    assert fc1.read_bytes == 4 * 64 * 4 + 8720 and fc1.write_bytes == 4 * 128 * 4
    assert fc1.dtype == "qint8" and fc1.attrs["weight_dtype"] == "qint8"  # an int8 GEMM, float32 out
    assert (fc1.attrs["in_features"], fc1.attrs["out_features"]) == (64, 128)
    assert t.used_params == t.params and not report.unused_param_names
    assert not any(op.startswith("quantized.") for op in report.uncounted)
    # per-layer values sum to the totals; the packed weights belong to their layers
    assert sum(n.flops for n in report.nodes) == t.flops
    assert {m.path: m.params for m in report.modules if m.path in ("fc1", "fc2")} == {"fc1": 8320, "fc2": 1290}
    rules = {f.rule for f in report.findings}
    assert "low-precision" not in rules and "no-grad" not in rules  # convert leaves its layers in train mode


def test_quantize_dynamic_lstm_counts_as_its_float_lstm():
    x = torch.randn(2, 5, 16)
    float_model = Recurrent().eval()
    q = _dynamic(copy.deepcopy(float_model), {nn.LSTM, nn.Linear})
    report = archscan.scan(q, [tuple(x.shape)], rules=[])
    t = report.totals
    assert t.params == _float_params(float_model)  # 2 layers of (4h*i + 4h*h + 2*4h) and the head
    # 10 tokens: layer 0 128*(16+32), layer 1 128*(32+32): 10 * (6144 + 8192); the head 10 * 32 * 4
    assert t.flops == 10 * (6144 + 8192) + 10 * 32 * 4 == 144640
    lstm = _node(report, "lstm")
    assert lstm.category == "rnn" and lstm.flops == 143360
    cells = [torch.ops.quantized.linear_unpack(p) for layer in q.lstm._all_weight_values
             for p in layer.param.__getstate__()[0][4]]
    biases = [b for layer in q.lstm._all_weight_values for b in layer.param.__getstate__()[0][1]]
    stored = sum(_qtensor_bytes(w) for w, _ in cells) + sum(b.nbytes for b in biases)
    assert lstm.weight_bytes == stored
    assert t.param_bytes == stored + _linear_packed_bytes(q.fc)
    assert not report.uncounted


def test_cli_scans_a_quantize_dynamic_model(tmp_path, capsys):
    path = tmp_path / "qmodel.py"
    path.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.act, self.fc2 = nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)

            def forward(self, x):
                return self.fc2(self.act(self.fc1(x)))

        def quantized():
            return torch.ao.quantization.quantize_dynamic(MLP().eval(), {nn.Linear}, dtype=torch.qint8)
    """))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main([f"{path}:quantized", "--input", "4,64", "--json"])
    assert code == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["totals"]["params"] == 9610 and out["totals"]["flops"] == 37888  # 4*64*128 + 4*128*10
    assert out["totals"]["param_bytes"] == 8720 + 1336
    assert not any(op.startswith("quantized.") for op in out["uncounted"])
    # the empty totals made element-wise work look like most of the model (G4 warned) and fp32 work
    # the model does not do (low-precision): neither is said of it now
    assert not [f for f in out["findings"] if f["severity"] != "info" or f["rule"] == "low-precision"]
    nodes = {n["module"]: n for n in out["nodes"] if n["flops"]}
    assert nodes["fc1"]["flops"] == 32768 and nodes["fc1"]["params"] == 8320


# --- torch.ao: static quantization ----------------------------------------------------------------------

def test_static_quantized_conv_and_linear_count_as_their_float_layers():
    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(0)
    float_model = ConvNet().eval()
    q = _static(float_model)
    report = archscan.scan(q, [tuple(x.shape)], rules=[])
    t = report.totals
    assert t.params == _float_params(float_model) == 3 * 8 * 9 + 8 + 512 * 10 + 10  # 5354
    # conv 2*8*8*8 outputs * 27 = 27648, fc 2*512*10 = 10240: the float model's
    assert t.flops == _float_multiply_adds(float_model, x) == 27648 + 10240
    conv_w, conv_b = q.conv._packed_params.unpack()
    conv_bytes = _qtensor_bytes(conv_w) + conv_b.nbytes  # 216 int8 + 8 scales*8 + 8 zero points*8 + 32 bias
    assert conv_bytes == 216 + 64 + 64 + 32
    assert t.param_bytes == conv_bytes + _linear_packed_bytes(q.fc)
    conv, fc = _node(report, "conv"), _node(report, "fc")
    assert conv.category == "conv" and conv.attrs["in_channels"] == 3 and conv.attrs["out_channels"] == 8
    assert conv.weight_bytes == conv_bytes and fc.weight_bytes == _linear_packed_bytes(q.fc)
    # int8 activations flow between the layers: uint8 bytes in and out
    assert conv.dtype == "quint8" and fc.dtype == "quint8" and conv.attrs["weight_dtype"] == "qint8"
    assert conv.read_bytes == 2 * 3 * 64 + conv_bytes and conv.write_bytes == 2 * 8 * 64
    assert not report.uncounted
    # (de)quantizing: one element op per element (2*3*64 in, 2*10 out)
    converts = [n for n in report.nodes if n.op in ("aten.quantize_per_tensor", "aten.dequantize.self")]
    assert {n.category for n in converts} == {"elementwise"} and sum(n.elem_ops for n in converts) == 384 + 20


# --- torchao: tensor-subclass weights -------------------------------------------------------------------

def _torchao_configs():
    torchao = pytest.importorskip("torchao")
    del torchao
    from torchao.quantization import (Float8WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig,
                                      Int8WeightOnlyConfig, IntxWeightOnlyConfig)
    from torchao.quantization.granularity import PerGroup

    return {"int8": (Int8WeightOnlyConfig(), "int8", None),
            "w8a8": (Int8DynamicActivationInt8WeightConfig(), "int8", "int8"),
            "fp8": (Float8WeightOnlyConfig(), "float8_e4m3fn", None),
            "int4": (IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)), "int4", None)}


@pytest.mark.parametrize("scheme", ["int8", "w8a8", "fp8", "int4"])
def test_torchao_weights_count_as_stored(scheme):
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_

    config, weight_dtype, compute = _torchao_configs()[scheme]
    x = torch.randn(4, 64)
    torch.manual_seed(0)
    float_model = MLP(64, 128, 32).eval()
    q = copy.deepcopy(float_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_(q, config)
    report = archscan.scan(q, [tuple(x.shape)], rules=None)
    t = report.totals
    assert t.params == _float_params(float_model) == 64 * 128 + 128 + 128 * 32 + 32  # 12448
    assert t.flops == _float_multiply_adds(float_model, x) == 4 * 64 * 128 + 4 * 128 * 32  # 49152
    stored = {name: _subclass_bytes(getattr(q, name).weight) for name in ("fc1", "fc2")}
    assert t.param_bytes == sum(stored.values()) + 128 * 4 + 32 * 4  # the float biases as they are
    for name, (k, n) in {"fc1": (64, 128), "fc2": (128, 32)}.items():
        node = _node(report, name)
        assert node.category == "linear" and node.flops == 4 * k * n
        assert node.weight_bytes == stored[name] + n * 4  # the weight read once at its bytes as stored, and the bias
        assert node.attrs["weight_dtype"] == weight_dtype and node.params == k * n + n
        if compute is None:  # weight-only: a float GEMM reading the stored weight
            assert node.read_bytes == 4 * k * 4 + stored[name] + n * 4 and node.dtype == "float32"
        else:  # the activations quantized first (1 byte each, a float32 scale per row), an int8 GEMM
            assert node.dtype == compute and node.elem_ops == 2 * 4 * k
            assert node.read_bytes == 4 * k * 4 + (4 * k + stored[name] + n * 4)
            assert node.write_bytes == 4 * k + 4 * 4 + 4 * n * 4
    int8_values = 64 * 128 + 128 * 32
    assert t.weight_bytes < 4 * int8_values  # far from float32's bytes
    assert not report.uncounted
    assert "low-precision" not in {f.rule for f in report.findings}
