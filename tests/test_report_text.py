"""Terminal text fitted to a width: the module tree keeps its levels, no line is wider than the
terminal, prose wraps at word boundaries and a source file:line is never split."""

import io
import re
import sys

import pytest
import torch
import torch.nn as nn

import archscan
from archscan.cli import main
from archscan.report.text import (DEFAULT_WIDTH, findings_table, fmt_bytes, fmt_count, module_table, node_table,
                                  render_text, terminal_width)
from archscan.results import Finding, ModuleReport, NodeReport, Report, Totals

SITE = ".venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py:113"
FIX = ("fold BN into the conv weights: torch.fx.experimental.optimization.fuse(model) or "
       "torch.ao.quantization.fuse_modules(model.eval(), [[conv, bn, relu], ...])")


def module(path: str, type_: str, flops: int = 115_605_504, params: int = 36_864) -> ModuleReport:
    return ModuleReport(path=path, type=type_, depth=path.count(".") + 1 if path else 0, flops=flops, elem_ops=200_704,
                        mac_bytes=1_753_088, params=params, nodes=1, out_shape=(1, 128, 28, 28), category="depthwise_conv")


def node(name: str, op: str, module_path: str) -> NodeReport:
    return NodeReport(name=name, op=op, module=module_path, module_type="Linear", category="elementwise", flops=2_097_152,
                      elem_ops=8192, mac_bytes=327_680, read_bytes=294_912, write_bytes=32_768, weight_bytes=262_144,
                      params=65_536, out_shape=(1, 32, 256), dtype="float32", attrs={"bound": "memory", "achieved": 0.42},
                      latency_ms=0.0123, predicted_ms=0.0051)


def report(modules, nodes=(), findings=(), model="nested", latency=None) -> Report:
    totals = Totals(params=1_692_928, flops=46_989_312, mac_bytes=10_682_752, elem_ops=358_000, read_bytes=8_493_056,
                    write_bytes=2_189_696, weight_bytes=5_777_408, used_params=1_692_928, unused_params=0,
                    param_bytes=6_771_712)
    return Report(model=model, capture="fx", inputs=({"shape": [1, 32], "dtype": "int64"},), dtype="float32",
                  totals=totals, nodes=tuple(nodes), modules=tuple(modules), uncounted={}, findings=tuple(findings),
                  latency=latency)


# a ResNet-like tree; the last top-level module has a child, so its rows start with spaces
NESTED = [module("", "Nested"), module("conv1", "Conv2d"), module("layer1", "Sequential"), module("layer1.0", "BasicBlock"),
          module("layer1.0.conv1", "Conv2d"), module("layer1.0.bn1", "BatchNorm2d"), module("layer1.1", "BasicBlock"),
          module("layer1.1.conv1", "Conv2d"), module("layer1.1.bn1", "BatchNorm2d"), module("head", "Head"),
          module("head.fc", "Linear")]


def wide_report() -> Report:
    """Long names everywhere: a Hugging Face-style tree, aten and higher-order ops, site-packages sources."""
    modules = [module("", "LlamaForCausalLM"), module("model", "LlamaModel"), module("model.layers", "ModuleList"),
               module("model.layers.0", "LlamaDecoderLayer"), module("model.layers.0.self_attn", "LlamaAttention"),
               module("model.layers.0.self_attn.q_proj", "Linear"), module("model.rotary_emb", "LlamaRotaryEmbedding")]
    nodes = [node("_assert_tensor_metadata_default_4", "aten._assert_tensor_metadata", "model.layers.0.input_layernorm"),
             node("wrap_with_set_grad_enabled", "torch.ops.higher_order.wrap_with_set_grad_enabled", "model.rotary_emb"),
             node("linear", "aten.linear.default", "model.layers.0.self_attn.q_proj")]
    findings = [
        Finding("host-tensor", "warning", "model.layers.0.self_attn", "4 tensor(s) created on the host inside forward",
                {}, {"copies": 4}, "register them as buffers in __init__ (register_buffer), or create them with "
                "device=x.device", SITE),
        Finding("inplace", "info", "model.layers.0.self_attn.rotary_emb_and_friends (+22)",
                "23 out-of-place element-wise op(s) consume a temporary only they read", {},
                {"mac_bytes": 821_248, "kernels": 23, "params": 16_200}, FIX, SITE.replace(":113", ":4711")),
        Finding("channels-last", "info", "", "convolutions are 100% of the FLOPs: try channels_last with cudnn.benchmark",
                {}, {}, "model.to(memory_format=torch.channels_last), inputs too; torch.backends.cudnn.benchmark = "
                "True; measure both with archscan --measure --channels-last"),
    ]
    return report(modules, nodes, findings, model="/home/someone/projects/llm/scripts/hf_llama.py:tiny_llama",
                  latency={"predicted_ms": 0.5, "profile": {"name": "NVIDIA H100 80GB HBM3", "created": "2025-06-01"}})


