"""Distillation targets: which stages to shrink, and the students that shrink them.

**Stages** are the model's top-level children that run something; **stacks** are the outermost
``nn.Sequential``/``nn.ModuleList`` modules (``layer3``, ``features``, a ViT's
``encoder.layers``; the model itself when it is an ``nn.Sequential``), and their children other
than plain ``torch.nn`` layers are **blocks** (``layer3.1``, ``features.7``). ``stage_ranking``
scores stages and blocks by how much more time they take than their FLOPs suggest, plus the
guideline findings (G1-G4) inside them::

    score = time_share - flops_share + findings_bytes / model_mac_bytes + 0.01 * findings

``time_share`` is the module's share of the measured node latency (``--measure``), else of the
predicted latency (a calibrated profile), else of the bytes moved (MAC). A block that takes 40%
of the time for 10% of the FLOPs scores 0.3: its work is memory- or overhead-bound, and a
student that removes it saves more time than its FLOPs promise. ``findings`` counts the
guideline findings that name a module inside it (a G3 finding naming five blocks counts once in
each block, and once in the stage holding them); ``findings_bytes`` is the MAC a G1/G2 finding
says its one layer wastes (G3 and G4 findings name several places and count without bytes).

**Students** (``Student``) are proposals, each a recipe applied to the teacher module:

- ``depth``: a run of repeated blocks in a stack (consecutive blocks of one type, each after the
  first keeping the shape the one before it produced) keeps its first ``ceil(n / 2)`` blocks;
  the survivors keep their names, so ``student.load_state_dict(teacher.state_dict(),
  strict=False)`` still lines up. Shape-changing first blocks stay.
- ``shuffle-unit``: one block with ``[N, C, H, W]`` input and output becomes a ShuffleNetV2 unit
  (``ShuffleUnit``) with the same shapes, when the unit has fewer parameters than the block.

A student's priority is the summed score of the modules it removes or replaces. ``PROPOSERS``
is the table of student kinds, each a function of a ``Teacher`` view: fewer blocks (depth), a
ShuffleNetV2 unit (shuffle-unit), a uniform width cut of the stage's channel groups (width, when
the view carries the model's ``grouping``).
"""

from __future__ import annotations

import copy
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from ..results import ModuleReport, NodeReport, Report, module_and_ancestors

GUIDELINE_RULES = ("G1", "G2", "G3", "G4")
FINDING_WEIGHT = 0.01   # one guideline finding counts as 1% of the model's time
STACKS = ("Sequential", "ModuleList")  # containers whose blocks run one after another


# --- what every proposer sees ---------------------------------------------------------------------------

class Teacher:
    """The teacher's report with the indexes proposers need, built once: modules by path, their
    children, the nodes under each module, the outermost stacks, and the stage ranking."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.modules: dict[str, ModuleReport] = {m.path: m for m in report.modules}
        self._children: dict[str, list[ModuleReport]] = defaultdict(list)
        for m in report.modules:  # registration order: a Sequential's execution order
            if m.path:
                self._children[m.path.rpartition(".")[0]].append(m)
        self._nodes: dict[str, list[NodeReport]] = defaultdict(list)
        for n in report.nodes:
            for path in module_and_ancestors(n.module):
                self._nodes[path].append(n)
        self.stacks = [m for m in report.modules if m.type in STACKS and m.container and m.nodes and not any(
            self.modules[p].container for p in module_and_ancestors(m.path)[:-1] if p and p in self.modules)]
        if "" in self.modules and self.modules[""].type == "Sequential":
            self.stacks = [self.modules[""]]  # the model is a stack: its children are the blocks
        self.ranking = stage_ranking(report, self)
        self.scores = {s.path: s for s in self.ranking}

    def nodes(self, path: str) -> list[NodeReport]:
        """Every node under ``path`` (its whole subtree), in graph order."""
        return self._nodes.get(path, [])

    def children(self, path: str) -> list[ModuleReport]:
        return self._children.get(path, [])

    def blocks(self, stack: str) -> list[ModuleReport]:
        """A stack's children that run and are not plain torch.nn layers (a Conv2d, a ReLU)."""
        return [m for m in self.children(stack) if m.nodes and (m.container or not m.builtin)]

    def runs(self, stack: str) -> list[list[ModuleReport]]:
        """Runs of repeated blocks: consecutive blocks of one type, each after the first reading
        the block before it (not parallel heads of a ModuleList) and keeping its shape."""
        runs: list[list[ModuleReport]] = []
        current: list[ModuleReport] = []
        for child in self.children(stack):
            if not (child.nodes and (child.container or not child.builtin)):
                current = []  # a plain layer, or a block that did not run, ends a run
            elif (current and child.type == current[0].type and child.out_shape == current[-1].out_shape
                  and self.feeds(current[-1].path, child.path)):
                current.append(child)
            else:
                current = [child]
                runs.append(current)
        return runs

    def feeds(self, a: str, b: str) -> bool:
        """Does a node under ``b`` read a node under ``a``?"""
        produced = {n.name for n in self.nodes(a)}
        return any(src in produced for n in self.nodes(b) for src in n.inputs)

    def input_shape(self, path: str) -> tuple[int, ...] | None:
        """The shape a module's nodes read from outside it: one producer's output; else (the
        model's input, read directly) a conv's recorded input shape or the model's only input."""
        nodes = self.nodes(path)
        if not nodes:
            return None
        inside = {n.name for n in nodes}
        outside = {src for n in nodes for src in n.inputs if src not in inside}
        if len(outside) == 1:
            return self.report.node(outside.pop()).out_shape
        if outside:
            return None
        if nodes[0].attrs.get("in_shape"):
            return tuple(nodes[0].attrs["in_shape"])
        return tuple(self.report.inputs[0]["shape"]) if len(self.report.inputs) == 1 else None


