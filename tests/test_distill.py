"""``archscan distill``: the stage ranking, the students it proposes, their check on fake tensors,
the layer mapping, the saved ``.pt2`` and the ``distill`` recommendations.

Every number is checked against something computed apart from the code under test: the student's
predicted totals against ``archscan.scan`` of the real student that ``distill`` saves (loaded from
the ``.pt2``), the dropped blocks' parameters counted on the zoo module itself, ShuffleNetV2 units'
parameters by hand, and the saved program trained in a fresh Python process that imports only torch.
"""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

import archscan
from archscan import zoo
from archscan.load.targets import input_specs, to_target
from archscan.distill import (ESTIMATED_KINDS, PROPOSERS, Student, check, distill, distill_recommendations, estimate, propose,
                              report_totals, stage_ranking)
from archscan.distill.students import (ShuffleUnit, StageScore, adapter_for, can_shuffle, candidates, unit_params,
                                       unit_stride)
from archscan.errors import ArchscanError
from archscan.measure.profile import DeviceProfile
from archscan.recommend import Context, command_of
from archscan.report.distill import distill_text
from archscan.rules import RuleContext

MODELS = ("resnet18", "mobilenet_v2", "shufflenet_v2_x0_5")
INPUT = "1,3,64,64"
COUNTED = ("params", "flops", "mac_bytes", "kernels")
_TEACHERS: dict = {}


def teacher(name: str):
    """(target, specs, report with the guideline findings, the two best students checked): once per model."""
    if name not in _TEACHERS:
        target, specs = to_target(f"zoo:{name}"), input_specs(INPUT)
        report = archscan.scan(target, specs, rules=["G1", "G2", "G3", "G4"], recommend=False, profile=False)
        _TEACHERS[name] = target, specs, report, propose(report, target, specs, limit=2)
    return _TEACHERS[name]


_SAVED: dict = {}


def saved(name: str, tmp_dir):
    """(DistillResult, path): the model's best student, built for real, exported in eval mode and saved; once."""
    if name not in _SAVED:
        target, specs, _, _ = teacher(name)
        path = tmp_dir / f"{name}-student.pt2"
        _SAVED[name] = distill(target, specs, path=str(path), train=False), path
    return _SAVED[name]


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("students")


@pytest.fixture(scope="module", autouse=True)
def _forget_teachers():
    yield
    _TEACHERS.clear()
    _SAVED.clear()


def scanned(path, specs) -> dict:
    """archscan's own count of a saved program."""
    return report_totals(scanned_report(path, specs))


def scanned_report(path, specs):
    return archscan.scan(str(path), specs, rules=[], recommend=False, profile=False)


# --------------------------------------------------------------------------- 1. the ranking
def test_score_is_the_documented_formula():
    # the module docstring's example: 40% of the time for 10% of the FLOPs scores 0.3; each finding adds 0.01
    s = StageScore("x", "Block", "block", flops_share=0.1, time_share=0.4, basis="mac", findings=(),
                   findings_bytes=0, findings_mac_share=0.0)
    assert s.excess == pytest.approx(0.3) and s.score == pytest.approx(0.3)
    s = StageScore("x", "Block", "block", 0.1, 0.4, "mac", (("G1", "x.conv"), ("G3", "x")), 500, 0.05)
    assert s.score == pytest.approx(0.3 + 0.05 + 2 * 0.01)


