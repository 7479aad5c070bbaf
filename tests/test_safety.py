"""Safe to open, safe to write, safe to call: untrusted ``.pt2`` files run no code, outputs are
written whole or not at all, interrupts leave nothing behind, library calls from threads get the
answers they get alone, and the caller's torch state is given back.

Exit codes (README): 2 bad input or a file that cannot be written, 130 SIGINT, 143 SIGTERM, 129 SIGHUP.
"""

from __future__ import annotations

import errno
import io
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import zipfile

import pytest
import torch

import archscan
from archscan import files
from archscan.errors import ArchscanError
from test_bad_input import one_error_line, run

ENV = {**os.environ, "COLUMNS": "100", "PYTHONUNBUFFERED": "1"}


def _as_a_terminal_starts_it():
    """A child's signals as a shell in a terminal leaves them: a test run in the background (``cmd &``
    ignores SIGINT), under nohup (SIGHUP) or in a pytest-xdist worker would hand its child ignored ones."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


@pytest.fixture
def interruptible():
    """This process takes Ctrl-C as Python's default does, whatever it inherited (see above)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def no_partials(folder) -> None:
    left = [f for f in os.listdir(folder) if f.startswith(files.PARTIAL_PREFIX)]
    assert not left, left


# --- untrusted .pt2 files ---------------------------------------------------------------------------

def _touched(path: str, value):
    open(path, "w").close()
    return value


class _Marker:
    """A pickle that runs code when unpickled (it creates ``path``, standing for whatever a
    malicious archive would run) and then gives ``value``, so that the archive still loads."""

    def __init__(self, path, value=None):
        self.path, self.value = str(path), value

    def __reduce__(self):
        return (_touched, (self.path, self.value))


class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


def _rewrite(src, dst, change) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, change(info.filename, zin.read(info.filename)))


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@pytest.fixture
def archives(tmp_path):
    """A good program and three ways to hide code in one: its sample inputs, a weight marked
    ``use_pickle``, and an opaque object member; ``marker`` is the file their code would create."""
    good = tmp_path / "good.pt2"
    torch.export.save(torch.export.export(_Small(), (torch.randn(2, 4),)), str(good))
    marker = tmp_path / "PWNED"
    evil = _saved(_Marker(marker))
    evil_inputs = _saved(_Marker(marker, ((torch.randn(2, 4),), {})))
    evil_bias = _saved(_Marker(marker, torch.nn.Parameter(torch.zeros(4))))

    bias_member = json.loads(_member(good, "model_weights_config.json"))["config"]["fc.bias"]["path_name"]

    def weight(name, data):
        if name.endswith("model_weights_config.json"):
            config = json.loads(data)
            config["config"]["fc.bias"]["use_pickle"] = True
            return json.dumps(config).encode()
        return evil_bias if name.endswith(f"weights/{bias_member}") else data

    def opaque(name, data):
        if name.endswith("model_constants_config.json"):
            return json.dumps({"config": {"obj": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                                                  "tensor_meta": None}}}).encode()
        return data

    made = {"inputs": tmp_path / "inputs.pt2", "weight": tmp_path / "weight.pt2", "opaque": tmp_path / "opaque.pt2"}
    _rewrite(good, made["inputs"], lambda n, d: evil_inputs if n.endswith("sample_inputs/model.pt") else d)
    _rewrite(good, made["weight"], weight)
    _rewrite(good, made["opaque"], opaque)
    with zipfile.ZipFile(made["opaque"], "a") as z:
        z.writestr("opaque/data/constants/opaque_obj_0", evil)
    return good, made, marker


def _member(path, suffix) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith(suffix)))


@pytest.mark.parametrize("kind", ["inputs", "weight", "opaque"])
@pytest.mark.parametrize("command", [[], ["fuse"], ["prune", "--list"]])
def test_malicious_program_is_refused_and_runs_nothing(capsys, archives, tmp_path, monkeypatch, kind, command):
    good, made, marker = archives
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *command, made[kind], "--input", "2,4")
    line = one_error_line(err)
    assert code == 2, line
    assert "refused" in line and "--allow-pickle" in line, line
    assert not marker.exists()


