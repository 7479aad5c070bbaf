"""Recommendations: the concrete changes that answer the findings, ranked by the time they save.

Findings are the diagnosis; a recommendation is one change (fold every conv-bn pair, rewrite the
attention, compile, ...) with what it saves, how that was estimated, and the command or Python
call that applies it. Several findings that one change answers make one recommendation, and one
command is one recommendation: ``archscan fuse`` folds the batch norms and rewrites the attention
in one run, so a model with both gets one ``fuse`` recommendation saving both.

``apply`` is one thing to paste: a shell command (``archscan ...``) that runs as printed, or
Python code; a way to measure it or an alternative by hand is in the reason. Every command writes
its own file (``-o``, or ``path=`` in Python): two recommendations never write the same path (the
second prune cut writes NAME-pruned-2.pt2).

What a command promises is what it does: ``fuse`` counts the norms ``archscan fuse`` folds (not
those after a conv whose weight another call reads, a linear with a 3-D output, a grouped
transposed conv: they stay, and the reason says how many), and its saving is what ``archscan fuse``
then measures on the two programs (the attention part counts the score matrix's traffic; the
kernel that replaces it may write a little besides, such as a log-sum-exp per row on CPU).

Savings (``estimated_saving``): ``mac_bytes`` moved, ``flops`` (multiply-adds), ``params``,
``kernels`` launched, and ``ms`` when a time can be given:

- ``measured``: the measured latency of the nodes the change removes (``--measure``);
- ``predicted``: the calibrated roofline of the device (``archscan calibrate``): the removed
  nodes' predicted time, or the bytes saved over the op class's bandwidth plus the kernels saved
  times its per-call overhead;
- ``mac``: no time; bytes moved only.

Ranking, in four tiers, each by the time saved where there is one (measured or predicted),
then the bytes saved:

1. changes that keep what the model computes, applicable here (fuse, SDPA, compile,
   channels_last, low precision, the hygiene fixes, the memory plans);
2. changes after which the model computes nearly the same, within a drift to check (``APPROXIMATE``:
   int8 weight-only quantization, ``quantize.py``);
3. changes that need the model trained again (``RETRAINING``: prune, distill, channel alignment),
   however much they save;
4. changes the scan knows cannot be applied as printed here: the model's torch.export failed in
   this scan (the capture notes say so) and ``archscan fuse``, ``prune`` and ``distill`` work on
   the exported graph. ``fuse`` (and its attention rewrite) stays, its reason saying why and its
   ``apply`` the change by hand; ``prune`` and ``distill``, whose programs cannot be written
   without export, are left out.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shlex
from collections import Counter
from typing import Callable

from ..measure.predict import kernels
from ..results import NodeReport, Recommendation, Report, export_failure
from ..rules.context import RuleContext, dtype_size
from ..rules.hygiene import conv_bn_pairs, elementwise_links
from .attention import attention_patterns
from .memory import memory_recommendations
from .quantize import quantize_recommendations

Recommender = Callable[["Context"], list[Recommendation]]


@dataclasses.dataclass
class Context:
    """What every recommender sees."""

    report: Report          # with its findings
    rules: RuleContext      # the node graph (built once for the rules and reused)
    profile: object | None  # a DeviceProfile, when one predicts latency
    command: str            # how to name the model and inputs on the command line ('' for a Python object)
    target: object | None = None   # the ModelTarget, inputs, constructor kwargs and dtype: recommenders
    specs: tuple = ()              # that build variants of the model (prune, distill) need them
    kwargs: dict | None = None
    dtype: object | None = None
    model: object | None = None    # the scan's fake (or meta) copy of the model: variants are built from it
    grouping: object | None = None # its channel groups when the capture found them (archscan.prune.Grouping)
    graph: object | None = None    # the fx graph of its direct run: a cut copy runs it without a trace
    export_failed: str | None = None  # why torch.export failed on the model in this scan (``export_failure``)

    def cited(self, *rules: str) -> tuple[dict, ...]:
        """The findings of these rules, as {"rule", "module"} references."""
        return tuple({"rule": f.rule, "module": f.module} for f in self.report.findings if f.rule in rules)

    def fuse_command(self) -> str:
        """The command that folds batch norms and rewrites attention for this model."""
        if not self.command:
            return "archscan.fuse(model, inputs, path='model-fused.pt2')"
        from ..load.targets import output_path

        return f"archscan fuse {self.command} -o {shlex.quote(output_path(self.report.model))}"

    def scan_command(self, flags: str, measure: str = "True") -> str:
        """The scan of this model with ``flags`` added (for a Python object: ``measure=`` as given)."""
        return f"archscan {self.command} {flags}" if self.command else f"archscan.scan(model, inputs, measure={measure})"

    def measured(self, nodes: list[NodeReport]) -> float | None:
        times = [n.latency_ms for n in nodes]
        return sum(times) if times and all(t is not None for t in times) else None

    def saving(self, removed: list[NodeReport], *, mac_bytes: int, kernels_saved: int, flops: int = 0,
               params: int = 0, category: str = "elementwise", whole_nodes: bool = True) -> tuple[dict, str]:
        """(estimated_saving, basis). ``whole_nodes``: ``removed`` disappear entirely (their measured
        or predicted time is the saving); otherwise only ``mac_bytes`` and ``kernels_saved`` do."""
        saving = {"mac_bytes": int(mac_bytes), "flops": int(flops), "params": int(params), "kernels": int(kernels_saved)}
        if whole_nodes and removed and (ms := self.measured(removed)) is not None:
            return {"ms": ms, **saving}, "measured"
        if self.profile is not None:
            if whole_nodes and removed and all(n.predicted_ms is not None for n in removed):
                ms = sum(n.predicted_ms for n in removed)
            else:
                ms = mac_bytes / self.profile.bandwidth_for(category) * 1e3 + kernels_saved * self.profile.overhead_for(category)
            return {"ms": ms, **saving}, "predicted"
        return saving, "mac"


def _where(nodes: list[NodeReport]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.module or n.name for n in nodes))


def foldable_pairs(ctx: Context) -> tuple[list[tuple[NodeReport, NodeReport, NodeReport | None]], Counter]:
    """(the conv/linear + batch-norm pairs ``archscan fuse`` folds, {why: count} of those it keeps).

    ``conv_bn_pairs`` finds a norm on a layer output nothing else reads; ``fuse`` also keeps the
    norm when the layer's weight is read by another call (one conv applied twice, tied weights:
    folding one call's norm into it would change the other), when a linear's output is 3-D or
    larger (the norm's channels are not its features) and after a grouped transposed conv
    (``archscan.transform.fold``)."""
    shared = _shared_weights(ctx)
    pairs, kept = [], Counter()
    for layer, bn, act in conv_bn_pairs(ctx.rules):
        if layer.name in shared:
            kept["their layer's weight is read by another call too"] += 1
        elif "out_features" in layer.attrs and (layer.out_shape is None or len(layer.out_shape) != 2):
            kept["after a linear with a 3-D or larger output"] += 1
        elif layer.attrs.get("transposed") and layer.attrs.get("groups", 1) != 1:
            kept["after a grouped transposed conv"] += 1
        else:
            pairs.append((layer, bn, act))
    return pairs, kept


def _shared_weights(ctx: Context) -> set[str]:
    """The conv/linear nodes whose weight another node reads too: a module called more than once,
    parameters tied between modules (the scan's copy of the model shows which), a layer that counts
    fewer parameters than its weight has (they were counted at another reader), and in a graph of
    aten ops every layer reading the same attribute as such a one (``attrs["shared_inputs"]``)."""
    layers = [n for n in ctx.report.nodes if n.category in _LAYERS]
    calls = Counter(n.module for n in layers if n.module and n.module_type == n.op)  # fx: one node per module call
    shared = {n.name for n in layers if n.module_type == n.op and calls[n.module] > 1}
    tied = _tied_modules(ctx.model) if ctx.model is not None else set()
    shared |= {n.name for n in layers if n.module in tied}
    readers: dict[str, list[NodeReport]] = {}
    for n in layers:
        for name in n.attrs.get("shared_inputs") or ():
            readers.setdefault(name, []).append(n)
        if (numel := _weight_numel(n)) is not None and n.params < numel:  # its weight was counted at another reader
            shared.add(n.name)
    for group in readers.values():  # a model input several layers read is not a weight: none lacks parameters
        if len(group) > 1 and any(n.name in shared for n in group):
            shared |= {n.name for n in group}
    return shared


_LAYERS = ("conv", "grouped_conv", "depthwise_conv", "linear")


def _tied_modules(model) -> set[str]:
    """Module paths whose parameters another module holds too (the same module registered twice
    counts: it is one weight under two paths)."""
    owners: dict[int, set[str]] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        for p in module._parameters.values():
            if p is not None:
                owners.setdefault(id(p), set()).add(path)
    return {path for paths in owners.values() if len(paths) > 1 for path in paths}


def _fuse(ctx: Context) -> list[Recommendation]:
    """The batch norms folded and the hand-written attention rewritten by one ``archscan fuse`` run:
    one recommendation (kind ``fuse``; ``sdpa`` when there is only attention)."""
    pairs, kept = foldable_pairs(ctx)
    patterns = attention_patterns(ctx.rules)
    if not pairs and not patterns:
        return []
    savings, reasons, findings = [], [], ()
    norms = [bn for _, bn, _ in pairs]
    if pairs:
        added = [(layer, _channels(layer)) for layer, _, _ in pairs if not _has_bias(layer)]
        bias_bytes = sum(c * dtype_size(layer.dtype) for layer, c in added)  # the new biases are read
        savings.append(ctx.saving(norms, mac_bytes=sum(n.mac_bytes for n in norms) - bias_bytes,
                                  kernels_saved=sum(map(kernels, norms)),
                                  params=_norm_params(ctx, norms) - sum(c for _, c in added), category="norm"))
        with_act = sum(1 for *_, act in pairs if act is not None)
        reasons.append(f"fold {len(pairs)} batch norm(s) into the conv/linear before them: {len(norms)} fewer kernels, "
                       f"their reads and writes gone"
                       + (f" ({with_act} activations after them stay separate ops)" if with_act else ""))
        findings += ctx.cited("fuse-conv-bn")
    if kept:
        reasons.append(f"{sum(kept.values())} {'more' if pairs else 'batch norm(s)'} stay: "
                       + "; ".join(f"{why} ({n})" for why, n in kept.items()))
    if patterns:
        removed = [n for p in patterns for n in p.elementwise]
        savings.append(ctx.saving(removed, mac_bytes=sum(p.mac_bytes for p in patterns),
                                  kernels_saved=sum(p.kernels_saved for p in patterns), category="elementwise"))
        largest = max(patterns, key=lambda p: p.scores_bytes)
        reasons.append(f"{'and rewrite ' if pairs else ''}{len(patterns)} hand-written attention(s) "
                       f"{'that ' if pairs else ''}write and re-read the {largest.scores_shape} score matrix "
                       f"{largest.round_trips} times: F.scaled_dot_product_attention never stores it "
                       "(in your own code: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=...))")
        findings += ctx.cited("G4")
    saving, basis = _together(savings)
    target = tuple(dict.fromkeys([*_where(norms), *(p.module for p in patterns)]))
    reason = "; ".join(reasons)
    apply = ctx.fuse_command()
    if ctx.export_failed is not None:
        reason = (f"archscan fuse cannot apply this here: torch.export failed on this model in this scan "
                  f"({_shortened(ctx.export_failed)}), and fuse works on the exported graph; by hand: {reason}")
        apply = _by_hand(pairs, patterns)
    return [Recommendation(kind="fuse" if pairs else "sdpa", target=target, reason=reason, estimated_saving=saving, basis=basis,
                           apply=apply, findings=findings)]


def _together(savings: list[tuple[dict, str]]) -> tuple[dict, str]:
    """Savings of the parts of one change added up; the basis of the least certain part."""
    order = ("mac", "predicted", "measured")
    basis = min((b for _, b in savings), key=order.index)
    total: dict = {}
    for saving, _ in savings:
        for k, v in saving.items():
            total[k] = total.get(k, 0) + v
    if basis == "mac":
        total.pop("ms", None)
    return total, basis


def _shortened(why: str) -> str:
    return why if len(why) <= 120 else why[:117].rstrip() + "..."


def _by_hand(pairs, patterns) -> str:
    """How to make the change in the model's own code, for a model ``archscan fuse`` cannot export."""
    code = []
    if pairs:
        code.append("conv = torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn) for each pair, "
                    "and the norm replaced by torch.nn.Identity()")
    if patterns:
        code.append("softmax(q @ k.transpose(-2, -1) * scale + mask) @ v written as "
                    "F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale) in forward")
    return "\n".join(code)


def _norm_params(ctx: Context, norms: list[NodeReport]) -> int:
    """Parameters that go with the folded norms: a norm module's are counted at its first call, and go
    only when none of its calls stays."""
    folded = {n.name for n in norms}
    staying = {n.module for n in ctx.report.nodes
               if n.category == "norm" and n.module and n.module_type == n.op and n.name not in folded}
    return sum(n.params for n in norms if not (n.module_type == n.op and n.module in staying))


def _channels(layer: NodeReport) -> int:
    return int(layer.attrs.get("out_channels", layer.attrs.get("out_features", 0)))


def _weight_numel(layer: NodeReport) -> int | None:
    """Elements of the layer's weight, from its attributes (None when they do not say)."""
    a = layer.attrs
    if "out_features" in a and "in_features" in a:
        return a["in_features"] * a["out_features"]
    if "kernel" in a and "out_channels" in a and "in_channels" in a:
        weight = a["out_channels"] * a["in_channels"] // max(1, a.get("groups", 1))
        for k in a["kernel"]:
            weight *= k
        return weight
    return None


def _has_bias(layer: NodeReport) -> bool:
    """Does the layer have a bias (then folding adds no parameters)? Its params exceed its weight's."""
    weight = _weight_numel(layer)
    return True if weight is None else layer.params > weight


def _compile(ctx: Context) -> list[Recommendation]:
    # what fuse already removes: folded norms, the ops inside hand-written attention
    taken = {bn.name for _, bn, _ in foldable_pairs(ctx)[0]}
    taken |= {n.name for p in attention_patterns(ctx.rules) for n in p.elementwise}
    links = [(a, b) for a, b in elementwise_links(ctx.rules) if a.name not in taken and b.name not in taken]
    if not links:
        return []
    consumers = list({b.name: b for _, b in links}.values())
    saved = sum(2 * a.write_bytes for a, _ in links)
    saving, basis = ctx.saving(consumers, mac_bytes=saved, kernels_saved=len(consumers), category="elementwise",
                               whole_nodes=False)
    return [Recommendation(
        kind="compile", target=_where(consumers),
        reason=f"{len(links)} element-wise op(s) read a temporary only they read: torch.compile fuses each chain "
               "into one kernel that never writes it",
        estimated_saving=saving, basis=basis, apply="model = torch.compile(model)",
        findings=ctx.cited("G4", "inplace"),
    )]


def _low_precision(ctx: Context) -> list[Recommendation]:
    found = [f for f in ctx.report.findings if f.rule == "low-precision"]
    if not found:
        return []
    nodes = [n for n in ctx.report.nodes if n.dtype == "float32" and n.category in
             ("conv", "grouped_conv", "depthwise_conv", "linear", "matmul", "attention")]
    saved_bytes = sum(n.mac_bytes for n in nodes) // 2
    saving = {"mac_bytes": saved_bytes, "flops": 0, "params": 0, "kernels": 0}
    basis = "mac"
    if ctx.profile is not None and nodes:
        from ..measure.predict import as_run, predict_node

        before = sum(predict_node(n, ctx.profile)[0] for n in nodes)
        after = sum(predict_node(as_run(n, "bf16"), ctx.profile)[0] for n in nodes)
        saving, basis = {"ms": max(0.0, before - after), **saving}, "predicted"
    decode = (ctx.report.phases or {}).get("decode")
    if decode:  # a decode step: its bf16 twin is analysed the same way (a measurement would time a forward
        named = getattr(ctx.profile, "created", "").startswith("datasheet")  # without the cache)
        profile = f" --device-profile {ctx.profile.name.split(' (')[0]}" if named else ""
        check = ("analyse the step in it: " + (f"archscan {ctx.command} --decode {decode['context']} --dtype bf16{profile}"
                                              if ctx.command else
                                              f"archscan.scan(model, inputs, decode={decode['context']}, dtype='bfloat16')"))
    else:
        check = "measure it: " + ctx.scan_command("--measure --amp bf16", "archscan.measure.MeasureOptions(amp='bf16')")
    return [Recommendation(
        kind="low-precision", target=("",),
        reason=f"run the conv/linear/matmul work in bfloat16: {len(nodes)} layers move half the bytes "
               "(and use tensor cores on a GPU); " + check,
        estimated_saving=saving, basis=basis,
        apply=f"with torch.autocast({_device_type(ctx)!r}, dtype=torch.bfloat16): model(x)",
        findings=ctx.cited("low-precision"),
    )]


def _device_type(ctx: Context) -> str:
    """The device the scan was about: the one measured or predicted, else a GPU when there is one, else the CPU."""
    import torch

    measured = (ctx.report.latency or {}).get("device") or getattr(ctx.profile, "device", None)
    return str(measured).split(":")[0] if measured else ("cuda" if torch.cuda.is_available() else "cpu")


def _channels_last(ctx: Context) -> list[Recommendation]:
    found = [f for f in ctx.report.findings if f.rule == "channels-last"]
    if not found:
        return []
    f = found[0]
    saving: dict = {"mac_bytes": 0, "flops": 0, "params": 0, "kernels": 0}
    basis = "mac"
    if "latency_ms" in f.saving:
        saving, basis = {"ms": f.saving["latency_ms"], **saving}, "measured"
    return [Recommendation(
        kind="channels-last", target=("",),
        reason=f.message if basis == "measured" else
        f"{f.message}; not measured here (measure it: "
        f"{ctx.scan_command('--measure --sweep', 'archscan.measure.MeasureOptions(sweep=True)')})",
        estimated_saving=saving, basis=basis,
        apply="model = model.to(memory_format=torch.channels_last); x = x.to(memory_format=torch.channels_last)",
        findings=ctx.cited("channels-last"),
    )]


PRUNE_RATIO = 0.3   # the cut a prune recommendation proposes (the CLI's default --ratio)
PRUNE_SHOWN = 2     # prune recommendations made (the groups saving most); `archscan prune --list` has all
# Variants of the model (pruned, student) are counted by scanning them. A scan makes them only for
# models torch.fx traces (a variant then costs about 0.06 s in a direct run; one that needs torch.export, seconds)
# with up to this many nodes (ResNet-101 has 345, ViT-L/16 298); for the others:
# `archscan prune --list`, `archscan distill`.
VARIANT_NODE_LIMIT = 800


def _variants_affordable(ctx: Context) -> bool:
    return ctx.report.capture == "fx" and len(ctx.report.nodes) <= VARIANT_NODE_LIMIT


def _prune(ctx: Context) -> list[Recommendation]:
    """The channel groups whose cut saves most, counted exactly on a cut copy of the model."""
    if ctx.target is None or ctx.model is None or getattr(ctx.target, "program", False) \
            or not _variants_affordable(ctx) or ctx.export_failed is not None:  # the pruned program is exported
        return []
    from ..errors import ArchscanError
    from ..load.building import on_meta
    from ..prune import analyse, params_removed, plan, predict, totals
    from ..load.targets import output_path

    try:
        grouping = ctx.grouping if ctx.grouping is not None else \
            analyse(ctx.target, ctx.specs, ctx.kwargs, ctx.dtype, model=ctx.model)
    except ArchscanError:
        return []  # the scan stands without it
    cuts = plan(grouping, PRUNE_RATIO)
    cuts.sort(key=lambda c: -params_removed(c[0], len(c[1]), grouping.param_shapes, grouping.buffers))
    before = totals(ctx.report)
    recs = []
    for cut in cuts[:2 * PRUNE_SHOWN]:
        try:  # counted once: a cut the model's code rejects does not run, and is not recommended
            after = predict(ctx.target, ctx.specs, [cut], ctx.kwargs, ctx.dtype, ctx.profile, ctx.model,
                            quick=on_meta(ctx.model), graph=ctx.graph)  # the model ran directly: so does a cut of it
        except ArchscanError:
            continue
        group, channels = cut
        saving = {k: before[k] - after[k] for k in ("mac_bytes", "flops", "params", "kernels")}
        basis, note = "mac", "time not predicted (no device profile: archscan calibrate)"
        if "predicted_ms" in after and "predicted_ms" in before:
            saving = {"ms": before["predicted_ms"] - after["predicted_ms"], **saving}
            basis = "predicted"
            time_share = saving["ms"] / before["predicted_ms"] if before["predicted_ms"] else 0.0
            flops_share = saving["flops"] / before["flops"] if before["flops"] else 0.0
            note = (f"predicted time -{100 * time_share:.1f}%"
                    + (" only: its layers are memory- or overhead-bound, so FLOPs fall but time does not; "
                       "it will not pay" if flops_share > 0 and time_share < 0.5 * flops_share else ""))
        modules = group.modules
        kept = group.channels - len(channels)
        recs.append(Recommendation(
            kind="prune", target=tuple(modules),
            reason=(f"cut channel group {group.id} from {group.channels} to {kept} channels (ratio {PRUNE_RATIO}, "
                    f"multiples of 8) across {len(modules)} layers made by {', '.join(p.rpartition('.')[0] for p in group.producers[:3])}"
                    f"{' ...' if len(group.producers) > 3 else ''}: FLOPs -{100 * saving['flops'] / max(1, before['flops']):.1f}%, "
                    f"{note}; channels chosen structurally (pass --weights for importance); fine-tune afterwards"),
            estimated_saving=saving, basis=basis,
            apply=(f"archscan prune {ctx.command} --group {group.id} --ratio {PRUNE_RATIO} -o "
                   f"{shlex.quote(output_path(ctx.report.model, 'pruned'))}" if ctx.command else
                   f"from archscan.prune import prune; prune(model, inputs, group_ids=[{group.id}], "
                   f"ratio={PRUNE_RATIO}, path='model-pruned.pt2')"),
            findings=tuple({"rule": f.rule, "module": f.module} for f in ctx.report.findings
                           if f.rule in ("G1", "G2") and f.module in modules),
        ))
        if len(recs) == PRUNE_SHOWN:
            break
    return recs


def _distill(ctx: Context) -> list[Recommendation]:
    """Smaller students to distill into (``archscan.distill``): at most two, estimated from the report."""
    if not _variants_affordable(ctx) or ctx.export_failed is not None:  # the student is saved with torch.export
        return []
    from ..distill import distill_recommendations  # late: keeps importing archscan.recommend light

    return distill_recommendations(ctx, ctx.target, ctx.specs, ctx.kwargs, ctx.dtype)


def _reparameterize(ctx: Context) -> list[Recommendation]:
    """Multi-branch blocks folded into one convolution each (the ``reparameterize`` finding): the
    call the model's own code offers (timm's ``reparameterize_model``, a block's
    ``reparameterize()`` or ``switch_to_deploy()``), else the fold by hand."""
    found = [f for f in ctx.report.findings if f.rule == "reparameterize"]
    if not found:
        return []
    f = found[0]
    from ..rules.reparam import branch_sums

    sums = branch_sums(ctx.rules)
    removed = [n for s in sums for n in s.nodes if n is not s.deployed]
    saving = {"mac_bytes": int(f.saving["mac_bytes"]), "flops": int(f.saving["flops"]), "params": 0,
              "kernels": int(f.saving["kernels"])}
    basis = "mac"
    if ctx.profile is not None and all(n.predicted_ms is not None for n in ctx.report.nodes):
        built = sum(n.predicted_ms for s in sums for n in s.nodes)
        deployed = sum(s.deployed.predicted_ms for s in sums)
        saving, basis = {"ms": max(0.0, built - deployed), **saving}, "predicted"
    elif (ms := ctx.measured(removed)) is not None:
        saving, basis = {"ms": ms, **saving}, "measured"
    methods = {name for m in (ctx.model.modules() if ctx.model is not None else ())
               for name in ("reparameterize", "switch_to_deploy") if callable(getattr(m, name, None))}
    timm = ctx.model is not None and type(ctx.model).__module__.startswith("timm.")
    if timm:
        apply = "model = timm.utils.reparameterize_model(model)"
    elif methods:
        method = sorted(methods)[0]
        apply = f"[m.{method}() for m in model.modules() if hasattr(m, {method!r})]"
    else:
        apply = f.fix
    return [Recommendation(
        kind="reparameterize", target=tuple(dict.fromkeys(s.module for s in sums)), reason=f.message,
        estimated_saving=saving, basis=basis, apply=apply, findings=({"rule": f.rule, "module": f.module},))]


def _from_finding(rule: str, kind: str, apply: str, ms_key: str | None = None) -> Recommender:
    """A recommendation per finding of ``rule``, saving what the finding says it saves."""

    def recommend(ctx: Context) -> list[Recommendation]:
        out = []
        by_name = {n.name: n for n in ctx.report.nodes}
        for f in ctx.report.findings:
            if f.rule != rule:
                continue
            nodes = [by_name[name] for name in f.evidence.get("nodes", []) if name in by_name]
            saving = {"mac_bytes": int(f.saving.get("mac_bytes", 0)), "flops": 0,
                      "params": int(f.saving.get("params", 0)), "kernels": len(nodes)}
            basis, ms = "mac", None
            if ms_key is not None and ms_key in f.saving:
                basis, ms = "measured", float(f.saving[ms_key])
            elif nodes and (measured := ctx.measured(nodes)) is not None:
                basis, ms = "measured", measured
            out.append(Recommendation(
                kind=kind, target=(f.module,), reason=f.message, estimated_saving=({"ms": ms} if ms is not None else {}) | saving,
                basis=basis, apply=f.fix if apply == "fix" else apply, findings=({"rule": f.rule, "module": f.module},),
            ))
        return out

    return recommend


# Rules are data: one table of recommenders, run in this order (the ranking decides what is shown first).
RECOMMENDERS: dict[str, Recommender] = {
    "fuse": _fuse,  # and sdpa: one archscan fuse run does both
    "compile": _compile,
    "low-precision": _low_precision,
    "channels-last": _channels_last,
    "prune": _prune,
    "distill": _distill,
    "quantize": quantize_recommendations,  # int8 weight-only where reading weights bounds the time
    "reparameterize": _reparameterize,
    "host-sync": _from_finding("host-sync", "host-sync", "fix"),
    "host-tensor": _from_finding("host-tensor", "buffer", "fix"),
    "remove-unused": _from_finding("unused-module", "remove-unused", "fix"),
    "pin-memory": _from_finding("input-transfer", "pin-memory", "fix", ms_key="latency_ms"),
    "align": _from_finding("channel-align", "align", "fix"),
    "eval": _from_finding("no-grad", "eval", "fix"),
    "memory": memory_recommendations,  # batch-size, checkpoint, fused-optimizer, amp, in-place (with --memory)
}


def _merged(recs: list[Recommendation]) -> list[Recommendation]:
    """One recommendation per change: the same kind, reason and apply line found at several places
    (a host sync on six source lines) is one, its targets, findings and savings together."""
    out: dict[tuple, Recommendation] = {}
    for r in recs:
        key = (r.kind, r.reason, r.apply)
        if key not in out:
            out[key] = r
            continue
        first = out[key]
        saving = {k: first.estimated_saving.get(k, 0) + v if isinstance(v, (int, float)) else v
                  for k, v in r.estimated_saving.items()}
        out[key] = dataclasses.replace(first, target=tuple(dict.fromkeys(first.target + r.target)),
                                       findings=tuple({json.dumps(f, sort_keys=True): f for f in first.findings + r.findings}.values()),
                                       estimated_saving={**first.estimated_saving, **saving})
    return list(out.values())


# Changes after which the model computes something else, to be trained (or fine-tuned) again: ranked
# after every change that keeps what it computes, however much they save.
RETRAINING = frozenset({"prune", "distill", "align"})
# Changes after which the model computes nearly the same, within a drift to check: ranked between the two.
APPROXIMATE = frozenset({"quantize"})
# Changes whose command works on torch.export's graph of the model.
NEEDS_EXPORT = frozenset({"fuse", "sdpa", "prune", "distill"})


# Where an apply line names the file it writes: (pattern, the path from the match, the path as written there).
_OUTPUTS = (
    (re.compile(r"(?<= -o )(?:'[^']*'|\S)+"), lambda word: shlex.split(word)[0], shlex.quote),  # a shell word
    (re.compile(r"(?<=path=)'[^']*'"), ast.literal_eval, repr),                                # a Python string
)


def _distinct_outputs(recs: list[Recommendation]) -> list[Recommendation]:
    """Every output file written by one recommendation only: a later one that would overwrite an
    earlier one's (two prune cuts, two students) writes NAME-2.pt2 (-3, ...) instead."""
    taken: set[str] = set()
    out = []
    for r in recs:
        found = next(((m, read, write) for pattern, read, write in _OUTPUTS if (m := pattern.search(r.apply))), None)
        if found is None:
            out.append(r)
            continue
        match, read, write = found
        path = read(match.group(0))
        stem, dot, ext = path.rpartition(".")
        new, i = path, 1
        while new in taken:
            i += 1
            new = f"{stem}-{i}.{ext}" if dot else f"{path}-{i}"
        taken.add(new)
        out.append(r if new == path else
                   dataclasses.replace(r, apply=r.apply[:match.start()] + write(new) + r.apply[match.end():]))
    return out


def _rank_key(r: Recommendation, ctx: Context) -> tuple:
    """Applicable here first, then needing no retraining; within a tier by time saved, then bytes."""
    ms = r.estimated_saving.get("ms")
    bytes_saved = r.estimated_saving.get("mac_bytes", 0) + max(r.estimated_saving.get("peak_bytes", 0), 0)
    blocked = ctx.export_failed is not None and r.kind in NEEDS_EXPORT
    tier = 2 if r.kind in RETRAINING else 1 if r.kind in APPROXIMATE else 0
    return (blocked, tier, ms is None, -(ms or 0.0), -bytes_saved, -r.estimated_saving.get("kernels", 0))


def recommend(report: Report, profile=None, command: str | None = None, rules: RuleContext | None = None,
              target=None, specs=(), kwargs: dict | None = None, dtype=None, model=None, grouping=None,
              graph=None) -> Report:
    """The report with ``recommendations`` filled in, best first.

    Args:
        profile: the ``DeviceProfile`` that predicted latency, if any.
        command: the model and inputs as ``archscan`` takes them ('zoo:resnet50 --input 1,3,224,224');
            None derives it from the report (a Python object gets Python calls instead).
        target, specs, kwargs, dtype, model: the model (the scan's fake copy) and how it was built,
            for the recommenders that count a changed copy of it (prune, distill); without them
            they propose nothing.
        grouping: the model's channel groups, when the scan found them (else they are found here).
        graph: the fx graph of the scan's direct run (``archscan.capture``), which cut copies run.
    """
    ctx = Context(report, rules or RuleContext(report), profile,
                  command if command is not None else command_of(report, kwargs),
                  target, tuple(specs), kwargs, dtype, model, grouping, graph, export_failure(report))
    recs = _merged([r for recommender in RECOMMENDERS.values() for r in recommender(ctx)])
    recs.sort(key=lambda r: _rank_key(r, ctx))
    return dataclasses.replace(report, recommendations=tuple(_distinct_outputs(recs)))


def command_of(report: Report, kwargs: dict | None = None) -> str:
    """'MODEL --input ... [--kwargs ...] [--dtype ...]' for a report whose model is a command-line
    target, else '': every apply line built on it acts on the model the report is about."""
    from ..load.specs import spec_text

    model = report.model
    if ":" not in model and not model.endswith(".pt2"):
        return ""
    parts = [shlex.quote(model)]
    for spec in report.inputs:
        dtype = spec["dtype"] if spec["dtype"] != "float32" and spec["dtype"] != report.dtype else "float32"
        values = spec.get("values") if isinstance(spec.get("values"), list) else None
        parts += ["--input", shlex.quote(spec_text(spec["shape"], dtype, spec.get("name"), values))]
    if kwargs:
        parts += ["--kwargs", shlex.quote(",".join(f"{k}={_literal(v)}" for k, v in kwargs.items()))]
    if report.dtype != "float32":
        parts += ["--dtype", report.dtype]
    return " ".join(parts)


def _literal(value) -> str:
    """A constructor argument as ``--kwargs`` reads it back (a bare word as written, else its repr)."""
    return str(value) if type(value).__name__ == "BareWord" else repr(value)


__all__ = ["APPROXIMATE", "NEEDS_EXPORT", "RECOMMENDERS", "RETRAINING", "Recommendation", "command_of", "export_failure",
           "foldable_pairs", "recommend"]