def test_ranking_shares_add_up_on_resnet18():
    _, _, report, _ = teacher("resnet18")
    ranking = {s.path: s for s in stage_ranking(report)}
    total_mac, total_flops = report.totals.mac_bytes, report.totals.flops
    stages = [s for s in ranking.values() if s.kind == "stage"]
    assert {s.path for s in stages} == {"conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4",
                                        "avgpool", "fc"}
    assert {s.path for s in ranking.values() if s.kind == "block"} == {f"layer{i}.{j}" for i in range(1, 5) for j in (0, 1)}
    # no profile, no measurement: shares of the bytes moved
    assert all(s.basis == "mac" for s in stages)
    for s in ranking.values():
        m = report.module(s.path)
        assert s.time_share == m.mac_bytes / total_mac and s.flops_share == m.flops / total_flops
    # the stages and the nodes of the root (torch.flatten) hold every byte; each stage's blocks hold all of its
    root = sum(n.mac_bytes for n in report.nodes if n.module == "") / total_mac
    assert sum(s.time_share for s in stages) + root == pytest.approx(1.0)
    for i in range(1, 5):
        assert ranking[f"layer{i}.0"].time_share + ranking[f"layer{i}.1"].time_share == pytest.approx(
            ranking[f"layer{i}"].time_share)
    # at 64x64 layer4's 8.4M weights dominate: 64% of the bytes for 23% of the FLOPs, the top stage
    assert next(iter(ranking)) == "layer4"
    # G3 names layer4.0 (projecting blocks) and layer4.1 (plain blocks) in two findings: both count in layer4
    assert sorted(r for r, _ in ranking["layer4"].findings) == ["G3", "G3"]
    assert [r for r, _ in ranking["layer4.1"].findings] == ["G3"]


def test_ranking_prefers_measured_time():
    _, _, report, _ = teacher("resnet18")
    import dataclasses

    timed = dataclasses.replace(report, nodes=tuple(
        dataclasses.replace(n, latency_ms=1.0 if n.module.startswith("layer2.") else 0.0) for n in report.nodes))
    ranking = stage_ranking(timed)
    top = ranking[0]
    assert (top.path, top.basis, top.time_share) == ("layer2", "measured", 1.0)
    assert top.excess == 1.0 - report.module("layer2").flops / report.totals.flops


def test_guideline_bytes_count_where_the_layer_is():
    _, _, report, _ = teacher("mobilenet_v2")
    block = {s.path: s for s in stage_ranking(report)}["features.2"]
    one_layer = [f for f in report.findings if f.rule in ("G1", "G2") and f.module.startswith("features.2.")]
    assert one_layer  # 16->96 expansion (G1) and the depthwise conv (G2)
    assert block.findings_bytes == sum(f.saving["mac_bytes"] for f in one_layer)
    assert block.findings_mac_share == block.findings_bytes / report.totals.mac_bytes


# --------------------------------------------------------------------------- 2. the ShuffleNetV2 unit
def test_shuffle_unit_parameters_by_hand():
    # stride 1, 8 channels: half = 4; 1x1 4*4 + BN 2*4, 3x3 depthwise 4*9 + BN 8, 1x1 16 + BN 8 = 92
    assert unit_params(8, 8, 1) == 92 == sum(p.numel() for p in ShuffleUnit(8, 8, 1).parameters())
    # and a 1x1 conv-BN 8->4 after the shuffle: + 8*4 + 2*4 = 132
    assert unit_params(8, 4, 1) == 132
    # stride 2, 4 -> 8: left 3x3 dw 4*9 + BN 8 + 1x1 4*4 + BN 8 = 68; right 1x1 16 + 8, dw 36 + 8, 1x1 16 + 8 = 92
    assert unit_params(4, 8, 2) == 68 + 92


@pytest.mark.parametrize("stride", [1, 2])
def test_shuffle_unit_parameters_counted_as_built(stride):
    shapes = [(c_in, c_out) for c_in in (2, 4, 6, 24, 58, 116) for c_out in (2, 8, 24, 58, 96, 232)]
    for c_in, c_out in shapes:
        if can_shuffle(c_in, c_out, stride):
            built = sum(p.numel() for p in ShuffleUnit(c_in, c_out, stride).parameters())
            assert unit_params(c_in, c_out, stride) == built, (c_in, c_out, stride)


@pytest.mark.parametrize("c_in, c_out, hw, stride, out_hw", [(24, 24, (16, 16), 1, (16, 16)), (16, 24, (16, 16), 2, (8, 8)),
                                                            (16, 24, (7, 5), 2, (4, 3)), (8, 6, (4, 4), 1, (4, 4))])
