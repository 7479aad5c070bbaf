"""Pruning: coupled channel groups found on fake tensors, cut by module surgery, checked and saved.

``analyse`` finds the groups (``groups.py``) on a fake copy of the model; ``plan`` chooses the
channels a ratio cuts (multiples of 8 kept; by importance with real weights, else the last
channels); ``predict`` applies the cut to a meta-device copy and counts it with archscan's own
analysis; ``prune`` applies it to the real model, checks that it runs, counts it again (the
counts equal the prediction: same shapes) and saves a ``.pt2``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ..analysis import analyse as analyse_model
from ..load.building import build_fake, build_real, copy_holding, make_call, on_meta, strip_user_hooks
from ..capture import capture_context
from ..capture.direct import Direct
from ..errors import ArchscanError, CaptureError
from ..load.frames import at, short
from ..isolation import isolated
from ..load.targets import InputSpec, ModelTarget, input_specs, to_target
from ..measure.predict import predicted, report_totals as totals
from .groups import ChannelGroup, Grouping, find_groups
from .surgery import apply_cuts

ALIGN = 8            # channel counts kept at multiples of this (tensor cores, vector units)
MIN_CHANNELS = 16    # smaller groups are left alone
DEFAULT_RATIOS = (0.25, 0.5)


def fake_model(target: ModelTarget, specs, kwargs=None, dtype=None) -> nn.Module:
    """The model built once on fake tensors, for the grouping and every cut copy counted after it
    (``meta_copy``): the user's constructor runs once."""
    with capture_context():
        model = build_fake(target, kwargs or {}, dtype, FakeTensorMode(allow_non_fake_inputs=True), specs)
        strip_user_hooks(model)
    return model


def analyse(target: ModelTarget, specs: Sequence[InputSpec], kwargs: dict | None = None,
            dtype: torch.dtype | None = None, model: nn.Module | None = None) -> Grouping:
    """The model's coupled channel groups, found on fake tensors (no weights, nothing computed).

    ``model``: a copy already built (a scan's: fake, or meta after a direct run), used
    instead of building another.
    """
    if model is not None:
        fake_mode = next((t.fake_mode for t in model.parameters() if hasattr(t, "fake_mode")), None)
        if fake_mode is not None:
            with capture_context():
                return find_groups(model, make_call(specs, dtype, fake_mode), fake_mode)
        if on_meta(model):  # a direct run's model
            try:
                with capture_context():
                    return find_groups(model, make_call(specs, dtype), Direct())
            except Exception:
                pass  # found on fake tensors, below
    with capture_context():
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        model = build_fake(target, kwargs or {}, dtype, fake_mode, specs)
        strip_user_hooks(model)
        call = make_call(specs, dtype, fake_mode)
        try:
            return find_groups(model, call, fake_mode)
        except ArchscanError:
            raise
        except Exception as exc:
            raise CaptureError(f"the model failed while its channels were traced{at(exc, target.source_file)}: "
                               f"{short(exc)}") from exc


def kept_channels(channels: int, ratio: float) -> int:
    """Channels left after cutting ``ratio`` of ``channels``: ``channels * (1 - ratio)`` rounded up
    to a multiple of ALIGN (a cut never exceeds the ratio asked for), at least ALIGN."""
    if not 0 <= ratio < 1:
        raise ArchscanError(f"--ratio {ratio} is not a fraction to cut", hint="use a number in [0, 1), e.g. 0.3")
    if channels < MIN_CHANNELS:
        return channels
    keep = max(ALIGN, math.ceil(round(channels * (1 - ratio), 6) / ALIGN) * ALIGN)
    return min(keep, channels)


def prunable(grouping: Grouping) -> list[ChannelGroup]:
    return [g for g in grouping.groups if g.pinned is None and g.channels >= MIN_CHANNELS]


