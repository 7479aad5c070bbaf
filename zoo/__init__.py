"""archscan's model zoo: families written for this project, registered timm-style.

`archscan zoo` lists them (from ``_catalog``, without importing torch); `archscan zoo:NAME
--input ...` analyzes one. The registry and the families load on first use of a name below.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._catalog import FAMILIES

__all__ = ["ZooEntry", "create_model", "get_entry", "list_models", "register_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        registry = importlib.import_module("._registry", __name__)
        for family in FAMILIES:  # importing a family registers its variants
            importlib.import_module(f".{family}", __name__)
        value = getattr(registry, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