def test_malicious_program_in_compare_and_the_library(capsys, archives):
    good, made, marker = archives
    code, out, err = run(capsys, "compare", good, made["inputs"], "--input", "2,4", "--json")
    rows = json.loads(out)["rows"]
    assert "refused" in rows[1]["error"] and "error" not in rows[0]
    with pytest.raises(ArchscanError, match="refused"):
        archscan.scan(str(made["weight"]), [(2, 4)])
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["inputs", "weight"])
def test_the_archives_really_run_code_when_allowed(capsys, archives, kind):
    """The opt-in does what it says (and proves the archives above are the real thing)."""
    good, made, marker = archives
    code, out, err = run(capsys, made[kind], "--input", "2,4", "--allow-pickle", "--json")
    assert code == 0, err
    assert marker.exists()
    assert json.loads(out)["totals"]["flops"] == 2 * 4 * 4  # 32 multiply-adds


def test_a_good_program_loads_without_the_opt_in(capsys, archives):
    good, made, marker = archives
    code, out, err = run(capsys, good, "--json")
    assert code == 0, err
    assert json.loads(out)["inputs"] == [{"shape": [2, 4], "dtype": "float32"}]  # its own sample inputs


def test_sample_inputs_that_are_not_args_and_kwargs(capsys, archives, tmp_path):
    good, made, marker = archives
    odd = tmp_path / "odd.pt2"
    _rewrite(good, odd, lambda n, d: _saved((torch.randn(2, 4), 3)) if n.endswith("sample_inputs/model.pt") else d)
    code, out, err = run(capsys, odd)
    assert code == 2 and "no --input given" in one_error_line(err)
    code, out, err = run(capsys, odd, "--input", "2,4", "--json")
    assert code == 0, err
    assert json.loads(out)["totals"]["flops"] == 32


# --- outputs written whole or not at all -----------------------------------------------------------