# --- ranking -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageScore:
    """One stage or block, scored as a distillation target (see the module docstring)."""

    path: str
    type: str
    kind: str                  # "stage" (a top-level child) or "block" (a child of a stack)
    flops_share: float
    time_share: float          # of the measured or predicted time, else of the bytes moved
    basis: str                 # measured | predicted | mac
    findings: tuple[tuple[str, str], ...]  # (rule, finding's module) of the guideline findings inside
    findings_bytes: int
    findings_mac_share: float  # findings_bytes / the model's MAC

    @property
    def excess(self) -> float:
        """Share of the model's time (or bytes) the module takes beyond its share of the FLOPs."""
        return self.time_share - self.flops_share

    @property
    def score(self) -> float:
        return self.excess + self.findings_mac_share + FINDING_WEIGHT * len(self.findings)


def time_basis(report: Report) -> str:
    """measured | predicted | mac: what a module's time share is a share of."""
    if any(n.latency_ms is not None for n in report.nodes):
        return "measured"
    if report.nodes and all(n.predicted_ms is not None for n in report.nodes):
        return "predicted"
    return "mac"


def _time(nodes: list[NodeReport], basis: str) -> float:
    if basis == "measured":
        return sum(n.latency_ms or 0.0 for n in nodes)
    if basis == "predicted":
        return sum(n.predicted_ms for n in nodes)
    return float(sum(n.mac_bytes for n in nodes))


def _finding_places(report: Report) -> list[tuple[tuple[str, ...], str, str, int]]:
    """(places, rule, finding's module, bytes) per guideline finding: the modules it names (G3:
    its blocks; G4: the blocks with the most element-wise bytes; G1, G2: the layer) and, for a
    finding about one layer, the bytes it says are wasted there."""
    out = []
    for f in report.findings:
        if f.rule not in GUIDELINE_RULES:
            continue
        places = tuple(f.evidence.get("blocks") or [b["block"] for b in f.evidence.get("top_blocks", [])])
        if places:  # several places: counted in each module it touches, without bytes
            out.append((places, f.rule, f.module, 0))
        else:
            out.append(((f.module,), f.rule, f.module, int(f.saving.get("mac_bytes", 0))))
    return out


def _inside(place: str, path: str) -> bool:
    return not path or place == path or place.startswith(path + ".")


def candidate_modules(view: Teacher) -> list[tuple[ModuleReport, str]]:
    """(module, "stage" | "block"): top-level children that run something, and the stacks' blocks."""
    out = {m.path: (m, "stage") for m in view.report.modules if m.depth == 1 and m.nodes}
    for stack in view.stacks:
        for b in view.blocks(stack.path):
            out.setdefault(b.path, (b, "block"))
    return list(out.values())


