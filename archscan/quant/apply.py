"""``archscan quantize``: a model quantized with torchao, its drift checked, saved and checked again.

The real model is built (random weights, or ``--weights``), its layers are chosen as ``--quant``
chooses them (``analyse.plan_layers`` on the core's report of the model), and torchao's
``quantize_`` is applied to a copy with ``filter_fn`` taking exactly those layer paths. The copy is
compared with the original on the same seeded random inputs (the specs'):

- per quantized layer, the SQNR of its output (forward hooks on both models, one input; the
  quantized model's layer sees the error of the layers before it, so this is the error as it
  reaches that layer's output),
- end to end: SQNR, cosine similarity and max absolute error over every float output, and for a
  classifier's logits (one 2-D float output) the share of rows whose arg-max agrees (top-1).

SQNR in dB is ``10·log10(Σ ref² / Σ (ref − q)²)`` over the elements, in float64 (inf when equal).

The quantized copy is exported (``transform.programs.export``: a dynamic batch where the model
allows it) and serialised; those bytes are loaded back with plain ``torch.export.load`` and run on
the same inputs: its end-to-end SQNR must equal the checked model's (to 0.1 dB), or nothing is
written (an earlier file at the path is kept) and the command fails; then the file is written
whole or not at all. Its weights as stored
(the inner storages of the quantized weights in the loaded program's state, the other parameters
as they are) are set against ``plan_layers``'s prediction. Where export cannot carry the model,
the state dict is saved instead (``STATE_FORMAT``, a ``.pt`` beside ``-o``), and checked the same
way after loading it into a freshly quantized model.

``budget``: a greedy mixed-precision plan. Each candidate layer's sensitivity is the end-to-end
SQNR of the model with that layer alone quantized (higher: less sensitive); the least sensitive
layers are quantized first, until the parameters' bytes fit.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import os
import textwrap
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn as nn

from ..analysis import analysis
from ..capture import capture_context
from ..costs import storages_nbytes
from ..errors import ArchscanError, CaptureError, VerifyError
from ..files import check_writable, write_file
from ..isolation import isolated
from ..load.building import Call, build_real, make_call, strip_user_hooks
from ..load.recording import output_tensors
from ..load.targets import InputSpec, ModelTarget, input_specs, output_path, to_target
from ..units import fmt_bytes
from .analyse import Layer, plan_layers
from .schemes import INT4_ON_CPU, Scheme, _quiet_import, config, layout_of, parse_scheme, torchao

SCHEMA = "archscan.quantize/1"
STATE_FORMAT = "archscan.quantized-state/1"
SAVED_TOLERANCE_DB = 0.1  # the saved program's end-to-end SQNR against the checked model's
RANDOM_WEIGHTS = ("the weights are random: the drift on them is not a verdict on a trained model's accuracy "
                  "(give --weights)")
SENSITIVITY = "the end-to-end SQNR with that layer alone quantized (higher: less sensitive, quantized first)"


@dataclass(frozen=True)
class Drift:
    """The quantized model's outputs against the original's on the same inputs (float outputs
    flattened and joined; ``top1`` for one 2-D float output, a classifier's logits)."""

    sqnr_db: float                  # inf when equal
    cosine: float
    max_abs_err: float
    top1: float | None = None       # share of rows whose arg-max agrees
    rows: int | None = None         # rows top1 was counted on

    def to_json(self) -> dict:
        return {k: _finite(v) for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Saved:
    """What was written and its check after loading it back."""

    path: str
    format: str                     # "pt2" (torch.export) or STATE_FORMAT
    sqnr_db: float                  # the loaded file's end-to-end SQNR against the original
    matches: bool                   # within SAVED_TOLERANCE_DB of the checked model's
    stored_bytes: int               # parameters as stored in the loaded file
    predicted_bytes: int            # plan_layers' stored bytes of the quantized layers + the other parameters
    why: str | None = None          # why export could not carry it (state dict saved instead)

    def to_json(self) -> dict:
        out = {k: _finite(v) for k, v in dataclasses.asdict(self).items() if v is not None}
        out["bytes_match"] = self.stored_bytes == self.predicted_bytes
        return out


@dataclass(frozen=True)
class QuantizeResult:
    """What ``quantize`` did and measured."""

    model: str
    scheme: str
    layout: str
    inputs: tuple[dict, ...]
    weights: str | None             # the checkpoint, or None for random weights
    layers: tuple[Layer, ...]       # every nn.Linear, quantized (kept None) or kept and why
    layer_sqnr: dict                # quantized layer path -> SQNR of its output (dB)
    drift: Drift
    param_bytes: int                # before: every parameter in the model's dtype
    param_bytes_after: int          # predicted: the quantized layers as stored, the rest as they are
    saved: Saved | None = None
    budget: dict | None = None      # with a budget: its bytes, the sensitivity per candidate, the choice
    notes: tuple[str, ...] = ()
    program: Any = field(default=None, repr=False, compare=False)

    @property
    def quantized(self) -> list[str]:
        return [l.module for l in self.layers if l.kept is None]

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "model": self.model, "scheme": self.scheme, "layout": self.layout,
                "inputs": list(self.inputs), "weights": self.weights,
                "quantized": len(self.quantized), "kept": sum(1 for l in self.layers if l.kept is not None),
                "layers": [{**l.to_json(), **({"sqnr_db": _finite(self.layer_sqnr[l.module])}
                                               if l.module in self.layer_sqnr else {})} for l in self.layers],
                "param_bytes": self.param_bytes, "param_bytes_after": self.param_bytes_after,
                "drift": self.drift.to_json(), "saved": self.saved.to_json() if self.saved else None,
                "budget": self.budget, "notes": list(self.notes)}


def _finite(x):
    """JSON has no infinity: an SQNR of equal outputs is written as null."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


# --- the measures ---------------------------------------------------------------------------------

def sqnr_db(reference: torch.Tensor, quantized: torch.Tensor) -> float:
    """``10·log10(Σ ref² / Σ (ref − q)²)`` in float64; inf when they are equal."""
    r, q = reference.detach().double().flatten(), quantized.detach().double().flatten()
    noise = float(((r - q) ** 2).sum())
    signal = float((r ** 2).sum())
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def drift(reference: Sequence[torch.Tensor], quantized: Sequence[torch.Tensor]) -> Drift:
    """``quantized`` outputs against ``reference`` (both flattened by ``output_tensors``)."""
    if len(reference) != len(quantized):
        raise ArchscanError(f"the quantized model returns {len(quantized)} tensors, the original {len(reference)}")
    pairs = [(r, q) for r, q in zip(reference, quantized) if r.is_floating_point()]
    if not pairs:
        raise ArchscanError("the model returns no floating-point output to compare",
                            hint="archscan quantize checks a model's float outputs")
    for r, q in pairs:
        if r.shape != q.shape:
            raise ArchscanError(f"the quantized model returns shape {tuple(q.shape)} where the original returns {tuple(r.shape)}")
    ref = torch.cat([r.detach().double().flatten() for r, _ in pairs])
    out = torch.cat([q.detach().double().flatten() for _, q in pairs])
    norms = float(ref.norm() * out.norm())
    cosine = float(ref @ out) / norms if norms else (1.0 if torch.equal(ref, out) else 0.0)
    top1 = rows = None
    if len(pairs) == 1 and pairs[0][0].dim() == 2 and pairs[0][0].shape[1] > 1:
        r, q = pairs[0]
        rows = r.shape[0]
        top1 = float((r.argmax(1) == q.argmax(1)).double().mean())
    return Drift(sqnr_db(ref, out), cosine, float((ref - out).abs().max()), top1, rows)


def layer_outputs(model: nn.Module, paths: Sequence[str], call: Call) -> tuple[tuple[torch.Tensor, ...], dict]:
    """(the model's outputs, {path: the output of that layer}) on ``call``'s inputs, by forward hooks
    (a layer run more than once: its outputs joined)."""
    modules = dict(model.named_modules())
    seen: dict[str, list[torch.Tensor]] = {p: [] for p in paths}
    handles = [modules[p].register_forward_hook(lambda m, a, out, p=p: seen[p].append(out.detach()))
               for p in paths]
    try:
        with torch.no_grad():
            out = output_tensors(call(model))
    finally:
        for h in handles:
            h.remove()
    return out, {p: torch.cat([t.flatten() for t in ts]) for p, ts in seen.items() if ts}


# --- quantizing -----------------------------------------------------------------------------------

def quantized_copy(model: nn.Module, paths: Sequence[str], scheme: Scheme) -> nn.Module:
    """A copy of ``model`` with torchao's ``quantize_`` applied to exactly the layers at ``paths``."""
    from torchao.quantization import quantize_

    chosen = set(paths)
    q = copy.deepcopy(model)
    try:
        with _quiet_import():
            quantize_(q, config(scheme), filter_fn=lambda m, fqn: fqn in chosen and isinstance(m, nn.Linear))
    except Exception as exc:
        raise ArchscanError(f"torchao could not quantize the model as {scheme.label}: {type(exc).__name__}: {exc}",
                            hint="try another --scheme, or --keep the layer it fails on") from None
    return q


def _swap(model: nn.Module, path: str, module: nn.Module) -> nn.Module:
    """Put ``module`` at ``path`` in ``model``; returns the one that was there."""
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    old = getattr(parent, name)
    setattr(parent, name, module)
    return old


def sensitivities(model: nn.Module, paths: Sequence[str], scheme: Scheme, call: Call,
                  reference: Sequence[torch.Tensor]) -> dict[str, float]:
    """Per layer: the end-to-end SQNR of ``model`` with that layer alone quantized. The layers are
    quantized once, in a copy, and each is put into the original model in turn."""
    full = quantized_copy(model, paths, scheme)
    modules = dict(full.named_modules())
    out = {}
    for p in paths:
        old = _swap(model, p, modules[p])
        try:
            with torch.no_grad():
                out[p] = drift(reference, output_tensors(call(model))).sqnr_db
        finally:
            _swap(model, p, old)
    return out


def param_bytes(model: nn.Module) -> int:
    """Every parameter's bytes (each tensor once), as the model holds it."""
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in model.parameters()}.values())


