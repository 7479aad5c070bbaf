"""archscan's model zoo: families written for this project, registered timm-style.

`archscan zoo` lists them; `archscan zoo:NAME --input ...` analyzes one.
"""

from ._registry import ZooEntry, create_model, get_entry, list_models, register_model

# Importing a family registers its variants.
from . import shufflenetv2, shufflenetv1, mobilenetv2, mobilenetv1, resnet, vit, llama, probes  # noqa: E402,F401

__all__ = ["ZooEntry", "create_model", "get_entry", "list_models", "register_model"]
