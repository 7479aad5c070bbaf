"""``archscan distill``: propose smaller students of a model, check them, save one as a ``.pt2``.

``students.py`` ranks the stages (``stage_ranking``) and proposes students (``candidates``).
Here each student is checked the way archscan checks anything: built without weights (meta
device, then fake tensors), run on the teacher's example inputs (it must give the teacher's
output shapes), and analysed by the analysis core (``archscan.analysis.analyse``) for its
params, FLOPs (multiply-adds), MAC bytes, kernels and, with a device profile, predicted
latency. ``distill`` then builds the chosen student with real random-init weights, exports it with ``torch.export`` (non-strict; training
mode by default, with the batch dimension dynamic where the model allows) and saves it:
``torch.export.load(path).module()`` trains with plain torch.

The student's figures are its inference costs (eval mode), like the teacher's. A program saved in
training mode also updates its batch-norm running statistics: archscan counts those writes (8
bytes per channel and 16 for the ``num_batches_tracked`` counter, in float32) when it analyses
the saved file; params and FLOPs are the same.

The layer mapping pairs teacher and student modules for a feature-distillation loss: each
feature point (``students.feature_points``) with the student module that produces the same
feature, their output shapes, and the adapter needed when the shapes differ.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ..analysis import analyse
from ..load.building import Call, build_fake, build_real, make_call, strip_user_hooks
from ..capture import capture_context, seeded_rng
from ..errors import ArchscanError, CaptureError
from ..load.frames import short
from ..isolation import isolated
from ..load.targets import (InputSpec, ModelTarget, check_kwargs, input_specs, model_dtype, output_path, parse_dtype,
                            to_target)
from ..measure.predict import kernels, predicted, report_totals
from ..load.recording import output_tensors, quiet
from ..results import Recommendation, Report, module_and_ancestors
from .students import (GUIDELINE_RULES, PROPOSERS, ShuffleUnit, StageScore, Student, Teacher, adapter_for, candidates,
                       feature_points, stage_ranking)

SCHEMA = "archscan.distill/1"
RECOMMENDED = 2              # distill recommendations per scan, at most
MAX_ESTIMATED = 8            # students the recommender estimates per scan, at most (best first)
ESTIMATED_KINDS = ("depth", "shuffle-unit")  # students ``estimate`` computes from the teacher's report


@dataclass(frozen=True)
class MappingEntry:
    """One teacher module whose output a student module is distilled on."""

    teacher: str                     # module path ('' is the model's output)
    student: str
    teacher_shape: tuple[int, ...]   # the first tensor of the module's output
    student_shape: tuple[int, ...]
    adapter: str | None              # "1x1 conv C_s->C_t", ...; None when the shapes are equal

    def to_json(self) -> dict:
        return {"teacher": self.teacher, "student": self.student, "teacher_shape": list(self.teacher_shape),
                "student_shape": list(self.student_shape), "adapter": self.adapter}


@dataclass(frozen=True)
class StudentResult:
    """A student checked on fake tensors: its totals beside the teacher's, or why it failed."""

    student: Student
    teacher: dict                        # params, flops, mac_bytes, kernels (, predicted_ms)
    totals: dict | None                  # the same for the student; None when it failed
    mapping: tuple[MappingEntry, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def smaller(self) -> bool:
        """It works, moves fewer bytes than the teacher, and does no more FLOPs."""
        return self.ok and _smaller(self.totals, self.teacher)


def _smaller(student: dict, teacher: dict) -> bool:
    return student["mac_bytes"] < teacher["mac_bytes"] and student["flops"] <= teacher["flops"]


@dataclass(frozen=True)
class DistillResult:
    """What ``distill`` built, checked and saved."""

    model: str
    inputs: tuple[dict, ...]
    student: Student
    teacher: dict                        # totals: params, flops, mac_bytes, kernels (, predicted_ms)
    totals: dict                         # the student's, at inference (eval mode)
    mapping: tuple[MappingEntry, ...]
    alternatives: tuple[str, ...]        # the other students ``--student`` takes, best first
    mode: str                            # train | eval: the mode the program was exported in
    dynamic_batch: bool                  # the program takes any batch size
    path: str | None = None
    program: Any = field(default=None, repr=False, compare=False)  # the student's ExportedProgram

    def to_json(self) -> dict:
        s = self.student
        return {
            "schema": SCHEMA, "model": self.model, "inputs": list(self.inputs), "teacher": self.teacher,
            "student": {"id": s.id, "kind": s.kind, "description": s.description, "changed": list(s.changed),
                        "why": s.why, **self.totals},
            "mapping": [m.to_json() for m in self.mapping], "alternatives": list(self.alternatives),
            "mode": self.mode, "dynamic_batch": self.dynamic_batch, "path": self.path,
        }


# --- totals ----------------------------------------------------------------------------------------------

def _sums(nodes) -> dict:
    out = {"flops": sum(n.flops for n in nodes), "mac_bytes": sum(n.mac_bytes for n in nodes),
           "kernels": sum(map(kernels, nodes))}
    if nodes and all(n.predicted_ms is not None for n in nodes):
        out["predicted_ms"] = sum(n.predicted_ms for n in nodes)
    return out


def _combine(totals: dict, part: dict, sign: int) -> dict:
    out = {k: totals[k] + sign * part[k] for k in ("params", "flops", "mac_bytes", "kernels")}
    if "predicted_ms" in totals and "predicted_ms" in part:
        out["predicted_ms"] = totals["predicted_ms"] + sign * part["predicted_ms"]
    return out


def estimate(report: Report, student: Student, profile=None, view: Teacher | None = None) -> dict:
    """The student's totals from the teacher's report, without building it: the teacher's, less
    the nodes and parameters of every module it removes or replaces, plus the new unit's own
    analysis (``archscan.analysis.analyse`` of the unit alone on the block's input shape). Exact when the
    rest of the model sees the same shapes, which ``check`` confirms.

    Raises:
        ValueError: a student kind this cannot estimate (``ESTIMATED_KINDS``): ``check`` it.
    """
    if student.kind not in ESTIMATED_KINDS:
        raise ValueError(f"{student.kind} students are not estimated from the report: check them")
    view = view or Teacher(report)
    totals = report_totals(report)
    for path in student.changed:
        totals = _combine(totals, {"params": view.modules[path].params, **_sums(view.nodes(path))}, -1)
    if student.unit is not None:
        totals = _combine(totals, _unit_totals(student.unit, report.dtype, profile), +1)  # no profile: no ms
    return totals


def _unit_totals(unit: tuple, dtype: str, profile) -> dict:
    _, in_shape, out_shape, stride = unit
    target = ModelTarget("ShuffleUnit", lambda: ShuffleUnit(in_shape[1], out_shape[1], stride))
    report = analyse(target, [InputSpec(tuple(in_shape))], dtype=None if dtype == "float32" else parse_dtype(dtype),
                     memory=False)
    return report_totals(predicted(report, profile))


# --- checking a student on fake tensors --------------------------------------------------------------------

def student_target(teacher: ModelTarget, student: Student, kwargs: dict | None = None) -> ModelTarget:
    """A target that builds the student: the teacher's factory (run on the meta device when
    archscan builds without weights) with the recipe applied, or a changed copy of an instance."""
    name = f"{teacher.name} [{student.id}]"
    if teacher.instance is not None:
        return ModelTarget(name, None, instance=student.recipe(build_real(teacher, {}, None)),
                           source_file=teacher.source_file)
    return ModelTarget(name, lambda **_: student.recipe(teacher.build(kwargs or {})), source_file=teacher.source_file)


def module_outputs(target: ModelTarget, specs: Sequence[InputSpec], kwargs: dict | None,
                   dtype: torch.dtype | None) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Output shapes (of each tensor) of every module that runs, '' for the model: one forward on
    fake tensors, with the model built as archscan's analysis builds it."""
    shapes: dict[str, tuple] = {}

    def recorder(path: str):
        def hook(module, args, output):
            shapes.setdefault(path, tuple(tuple(t.shape) for t in output_tensors(output)))
        return hook

    with capture_context():
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        model = build_fake(target, kwargs or {}, dtype, fake_mode, specs)
        call = make_call(specs, dtype, fake_mode)
        handles = [m.register_forward_hook(recorder(path)) for path, m in model.named_modules()]
        try:
            with fake_mode, torch.no_grad(), quiet():
                call(model)
        except ArchscanError:
            raise
        except Exception as exc:
            raise CaptureError(f"{target.name} does not run on the example inputs: {short(exc)}") from exc
        finally:
            for h in handles:
                h.remove()
    return shapes


def layer_mapping(view: Teacher, student: Student, teacher_shapes: dict, student_shapes: dict) -> tuple[MappingEntry, ...]:
    """Teacher feature points, each with the student module producing the same feature (the same
    path where the student keeps it, the student's ``pairs`` where it changed), then the changed
    blocks' own pairs whose output is not a feature point already; in the teacher's order."""
    report = view.report
    last = {}  # a module's output is its last node's: two modules ending on one node give one feature
    for i, n in enumerate(report.nodes):
        for p in module_and_ancestors(n.module):
            last[p] = i
    pairs = dict(student.pairs)
    wanted = [("", "")] + [(p, pairs.get(p, p)) for p in feature_points(view)] + list(student.pairs)
    out, seen = [], set()
    for t, s in wanted:
        feature = last.get(t, t)
        if feature in seen or not teacher_shapes.get(t) or not student_shapes.get(s):
            continue  # the same feature again; or dropped, not run, not a tensor
        seen.add(feature)
        ts, ss = teacher_shapes[t][0], student_shapes[s][0]
        out.append(MappingEntry(t, s, ts, ss, adapter_for(ts, ss)))
    out.sort(key=lambda e: (e.teacher == "", last.get(e.teacher, len(report.nodes))))
    return tuple(out)


def check(report: Report, target: ModelTarget, specs: Sequence[InputSpec], student: Student, *,
          kwargs: dict | None = None, dtype: torch.dtype | None = None, profile=None,
          teacher_shapes: dict | None = None, view: Teacher | None = None) -> StudentResult:
    """Build ``student`` on fake tensors, run it on the teacher's inputs (the same output shapes?)
    and analyse it with ``archscan.analysis.analyse``."""
    teacher = report_totals(report)
    teacher_shapes = teacher_shapes or module_outputs(target, specs, kwargs, dtype)
    try:
        built = student_target(target, student, kwargs)
        shapes = module_outputs(built, specs, None, dtype)
        if shapes.get("") != teacher_shapes.get(""):
            raise ArchscanError(f"its output shapes {_shapes(shapes.get(''))} differ from the model's "
                                f"{_shapes(teacher_shapes.get(''))}")
        analysed = predicted(analyse(built, specs, dtype=dtype, memory=False), profile)
    except Exception as exc:  # the recipe does not fit the model, or the student does not run
        return StudentResult(student, teacher, None, error=str(exc) if isinstance(exc, ArchscanError) else short(exc))
    totals = report_totals(analysed)
    if "predicted_ms" not in teacher:
        totals.pop("predicted_ms", None)
    return StudentResult(student, teacher, totals, layer_mapping(view or Teacher(report), student, teacher_shapes, shapes))


def _shapes(shapes) -> str:
    return ", ".join("×".join(map(str, s)) for s in shapes or ()) or "none"


def propose(report: Report, target: ModelTarget, specs: Sequence[InputSpec], kwargs: dict | None = None,
            dtype: torch.dtype | None = None, *, limit: int = 4, profile=None) -> list[StudentResult]:
    """Check the students of the model ``report`` analysed, in priority order, until ``limit`` of
    them pass and are smaller than the model (the others checked are listed too: ``error`` says
    why one failed, ``smaller`` whether it saves bytes).

    Args:
        report: the teacher's report; its guideline findings (G1-G4) count in the ranking.
        target, specs, kwargs, dtype: the teacher as ``archscan.scan`` took it (``specs`` with the dtype applied).
        limit: how many working, smaller students to find.
        profile: the ``DeviceProfile`` that predicted the report's latency, to predict the students'.
    """
    if target.program:
        return []
    view = Teacher(report)
    view.grouping = _grouping(target, specs, kwargs, dtype)
    students = candidates(report, view)
    if not students:
        return []
    teacher_shapes = module_outputs(target, specs, kwargs, dtype)
    results: list[StudentResult] = []
    for s in students:
        results.append(check(report, target, specs, s, kwargs=kwargs, dtype=dtype, profile=profile,
                             teacher_shapes=teacher_shapes, view=view))
        if sum(r.smaller for r in results) >= limit:
            break
    return results


# --- building, exporting and saving ------------------------------------------------------------------------

@isolated
def distill(model: nn.Module | Any, inputs: Any, *, student: str | None = None, path: str | None = None,
            kwargs: dict | None = None, dtype: torch.dtype | str | None = None, train: bool = True,
            name: str | None = None, allow_pickle: bool = False) -> DistillResult:
    """Propose students of ``model``, check them, and build one with random-init weights.
    Thread-safe and state-keeping as ``archscan.scan`` (``archscan.isolation``).

    Args:
        model, inputs, kwargs, dtype, name, allow_pickle: as for ``archscan.scan``.
        student: the student's id (``depth:layer3:1``, ``shuffle:layer2.1``); None takes the first,
            in priority order, that passes its check and moves fewer bytes than the model.
        path: where to save the ``.pt2`` (``torch.export.load(path).module()`` trains it); None saves nothing.
        train: export in training mode (batch norms use batch statistics, dropout is on); False
            exports the inference program.

    Returns:
        ``DistillResult``: teacher and student totals, the layer mapping, the program.

    Raises:
        ArchscanError: no student to propose, an unknown ``student`` id, or a student that fails its check.
    """
    dtype = model_dtype(dtype)
    specs = input_specs(inputs, dtype)
    target = to_target(model, name, allow_pickle)
    if target.program:
        raise ArchscanError(f"{target.name} is an exported program: archscan cannot change its modules",
                            hint="point archscan distill at the model's source: file.py:Net, package.module:factory or zoo:name")
    check_kwargs(target, kwargs)
    profile = _default_profile()
    with seeded_rng():
        report = predicted(analyse(target, specs, kwargs=kwargs, dtype=dtype, rules=list(GUIDELINE_RULES), memory=False),
                           profile)
        view = Teacher(report)
        view.grouping = _grouping(target, specs, kwargs, dtype)
        students = candidates(report, view)
        if not students:
            raise ArchscanError(
                f"archscan proposes no student for {target.name}: it has no run of repeated blocks to shorten "
                f"and no [N, C, H, W] block a smaller ShuffleNetV2 unit could replace",
                hint="students shorten an nn.Sequential/nn.ModuleList stage of repeated blocks or replace a "
                     "convolutional block; `archscan MODEL` shows the model's modules")
        ids = [s.id for s in students]
        if student is not None and student not in ids:
            raise ArchscanError(f"no student {student!r} for {target.name}", hint=f"known: {', '.join(ids)}")
        tried = [students[ids.index(student)]] if student is not None else students
        teacher_shapes = module_outputs(target, specs, kwargs, dtype)
        failures = []
        for s in tried:
            result = check(report, target, specs, s, kwargs=kwargs, dtype=dtype, profile=profile,
                           teacher_shapes=teacher_shapes, view=view)
            if result.ok and (student is not None or result.smaller):
                break
            failures.append(f"{s.id}: {result.error or 'moves no fewer bytes than the model'}")
        else:
            raise CaptureError(f"no student of {target.name} passed its check: {'; '.join(failures[:3])}"
                               + (f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""),
                               hint="run with --debug and report the model: its modules do not work as its "
                                    "report suggests")
        chosen = result.student
        teacher_model = build_real(target, kwargs or {}, dtype, specs)
        strip_user_hooks(teacher_model)
        program, dynamic, example = _export(chosen.recipe(teacher_model), specs, dtype, train)
        if path is None:
            _run(program, example, "the exported student")
        else:
            from ..transform.programs import save_program  # late: a scan's recommendations do not save

            save_program(program, path)
            with quiet():
                saved = torch.export.load(path)
            _run(saved, example, f"the student saved to {path}")
    return DistillResult(target.name, tuple(s.to_json() for s in specs), chosen, result.teacher, result.totals,
                         result.mapping, tuple(i for i in ids if i != chosen.id), "train" if train else "eval",
                         dynamic, path, program)


def _export(module: nn.Module, specs: Sequence[InputSpec], dtype: torch.dtype | None,
            train: bool = True) -> tuple[torch.export.ExportedProgram, bool, Call]:
    """(program, dynamic batch?, the inputs it was traced on): ``module`` exported in training (or
    eval) mode, its batch dimension dynamic where the model allows it, its output flattened to its
    tensors when export cannot keep it (a namedtuple, a ``ModelOutput``), as fuse and prune save
    theirs (``archscan.transform.programs.export``)."""
    from ..transform.programs import batch_call, export

    module.train(train)
    call = make_call(specs, dtype)
    buffers = {name: b.clone() for name, b in module.named_buffers()}
    with torch.no_grad():
        reference = call(module)  # what forward returns in this mode; the statistics it moved go back
        for name, b in module.named_buffers():
            b.copy_(buffers[name])
    program = export(module, call, reference, "the student", batch=batch_call(specs, dtype))
    return program, bool(program.range_constraints), call


def _run(program: torch.export.ExportedProgram, call: Call, what: str) -> None:
    """Run a copy of the program once: in training mode a run updates its batch-norm statistics."""
    try:
        with warnings.catch_warnings():  # the program's tree specs warn about their own deprecations
            warnings.simplefilter("ignore", FutureWarning)
            module = copy.deepcopy(program.module())
        call(module)
    except Exception as exc:
        hint = ("a batch of one cannot train batch norms over a 1x1 map: pass a batch of 2 or more, or --eval"
                if "more than 1 value per channel" in str(exc) else None)
        raise CaptureError(f"{what} does not run: {short(exc)}", hint=hint) from exc




def _default_profile():
    """The cached profile of the default device (what a scan predicts with), or None."""
    from ..measure import cached_profile, resolve_device

    return cached_profile(resolve_device(None))[0]


def _grouping(target: ModelTarget, specs, kwargs=None, dtype=None, model=None):
    """The model's channel groups for width students (None when they cannot be traced)."""
    from ..prune import analyse as channel_groups

    try:
        return channel_groups(target, specs, kwargs, dtype, model=model)
    except ArchscanError:
        return None


# --- the recommender ---------------------------------------------------------------------------------------

def distill_recommendations(ctx, target: ModelTarget | None = None, specs: Sequence[InputSpec] = (),
                            kwargs: dict | None = None, dtype: torch.dtype | None = None) -> list[Recommendation]:
    """``distill`` recommendations for ``archscan.recommend``: the best students (at most
    ``RECOMMENDED``) whose changed modules take more time (or bytes) than their FLOPs suggest or
    carry guideline findings (priority above 0), and that move fewer bytes than the model.
    Savings are the teacher's totals less the student's ``estimate`` (nothing is built), so only
    the kinds ``estimate`` knows are recommended in a scan; width students, which must be built
    to be counted, are proposed by ``archscan distill``.

    Args:
        ctx: the recommend ``Context`` (report with findings, profile, command).
        target: the model as scanned; None (or an exported program) recommends nothing.
    """
    report = ctx.report
    if target is None or target.program:
        return []
    view = Teacher(report)  # no grouping: width students are not recommended in a scan (see above)
    teacher = report_totals(report)
    out = []
    for s in [s for s in candidates(report, view) if s.priority > 0][:MAX_ESTIMATED]:
        try:
            if s.kind in ESTIMATED_KINDS:
                totals = estimate(report, s, ctx.profile, view)
            else:
                totals = check(report, target, specs, s, kwargs=kwargs, dtype=dtype, profile=ctx.profile, view=view).totals
        except ArchscanError:
            continue  # the unit's own analysis failed: no estimate, no recommendation
        if totals is None or not _smaller(totals, teacher):
            continue
        saving = {k: teacher[k] - totals[k] for k in ("mac_bytes", "flops", "params", "kernels")}
        basis = "mac"
        if "predicted_ms" in teacher and "predicted_ms" in totals:
            saving, basis = {"ms": teacher["predicted_ms"] - totals["predicted_ms"], **saving}, "predicted"
        cited = {(rule, module) for p in s.changed if p in view.scores for rule, module in view.scores[p].findings}
        out.append(Recommendation(
            kind="distill", target=s.changed,
            reason=f"a smaller student to distill, {s.id}: {s.description}; {s.why}. It starts from random weights: "
                   "train it on the model's outputs (archscan distill prints the layer mapping for feature losses)",
            estimated_saving=saving, basis=basis, apply=_apply(ctx, s),
            findings=tuple({"rule": r, "module": m} for r, m in sorted(cited))))
        if len(out) == RECOMMENDED:
            break
    return out


def _apply(ctx, s: Student) -> str:
    if not ctx.command:
        return (f"from archscan.distill import distill; distill(model, inputs, student={s.id!r}, "
                f"path='model-student.pt2')")
    return f"archscan distill {ctx.command} --student {s.id} -o {output_path(ctx.report.model, 'student')}"


__all__ = ["DistillResult", "MappingEntry", "PROPOSERS", "StageScore", "Student", "StudentResult", "check",
           "distill", "distill_recommendations", "estimate", "layer_mapping", "module_outputs",
           "propose", "report_totals", "stage_ranking", "student_target"]