def test_shuffle_unit_keeps_the_shapes(c_in, c_out, hw, stride, out_hw):
    assert unit_stride((2, c_in, *hw), (2, c_out, *out_hw)) == stride
    y = ShuffleUnit(c_in, c_out, stride)(torch.randn(2, c_in, *hw))
    assert tuple(y.shape) == (2, c_out, *out_hw)


def test_shuffle_unit_refuses_what_it_cannot_match():
    assert unit_stride((1, 7, 8, 8), (1, 7, 8, 8)) is None    # an odd channel count cannot be split in half
    assert unit_stride((1, 8, 8, 8), (1, 7, 4, 4)) is None    # nor shuffled in two halves
    assert unit_stride((1, 8, 8, 8), (1, 8, 2, 2)) is None    # stride 4
    assert unit_stride((1, 8, 8), (1, 8, 8)) is None          # not [N, C, H, W]
    with pytest.raises(ValueError):
        ShuffleUnit(7, 7, 1)


def test_adapters():
    assert adapter_for((1, 64, 8, 8), (1, 64, 8, 8)) is None
    assert adapter_for((1, 64, 8, 8), (1, 32, 8, 8)) == "1x1 conv 32->64"
    assert adapter_for((1, 64, 8, 8), (1, 32, 4, 4)) == "1x1 conv 32->64 + resize 4x4->8x8"
    assert adapter_for((1, 197, 768), (1, 197, 384)) == "linear 384->768"
    assert adapter_for((1, 1000), (1, 1000)) is None
    assert adapter_for((1, 64, 8, 8), (1, 64)).startswith("no simple adapter")


# --------------------------------------------------------------------------- 3. students of the zoo
@pytest.mark.parametrize("name", MODELS)
def test_students_run_and_their_counts_are_the_saved_students(name, student_dir):
    target, specs, report, results = teacher(name)
    assert len(results) == 2 and all(r.ok for r in results), [r.error for r in results]
    out_shape = report.nodes[-1].out_shape
    assert out_shape == (1, 1000)
    for r in results:
        # run on fake tensors with the teacher's input: the teacher's output shape
        assert r.mapping[-1].teacher == r.mapping[-1].student == ""
        assert r.mapping[-1].teacher_shape == r.mapping[-1].student_shape == out_shape
        assert r.teacher == report_totals(report)
        # the prediction from the teacher's report alone is the built student's count (width
        # students are counted by building them: their cuts reach inside layers)
        if r.student.kind in ESTIMATED_KINDS:
            assert estimate(report, r.student) == r.totals
        assert all(r.totals[k] < r.teacher[k] for k in ("params", "flops", "mac_bytes"))
    # the best one, built for real and saved: archscan counts exactly the predicted totals on it
    d, path = saved(name, student_dir)
    assert d.student.id == results[0].student.id and d.path == str(path) and d.mode == "eval" and d.dynamic_batch
    assert d.totals == results[0].totals and d.teacher == report_totals(report)
    real = scanned_report(path, specs)
    assert report_totals(real) == d.totals
    assert d.mapping == results[0].mapping
    # the student's side of the mapping: the saved program's own modules (its graph keeps their paths)
    for m in d.mapping:
        assert m.student_shape == real.module(m.student).out_shape
    assert results[1].student.id in d.alternatives and d.student.id not in d.alternatives


@pytest.mark.parametrize("name", MODELS)
def test_mapping_shapes_and_adapters(name):
    _, _, report, results = teacher(name)
    modules = {m.path: m for m in report.modules}
    for r in results:
        assert r.mapping
        for m in r.mapping:
            if m.teacher:  # the teacher's shapes are its report's module outputs
                assert m.teacher_shape == modules[m.teacher].out_shape
            assert (m.adapter is None) == (m.teacher_shape == m.student_shape)
            assert m.teacher not in r.student.changed or m.teacher in dict(r.student.pairs)


