"""Measurement, calibration and prediction on the CPU: harness logic with a fake clock, structure of a
real run, exact prediction arithmetic. Speed itself is measured in benchmarks/, never asserted here."""

import json

import pytest
import torch

import archscan
from archscan.errors import ArchscanError, DeviceError
from archscan.measure import (CudaClock, DeviceProfile, MeasureOptions, calibrate, load_profile,
                              predict_node, save_profile, summarize, time_fn)
from archscan.measure.predict import fidelity, kernels, spearman
from archscan.results import NodeReport


class FakeClock:
    """Each timed call takes the next scripted duration (ms)."""

    def __init__(self, durations):
        self.durations = list(durations)
        self.calls = 0
        self.syncs = 0

    def start(self):
        return None

    def stop(self, token):
        self.calls += 1
        return self.durations.pop(0)

    def sync(self):
        self.syncs += 1


def test_time_fn_warms_up_then_repeats_within_budget():
    calls = []
    clock = FakeClock([10.0] * 100)
    stats = time_fn(lambda: calls.append(1), clock, warmup=3, min_repeats=5, budget_ms=35.0)
    # 3 warm-up calls (untimed), then timed calls until 5 repeats; 5 * 10 ms exceeds the 35 ms budget
    assert len(calls) == 3 + 5 and clock.calls == 5 and clock.syncs == 1
    assert stats.median_ms == 10.0 and stats.repeats == 5


def test_time_fn_keeps_going_while_under_budget():
    clock = FakeClock([1.0] * 1000)
    stats = time_fn(lambda: None, clock, warmup=0, min_repeats=5, max_repeats=200, budget_ms=30.0)
    assert stats.repeats == 30  # 30 calls of 1 ms fill the 30 ms budget


def test_time_fn_respects_max_repeats():
    clock = FakeClock([0.001] * 1000)
    assert time_fn(lambda: None, clock, warmup=0, min_repeats=5, max_repeats=50, budget_ms=1e9).repeats == 50


def test_summarize_median_and_quartiles():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median_ms, s.p25_ms, s.p75_ms, s.min_ms, s.repeats) == (3.0, 2.0, 4.0, 1.0, 5)
    assert s.spread == pytest.approx((4.0 - 2.0) / 3.0)
    with pytest.raises(ValueError):
        summarize([])


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their average rank: ranks a = 1, 2.5, 2.5, 4; b = 1, 2, 3, 4
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, abs=1e-6)


PROFILE = DeviceProfile(device="cpu", name="Test CPU", threads=2, peak_flops={"float32": 1e9, "bfloat16": 2e9},
                        bandwidth=1e9, launch_overhead_ms=0.01, created="2026-11-22T00:00:00+00:00",
                        torch_version="x", class_flops={"depthwise_conv": 1e8}, class_bandwidth={"norm": 5e8})


def node(**kw):
    base = dict(name="n", op="Conv2d", module="m", module_type="Conv2d", category="conv", flops=0, elem_ops=0,
                mac_bytes=0, read_bytes=0, write_bytes=0, weight_bytes=0, params=0, out_shape=(1,), dtype="float32",
                aten_ops=("aten.convolution.default",))
    base.update(kw)
    return NodeReport(**base)


