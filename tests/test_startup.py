"""A command imports only what it needs: ``archscan.capture.nocompile`` keeps ``torch._dynamo`` out of an
analysis (same totals), ``archscan zoo``, ``--help`` and usage errors do not import torch, and
the zoo's torch-free catalogue agrees with its registry. Timings are in benchmarks/bench_startup.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from archscan.capture import nocompile
from archscan.load.specs import check_arguments, dtype_key, split_input_spec
from archscan.errors import ArchscanError
from archscan.zoo._catalog import catalog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIG = {"llama3_70b", "llama2_7b", "vit_h_14", "vit_l_16"}  # seconds each; the 70B has its own test


def _finished(run: subprocess.Popen, timeout: int = 600):
    out, err = run.communicate(timeout=timeout)
    assert run.returncode == 0, err[-3000:]
    return json.loads(out)


def _python(code: str, timeout: int = 600) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_torch_is_as_nocompile_expects():
    """Fails when a torch release changes what the stand-in relies on: update archscan.capture.nocompile
    (until then the console falls back to loading dynamo, with the same results, only slower)."""
    assert nocompile.expected() == []


_TOTALS = """
import json, sys
from archscan.capture import nocompile
standin = {standin}
if standin:
    assert nocompile.install()
import archscan
from archscan import zoo
out = {{}}
for name in zoo.list_models():
    if name in {big}:
        continue
    report = archscan.scan("zoo:" + name, list(zoo.get_entry(name).default_input), recommend=False, profile=False)
    out[name] = [report.capture, report.totals.params, report.totals.flops, report.totals.mac_bytes,
                 report.totals.elem_ops, len(report.nodes), sorted((f.rule, f.module) for f in report.findings)]
if standin:
    assert nocompile.installed(), "torch._dynamo was loaded during the analysis"
    assert "torch._dynamo.eval_frame" not in sys.modules
