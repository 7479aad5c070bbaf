"""One library call at a time, and the caller's torch state as it was: ``isolated``.

``archscan.scan``, ``fuse``, ``prune``, ``distill`` and ``compare`` run under it. They are safe
to call from several threads: the calls **serialise on one process-wide lock** (re-entrant, so
``compare`` can call ``scan``). They cannot run side by side: the capture patches process-wide
state while it runs (torch.fx's tracer patches ``nn.Module.__call__``, global module hooks are set
aside, the garbage collector is paused, ``.pt2`` loads force weights-only unpickling through the
environment), so two at once would see each other's patches. A thread's answer is the one the
same call gives alone.

The caller's global torch state is saved before the call and given back after it, whatever the
model's file or the analysis did to it: grad mode, inference mode, anomaly detection,
deterministic algorithms (and warn-only), ``cudnn.benchmark``/``deterministic``/``enabled``, TF32
and float32 matmul precision, the SDPA backends, the default dtype, the default device and the
CPU thread count (the RNG is given back by ``capture.seeded_rng``); and Python's ``sys.path`` (a
model file's directory is put on it while the file is imported) and warning filters. The call itself runs with grad
enabled, outside inference mode and with the CPU as the default device, whatever the caller set.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import warnings
from typing import Any, Callable, TypeVar

_LOCK = threading.RLock()
F = TypeVar("F", bound=Callable[..., Any])


def isolated(fn: F) -> F:
    """Run ``fn`` under the process-wide lock, with the caller's torch state saved and restored."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with _LOCK, _state_kept():
            return fn(*args, **kwargs)
    return call  # type: ignore[return-value]


# (read, write) pairs of process-wide (or per-thread) settings a model's file may change
def _settings() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    import torch

    backends = torch.backends
    out: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
        "grad": (torch.is_grad_enabled, torch.set_grad_enabled),
        "anomaly": (lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
                    lambda v: torch.set_anomaly_enabled(*v)),
        "deterministic": (lambda: (torch.are_deterministic_algorithms_enabled(),
                                   torch.is_deterministic_algorithms_warn_only_enabled()),
                          lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "threads": (torch.get_num_threads, torch.set_num_threads),
        "float32_matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    }
    for label, owner, names in (("cudnn", backends.cudnn, ("benchmark", "deterministic", "enabled", "allow_tf32")),
                                ("cuda.matmul", backends.cuda.matmul, ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                                                                       "allow_bf16_reduced_precision_reduction")),
                                ("mkldnn", backends.mkldnn, ("enabled",))):
        for name in names:
            if hasattr(owner, name):
                out[f"{label}.{name}"] = (functools.partial(getattr, owner, name), functools.partial(setattr, owner, name))
    for owner in ("", "cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn"):
        obj = functools.reduce(getattr, owner.split("."), backends) if owner else backends
        if hasattr(obj, "fp32_precision"):  # torch >= 2.9: the TF32 switches' newer names
            out[f"{owner or 'backends'}.fp32_precision"] = (functools.partial(getattr, obj, "fp32_precision"),
                                              functools.partial(setattr, obj, "fp32_precision"))
    cuda = backends.cuda
    for kind in ("flash", "mem_efficient", "math", "cudnn"):
        read, write = getattr(cuda, f"{kind}_sdp_enabled", None), getattr(cuda, f"enable_{kind}_sdp", None)
        if read is not None and write is not None:
            out[f"sdp.{kind}"] = (read, write)
    return out


def _default_device() -> Any:
    """The device ``torch.set_default_device`` set (None when none was)."""
    import torch

    context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    return None if context is None else context.device


@contextlib.contextmanager
def _state_kept():
    import torch

    path, filters = list(sys.path), list(warnings.filters)  # a model file's directory, its warning filters
    settings = _settings()
    saved = {}
    for key, (read, _) in settings.items():
        with contextlib.suppress(Exception):
            saved[key] = read()
    device = _default_device()
    try:
        if device is not None:
            torch.set_default_device(None)
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        for key, value in saved.items():
            read, write = settings[key]
            with contextlib.suppress(Exception):
                if read() != value:
                    write(value)
        if _default_device() != device:
            torch.set_default_device(device)
        sys.path[:] = [p for p in sys.path if p in path] + [p for p in path if p not in sys.path]
        warnings.filters[:] = filters
        warnings._filters_mutated()  # the module's cache of what it already warned about