def test_prediction_formula_exact():
    # compute 2e6 / 1e9 = 2 ms, memory 1e6 / 1e9 = 1 ms, one kernel 0.01 ms -> 2.01 ms, compute-bound
    assert predict_node(node(flops=2_000_000, mac_bytes=1_000_000), PROFILE) == (pytest.approx(2.01), "compute")
    # memory-bound norm: 1e6 bytes at the norm class's 5e8 B/s = 2 ms; two ops but aten.empty launches nothing
    bn = node(category="norm", mac_bytes=1_000_000, aten_ops=("aten.empty.memory_format", "aten.native_batch_norm.default"))
    assert kernels(bn) == 1
    assert predict_node(bn, PROFILE) == (pytest.approx(2.01), "memory")
    # depthwise conv uses its class rate: 1e6 / 1e8 = 10 ms
    assert predict_node(node(category="depthwise_conv", flops=1_000_000), PROFILE)[0] == pytest.approx(10.01)
    # bf16 scales the class rate by the matmul peaks (2x) and falls back to the dtype peak otherwise
    assert predict_node(node(flops=2_000_000, dtype="bfloat16"), PROFILE)[0] == pytest.approx(1.01)
    # a class's own per-call overhead replaces the generic launch overhead: 2 ms + 0.5 ms
    import dataclasses

    with_floor = dataclasses.replace(PROFILE, class_overhead_ms={"conv": 0.5})
    assert predict_node(node(flops=2_000_000, mac_bytes=1_000_000), with_floor)[0] == pytest.approx(2.5)
    # a tiny op is overhead-bound
    assert predict_node(node(category="activation", mac_bytes=8, aten_ops=("aten.relu.default",)), PROFILE)[1] == "overhead"


def test_profile_round_trip(tmp_path):
    path = save_profile(PROFILE, tmp_path / "p.json")
    assert DeviceProfile.from_json(json.loads(path.read_text())) == PROFILE
    assert load_profile(torch.device("cpu"), path=path) == PROFILE


def test_quick_calibration_on_cpu_is_cached():
    profile = calibrate("cpu", quick=True)
    assert profile.peak_flops["float32"] > 0 and profile.bandwidth > 0 and profile.launch_overhead_ms > 0
    assert set(profile.class_flops) == {"conv", "grouped_conv", "depthwise_conv", "linear"}
    assert set(profile.class_overhead_ms) == set(profile.class_flops) | set(profile.class_bandwidth)
    assert all(v >= 0 for v in profile.class_overhead_ms.values())
    save_profile(profile)
    assert load_profile(torch.device("cpu")) == profile  # found again under the cache directory


def test_real_cpu_run_times_every_node(toy):
    r = archscan.scan(f"{toy}:Net", [(2, 3, 16, 16)], measure=MeasureOptions(device="cpu", node_budget_ms=2,
                                                                             e2e_budget_ms=5, progress=False))
    lat = r.latency
    assert lat["device"] == "cpu" and lat["threads"] == torch.get_num_threads()
    assert lat["end_to_end_ms"] > 0 and lat["throughput_per_s"] == pytest.approx(2 / (lat["end_to_end_ms"] / 1e3))
    assert all(n.latency_ms is not None and n.latency_ms > 0 for n in r.nodes)
    assert lat["timed_nodes"] == len(r.nodes)
    assert lat["per_layer_sum_ms"] == pytest.approx(sum(n.latency_ms for n in r.nodes))
    assert lat["gap_ms"] == pytest.approx(lat["end_to_end_ms"] - lat["per_layer_sum_ms"])
    assert r.module("").latency_ms == pytest.approx(lat["per_layer_sum_ms"])
    assert r.module("conv").latency_ms == pytest.approx(r.node("conv").latency_ms)


def test_predictions_with_a_profile(toy):
    r = archscan.scan(f"{toy}:Net", [(2, 3, 16, 16)], profile=PROFILE)
    assert all(n.predicted_ms is not None for n in r.nodes)
    assert r.latency["predicted_ms"] == pytest.approx(sum(n.predicted_ms for n in r.nodes))
    assert {n.attrs["bound"] for n in r.nodes} <= {"compute", "memory", "overhead", "none"}
    measured = archscan.scan(f"{toy}:Net", [(2, 3, 16, 16)], profile=PROFILE,
                             measure=MeasureOptions(device="cpu", node_budget_ms=2, e2e_budget_ms=5, progress=False))
    for n in measured.nodes:
        assert n.attrs["achieved"] == pytest.approx(n.predicted_ms / n.latency_ms)
    fit = fidelity(measured)
    assert fit["nodes"] == len([n for n in measured.nodes if n.category != "view"])
    assert -1 <= fit["spearman"] <= 1
    assert measured.latency["prediction_error"] == pytest.approx(
        measured.latency["predicted_ms"] / measured.latency["end_to_end_ms"] - 1)