def stored_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """The bytes of ``tensors`` as stored: a torchao weight's inner storages, each storage once."""
    return storages_nbytes(tensors)


def _check_budget(budget: int, layers: Sequence[Layer], before: int, scheme: Scheme) -> None:
    """Before anything is measured: one line when the budget cannot be met, or is met already."""
    candidates = [l for l in layers if l.kept is None]
    floor = before - sum(l.weight_bytes - l.stored_bytes for l in candidates)
    if budget < floor:
        raise ArchscanError(f"--budget {fmt_bytes(budget)} is below what quantizing every candidate layer as "
                            f"{scheme.label} reaches: {fmt_bytes(floor)} ({floor:,} bytes) of parameters",
                            hint="raise the budget or pick a scheme that stores fewer bytes; the first and last layers, "
                                 "and those --keep names, stay in high precision")
    if before <= budget:
        raise ArchscanError(f"the model's parameters ({fmt_bytes(before)}) already fit --budget {fmt_bytes(budget)}: "
                            "nothing needs quantizing", hint="drop --budget to quantize every candidate layer")


def plan_budget(layers: Sequence[Layer], sensitivity: dict[str, float], before: int, budget: int) -> list[str]:
    """The least sensitive candidates first (highest SQNR alone; ties: more bytes saved first), until
    the parameters' bytes fit ``budget``."""
    order = sorted((l for l in layers if l.kept is None),
                   key=lambda l: (-sensitivity[l.module], -(l.weight_bytes - l.stored_bytes), l.module))
    chosen, total = [], before
    for l in order:
        if total <= budget:
            break
        chosen.append(l.module)
        total -= l.weight_bytes - l.stored_bytes
    return chosen


