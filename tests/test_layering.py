"""The house stays one-way: archscan's imports, read with ``ast``, against a declared list of layers.

Each module may import modules of its own layer or of layers below it, never above, and no
import circle exists (imports inside functions count: a late import is still a dependency).
docs/development.md explains the layers; a new module must be placed here before it can land.
"""

from __future__ import annotations

import ast
import fnmatch
import os

import networkx as nx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"archscan": os.path.join(ROOT, "archscan"), "archscan.zoo": os.path.join(ROOT, "zoo")}

# Lowest first. A pattern ending in ``*`` takes a package and everything under it.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["archscan", "archscan.errors", "archscan.results", "archscan.units", "archscan.files",
              "archscan.isolation", "archscan.devices*", "archscan.zoo*"]),
    ("cost", ["archscan.costs*"]),
    ("load", ["archscan.load*"]),
    ("capture", ["archscan.capture*"]),
    ("memory", ["archscan.memory*"]),  # the tracker rides the capture, handed in by the analysis
    ("graph", ["archscan.graph*"]),
    ("rules", ["archscan.rules*"]),
    ("analysis", ["archscan.analysis*"]),  # the analysis core ends here: nothing below imports what is above
    ("measure", ["archscan.measure*"]),
    ("llm", ["archscan.llm*"]),  # a decode step with a KV cache, predicted on a profile
    ("parallel", ["archscan.parallel*"]),  # a training step over a mesh of ranks: FSDP2, TP, DDP, on fake tensors
    ("transform", ["archscan.transform*"]),
    ("prune", ["archscan.prune*"]),
    ("distill", ["archscan.distill*"]),
    ("quant", ["archscan.quant*"]),  # a model quantized with torchao: bytes as stored, costs as its kernels run
    ("recommend", ["archscan.recommend*"]),
    ("compare", ["archscan.compare*"]),  # rows of several models; its caller hands it the analysis to run
    ("orchestrator", ["archscan.api"]),
    ("report", ["archscan.report*"]),
    ("cli", ["archscan.cli", "archscan.__main__"]),
]


def modules() -> dict[str, str]:
    """Dotted module name -> file, for every module of the package (the zoo ships as archscan.zoo)."""
    out = {}
    for package, folder in PACKAGES.items():
        for dirpath, _, files in os.walk(folder):
            for f in files:
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), folder)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                name = ".".join([package, *rel])
                if name.startswith("archscan.zoo") and package == "archscan":
                    continue
                out[name] = os.path.join(dirpath, f)
    return out


def imports(name: str, path: str, known: set[str]) -> list[tuple[str, int]]:
    """(imported archscan module, line) for every import in the file, at any depth."""
    is_package = os.path.basename(path) == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            names = [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for full in names:
            while full not in known and "." in full:
                full = full.rpartition(".")[0]  # `from .x import name`: the module x
            if full in known and full != name:
                found.append((full, node.lineno))
    return found


def layer_of(name: str) -> int:
    for i, (_, patterns) in enumerate(LAYERS):
        for p in patterns:
            if name == p or (p.endswith("*") and (name == p[:-1] or fnmatch.fnmatch(name, p[:-1] + ".*"))):
                return i
    raise LookupError(name)


def import_graph() -> nx.DiGraph:
    mods = modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(mods)
    for name, path in mods.items():
        for target, line in imports(name, path, set(mods)):
            graph.add_edge(name, target, line=line)
    return graph


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if not _placed(m)]
    assert not unplaced, f"place these modules in a layer of tests/test_layering.py: {unplaced}"


def _placed(name: str) -> bool:
    try:
        layer_of(name)
    except LookupError:
        return False
    return True


def test_imports_only_go_down():
    graph = import_graph()
    upward = [f"{a} (layer {LAYERS[layer_of(a)][0]}) imports {b} (layer {LAYERS[layer_of(b)][0]}) at line {d['line']}"
              for a, b, d in graph.edges(data=True) if _placed(a) and _placed(b) and layer_of(b) > layer_of(a)]
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_no_import_circle():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c + c[:1]) for c in cycles)


def test_the_core_imports_nothing_above_it():
    """The analysis core (up to archscan.analysis) reaches none of measure, transform, prune,
    distill, recommend, the orchestrator, compare, report or cli, even through another module."""
    graph = import_graph()
    core_top = [name for name, _ in LAYERS].index("analysis")
    for name in graph:
        if layer_of(name) <= core_top:
            above = sorted(m for m in nx.descendants(graph, name) if layer_of(m) > core_top)
            assert not above, f"{name} reaches {above}"


def test_only_the_orchestrator_and_the_cli_reach_scan_and_recommend():
    """prune, distill, fuse and compare call the core's ``analyse``, never ``archscan.scan``; only the
    orchestrator (``archscan.api``) and the CLI import the recommenders."""
    graph = import_graph()
    assert set(graph.predecessors("archscan.api")) <= {"archscan.cli"}
    importers = {m for m in graph.predecessors("archscan.recommend") if not m.startswith("archscan.recommend.")}
    assert importers <= {"archscan.api", "archscan.cli"}


@pytest.mark.parametrize("name, source, target", [
    ("archscan.prune.groups", "from ..api import scan\n", "archscan.api"),
    ("archscan.capture", "from ..measure.run import available_bytes\n", "archscan.measure.run"),
    ("archscan.transform.fuse", "def f():\n    from ..prune import analyse\n", "archscan.prune"),
    ("archscan.distill.students", "import torch\nfrom torch import nn\n", None),
    ("archscan.load.targets", "import archscan.measure.run as run\n", "archscan.measure.run"),
    ("archscan.prune", "from .. import recommend\n", "archscan.recommend"),
])
def test_the_reader_sees_imports(tmp_path, name, source, target):
    """The check itself: an import at the top or inside a function, relative or absolute, is seen."""
    package = os.path.basename(modules()[name]) == "__init__.py"
    path = tmp_path / ("__init__.py" if package else "module.py")
    path.write_text(source)
    found = [t for t, _ in imports(name, str(path), set(modules()))]
    assert found == ([target] if target else [])


def test_the_top_holds_entry_points_and_what_every_stage_shares():
    """At most nine modules at the top of archscan/; every stage is a package whose ``__init__``
    says what it takes and gives (a docstring)."""
    folder = PACKAGES["archscan"]
    top = sorted(f for f in os.listdir(folder) if f.endswith(".py"))
    assert len(top) <= 9, top
    packages = [d for d in os.listdir(folder) if os.path.isfile(os.path.join(folder, d, "__init__.py"))]
    assert {"load", "capture", "costs", "memory", "llm", "devices", "graph", "rules", "analysis", "measure",
            "transform", "prune", "distill", "recommend", "compare", "report"} <= set(packages)
    for package in packages:
        tree = ast.parse(open(os.path.join(folder, package, "__init__.py"), encoding="utf-8").read())
        assert ast.get_docstring(tree), f"archscan/{package}/__init__.py says nothing of what the stage does"