print(json.dumps(out))
"""


def test_totals_identical_without_dynamo():
    """Every zoo model (but the largest) gives the same capture, totals, node count and findings
    with the stand-in as with torch's own path, and dynamo never loads."""
    # the two processes side by side: each runs on one core
    runs = [subprocess.Popen([sys.executable, "-c", _TOTALS.format(standin=standin, big=sorted(BIG))], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for standin in (True, False)]
    (fast, plain) = [_finished(run) for run in runs]
    assert len(fast) >= 30
    assert fast == plain


def test_standin_gives_way_to_real_dynamo():
    """After install, anything that uses dynamo gets the real package: the same config module,
    disable() wrappers that defer to it, and torch.compile works."""
    _python("""
import sys, torch
from archscan.capture import nocompile
assert nocompile.install()
config = sys.modules["torch._dynamo.config"]
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode():
    x = torch.randn(2, 3).reshape(3, 2)
assert nocompile.installed()
assert torch._dynamo.reset is not None  # anything else loads the real package
assert not nocompile.installed() and nocompile._FINDER not in sys.meta_path
assert torch._dynamo.config is config and sys.modules["torch._dynamo.config"] is config
f = torch.compile(lambda a: a * 2 + 1, backend="eager")
assert torch.equal(f(torch.ones(3)), torch.full((3,), 3.0))
with FakeTensorMode():  # the deferred disable() wrappers now use dynamo's own
    torch.randn(2, 3).reshape(3, 2)
""")


def test_submodule_import_loads_the_package_first():
    """``from torch._dynamo.source import ...`` (torch's fake-tensor code does this when it fakes a
    real tensor, e.g. in torch.export) runs the package's __init__ first, as Python does, so
    dynamo's circular imports resolve in their own order; each submodule is loaded once."""
    _python("""
import sys, torch
from archscan.capture import nocompile
assert nocompile.install()
from torch._dynamo.source import ConstantSource
assert not nocompile.installed()
source = sys.modules["torch._dynamo.source"]
assert torch._dynamo.source is source and source.ConstantSource is ConstantSource
assert source.__spec__.name == "torch._dynamo.source" and source.__spec__.origin.endswith("source.py")
import torch._dynamo.source as again
assert again is source
m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval()
ep = torch.export.export(m, (torch.randn(1, 3, 8, 8),))
assert torch.allclose(ep.module()(torch.ones(1, 3, 8, 8)), m(torch.ones(1, 3, 8, 8)))
""")
    _python("""
import torch
from archscan.capture import nocompile
assert nocompile.install()
m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval()
torch.export.export(m, (torch.randn(1, 3, 8, 8),))  # what verifying a fusion does
assert not nocompile.installed()
""")


def test_install_leaves_a_loaded_dynamo_alone():
    _python("""
import sys, torch, torch._dynamo
from archscan.capture import nocompile
real = sys.modules["torch._dynamo"]
assert not nocompile.install() and sys.modules["torch._dynamo"] is real
""")


@pytest.mark.parametrize("args", [["--help"], ["zoo"], ["zoo", "--json"], ["scan", "--help"], ["zoo:resnet5"],
                                  ["missing.py:Net"], ["Net"], ["zoo:resnet50", "--input", "1,a"],
                                  ["zoo:resnet50", "--dtype", "f?"], ["zoo:resnet50", "--bogus"],
                                  ["zoo:resnet50", "--capture", "jit"], ["prune", "nope.py:Net"]])
def test_light_commands_do_not_import_torch(args):
    out = _python(f"""
import sys
sys.argv = ["archscan"] + {args!r}
from archscan.cli import main
try:
    code = main()
except SystemExit as exc:
    code = exc.code
print(code, "torch" in sys.modules, "networkx" in sys.modules)
""")
    code, torch_loaded, nx_loaded = out.split()[-3:]
    assert torch_loaded == "False" and nx_loaded == "False", args


def test_a_scan_command_imports_only_what_it_uses():
    """The console's main job loads no compiler stack, no plotting, no transforms, no numpy.ma, no
    networkx for a model of module units (its import is a tenth of a second; fork/join regions use
    it) and, with the typer versions pyproject allows, no pydantic (typer 0.29 converts options
    through it)."""
    out = _python("""
import io, json, sys, contextlib
sys.argv = ["archscan", "zoo:mobilenet_v2", "--input", "1,3,64,64", "--json"]
from archscan import cli
cli._CONSOLE = True
with contextlib.redirect_stdout(io.StringIO()) as text:
    code = cli.main()
import typer
assert code == 0 and json.loads(text.getvalue())["recommendations"]
print(json.dumps({"typer": typer.__version__, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in
      ("pydantic", "matplotlib", "sympy", "networkx") or m in ("numpy.ma", "archscan.transform", "torch._dynamo.eval_frame"))}))
""")
    result = json.loads(out.splitlines()[-1])
    typer_version = tuple(int(p) for p in result["typer"].split(".")[:2])
    expected = {"pydantic"} if typer_version >= (0, 29) else set()
    assert {m.split(".")[0] if m.startswith("pydantic") else m for m in result["loaded"]} == expected, result


def test_catalogue_matches_registry():
    from archscan import zoo

    listed = catalog()
    assert sorted(listed) == zoo.list_models()
    for name, entry in listed.items():
        registered = zoo.get_entry(name)
        assert (entry.family, entry.default_input, entry.summary) == \
               (registered.family, registered.default_input, registered.summary), name


def test_spec_syntax():
    assert split_input_spec("1,3,224,224") == ((1, 3, 224, 224), "float32", None)
    assert split_input_spec(" ids = 1,128 : i64") == ((1, 128), "int64", "ids")
    assert dtype_key("torch.bf16") == "bfloat16"
    for bad in ("", "1,,0", "a=b=1", "1 2:int64", "9" * 20 + ",9" * 3):
        with pytest.raises(ArchscanError):
            split_input_spec(bad)
    with pytest.raises(ArchscanError, match="not supported"):
        dtype_key("complex64", lambda key: isinstance(getattr(torch, key, None), torch.dtype))
    with pytest.raises(ArchscanError, match="no zoo model"):
        check_arguments("zoo:nope", [], None)


def test_spec_dtypes_are_torch_dtypes():
    """Every name the torch-free parser accepts is a torch dtype of that item size."""
    from archscan.load.specs import ALIASES, INPUT_DTYPES, ITEMSIZE

    for name in INPUT_DTYPES:
        assert getattr(torch, name).itemsize == ITEMSIZE[name]
    for alias, name in ALIASES.items():
        assert getattr(torch, alias, getattr(torch, name)) == getattr(torch, name), alias