def test_resnet18_depth_student_drops_exactly_the_blocks_params(tmp_path):
    target, specs, report, _ = teacher("resnet18")
    r = check(report, target, specs, next(s for s in candidates(report) if s.id == "depth:layer3:1"))
    assert r.ok and r.student.changed == ("layer3.1",)
    dropped = zoo.create_model("resnet18").layer3[1]
    # two 3x3 convs 256->256 (2 * 589,824) and two batch norms (2 * 512): 1,180,672 parameters
    assert sum(p.numel() for p in dropped.parameters()) == 1_180_672
    assert r.teacher["params"] - r.totals["params"] == 1_180_672
    # both convs at 4x4: 2 * 16 * 256 * 256 * 9 = 18,874,368 multiply-adds
    assert r.teacher["flops"] - r.totals["flops"] == 18_874_368
    # the survivors keep their names: layer3 holds "0" only, and its output is still layer3's
    assert [(m.teacher, m.student) for m in r.mapping] == [("layer1", "layer1"), ("layer2", "layer2"),
                                                          ("layer3", "layer3"), ("layer4", "layer4"), ("", "")]


def test_mobilenet_depth_student_maps_the_shortened_run():
    target, specs, report, _ = teacher("mobilenet_v2")
    student = next(s for s in candidates(report) if s.id == "depth:features.7-10:2")
    assert student.changed == ("features.9", "features.10")
    r = check(report, target, specs, student)
    assert r.ok and estimate(report, student) == r.totals
    pairs = {m.teacher: m.student for m in r.mapping}
    assert pairs["features.10"] == "features.8"  # the run's output now comes from its second block
    assert pairs["features.13"] == "features.13"


