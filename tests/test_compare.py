"""archscan compare: rows, ratios, patterns, sweeps, failures, and the paper's equal-FLOPs point."""

from __future__ import annotations

import json

import pytest

import archscan
from archscan.cli import main
from archscan.api import compare
from archscan.compare import expand, jobs, with_batch
from archscan.errors import ArchscanError


def _run(capsys, *args) -> tuple[int, dict]:
    code = main(["compare", *args, "--json"])
    out = capsys.readouterr()
    assert code == 0 or "models failed" in out.err
    return code, json.loads(out.out)


def test_rows_match_single_scans(capsys):
    code, data = _run(capsys, "zoo:shufflenet_v2_x0_5", "zoo:mobilenet_v1_050")
    assert code == 0 and data["schema"] == "archscan.compare/1"
    assert [r["model"] for r in data["rows"]] == ["zoo:shufflenet_v2_x0_5", "zoo:mobilenet_v1_050"]
    for row in data["rows"]:
        report = archscan.scan(row["target"], [(1, 3, 224, 224)], profile=False)
        assert (row["params"], row["flops"], row["mac_bytes"]) == (report.totals.params, report.totals.flops,
                                                                   report.totals.mac_bytes)
        assert set(row["findings"]) >= {"G1", "G2", "G3", "G4"}
        assert sum(row["findings"].values()) == len(report.findings)
    first, second = data["rows"]
    assert data["baseline"] == first["model"] and first["ratios"]["flops"] == 1.0
    assert second["ratios"]["flops"] == pytest.approx(second["flops"] / first["flops"])


def test_equal_flops_differ_in_memory_access():
    """The paper's Table 8 point: ShuffleNetV1 1x (g=3) has about ShuffleNetV2 1x's FLOPs (140 vs
    146 MFLOPs published) but moves more bytes, through more element-wise work."""
    rows = {r["target"]: r for r in compare(["zoo:shufflenet_v2_x1_0", "zoo:shufflenet_v1_g3_x1_0"], profile=False).rows}
    v2, v1 = rows["zoo:shufflenet_v2_x1_0"], rows["zoo:shufflenet_v1_g3_x1_0"]
    assert v1["flops"] == pytest.approx(v2["flops"], rel=0.1)
    assert v1["mac_bytes"] > 1.3 * v2["mac_bytes"]
    assert v1["elementwise_mac_share"] > v2["elementwise_mac_share"]


def test_patterns_batches_and_own_inputs():
    assert expand(["zoo:shufflenet_v2_x*"]) == [f"zoo:shufflenet_v2_x{s}" for s in ("0_5", "1_0", "1_5", "2_0")]
    planned = jobs(["zoo:resnet18", "zoo:vit_tiny@1,3,64,64"], ["2,3,32,32"], [1, 4])
    assert [(j.target, j.inputs, j.batch) for j in planned] == [
        ("zoo:resnet18", ("2,3,32,32",), 1), ("zoo:resnet18", ("2,3,32,32",), 4),
        ("zoo:vit_tiny", ("1,3,64,64",), 1), ("zoo:vit_tiny", ("1,3,64,64",), 4)]
    assert with_batch(["1,128:int64", "attention_mask=1,128:int64"], 8) == ["8,128:int64", "attention_mask=8,128:int64"]
    result = compare(["zoo:mobilenet_v1_050"], ["1,3,96,96"], [1, 2], profile=False)
    small, big = result.rows
    assert (small["batch"], big["batch"]) == (1, 2) and big["flops"] == 2 * small["flops"]
    with pytest.raises(ArchscanError, match="no zoo model matches"):
        expand(["zoo:nothing_*"])


