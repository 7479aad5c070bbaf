"""Defects found by trying archscan on models nobody here wrote, one test per class, each on a model
of its kind (tests/models/new_users.py): recurrent layers through the file path, apply lines, integer
input values, attention fuse leaves, building blocks, false findings, transforms' saved programs,
prune's channel rules, mixture-of-experts GEMMs, causal attention, datasheet profiles and decode."""

from __future__ import annotations

import contextlib
import json
import os
import shlex

import pytest
import torch

import archscan
from archscan import zoo
from archscan.cli import main

MODELS = os.path.join(os.path.dirname(__file__), "models", "new_users.py")


def _scan_json(capsys, *args) -> dict:
    assert main([*args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("cls, spec, flops", [
    # T * N * gates * H * (I + H) per layer and direction, plus the head
    ("LSTMHead", "4,50,64", 50 * 4 * 4 * 128 * (64 + 128) + 4 * 128 * 10),
    ("StackedGRU", "20,4,32", 20 * 4 * 3 * 48 * ((32 + 48) * 2 + (96 + 48) * 2)),
    ("TanhRNN", "4,30,16", 30 * 4 * 24 * (16 + 24)),
])
def test_recurrent_layers_through_the_file_path(capsys, cls, spec, flops):
    """A class in a file (the direct run cannot run an RNN's fused kernel on meta weights) counts
    what the instance counts: the hand formula."""
    report = _scan_json(capsys, f"{MODELS}:{cls}", "--input", spec)
    assert report["totals"]["flops"] == flops
    import importlib.util

    found = importlib.util.spec_from_file_location("new_users", MODELS)
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    instance = archscan.scan(getattr(module, cls)(), spec, recommend=False, rules=[])
    assert instance.totals.flops == flops and instance.totals.params == report["totals"]["params"]


def test_a_real_input_error_is_still_named(capsys):
    assert main([f"{MODELS}:LSTMHead", "--input", "4,50,32"]) == 2
    assert "rejected input of shape [4, 50, 32]" in capsys.readouterr().err


def test_integer_inputs_take_values(capsys):
    """Zeros for lengths fail with a hint; values drawn from a range (seeded) decide the path and
    the report says which were used; 50..50 gives full sequences, by hand."""
    assert main([f"{MODELS}:PackedLSTM", "--input", "4,50:int64", "--input", "4:int64"]) == 3
    assert "give them values: --input" in capsys.readouterr().err
    per_token = 4 * 32 * (16 + 32)
    full = _scan_json(capsys, f"{MODELS}:PackedLSTM", "--input", "4,50:int64=1..99", "--input", "4:int64=50..50")
    assert full["totals"]["flops"] == 4 * 50 * per_token
    assert full["inputs"][1]["values"] == [50, 50]
    ranged = _scan_json(capsys, f"{MODELS}:PackedLSTM", "--input", "4,50:int64=1..99", "--input", "4:int64=1..50")
    lengths = torch.randint(1, 51, (4,), generator=torch.Generator().manual_seed(1))
    assert ranged["totals"]["flops"] == int(lengths.sum()) * per_token
    assert any("integers uniform in 1..50" in note for note in ranged["capture_notes"])


def test_example_tensors_lend_their_values():
    import importlib.util

    found = importlib.util.spec_from_file_location("new_users", MODELS)
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    lengths = torch.tensor([5, 17, 3, 9])
    report = archscan.scan(module.PackedLSTM(), [torch.randint(1, 99, (4, 20)), lengths], recommend=False, rules=[])
    assert report.totals.flops == int(lengths.sum()) * 4 * 32 * (16 + 32)
    assert report.inputs[1]["values"] == "the example tensor's"


@pytest.mark.parametrize("text, message", [("1,3=1..5", "values LOW..HIGH are for integer inputs"),
                                           ("4:int64=9..1", "the range 9..1 is empty")])
def test_bad_values_are_one_line(capsys, text, message):
    assert main(["zoo:resnet18", "--input", text]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_apply_lines_run_as_printed_on_the_same_model(capsys, tmp_path):
    """Every archscan command a recommendation prints carries the constructor arguments: run as
    printed, it acts on the model the report is about (its parameter count)."""
    report = _scan_json(capsys, f"{MODELS}:conv_net", "--kwargs", "width=0.5,act=gelu", "--input", "2,3,32,32")
    lines = [r["apply"] for r in report["recommendations"] if r["apply"].startswith("archscan ")]
    assert lines and all("--kwargs width=0.5,act=gelu" in line for line in lines)
    fuse = next(line for line in lines if line.startswith("archscan fuse"))
    args = shlex.split(fuse)[1:]
    args[args.index("-o") + 1] = str(tmp_path / "fused.pt2")
    assert main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    fused = _scan_json(capsys, str(tmp_path / "fused.pt2"))
    convs = 3 * 16 * 9 + 16 + 16 * 16 * 9 + 16  # width 0.5: 16 channels, biases from the folded norms
    assert fused["totals"]["params"] == convs + 16 * 10 + 10


def test_one_recommendation_per_change():
    from archscan.recommend import _merged
    from archscan.results import Recommendation

    def rec(target):
        return Recommendation("host-sync", (target,), "a sync", {"mac_bytes": 0, "ms": 1.0}, "measured", "fix it",
                              ({"rule": "host-sync", "module": target},))

    merged = _merged([rec("a"), rec("b"), rec("a")])
    assert len(merged) == 1 and merged[0].target == ("a", "b") and merged[0].estimated_saving["ms"] == 3.0
    assert len(merged[0].findings) == 2


def test_capture_notes_say_in_words_why_fx_gave_way(capsys):
    report = _scan_json(capsys, f"{MODELS}:PackedLSTM", "--input", "4,50:int64=1..99", "--input", "4:int64=1..50")
    assert "symbolic tracing could not follow it" in report["capture_notes"][0]
    assert "__cuda_array_interface__" not in report["capture_notes"][0]
    autocast = [r["apply"] for r in report["recommendations"] if r["kind"] == "low-precision"]
    if not torch.cuda.is_available():  # a CPU-only scan names the CPU's autocast
        assert all("torch.autocast('cpu'" in a for a in autocast)


def test_fuse_keeps_trained_batch_norm_statistics(tmp_path):
    """An instance whose batch norms carry statistics is fused as given: the saved program computes
    what the model does (no random statistics put in their place)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3), torch.nn.BatchNorm2d(8))
    for _ in range(3):
        model(torch.randn(4, 3, 16, 16) * 3 + 2)
    model.eval()
    x = torch.randn(1, 3, 16, 16)
    result = archscan.fuse(model, [x], path=str(tmp_path / "f.pt2"))
    assert "own weights" in result.weights and result.check.passed
    got = torch.export.load(str(tmp_path / "f.pt2")).module()(x)
    assert torch.allclose(got, model(x), atol=1e-5)


def test_building_blocks_are_the_innermost_repeated_units(capsys):
    """The same eight residual blocks are the building blocks, and give the same G3 finding,
    whether the model nests them in two stages or lists them flat."""
    staged = _scan_json(capsys, f"{MODELS}:Staged", "--input", "1,3,16,16")
    flat = _scan_json(capsys, f"{MODELS}:Flat", "--input", "1,3,16,16")
    assert [b["type"] for b in staged["blocks"]] == [b["type"] for b in flat["blocks"]] == ["Residual"] * 8
    assert [b["fragments"] for b in staged["blocks"]] == [b["fragments"] for b in flat["blocks"]]
    g3 = lambda r: sorted((f["severity"], f["message"]) for f in r["findings"] if f["rule"] == "G3")  # noqa: E731
    assert g3(staged) == g3(flat) and g3(flat)


@pytest.mark.parametrize("capture", ["fx", "eager", "export"])
def test_dtype_casts_are_not_device_moves(capsys, capture):
    report = _scan_json(capsys, f"{MODELS}:Casts", "--input", "2,8", "--capture", capture)
    assert report["capture"] == capture
    assert not [f for f in report["findings"] if f["rule"] == "host-tensor"]
    assert not [r for r in report["recommendations"] if r["kind"] == "buffer"]


def test_parameters_unused_for_these_inputs_are_not_called_dead(capsys):
    report = _scan_json(capsys, f"{MODELS}:OptionalPath", "--input", "2,8")
    (f,) = [f for f in report["findings"] if f["rule"] == "unused-module"]
    assert "not used in forward for these inputs" in f["message"] and "mask_token" in f["message"]
    assert "scan with the inputs that do" in f["fix"]


def test_a_cache_filled_by_one_capture_is_not_read_by_the_next(capsys):
    """The recording fills the model's eval-mode bias cache; export, which follows it for an
    attention written by hand, still reads the bias table: nothing is called unused."""
    report = _scan_json(capsys, f"{MODELS}:CachedBiasAttention", "--input", "2,16,32")
    assert report["capture"] == "export"
    assert not [f for f in report["findings"] if f["rule"] == "unused-module"]
    assert any(r["kind"] == "sdpa" for r in report["recommendations"])


def test_an_attention_in_one_call_is_recorded_not_exported(capsys):
    """SDPA's math path shows a softmax between matrix products in the recording; it is one call
    already, so the recording is kept (export would trace the same code several times slower)."""
    report = _scan_json(capsys, f"{MODELS}:WideKeyAttention", "--input", "2,16,32")
    assert report["capture"] == "eager"
    exported = _scan_json(capsys, f"{MODELS}:WideKeyAttention", "--input", "2,16,32", "--capture", "export")
    assert exported["totals"]["flops"] == report["totals"]["flops"]
    assert not any(r["kind"] == "sdpa" for r in report["recommendations"] + exported["recommendations"])


@pytest.mark.parametrize("capture", ["auto", "export"])
def test_a_sliding_window_caps_the_executed_pairs(capsys, capture):
    """A window of 4 over 16 tokens lets 1 + 2 + 3 + 13 * 4 = 58 of the 256 query-key pairs
    through: the executed multiply-adds are the dense count's 58/256, in the recording and in
    export; a mask given as an input has unknown values, so nothing is assumed of it."""
    report = _scan_json(capsys, f"{MODELS}:SlidingWindowAttention", "--input", "2,16,32", "--capture", capture)
    dense = 2 * 4 * 16 * 16 * (8 + 8)  # batch * heads * queries * keys * (q.k and p.v per pair)
    (attention,) = [n for n in report["nodes"] if n["category"] == "attention"]
    assert attention["flops"] == dense and attention["attrs"]["masked"]
    assert attention["attrs"]["executed_flops"] == dense * 58 // 256
    assert report["totals"]["flops"] - report["totals"]["executed_flops"] == dense - dense * 58 // 256
    given = _scan_json(capsys, f"{MODELS}:SlidingWindowAttention", "--input", "2,16,32", "--input", "mask=16,16:bool",
                       "--capture", capture)
    assert given["totals"]["executed_flops"] == given["totals"]["flops"]


def test_fuse_rewrites_a_learned_temperature_and_says_why_it_leaves_one(capsys, tmp_path):
    """The scan's sdpa promise is kept: a per-head temperature folds into q; an attention whose
    weights are returned is left, with its reason."""
    scan = _scan_json(capsys, f"{MODELS}:Temperature", "--input", "2,16,32")
    assert any(r["kind"] == "sdpa" for r in scan["recommendations"])
    assert main(["fuse", f"{MODELS}:Temperature", "--input", "2,16,32", "-o", str(tmp_path / "t.pt2"), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert len(done["attention"]) == 1 and done["attention"][0]["temperature"] and done["check"]["passed"]
    assert main(["fuse", f"{MODELS}:RelativeBiasReturned", "--input", "2,16,32", "-o", str(tmp_path / "r.pt2"), "--json"]) == 0
    left = json.loads(capsys.readouterr().out)
    assert not left["attention"] and "another reader" in left["attention_left"][0]["why"]


@pytest.mark.parametrize("command", [["fuse"], ["prune", "--group", "10", "--ratio", "0.3"]])
def test_saved_programs_take_any_batch(capsys, tmp_path, command):
    """A fused or pruned program traced at batch 1 runs at batch 3: its batch dimension is dynamic."""
    path = str(tmp_path / "m.pt2")
    assert main([command[0], "zoo:resnet18", "--input", "1,3,32,32", *command[1:], "-o", path]) == 0, capsys.readouterr().err
    program = torch.export.load(path).module()
    assert program(torch.randn(3, 3, 32, 32)).shape == (3, 1000)


def test_a_failed_save_leaves_no_partial_file(tmp_path, monkeypatch):
    """A save that fails halfway leaves neither a partial program nor a temporary file; an earlier
    program at the path is kept."""
    from archscan.transform.programs import save_program

    program = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    path = tmp_path / "m.pt2"
    save_program(program, str(path))
    before = path.read_bytes()

    def half_then_fail(program, f, *args, **kwargs):  # f: a path or a file (save_program serialises in memory)
        with contextlib.nullcontext(f) if hasattr(f, "write") else open(f, "wb") as fh:
            fh.write(b"partial")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(torch.export, "save", half_then_fail)
    with pytest.raises(RuntimeError):
        save_program(program, str(path))
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.pt2"]


def test_distill_saves_a_student_of_a_model_with_a_namedtuple_output(capsys, tmp_path):
    """A model that returns a namedtuple in training mode: the student's program is saved (its
    outputs flattened to a tuple), loads with torch alone and takes any batch."""
    path = str(tmp_path / "s.pt2")
    assert main(["distill", f"{MODELS}:NamedOutput", "--input", "2,3,32,32", "-o", path]) == 0, capsys.readouterr().err
    outputs = torch.export.load(path).module()(torch.randn(3, 3, 32, 32))
    assert [tuple(t.shape) for t in outputs] == [(3, 10), (3, 10)]


def test_g1_only_where_balancing_channels_is_the_fix(capsys):
    """A 1:1 strided conv and a 2-class output conv get no G1 finding (channel balance cannot fix
    them); the 32->256 1x1 conv does."""
    report = _scan_json(capsys, f"{MODELS}:FixedByTheTask", "--input", "1,32,64,64")
    assert [f["module"] for f in report["findings"] if f["rule"] == "G1"] == ["expand"]


def test_prune_passes_channels_through_ops_that_do_not_move_them(tmp_path):
    """Hardswish, in-place Mish, PReLU (its weight cut with the channels) and a spatial torch.roll
    leave every conv's channel group cuttable; the PReLU group cut by half counts exactly."""
    from archscan.load.targets import resolve_target
    from archscan.prune import analyse, prune

    target, specs = resolve_target(f"{MODELS}:Activations"), [archscan.InputSpec((1, 3, 16, 16))]
    grouping = analyse(target, specs)
    cuttable = [g for g in grouping.groups if g.pinned is None]
    assert len(cuttable) == 4 and not grouping.unknown_ops
    (prelu,) = [g for g in cuttable if "a2.weight" in {m.param for m in g.members}]
    result = prune(target, specs, group_ids=[prelu.id], ratio=0.5, path=str(tmp_path / "p.pt2"))
    # c2: 32 -> 16 filters (3x3x32 + bias), PReLU 32 -> 16, c3 reads 16 channels
    assert result.before["params"] - result.after["params"] == 16 * (32 * 9 + 1) + 16 + 32 * 16 * 9
    # a global pool's in-place restride on a channels-last map keeps its channels where they were
    target = resolve_target(f"{MODELS}:PooledChannelsLast")
    grouping = analyse(target, specs)
    assert not grouping.unknown_ops and [g.channels for g in grouping.groups if g.pinned is None] == [32, 64]
    pooled = next(g for g in grouping.groups if g.channels == 64)
    result = prune(target, specs, group_ids=[pooled.id], ratio=0.5, path=str(tmp_path / "q.pt2"))
    assert result.before["params"] - result.after["params"] == 32 * (32 + 1) + 32 * 10  # conv2's half, head's inputs


def test_packed_rnn_sync_is_where_lengths_go_to_the_host(capsys):
    """nn.LSTM reads a PackedSequence's batch_sizes, which the host holds: no sync there; the
    sync is pack_padded_sequence's copy of the lengths to the host."""
    report = _scan_json(capsys, f"{MODELS}:PackedLSTM", "--input", "4,50:int64=1..99", "--input", "4:int64=1..50")
    syncs = [f for f in report["findings"] if f["rule"] == "host-sync"]
    assert len(syncs) == 1 and "pack_padded_sequence copies its lengths" in syncs[0]["message"]
    line = _line_of("packed = nn.utils.rnn.pack_padded_sequence(")
    assert syncs[0]["source"].endswith(f"new_users.py:{line}") and syncs[0]["module"] != "lstm"


def test_no_shuffle_student_for_a_channels_last_stage(capsys):
    """Blocks on [N, H, W, C] maps get no ShuffleNetV2-unit student (it would take H for the
    channels); a channels-first residual block does."""
    from archscan.distill.students import candidates

    def ids(cls):
        report = archscan.scan(f"{MODELS}:{cls}", "2,3,32,32", recommend=False, rules=[])
        return [s.id for s in candidates(report)]

    assert ids("ChannelsLast") and not [i for i in ids("ChannelsLast") if i.startswith("shuffle:")]
    assert any(i.startswith("shuffle:") for i in ids("Flat"))


@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_grouped_expert_gemms_are_counted_in_every_dtype(capsys, dtype):
    """F.grouped_mm (transformers 5's experts): float32 runs on fake tensors though torch's meta
    kernel insists on bf16, and the experts' GEMMs count exactly, whatever the routing: T·k rows."""
    tokens, dim, hidden, experts, k = 32, 32, 64, 8, 2
    args = ["--input", "2,16,32"] + (["--dtype", dtype] if dtype else [])
    report = _scan_json(capsys, f"{MODELS}:GroupedExperts", *args)
    routed = tokens * k
    assert report["totals"]["flops"] == tokens * dim * experts + routed * dim * hidden + routed * hidden * dim
    assert not report["uncounted"] and "for real" not in " ".join(report["capture_notes"])
    step = _scan_json(capsys, f"{MODELS}:GroupedExperts", *args, "--train", "--optimizer", "sgd")["training"]
    # router and up: weight gradients only (the input needs none); down: input and weight gradients
    assert step["phases"]["backward"]["flops"] == tokens * dim * experts + 3 * routed * dim * hidden


def test_causal_attention_reports_executed_beside_dense_flops():
    """A causal prefill of S tokens computes S(S+1)/2 of the S² query-key pairs: totals.flops keeps
    the dense count, totals.executed_flops the executed one, by hand for the zoo's Llama."""
    from archscan.costs.registry import causal_pairs

    assert causal_pairs(64, 64) == 64 * 65 // 2 and causal_pairs(1, 65) == 1 and causal_pairs(4, 2) == 1 + 2 + 2 + 2
    report = archscan.scan("zoo:llama_tiny", "1,64:int64", recommend=False, rules=[])
    attention = [n for n in report.nodes if n.category == "attention"]
    dense = sum(n.flops for n in attention)
    assert dense == len(attention) * 64 * 64 * 2 * 256  # L·S·(e + ev) over every head: 256 wide
    executed = report.totals.executed_flops
    assert report.totals.flops - executed == dense - dense * (64 * 65 // 2) // (64 * 64)
    vit = archscan.scan("zoo:vit_tiny", "1,3,224,224", recommend=False, rules=[])
    assert vit.totals.executed_flops == vit.totals.flops  # no causal mask: nothing skipped


def test_datasheet_profiles_predict_without_the_gpu(capsys):
    """--device-profile NAME predicts from the datasheet: dense peaks per dtype and bandwidth times
    the documented efficiencies. H200 has H100's compute and 4.8/3.35 its bandwidth: a
    bandwidth-bound model predicts faster on it, a compute-bound one the same."""
    from archscan.measure import datasheet_profile
    from archscan.measure.profile import DATASHEET_BANDWIDTH_EFFICIENCY, DATASHEET_CLASS_EFFICIENCY

    h100, h200 = datasheet_profile("h100"), datasheet_profile("H200")
    assert h100.peak_flops["bfloat16"] == 989.4e12 / 2 and h100.peak_flops["float32"] == 67e12 / 2
    assert h100.bandwidth == 3.35e12 * DATASHEET_BANDWIDTH_EFFICIENCY
    assert h100.flops_for("bfloat16", "matmul") == pytest.approx(DATASHEET_CLASS_EFFICIENCY["matmul"] * 989.4e12 / 2)

    def predicted(model, spec, name, dtype=None):  # as served: the kernels alone (the host is the same on both)
        args = [model, "--input", spec, "--device-profile", name] + (["--dtype", dtype] if dtype else [])
        return _scan_json(capsys, *args)["latency"]["served_ms"]

    # 4M rows through an 8x8 linear and casts: bytes, not multiply-adds, set the time
    h100_ms, h200_ms = (predicted(f"{MODELS}:Casts", "4194304,8", name) for name in ("h100", "h200"))
    assert h200_ms / h100_ms == pytest.approx(3.35 / 4.8, rel=0.05)
    # ResNet-50 in bf16 is mostly compute: H200's extra bandwidth buys less than its 1.43x
    resnet = [predicted("zoo:resnet50", "64,3,224,224", name, "bf16") for name in ("h100", "h200")]
    assert 3.35 / 4.8 < resnet[1] / resnet[0] < 1
    assert main(["zoo:resnet18", "--device-profile", "t4"]) == 2
    assert "no datasheet profile for 't4'" in capsys.readouterr().err


def test_expert_weight_bytes_follow_the_routed_rows():
    """A grouped GEMM reads the experts its routed tokens touch: balanced routing, each token picking
    k distinct experts, E·(1 − (1 − k/E)^T) expected (k at one token), min(E, T·k) at worst."""
    per_expert = 32 * 64 * 4  # [K, N] float32
    report = archscan.scan(f"{MODELS}:GroupedExperts", "1,1,32", recommend=False, rules=[])
    (up, down) = [n for n in report.nodes if n.op == "aten._grouped_mm"]
    assert (up.attrs["tokens"], up.attrs["experts_per_token"]) == (1, 2)
    assert up.attrs["expected_experts"] == 2 and up.attrs["worst_case_experts"] == 2
    assert up.weight_bytes == 2 * per_expert and up.attrs["expert_bytes_worst_case"] == 2 * per_expert
    three = archscan.scan(f"{MODELS}:GroupedExperts", "1,3,32", recommend=False, rules=[])
    up = next(n for n in three.nodes if n.op == "aten._grouped_mm")
    expected = 8 * (1 - (1 - 2 / 8) ** 3)  # 3 tokens, top-2 of 8: 4.625 experts
    assert up.attrs["expected_experts"] == pytest.approx(expected, abs=1e-3) and up.attrs["worst_case_experts"] == 6
    assert up.weight_bytes == round(expected * per_expert)
    many = archscan.scan(f"{MODELS}:GroupedExperts", "4,64,32", recommend=False, rules=[])
    up = next(n for n in many.nodes if n.op == "aten._grouped_mm")
    assert up.attrs["worst_case_experts"] == 8 and up.weight_bytes <= 8 * per_expert


def test_decode_step_with_a_kv_cache_by_hand(capsys):
    """--decode L: one token after L cached, on fake tensors, as the model's own code runs it; the
    KV cache comes from the traced cache tensors, so grouped-query and multi-query attention come
    out right by construction."""
    dim, layers, heads, ffn, vocab, context = 256, 4, 8, 768, 32000, 128
    report = _scan_json(capsys, "zoo:llama_tiny", "--input", "1,1:int64", "--decode", str(context))
    decode, kv = report["phases"]["decode"], report["kv_cache"]
    hd = dim // heads
    per_layer = dim * dim * 2 + dim * (4 * hd) * 2 + 3 * dim * ffn + heads * (context + 1) * 2 * hd
    assert decode["flops"] == layers * per_layer + dim * vocab
    assert kv["bytes_per_token"] == layers * 2 * 4 * hd * 4  # n_kv_heads 4, float32
    assert decode["kv_read_bytes"] == context * kv["bytes_per_token"]
    assert decode["kv_written_bytes"] == (context + 1) * kv["bytes_per_token"]  # torch.cat rewrites the cache
    prefill = archscan.scan("zoo:llama_tiny", f"1,{context}:int64", recommend=False, rules=[])
    assert report["phases"]["prefill"]["flops"] == prefill.totals.flops
    for kv_heads, per_token in ((8, layers * 2 * 8 * hd * 4), (1, layers * 2 * 1 * hd * 4)):  # MHA, MQA
        other = _scan_json(capsys, "zoo:llama_tiny", "--kwargs", f"n_kv_heads={kv_heads}", "--input", "1,1:int64",
                           "--decode", "16")
        assert other["kv_cache"]["bytes_per_token"] == per_token
    h100, h200 = (_scan_json(capsys, "zoo:llama_tiny", "--input", "4,1:int64", "--decode", "512", "--device-profile",
                             name)["phases"]["decode"] for name in ("h100", "h200"))
    assert h200["tokens_per_s"] > h100["tokens_per_s"] > 0  # decode reads weights and cache: bandwidth
    kv = _scan_json(capsys, "zoo:llama_tiny", "--input", "1,1:int64", "--decode", "64", "--device-profile",
                    "l4")["kv_cache"]
    weights = sum(p.numel() * 4 for p in zoo.create_model("llama_tiny").parameters()) + 2 * 4096 * 32 * 4  # + RoPE tables
    assert kv["weights_bytes"] == weights
    for cell in kv["grid"]:  # weights + KV over batch x context, against the L4's 24 GiB
        assert cell["bytes"] == weights + kv["bytes_per_token"] * cell["batch"] * cell["context"]
        assert cell["fits"] == (cell["bytes"] <= 24 << 30)
    assert {c["context"] for c in kv["grid"]} == {2048}  # not past the model's 4,096 positions (8k and up)
    assert main(["zoo:resnet18", "--decode", "16"]) == 2
    assert "--decode takes one input of token ids" in capsys.readouterr().err
    assert main(["zoo:llama_tiny", "--input", "1,1:int64", "--decode", "5000"]) == 2
    err = capsys.readouterr().err
    assert "at most 4,096 positions (max_seq_len)" in err and "--decode 4095" in err and len(err.splitlines()) == 1


def test_a_window_and_a_chunk_offset_count_in_both_decode_phases(capsys):
    """Attention under a mask the model builds from positions, in the prefill and in the step: a
    window of 4 lets 1 + 2 + 3 + 13 x 4 = 58 of a 16-token prefill's 256 query-key pairs through and
    4 of the 17 keys one new token sees; three new tokens after 16 cached see 17 + 18 + 19 = 54 of
    3 x 19 keys without a window (the chunk's offset) and 3 x 4 with one. The zoo's Llama masks a
    chunk the same way (ones(t, L + t).tril(L))."""
    heads, hd, context = 2, 16, 16

    def attention(queries, keys):  # q.k and p.v: every pair, each head
        return 2 * heads * queries * keys * hd

    def gap(new, window):
        return _scan_json(capsys, f"{MODELS}:WindowCacheDecoder", "--kwargs", f"window={window}", "--input",
                          f"1,{new}:int64", "--decode", str(context))["phases"]

    cases = ((1, 4, 58, 4), (3, 4, 58, 12), (3, "None", 136, 54), (1, "None", 136, 17))
    for new, window, prefill_pairs, step_pairs in cases:
        phases = gap(new, window)
        full = attention(context, context)
        assert phases["prefill"]["flops"] - phases["prefill"]["executed_flops"] == full - full * prefill_pairs // 256
        full = attention(new, context + new)
        assert phases["decode"]["flops"] - phases["decode"]["executed_flops"] == \
            full - full * step_pairs // (new * (context + new)), (new, window)
    layers, heads, hd = 4, 8, 32  # llama_tiny
    llama = _scan_json(capsys, "zoo:llama_tiny", "--input", "1,3:int64", "--decode", "16")["phases"]["decode"]
    full = 2 * heads * 3 * 19 * hd
    assert llama["flops"] - llama["executed_flops"] == layers * (full - full * 54 // 57)


def test_a_window_of_a_static_cache_reads_the_window(capsys):
    """A static cache of 256 tokens, written in place, whose attention reads its last 8: the step
    reads the window's keys and values (2 heads x 8 tokens x 16 x float32 each, the new token's
    among them), not the storage behind them."""
    heads, window, head_dim = 2, 8, 16
    decode = _scan_json(capsys, f"{MODELS}:StaticWindowDecoder", "--input", "1,1:int64", "--decode", "64")
    assert decode["phases"]["decode"]["kv_read_bytes"] == 2 * heads * window * head_dim * 4
    assert decode["kv_cache"]["bytes"] == 2 * heads * 256 * head_dim * 4  # what it holds: the whole buffer


def test_a_cache_that_stops_growing_is_held_fixed_per_sequence(capsys):
    """A cache that keeps its last tokens only (a sliding window, a fixed-size cache) adds nothing
    per token: its bytes are fixed per sequence, and the memory grid holds them so at every context."""
    window, latent = 24, 8
    kv = _scan_json(capsys, f"{MODELS}:LatentCacheDecoder", "--kwargs", f"window={window}", "--input", "2,1:int64",
                    "--decode", "100")["kv_cache"]
    assert kv["bytes_per_token"] == 0 and kv["fixed_bytes_per_sequence"] == window * latent * 4
    assert {c["bytes"] for c in kv["grid"] if c["batch"] == 8} == {kv["weights_bytes"] + 8 * window * latent * 4}
    growing = _scan_json(capsys, f"{MODELS}:LatentCacheDecoder", "--input", "2,1:int64", "--decode", "100")["kv_cache"]
    assert growing["bytes_per_token"] == latent * 4 and growing["fixed_bytes_per_sequence"] == 0
    assert main([f"{MODELS}:LatentCacheDecoder", "--kwargs", f"window={window}", "--input", "1,1:int64", "--decode", "100"]) == 0
    assert "0 B per token + 768 B per sequence that does not grow with the context" in capsys.readouterr().out


def test_a_cache_re_expanded_every_step_is_named_with_both_numbers(capsys):
    """As written vs as served: weights multiplied over all L cached tokens each decode step (a
    compressed cache re-expanded, Hugging Face's DeepSeek-V3) are a finding with both numbers;
    a plain key/value cache (the zoo's Llama) is not."""
    context, latent, heads, hd, dim, vocab = 100, 8, 2, 16, 32, 100
    report = _scan_json(capsys, f"{MODELS}:LatentCacheDecoder", "--input", "1,1:int64", "--decode", str(context))
    decode = report["phases"]["decode"]
    rows = context + 1
    assert decode["context_gemms"]["flops"] == rows * latent * heads * 2 * hd  # up, over every cached token
    rest = dim * latent + dim * heads * hd + heads * rows * 2 * hd + heads * hd * vocab  # down, q, attention, out
    assert decode["flops"] - decode["context_gemms"]["flops"] == rest
    (f,) = [f for f in report["findings"] if f["rule"] == "decode-context"]
    assert f["module"] == "up" and f["evidence"] == {
        "context_flops": rows * latent * heads * 2 * hd, "rest_flops": rest, "context": context,
        "at": [f["source"]], "modules": ["up"]}
    assert f["source"].endswith(f"new_users.py:{_line_of('kv = self.up(latent)')}")
    llama = _scan_json(capsys, "zoo:llama_tiny", "--input", "1,1:int64", "--decode", "64")
    assert "context_gemms" not in llama["phases"]["decode"]
    assert not [f for f in llama["findings"] if f["rule"] == "decode-context"]


def _line_of(text: str) -> int:
    with open(MODELS) as fh:
        return next(i for i, line in enumerate(fh, 1) if text in line)


def test_speed_grid_is_exact_where_it_was_not_fitted():
    """--decode with a named GPU: time to first token, decode ms and tokens/s over batch x context,
    fitted per op from small runs; a point the fit never saw, run on its own, predicts the same to
    the last bit. A cache that stops growing (a window) is not polynomial: no grid, and why."""
    from archscan.llm.decode import decode_step
    from archscan.load.targets import parse_input_spec, resolve_target
    from archscan.measure import datasheet_profile

    h100 = datasheet_profile("h100")
    llama = resolve_target("zoo:llama_tiny")
    speed = decode_step(llama, [parse_input_spec("1,1:int64")], 100, profile=h100, grid=True)["kv_cache"]["speed"]
    # the zoo's Llama-tiny takes 4,096 positions (its RoPE tables): the 8k..128k contexts are left out
    assert speed["positions"] == 4096 and "why" not in speed
    assert [(c["batch"], c["context"]) for c in speed["cells"]] == [(b, 2048) for b in (1, 8, 32, 128)]
    for batch, context in ((1, 2048), (8, 2048), (128, 2048)):
        alone = decode_step(llama, [parse_input_spec(f"{batch},1:int64")], context, profile=h100)["phases"]
        (cell,) = [c for c in speed["cells"] if (c["batch"], c["context"]) == (batch, context)]
        assert cell["decode_ms"] == alone["decode"]["predicted_ms"]
        assert cell["ttft_ms"] == alone["prefill"]["predicted_ms"]
        assert cell["tokens_per_s"] == batch / cell["decode_ms"] * 1e3
        # as served (the GPU model's kernels alone), and the causal prefill's executed pairs, exact too
        assert (cell["served_decode_ms"], cell["served_ttft_ms"]) == (alone["decode"]["served_ms"],
                                                                       alone["prefill"]["served_ms"])
    # a cache that stops growing at its window (24) is not polynomial across it, but it is beyond it:
    # the fit moves to contexts past the window, and the grid's points are there
    target = resolve_target(f"{MODELS}:LatentCacheDecoder")
    windowed = decode_step(target, [parse_input_spec("1,1:int64")], 100, {"window": 24}, profile=h100,
                           grid=True)["kv_cache"]["speed"]
    assert windowed["fitted_contexts"][0] > 24
    alone = decode_step(target, [parse_input_spec("8,1:int64")], 8192, {"window": 24}, profile=h100)["phases"]
    (cell,) = [c for c in windowed["cells"] if (c["batch"], c["context"]) == (8, 8192)]
    assert (cell["decode_ms"], cell["ttft_ms"]) == (alone["decode"]["predicted_ms"], alone["prefill"]["predicted_ms"])
    # a window wider than the largest fitted contexts' (3 x 1,024) reach: no grid, and why
    wide = decode_step(target, [parse_input_spec("1,1:int64")], 100, {"window": 8000}, profile=h100,
                       grid=True)["kv_cache"]["speed"]
    assert wide["cells"] == [] and "not polynomial" in wide["why"]


def test_compare_attention_variants_by_their_decode_step(capsys):
    """compare --decode L --device-profile A,B: KV bytes per token and at 32k, the step's bytes and
    tokens/s on two named GPUs, side by side; MHA, GQA and MQA of one config differ in the cache."""
    names = [f"{MODELS}:llama_{v}" for v in ("mha", "gqa", "mqa")]
    assert main(["compare", *names, "--input", "1,1:int64", "--decode", "256", "--device-profile", "h100,l4",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    per_token = [r["kv_bytes_per_token"] for r in rows]
    assert per_token == [2 * 2 * kv * 16 * 4 for kv in (4, 2, 1)]  # layers x (K, V) x heads x 16 x float32
    assert [r["kv_bytes_32k"] for r in rows] == [p * 32768 for p in per_token]
    for r in rows:
        assert set(r["tokens_per_s"]) == {"h100 (datasheet)", "l4 (datasheet)"}
        # as written: a toy model's eager step is host-bound, no slower on the H100 than on the L4
        assert r["tokens_per_s"]["h100 (datasheet)"] >= r["tokens_per_s"]["l4 (datasheet)"] > 0
        alone = archscan.scan(r["target"], "1,1:int64", decode=256, profile=archscan.measure.datasheet_profile("l4"),
                              recommend=False, rules=[]).phases["decode"]
        assert r["decode_bytes"] == alone["mac_bytes"] and r["tokens_per_s"]["l4 (datasheet)"] == alone["tokens_per_s"]
    assert main(["compare", *names[:1], "--input", "1,1:int64", "--decode", "256", "--device-profile", "h100",
                 "--measure"]) == 2