def importance(group: ChannelGroup, model: nn.Module | None) -> np.ndarray | None:
    """Per channel: the L2 norms of the producing layers' filters plus |gamma| of the norms in the
    group, summed over the group. None without real weights."""
    if model is None:
        return None
    tensors = dict(model.named_parameters(remove_duplicate=False))
    score = np.zeros(group.channels)
    for (param, dim), idx in group.indices.items():
        t = tensors.get(param)
        if t is None or t.is_meta:
            continue
        w = t.detach().float().movedim(dim, 0)
        if param in group.producers and w.dim() > 1:
            per = w.reshape(w.shape[0], -1).norm(dim=1).cpu().numpy()
        elif w.dim() == 1 and param.endswith("weight"):
            per = w.abs().cpu().numpy()   # a norm's gamma
        else:
            continue
        score += per[idx].sum(axis=1)
    return score


def plan(grouping: Grouping, ratio: float, group_ids: Sequence[int] | None = None,
         model: nn.Module | None = None) -> list[tuple[ChannelGroup, np.ndarray]]:
    """(group, channel positions to cut) for every chosen group: the least important channels
    with real weights, else the last ones."""
    chosen = prunable(grouping) if group_ids is None else [_get(grouping, i) for i in group_ids]
    cuts = []
    for g in chosen:
        n_cut = g.channels - kept_channels(g.channels, ratio)
        if n_cut <= 0:
            continue
        score = importance(g, model)
        order = np.argsort(score, kind="stable") if score is not None else np.arange(g.channels)[::-1]
        cuts.append((g, np.sort(order[:n_cut])))
    return cuts


def _get(grouping: Grouping, gid: int) -> ChannelGroup:
    try:
        g = grouping.group(gid)
    except KeyError:
        raise ArchscanError(f"no channel group {gid}", hint=f"groups are 0..{len(grouping.groups) - 1}: "
                            "`archscan prune MODEL --list` shows them") from None
    if g.pinned is not None:
        raise ArchscanError(f"channel group {gid} cannot be cut: {g.pinned}",
                            hint="`archscan prune MODEL --list` shows the groups that can")
    if g.channels < MIN_CHANNELS:
        raise ArchscanError(f"channel group {gid} has {g.channels} channels, too few to cut (fewer than {MIN_CHANNELS})")
    return g


def params_removed(group: ChannelGroup, n_cut: int, shapes: dict[str, tuple], buffers=frozenset()) -> int:
    """Parameters a cut of ``n_cut`` channels of ``group`` removes, exactly (``buffers``: the
    names not to count, running statistics)."""
    by_param: dict[str, dict[int, int]] = {}
    for (param, dim), idx in group.indices.items():
        if param in buffers:
            continue
        by_param.setdefault(param, {})[dim] = n_cut * idx.shape[1]
    removed = 0
    for param, dims in by_param.items():
        shape = list(shapes[param])
        after = [s - dims.get(d, 0) for d, s in enumerate(shape)]
        removed += math.prod(shape) - math.prod(after)
    return removed


