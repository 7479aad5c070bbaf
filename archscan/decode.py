"""One decode step of a language model with a KV cache of L tokens, on fake tensors (``--decode L``).

The model's own code runs it, through the protocol Hugging Face models follow (and the zoo's
Llama): ``model(prefill, use_cache=True)`` returns ``(logits, past_key_values)`` (or an object
with ``.past_key_values``); ``model(tokens, past_key_values=cache, use_cache=True)`` runs the
next tokens after the cache's L. The prefill of L tokens makes the cache (on fake tensors,
nothing computed, not counted); the step given by ``--input`` (usually ``1,1:int64``) is
counted op by op, as the scan counts a forward.

The KV cache is what the traced cache holds, not a formula per architecture: its tensors'
bytes over the L tokens give ``bytes_per_token``, so MHA, GQA, MQA, MLA and quantized caches come
out right by construction. KV bytes read are the cache storages the step's ops read; KV bytes
written are the cache the step returns, as the model's code writes it (a ``torch.cat`` rewrites
the whole cache each step).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace
from typing import Any, Sequence

import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from .building import build_fake, make_call
from .costs import cost_op, storage_key, tensors_in, topk_routing
from .costs.kernels import run_op
from .errors import ArchscanError, CaptureError
from .frames import short
from .loading import InputSpec, ModelTarget
from .measure import DeviceProfile
from .measure.predict import predict_node
from .recording import output_tensors, quiet, user_line
from .results import NodeReport


class _StepCosts(TorchDispatchMode):
    """Costs every op of the step; notes the cache storages the ops read, and the weight GEMMs
    that run over the whole cached context (``rows``: the tokens cached after the step)."""

    def __init__(self, weight_keys: set, cache_keys: set, rows: int = 0):
        super().__init__()
        self.weight_keys, self.cache_keys, self.rows = weight_keys, cache_keys, rows
        self.ops: list = []
        self.routing: tuple[int, int] | None = None  # the last router's (tokens, k)
        self.kv_read: dict[int, int] = {}
        self.from_cache = set(cache_keys)  # storages computed from the cache
        self.context_gemms: list[tuple[int, str | None, str]] = []  # (multiply-adds, model line, module)
        self.modules: list[str] = []  # the modules running now, outermost first (``watch_modules``)

    @contextlib.contextmanager
    def watch_modules(self, model: torch.nn.Module):
        """Keep ``modules`` while the model runs: global forward hooks, removed after."""
        names = {id(m): name for name, m in model.named_modules()}

        def enter(module, args) -> None:
            self.modules.append(names.get(id(module), ""))

        def leave(module, args, out) -> None:  # returns None: the output stays the module's
            self.modules.pop()

        push = torch.nn.modules.module.register_module_forward_pre_hook(enter)
        pop = torch.nn.modules.module.register_module_forward_hook(leave)
        try:
            yield
        finally:
            push.remove()
            pop.remove()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = run_op(func, args, kwargs)
        if func.namespace == "prim":
            return out
        self.routing = topk_routing(func, out) or self.routing
        cost = cost_op(func, args, kwargs, out, self.weight_keys, self.routing)
        self.ops.append((cost, _dtype(out)))
        tensors = tensors_in((args, kwargs))
        derived = [t for t in tensors if storage_key(t) in self.from_cache]
        for t in derived:
            key = storage_key(t)
            if key in self.cache_keys:
                self.kv_read[key] = t.untyped_storage().nbytes()
        if derived:
            self.from_cache.update(storage_key(t) for t in tensors_in(out))
            if cost.flops and cost.weight_bytes and any(self.rows in t.shape for t in derived):
                self.context_gemms.append((cost.flops, user_line(), self.modules[-1] if self.modules else ""))
        return out


def _dtype(out: Any) -> str | None:
    tensors = tensors_in(out)
    return str(tensors[0].dtype).replace("torch.", "") if tensors else None


def _storage_bytes(tensors) -> int:
    """The bytes of the tensors' storages, each storage once (views and shared tensors count once)."""
    return sum({storage_key(t): t.untyped_storage().nbytes() for t in tensors}.values())


def _cache_of(output: Any) -> Any:
    """The cache a ``use_cache=True`` forward returned (the protocol in the module docstring)."""
    if hasattr(output, "past_key_values"):
        return output.past_key_values
    if isinstance(output, (tuple, list)) and len(output) == 2:
        return output[1]
    raise ArchscanError("the model's forward with use_cache=True returned no cache",
                        hint="--decode needs forward(tokens, past_key_values=..., use_cache=True) returning "
                             "(logits, past_key_values) or an object with .past_key_values")


def check_decode(specs: Sequence[InputSpec], context: int) -> None:
    """One line, before any analysis, for a --decode the inputs cannot take."""
    if context < 1:
        raise ArchscanError(f"--decode {context}: the cache must hold at least one token", hint="--decode 2048")
    if len(specs) != 1 or specs[0].dtype.is_floating_point or len(specs[0].shape) != 2:
        raise ArchscanError("--decode takes one input of token ids, [batch, new tokens]", hint="--input 1,1:int64")


def decode_step(target: ModelTarget, specs: Sequence[InputSpec], context: int, kwargs: dict | None = None,
                dtype: torch.dtype | None = None, profile: DeviceProfile | None = None,
                model: torch.nn.Module | None = None) -> dict:
    """The ``phases.decode`` and ``kv_cache`` sections: one step of ``specs`` (the new tokens)
    after a cache of ``context`` tokens. ``model``: the scan's model on fake tensors, reused (its
    modes are left as found); None builds one."""
    check_decode(specs, context)
    fake_mode = detect_fake_mode(list(model.parameters())) if model is not None else None
    if fake_mode is None:
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        model = build_fake(target, kwargs or {}, dtype, fake_mode, specs)
    modes = {m: m.training for m in model.modules()}
    try:
        return _decode(model.eval(), fake_mode, specs, context, dtype, profile)
    finally:
        for m, training in modes.items():
            m.training = training


