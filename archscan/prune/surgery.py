"""Module surgery: cut channels out of a model's parameters, buffers and layer attributes.

Every cut parameter gets a new, smaller tensor (``index_select``: real, fake or meta alike); the
torch.nn layers that hold them get their sizes updated (``out_channels``, ``in_features``,
``num_features``, ``groups`` of a depthwise conv...). No masks: the result is a smaller model.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
import torch.nn as nn

from .groups import ChannelGroup, unique


def drops(cuts: list[tuple[ChannelGroup, np.ndarray]]) -> dict[tuple[str, int], np.ndarray]:
    """(param, dim) -> the indices to remove, for cuts of several groups (channel positions per group)."""
    out: dict[tuple[str, int], list[np.ndarray]] = defaultdict(list)
    for group, channels in cuts:
        for key, idx in group.indices.items():
            out[key].append(idx[channels].ravel())
    return {k: unique(np.concatenate(v)) for k, v in out.items()}


def _owners(model: nn.Module) -> dict[int, list[tuple[nn.Module, str, bool]]]:
    """id(tensor) -> every (module, attribute, is_parameter) holding it (tied weights have several)."""
    held: dict[int, list] = defaultdict(list)
    for module in model.modules():
        for store, is_param in ((module._parameters, True), (module._buffers, False)):
            for name, t in store.items():
                if t is not None:
                    held[id(t)].append((module, name, is_param))
    return held


def apply_cuts(model: nn.Module, cuts: list[tuple[ChannelGroup, np.ndarray]]) -> None:
    """Cut the channels in place: every member tensor loses the indices of the cut channels."""
    by_param: dict[str, dict[int, np.ndarray]] = defaultdict(dict)
    for (param, dim), idx in drops(cuts).items():
        by_param[param][dim] = idx
    held = _owners(model)
    touched: set[int] = set()
    for name, dims in by_param.items():
        owner_path, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_path) if owner_path else model
        old = getattr(owner, attr)
        new = old.detach()
        for dim, idx in dims.items():
            keep = np.ones(old.shape[dim], dtype=bool)
            keep[idx] = False
            keep = np.flatnonzero(keep)
            new = new.index_select(dim, torch.as_tensor(keep, dtype=torch.long, device=old.device))
        for module, key, is_param in held.get(id(old), [(owner, attr, isinstance(old, nn.Parameter))]):
            if is_param:
                module._parameters[key] = nn.Parameter(new, requires_grad=old.requires_grad)
            else:
                module._buffers[key] = new
            touched.add(id(module))
    for module in model.modules():
        if id(module) in touched:
            _resize(module)


def _resize(module: nn.Module) -> None:
    """Make a torch.nn layer's size attributes agree with its (cut) weights."""
    if isinstance(module, nn.modules.conv._ConvNd):
        w = module.weight
        depthwise = module.groups > 1 and module.groups == module.in_channels and not module.transposed \
            and w.shape[1] == 1
        if module.transposed:
            module.in_channels = w.shape[0]
            module.out_channels = w.shape[1] * module.groups
        elif depthwise:
            module.in_channels = module.groups = w.shape[0] // max(1, module.out_channels // module.in_channels)
            module.out_channels = w.shape[0]
        else:
            module.out_channels = w.shape[0]
            module.in_channels = w.shape[1] * module.groups
    elif isinstance(module, nn.Linear):
        module.out_features, module.in_features = module.weight.shape
    elif isinstance(module, nn.modules.batchnorm._NormBase):
        ref = module.weight if module.weight is not None else module.running_mean
        if ref is not None:
            module.num_features = ref.shape[0]
    elif isinstance(module, nn.LayerNorm) and module.weight is not None and len(module.normalized_shape) == 1:
        module.normalized_shape = (module.weight.shape[0],)
    elif isinstance(module, nn.Embedding):
        module.num_embeddings, module.embedding_dim = module.weight.shape
    elif isinstance(module, nn.RMSNorm) and module.weight is not None:
        module.normalized_shape = (module.weight.shape[0],)