def stage_ranking(report: Report, view: Teacher | None = None) -> list[StageScore]:
    """Stages and blocks, best distillation target first (the score: see the module docstring)."""
    if view is None:
        return Teacher(report).ranking
    basis = time_basis(report)
    total_time = _time(list(report.nodes), basis) or 1.0
    total_flops, total_mac = report.totals.flops, report.totals.mac_bytes or 1
    places = _finding_places(report)
    scores = []
    for m, kind in candidate_modules(view):
        inside = [(rule, module, nbytes) for where, rule, module, nbytes in places
                  if any(_inside(place, m.path) for place in where)]
        nbytes = sum(b for *_, b in inside)
        scores.append(StageScore(
            path=m.path, type=m.type, kind=kind, flops_share=m.flops / total_flops if total_flops else 0.0,
            time_share=_time(view.nodes(m.path), basis) / total_time, basis=basis,
            findings=tuple((rule, module) for rule, module, _ in inside), findings_bytes=nbytes,
            findings_mac_share=nbytes / total_mac))
    scores.sort(key=lambda s: (-s.score, s.path))
    return scores


def describe_share(scores: list[StageScore]) -> str:
    """'layer4.1 takes 36% of the bytes moved for 13% of the FLOPs; 1 G3 finding'."""
    if not scores:
        return ""
    what = {"measured": "of the measured time", "predicted": "of the predicted time", "mac": "of the bytes moved"}
    names = ", ".join(s.path for s in scores[:3]) + (f" (+{len(scores) - 3})" if len(scores) > 3 else "")
    verb = "takes" if len(scores) == 1 else "take"
    text = (f"{names} {verb} {100 * sum(s.time_share for s in scores):.0f}% {what[scores[0].basis]} for "
            f"{100 * sum(s.flops_share for s in scores):.0f}% of the FLOPs")
    rules = Counter(rule for s in scores for rule, _ in s.findings)
    if rules:
        text += "; " + ", ".join(f"{n} {rule} finding{'s' if n > 1 else ''}" for rule, n in sorted(rules.items()))
    return text


# --- the ShuffleNetV2 unit ------------------------------------------------------------------------------

ConvBN = tuple[int, int, int, int, int, bool]  # in channels, out channels, kernel, stride, groups, ReLU after


def unit_layers(in_channels: int, out_channels: int, stride: int) -> dict[str, list[ConvBN]]:
    """The conv-BN(-ReLU) layers of a ``ShuffleUnit`` per branch: what it builds and what
    ``unit_params`` counts."""
    if stride == 1:
        half = in_channels // 2
        project = [(in_channels, out_channels, 1, 1, 1, True)] if out_channels != in_channels else []
        return {"branch1": [],  # the split-off half passes through
                "branch2": [(half, half, 1, 1, 1, True), (half, half, 3, 1, half, False), (half, half, 1, 1, 1, True)],
                "project": project}
    left, right = out_channels // 2, out_channels - out_channels // 2
    return {"branch1": [(in_channels, in_channels, 3, 2, in_channels, False), (in_channels, left, 1, 1, 1, True)],
            "branch2": [(in_channels, right, 1, 1, 1, True), (right, right, 3, 2, right, False), (right, right, 1, 1, 1, True)],
            "project": []}


def _conv_bn(c_in: int, c_out: int, kernel: int = 1, stride: int = 1, groups: int = 1, relu: bool = True) -> list:
    layers = [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(c_out)]
    return layers + [nn.ReLU(inplace=True)] if relu else layers


def _conv_bns(layers: list[ConvBN]) -> nn.Sequential:
    return nn.Sequential(*(m for spec in layers for m in _conv_bn(*spec)))


def channel_shuffle(x: torch.Tensor, groups: int = 2) -> torch.Tensor:
    """(N, g*c, H, W) -> view (N, g, c, H, W) -> transpose (N, c, g, H, W) -> (N, g*c, H, W)."""
    return x.unflatten(1, (groups, -1)).transpose(1, 2).flatten(1, 2)