def _decode(model: torch.nn.Module, fake_mode: FakeTensorMode, specs: Sequence[InputSpec], context: int,
            dtype: torch.dtype | None, profile: DeviceProfile | None) -> dict:
    batch = specs[0].shape[0]
    prefill = make_call([replace(specs[0], shape=(batch, context))], dtype, fake_mode)
    step = make_call(specs, dtype, fake_mode)
    weight_keys = {storage_key(t) for t in [*model.parameters(), *model.buffers()]}
    first = _StepCosts(weight_keys, set())
    try:
        with fake_mode, torch.no_grad(), quiet(), first:
            cache = _cache_of(model(*prefill.args, **prefill.kwargs, use_cache=True))
    except ArchscanError:
        raise
    except Exception as exc:
        raise CaptureError(f"the prefill of {context} tokens with use_cache=True did not run: {short(exc)}",
                           hint="--decode needs forward(tokens, past_key_values=..., use_cache=True)") from exc
    cached = output_tensors(cache)
    cache_keys = {storage_key(t) for t in cached}
    kv_bytes = _storage_bytes(cached)
    costs = _StepCosts(weight_keys, cache_keys, rows=context + specs[0].shape[1])
    try:
        with fake_mode, torch.no_grad(), quiet(), costs, costs.watch_modules(model):
            output = model(*step.args, **step.kwargs, past_key_values=cache, use_cache=True)
    except Exception as exc:
        raise CaptureError(f"the decode step after {context} cached tokens did not run: {short(exc)}",
                           hint="--decode needs forward(tokens, past_key_values=..., use_cache=True)") from exc
    written = _storage_bytes(output_tensors(_cache_of(output)))
    prefill_phase = _phase(first, batch * context, 0, 0, kv_bytes, profile)
    decode_phase = {"context": context, **_phase(costs, math.prod(specs[0].shape), sum(costs.kv_read.values()),
                                                  context, written, profile)}
    if costs.context_gemms:  # weights multiplied over every cached token, each step (a re-expanded cache)
        decode_phase["context_gemms"] = {"flops": sum(f for f, _, _ in costs.context_gemms),
                                         "ops": len(costs.context_gemms), "rows": costs.rows,
                                         "at": sorted({line for _, line, _ in costs.context_gemms if line}),
                                         "modules": [m for _, _, m in costs.context_gemms]}
    weights = _storage_bytes([*model.parameters(), *model.buffers()])
    per_token = kv_bytes // (batch * context)
    return {"phases": {"prefill": prefill_phase, "decode": decode_phase},
            "kv_cache": {"bytes": kv_bytes, "bytes_per_token": per_token, "tokens": context,
                         "batch": batch, "tensors": len(cached), "weights_bytes": weights,
                         "grid": memory_grid(weights, per_token, _memory_of(profile))}}


GRID_BATCHES = (1, 8, 32, 128)
GRID_CONTEXTS = (2048, 8192, 32768, 131072)


def memory_grid(weights: int, per_token: int, limit: int | None = None) -> list[dict]:
    """Weights + KV cache over a batch × context grid (the cache is linear in both: bytes per token
    of the traced cache), and whether each fits ``limit`` bytes (a named GPU's memory) when known."""
    return [{"batch": b, "context": c, "bytes": weights + per_token * b * c,
             **({"fits": weights + per_token * b * c <= limit} if limit else {})}
            for b in GRID_BATCHES for c in GRID_CONTEXTS]


def _memory_of(profile: DeviceProfile | None) -> int | None:
    """The memory of a datasheet profile's GPU (``--device-profile``), else None."""
    from .gpus import gpu

    if profile is None or not profile.created.startswith("datasheet"):
        return None
    found = gpu(profile.name.split(" (")[0])
    return found.memory_bytes if found else None


def _phase(costs: _StepCosts, tokens: int, kv_read: int, context: int, kv_written: int,
           profile: DeviceProfile | None) -> dict:
    """One phase's totals: multiply-adds (dense and executed), bytes moved, weight and KV bytes,
    and with a profile its predicted time and tokens/s."""
    ops = [c for c, _ in costs.ops]
    phase = {"tokens": tokens, "flops": sum(c.flops for c in ops),
             "executed_flops": sum(c.attrs.get("executed_flops", c.flops) for c in ops),
             "mac_bytes": sum(c.mac_bytes for c in ops), "weight_bytes": sum(c.weight_bytes for c in ops),
             "kv_read_bytes": kv_read, "kv_written_bytes": kv_written}
    if profile is not None:
        ms = sum(predict_node(_as_node(c, dt), profile)[0] for c, dt in costs.ops)
        phase.update(predicted_ms=ms, tokens_per_s=tokens / ms * 1e3 if ms else None, profile=profile.name)
    return phase


def _as_node(cost, dtype: str | None) -> NodeReport:
    """One op as a node the roofline predicts."""
    return NodeReport(name=cost.op, op=cost.op, module="", module_type="", category=cost.category, flops=cost.flops,
                      elem_ops=cost.elem_ops, mac_bytes=cost.mac_bytes, read_bytes=cost.read_bytes,
                      write_bytes=cost.write_bytes, weight_bytes=cost.weight_bytes, params=0, out_shape=None,
                      dtype=dtype, aten_ops=(cost.op,) if cost.category != "view" else ())


__all__ = ["check_decode", "decode_step"]
