"""Bad or unusual input, class by class: one `archscan: error:` line on stderr, a documented exit
code, no traceback, nothing lost; and inputs Python accepts are accepted.

Exit codes (README): 1 findings at --fail-on, 2 bad usage or input, 3 the model's code failed or
could not be captured, 4 a device problem, 5 an internal error, 130 interrupted.
"""

import json
import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from archscan.cli import main

MODEL = textwrap.dedent("""\
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self, width=4):
            super().__init__()
            self.fc = nn.Linear(8, width)

        def forward(self, x):
            return self.fc(x)
    """)


DATA_BRANCH = MODEL.replace("return self.fc(x)", "return self.fc(x) if x.sum() > 0 else self.fc(-x)")


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("archscan: error: "), lines[0]
    return lines[0]


def expect_error(capsys, code_wanted, needles, *args):
    code, out, err = run(capsys, *args)
    line = one_error_line(err)
    assert code == code_wanted, (code, line)
    for needle in needles:
        assert needle in line, (needle, line)
    return out, line


@pytest.fixture
def model_file(tmp_path):
    """Writes a model file from source text (or bytes) and returns its path."""
    def write(source, name="model.py"):
        path = tmp_path / name
        if isinstance(source, bytes):
            path.write_bytes(source)
        else:
            path.write_text(textwrap.dedent(source))
        return path
    return write


@pytest.fixture
def net(model_file):
    return model_file(MODEL)


# --- usage errors: what typer/click reject, and options archscan checks before any work ----------------

USAGE = [
    (["zoo:resnet18", "--inptu", "1,3,8,8"], ["--inptu"]),
    (["zoo:resnet18", "--depth", "abc"], ["--depth", "int"]),
    (["zoo:resnet18", "--input"], ["--input"]),
    (["zoo:resnet18", "--depth", "-1"], ["--depth"]),
    (["zoo:resnet18", "--threads", "0"], ["--threads"]),
    (["zoo:resnet18", "--amp", "fp8"], ["--amp", "--measure"]),
    (["zoo:resnet18", "--sweep"], ["--sweep", "--measure"]),
    (["zoo:resnet18", "--channels-last"], ["--channels-last", "--measure"]),
    (["zoo:resnet18", "--measure", "--amp", "fp8"], ["fp8", "bf16"]),
    (["zoo:resnet18", "--capture", "jit"], ["--capture", "jit"]),
    (["zoo:resnet18", "--fail-on", "fatal"], ["--fail-on", "fatal"]),
    (["zoo:resnet18", "--rules", "G9"], ["G9"]),
    (["scan"], ["Missing argument"]),
    (["guidelines", "--tables", ""], ["--tables"]),
    (["guidelines", "--batch", "0"], ["--batch"]),
    (["guidelines", "--batch", "-1"], ["--batch"]),
    (["calibrate", "--threads", "-1"], ["--threads"]),
    (["zoo", "--bogus"], ["--bogus"]),
]


@pytest.mark.parametrize("args,needles", USAGE, ids=[" ".join(a) or "nothing" for a, _ in USAGE])
def test_usage_errors_are_one_line_before_any_work(capsys, monkeypatch, args, needles):
    from archscan import analysis
    from archscan.measure import guidelines, profile

    monkeypatch.setattr(analysis, "capture", lambda *a, **k: pytest.fail("analysed despite a bad option"))
    monkeypatch.setattr(profile, "_calibrate", lambda *a, **k: pytest.fail("calibrated despite a bad option"))
    monkeypatch.setattr(guidelines, "time_back_to_back", lambda *a, **k: pytest.fail("measured despite a bad option"))
    expect_error(capsys, 2, needles, *args)


def test_no_arguments(capsys):
    expect_error(capsys, 2, ["no model given", "--help"])