def test_saved_student_trains_in_a_fresh_process(tmp_path):
    target, specs, report, _ = teacher("resnet18")
    path = tmp_path / "student.pt2"
    d = distill(target, specs, student="depth:layer3:1", path=str(path))
    assert d.mode == "train" and d.dynamic_batch
    script = textwrap.dedent(f"""
        import json, sys, torch
        model = torch.export.load({str(path)!r}).module()
        buffers = dict(model.named_buffers())
        mean = next(k for k in buffers if k.endswith("running_mean"))
        before = buffers[mean].clone()
        fresh = all(float(t.abs().max()) == 0 for k, t in buffers.items()
                    if k.endswith(("running_mean", "num_batches_tracked")))
        y = model(torch.randn(3, 3, 64, 64))  # batch 3: the program was given batch 1
        loss = torch.nn.functional.cross_entropy(y, torch.tensor([1, 2, 3]))
        loss.backward()
        params = [p for _, p in model.named_parameters()]
        print(json.dumps({{"shape": list(y.shape), "params": len(params), "numel": sum(p.numel() for p in params),
                          "grads": sum(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params),
                          "bn_moved": float((dict(model.named_buffers())[mean] - before).abs().max()),
                          "fresh": fresh, "archscan": "archscan" in sys.modules}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["shape"] == [3, 1000] and not got["archscan"]
    assert got["numel"] == d.totals["params"] and got["grads"] == got["params"] > 0
    assert got["fresh"]  # saved as initialised: the checks archscan ran on it left no statistics behind
    assert got["bn_moved"] > 0  # training mode: batch statistics, running statistics updated
    # archscan counts the training program's running-statistics writes on top of the inference
    # figures: 8 bytes per channel (mean and var, float32) and 16 per norm (num_batches_tracked)
    norms = [m for p, m in zoo.create_model("resnet18").named_modules()
             if isinstance(m, nn.BatchNorm2d) and not p.startswith("layer3.1.")]
    counted = scanned(path, specs)
    assert (counted["params"], counted["flops"]) == (d.totals["params"], d.totals["flops"])
    assert counted["mac_bytes"] - d.totals["mac_bytes"] == sum(8 * m.num_features + 16 for m in norms)


# --------------------------------------------------------------------------- 4. errors
def test_unknown_student_names_the_known_ones():
    target, specs, report, results = teacher("resnet18")
    with pytest.raises(ArchscanError) as info:
        distill(target, specs, student="depth:layer9:1")
    assert info.value.exit_code == 2
    assert "depth:layer9:1" in str(info.value)
    for r in results:
        assert r.student.id in info.value.hint


def test_nothing_to_propose():
    with pytest.raises(ArchscanError) as info:
        distill(nn.Linear(8, 4), (2, 8))
    assert info.value.exit_code == 2 and "no student" in str(info.value) and info.value.hint


def test_an_exported_program_is_not_a_teacher(tmp_path):
    path = tmp_path / "linear.pt2"
    torch.export.save(torch.export.export(nn.Linear(8, 4), (torch.randn(2, 8),)), str(path))
    with pytest.raises(ArchscanError) as info:
        distill(str(path), (2, 8))
    assert info.value.exit_code == 2 and "exported program" in str(info.value)


# --------------------------------------------------------------------------- 5. another kind of student
class Stage(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Toy(nn.Module):
    """a 3->8, b 8->8, head 8->4 (3x3 convs with bias), then a mean over H, W."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = Stage(3, 8), Stage(8, 8), Stage(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(self.a(x))).mean((2, 3))


def _narrow_b(model: nn.Module) -> nn.Module:
    model.b.conv = nn.Conv2d(8, 6, 3, padding=1)
    model.head.conv = nn.Conv2d(6, 4, 3, padding=1)
    return model


def _five_outputs(model: nn.Module) -> nn.Module:
    model.head = Stage(8, 5)
    return model


def _width(view):
    assert view.scores["b"].kind == "stage"  # what a proposer sees: the ranking, the modules, the stacks
    return [Student("width:b:6", "width", "b: 8 -> 6 channels", ("b", "head"), _narrow_b, priority=1.0,
                    why="test", pairs=(("b", "b"), ("head", "head"))),
            Student("width:head:5", "width", "a wrong student", ("head",), _five_outputs, priority=2.0)]


def test_a_new_kind_of_student_is_one_more_proposer(monkeypatch):
    monkeypatch.setitem(PROPOSERS, "width", _width)
    target, specs = to_target(Toy), input_specs("1,3,8,8")
    report = archscan.scan(target, specs, rules=["G1", "G2", "G3", "G4"], recommend=False, profile=False)
    ids = [s.id for s in candidates(report)]
    assert ids[:2] == ["width:head:5", "width:b:6"] and "shuffle:b" in ids
    wrong = check(report, target, specs, candidates(report)[0])
    assert not wrong.ok and wrong.totals is None
    assert wrong.error == "its output shapes 1×5 differ from the model's 1×4"
    with pytest.raises(ArchscanError, match="width:head:5: its output shapes 1×5"):
        distill(target, specs, student="width:head:5")
    assert distill(target, specs).student.id == "width:b:6"  # the best that passes its check
    r = check(report, target, specs, candidates(report)[1])
    assert r.ok
    # params: a 3*8*9 + 8 = 224, b 8*8*9 + 8 = 584, head 8*4*9 + 4 = 292 -> 1100;
    # the student's b 8*6*9 + 6 = 438 and head 6*4*9 + 4 = 220 -> 882
    assert (r.teacher["params"], r.totals["params"]) == (1100, 882)
    adapters = {m.teacher: m.adapter for m in r.mapping}
    assert adapters == {"a": None, "b": "1x1 conv 6->8", "head": None, "": None}
    # not estimated from the report: the recommender checks it, with the target and specs
    with pytest.raises(ValueError):
        estimate(report, r.student)
    ctx = Context(report, RuleContext(report), None, command_of(report))
    recs = distill_recommendations(ctx, target, specs)  # the wrong student is checked, and left out
    assert recs[0].target == ("b", "head") and recs[0].estimated_saving["params"] == 1100 - 882
    assert recs[0].basis == "mac" and "ms" not in recs[0].estimated_saving


def test_an_instance_teacher_is_copied_not_changed():
    model = Toy()
    d = distill(model, "1,3,8,8", student="shuffle:b")
    assert isinstance(model.b, Stage)  # the user's module is untouched
    built = d.student.build(model)     # the recipe on a deep copy
    assert isinstance(built.b, ShuffleUnit) and isinstance(model.b, Stage) and built.a is not model.a
    assert d.totals["params"] == 224 + unit_params(8, 8, 1) + 292


class Residual(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(x))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[Residual(16) for _ in range(5)])
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.layers(x))


