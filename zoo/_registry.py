"""The model registry: one decorator, one table, timm style.

Each family file defines one model class, a private generator and one-line registered
variants::

    @register_model(default_input="1,3,224,224")
    def shufflenet_v2_x1_0(**kwargs): return _shufflenet_v2("x1_0", **kwargs)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch.nn as nn

from ._catalog import CatalogEntry


@dataclass(frozen=True)
class ZooEntry(CatalogEntry):
    """One registered model: what ``archscan zoo`` shows of it, and its factory."""

    factory: Callable[..., nn.Module]


_MODELS: dict[str, ZooEntry] = {}


def register_model(default_input: str | tuple[str, ...] = "1,3,224,224"):
    """Register a factory under its function name; refuses duplicates.

    Args:
        default_input: input spec(s) in the CLI's `--input` syntax, e.g. "1,128:int64".
    """
    inputs = (default_input,) if isinstance(default_input, str) else tuple(default_input)

    def wrap(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        name = fn.__name__
        if name in _MODELS:
            raise ValueError(f"zoo model {name!r} registered twice")
        family = fn.__module__.rsplit(".", 1)[-1]
        module_doc = inspect.getmodule(fn).__doc__ or ""
        summary = (fn.__doc__ or module_doc).strip().splitlines()[0] if (fn.__doc__ or module_doc).strip() else ""
        _MODELS[name] = ZooEntry(name, family, inputs, summary, fn)
        return fn

    return wrap


def list_models(family: str | None = None) -> list[str]:
    """Registered model names, sorted; optionally only one family (file stem)."""
    return sorted(n for n, e in _MODELS.items() if family is None or e.family == family)


def get_entry(name: str) -> ZooEntry:
    """The registry entry for `name`; KeyError if unknown."""
    return _MODELS[name]


def create_model(name: str, **kwargs) -> nn.Module:
    """Build a registered model with constructor overrides."""
    return _MODELS[name].factory(**kwargs)