def test_measure_options_are_checked_before_the_analysis(toy, monkeypatch):
    from archscan import analysis

    monkeypatch.setattr(analysis, "capture", lambda *a, **k: pytest.fail("analysed although the options are wrong"))
    with pytest.raises(ArchscanError, match="--amp"):
        archscan.scan(f"{toy}:Net", [(1, 3, 8, 8)], measure=MeasureOptions(device="cpu", amp="fp8"))
    with pytest.raises(DeviceError, match="unknown device"):
        archscan.scan(f"{toy}:Net", [(1, 3, 8, 8)], measure=MeasureOptions(device="tpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_missing_gpu_is_one_clear_error_before_any_analysis(capsys, toy, monkeypatch):
    from archscan import analysis
    from archscan.cli import main

    monkeypatch.setattr(analysis, "capture", lambda *a, **k: pytest.fail("analysed although the device is not there"))
    code = main([f"{toy}:Net", "--input", "1,3,8,8", "--measure", "--device", "cuda"])
    out, err = capsys.readouterr()
    assert code == 4 and "CUDA is not available" in err and "Traceback" not in err
    assert out == ""


def test_out_of_memory_becomes_a_device_error(toy, monkeypatch):
    from archscan.measure import run

    def boom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    monkeypatch.setattr(run, "_measure", boom)
    with pytest.raises(DeviceError, match="out of memory"):
        archscan.scan(f"{toy}:Net", [(1, 3, 8, 8)], measure=MeasureOptions(device="cpu"))


def test_too_big_to_measure_is_refused_before_allocating():
    with pytest.raises(DeviceError, match="real weights"):
        archscan.scan("zoo:llama3_70b", ["1,8:int64"], measure=MeasureOptions(device="cpu"))


def test_guidelines_structure_on_cpu():
    from archscan.measure.guidelines import run_guidelines
    from archscan.zoo.probes import TABLES

    where, (table,) = run_guidelines("cpu", tables=("G4",), blocks=2, budget_ms=5)
    assert where.startswith("cpu")
    assert [r.name for r in table.rows] == list(TABLES["G4"])
    assert all(r.throughput > 0 and r.paper_gpu > 0 and r.paper_cpu > 0 for r in table.rows)
    assert -1 <= table.spearman_cpu <= 1 and isinstance(table.ordering_holds, bool)
    # at x2 and x4 channels too, where a rounded width is not the default input's times the scale
    for scale in (2, 4):
        _, (table,) = run_guidelines("cpu", scale=scale, tables=("G3",), blocks=1, budget_ms=1)
        assert [r.name for r in table.rows] == list(TABLES["G3"]) and all(r.throughput > 0 for r in table.rows)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_measurement(toy):
    r = archscan.scan(f"{toy}:Net", [(8, 3, 32, 32)], measure=MeasureOptions(device="cuda", progress=False))
    assert r.latency["device"].startswith("cuda") and r.latency["cudnn_benchmark"]
    assert all(n.latency_ms > 0 for n in r.nodes)


def test_autocast_predicts_matmul_class_nodes_in_low_precision():
    import dataclasses

    from archscan.measure.predict import as_run

    conv = node(flops=2_000_000, mac_bytes=1_000_000)
    relu = node(category="activation", mac_bytes=1_000_000, aten_ops=("aten.relu.default",))
    assert as_run(conv, "bf16") == dataclasses.replace(conv, dtype="bfloat16", mac_bytes=500_000)
    assert as_run(relu, "bf16") is relu  # autocast leaves element-wise ops alone
    # bf16 peak is 2e9: 2e6 / 2e9 = 1 ms + 0.01 ms launch
    assert predict_node(as_run(conv, "bf16"), PROFILE)[0] == pytest.approx(1.01)


def test_cuda_clock_brackets_with_events_and_synchronizes(monkeypatch):
    """The CUDA clock's logic, with torch.cuda.Event replaced (runs without a GPU)."""

    log = []

    class FakeEvent:
        count = 0

        def __init__(self, enable_timing=False):
            assert enable_timing
            FakeEvent.count += 1
            self.t = FakeEvent.count * 1.5

        def record(self):
            log.append("record")

        def synchronize(self):
            log.append("sync")

        def elapsed_time(self, end):
            return end.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    clock = CudaClock(torch.device("cuda"))
    token = clock.start()
    assert clock.stop(token) == pytest.approx(1.5)
    assert log == ["record", "record", "sync"]  # start event, end event, wait for the end event



def test_sweep_on_cpu(toy):
    r = archscan.scan(f"{toy}:Net", [(1, 3, 16, 16)], rules=["batch-size"],
                      measure=MeasureOptions(device="cpu", node_budget_ms=1, e2e_budget_ms=5, progress=False, sweep=True))
    batches = r.latency["sweep"]["batches"]
    assert [b["batch"] for b in batches] == [1, 2, 4, 8]
    assert all(b["per_s"] == pytest.approx(b["batch"] / (b["ms"] / 1e3)) for b in batches)
    assert "input_copies" not in r.latency["sweep"]  # GPU only



def test_eager_capture_is_timed_per_leaf_module(toy):
    r = archscan.scan(f"{toy}:DataBranch", [(1, 3, 16, 16)], rules=[],
                      measure=MeasureOptions(device="cpu", e2e_budget_ms=5, progress=False))
    assert r.capture == "eager"
    conv, fc = r.module("conv").latency_ms, r.module("fc").latency_ms
    assert conv > 0 and fc > 0
    assert r.latency["per_layer_sum_ms"] == pytest.approx(conv + fc)
    assert r.latency["timed_nodes"] == 2 and "leaf modules" in r.latency["per_layer_note"]
    assert all(n.latency_ms is None for n in r.nodes)


def test_any_failure_while_measuring_is_a_device_error(toy, monkeypatch):
    from archscan.measure import run

    def boom(*a, **k):
        raise ValueError("kernel not implemented for 'Half'")

    monkeypatch.setattr(run, "_measure", boom)
    with pytest.raises(DeviceError, match="failed while measuring on cpu: ValueError"):
        archscan.scan(f"{toy}:Net", [(1, 3, 8, 8)], measure=MeasureOptions(device="cpu"))


# --- unstable timings: retried, flagged, warned about; unstable calibrations not cached -------------------

class CycleClock:
    """Each timed call takes the next duration (ms) of ``durations``, over and over; with ``noisy``
    off it takes the first one every time. [1, 2, 4, 8] makes any 5 or more consecutive samples,
    or every other one, spread far over 25% (e.g. sorted 1 1 2 4 8: (4 - 1) / 2 = 150%)."""

    def __init__(self, durations, noisy=True):
        self.durations, self.noisy, self.calls = list(durations), noisy, 0

    def start(self):
        return None

    def stop(self, token):
        self.calls += 1
        return self.durations[(self.calls - 1) % len(self.durations)] if self.noisy else self.durations[0]

    def sync(self):
        pass


NOISE = [1.0, 2.0, 4.0, 8.0]
# Ten times that for calibrations: every round overruns its budget, so none is repeated (quick tests;
# the retries themselves are tested above).
SLOW_NOISE = [10 * ms for ms in NOISE]


def test_unstable_means_a_spread_over_a_quarter():
    from archscan.measure import UNSTABLE_SPREAD, is_unstable

    assert UNSTABLE_SPREAD == 0.25 and not is_unstable(0.25) and is_unstable(0.2501)
    # sorted 1 2 3 4 5: (4 - 2) / 3 = 0.667
    assert summarize([5.0, 1.0, 3.0, 2.0, 4.0]).unstable
    # sorted 10 10 11 11 12: (11 - 10) / 11 = 0.091
    steady = summarize([10.0, 11.0, 10.0, 12.0, 11.0])
    assert not steady.unstable and steady.to_json()["unstable"] is False and steady.to_json()["rounds"] == 1


def test_time_stable_retries_with_twice_the_repeats_until_stable():
    from archscan.measure import time_stable

    # round 1: 5 repeats (17 ms, budget 10), sorted 1 1 5 5 5: (5 - 1) / 5 = 0.8, unstable
    # round 2: 10 repeats of 2 ms (budget 20), spread 0
    clock = FakeClock([1.0, 5.0, 1.0, 5.0, 5.0] + [2.0] * 10)
    stats = time_stable(lambda: None, clock, warmup=0, min_repeats=5, budget_ms=10.0)
    assert (stats.rounds, stats.repeats, stats.median_ms, stats.unstable) == (2, 10, 2.0, False)
    assert clock.calls == 15 and clock.syncs == 2 and clock.durations == [] and stats.total_ms == 17 + 20


def test_time_stable_gives_up_with_the_steadiest_round():
    from archscan.measure import time_stable

    # round 1 (5 repeats, budget 10): sorted 1 1 5 5 5, spread 0.8
    # round 2 (10, budget 20): sorted 1 1 1 2 2 2 2 2 3 4: p25 = 1 + 0.25 * (2 - 1) = 1.25, median 2, p75 2: 0.375
    # round 3 (20, budget 40): ten 1s and ten 5s: (5 - 1) / 3 = 1.33
    clock = FakeClock([1.0, 5.0, 1.0, 5.0, 5.0] + [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 3.0, 4.0]
                      + [1.0, 5.0] * 10)
    stats = time_stable(lambda: None, clock, retries=2, warmup=0, min_repeats=5, budget_ms=10.0)
    assert clock.calls == 5 + 10 + 20  # each retry doubles the repeats, then it stops
    assert (stats.rounds, stats.repeats, stats.median_ms) == (3, 10, 2.0)
    assert stats.spread == pytest.approx(0.375) and stats.unstable


def test_time_stable_does_not_repeat_calls_that_overrun_the_budget():
    from archscan.measure import time_stable

    # 5 repeats took 17 ms against a 5 ms budget: a longer round would not fit either
    clock = FakeClock([1.0, 5.0, 1.0, 5.0, 5.0] * 10)
    stats = time_stable(lambda: None, clock, warmup=0, min_repeats=5, budget_ms=5.0)
    assert (stats.rounds, stats.repeats, clock.calls) == (1, 5, 5) and stats.unstable


def _measure_with(monkeypatch, toy, clock, name="Net", e2e_budget_ms=5):
    from archscan.measure import run

    monkeypatch.setattr(run, "clock_for", lambda device: clock)
    return archscan.scan(f"{toy}:{name}", [(1, 3, 16, 16)], rules=[], measure=MeasureOptions(
        device="cpu", node_budget_ms=2, e2e_budget_ms=e2e_budget_ms, progress=False))


def test_unstable_end_to_end_is_retried_then_warned_about(monkeypatch, toy):
    # 10 repeats of 1-8 ms take about 38 ms: within twice a 40 ms budget, so the rounds go on
    r = _measure_with(monkeypatch, toy, CycleClock(NOISE), e2e_budget_ms=40)
    lat = r.latency
    assert lat["unstable"] is True and lat["end_to_end"]["unstable"] is True
    assert lat["end_to_end"]["rounds"] == 3 and lat["end_to_end"]["spread"] > 0.25
    timed = lat["timed_nodes"]
    assert timed == len(r.nodes) and lat["unstable_nodes"] == timed
    assert all(n.attrs["latency_unstable"] for n in r.nodes)
    (warning,) = r.warnings
    assert warning.startswith("the end-to-end timing is unstable: spread ")
    assert f"{timed} of {timed} layer timings are unstable" in warning and "--threads" in warning
    data = r.to_json()
    assert data["latency"]["unstable"] is True and data["warnings"] == [warning]


def test_stable_measurement_has_no_warning(monkeypatch, toy):
    r = _measure_with(monkeypatch, toy, CycleClock(NOISE, noisy=False))
    lat = r.latency
    assert lat["unstable"] is False and lat["unstable_nodes"] == 0 and lat["end_to_end"]["rounds"] == 1
    assert r.warnings == () and r.to_json()["warnings"] == []
    assert not any("latency_unstable" in n.attrs for n in r.nodes)


def test_unstable_layers_alone_are_counted(monkeypatch, toy):
    from archscan.measure import run

    clock = CycleClock(NOISE, noisy=False)
    replay = run._TimingInterpreter.run

    def noisy_from_here(self, *args):  # the end to end was steady; the machine gets busy for the nodes
        clock.noisy = True
        return replay(self, *args)

    monkeypatch.setattr(run._TimingInterpreter, "run", noisy_from_here)
    r = _measure_with(monkeypatch, toy, clock)
    lat = r.latency
    n = lat["timed_nodes"]
    assert lat["unstable"] is False and lat["unstable_nodes"] == n > 0
    (warning,) = r.warnings
    assert warning.startswith(f"{n} of {n} layer timings are unstable (") and "even after a retry" in warning


def test_unstable_leaf_modules_of_an_eager_capture_are_counted(monkeypatch, toy):
    r = _measure_with(monkeypatch, toy, CycleClock(NOISE), name="DataBranch")
    assert r.capture == "eager" and r.latency["unstable_nodes"] == r.latency["timed_nodes"] == 2
    assert "2 of 2 layer timings are unstable (conv, fc)" in r.warnings[0]


def test_unstable_measurement_in_the_cli_json(capsys, monkeypatch, toy):
    from archscan.cli import main
    from archscan.measure import run

    monkeypatch.setattr(run, "clock_for", lambda device: CycleClock(NOISE))
    code = main([f"{toy}:Net", "--input", "1,3,8,8", "--measure", "--device", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    assert data["latency"]["unstable"] is True and data["latency"]["end_to_end"]["spread"] > 0.25
    assert len(data["warnings"]) == 1 and "archscan: warning: the end-to-end timing is unstable" in err


def _calibrate_with(monkeypatch, clock):
    from archscan.measure import profile

    monkeypatch.setattr(profile, "clock_for", lambda device: clock)
    return calibrate("cpu", quick=True)


def test_calibration_records_the_spread_of_every_quantity(monkeypatch):
    from archscan.measure import instability

    p = _calibrate_with(monkeypatch, CycleClock([0.9], noisy=False))
    assert set(p.spread) == ({"peak_flops.float32", "bandwidth", "launch_overhead_ms"}
                             | {f"class_flops.{c}" for c in p.class_flops}
                             | {f"class_bandwidth.{c}" for c in p.class_bandwidth}
                             | {f"class_overhead_ms.{c}" for c in p.class_overhead_ms})
    assert all(s == 0.0 for s in p.spread.values()) and instability(p) == {}
    # 200 ReLU calls take 0.9 ms: 4.5 us each; a 7x7 conv 0.9 - 0.9 * (7 * 7) / (28 * 28) ms beyond its rate
    assert p.launch_overhead_ms == pytest.approx(0.0045)
    assert p.class_overhead_ms["conv"] == pytest.approx(0.9 - 0.9 * 49 / 784)


def test_noisy_calibration_is_unstable(monkeypatch):
    from archscan.measure import instability

    p = _calibrate_with(monkeypatch, CycleClock(SLOW_NOISE))
    assert all(s > 0.25 for s in p.spread.values())
    assert set(instability(p)) == set(p.spread)


def test_implausible_overhead_is_unstable_even_when_steady(monkeypatch):
    from archscan.measure import instability

    # every op takes 5 ms: a 7x7 conv costs 5 ms - 5 * (7 * 7) / (28 * 28) = 4.69 ms beyond its rate
    p = _calibrate_with(monkeypatch, CycleClock([5.0], noisy=False))
    assert p.class_overhead_ms["conv"] == pytest.approx(5.0 - 5.0 * 49 / 784)
    problems = instability(p)
    assert problems["class_overhead_ms.conv"] == "4688 us per call"
    assert "launch_overhead_ms" not in problems  # 5 ms / 200 calls = 25 us is plausible
    assert not any("spread" in why for why in problems.values())


def test_instability_of_a_profile_exact():
    import dataclasses

    from archscan.measure import instability, instability_error

    p = dataclasses.replace(PROFILE, spread={"bandwidth": 0.3, "peak_flops.float32": 0.25, "class_overhead_ms.conv": 0.4},
                            class_overhead_ms={"conv": 1.5, "norm": 0.002})
    assert instability(p) == {"bandwidth": "spread 30%", "class_overhead_ms.conv": "spread 40% and 1500 us per call"}
    error = instability_error(p)
    assert isinstance(error, DeviceError) and error.exit_code == 4 and str(error).startswith(
        "the calibration of cpu is unstable (a spread over 25% or a per-call overhead over 1000 us), so the profile "
        "was not saved: bandwidth spread 30%; class_overhead_ms.conv spread 40% and 1500 us per call (")
    assert "--force" in error.hint
    assert instability_error(PROFILE) is None


def test_profile_spreads_round_trip_and_old_profiles_load(tmp_path):
    import dataclasses

    p = dataclasses.replace(PROFILE, spread={"bandwidth": 0.03})
    assert load_profile(torch.device("cpu"), path=save_profile(p, tmp_path / "p.json")) == p
    old = {k: v for k, v in PROFILE.to_json().items() if k != "spread"}  # saved before spreads were recorded
    assert DeviceProfile.from_json(old).spread == {}
    with pytest.raises(ValueError):
        DeviceProfile.from_json({**old, "spread": {"bandwidth": "wide"}})


def _cached_profiles():
    from archscan.measure import cache_dir

    return sorted((cache_dir() / "profiles").glob("*.json"))


def test_calibrate_refuses_to_cache_an_unstable_profile_unless_forced(capsys, monkeypatch, toy):
    from archscan.cli import main
    from archscan.measure import profile

    monkeypatch.setattr(profile, "clock_for", lambda device: CycleClock(SLOW_NOISE))
    code = main(["calibrate", "--device", "cpu", "--quick"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 4 and len(lines) == 1 and lines[0].startswith("archscan: error: the calibration of cpu is unstable")
    assert "--force" in lines[0] and "Traceback" not in err
    assert _cached_profiles() == []  # nothing cached
    assert "UNSTABLE: spread" in out and "not saved (unstable)" in out

    code = main(["calibrate", "--device", "cpu", "--quick", "--force"])
    out, err = capsys.readouterr()
    assert code == 0 and err == "" and "UNSTABLE" in out
    (path,) = _cached_profiles()
    assert str(path) in out
    # every later prediction from it says that it is unstable
    code = main([f"{toy}:Net", "--input", "1,3,8,8", "--device", "cpu", "--json"])  # the CPU profile, on a GPU machine too
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert code == 0 and data["latency"]["predicted_ms"] > 0
    assert len(data["warnings"]) == 1 and "is unstable" in data["warnings"][0]
    assert err.startswith("archscan: warning: the device profile of cpu")


def test_calibrate_output_shows_the_spread_of_each_quantity(capsys, monkeypatch):
    from archscan.cli import main
    from archscan.measure import profile

    monkeypatch.setattr(profile, "clock_for", lambda device: CycleClock([0.9], noisy=False))
    code = main(["calibrate", "--device", "cpu", "--quick"])
    out, _ = capsys.readouterr()
    (saved,) = _cached_profiles()
    cached = load_profile(torch.device("cpu"), path=saved)
    rows = [line for line in out.splitlines() if "spread" in line]
    assert code == 0 and len(rows) == len(cached.spread) > 10
    assert all(row.endswith("spread 0.0%") for row in rows) and "UNSTABLE" not in out
    assert any(row.startswith("launch overhead") and "4.5 us per kernel" in row for row in rows)
    code = main(["calibrate", "--device", "cpu", "--quick", "--json"])
    data = json.loads(capsys.readouterr()[0])
    assert code == 0 and data["spread"] == cached.spread and data["unstable"] == {} and data["saved"] == str(saved)


class _GpuLikeClock(CudaClock):
    """A CUDA clock without CUDA: each call of the timed function advances it 2 ms, or 3 ms when
    it is the first call after ``start`` (the host's dispatch, before the device is busy)."""

    def __init__(self):
        super().__init__(torch.device("cpu"))
        self.now, self.fresh = 0.0, True

    def tick(self):
        self.now += 3.0 if self.fresh else 2.0
        self.fresh = False

    def start(self):
        self.fresh = True
        return self.now

    def stop(self, token):
        return self.now - token

    def sync(self):
        pass


def test_gpu_timings_are_back_to_back_and_per_call():
    """On a GPU a node is timed as the forward runs it: BACK_TO_BACK calls in each sample, the
    sample divided by them; the first call's dispatch is a tenth of it. On the CPU: single calls."""
    from archscan.measure.timing import BACK_TO_BACK, time_back_to_back

    clock, calls = _GpuLikeClock(), []
    stats = time_back_to_back(lambda: (calls.append(1), clock.tick()), clock, warmup=0, min_repeats=5, budget_ms=0)
    assert len(calls) == 5 * BACK_TO_BACK
    assert stats.median_ms == pytest.approx((3.0 + 2.0 * (BACK_TO_BACK - 1)) / BACK_TO_BACK)
    single = CycleClock([7.0], noisy=False)
    assert time_back_to_back(lambda: None, single, warmup=0, min_repeats=5, budget_ms=0).median_ms == 7.0
    assert single.calls == 5


def test_gpu_class_rates_fill_the_device_and_take_the_linear_bandwidth(monkeypatch):
    """A GPU's class rates are measured on _RATE_MAP's map (not a CPU's batch-1 layer, which a GPU
    runs under its dispatch time); its linear layers have no rate of their own (the matmul peak)
    but the bandwidth of a skinny product. Run here on the CPU, with small shapes."""
    from archscan.measure import profile as prof
    from archscan.measure.timing import CpuClock

    seen = []
    real_ops = prof._class_ops
    def spy(device, hw, c, batch=1):
        seen.append((batch, hw, c))
        return real_ops(device, hw, c, batch)

    monkeypatch.setattr(prof, "_class_ops", spy)
    monkeypatch.setattr(prof, "_RATE_MAP", {"cpu": prof._RATE_MAP["cpu"], "cuda": dict(batch=3, hw=16, c=16)})
    monkeypatch.setattr(prof, "_SKINNY_LINEAR", (2, 64, 96))
    flops, bandwidth, overhead, spread = prof._class_rates(torch.device("cpu"), CpuClock(), 2.0, False, 1e12, gpu=True)
    assert seen == [(3, 16, 16), (1, 7, 64)]  # the device-filling map, then the overheads' late layer
    assert "linear" not in flops and set(flops) == {"conv", "grouped_conv", "depthwise_conv"}
    assert bandwidth["linear"] > 0 and "class_bandwidth.linear" in spread
    assert set(overhead) == set(flops) | set(bandwidth) and all(v >= 0 for v in overhead.values())
    # the CPU keeps its batch-1 layer and its linear rate
    seen.clear()
    flops, bandwidth, _, _ = prof._class_rates(torch.device("cpu"), CpuClock(), 2.0, True, 1e12)
    assert seen[0] == (1, 28, 64) and "linear" in flops and "linear" not in bandwidth