def cuttable(target: ModelTarget, specs, cuts, kwargs=None, dtype=None,
             model: nn.Module | None = None) -> tuple[list, dict[int, str], dict]:
    """The cuts the model's code accepts, why each other one does not run, and the totals of the
    model with the accepted cuts: all at once first, else one group at a time (a layer that checks
    its width, such as nn.MultiheadAttention)."""
    try:
        return cuts, {}, predict(target, specs, cuts, kwargs, dtype, model=model)
    except ArchscanError:
        pass
    ok, refused = [], {}
    for cut in cuts:
        try:
            predict(target, specs, [cut], kwargs, dtype, model=model)
            ok.append(cut)
        except ArchscanError as exc:
            refused[cut[0].id] = str(exc)
    return ok, refused, predict(target, specs, ok, kwargs, dtype, model=model) if ok else {}


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of a (fake) model with every parameter and buffer on the meta device: building
    variants of it runs no constructor of the user's."""
    memo: dict = {}
    with torch._C.DisableTorchFunction():  # a build's modes (the meta device, skipped initialisers) have nothing to do here
        for t in [*model.parameters(), *model.buffers()]:
            if id(t) not in memo:
                meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
                memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy_holding(model, memo, lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"))


def pruned_target(target: ModelTarget, cuts, model: nn.Module | None = None) -> ModelTarget:
    """A target that builds the model and cuts it: on the meta device when archscan analyses it
    (from ``model``, a fake or meta copy, when given: no constructor runs again)."""
    if model is not None:
        def build(**_):
            copy_ = meta_copy(model)
            apply_cuts(copy_, cuts)
            return copy_
    elif target.instance is not None:
        def build(**_):
            model = copy.deepcopy(target.instance)
            apply_cuts(model, cuts)
            return model
    else:
        def build(**kw):
            model = target.build(kw)
            apply_cuts(model, cuts)
            return model
    return ModelTarget(f"{target.name} (pruned)", build, source_file=target.source_file)


def predict(target: ModelTarget, specs, cuts, kwargs=None, dtype=None, profile=None,
            model: nn.Module | None = None, quick: bool = False, graph=None) -> dict:
    """Totals of the cut model, counted by archscan's analysis of a meta-device copy; ``quick``:
    in a direct run only (``capture(method="direct")``), failing where that cannot count it, of
    ``graph`` when given (the uncut model's fx graph: fx calls the cut torch.nn layers, so a cut
    copy traces to the same graph)."""
    try:
        report = predicted(analyse_model(pruned_target(target, cuts, model), specs,
                                         kwargs=kwargs if model is None else None, dtype=dtype, memory=False,
                                         capture_method="direct" if quick else "auto", graph=graph), profile)
    except ArchscanError as exc:
        raise ArchscanError(f"the cut model does not run: {exc}",
                            hint="the model's code fixes a shape these channels feed; cut other groups (--group)") from None
    return totals(report)


@dataclass(frozen=True)
class PruneResult:
    model: str
    ratio: float
    groups: tuple[dict, ...]      # per cut group: id, channels, kept, members, importance
    before: dict
    predicted: dict
    after: dict                   # counted on the real pruned model
    importance: str               # "weights" or "structural"
    weights: str | None
    latency: dict | None = None
    path: str | None = None
    program: Any = field(default=None, repr=False, compare=False)
    left_out: tuple[dict, ...] = ()   # groups not cut because the model's code rejects the cut

    def to_json(self) -> dict:
        return {"schema": "archscan.prune/1", "left_out": list(self.left_out), "model": self.model, "ratio": self.ratio, "importance": self.importance,
                "weights": self.weights, "before": self.before, "predicted": self.predicted, "after": self.after,
                "groups": list(self.groups), "path": self.path,
                **({"latency": self.latency} if self.latency is not None else {})}


def describe(g: ChannelGroup, sources: dict[str, str] | None = None) -> dict:
    """A group as JSON: members (module paths and source lines), channels, why it is pinned."""
    sources = sources or {}
    return {"id": g.id, "channels": g.channels, "pinned": g.pinned,
            "producers": [p.rpartition(".")[0] for p in g.producers],
            "members": [{"module": m, "source": sources.get(m)} for m in g.modules]}


@isolated
def prune(target: ModelTarget | nn.Module | str, specs: Sequence[InputSpec] | Any, *, ratio: float = 0.3,
          group_ids: Sequence[int] | None = None,
          kwargs: dict | None = None, dtype: torch.dtype | None = None, weights: str | None = None,
          path: str | None = None, device: torch.device | None = None, allow_pickle: bool = False) -> PruneResult:
    """Cut ``ratio`` of the chosen groups' channels (all prunable groups by default) from the real
    model, check it runs, count it, save it.

    ``target`` and ``specs`` take what ``archscan.scan`` takes: a module, class, factory or target
    string, and shapes or specs. ``group_ids`` are the ids ``archscan prune --list`` shows.
    Thread-safe and state-keeping as ``archscan.scan`` (``archscan.isolation``); ``allow_pickle``
    as for it.
    """
    from ..transform.programs import batch_call, export, latency_ab, save_program
    from ..transform.weights import load_weights

    kept_channels(MIN_CHANNELS, ratio)  # the ratio is checked before anything is built
    target = to_target(target, allow_pickle=allow_pickle)
    specs = input_specs(specs, dtype) if not (isinstance(specs, (list, tuple)) and specs
                                                 and all(isinstance(x, InputSpec) for x in specs)) else list(specs)
    fake = fake_model(target, specs, kwargs, dtype)
    grouping = analyse(target, specs, kwargs, dtype, model=fake)
    with capture_context():
        model = build_real(target, kwargs or {}, dtype, specs)
        strip_user_hooks(model)
        if weights is not None:
            load_weights(model, weights)
        original = copy.deepcopy(model) if device is not None else None
        cuts = plan(grouping, ratio, group_ids, model if weights is not None else None)
        if not cuts:
            raise ArchscanError(f"nothing to cut at --ratio {ratio}",
                                hint="no group can be cut (see `archscan prune MODEL --list`), or the ratio keeps every channel")
        refused: dict[int, str] = {}
        if group_ids is None:  # every group: leave out those the model's code does not accept cut
            cuts, refused, predicted = cuttable(target, specs, cuts, kwargs, dtype, fake)
            if not cuts:
                raise ArchscanError("no group can be cut without breaking the model's code: "
                                    + "; ".join(f"group {g}: {why}" for g, why in list(refused.items())[:2]))
        else:
            predicted = predict(target, specs, cuts, kwargs, dtype, model=fake)
        before_report = analyse_model(pruned_target(target, [], fake), specs, dtype=dtype, memory=False)
        apply_cuts(model, cuts)
        call = make_call(specs, dtype)
        try:
            with torch.no_grad():
                output = call(model)
        except Exception as exc:
            raise CaptureError(f"the pruned model does not run{at(exc, target.source_file)}: {short(exc)}",
                               hint="the model's code fixes a shape these channels feed; cut other groups (--group)") from exc
        after = totals(analyse_model(model, specs, dtype=dtype, name=target.name, memory=False))
        program = export(model, call, output, "the pruned model", batch=batch_call(specs, dtype))
    sources = _sources(before_report)
    groups = tuple({**describe(g, sources), "kept": g.channels - len(c), "cut": len(c)} for g, c in cuts)
    result = PruneResult(target.name, ratio, groups, totals(before_report), predicted, after,
                         "weights" if weights is not None else "structural", weights, program=program,
                         left_out=tuple({"id": g, "why": why} for g, why in refused.items()))
    if device is not None:
        result = dataclasses.replace(result, latency=latency_ab(original, program, call, device))
    if path is not None:
        save_program(program, path)
        result = dataclasses.replace(result, path=path)
    return result


def group_table(target: ModelTarget, specs, kwargs=None, dtype=None, ratios: Sequence[float] = DEFAULT_RATIOS,
                profile=None) -> tuple[Grouping, list[dict]]:
    """Every group with its layers (module paths, source lines) and, for each ratio, what cutting
    it alone saves: params, FLOPs, MAC and (with a device profile) predicted ms, counted exactly
    on a cut meta copy; ``pays`` False where FLOPs fall but predicted time does not."""
    for r in ratios:
        kept_channels(MIN_CHANNELS, r)
    model = fake_model(target, specs, kwargs, dtype)
    grouping = analyse(target, specs, kwargs, dtype, model=model)
    base = predicted(analyse_model(pruned_target(target, [], model), specs, dtype=dtype, memory=False), profile)
    before, sources = totals(base), _sources(base)
    rows = []
    for g in grouping.groups:
        row = describe(g, sources)
        row["cuts"] = []
        if g in prunable(grouping):
            for r in ratios:
                cut = plan(grouping, r, [g.id])
                if not cut:
                    continue
                try:
                    after = predict(target, specs, cut, dtype=dtype, profile=profile, model=model)
                except ArchscanError as exc:
                    row["refused"] = str(exc)
                    break
                saved = {k: before[k] - after[k] for k in ("params", "flops", "mac_bytes")}
                entry = {"ratio": r, "kept": g.channels - len(cut[0][1]), **saved}
                if "predicted_ms" in after:
                    entry["ms"] = before["predicted_ms"] - after["predicted_ms"]
                    time_share = entry["ms"] / before["predicted_ms"] if before["predicted_ms"] else 0.0
                    flops_share = saved["flops"] / before["flops"] if before["flops"] else 0.0
                    entry["pays"] = not (flops_share > 0 and time_share < 0.5 * flops_share)
                row["cuts"].append(entry)
        rows.append(row)
    return grouping, rows


def _sources(report) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in report.nodes:
        if n.source and n.module and n.module not in out:
            out[n.module] = n.source
    return out


__all__ = ["ALIGN", "analyse", "describe", "kept_channels", "plan", "predict", "prunable", "prune", "PruneResult"]
