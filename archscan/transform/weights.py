"""Real weights for a transform: a checkpoint the user names, or random ones that show a wrong fold."""

from __future__ import annotations

import os
import pickle
import re

import torch
import torch.nn as nn

from ..errors import ArchscanError

_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "ema", "model_ema")
_PREFIXES = ("module.", "_orig_mod.")  # DataParallel / DistributedDataParallel, torch.compile


def _read(path: str) -> object:
    if not os.path.isfile(path):
        raise ArchscanError(f"no such weights file: {path}", hint="give a state_dict saved with torch.save(model.state_dict(), path)")
    if path.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ArchscanError(f"reading {path} needs the safetensors package", hint="pip install safetensors") from None
        try:
            return load_file(path, device="cpu")
        except Exception as exc:
            raise ArchscanError(f"{path} is not a safetensors file: {exc}") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
        what = f" (it holds a {found.group(1)})" if found else ""
        raise ArchscanError(f"{path} holds Python objects besides tensors{what}, and archscan loads weights only "
                            "with torch.load(weights_only=True), which refuses them",
                            hint="save the weights alone: torch.save(model.state_dict(), path)") from None
    except Exception as exc:
        raise ArchscanError(f"{path} could not be read by torch.load: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                            hint="give a file written by torch.save(model.state_dict(), path)") from None


def _state_dict(obj: object, path: str) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint: a state_dict, or one under a usual key ('state_dict', 'model', ...)."""
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        state = obj
    elif isinstance(obj, dict):
        inner = next((obj[k] for k in _WRAPPER_KEYS if isinstance(obj.get(k), dict)), None)
        if inner is None:
            raise ArchscanError(f"{path} is a dict without a state_dict in it (keys: {', '.join(map(str, list(obj)[:6]))})",
                                hint="save model.state_dict(), or a dict with it under 'state_dict'")
        return _state_dict(inner, path)
    else:
        raise ArchscanError(f"{path} holds a {type(obj).__name__}, not a state_dict", hint="save model.state_dict()")
    for prefix in _PREFIXES:
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def load_weights(model: nn.Module, path: str) -> None:
    """Load a checkpoint into ``model`` (strict, except batch norms' ``num_batches_tracked``)."""
    state = _state_dict(_read(path), path)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches
        lines = [line.strip() for line in str(exc).splitlines() if "size mismatch" in line]
        raise ArchscanError(f"{path} does not fit the model: {lines[0] if lines else str(exc).splitlines()[0]}"
                            + (f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""),
                            hint="check the model's constructor arguments (--kwargs)") from None
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} key(s): {', '.join(missing[:4])}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {', '.join(unexpected[:4])}")
        raise ArchscanError(f"{path} does not fit the model: {'; '.join(parts)}",
                            hint="check the model's constructor arguments (--kwargs), or save model.state_dict()")


def _norms(model: nn.Module) -> list[nn.Module]:
    """The modules with floating running statistics (batch norms and their kin)."""
    return [m for m in model.modules()
            if isinstance(getattr(m, "running_mean", None), torch.Tensor) and isinstance(getattr(m, "running_var", None), torch.Tensor)
            and m.running_mean.is_floating_point()]


def fresh_batch_norms(model: nn.Module) -> bool:
    """Are all the model's batch norms as a constructor leaves them (statistics 0 and 1, weight 1,
    bias 0, no batch seen)? A model that carries trained or loaded weights has some that are not."""
    with torch.no_grad():
        for m in _norms(model):
            seen = getattr(m, "num_batches_tracked", None)
            weight, bias = getattr(m, "weight", None), getattr(m, "bias", None)
            if (m.running_mean.any() or not bool((m.running_var == 1).all())
                    or (isinstance(seen, torch.Tensor) and bool(seen.any()))
                    or (isinstance(weight, torch.Tensor) and not bool((weight == 1).all()))
                    or (isinstance(bias, torch.Tensor) and bias.any())):
                return False
    return True


def randomize_batch_norms(model: nn.Module) -> int:
    """Give every batch norm random statistics and affine parameters (a fresh model's are 0/1,
    which would hide a wrong fold); returns how many it changed. Seeded by the caller. Only for a
    freshly built model (``fresh_batch_norms``): trained statistics are the model's, left as they are."""
    if not fresh_batch_norms(model):
        return 0
    count = 0
    with torch.no_grad():
        for module in _norms(model):
            mean, var = module.running_mean, module.running_var
            mean.copy_(torch.randn_like(mean) * 0.5)
            var.copy_(torch.rand_like(var) * 1.5 + 0.5)
            for name, make in (("weight", lambda t: torch.rand_like(t) + 0.5), ("bias", lambda t: torch.randn_like(t) * 0.5)):
                t = getattr(module, name, None)
                if isinstance(t, torch.Tensor) and t.shape == mean.shape:
                    t.copy_(make(t))
            count += 1
    return count
