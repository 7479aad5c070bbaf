"""tests/gpu_truth/capture.py, the script that records GPU truth: its held-out set runs end to end on
the CPU (--dry, toy sizes) and writes the summary lines README.md documents; its largest-batch search
finds the boundary; the recorded set is still the one whose data is in tests/gpu_truth."""

import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_truth")
CAPTURE = os.path.join(HERE, "capture.py")


@pytest.fixture(scope="module")
def capture():
    """capture.py as a module: imported (not run), it parses no command line and touches no GPU."""
    spec = importlib.util.spec_from_file_location("gpu_truth_capture", CAPTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Keys of every configuration's line, and those of its kind (README.md, "Files" and "Held-out set").
COMMON = {"id", "model", "kind", "params", "ok", "wall_s"}
KIND_KEYS = {
    "decode": {"b", "n", "dtype", "own_bytes", "eager_ms", "experts_implementation"},
    "maxbatch": {"run", "n", "budget_gib", "budget_bytes", "start", "cap_s", "largest", "smallest_oom", "complete",
                 "tries", "dry_fake_largest"},
}
SEARCH = "maxbatch_gpt2_train_x1024_12gib"


def test_heldout_dry_run_writes_the_documented_lines(tmp_path, capture):
    pytest.importorskip("transformers")
    only = "maxbatch_gpt2_train,lat_mixtral_small_decode_b1_"  # a search of training steps, a MoE decode
    proc = subprocess.run([sys.executable, CAPTURE, "--dry", "--set", "heldout", "--out", str(tmp_path), "--only", only],
                          check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in (tmp_path / "summary.jsonl").read_text().splitlines()]
    env, recs = lines[0], {r["id"]: r for r in lines[1:]}
    assert env["id"] == "env" and env["dry"] is True and env["set"] == "heldout"
    assert set(recs) == {"maxbatch_gpt2_train_x1024_12gib", "lat_mixtral_small_decode_b1_l2048_bf16"}
    for rec in recs.values():
        assert rec["ok"] is True, rec.get("tb")
        expected = COMMON | KIND_KEYS[rec["kind"]]
        assert expected <= set(rec), (rec["id"], expected - set(rec))

    decode = recs["lat_mixtral_small_decode_b1_l2048_bf16"]
    assert decode["eager_ms"] > 0 and decode["experts_implementation"]
    assert decode["own_bytes"] >= 2 * decode["params"]  # bf16 weights, at least
    with gzip.open(tmp_path / decode["id"] / "trace.json.gz", "rt") as f:
        assert any(e.get("cat") == "cpu_op" for e in json.load(f)["traceEvents"])
    assert not (tmp_path / SEARCH).exists()  # a search writes its line only

    # the fake budget fits up to 5 rows: from start 4, tries 4 (ok), 8 (oom), then 6 (oom), 5 (ok)
    search = recs[SEARCH]
    assert search["dry_fake_largest"] == capture.DRY_FAKE_LARGEST == 5
    assert (search["largest"], search["smallest_oom"], search["complete"]) == (5, 6, True)
    assert [(t["b"], t["outcome"]) for t in search["tries"]] == [(4, "ok"), (8, "oom"), (6, "oom"), (5, "ok")]
    assert search["budget_bytes"] == 12 * 2**30


@pytest.mark.parametrize("start,fits_up_to,expected_tries", [
    (4, 37, [4, 8, 16, 32, 64, 48, 40, 36, 38, 37]),  # doubling, then bisection
    (64, 3, [64, 32, 16, 8, 4, 2, 3]),  # halving while nothing fits, then bisection
    (4, 0, [4, 2, 1]),  # nothing fits: largest 0
    (1, 1, [1, 2]),
])
def test_search_finds_the_largest_batch(capture, start, fits_up_to, expected_tries):
    tried = []

    def fits(b):
        tried.append(b)
        return b <= fits_up_to

    assert capture.search_largest(fits, start, give_up=lambda: False) == (fits_up_to, fits_up_to + 1, True)
    assert tried == expected_tries


def test_search_stops_at_its_cap_and_limit(capture):
    calls = []
    assert capture.search_largest(lambda b: calls.append(b) or True, 1, give_up=lambda: len(calls) >= 3) == (4, None, False)
    assert capture.search_largest(lambda b: True, 1, give_up=lambda: False, limit=100) == (64, None, False)
    assert capture.search_largest(lambda b: b < 10, 1, give_up=lambda: True) == (1, None, False)


def test_recorded_set_is_the_recorded_data(capture):
    summary = os.path.join(HERE, "summary.jsonl")
    if not os.path.exists(summary):
        pytest.skip("the recorded data is not in this checkout")
    with open(summary) as f:
        recorded = [json.loads(line)["id"] for line in f][1:]
    assert [c[0] for c in capture.SETS["recorded"]] == recorded and len(recorded) == 20
    assert all(c[-1] == 0 for c in capture.SETS["recorded"])  # no estimate: the deadline rule as it was recorded


def test_heldout_set_is_held_out_bounded_and_documented(capture):
    heldout = capture.SETS["heldout"]
    ids = [c[0] for c in heldout]
    assert len(set(ids)) == len(ids)
    assert not {c[1] for c in heldout} & {c[1] for c in capture.CONFIGS}  # no recorded model
    assert all(c[1] in capture.FACTORIES for c in heldout)
    assert all(c[-1] > 0 for c in heldout) and sum(c[-1] for c in heldout) < capture.DEADLINE_S["heldout"]
    assert all(c[3]["cap_s"] <= 60 for c in heldout if c[2] == "maxbatch")  # every search is bounded
    # every id is named, whole, in the README's held-out table
    with open(os.path.join(HERE, "README.md")) as f:
        section = f.read().split("## Held-out set", 1)[1]
    assert [i for i in ids if not re.search(rf"\| {re.escape(i)} \|", section)] == []