def test_failed_model_is_a_row_and_exit_3(capsys, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass Net(torch.nn.Module):\n    def forward(self, x):\n        return x @ torch.ones(5, 5)\n")
    code, data = _run(capsys, "zoo:shufflenet_v2_x0_5", f"{bad}:Net@1,3,8,8", "missing.py:Net", "zoo:nope")
    assert code == 3
    rows = {r["model"].split("@")[0]: r for r in data["rows"]}
    assert "error" not in rows["zoo:shufflenet_v2_x0_5"] and rows["zoo:shufflenet_v2_x0_5"]["flops"] > 0
    assert "not found" in rows["missing.py:Net"]["error"]
    assert "no zoo model" in rows["zoo:nope"]["error"]
    assert "error" in rows[f"{bad}:Net"]


def test_sort_and_baseline():
    result = compare(["zoo:shufflenet_v2_x1_0", "zoo:shufflenet_v2_x0_5", "zoo:mobilenet_v1_050"], profile=False,
                     sort="flops", baseline="shufflenet_v2_x1_0")
    flops = [r["flops"] for r in result.rows]
    assert flops == sorted(flops)
    assert result.baseline == "zoo:shufflenet_v2_x1_0"
    assert next(r for r in result.rows if r["target"] == "zoo:shufflenet_v2_x1_0")["ratios"]["flops"] == 1.0
    with pytest.raises(ArchscanError, match="--sort"):
        compare(["zoo:resnet18"], sort="speed")
    with pytest.raises(ArchscanError, match="--baseline"):
        compare(["zoo:shufflenet_v2_x0_5"], profile=False, baseline="resnet18")


@pytest.mark.parametrize("args, message", [(["zoo:resnet18", "--batch", "0"], "--batch"),
                                           (["zoo:resnet18", "--input", "1,,x"], "--input"),
                                           (["zoo:resnet18", "--sort", "speed"], "--sort")])
def test_usage_errors(capsys, args, message):
    assert main(["compare", *args]) == 2
    assert message in capsys.readouterr().err


def test_text_table(capsys):
    assert main(["compare", "zoo:shufflenet_v2_x0_5", "zoo:mobilenet_v1_050"]) == 0
    out = capsys.readouterr().out
    assert "zoo:mobilenet_v1_050" in out and "x FLOPs" in out and "baseline" in out


def test_fragments_of_nested_blocks_in_every_renderer(tmp_path, capsys):
    """RegNetY nests its residual blocks in Sequential stages inside a Sequential trunk, and each
    block's transform in Sequentials of its own: the fragments column is the blocks' fragments that
    G3 reports (7 per stage-opening block, 6 per other), in the table, the Markdown and the HTML, and
    no report names a path outside the working directory."""
    models = "tests/models/regnety.py"
    md, html = tmp_path / "c.md", tmp_path / "c.html"
    assert main(["compare", f"{models}:RegNetY", f"{models}:small", "--input", "1,3,64,64",
                 "--markdown", str(md), "--report", str(html), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    report = archscan.scan(f"{models}:RegNetY", [(1, 3, 64, 64)], recommend=False)
    g3 = [f for f in report.findings if f.rule == "G3"]
    assert report.totals.params == 4_344_144  # torchvision's regnet_y_400mf
    assert sorted((len(f.evidence["blocks"]), f.evidence["fragments"]) for f in g3) == [(4, 7), (12, 6)]
    assert rows[0]["fragments"] == 4 * 7 + 12 * 6 == 100 and rows[1]["fragments"] > 0
    markdown, page = md.read_text(), html.read_text()
    assert "| 100 |" in next(line for line in markdown.splitlines() if line.startswith("| `tests/models/regnety.py:RegNetY`"))
    assert ">100<" in page
    for text in (markdown, page):
        assert str(tmp_path) not in text and "/work/" not in text and "/home/" not in text and "/root/" not in text


def test_decode_columns_in_every_renderer(tmp_path, capsys):
    """compare --decode on two GPUs: KV per token, step bytes and tokens/s on each GPU, and the
    peak memory, in the terminal's table, the Markdown and the HTML alike."""
    models = "tests/models/new_users.py"
    md, html = tmp_path / "c.md", tmp_path / "c.html"
    assert main(["compare", f"{models}:llama_mha", f"{models}:llama_gqa", "--input", "1,1:int64", "--decode", "64",
                 "--device-profile", "h100,a100-80gb", "--markdown", str(md), "--report", str(html)]) == 0
    out = capsys.readouterr().out
    for short in ("peak mem", "KV/token", "step bytes", "tok/s h100", "tok/s a100-80gb"):
        assert short in out
    for long in ("peak memory", "KV bytes per token", "decode step bytes", "tokens/s on h100", "tokens/s on a100-80gb"):
        assert long in md.read_text() and long in html.read_text()
    rows = [line for line in md.read_text().splitlines() if line.startswith("| `")]
    assert "| 1,024 |" in rows[0] and "| 512 |" in rows[1]  # KV bytes per token: 4 KV heads, then 2