class Tokens(nn.Module):
    """A ViT-like layout: the repeated blocks sit in encoder.layers, one level down."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.encoder, self.head = nn.Linear(8, 16), Encoder(), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)))


def test_blocks_one_level_down_and_a_sequential_model():
    target, specs = to_target(Tokens), input_specs("2,5,8")
    report = archscan.scan(target, specs, rules=["G1", "G2", "G3", "G4"], recommend=False, profile=False)
    students = {s.id: s for s in candidates(report)}
    assert set(students) == {"depth:encoder.layers:3"}  # 3-D tokens: no ShuffleNetV2 unit
    r = check(report, target, specs, students["depth:encoder.layers:3"])
    assert r.ok and r.student.changed == ("encoder.layers.3", "encoder.layers.4")
    # two Linear(16, 16): 2 * (256 + 16) = 544 parameters, 2 * 2*5 * 256 = 5120 multiply-adds
    assert (r.teacher["params"] - r.totals["params"], r.teacher["flops"] - r.totals["flops"]) == (544, 5120)
    assert estimate(report, r.student) == r.totals
    assert [(m.teacher, m.student, m.teacher_shape) for m in r.mapping] == [
        ("encoder.layers", "encoder.layers", (2, 5, 16)), ("", "", (2, 5, 3))]
    # an nn.Sequential model is a stack itself: Stage(3, 8) changes the shape, the three Stage(8, 8) keep it
    model = nn.Sequential(Stage(3, 8), Stage(8, 8), Stage(8, 8), Stage(8, 8))
    d = distill(model, "1,3,8,8", student="depth:model:2", train=False)
    assert d.student.changed == ("2", "3") and len(model) == 4
    assert d.teacher["params"] - d.totals["params"] == 2 * 584  # 8*8*9 + 8 each
    assert sorted(d.program.state_dict) == ["0.conv.bias", "0.conv.weight", "1.conv.bias", "1.conv.weight"]


PROFILE = DeviceProfile(device="cpu", name="test", threads=None, peak_flops={"float32": 1e9}, bandwidth=1e9,
                        launch_overhead_ms=0.01, created="now", torch_version=torch.__version__,
                        class_bandwidth={"norm": 5e8})


def test_predicted_latency_with_a_profile():
    target, specs = to_target("zoo:resnet18"), input_specs(INPUT)
    report = archscan.scan(target, specs, rules=["G1", "G2", "G3", "G4"], recommend=False, profile=PROFILE)
    assert {s.basis for s in stage_ranking(report)} == {"predicted"}
    unit = next(s for s in candidates(report) if s.id == "shuffle:layer4.1")
    r = check(report, target, specs, unit, profile=PROFILE)
    guess = estimate(report, unit, PROFILE)  # the unit's own nodes predicted apart
    assert {k: guess[k] for k in COUNTED} == {k: r.totals[k] for k in COUNTED}
    assert guess["predicted_ms"] == pytest.approx(r.totals["predicted_ms"], rel=1e-9)
    assert r.teacher["predicted_ms"] == pytest.approx(report.latency["predicted_ms"], rel=1e-12)
    ctx = Context(report, RuleContext(report), PROFILE, command_of(report))
    recs = distill_recommendations(ctx, target, specs)
    assert recs and all(rec.basis == "predicted" for rec in recs)
    by_id = {s.id: s for s in candidates(report)}
    for rec in recs:
        sid = rec.apply.split("--student ")[1].split()[0]
        if sid.startswith("width:"):
            continue  # built and counted by check(), not estimated from the report
        student = by_id[sid]
        assert rec.estimated_saving["ms"] == pytest.approx(
            r.teacher["predicted_ms"] - estimate(report, student, PROFILE)["predicted_ms"], rel=1e-9)


class Heads(nn.Module):
    """Three heads of one type read the same feature: a ModuleList, but no chain of blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.heads = Stage(3, 8), nn.ModuleList(Stage(8, 8) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return sum(head(x) for head in self.heads)


def test_parallel_heads_are_not_a_run_of_blocks():
    report = archscan.scan(Heads, "1,3,8,8", rules=[], recommend=False, profile=False)
    assert not [s for s in candidates(report) if s.kind == "depth"]
    chain = archscan.scan(lambda: nn.Sequential(Stage(3, 8), Stage(8, 8), Stage(8, 8)), "1,3,8,8", rules=[],
                          recommend=False, profile=False)
    assert [s.id for s in candidates(chain) if s.kind == "depth"] == ["depth:model:2"]


# --------------------------------------------------------------------------- 6. recommendations and text
def test_recommendations_save_what_the_student_saves():
    target, specs, report, results = teacher("resnet18")
    ctx = Context(report, RuleContext(report), None, command_of(report))
    recs = distill_recommendations(ctx, target, specs)
    assert 1 <= len(recs) <= 2 and all(r.kind == "distill" for r in recs)
    best = next(r for r in results if r.student.kind in ESTIMATED_KINDS)  # width students are not built in a scan
    rec = recs[0]
    assert rec.target == best.student.changed
    assert rec.estimated_saving == {k: best.teacher[k] - best.totals[k] for k in ("mac_bytes", "flops", "params", "kernels")}
    assert rec.basis == "mac"
    assert rec.apply == f"archscan distill zoo:resnet18 --input {INPUT} --student {best.student.id} -o resnet18-student.pt2"
    assert rec.findings and all(f["rule"] in ("G1", "G2", "G3", "G4") for f in rec.findings)
    # a Python object gets the Python call; no target, or an exported program, gets nothing
    python = Context(report, RuleContext(report), None, "")
    assert distill_recommendations(python, target, specs)[0].apply.startswith("from archscan.distill import distill")
    assert distill_recommendations(ctx, None) == []


def test_text_and_json(student_dir):
    d, path = saved("shufflenet_v2_x0_5", student_dir)
    text = distill_text(d, width=100)
    t, s = d.teacher, d.totals
    assert f"student  {d.student.id}: " in text
    assert f"params   {t['params']:,} -> {s['params']:,} ({s['params'] - t['params']:+,})" in text
    assert "teacher    student    teacher shape" in text and "(output)" in text
    assert all(len(line) <= 100 for line in text.splitlines() if str(path) not in line)  # a path is not split
    assert f"saved    {path}  (load:" in text and "eval mode: batch norms use running statistics" in text
    out = d.to_json()
    assert out["schema"] == "archscan.distill/1" and out["path"] == str(path) and out["mode"] == "eval"
    assert {k: out["teacher"][k] for k in COUNTED} == {k: t[k] for k in COUNTED}
    assert {k: out["student"][k] for k in COUNTED} == {k: s[k] for k in COUNTED}
    assert out["mapping"][-1] == {"teacher": "", "student": "", "teacher_shape": [1, 1000], "student_shape": [1, 1000],
                                  "adapter": None}
    json.dumps(out)


def test_width_student_cuts_the_stages_channel_groups(tmp_path):
    """width:layer4:0.5 cuts the two block-internal groups of resnet18's layer4 (512 -> 256 each):
    exactly the parameters archscan.prune counts, the output shape kept, the saved program scanned alike."""
    from archscan.prune import analyse, params_removed, plan

    specs = input_specs("1,3,64,64")
    grouping = analyse(to_target("zoo:resnet18"), specs)
    inside = [g.id for g in grouping.groups if g.pinned is None and all(m.startswith("layer4.") for m in g.modules)]
    cuts = plan(grouping, 0.5, inside)
    assert [(g.channels, g.channels - len(c)) for g, c in cuts] == [(512, 256), (512, 256)]
    path = str(tmp_path / "w.pt2")
    result = distill("zoo:resnet18", "1,3,64,64", student="width:layer4:0.5", path=path)
    removed = sum(params_removed(g, len(c), grouping.param_shapes, grouping.buffers) for g, c in cuts)
    assert result.teacher["params"] - result.totals["params"] == removed
    assert result.mapping[-1].teacher_shape == result.mapping[-1].student_shape == (1, 1000)
    scanned = archscan.scan(path, "1,3,64,64", rules=[], recommend=False)
    assert scanned.totals.params == result.totals["params"]
