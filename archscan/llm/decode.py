"""One decode step of a language model with a KV cache of L tokens, on fake tensors (``--decode L``).

The model's own code runs it, through the protocol Hugging Face models follow (and the zoo's
Llama): ``model(prefill, use_cache=True)`` returns ``(logits, past_key_values)`` (or an object
with ``.past_key_values``); ``model(tokens, past_key_values=cache, use_cache=True)`` runs the
next tokens after the cache's L. The prefill of L tokens makes the cache (on fake tensors,
nothing computed) and is counted as the prefill phase; the step given by ``--input`` (usually
``1,1:int64``) is counted op by op, as the scan counts a forward. Weight GEMMs the step runs
over every cached token (a compressed cache re-expanded each step, as Hugging Face's
DeepSeek-V3 is written) are counted apart (``context_gemms``). With a named GPU, ``speed_grid``
predicts the prefill and the step over a batch × context grid from a handful of small runs.

The KV cache is what the traced cache holds, not a formula per architecture: what its tensors
gain in the step, per new token, is ``bytes_per_token``, and what they held beyond that after L
tokens is fixed per sequence (a sliding window's, a fixed-size cache's), so MHA, GQA, MQA, MLA,
quantized and windowed caches come out right by construction. KV bytes read are the cache
storages the step's ops read; KV bytes written are the cache the step returns, as the model's
code writes it (a ``torch.cat`` rewrites the whole cache each step).

Attention under a mask the model builds from positions (a sliding window, a chunk's offset)
counts the query-key pairs the mask lets through: the step keeps the real values of the small
tensors it makes from numbers alone (``_StepCosts._follow``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Callable, Sequence

import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.weak import WeakIdKeyDictionary

from ..load.building import build_fake, make_call
from ..costs import (MASK_ELEMENTS, bound_arguments, cost_op, expected_experts, mask_pairs, storage_key, tensors_in,
                     topk_routing)
from ..costs.kernels import run_op
from ..load.recording import run_higher_order
from ..errors import ArchscanError, CaptureError
from ..load.frames import short
from ..load.targets import InputSpec, ModelTarget
from ..measure import DeviceProfile
from ..memory import module_hooks
from ..measure.gpu import execution_model, gpu_of, simulate
from ..measure.predict import predict_node
from ..load.recording import output_tensors, quiet, user_line
from ..results import NodeReport


def _spans(t: torch.Tensor) -> set[tuple[int, int]]:
    """The byte ranges of its storage a view's elements occupy (a window of a cache laid out
    [batch, heads, tokens, dim]: one range per batch and head), merged where contiguous; one range
    of its size past ``_MAX_RANGES`` of them."""
    size, start = t.element_size(), t.storage_offset()
    dims: list[list[int]] = []  # [size, stride], outermost first, contiguous neighbours merged
    for n, stride in reversed([(n, abs(s)) for n, s in zip(t.shape, t.stride()) if n != 1]):
        if dims and dims[0][1] * dims[0][0] == stride:
            dims[0][0] *= n
        else:
            dims.insert(0, [n, stride])
    block = dims.pop()[0] if dims and dims[-1][1] == 1 else 1
    if t.numel() == 0:
        return set()
    if math.prod(n for n, _ in dims) > _MAX_RANGES:
        return {(start * size, (start + t.numel()) * size)}
    offsets = [start]
    for n, stride in dims:
        offsets = [o + i * stride for o in offsets for i in range(n)]
    return {(o * size, (o + block) * size) for o in offsets}


_MAX_RANGES = 1 << 16


def _covered(spans: set[tuple[int, int]]) -> int:
    """The bytes the union of byte ranges covers."""
    total, end = 0, 0
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


class _StepCosts(TorchDispatchMode):
    """Costs every op of the step; notes the cache storages the ops read, and the weight GEMMs
    that run over the whole cached context (``rows``: the tokens cached after the step)."""

    def __init__(self, weight_keys: set, cache_keys: set, rows: int = 0):
        super().__init__()
        self.weight_keys, self.cache_keys, self.rows = weight_keys, cache_keys, rows
        self.ops: list = []
        self.routing: tuple[int, int] | None = None  # the last router's (tokens, k)
        self.kv_read: dict[int, int] = {}  # cache storage -> the bytes of it the step's ops read
        self.read_spans: dict[int, set[tuple[int, int]]] = {}  # cache storage -> the byte ranges its views read
        self.kv_by_op: list[int] = []  # per op, the bytes of the cache's tensors it reads (a quantized cache's saving)
        self.from_cache = set(cache_keys)  # storages computed from the cache
        self.context_gemms: list[tuple[int, str | None, str]] = []  # (multiply-adds, model line, module)
        self.where, self.called_at = "", {}  # the module running now (``memory.module_hooks`` keeps them)
        self.modules: list[str] = []  # per op, the module it ran in (the GPU model's host time per layer call)
        self.types: dict[str, str] = {}  # module path -> its type's name
        self.values = WeakIdKeyDictionary()  # fake tensor -> its real value, where known (``_follow``)

    supports_higher_order_operators = True  # torch.cond: its branch's ops, one by one (run_higher_order)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return run_higher_order(self, func, args, kwargs)
        out = run_op(func, args, kwargs)
        if func.namespace == "prim":
            return out
        self.routing = topk_routing(func, out, self.routing) or self.routing
        cost = cost_op(func, args, kwargs, out, self.weight_keys, self.routing)
        tensors = tensors_in((args, kwargs))
        self._follow(func, args, kwargs, tensors, out)
        if cost.category == "attention" and "executed_flops" not in cost.attrs:
            cost = self._masked(func, args, kwargs, cost)
        if func.overloadpacket is torch.ops.aten.cat and any(storage_key(t) in self.cache_keys for t in tensors):
            # the cache rewritten whole to append the new tokens: a serving engine's cache (paged, or static
            # under a CUDA graph) writes only the new ones in place, reading and writing their bytes
            new = sum(t.numel() * t.element_size() for t in tensors if storage_key(t) not in self.cache_keys)
            cost = replace(cost, attrs={**cost.attrs, "served_bytes": 2 * new})
        self.ops.append((cost, _dtype(out)))
        self.modules.append(self.where if isinstance(self.where, str) else "")
        derived = [t for t in tensors if storage_key(t) in self.from_cache]
        written = {id(a) for a, arg in zip(args, func._schema.arguments)
                   if isinstance(a, torch.Tensor) and arg.alias_info is not None and arg.alias_info.is_write}
        self.kv_by_op.append(0 if func.is_view else sum(t.numel() * t.element_size() for t in derived
                                                        if storage_key(t) in self.cache_keys and id(t) not in written))
        for t in derived if not func.is_view else ():  # a view reads nothing; a write into the cache is no read
            key = storage_key(t)
            if key in self.cache_keys and id(t) not in written:  # the bytes of the cache this op reads (a sliding
                spans = self.read_spans.setdefault(key, set())  # window's slice, not the storage behind it)
                spans.update(_spans(t))
                self.kv_read[key] = _covered(spans)
        if derived:
            self.from_cache.update(storage_key(t) for t in tensors_in(out))
            if cost.flops and cost.weight_bytes and any(self.rows in t.shape for t in derived):
                self.context_gemms.append((cost.flops, user_line(), self.where))
        return out

    def _follow(self, func, args: tuple, kwargs: dict, tensors: list, out: Any) -> None:
        """Keep the real value of each small tensor the step makes from numbers alone: positions,
        and the attention masks built from them (a sliding window, a chunk's offset). An op whose
        tensors all have values (a factory has none to read) is run again on the CPU on them; one
        that reads anything else (an input, a weight, the cache) has none, and one that writes
        into a tensor it cannot follow takes that tensor's value away."""
        known = all(t in self.values for t in tensors)
        outs = tensors_in(out)
        if known and outs and torch.Tag.nondeterministic_seeded not in func.tags \
                and all(t.numel() <= MASK_ELEMENTS for t in outs):
            real_args = torch.utils._pytree.tree_map(
                lambda a: self.values[a] if isinstance(a, torch.Tensor) else torch.device("cpu")
                if isinstance(a, torch.device) else a, (args, kwargs))
            try:
                with _disable_current_modes():
                    real = func(*real_args[0], **real_args[1])
            except Exception:
                real = None
            if real is not None:
                for fake, value in zip(torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(real)):
                    if isinstance(fake, torch.Tensor) and isinstance(value, torch.Tensor):
                        self.values[fake] = value
                return
        if func._schema.is_mutable:
            for t in tensors:
                self.values.pop(t, None)

    def _masked(self, func, args: tuple, kwargs: dict, cost):
        """Attention under a mask whose values the step made from numbers alone (``_follow``):
        the multiply-adds of the query-key pairs it lets through, as ``executed_flops``."""
        bound = bound_arguments(func, args, kwargs)
        mask = bound.get("attn_mask", bound.get("attn_bias"))
        value = self.values.get(mask) if isinstance(mask, torch.Tensor) else None
        if value is None:
            return cost
        with _disable_current_modes():
            pairs = mask_pairs(value)
        if pairs is None:
            return cost
        allowed, total = pairs
        return replace(cost, attrs={**cost.attrs, "masked": True, "executed_flops": cost.flops * allowed // total})


def _dtype(out: Any) -> str | None:
    tensors = tensors_in(out)
    return str(tensors[0].dtype).replace("torch.", "") if tensors else None


def _own_bytes(tensors) -> int:
    """The bytes of the tensors themselves (a view counts its own elements, not its storage's)."""
    return sum(t.numel() * t.element_size() for t in tensors)


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


def decoder_tokens(specs: Sequence[InputSpec]) -> InputSpec:
    """The input of the new tokens a decode step takes: ``decoder_input_ids`` for an
    encoder-decoder (the other inputs are the encoder's), else the one input."""
    return next((s for s in specs if s.name == "decoder_input_ids"), specs[0])


def check_decode(specs: Sequence[InputSpec], context: int) -> None:
    """One line, before any analysis, for a --decode the inputs cannot take: one input of token
    ids, or an encoder-decoder's encoder inputs and ``decoder_input_ids``."""
    if context < 1:
        raise ArchscanError(f"--decode {context}: the cache must hold at least one token", hint="--decode 2048")
    tokens = decoder_tokens(specs)
    if (len(specs) != 1 and tokens.name != "decoder_input_ids") or tokens.dtype.is_floating_point \
            or len(tokens.shape) != 2 or tokens.path:
        raise ArchscanError("--decode takes one input of token ids, [batch, new tokens], or an encoder-decoder's "
                            "inputs and decoder_input_ids=[batch, new tokens]",
                            hint="--input 1,1:int64, or --input 1,512:int64 --input decoder_input_ids=1,1:int64")
    if any(s.shape[:1] != tokens.shape[:1] for s in specs):
        raise ArchscanError("--decode: the encoder's inputs and decoder_input_ids must have the same batch",
                            hint="give every --input the same first dimension")


def decode_step(target: ModelTarget, specs: Sequence[InputSpec], context: int, kwargs: dict | None = None,
                dtype: torch.dtype | None = None, profile: DeviceProfile | None = None,
                model: torch.nn.Module | None = None, grid: bool = False,
                others: Sequence[DeviceProfile] = (), variants: dict[str, Callable] | None = None) -> dict:
    """The ``phases.decode`` and ``kv_cache`` sections: one step of ``specs`` (the new tokens)
    after a cache of ``context`` tokens. ``model``: the scan's model on fake tensors, reused (its
    modes are left as found); None builds one. ``grid`` (with a profile): predicted time to the
    first token, decode ms and tokens/s over the batch × context grid (``kv_cache.speed``).
    ``others``: more profiles the step is predicted on (``phases.decode.on``, beside ``profile``'s).
    ``variants``: name -> ``f(nodes, kv_bytes_read_per_node) -> nodes``, the step as a changed model
    runs it (a quantized one: ``archscan.quant``), totalled and predicted as ``phases.decode[name]``."""
    check_decode(specs, context)
    fake_mode = detect_fake_mode(list(model.parameters())) if model is not None else None
    if fake_mode is None:
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        model = build_fake(target, kwargs or {}, dtype, fake_mode, specs)
    positions = max_positions(model)
    new = decoder_tokens(specs).shape[1]
    if positions is not None and context + new > positions[0]:
        raise ArchscanError(f"--decode {context}: the model takes at most {positions[0]:,} positions ({positions[1]}); "
                            f"{context:,} cached and {new} new tokens need {context + new:,}",
                            hint=f"--decode {positions[0] - new}")
    modes = {m: m.training for m in model.modules()}
    try:
        return _decode(model.eval(), fake_mode, specs, context, dtype, profile, grid, others, positions, variants)
    finally:
        for m, training in modes.items():
            m.training = training


_POSITION_NAMES = ("max_position_embeddings", "max_seq_len", "n_positions", "max_positions")


def max_positions(model: torch.nn.Module) -> tuple[int, str] | None:
    """(the longest sequence the model takes, where that is said): a Hugging Face config's
    ``max_position_embeddings`` (``n_positions``), else the first module attribute of those names
    (the zoo's Llama: ``max_seq_len``, the length of its RoPE tables); None when none says."""
    config = getattr(model, "config", None)
    for name in _POSITION_NAMES:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value, f"config.{name}"
    for path, module in model.named_modules():
        for name in _POSITION_NAMES:
            value = getattr(module, name, None)
            if isinstance(value, int) and value > 0:
                return value, f"{path + '.' if path else ''}{name}"
    return None


@dataclass
class _Run:
    """One prefill of ``context`` tokens and the step after it, costed op by op."""

    prefill: "_StepCosts"
    step: "_StepCosts"
    cached: tuple[torch.Tensor, ...]  # the cache's tensors after the prefill
    written: int                       # the bytes of the cache the step returned
    held: tuple[int, int]              # the cache's own bytes (not its storages') before and after the step


def _run(model: torch.nn.Module, fake_mode: FakeTensorMode, weight_keys: set, spec: InputSpec, batch: int,
         context: int, dtype: torch.dtype | None, encoder: Sequence[InputSpec] = ()) -> _Run:
    """The prefill of ``batch`` × ``context`` tokens with ``use_cache=True``, then one step of
    ``spec``'s new tokens (at ``batch``) after that cache. An encoder-decoder (``encoder``: its
    encoder's inputs) runs its encoder in the prefill, once, and the step reads its output
    (``encoder_outputs``) and the cross-attention cache the prefill made."""
    encoder = [replace(s, shape=(batch, *s.shape[1:])) for s in encoder]
    prefill = make_call([*encoder, replace(spec, shape=(batch, context))], dtype, fake_mode)
    step = make_call([*(s for s in encoder if s.name == "attention_mask"), replace(spec, shape=(batch, spec.shape[1]))],
                     dtype, fake_mode)
    types = {path: type(m).__name__ for path, m in model.named_modules()}
    first = _StepCosts(weight_keys, set())
    first.types = types
    hooks = module_hooks(model, first)
    try:
        with fake_mode, torch.no_grad(), quiet(), first:
            prefilled = model(*prefill.args, **prefill.kwargs, use_cache=True)
            cache = _cache_of(prefilled)
            encoded = getattr(prefilled, "encoder_last_hidden_state", None) if encoder else None
            if encoder and encoded is None:
                raise ArchscanError("--decode with decoder_input_ids: the model's output has no encoder_last_hidden_state",
                                    hint="an encoder-decoder returns it (Hugging Face's Seq2SeqLMOutput)")
    except ArchscanError:
        raise
    except Exception as exc:
        raise CaptureError(f"the prefill of {context} tokens with use_cache=True did not run: {short(exc)}",
                           hint="--decode needs forward(tokens, past_key_values=..., use_cache=True)") from exc
    finally:
        for hook in hooks:
            hook.remove()
    cached = output_tensors(cache)
    costs = _StepCosts(weight_keys, {storage_key(t) for t in cached}, rows=context + spec.shape[1])
    costs.types = types
    hooks = module_hooks(model, costs)
    try:
        with fake_mode, torch.no_grad(), quiet(), costs:
            reuse = {"encoder_outputs": (encoded,)} if encoder else {}  # the encoder ran once, in the prefill
            output = model(*step.args, **step.kwargs, **reuse, past_key_values=cache, use_cache=True)
    except Exception as exc:
        raise CaptureError(f"the decode step after {context} cached tokens did not run: {short(exc)}",
                           hint="--decode needs forward(tokens, past_key_values=..., use_cache=True)") from exc
    finally:
        for hook in hooks:
            hook.remove()
    returned = output_tensors(_cache_of(output))
    return _Run(first, costs, cached, _storage_bytes(returned), (_own_bytes(cached), _own_bytes(returned)))


def _decode(model: torch.nn.Module, fake_mode: FakeTensorMode, specs: Sequence[InputSpec], context: int,
            dtype: torch.dtype | None, profile: DeviceProfile | None, grid: bool = False,
            others: Sequence[DeviceProfile] = (), positions: tuple[int, str] | None = None,
            variants: dict[str, Callable] | None = None) -> dict:
    tokens = decoder_tokens(specs)
    encoder = [s for s in specs if s is not tokens]
    batch = tokens.shape[0]
    weight_keys = {storage_key(t) for t in [*model.parameters(), *model.buffers()]}
    run = _run(model, fake_mode, weight_keys, tokens, batch, context, dtype, encoder)
    costs, cached = run.step, run.cached
    kv_bytes = _storage_bytes(cached)
    prefill_phase = _phase(run.prefill, batch * context, 0, 0, kv_bytes, profile)
    decode_phase = {"context": context, **_phase(costs, math.prod(tokens.shape), sum(costs.kv_read.values()),
                                                  context, run.written, profile)}
    if others:  # the same step on more GPUs
        decode_phase["on"] = {p.name: _predicted(costs, decode_phase["tokens"], p)
                              for p in ([profile] if profile is not None else []) + list(others)}
    for name, change in (variants or {}).items():
        decode_phase[name] = _variant(costs, decode_phase["tokens"], change, profile)
    if costs.context_gemms:  # weights multiplied over every cached token, each step (a re-expanded cache)
        decode_phase["context_gemms"] = {"flops": sum(f for f, _, _ in costs.context_gemms),
                                         "ops": len(costs.context_gemms), "rows": costs.rows,
                                         "at": sorted({line for _, line, _ in costs.context_gemms if line}),
                                         "modules": [m for _, _, m in costs.context_gemms]}
    weights = _storage_bytes([*model.parameters(), *model.buffers()])
    per_token, fixed = _growth(run.held, batch, context, tokens.shape[1])
    cells = memory_grid(weights, per_token, _memory_of(profile), fixed, positions[0] if positions else None)
    kv_cache = {"bytes": kv_bytes, "bytes_per_token": per_token, "fixed_bytes_per_sequence": fixed,
                "tokens": context, "batch": batch, "tensors": len(cached), "weights_bytes": weights, "grid": cells}
    if grid and profile is not None:
        kv_cache["speed"] = speed_grid(model, fake_mode, weight_keys, tokens, dtype, profile, run, batch,
                                       context, cells, positions, encoder)
    return {"phases": {"prefill": prefill_phase, "decode": decode_phase}, "kv_cache": kv_cache}


# --- time to first token and tokens/s over the grid, from a handful of small runs ----------------------
#
# Each op's multiply-adds and bytes are, in batch B and context L, bilinear in the decode step
# (a + b·B + c·L + d·B·L: weights once, activations per sequence, the cache per token) and, in the
# prefill, quadratic in L (attention's L² pairs, masks). Batch 1 may take another path than larger
# batches (a squeeze that copies, a kernel for one sequence), so it is its own family: runs at B = 1
# and at B in {2, 3}, each at three small contexts (``_SPACINGS``), determine the coefficients exactly. Each family is
# checked op by op against runs it was not fitted on (the user's own (B, L), one more, the grid's longest), and the
# grid is evaluated only when every op agrees. Expert weights (mixtures of experts) are not
# polynomial in the tokens: their bytes are taken out before the fit and put back per point.

_FIT_CONTEXTS = (16, 32, 48)
# A model that pads its sequence to chunks (a state-space model's chunked scan: Bamba's 256, a gated
# delta rule's 64 in Qwen3-Next) is polynomial only on multiples of its chunk: the fit moves to
# multiples of these spacings, in turn, until it agrees with the runs it was not fitted on, the
# grid's longest context among them (a sliding window wider than the fitted contexts shows there).
_SPACINGS = (16, 64, 256, 1024)
_FIELDS = ("flops", "elem_ops", "read_bytes", "write_bytes", "weight_bytes")


def _family(batch: int) -> tuple[int, ...]:
    """The batches a point's fit is made from."""
    return (1,) if batch == 1 else (2, 3)


def _basis(batch: int, context: int, quadratic: bool, single: bool) -> tuple[int, ...]:
    terms = (1, context) if single else (1, batch, context, batch * context)
    if not quadratic:
        return terms
    return terms + ((context * context,) if single else (context * context, batch * context * context))


def _weights(points: Sequence[tuple[int, int]], at: tuple[int, int], quadratic: bool) -> list[Fraction]:
    """w with f(at) = Σ w_i f(points_i) for every f in the span of the basis: basis(at) · A⁻¹."""
    single = len({b for b, _ in points}) == 1
    a = [[Fraction(v) for v in _basis(b, c, quadratic, single)] for b, c in points]
    n = len(a)
    inv = [[Fraction(int(i == j)) for j in range(n)] for i in range(n)]
    for col in range(n):  # Gauss-Jordan, exact
        pivot = next(r for r in range(col, n) if a[r][col] != 0)
        a[col], a[pivot], inv[col], inv[pivot] = a[pivot], a[col], inv[pivot], inv[col]
        scale = a[col][col]
        a[col] = [v / scale for v in a[col]]
        inv[col] = [v / scale for v in inv[col]]
        for r in range(n):
            if r != col and a[r][col] != 0:
                factor = a[r][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col])]
                inv[r] = [x - factor * y for x, y in zip(inv[r], inv[col])]
    target = _basis(*at, quadratic, single)
    # f(at) = basis(at)·coef with coef = A⁻¹·f(points): w_j = Σ_i basis_i(at)·A⁻¹[i][j]
    return [sum(Fraction(target[i]) * inv[i][j] for i in range(n)) for j in range(n)]


def _op_rows(costs: "_StepCosts") -> list[tuple]:
    """Per op: (op, category, dtype, fields with the experts' bytes taken out and the executed
    multiply-adds of causal attention last, expert attrs or None, (module, its type))."""
    rows = []
    for i, (cost, dtype) in enumerate(costs.ops):
        experts = cost.attrs if "expert_bytes_read" in cost.attrs else None
        out = experts["expert_bytes_read"] if experts else 0
        executed = cost.attrs.get("executed_flops", cost.flops) if cost.attrs.get("causal") else cost.flops
        values = (cost.flops, cost.elem_ops, cost.read_bytes - out, cost.write_bytes, cost.weight_bytes - out, executed,
                  cost.attrs.get("served_bytes", -1))
        rows.append((cost.op, cost.category, dtype, values, experts, _where(costs, i)))
    return rows


def _where(costs: "_StepCosts", i: int) -> tuple[str, str]:
    """(the module op ``i`` ran in, its type's name)."""
    path = costs.modules[i] if i < len(costs.modules) else ""
    return path, costs.types.get(path, "")


def _expert_bytes(attrs: dict, tokens: int) -> int:
    """``expert_reads``'s expected bytes for ``tokens`` tokens routed as ``attrs`` says."""
    per_expert = attrs["expert_bytes_worst_case"] // max(attrs["worst_case_experts"], 1)
    return round(expected_experts(attrs["experts"], attrs["experts_per_token"], tokens) * per_expert)


def _evaluate(runs: Sequence[list[tuple]], weights: Sequence[Fraction], tokens_per_row: int) -> list[NodeReport] | None:
    """The ops at a point: Σ w_i · fields of run i per op (exact), experts' bytes put back for
    ``tokens_per_row`` routed tokens; None when the runs' ops do not line up."""
    first = runs[0]
    if any(len(r) != len(first) or any(a[0] != b[0] for a, b in zip(r, first)) for r in runs[1:]):
        return None
    denominator = math.lcm(*(w.denominator for w in weights))  # integer arithmetic from here: exact, fast
    scaled = [int(w * denominator) for w in weights]
    nodes = []
    for i, (op, category, dtype, _, experts, where) in enumerate(first):
        values = []
        for f in range(len(_FIELDS) + 2):  # the fields, the executed multiply-adds and the bytes as served
            v, rest = divmod(sum(w * r[i][3][f] for w, r in zip(scaled, runs)), denominator)
            if rest:
                return None
            values.append(v)
        flops, elem, read, write, weight, executed, served = values
        if experts is not None:
            extra = _expert_bytes(experts, tokens_per_row)
            read, weight = read + extra, weight + extra
        attrs = {"causal": True, "executed_flops": executed} if executed != flops else {}
        if served >= 0:
            attrs["served_bytes"] = served
        nodes.append(_node(op, category, dtype, flops, elem, read, write, weight, *where, attrs))
    return nodes


def _same(nodes: Sequence[NodeReport], costs: "_StepCosts") -> bool:
    """Do the evaluated ops equal a run's, field by field?"""
    return len(nodes) == len(costs.ops) and all(
        (n.op, n.flops, n.elem_ops, n.read_bytes, n.write_bytes, n.weight_bytes)
        == (c.op, c.flops, c.elem_ops, c.read_bytes, c.write_bytes, c.weight_bytes)
        for n, (c, _) in zip(nodes, costs.ops))


def speed_grid(model: torch.nn.Module, fake_mode: FakeTensorMode, weight_keys: set, spec: InputSpec,
               dtype: torch.dtype | None, profile: DeviceProfile, checked: _Run, batch: int, context: int,
               cells: Sequence[dict], limit: tuple[int, str] | None = None,
               encoder: Sequence[InputSpec] = ()) -> dict:
    """Predicted time to the first token (the prefill of L tokens at batch B), decode ms per step
    and tokens/s at every (B, L) of ``cells``, from small runs fitted per op (see above) and
    checked op by op against ``checked``, the run at the user's (``batch``, ``context``), and one
    more run in the other batch family. ``limit``: the model's positions (``max_positions``);
    contexts past them are left out."""
    new = spec.shape[1]
    runs: dict[tuple[int, int], _Run] = {}
    rows: dict[tuple[int, int], tuple[list, list]] = {}  # each run's (prefill, step) op rows, made once

    def run(b: int, c: int) -> _Run:
        if (b, c) not in runs:
            runs[b, c] = checked if (b, c) == (batch, context) else _run(model, fake_mode, weight_keys, spec, b, c,
                                                                        dtype, encoder)
        return runs[b, c]

    def rows_of(b: int, c: int) -> tuple[list, list]:
        if (b, c) not in rows:
            rows[b, c] = (_op_rows(run(b, c).prefill), _op_rows(run(b, c).step))
        return rows[b, c]

    fit = _FIT_CONTEXTS

    def at(b: int, c: int) -> tuple[list | None, list | None]:
        points = [(f, x) for f in _family(b) for x in fit]
        step_points = [p for p in points if p[1] in fit[:2]]
        prefill = _evaluate([rows_of(*p)[0] for p in points], _weights(points, (b, c), True), b * c)
        step = _evaluate([rows_of(*p)[1] for p in step_points], _weights(step_points, (b, c), False), b * new)
        return prefill, step

    def agrees(b: int, c: int, against: _Run | None) -> bool:
        against = against or run(b, c)
        prefill, step = at(b, c)
        return prefill is not None and step is not None and _same(prefill, against.prefill) and _same(step, against.step)

    reach = [cell["context"] for cell in cells if limit is None or cell["context"] + new <= limit[0]]
    far = max(reach) if reach else None  # the grid's longest context: checked too, so no window hides past the fit
    failed, passed = (batch, context), False
    for spacing in _SPACINGS:  # the contexts fitted: multiples of a chunk the model may pad its sequence to
        if spacing > _SPACINGS[0] and limit is not None and 4 * spacing + new > limit[0]:
            break
        fit = tuple(spacing * i for i in (1, 2, 3))
        other = (4 if batch == 1 else 1, 4 * spacing)
        on_lattice = spacing == _SPACINGS[0] or context % spacing == 0
        mine = (batch, context, checked) if on_lattice else (batch, 4 * spacing, None)
        failed = next(((b, c) for b, c, against in (mine, (*other, None)) if not agrees(b, c, against)), None)
        if failed is None and far is not None and far > other[1] and not agrees(other[0], far, None):
            failed = (other[0], far)  # a window wider than the fitted contexts: the far end tells
        if failed is None:
            passed = True
            break
    if not passed:
        b, c = failed
        counts = {len(rows_of(f, x)[0]) for f in _family(b) for x in fit}
        why = ("the prefill runs more ops the longer the context (a Python loop over chunks of the sequence, "
               "as Qwen3-Next's gated delta rule is written)" if len(counts) > 1 else
               "a sliding window, a cache that changes layout, or a path that depends on the length")
        return {"cells": [], "why": (f"the ops of the prefill or the step are not polynomial in batch and "
                                     f"context (checked at {b} x {c:,}, fitted on multiples of up to "
                                     f"{fit[0]:,} tokens): {why}")}
    out = []
    if any(cell["context"] % fit[0] for cell in cells):
        return {"cells": [], "why": f"the grid's contexts are not multiples of the {fit[0]:,} tokens fitted"}
    for cell in cells:
        if limit is not None and cell["context"] + new > limit[0]:
            continue  # past the model's positions: it cannot run there
        prefill, step = at(cell["batch"], cell["context"])
        if prefill is None or step is None:
            return {"cells": [], "why": "the fitted ops are not whole numbers at the grid's points"}
        first, each = _times(prefill, profile), _times(step, profile)
        ms = each["predicted_ms"]
        row = {"batch": cell["batch"], "context": cell["context"], "ttft_ms": first["predicted_ms"], "decode_ms": ms,
               "tokens_per_s": cell["batch"] * new / ms * 1e3 if ms else None}
        if "served_ms" in each:  # a GPU: as a serving engine runs the same kernels (a CUDA graph, no Python)
            row.update(served_ttft_ms=first["served_ms"], served_decode_ms=each["served_ms"],
                       served_tokens_per_s=cell["batch"] * new / each["served_ms"] * 1e3 if each["served_ms"] else None)
        out.append(row)
    return {"cells": out, "profile": profile.name, "execution_model": execution_model(profile),
            "checked_at": [list(mine[:2]), list(other)] + ([[other[0], far]] if far is not None and far > other[1] else []),
            "fitted_contexts": list(fit),
            "runs": len(runs), **({"positions": limit[0]} if limit else {})}


GRID_BATCHES = (1, 8, 32, 128)
GRID_CONTEXTS = (2048, 8192, 32768, 131072)


def _growth(held: tuple[int, int], batch: int, context: int, new: int) -> tuple[int, int]:
    """(bytes per cached token, bytes per sequence that do not grow with the context) of a cache
    that held ``held[0]`` bytes after ``context`` tokens and ``held[1]`` after ``new`` more, at
    ``batch``: what the step added is the per-token part (all of an appended cache; none of a
    sliding window's or a fixed-size cache's), the rest of what it held is fixed."""
    before, after = held
    per_token = max(after - before, 0) // (batch * new)
    return per_token, max(before - per_token * batch * context, 0) // batch


def memory_grid(weights: int, per_token: int, limit: int | None = None, fixed: int = 0,
                positions: int | None = None) -> list[dict]:
    """Weights + KV cache over a batch × context grid (per sequence, ``fixed`` bytes and
    ``per_token`` for each token: linear in the batch and in the context), and whether each fits
    ``limit`` bytes (a named GPU's memory) when known. Contexts past the model's ``positions`` are
    left out, as the speed grid leaves them: the model cannot run there."""
    contexts = [c for c in GRID_CONTEXTS if positions is None or c <= positions]
    cells = [(b, c, weights + b * (fixed + per_token * c)) for b in GRID_BATCHES for c in contexts]
    return [{"batch": b, "context": c, "bytes": total, **({"fits": total <= limit} if limit else {})}
            for b, c, total in cells]


def _memory_of(profile: DeviceProfile | None) -> int | None:
    """The memory of a datasheet profile's GPU (``--device-profile``), else None."""
    from ..devices.gpus import gpu

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
        phase.update(**_predicted(costs, tokens, profile), profile=profile.name)
    return phase


def _nodes(costs: _StepCosts, change: Callable | None = None) -> list[NodeReport]:
    """The phase's ops as nodes, rewritten by ``change`` (``decode_step``'s ``variants``) when given."""
    nodes = [_as_node(c, dt, *_where(costs, i)) for i, (c, dt) in enumerate(costs.ops)]
    return change(nodes, costs.kv_by_op) if change is not None else nodes


def _predicted(costs: _StepCosts, tokens: int, profile: DeviceProfile, change: Callable | None = None) -> dict:
    """A phase's time on ``profile`` and its tokens/s: on a GPU as written (eager) and as served
    (``_times``), else the roofline's."""
    times = _times(_nodes(costs, change), profile)
    ms = times["predicted_ms"]
    out = {**times, "tokens_per_s": tokens / ms * 1e3 if ms else None}
    if times.get("served_ms"):
        out["served_tokens_per_s"] = tokens / times["served_ms"] * 1e3
    return out


def _variant(costs: _StepCosts, tokens: int, change: Callable, profile: DeviceProfile | None) -> dict:
    """The step's totals as ``change`` rewrites its ops (``decode_step``'s ``variants``), and with a
    profile its predicted time and tokens/s."""
    nodes = _nodes(costs, change)
    out = {"flops": sum(n.flops for n in nodes), "mac_bytes": sum(n.mac_bytes for n in nodes),
           "weight_bytes": sum(n.weight_bytes for n in nodes)}
    return {**out, **_predicted(costs, tokens, profile, change)} if profile is not None else out


def _times(nodes: Sequence[NodeReport], profile: DeviceProfile) -> dict:
    """The ops' time on ``profile``, in order: on a GPU the GPU model's two predictions (``predicted_ms``
    as written, eager PyTorch's host and GPU timelines; ``served_ms`` the kernels alone) and the host's
    time; else each op's roofline, summed. ``execution_model`` says which."""
    found = gpu_of(profile)
    if found is None:
        return {"predicted_ms": sum(predict_node(n, profile)[0] for n in nodes), "execution_model": execution_model(profile)}
    timeline = simulate(nodes, found)
    return {"predicted_ms": timeline.eager_ms, "served_ms": timeline.served_ms, "host_ms": timeline.host_ms,
            "execution_model": found.name}


def _as_node(cost, dtype: str | None, module: str = "", module_type: str = "") -> NodeReport:
    """One op as a node the roofline predicts (attention keeps what its mask leaves: ``causal``,
    ``masked``, ``executed_flops``; a cache rewritten to append, the bytes of an append in place:
    ``served_bytes``)."""
    attrs = {k: cost.attrs[k] for k in ("causal", "masked", "executed_flops", "served_bytes") if k in cost.attrs}
    return _node(cost.op, cost.category, dtype, cost.flops, cost.elem_ops, cost.read_bytes, cost.write_bytes,
                 cost.weight_bytes, module, module_type, attrs)


def _node(op: str, category: str, dtype: str | None, flops: int, elem_ops: int, read: int, write: int,
          weight: int, module: str = "", module_type: str = "", attrs: dict | None = None) -> NodeReport:
    """An op's costs as a node the roofline predicts (``predict_node``); ``module``: the layer it ran
    in and its type (the GPU model's host time of a layer call)."""
    return NodeReport(name=op, op=op, module=module, module_type=module_type, category=category, flops=flops,
                      elem_ops=elem_ops, mac_bytes=read + write, read_bytes=read, write_bytes=write, weight_bytes=weight,
                      params=0, out_shape=None, dtype=dtype, aten_ops=(op,) if category != "view" else (),
                      attrs=attrs or {})


__all__ = ["check_decode", "decode_step"]