def _nothing_to_quantize(name: str, layers: Sequence[Layer], scheme: Scheme) -> ArchscanError:
    if not layers:
        return ArchscanError(f"{name} has nothing to quantize: it has no nn.Linear layer "
                             "(torchao's configs quantize nn.Linear only)", hint="archscan quantize applies to linear layers")
    reasons = sorted({l.kept for l in layers})
    return ArchscanError(f"{name} has nothing to quantize as {scheme.label}: every nn.Linear stays in high precision "
                         f"({'; '.join(reasons[:2])}{'; ...' if len(reasons) > 2 else ''})",
                         hint="drop the --keep patterns that keep them, or try another --scheme")


def default_path(model: str, scheme: Scheme) -> str:
    """'zoo:resnet18', int4:g32 -> 'resnet18-int4-g32.pt2'."""
    return output_path(model, scheme.label.replace(":", "-"))


def state_path(path: str) -> str:
    """Where the state dict goes when export cannot carry the model: ``-o``'s name with ``.pt``."""
    return os.path.splitext(path)[0] + ".pt"


# --- the whole ------------------------------------------------------------------------------------

@isolated
def quantize(target: ModelTarget | nn.Module | str, specs: Sequence[InputSpec] | Any, scheme: Scheme | str = "int8", *,
             weights: str | None = None, keep: Sequence[str] = (), budget: int | str | None = None,
             path: str | None = None, kwargs: dict | None = None, dtype: torch.dtype | None = None,
             allow_pickle: bool = False) -> QuantizeResult:
    """Quantize the real model with torchao, check its drift against the original, save it.

    Args:
        target, specs, kwargs, dtype: as for ``archscan.scan`` (a module, class, factory or target
            string; shapes or specs).
        scheme: 'int8', 'w8a8', 'fp8', 'int4[:gN]' (``archscan.quant.schemes``), or a ``Scheme``.
        weights: a state_dict file; without it, random weights (the drift is then no verdict on
            a trained model's accuracy: ``notes`` says so).
        keep: layers kept in high precision (module paths, prefixes or regular expressions).
        budget: bytes (or '5MiB') the parameters must fit: the least sensitive layers are
            quantized first until they do.
        path: where to save (``.pt2``; a ``.pt`` state dict beside it where export cannot carry
            the model); None saves nothing.

    Raises:
        ArchscanError: an unknown scheme, torchao missing, nothing to quantize, a --keep pattern
            that matches no layer, a budget that cannot be met, an output that cannot be written.
        VerifyError: the saved file, loaded back, does not compute what was checked (removed).
    """
    scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    torchao()
    limit = parse_size(budget) if isinstance(budget, str) else budget
    if limit is not None and limit <= 0:
        raise ArchscanError(f"--budget {budget!r} is no size at all", hint="give a size above zero: 5MiB")
    if path is not None:
        check_writable(path, "-o")
    target = to_target(target, allow_pickle=allow_pickle)
    specs = list(specs) if (isinstance(specs, (list, tuple)) and specs and all(isinstance(x, InputSpec) for x in specs)) \
        else input_specs(specs, dtype)
    report = analysis(target, specs, kwargs=kwargs, dtype=dtype, rules=(), memory=False).report
    with capture_context():
        model = build_real(target, kwargs or {}, dtype, specs)
        strip_user_hooks(model)
        if weights is not None:
            from ..transform.weights import load_weights

            load_weights(model, weights)
        model.eval()
        layers = plan_layers(model, report, scheme, keep=keep)
        if not any(l.kept is None for l in layers):
            raise _nothing_to_quantize(target.name, layers, scheme)
        before = param_bytes(model)
        if limit is not None:
            _check_budget(limit, layers, before, scheme)
        call = make_call(specs, dtype)
        with torch.no_grad():
            output = call(model)
        reference = output_tensors(output)
        plan = None
        if limit is not None:
            candidates = [l.module for l in layers if l.kept is None]
            sensitivity = sensitivities(model, candidates, scheme, call, reference)
            chosen = set(plan_budget(layers, sensitivity, before, limit))
            layers = [l if l.kept is not None or l.module in chosen else
                      dataclasses.replace(l, stored_bytes=l.weight_bytes, parts={}, kept="not needed to fit --budget")
                      for l in layers]
            plan = {"bytes": limit, "sensitivity": SENSITIVITY,
                    "candidates": [{"module": p, "sqnr_db": _finite(s), "quantized": p in chosen,
                                    "bytes_saved": next(l.weight_bytes - l.stored_bytes for l in layers
                                                        if l.module == p) if p in chosen else 0}
                                   for p, s in sorted(sensitivity.items(), key=lambda kv: -kv[1])]}
        paths = [l.module for l in layers if l.kept is None]
        q = quantized_copy(model, paths, scheme)
        outputs, q_layers = layer_outputs(q, paths, call)
        _, ref_layers = layer_outputs(model, paths, call)
        checked = drift(reference, outputs)
        per_layer = {p: sqnr_db(ref_layers[p], q_layers[p]) for p in paths if p in ref_layers and p in q_layers}
        after = before - sum(l.weight_bytes - l.stored_bytes for l in layers if l.kept is None)
        if plan is not None:
            plan["param_bytes_after"] = after
        program, why = _export(q, call, specs, dtype, outputs)
        saved = None
        if path is not None:
            predicted = after
            saved = (_save_program(program, path, call, reference, checked, predicted) if program is not None
                     else _save_state(q, model, paths, scheme, target.name, state_path(path), why, call, reference,
                                      checked, predicted))
    notes = (() if weights is not None else (RANDOM_WEIGHTS,)) + ((INT4_ON_CPU,) if scheme.name == "int4" else ())
    return QuantizeResult(target.name, scheme.label, layout_of(scheme, False), tuple(s.to_json() for s in specs),
                          weights, tuple(layers), per_layer, checked, before, after, saved, plan, notes, program)


