"""The zoo's catalogue without importing torch: names, families, default inputs and summaries read
from the family files' source (their ``@register_model`` decorators and docstrings), so
``archscan zoo`` lists the zoo in a tenth of a second. ``tests/test_zoo.py`` checks it against
the registry that importing the families builds.
"""

from __future__ import annotations

import ast
import functools
import os
from dataclasses import dataclass

# the family files, in the order the package imports them
FAMILIES = ("shufflenetv2", "shufflenetv1", "mobilenetv2", "mobilenetv1", "resnet", "vit", "llama", "probes")

_DEFAULT_INPUT = "1,3,224,224"  # register_model's default


@dataclass(frozen=True)
class CatalogEntry:
    """What ``archscan zoo`` shows of one model."""

    name: str
    family: str
    default_input: tuple[str, ...]
    summary: str


def catalog() -> dict[str, CatalogEntry]:
    """Every registered model by name, read from the family files (once a process: a scan checks
    the name, then resolves it)."""
    return dict(_read_catalog())


@functools.lru_cache(maxsize=1)
def _read_catalog() -> dict[str, CatalogEntry]:
    here = os.path.dirname(os.path.abspath(__file__))
    out: dict[str, CatalogEntry] = {}
    for family in FAMILIES:
        with open(os.path.join(here, f"{family}.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        module_doc = ast.get_docstring(tree, clean=False) or ""
        for fn in tree.body:
            decorator = _register_decorator(fn)
            if decorator is None:
                continue
            doc = (ast.get_docstring(fn, clean=False) or module_doc).strip()
            out[fn.name] = CatalogEntry(fn.name, family, _default_input(decorator), doc.splitlines()[0] if doc else "")
    return out


def _register_decorator(node: ast.AST) -> ast.expr | None:
    if not isinstance(node, ast.FunctionDef):
        return None
    for d in node.decorator_list:
        func = d.func if isinstance(d, ast.Call) else d
        if isinstance(func, ast.Name) and func.id == "register_model":
            return d
    return None


def _default_input(decorator: ast.expr) -> tuple[str, ...]:
    if not isinstance(decorator, ast.Call):
        return (_DEFAULT_INPUT,)
    args = list(decorator.args) + [k.value for k in decorator.keywords if k.arg == "default_input"]
    if not args:
        return (_DEFAULT_INPUT,)
    value = ast.literal_eval(args[0])
    return (value,) if isinstance(value, str) else tuple(value)