def test_device_that_is_not_there(capsys, monkeypatch):
    from archscan import analysis

    monkeypatch.setattr(analysis, "capture", lambda *a, **k: pytest.fail("analysed despite a bad device"))
    expect_error(capsys, 4, ["tpu"], "zoo:resnet18", "--device", "tpu")
    expect_error(capsys, 4, ["tpu"], "zoo:resnet18", "--measure", "--device", "tpu")
    expect_error(capsys, 4, ["tpu"], "guidelines", "--device", "tpu")


def test_version_and_help(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("archscan ")
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "MODEL" in out and "calibrate" in out


# --- input specs and constructor arguments -----------------------------------------------------------

@pytest.mark.parametrize("spec,needle", [
    ("99999999999999999999,3,8,8", "too large"),
    ("4000000000,4000000000,4000000000", "too large"),
    ("1,8:qint8", "qint8"),
    ("1,8:complex", "complex"),
    ("1,8:float8_e4m3fn", "float8_e4m3fn"),
])
def test_bad_input_spec(capsys, net, spec, needle):
    expect_error(capsys, 2, [needle], f"{net}:Net", "--input", spec)


def test_dtype_is_reported_as_run(capsys, net):
    code, out, err = run(capsys, f"{net}:Net", "--input", "2,8", "--dtype", "float64", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["inputs"] == [{"shape": [2, 8], "dtype": "float64"}]
    assert {n["dtype"] for n in data["nodes"]} == {"float64"}


@pytest.mark.parametrize("kwargs,needle", [
    ("width=fuor", "fuor"),
    ("width=[1,2", "[1,2"),
    ("width=4,width=5", "twice"),
])
def test_kwargs_that_are_not_literals(capsys, net, kwargs, needle):
    expect_error(capsys, 2, [needle], f"{net}:Net", "--input", "2,8", "--kwargs", kwargs)


def test_string_kwargs_when_the_constructor_takes_strings(capsys, model_file):
    path = model_file("""\
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self, act: str = "relu"):
                super().__init__()
                self.fc = nn.Linear(8, 8)
                self.act = {"relu": nn.ReLU(), "gelu": nn.GELU()}[act]

            def forward(self, x):
                return self.act(self.fc(x))
        """)
    for kwargs in ("act=gelu", "act='gelu'"):
        code, out, err = run(capsys, f"{path}:Net", "--input", "2,8", "--kwargs", kwargs, "--json")
        assert code == 0, err
        assert "GELU" in {n["op"] for n in json.loads(out)["nodes"]} | {m["type"] for m in json.loads(out)["modules"]}


def test_kwargs_on_a_module_instance(capsys, model_file):
    path = model_file(MODEL + "\n\nnet = Net()\n")
    expect_error(capsys, 2, ["instance", "--kwargs"], f"{path}:net", "--input", "2,8", "--kwargs", "width=3")


def test_dict_input_through_the_library(net):
    import archscan
    from archscan.errors import ArchscanError

    assert archscan.scan(f"{net}:Net", {"x": (2, 8)}).totals.flops == 2 * 8 * 4  # forward's keyword arguments
    with pytest.raises(ArchscanError, match="has no argument 'y'"):
        archscan.scan(f"{net}:Net", {"y": (2, 8)})
    with pytest.raises(ArchscanError) as err:  # a dict where forward takes a tensor: the model's own error
        archscan.scan(f"{net}:Net", [{"x": (2, 8)}])
    assert "not dict" in str(err.value) and len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("inputs,needles", [
    (["y=2,8"], ["has no argument 'y'", "x"]),
    (["x=2,8", "x=2,8"], ["given twice"]),
    (["2,8", "x=2,8"], ["already fills"]),
    (["x=2,8", "2,8"], ["positional --input follows a named one"]),
    (["1x=2,8"], ["not an argument name"]),
])
def test_named_inputs_that_do_not_fit(capsys, net, inputs, needles):
    expect_error(capsys, 2, needles, f"{net}:Net", *[a for i in inputs for a in ("--input", i)])


# --- model files: what Python imports, archscan imports ------------------------------------------------

def test_utf8_with_bom(capsys, model_file):
    path = model_file(b"\xef\xbb\xbf" + MODEL.encode())
    code, _, err = run(capsys, f"{path}:Net", "--input", "2,8")
    assert code == 0, err


def test_latin1_source(capsys, model_file):
    source = "# -*- coding: latin-1 -*-\n# caf\xe9\n" + MODEL
    path = model_file(source.encode("latin-1"))
    code, _, err = run(capsys, f"{path}:Net", "--input", "2,8")
    assert code == 0, err


def test_file_without_py_suffix(capsys, model_file):
    path = model_file(MODEL, name="model")
    code, _, err = run(capsys, f"{path}:Net", "--input", "2,8")
    assert code == 0, err


def test_binary_file(capsys, model_file):
    path = model_file(b"\x7fELF\x02\x01\x01\x00\x00\xff\xfe" * 8, name="model.bin")
    expect_error(capsys, 3, ["model.bin", "not Python source"], f"{path}:Net", "--input", "2,8")


def test_unreadable_file(capsys, net, monkeypatch):
    import builtins

    real_open = builtins.open

    def guarded(file, *a, **k):
        if os.fspath(file) == str(net):
            raise PermissionError(13, "Permission denied", str(net))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded)
    expect_error(capsys, 2, ["cannot read", "Permission denied"], f"{net}:Net", "--input", "2,8")


@pytest.mark.parametrize("target,needle", [(":Net", "before ':'"), ("{net}:", "after ':'"),
                                           ("{net}:net.fc", "no 'net.fc'"), ("{net}:torch", "module")])
def test_malformed_targets(capsys, net, target, needle):
    expect_error(capsys, 2, [needle], target.format(net=net), "--input", "2,8")


def test_not_a_module_says_an(capsys, model_file):
    path = model_file(MODEL + "\nanswer = 42\n")
    _, line = expect_error(capsys, 2, ["is an int"], f"{path}:answer", "--input", "2,8")


# --- model code that exits, parses arguments, prints, or fails -----------------------------------------

def test_sys_exit_at_import(capsys, model_file):
    path = model_file("import sys\nsys.exit(0)\n" + MODEL)
    expect_error(capsys, 3, ["sys.exit(0)", "model.py:2"], f"{path}:Net", "--input", "2,8", "--fail-on", "info")


def test_sys_exit_in_forward(capsys, model_file):
    path = model_file(MODEL.replace("return self.fc(x)", "import sys; sys.exit(0)"))
    expect_error(capsys, 3, ["sys.exit(0)", "model.py:11"], f"{path}:Net", "--input", "2,8")


def test_sys_exit_through_the_library(model_file):
    import archscan
    from archscan.errors import CaptureError

    path = model_file(MODEL.replace("return self.fc(x)", "import sys; sys.exit(0)"))
    with pytest.raises(CaptureError, match=r"sys.exit\(0\) at .*model.py:11"):
        archscan.scan(f"{path}:Net", [(2, 8)])


def test_sys_exit_in_constructor(capsys, model_file):
    path = model_file(MODEL.replace("super().__init__()", "super().__init__(); raise SystemExit(3)"))
    expect_error(capsys, 3, ["sys.exit(3)", "model.py:7"], f"{path}:Net", "--input", "2,8")


def test_argparse_at_import(capsys, model_file):
    path = model_file("import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', required=True)\n"
                      "args = p.parse_args()\n" + MODEL)
    expect_error(capsys, 3, ["command-line arguments", "model.py:4", "--lr", "__main__"],
                 f"{path}:Net", "--input", "2,8")


def test_argparse_at_import_sees_no_archscan_arguments(capsys, model_file):
    path = model_file("import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', default=0.1)\n"
                      "args = p.parse_args()\n" + MODEL)
    code, _, err = run(capsys, f"{path}:Net", "--input", "2,8", "--depth", "1")
    assert code == 0, err


def test_json_stdout_stays_json_when_the_model_prints(capsys, model_file):
    path = model_file("print('importing')\n" + MODEL
                      .replace("super().__init__()", "super().__init__(); print('building')")
                      .replace("return self.fc(x)", "print('forward'); return self.fc(x)"))
    code, out, err = run(capsys, f"{path}:Net", "--input", "2,8", "--json", "--measure", "--device", "cpu")
    assert code == 0, err
    assert json.loads(out)["schema"] == "archscan.report/1"
    assert "importing" in err and "building" in err and "forward" in err


def test_model_code_error_names_the_line(capsys, model_file):
    path = model_file(MODEL.replace("return self.fc(x)", "return self.fc(x) / {}['missing']"))
    _, line = expect_error(capsys, 3, ["model.py:11", "KeyError", "Net.forward"], f"{path}:Net", "--input", "2,8")
    assert "layer ''" not in line


@pytest.mark.parametrize("source,args,builds", [
    (MODEL, [], "x"),                                         # fx on fake tensors: built once
    (MODEL, ["--measure", "--device", "cpu"], "xx"),          # + the real model that is timed
    (DATA_BRANCH, ["--measure", "--device", "cpu"], "xx"),    # eager: the real run's model is the one timed
])
def test_constructor_runs_as_few_times_as_it_can(capsys, model_file, tmp_path, source, args, builds):
    counter = tmp_path / "count"
    path = model_file(source.replace("super().__init__()", f"super().__init__(); open({str(counter)!r}, 'a').write('x')"))
    code, _, err = run(capsys, f"{path}:Net", "--input", "2,8", *args)
    assert code == 0, err
    assert counter.read_text() == builds


def test_root_module_is_named_as_the_model(capsys, model_file):
    path = model_file(MODEL.replace("return self.fc(x)", "return self.fc(x) @ x"))
    _, line = expect_error(capsys, 2, ["Net"], f"{path}:Net", "--input", "2,8")
    assert "layer ''" not in line


# --- captures: forced captures do not quietly change; host syncs are seen -------------------------------

def test_forced_capture_does_not_fall_back(capsys, model_file):
    path = model_file(DATA_BRANCH)
    for method in ("fx", "export"):
        expect_error(capsys, 3, [method, "--capture auto"], f"{path}:Net", "--input", "2,8", "--capture", method)


@pytest.mark.parametrize("expr", ["x.tolist()", "len(x.tolist())", "x.item() if x.numel() == 1 else x.sum().item()"])
def test_tolist_and_item_are_host_syncs(capsys, model_file, expr):
    path = model_file(MODEL.replace("return self.fc(x)", f"_ = {expr}\n        return self.fc(x)"))
    code, out, err = run(capsys, f"{path}:Net", "--input", "2,8", "--json")
    assert code == 0, err
    syncs = [f for f in json.loads(out)["findings"] if f["rule"] == "host-sync"]
    assert syncs and "model.py:11" in syncs[0]["source"], syncs


def test_eager_fallback_checks_memory_first(capsys, model_file):
    path = model_file(DATA_BRANCH)
    expect_error(capsys, 4, ["eager capture", "GiB"], f"{path}:Net", "--input", "2000000000,8")


def test_lazy_modules(capsys, model_file):
    path = model_file(MODEL.replace("nn.Linear(8, width)", "nn.LazyLinear(width)"))
    code, out, err = run(capsys, f"{path}:Net", "--input", "2,8", "--json")
    assert code == 0, err
    # 2*8*4 multiply-adds; weight 8*4 + bias 4
    assert json.loads(out)["totals"]["flops"] == 64 and json.loads(out)["totals"]["params"] == 36


# --- interrupts and archscan's own failures ---------------------------------------------------------------

def test_interrupt(capsys, net, monkeypatch):
    from archscan import analysis

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(analysis, "capture", interrupted)
    code, _, err = run(capsys, f"{net}:Net", "--input", "2,8")
    assert code == 130 and err.strip() == "archscan: interrupted"


def test_internal_error_is_one_line_and_debug_shows_the_traceback(capsys, net, monkeypatch):
    from archscan import analysis

    monkeypatch.setattr(analysis, "build_report", len)  # a failure with no frame in model code: len() takes 1 argument
    expect_error(capsys, 5, ["internal error", "TypeError", "--debug"], f"{net}:Net", "--input", "2,8")
    code, _, err = run(capsys, f"{net}:Net", "--input", "2,8", "--debug")
    assert code == 5 and "Traceback" in err and "len()" in err


# --- the device profile cache and calibrate ----------------------------------------------------------------

def _profile_path():
    import torch

    from archscan.measure.profile import device_name, profile_key, profile_path

    dev = torch.device("cpu")
    return profile_path(profile_key("cpu", device_name(dev), torch.get_num_threads()))


@pytest.mark.parametrize("content", ['{"device": "cpu", "peak', "[]", "{}", '{"bandwidth": "fast"}', None])
def test_damaged_profile_skips_predictions(capsys, net, content):
    path = _profile_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if content is None:
        path.mkdir()  # unreadable: a directory where the file should be
    else:
        path.write_text(content)
    code, out, err = run(capsys, f"{net}:Net", "--input", "2,8", "--json")
    assert code == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("archscan: warning:") and str(path) in lines[0]
    assert "archscan calibrate" in lines[0]
    data = json.loads(out)
    assert data["totals"]["flops"] == 2 * 8 * 4 and "latency" not in data and data["warnings"]
    if content is not None:
        assert path.read_text() == content  # nothing on disk changed


def test_calibrate_checks_the_cache_directory_first(capsys, monkeypatch, tmp_path):
    from archscan.measure import profile

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ARCHSCAN_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(profile, "_calibrate", lambda *a, **k: pytest.fail("measured into an unwritable directory"))
    expect_error(capsys, 2, ["cannot save", "ARCHSCAN_CACHE_DIR"], "calibrate", "--device", "cpu", "--quick")


def test_calibrate_prints_the_profile_when_saving_fails(capsys, monkeypatch):
    from archscan import cli
    from archscan.measure import profile

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(profile, "save_profile", full_disk)
    monkeypatch.setattr("archscan.measure.save_profile", full_disk)
    code, out, err = run(capsys, "calibrate", "--device", "cpu", "--quick", "--force")
    assert code == 2 and "No space left" in one_error_line(err)
    assert "matmul float32" in out and "not saved" in out


def test_calibrate_labels_do_not_run_into_values(capsys):
    code, out, _ = run(capsys, "calibrate", "--device", "cpu", "--quick", "--force")
    assert code == 0
    for line in out.splitlines():
        label, _, value = line.partition("  ")
        assert value.strip(), line


# --- the installed console script ---------------------------------------------------------------------

def _script() -> str:
    path = os.path.join(sysconfig.get_path("scripts"), "archscan")
    if not os.path.exists(path):
        pytest.skip("archscan is not installed as a console script in this environment")
    return path


@pytest.mark.parametrize("args,code_wanted", [
    (["zoo:resnet18", "--inptu", "1,3,8,8"], 2),
    ([], 2),
    (["zoo:resnet18", "--depth", "abc"], 2),
    (["zoo:resnet5O"], 2),
])
def test_console_script(args, code_wanted):
    proc = subprocess.run([_script(), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == code_wanted, proc.stderr
    line = one_error_line(proc.stderr)
    assert proc.stdout == "", proc.stdout


def test_console_script_sys_exit_in_model(model_file):
    path = model_file("import sys\nsys.exit(0)\n" + MODEL)
    proc = subprocess.run([_script(), f"{path}:Net", "--input", "2,8"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and "sys.exit(0)" in one_error_line(proc.stderr)


def test_usage_errors_do_not_import_torch():
    code = ("import sys; from archscan.cli import main; rc = main(['zoo:resnet18', '--inptu', '1']); "
            "print(rc, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2", "False"], proc.stderr