def _limited(limit_bytes: int):
    """A child process whose files cannot grow past ``limit_bytes`` (``ulimit -f``): a disk that fills."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return limit


@pytest.mark.parametrize("args,output", [
    (["zoo:shufflenet_v2_x0_5", "--input", "1,3,32,32", "--markdown", "{out}"], "out.md"),
    (["zoo:shufflenet_v2_x0_5", "--input", "1,3,32,32", "--report", "{out}"], "out.html"),
    (["zoo:resnet18", "--input", "2,3,32,32", "--train", "--memory-snapshot", "{out}"], "out.pickle"),
    (["fuse", "zoo:resnet18", "--input", "1,3,32,32", "-o", "{out}"], "out.pt2"),
], ids=["markdown", "report", "snapshot", "fuse"])
def test_a_write_that_fails_keeps_the_old_file(tmp_path, args, output):
    """With the file size capped at 4 KiB every one of these outputs fails halfway: one line,
    exit 2, the earlier file whole, no temporary file left."""
    out = tmp_path / output
    out.write_bytes(b"an earlier, complete report")
    done = subprocess.run([sys.executable, "-m", "archscan", *[a.format(out=out) for a in args]], cwd=tmp_path,
                          capture_output=True, text=True, env=ENV, preexec_fn=_limited(4096), timeout=300)
    line = one_error_line(done.stderr)
    assert done.returncode == 2, line
    assert "cannot write" in line and str(out) in line and "File too large" in line, line
    assert out.read_bytes() == b"an earlier, complete report"
    no_partials(tmp_path)


def test_write_file_permissions_and_errors(tmp_path, monkeypatch):
    old = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.txt"
        files.write_file(fresh, "x")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644  # as open() gives it under umask 022
        kept = tmp_path / "kept.txt"
        kept.write_text("old")
        kept.chmod(0o600)
        files.write_file(kept, b"new")
        assert kept.read_text() == "new" and stat.S_IMODE(kept.stat().st_mode) == 0o600
    finally:
        os.umask(old)
    link = tmp_path / "link.txt"
    link.symlink_to(kept)
    files.write_file(link, "through the link")
    assert link.is_symlink() and kept.read_text() == "through the link"
    with pytest.raises(ArchscanError, match="no directory"):
        files.write_file(tmp_path / "missing" / "x.txt", "x")
    with pytest.raises(ArchscanError, match="is a directory"):
        files.write_file(tmp_path, "x")
    with pytest.raises(ArchscanError, match="no file name"):
        files.write_file("", "x")

    def read_only(*a, **k):  # a read-only directory (the suite may run as root, whom chmod does not stop)
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    with pytest.raises(ArchscanError, match="Permission denied") as caught:
        files.write_file(tmp_path / "new.pt2", b"x", "-o")
    assert caught.value.exit_code == 2 and "-o" in str(caught.value)
    no_partials(tmp_path)


def test_fuse_into_a_directory_that_cannot_be_written(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(files.tempfile, "mkstemp", lambda *a, **k: (_ for _ in ()).throw(
        PermissionError(errno.EACCES, "Permission denied")))
    target = tmp_path / "fused.pt2"
    code, out, err = run(capsys, "fuse", "zoo:resnet18", "--input", "1,3,32,32", "-o", target)
    line = one_error_line(err)
    assert code == 2 and str(target) in line and "Permission denied" in line, line
    assert not target.exists()


def test_an_interrupt_swallowed_while_writing_still_stops_the_rename(tmp_path, interruptible):
    """A SIGINT raised where Python only prints it (a finaliser) must not let the file land."""
    target = tmp_path / "out.md"
    target.write_text("old")

    def write(fh):
        fh.write(b"half of the new")
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
        except KeyboardInterrupt:
            pass  # swallowed, as a finaliser would

    with pytest.raises(KeyboardInterrupt):
        files.write_file(target, write)
    assert target.read_text() == "old"
    no_partials(tmp_path)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


SLOW_WRITE = textwrap.dedent("""\
    import sys, time
    from archscan import cli, files
    cli._terminate_on_signals()      # as the archscan command does
    def slow(fh):
        fh.write(b"the first half")
        print("writing", flush=True)
        time.sleep(60)
    files.write_file(sys.argv[1], slow)
    """)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 128 + 15), (signal.SIGINT, None), (signal.SIGHUP, 128 + 1)])
def test_a_signal_during_a_write_leaves_nothing(tmp_path, sig, code):
    target = tmp_path / "out.pt2"
    target.write_bytes(b"old")
    script = tmp_path / "slow.py"
    script.write_text(SLOW_WRITE)
    child = subprocess.Popen([sys.executable, str(script), str(target)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV, preexec_fn=_as_a_terminal_starts_it)
    assert child.stdout.readline().strip() == "writing"
    child.send_signal(sig)
    _, err = child.communicate(timeout=60)
    assert child.returncode != 0
    if code is None:
        assert "KeyboardInterrupt" in err
    else:
        assert "Terminated" in err
    assert target.read_bytes() == b"old"
    no_partials(tmp_path)


SLEEPER = textwrap.dedent("""\
    import os, time
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            open(os.path.join(os.path.dirname(__file__), "running"), "w").close()
            time.sleep(60)
            return self.fc(x)
    """)


@pytest.mark.parametrize("sig,code,name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP"),
                                           (signal.SIGINT, 130, None)])
def test_the_command_ends_on_a_signal_with_one_line(tmp_path, sig, code, name):
    model = tmp_path / "sleeper.py"
    model.write_text(SLEEPER)
    child = subprocess.Popen([sys.executable, "-m", "archscan", f"{model}:Net", "--input", "2,4"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path,
                             preexec_fn=_as_a_terminal_starts_it)
    deadline = time.monotonic() + 120
    while not (tmp_path / "running").exists():  # the model's forward is running (its output is captured)
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.05)
    child.send_signal(sig)
    _, err = child.communicate(timeout=60)
    assert child.returncode == code, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines == [f"archscan: terminated ({name})" if name else "archscan: interrupted"], err


# --- the library from threads -----------------------------------------------------------------------

THREADED = [("zoo:mobilenet_v2", (1, 3, 64, 64)), ("zoo:resnet18", (1, 3, 64, 64)),
            ("zoo:shufflenet_v2_x1_0", (1, 3, 64, 64)), ("zoo:llama_tiny", "1,32:int64")]


def _scan_json(target, shape) -> dict:
    return archscan.scan(target, [shape], recommend=False).to_json()


def test_four_threads_get_the_sequential_answers():
    sequential = {target: _scan_json(target, shape) for target, shape in THREADED}
    got, errors = {}, []

    def work(target, shape):
        try:
            got[target] = _scan_json(target, shape)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=item) for item in THREADED]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert got == sequential
    assert all(report["totals"]["flops"] > 0 for report in got.values())


# --- the caller's torch state ---------------------------------------------------------------------

LEAKY = textwrap.dedent("""\
    import warnings

    import torch
    import torch.nn as nn

    warnings.simplefilter("error")
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_float32_matmul_precision("medium")
    torch.set_default_dtype(torch.float64)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.set_num_threads(1)
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x)
    """)


def _state() -> dict:
    return {"grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled(),
            "deterministic": (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled()),
            "benchmark": torch.backends.cudnn.benchmark, "tf32": torch.backends.cuda.matmul.allow_tf32,
            "precision": torch.get_float32_matmul_precision(), "dtype": torch.get_default_dtype(),
            "device": torch.get_default_device(), "threads": torch.get_num_threads(),
            "sys.path": list(sys.path), "warning filters": list(warnings.filters)}


def test_a_model_file_leaks_no_global_state(tmp_path):
    model = tmp_path / "leaky.py"
    model.write_text(LEAKY)
    archscan.scan("zoo:resnet18", [(1, 3, 32, 32)], recommend=False)  # torch's lazy modules add filters of their own
    before = _state()
    report = archscan.scan(f"{model}:Net", [(2, 8)], recommend=False)
    assert _state() == before
    assert report.totals.flops == 2 * 8 * 8  # 128 multiply-adds


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_a_training_step_inside_the_callers_no_grad(mode):
    with mode():
        report = archscan.scan("zoo:resnet18", [(2, 3, 32, 32)], train=True, recommend=False)
        assert not torch.is_grad_enabled()
    assert report.training_step["phases"]["backward"]["flops"] > 0


def test_the_callers_default_device_is_not_the_scans():
    expected = archscan.scan("zoo:resnet18", [(1, 3, 32, 32)], recommend=False).totals.flops
    torch.set_default_device("meta")
    try:
        assert archscan.scan("zoo:resnet18", [(1, 3, 32, 32)], recommend=False).totals.flops == expected
        assert torch.get_default_device().type == "meta"
    finally:
        torch.set_default_device(None)


# --- small things of the command line ----------------------------------------------------------------

@pytest.mark.parametrize("args", [["--optimizer", ""], ["--amp", ""], ["--rules", ""], ["--skip-rules", ""],
                                  ["--kwargs", ""], ["--memory-snapshot", ""], ["--optimizer="], ["--dtype", " "]])
def test_an_empty_option_is_refused(capsys, args):
    code, out, err = run(capsys, "zoo:resnet18", "--input", "2,3,32,32", "--train", *args)
    line = one_error_line(err)
    assert code == 2 and f"{args[0].rstrip('=')} is empty" in line, line


def test_parameters_over_the_budget_are_refused_before_the_step(capsys, monkeypatch):
    import archscan.api

    def never(*a, **k):
        raise AssertionError("the training step ran before the budget check")

    monkeypatch.setattr(archscan.api, "train_step", never)
    code, out, err = run(capsys, "zoo:resnet18", "--input", "2,3,32,32", "--train", "--memory", "1MiB")
    line = one_error_line(err)
    assert code == 2 and "the parameters alone need 44.6 MiB" in line, line


def test_python_dash_m_and_shell_completion(tmp_path):
    done = subprocess.run([sys.executable, "-m", "archscan", "--version"], capture_output=True, text=True, env=ENV)
    assert done.returncode == 0 and done.stdout.startswith("archscan "), done.stderr
    complete = {**ENV, "_ARCHSCAN_COMPLETE": "complete_bash", "COMP_WORDS": "archscan fu", "COMP_CWORD": "1"}
    done = subprocess.run([sys.executable, "-m", "archscan"], capture_output=True, text=True, env=complete)
    assert done.returncode == 0 and done.stdout.split() == ["fuse"], (done.stdout, done.stderr)
    # typer asks shellingham for the shell when it is installed (and fails where no shell is among the
    # process's parents, as in a pytest-xdist worker); this variable makes it take the shell given
    done = subprocess.run([sys.executable, "-m", "archscan", "--show-completion", "bash"], capture_output=True,
                          text=True, env={**ENV, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert done.returncode == 0 and "_ARCHSCAN_COMPLETE=complete_bash" in done.stdout, done.stderr


def test_a_directory_named_like_a_program(capsys, tmp_path):
    folder = tmp_path / "model.pt2"
    folder.mkdir()
    code, out, err = run(capsys, folder)
    assert code == 2 and "is a directory, not a file" in one_error_line(err)
