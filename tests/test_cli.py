"""The command line: the main job, JSON, the zoo list, and bad input as one clear line."""

import os
import json

import pytest

from archscan.cli import main


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *needles):
    assert code != 0
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("archscan: error:")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_main_job_table(capsys, toy):
    code, out, err = run(capsys, f"{toy}:Net", "--input", "1,3,32,32")
    assert code == 0, err
    assert "conv" in out and "fc" in out and "FLOPs" in out
    # conv 3->8 3x3 at 32x32: 32*32*8*27 = 221184; fc 8*10 = 80
    assert "(221,264)" in out


def test_json_schema(capsys, toy):
    code, out, _ = run(capsys, f"{toy}:Net", "--input", "1,3,32,32", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["schema"] == "archscan.report/1"
    assert data["capture"] == "fx"
    assert data["inputs"] == [{"shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert data["totals"]["flops"] == 221_264
    assert data["totals"]["params"] == 3 * 8 * 9 + 16 + 8 * 10 + 10
    assert data["totals"]["mac_bytes"] == sum(n["mac_bytes"] for n in data["nodes"])
    node_keys = {"name", "op", "module", "category", "flops", "mac_bytes", "params", "out_shape"}
    assert all(node_keys <= set(n) for n in data["nodes"])
    assert {"path", "flops", "mac_bytes", "params"} <= set(data["modules"][0])
    assert data["uncounted"] == {}


def test_kwargs_and_factory(capsys, toy):
    code, out, _ = run(capsys, f"{toy}:make_net", "--input", "1,3,8,8", "--kwargs", "num_classes=3", "--json")
    assert code == 0
    data = json.loads(out)
    assert [n["out_shape"] for n in data["nodes"]][-1] == [1, 3]


def test_importable_factory(capsys, toy, monkeypatch):
    import os
    monkeypatch.syspath_prepend(os.path.dirname(toy))
    code, out, _ = run(capsys, "toy:make_net", "--input", "1,3,8,8", "--kwargs", "num_classes=4", "--json")
    assert code == 0
    assert json.loads(out)["nodes"][-1]["out_shape"] == [1, 4]


def test_several_and_integer_inputs(capsys, toy):
    code, out, _ = run(capsys, f"{toy}:TwoInputs", "--input", "2,16", "--input", "2,10", "--json")
    assert code == 0
    # 2*16*8 + 2*10*8 = 416
    assert json.loads(out)["totals"]["flops"] == 416
    code, out, _ = run(capsys, f"{toy}:Tokens", "--input", "1,12:int64", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["inputs"][0]["dtype"] == "int64"
    assert data["totals"]["flops"] == 12 * 16 * 100


def test_dtype_option(capsys, toy):
    code, out, _ = run(capsys, f"{toy}:TwoInputs", "--input", "2,16", "--input", "2,10", "--dtype", "bfloat16", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["dtype"] == "bfloat16"
    assert {n["dtype"] for n in data["nodes"]} == {"bfloat16"}


def test_zoo_list(capsys):
    code, out, _ = run(capsys, "zoo")
    assert code == 0
    for name in ("shufflenet_v2_x1_0", "mobilenet_v2", "resnet50", "vit_b_16", "llama3_70b"):
        assert name in out


def test_zoo_model_default_input(capsys):
    code, out, _ = run(capsys, "zoo:shufflenet_v2_x0_5", "--json")
    assert code == 0
    assert json.loads(out)["inputs"][0]["shape"] == [1, 3, 224, 224]


def test_depth_option(capsys):
    code1, shallow, _ = run(capsys, "zoo:resnet18", "--depth", "1")
    code2, deep, _ = run(capsys, "zoo:resnet18", "--depth", "3")
    assert code1 == code2 == 0
    table = lambda text: text.split("\n\n")[0]  # noqa: E731  the module table, before the totals
    assert "conv2" not in table(shallow) and "conv2" in table(deep)
    assert len(table(deep).splitlines()) > len(table(shallow).splitlines())


# --- bad input: one line on stderr, exit code != 0, no traceback ------------------------------------

def test_missing_file(capsys):
    code, _, err = run(capsys, "no/such/model.py:Net", "--input", "1,3,8,8")
    assert_one_line_error(code, err, "not found", "no/such/model.py")


def test_syntax_error(capsys, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\nclass Net(:\n    pass\n")
    code, _, err = run(capsys, f"{bad}:Net", "--input", "1,3,8,8")
    assert_one_line_error(code, err, "bad.py:3", "syntax error")


def test_unknown_name(capsys, toy):
    code, _, err = run(capsys, f"{toy}:Nett", "--input", "1,3,8,8")
    assert_one_line_error(code, err, "no 'Nett'", "Net")


def test_unknown_zoo_name(capsys):
    code, _, err = run(capsys, "zoo:resnet5O", "--input", "1,3,8,8")
    assert_one_line_error(code, err, "resnet50")


def test_constructor_needs_arguments(capsys, toy):
    code, _, err = run(capsys, f"{toy}:NeedsArgs", "--input", "1,8")
    assert_one_line_error(code, err, "width", "depth", "--kwargs")


@pytest.mark.parametrize("spec", ["1,3,a,4", "", "1,-3", "1;3;4", "1,3:int65"])
def test_malformed_input(capsys, toy, spec):
    code, _, err = run(capsys, f"{toy}:Net", "--input", spec)
    assert_one_line_error(code, err)


def test_shape_rejected_names_layer_and_shapes(capsys, toy):
    code, _, err = run(capsys, f"{toy}:Net", "--input", "1,4,8,8")
    assert_one_line_error(code, err, "'conv'", "Conv2d", "[1, 4, 8, 8]")


def test_model_that_fails_in_its_graph(capsys, toy):
    code, _, err = run(capsys, f"{toy}:Broken", "--input", "2,4")
    assert_one_line_error(code, err, "toy.py:70", "matmul", "[2, 4], [3, 3]")


def test_untraceable_model_that_cannot_run(capsys, toy):
    # fx and export fail on the tensor-valued branch; the eager run then fails too
    code, _, err = run(capsys, f"{toy}:BrokenAfterBranch", "--input", "2,4")
    assert_one_line_error(code, err, "cannot run", "toy.py:82")


def test_unknown_dtype(capsys, toy):
    code, _, err = run(capsys, f"{toy}:Net", "--input", "1,3,8,8", "--dtype", "float33")
    assert_one_line_error(code, err, "float33")


def test_not_a_model(capsys, toy):
    code, _, err = run(capsys, f"{toy}:not_a_model", "--input", "1,3,8,8")
    assert_one_line_error(code, err, "int")


def test_unknown_option(capsys, toy):
    code, _, err = run(capsys, f"{toy}:Net", "--inptu", "1,3,8,8")
    assert code != 0 and "Traceback" not in err


# --- findings --------------------------------------------------------------------------------------

def test_findings_in_table_and_json(capsys, toy):
    code, out, _ = run(capsys, f"{toy}:Unused", "--input", "2,8")
    assert code == 0 and "unused-module" in out and "spare" in out
    code, out, _ = run(capsys, f"{toy}:Unused", "--input", "2,8", "--json")
    data = json.loads(out)
    (f,) = [f for f in data["findings"] if f["rule"] == "unused-module"]
    assert set(f) >= {"rule", "severity", "module", "message", "evidence", "saving"}
    assert f["saving"]["params"] == 9000


def test_rules_and_skip_rules_select(capsys, toy):
    code, out, _ = run(capsys, f"{toy}:Net", "--input", "1,3,8,8", "--json", "--rules", "fuse-conv-bn")
    assert {f["rule"] for f in json.loads(out)["findings"]} == {"fuse-conv-bn"}
    code, out, _ = run(capsys, f"{toy}:Net", "--input", "1,3,8,8", "--json", "--skip-rules", "fuse-conv-bn,G4")
    rules = {f["rule"] for f in json.loads(out)["findings"]}
    assert rules and "fuse-conv-bn" not in rules and "G4" not in rules


def test_fail_on(capsys, toy):
    code, _, err = run(capsys, f"{toy}:Unused", "--input", "2,8", "--fail-on", "warning")
    assert code == 1 and "--fail-on warning" in err
    code, _, _ = run(capsys, f"{toy}:Unused", "--input", "2,8", "--fail-on", "error")
    assert code == 0
    code, _, _ = run(capsys, f"{toy}:Mlp", "--input", "2,16", "--rules", "unused-module", "--fail-on", "info")
    assert code == 0


def test_unknown_rule(capsys, toy):
    code, _, err = run(capsys, f"{toy}:Net", "--input", "1,3,8,8", "--rules", "G5")
    assert_one_line_error(code, err, "G5", "G1")


# --- measuring ---------------------------------------------------------------------------------------

def test_calibrate_then_predict(capsys, toy):
    code, out, _ = run(capsys, "calibrate", "--device", "cpu", "--quick", "--force")  # output and caching, not stability
    assert code == 0 and "multiply-adds/s" in out and "saved" in out
    code, out, _ = run(capsys, f"{toy}:Net", "--input", "1,3,8,8", "--json")
    data = json.loads(out)
    assert data["latency"]["predicted_ms"] > 0 and all("predicted_ms" in n for n in data["nodes"])


def test_measure_on_cpu(capsys, toy):
    code, out, _ = run(capsys, f"{toy}:Net", "--input", "1,3,8,8", "--measure", "--device", "cpu", "--threads", "1")
    assert code == 0 and "end to end on cpu" in out and "1 threads" in out and "per layer" in out


def test_guidelines_command(capsys):
    code, out, _ = run(capsys, "guidelines", "--device", "cpu", "--tables", "G4")
    assert code == 0
    assert "g4_relu_shortcut" in out and "paper GPU" in out and "ordering" in out


def test_guidelines_bad_options(capsys):
    code, _, err = run(capsys, "guidelines", "--scale", "3")
    assert_one_line_error(code, err, "--scale 3")
    code, _, err = run(capsys, "guidelines", "--tables", "G5")
    assert_one_line_error(code, err, "G5")


@pytest.mark.parametrize("target,inputs,needle", [
    ("TwoInputs", ["2,16"], "TwoInputs.forward takes 2 input(s) (x, y) but 1 --input was given"),
    ("make_net", ["1,3,8,8", "1,3"], "Net.forward takes 1 input(s) (x) but 2 --input were given"),
])
def test_wrong_number_of_inputs(capsys, toy, target, inputs, needle):
    args = [f"{toy}:{target}"] + [a for spec in inputs for a in ("--input", spec)]
    code, _, err = run(capsys, *args)
    assert_one_line_error(code, err, needle)


def test_float_token_ids_get_a_hint(capsys, toy):
    code, _, err = run(capsys, f"{toy}:Tokens", "--input", "1,12")
    assert_one_line_error(code, err, "'emb'", "--input 1,128:int64")


def test_reader_gone_is_quiet():
    """`archscan ... | head -1`: no traceback, no 'the model called sys.exit', exit 141 as `cat` does."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "archscan.cli", "compare", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "80"})
    proc.stdout.close()  # before the child writes (it is still importing): its first write finds no reader
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""