def parse_size(text: str) -> int:
    """'5MiB', '12MB', '4096B': bytes (``archscan.memory.budget.parse_budget``'s units; no GPU names)."""
    from ..memory.budget import parse_budget

    try:
        found = parse_budget(text)
    except ArchscanError:
        found = None
    if found is None or found.gpu is not None:
        raise ArchscanError(f"cannot read --budget {text!r}", hint="give a size with its unit: 5MiB, 12MB, 800KiB")
    return found.bytes


def _export(q: nn.Module, call: Call, specs, dtype, output) -> tuple[torch.export.ExportedProgram | None, str | None]:
    """The quantized model exported (a dynamic batch where it allows it), or (None, why not)."""
    from ..transform.programs import batch_call, export

    try:
        with _quiet_import():
            return export(q, call, output, "the quantized model", batch=batch_call(specs, dtype)), None
    except CaptureError as exc:
        return None, str(exc).split(" (")[0]


def _save_program(program, path: str, call: Call, reference, checked: Drift, predicted: int) -> Saved:
    """The program serialised, loaded back from those bytes with plain ``torch.export.load`` and
    checked, then written whole; a program that fails its check is never written (an earlier file
    at ``path`` is kept)."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    with _quiet_import():
        loaded = torch.export.load(buffer)
    with torch.no_grad():
        got = drift(reference, output_tensors(call(loaded.module())))
    state = loaded.state_dict
    params = [state[n] for n in loaded.graph_signature.parameters if n in state]
    saved = _judged(Saved(path, "pt2", got.sqnr_db, _same(got, checked), stored_bytes(params), predicted), checked)
    write_file(path, buffer.getbuffer(), "-o")
    return saved


def _save_state(q: nn.Module, model: nn.Module, paths: Sequence[str], scheme: Scheme, name: str, path: str,
                why: str | None, call: Call, reference, checked: Drift, predicted: int) -> Saved:
    """Where export cannot carry the model: its state dict and what rebuilds it (``STATE_FORMAT``),
    loaded back into a freshly quantized copy of the model and checked."""
    from torchao.quantization import quantize_

    data = {"format": STATE_FORMAT, "model": name, "scheme": scheme.label, "config": repr(config(scheme)),
            "quantized": list(paths), "state_dict": q.state_dict()}
    buffer = io.BytesIO()
    torch.save(data, buffer)
    buffer.seek(0)
    back = torch.load(buffer, map_location="cpu", weights_only=True)
    fresh = copy.deepcopy(model)
    chosen = set(back["quantized"])
    with _quiet_import():
        quantize_(fresh, config(parse_scheme(back["scheme"])), filter_fn=lambda m, fqn: fqn in chosen)
    fresh.load_state_dict(back["state_dict"], assign=True)
    with torch.no_grad():
        got = drift(reference, output_tensors(call(fresh)))
    saved = _judged(Saved(path, STATE_FORMAT, got.sqnr_db, _same(got, checked), stored_bytes(list(fresh.parameters())),
                          predicted, why), checked)
    write_file(path, buffer.getbuffer(), "-o")
    return saved


def _same(got: Drift, checked: Drift) -> bool:
    if math.isinf(got.sqnr_db) or math.isinf(checked.sqnr_db):
        return got.sqnr_db == checked.sqnr_db
    return abs(got.sqnr_db - checked.sqnr_db) <= SAVED_TOLERANCE_DB


def _judged(saved: Saved, checked: Drift) -> Saved:
    """A file that, loaded back, does not compute what was checked is not written, and the command fails."""
    if saved.matches:
        return saved
    raise VerifyError(f"the saved file, loaded back, drifts {saved.sqnr_db:.2f} dB SQNR from the original where the "
                      f"checked model drifts {checked.sqnr_db:.2f} dB; {saved.path} was not written",
                      hint="report the model: the export changed what it computes")


# --- text -----------------------------------------------------------------------------------------

def _db(x: float) -> str:
    return "exact" if math.isinf(x) and x > 0 else f"{x:.1f} dB"


def quantize_text(result: QuantizeResult, width: int = 100) -> str:
    """The result as the command prints it: the layers (a table), then the drift, the budget's plan,
    what was saved and the notes, each wrapped to ``width``."""
    from tabulate import tabulate

    head = [f"archscan quantize: {result.model} as {result.scheme} ({result.layout}), "
            + (f"weights {result.weights}" if result.weights else "random weights"),
            f"quantized {len(result.quantized)} of {len(result.layers)} linear layers; parameters "
            f"{fmt_bytes(result.param_bytes)} -> {fmt_bytes(result.param_bytes_after)} as stored"]
    rows = [[l.module, f"{l.in_features}x{l.out_features}", fmt_bytes(l.weight_bytes), fmt_bytes(l.stored_bytes),
             _db(result.layer_sqnr[l.module]) if l.module in result.layer_sqnr else "-",
             "quantized" if l.kept is None else f"kept: {l.kept}"] for l in result.layers]
    table = tabulate(rows, headers=["layer", "in x out", "weight", "stored", "output SQNR", ""],
                     disable_numparse=True, colalign=("left", "right", "right", "right", "right", "left"))
    d = result.drift
    top1 = f", top-1 agreement {d.top1:.1%} of {d.rows} rows" if d.top1 is not None else ""
    tail = [f"end to end: SQNR {_db(d.sqnr_db)}, cosine {d.cosine:.6f}, max abs error {d.max_abs_err:.3g}{top1}"]
    if result.budget is not None:
        b = result.budget
        tail.append(f"budget {fmt_bytes(b['bytes'])}: {sum(c['quantized'] for c in b['candidates'])} of "
                    f"{len(b['candidates'])} candidate layers quantized, least sensitive first, and the parameters "
                    f"({fmt_bytes(b['param_bytes_after'])}) fit; sensitivity: {SENSITIVITY}")
        tail += [f"  {c['module']}: {_db(c['sqnr_db']) if c['sqnr_db'] is not None else 'exact'} alone, "
                 + (f"quantized (saves {fmt_bytes(c['bytes_saved'])})" if c["quantized"] else "kept")
                 for c in b["candidates"]]
    s = result.saved
    if s is not None:
        if s.format == "pt2":
            tail.append(f"saved {s.path} (torch.export: torch.export.load(path).module() runs it; torchao must be installed)")
        else:
            tail.append(f"export could not carry the model ({s.why}): saved its state dict instead, {s.path} "
                        f"({STATE_FORMAT}, see docs/quantization.md)")
        tail.append(f"  loaded back: SQNR {_db(s.sqnr_db)}, the checked model's within {SAVED_TOLERANCE_DB} dB; "
                    f"parameters as stored {s.stored_bytes:,} bytes"
                    + (", as predicted" if s.stored_bytes == s.predicted_bytes
                       else f", predicted {s.predicted_bytes:,}: they differ"))
    tail += [f"note: {note}" for note in result.notes]
    return "\n".join([*_wrapped(head, width), "", table, "", *_wrapped(tail, width)])


def _wrapped(lines: Sequence[str], width: int) -> list[str]:
    return [w for line in lines for w in (textwrap.wrap(line, width, subsequent_indent="    ") or [""])]


__all__ = ["SAVED_TOLERANCE_DB", "SCHEMA", "STATE_FORMAT", "Drift", "QuantizeResult", "Saved", "default_path",
           "drift", "layer_outputs", "param_bytes", "parse_size", "plan_budget", "quantize", "quantize_text",
           "quantized_copy", "sensitivities", "sqnr_db", "state_path", "stored_bytes"]