def tree_column(table: str) -> list[str]:
    """The module column of a rendered module table, one label per row."""
    lines = table.splitlines()
    width = len(lines[1].split("  ")[0])
    return [line[:width].rstrip() for line in lines[2:] if line and not line.startswith("(left out")]


class Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn1(self.conv1(x))) + x


class Nested(nn.Module):
    """conv1 -> layer1 (two residual blocks of conv1, bn1) -> fc: three levels of modules."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.layer1 = nn.Sequential(Block(8), Block(8))
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.layer1(self.conv1(x)).mean((2, 3)))


# --- the module tree ---------------------------------------------------------------------------------

def test_tree_keeps_every_level():
    assert tree_column(module_table(report(NESTED), depth=3, width=200)) == [
        "nested",
        "├─ conv1",
        "├─ layer1",
        "│  ├─ 0",
        "│  │  ├─ conv1",
        "│  │  └─ bn1",
        "│  └─ 1",
        "│     ├─ conv1",
        "│     └─ bn1",
        "└─ head",
        "   └─ fc",  # tabulate stripped these leading spaces: fc read as a sibling of head
    ]


def test_tree_stops_at_depth():
    assert tree_column(module_table(report(NESTED), depth=1, width=200)) == ["nested", "├─ conv1", "├─ layer1", "└─ head"]


def test_scanned_model_tree_at_depth_3():
    r = archscan.scan(Nested(), [(1, 3, 16, 16)], name="nested")
    labels = tree_column(module_table(r, depth=3, width=80))
    # layer1.0.conv1 sits under layer1.0, which sits under layer1: three glyph levels, not a sibling of conv1
    block = labels.index("│  ├─ 0")
    assert labels[block - 1] == "├─ layer1" and labels[block + 1] == "│  │  ├─ conv1"
    assert labels[1] == "├─ conv1"


def test_long_model_name_shortened_from_the_left():
    labels = tree_column(module_table(report(NESTED, model="/home/someone/projects/llm/scripts/net.py:Net"), width=120))
    assert labels[0] == "…/llm/scripts/net.py:Net"


# --- widths ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [80, 120])
def test_every_line_fits(width):
    r = wide_report()
    for text in (render_text(r, depth=5, width=width), render_text(r, per_node=True, width=width),
                 module_table(report(NESTED), depth=3, width=width), node_table(r, width=width)):
        too_wide = [line for line in text.splitlines() if len(line) > width]
        assert not too_wide, "\n".join(too_wide)


@pytest.mark.parametrize("width", [80, 120])
def test_scanned_model_fits(width):
    r = archscan.scan(Nested(), [(1, 3, 16, 16)], name="nested")
    for text in (render_text(r, depth=3, width=width), render_text(r, per_node=True, width=width)):
        assert max(len(line) for line in text.splitlines()) <= width


def test_least_important_columns_go_first():
    r = report(NESTED)
    wide = module_table(r, depth=3, width=200)
    assert wide.splitlines()[0].split() == ["module", "type", "category", "params", "FLOPs", "share", "MAC", "elem",
                                            "ops", "FLOPs/B", "out", "shape"]
    assert "left out" not in wide
    narrow = module_table(r, depth=3, width=80).splitlines()
    kept = narrow[0].split()
    assert kept[:2] == ["module", "type"] and {"FLOPs", "MAC"} <= set(kept) and "category" not in kept
    assert narrow[-1].endswith("--json has every value)") and "category, elem ops" in " ".join(narrow[-2:])


def test_node_table_keeps_name_and_flops():
    header = node_table(wide_report(), width=80).splitlines()[0].split()
    assert header[0] == "node" and "FLOPs" in header and "ms" in header
    assert "category" not in header


# --- findings ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_file_line_never_split(width):
    lines = findings_table(wide_report(), width=width).splitlines()
    for path in (SITE, SITE.replace(":113", ":4711")):
        file_line = path.rsplit("/", 1)[1]  # modeling_llama.py:113
        shown = [line for line in lines if file_line in line]
        assert len(shown) == 1, lines
        token = re.search(r"\S*" + re.escape(file_line) + r"(?=\s|$)", shown[0]).group()
        # the whole path, or its tail after '…': shortened from the left, never wrapped onto two lines
        assert token == path or (token.startswith("…/") and path.endswith(token[1:])), shown[0]
    assert not [line for line in lines if re.fullmatch(r"\s*\d+", line) or line.rstrip().endswith(".py:")]


@pytest.mark.parametrize("width", [80, 120, 200])
def test_prose_wraps_at_word_boundaries(width):
    text = findings_table(wide_report(), width=width)
    body = " ".join(line for line in text.splitlines())
    for word in ("out-of-place", "element-wise", "temporary", "--measure", "--channels-last", "register_buffer),",
                 "device=x.device", "[[conv,"):
        assert word in body, word  # each word whole on one line, never broken at a hyphen or mid-word
    assert "torch.fx.experimental." in body  # a dotted name longer than the column breaks after a dot


def test_findings_stack_when_narrow():
    wide = findings_table(wide_report(), width=200).splitlines()
    assert wide[0].split() == ["severity", "rule", "where", "finding", "saving", "fix"]
    narrow = findings_table(wide_report(), width=80).splitlines()
    assert narrow[0].split() == ["rule", "where", "finding"]
    assert narrow[3].split()[0] == "warning" and any("fix: register them as buffers" in line for line in narrow)
    assert any("saving: 802 KiB, 23 kernels," in line for line in narrow)  # 821248 B / 1024 = 802 KiB


# --- units and the terminal ---------------------------------------------------------------------------

def test_units_never_in_exponent_form():
    assert fmt_bytes(1011 * 1024) == "0.987 MiB"   # 1011 KiB = 0.987 MiB, not '1.01e+03 KiB'
    assert fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(432) == "432 B"
    assert fmt_count(999_999) == "1M"              # not '1e+03K'
    assert fmt_count(221_264) == "221K" and fmt_count(80) == "80"


def test_terminal_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "77")
    assert terminal_width() == 77
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr(sys, "__stdout__", io.StringIO())  # a pipe: no terminal to ask
    assert terminal_width() == DEFAULT_WIDTH == 120


def test_cli_fits_columns(capsys, monkeypatch, toy):
    monkeypatch.setenv("COLUMNS", "80")
    assert main([f"{toy}:Net", "--input", "1,3,32,32"]) == 0
    out = capsys.readouterr().out
    assert "left out to fit 80 columns" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_the_memory_line_shortens_a_library_path_as_the_findings_do():
    """A peak inside an installed library: the memory line names the source's last parts, as the
    findings' column does, not the machine's whole path (the JSON keeps it)."""
    from archscan.report.text import _memory_line
    where = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py:175"
    memory = {"peak_bytes": 1 << 20, "at_peak": {"activations": 1 << 20},
              "peak_at": {"phase": "forward", "op": "mul", "module": "model.layers.3.mlp", "source": where}}
    line = _memory_line("memory     ", memory)
    assert "…/models/llama/modeling_llama.py:175" in line and "/root/" not in line and "site-packages" not in line