class ShuffleUnit(nn.Module):
    """A ShuffleNetV2 unit (Ma et al., "ShuffleNet V2: Practical Guidelines for Efficient CNN
    Architecture Design", ECCV 2018, Fig. 3c/d) with a given input and output shape.

    Stride 1 (Fig. 3c): split the channels in half, one half through 1x1 conv-BN-ReLU, 3x3
    depthwise conv-BN, 1x1 conv-BN-ReLU, concat with the other half, shuffle; when the output
    channels differ from the input's, a final 1x1 conv-BN-ReLU maps them.
    Stride 2 (Fig. 3d): both branches see the whole input (3x3 depthwise stride 2, then 1x1; and
    1x1, 3x3 depthwise stride 2, 1x1), concat to the output channels, shuffle.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        """Args:
        in_channels: input channels (even for stride 1).
        out_channels: output channels (even for stride 2).
        stride: 1 (same H, W) or 2 (H, W halved, rounding up).
        """
        super().__init__()
        if not can_shuffle(in_channels, out_channels, stride):
            raise ValueError(f"no ShuffleNetV2 unit maps {in_channels} to {out_channels} channels at stride {stride}")
        self.stride = stride
        branches = unit_layers(in_channels, out_channels, stride)
        self.branch1, self.branch2 = _conv_bns(branches["branch1"]), _conv_bns(branches["branch2"])
        self.project = _conv_bns(branches["project"]) if branches["project"] else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)  # (N, C/2, H, W) each
            out = channel_shuffle(torch.cat((x1, self.branch2(x2)), dim=1))
        else:
            out = channel_shuffle(torch.cat((self.branch1(x), self.branch2(x)), dim=1))  # (N, C_out, H/2, W/2)
        return self.project(out) if self.project is not None else out


def can_shuffle(in_channels: int, out_channels: int, stride: int) -> bool:
    """Stride 1 splits the input channels in half; stride 2 shuffles two equal output halves."""
    if stride == 1:
        return in_channels >= 2 and in_channels % 2 == 0
    return stride == 2 and out_channels >= 2 and out_channels % 2 == 0


def unit_stride(in_shape, out_shape) -> int | None:
    """1 or 2 for a [N, C, H, W] -> [N, C', H', W'] block a ShuffleUnit can replace, else None."""
    if not in_shape or not out_shape or len(in_shape) != 4 or len(out_shape) != 4 or in_shape[0] != out_shape[0]:
        return None
    (h, w), (h2, w2) = in_shape[2:], out_shape[2:]
    if (h2, w2) == (h, w):
        return 1 if can_shuffle(in_shape[1], out_shape[1], 1) else None
    if (h2, w2) == (math.ceil(h / 2), math.ceil(w / 2)) and (h, w) != (1, 1):
        return 2 if can_shuffle(in_shape[1], out_shape[1], 2) else None
    return None


def unit_params(in_channels: int, out_channels: int, stride: int) -> int:
    """Parameters of a ``ShuffleUnit``, counted from ``unit_layers``: each conv's weight (no
    bias) and its batch norm's weight and bias."""
    return sum(c_out * (c_in // groups) * kernel * kernel + 2 * c_out
               for layers in unit_layers(in_channels, out_channels, stride).values()
               for c_in, c_out, kernel, _, groups, _ in layers)


# --- students ------------------------------------------------------------------------------------------

Recipe = Callable[[nn.Module], nn.Module]


@dataclass(frozen=True)
class Student:
    """A proposed student: what changes, and the recipe that makes it from the teacher module."""

    id: str                            # "depth:layer3:1", "shuffle:layer2.1"
    kind: str                          # depth | shuffle-unit | width (``PROPOSERS``)
    description: str
    changed: tuple[str, ...]           # teacher module paths removed or replaced
    recipe: Recipe = field(repr=False, compare=False)  # changes the module it is given, in place, and returns it
    priority: float = 0.0              # summed stage score of ``changed``
    why: str = ""                      # what the ranking saw in ``changed``
    # teacher -> student module whose outputs correspond, where a path alone does not tell
    pairs: tuple[tuple[str, str], ...] = ()
    # the new module's place: (path, input shape, output shape, stride), for ``estimate``
    unit: tuple | None = field(default=None, repr=False)

    def build(self, teacher: nn.Module) -> nn.Module:
        """The student, made from a deep copy of ``teacher`` (left untouched)."""
        return self.recipe(copy.deepcopy(teacher))


def _drop_recipe(stack: str, names: tuple[str, ...]) -> Recipe:
    def recipe(model: nn.Module) -> nn.Module:
        container = model.get_submodule(stack)
        if not isinstance(container, (nn.Sequential, nn.ModuleList)):
            raise TypeError(f"{stack or 'the model'} is a {type(container).__name__}, not an nn.Sequential or nn.ModuleList")
        for name in names:
            del container._modules[name]  # the survivors keep their names (and state_dict keys)
        return model

    return recipe


def _last(path: str) -> str:
    return path.rpartition(".")[2]


def depth_students(view: Teacher) -> list[Student]:
    """Per run of two or more repeated blocks: keep the first ceil(n / 2), drop the rest."""
    out = []
    for stack in view.stacks:
        children = view.children(stack.path)
        runs = view.runs(stack.path)
        for run in runs:
            if len(run) < 2:
                continue
            keep = math.ceil(len(run) / 2)
            dropped = run[keep:]
            names = tuple(_last(m.path) for m in dropped)
            if stack.type == "ModuleList" and names != tuple(_last(c.path) for c in children[-len(names):]):
                continue  # a ModuleList is indexed by position: only its last entries can go
            label = (stack.path or "model") if len(run) == len(children) else \
                f"{stack.path + '.' if stack.path else ''}{_last(run[0].path)}-{_last(run[-1].path)}"
            changed = tuple(m.path for m in dropped)
            scored = [view.scores[p] for p in changed if p in view.scores]
            out.append(Student(
                id=f"depth:{label}:{keep}", kind="depth",
                description=f"{label}: keep {keep} of {len(run)} {run[0].type} blocks (drop {', '.join(changed)})",
                changed=changed, recipe=_drop_recipe(stack.path, names),
                priority=sum(s.score for s in scored), why=describe_share(scored),
                # the run's output now comes from its last kept block (the last run's is the stack's)
                pairs=((run[-1].path, run[keep - 1].path),) if run is not runs[-1] else ()))
    return out


def _replace_recipe(path: str, in_channels: int, out_channels: int, stride: int) -> Recipe:
    def recipe(model: nn.Module) -> nn.Module:
        parent, _, name = path.rpartition(".")
        owner = model.get_submodule(parent)
        old = getattr(owner, name)
        unit = ShuffleUnit(in_channels, out_channels, stride)
        ref = next((t for t in (*old.parameters(), *old.buffers()) if t.is_floating_point()), None)
        if ref is not None:  # on the block's device (meta, when built without weights) and in its dtype
            unit = unit.to(device=ref.device, dtype=ref.dtype)
        setattr(owner, name, unit)
        return model

    return recipe


def _channels_first(view: Teacher, path: str, channels: int) -> bool:
    """Is dim 1 of the block's input its channels? Its first convolution reads that many channels
    (a block with no convolution, or one that reads another dim, holds its channels elsewhere)."""
    convs = [n for n in view.nodes(path) if "in_channels" in n.attrs]
    return bool(convs) and convs[0].attrs["in_channels"] == channels


def shuffle_students(view: Teacher) -> list[Student]:
    """Per block (or top-level module of its own) with [N, C, H, W] input and output (its first
    convolution reads dim 1: a channels-last block gets none): a ShuffleUnit with the same
    shapes, when it has fewer parameters than the block."""
    out = []
    for s in view.ranking:
        m = view.modules[s.path]
        if m.builtin and not m.container or s.kind == "stage" and m.container:
            continue  # a plain layer is no block; whole stacks are shortened (depth), not replaced
        in_shape = view.input_shape(s.path)
        stride = unit_stride(in_shape, m.out_shape)
        if stride is None or unit_params(in_shape[1], m.out_shape[1], stride) >= m.params:
            continue
        if not _channels_first(view, s.path, in_shape[1]):
            continue  # its dim 1 is not its channels (a channels-last stage: N, H, W, C)
        c_in, c_out = in_shape[1], m.out_shape[1]
        out.append(Student(
            id=f"shuffle:{s.path}", kind="shuffle-unit",
            description=f"{s.path}: {m.type} -> ShuffleNetV2 unit ({c_in}->{c_out} channels, stride {stride})",
            changed=(s.path,), recipe=_replace_recipe(s.path, c_in, c_out, stride), priority=s.score,
            why=describe_share([s]), pairs=((s.path, s.path),),
            unit=(s.path, tuple(in_shape), tuple(m.out_shape), stride)))
    return out


Proposer = Callable[[Teacher], list[Student]]

# Student kinds are data: one proposer per kind, in this order on equal priority.
WIDTH_RATIO = 0.5  # the uniform width cut a width student makes inside a stage


def width_students(view: Teacher) -> list[Student]:
    """Per ranked stage or block: every prunable channel group that lies entirely inside it cut by
    WIDTH_RATIO (``archscan.prune``: kept counts multiples of 8). Its output width is unchanged,
    so the model around it stays as it is. Needs ``view.grouping`` (the model's channel groups)."""
    grouping = getattr(view, "grouping", None)
    if grouping is None:
        return []
    from ..prune import plan, prunable
    from ..prune.surgery import apply_cuts

    groups = prunable(grouping)
    out = []
    for stage in view.ranking:
        prefix = stage.path + "."
        inside = [g.id for g in groups if g.modules and all(m.startswith(prefix) for m in g.modules)]
        cuts = plan(grouping, WIDTH_RATIO, inside) if inside else []
        if not cuts:
            continue

        def recipe(model: nn.Module, cuts=cuts) -> nn.Module:
            apply_cuts(model, cuts)
            return model

        channels = ", ".join(f"{g.channels}->{g.channels - len(c)}" for g, c in cuts[:4]) + (" ..." if len(cuts) > 4 else "")
        out.append(Student(
            id=f"width:{stage.path}:{WIDTH_RATIO:g}", kind="width",
            description=f"{stage.path}: {len(cuts)} channel group(s) inside it cut by {WIDTH_RATIO:g} ({channels})",
            changed=(stage.path,), recipe=recipe, priority=stage.score, why=describe_share([stage]),
            pairs=((stage.path, stage.path),)))  # same path, same output width: its output is the stage's
    return out


PROPOSERS: dict[str, Proposer] = {
    "depth": depth_students,
    "shuffle-unit": shuffle_students,
    "width": width_students,
}


def candidates(report: Report, view: Teacher | None = None) -> list[Student]:
    """Every student the proposers make for this report, highest priority first."""
    view = view or Teacher(report)
    order = {kind: i for i, kind in enumerate(PROPOSERS)}
    students = [s for proposer in PROPOSERS.values() for s in proposer(view)]
    students.sort(key=lambda s: (-s.priority, order.get(s.kind, len(order)), s.id))
    return students


# --- the layer mapping ----------------------------------------------------------------------------------

def feature_points(view: Teacher) -> list[str]:
    """Teacher modules a student is distilled on, beside the model's output (''): each stack with
    runs of blocks (and, when it holds several runs, each run's last block); a model without such
    stacks, each top-level module of its own (not a plain torch.nn layer)."""
    points = []
    for stack in view.stacks:
        runs = view.runs(stack.path)
        if runs:
            points += [run[-1].path for run in runs[:-1]] + ([stack.path] if stack.path else [])
    if not points:
        points = [m.path for m in view.report.modules if m.depth == 1 and m.nodes and not m.builtin]
    return points


def adapter_for(teacher_shape, student_shape) -> str | None:
    """The layer that maps a student feature onto the teacher's for a feature loss; None when
    the shapes are equal. Channels are dim 1 of a 4-D/5-D map (a 1x1 conv), the last dim of a
    2-D/3-D tensor (a linear layer); a different spatial size is resized."""
    t, s = tuple(teacher_shape or ()), tuple(student_shape or ())
    if t == s:
        return None
    if len(t) != len(s) or len(t) < 2 or s[0] != t[0]:
        return f"no simple adapter: {list(s)} -> {list(t)}"
    if len(t) in (2, 3):
        return f"linear {s[-1]}->{t[-1]}" if t[:-1] == s[:-1] else f"no simple adapter: {list(s)} -> {list(t)}"
    parts = [f"1x1 conv {s[1]}->{t[1]}"] if s[1] != t[1] else []
    if s[2:] != t[2:]:
        parts.append(f"resize {'x'.join(map(str, s[2:]))}->{'x'.join(map(str, t[2:]))}")
    return " + ".join(parts)


__all__ = ["FINDING_WEIGHT", "GUIDELINE_RULES", "PROPOSERS", "ShuffleUnit", "StageScore", "Student", "Teacher",
           "adapter_for", "candidates", "channel_shuffle", "depth_students", "feature_points", "shuffle_students",
           "stage_ranking", "unit_params", "unit_stride", "width_students"]
