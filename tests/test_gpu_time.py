"""The GPU time model (archscan.measure.gpu) against recorded GPU runs, without a GPU.

Ground truth: ``tests/gpu_truth`` (NVIDIA H200, torch 2.11, 2026-11-26) and its held-out set
``tests/gpu_truth/heldout-h100-2026-11-26`` (NVIDIA H100 80GB HBM3, same day): each latency
configuration's eager time (``eager_ms``, median of 20 CUDA-event timings) and, for image forwards,
the same forward replayed from a CUDA graph (``graph_ms``).

Fit and test are kept apart. ``benchmarks/fit_gpu_time.py`` fits the model's constants on
``FIT`` (five H200 configurations); every test below that bounds the error uses only ``HELD_OUT``
(the other three H200 configurations: a float32 forward after bfloat16 ones, an LLM prefill after
decode steps, a training step) and the H100 set (models and a GPU the fit never saw). Each
configuration is predicted the way a user gets it: ``archscan.scan`` with the named GPU's datasheet
profile (a decode step through ``archscan.llm.decode.decode_step``, as ``--decode`` runs it).

The two decode steps of the recorded Llama are both fit on: they run the same op stream, yet their
host was 1.8x apart (12.4 and 22.0 ms eager; 2.7 and 4.1 µs per ``aten::slice`` in their traces), so
no host model can hold both within 25%; the fit takes the runs' average host speed
(``docs/gpu-time.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch

import archscan
from archscan.devices.gpus import GPU, gpu
from archscan.measure import datasheet_profile
from archscan.measure import gpu as model
from archscan.measure.predict import apply_predictions
from archscan.results import NodeReport

TRUTH = Path(__file__).parent / "gpu_truth"
HELDOUT = TRUTH / "heldout-h100-2026-11-26"
MODELS = str(TRUTH / "models.py")

# the configurations benchmarks/fit_gpu_time.py fits on (FIT_CONFIGS there), and the ones held out
FIT = ("lat_resnet50_fwd_b64_bf16", "lat_mobilenet_v2_fwd_b128_bf16", "lat_vit_b_16_fwd_b64_bf16",
       "lat_llama_1b_decode_b1_l2048_bf16", "lat_llama_1b_decode_b16_l2048_bf16")
HELD_OUT = ("lat_resnet50_fwd_b64_fp32", "lat_llama_1b_prefill_1x2048_bf16")
# the training steps whose backward kernels fit the backward classes (BACKWARD_CONFIGS there): the latency one is
# checked as a fit configuration
FIT_TRAIN = ("lat_resnet50_train_b32_fp32", "mem_resnet50_train_b32", "mem_mobilenet_v2_train_b64",
             "mem_vit_b_16_train_b16", "mem_roberta_base_train_8x512", "mem_roberta_base_train_8x512_bf16",
             "mem_pythia_160m_train_4x1024", "mem_llama_1b_train_2x2048_bf16w")
# the H100 set's latency configurations archscan can build here (ConvNeXt-T, EfficientNet-B0 and Swin-T
# need torchvision, which does not import beside the CPU build of torch)
HELD_OUT_H100 = ("lat_mistral_7b_decode_b1_l2048_bf16", "lat_mistral_7b_decode_b1_l16384_bf16",
                 "lat_mistral_7b_decode_b16_l4096_bf16", "lat_mistral_7b_decode_b32_l2048_bf16",
                 "lat_mistral_7b_prefill_1x4096_bf16", "lat_mixtral_small_decode_b1_l2048_bf16",
                 "lat_mixtral_small_decode_b16_l2048_bf16", "lat_mixtral_small_prefill_1x2048_bf16",
                 "lat_bert_base_train_8x512_fp32")
BOUND = 0.25  # predicted within 25% of measured

# recorded model -> archscan target
TARGETS = {"resnet50": "zoo:resnet50", "mobilenet_v2": "zoo:mobilenet_v2", "vit_b_16": "zoo:vit_b_16",
           "llama_1b": f"{MODELS}:llama_1b", "mistral_7b": f"{MODELS}:mistral_7b",
           "mixtral_small": f"{MODELS}:mixtral_small", "bert_base": f"{MODELS}:bert_base"}


def _summary(folder: Path) -> dict:
    with open(folder / "summary.jsonl", encoding="utf-8") as fh:
        return {r["id"]: r for r in map(json.loads, fh)}


@functools.lru_cache(maxsize=None)
def truth() -> dict:
    """Every recorded configuration by id, with the GPU it ran on (``gpu``: 'h200' or 'h100')."""
    out = {}
    for folder, name in ((TRUTH, "h200"), (HELDOUT, "h100")):
        for key, rec in _summary(folder).items():
            if key != "env":
                out[key] = {**rec, "gpu": name}
    return out


@functools.lru_cache(maxsize=None)
def predict_config(name: str) -> dict:
    """archscan's prediction of a recorded latency configuration on its GPU's datasheet profile:
    ``eager_ms`` (as written), ``served_ms`` (as served), and ``roofline_ms``, what archscan predicted
    before the GPU model (the datasheet roofline: each op max(compute, memory) + 5 µs; None for a
    training step, which it did not time)."""
    rec = truth()[name]
    profile = datasheet_profile(rec["gpu"])
    roofline = dataclasses.replace(profile, device="cpu", name=f"{profile.name} roofline")  # no GPU model
    dtype = torch.bfloat16 if rec.get("dtype") == "torch.bfloat16" else None
    target = TARGETS[rec["model"]]
    if rec["kind"] == "decode":
        from archscan.llm.decode import decode_step
        from archscan.load.targets import input_specs

        specs = input_specs([f"{rec['b']},1:int64"], dtype)
        out = decode_step(None, specs, rec["n"], dtype=dtype, profile=profile, others=(roofline,),
                          model=_fake_model(target, dtype))["phases"]["decode"]
        return {"eager_ms": out["predicted_ms"], "served_ms": out["served_ms"],
                "roofline_ms": out["on"][roofline.name]["predicted_ms"]}
    shape = f"{rec['b']},{rec['n']}:int64" if "n" in rec else f"{rec['b']},3,224,224"
    train = rec["kind"] == "latency_train"
    report = archscan.scan(target, [shape], dtype=dtype, profile=profile, recommend=False, rules=[], train=train)
    if train:
        timed = report.training_step["time"]
        return {"eager_ms": timed["predicted_ms"], "served_ms": timed["served_ms"], "roofline_ms": None}
    return {"eager_ms": report.latency["predicted_ms"], "served_ms": report.latency["served_ms"],
            "roofline_ms": apply_predictions(report, roofline).latency["predicted_ms"]}


@functools.lru_cache(maxsize=None)
def _fake_model(target: str, dtype):
    """The model on fake tensors, built once for every decode step of it (as a scan hands its own to --decode)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from archscan.load.building import build_fake
    from archscan.load.targets import input_specs, to_target

    return build_fake(to_target(target), {}, dtype, FakeTensorMode(allow_non_fake_inputs=True),
                      input_specs(["1,1:int64"], dtype))


def ratio(name: str, key: str = "eager_ms") -> float:
    """Predicted over measured: ``eager_ms`` against the eager run, ``served_ms`` against the CUDA graph's."""
    rec = truth()[name]
    return predict_config(name)[key] / rec["eager_ms" if key == "eager_ms" else "graph_ms"]


# Known misses on held-out data, kept failing on purpose (strict): each names why. None at present: the KV
# cache's torch.cat (transformers' DynamicCache), kernel-bound at 0.64 TB/s on the H200 and 0.67 TB/s on the
# H100, missed Mistral-7B's decode at batch 16 and 32 on the H100 by 1.32x until the model priced it at an
# absolute rate (gpu.RATE_CLASSES).
KNOWN_MISSES: dict[str, str] = {}


def _held_out(names):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[n])) if n in KNOWN_MISSES else n
            for n in names]


def test_fit_and_test_sets_are_apart():
    """The test names the fit script's configurations, none of them is tested as held out, and the
    module's constants say they are that fit's."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from fit_gpu_time import BACKWARD_CONFIGS, FIT_CONFIGS

    assert FIT == FIT_CONFIGS and FIT_TRAIN == BACKWARD_CONFIGS
    assert not (set(FIT) | set(FIT_TRAIN)) & set(HELD_OUT + HELD_OUT_H100)
    assert all(truth()[n]["gpu"] == "h200" for n in FIT_TRAIN)  # the H100's training steps stay held out
    recorded = {k for k, v in truth().items() if k.startswith("lat_") and v["gpu"] == "h200"}
    # every recorded latency configuration is in one of the three
    assert recorded == set(FIT) | set(HELD_OUT) | {n for n in FIT_TRAIN if n.startswith("lat_")}
    assert model.FIT.source.startswith("benchmarks/fit_gpu_time.py") and f"{len(FIT)} runs" in model.FIT.source


@pytest.mark.parametrize("name", _held_out(HELD_OUT + HELD_OUT_H100))
def test_held_out_as_written(name):
    """Eager PyTorch's time of a configuration the fit never saw, within 25%."""
    assert abs(ratio(name) - 1) <= BOUND, f"{name}: predicted {predict_config(name)['eager_ms']:.3f} ms, " \
                                          f"measured {truth()[name]['eager_ms']:.3f} ms"


@pytest.mark.parametrize("name", [n for n in HELD_OUT + HELD_OUT_H100 if truth()[n].get("graph_ms")])
def test_held_out_as_served(name):
    """The same forward replayed from a CUDA graph, within 25%."""
    assert abs(ratio(name, "served_ms") - 1) <= BOUND


@pytest.mark.parametrize("name", FIT + tuple(n for n in FIT_TRAIN if n.startswith("lat_")))
def test_fit_configurations(name):
    """The configurations fit on, within 35% as written (the host's speed varied 1.8x between the two
    decode steps, which take the middle) and 25% as served."""
    assert abs(ratio(name) - 1) <= 0.35
    if truth()[name].get("graph_ms"):
        assert abs(ratio(name, "served_ms") - 1) <= BOUND


def test_the_datasheet_roofline_would_fail():
    """What archscan predicted before (the datasheet roofline) misses the same bound on most of the
    held-out configurations the model holds, and on both sides (too fast on decode steps and bf16
    forwards, too slow on the float32 forward)."""
    names = [n for n in HELD_OUT + HELD_OUT_H100 + FIT if predict_config(n)["roofline_ms"] is not None]
    roof = {n: predict_config(n)["roofline_ms"] / truth()[n]["eager_ms"] for n in names}
    held = [n for n in names if abs(ratio(n) - 1) <= BOUND]
    missed = [n for n in held if abs(roof[n] - 1) > BOUND]
    assert len(missed) > len(held) / 2, roof
    assert min(roof.values()) < 1 - BOUND and max(roof.values()) > 1 + BOUND, roof


# --- the model's arithmetic, exact on tiny cases ------------------------------------------------------

_GPU = GPU("test", 1 << 30, "a GPU of round numbers", fp32_tflops=2.0, bf16_tflops=4.0, bandwidth_tbs=1.0)
_FIT = model.GpuTimeFit(floor_us=1.0, compute={"gemm": 0.5, "attention": 0.5}, bandwidth={"elementwise": 1.0, "attention": 1.0},
                        kernels={}, host_us={"op": 10.0, "view": 1.0, "attention": 10.0, "module": 0.0})


def _node(category: str, nbytes: int, flops: int = 0, dtype: str = "bfloat16", attrs: dict | None = None) -> NodeReport:
    op = {"elementwise": "aten.add.Tensor", "attention": "aten._scaled_dot_product_flash_attention.default"}[category]
    return NodeReport(name=op, op=op, module="", module_type="", category=category, flops=flops, elem_ops=0,
                      mac_bytes=nbytes, read_bytes=nbytes, write_bytes=0, weight_bytes=0, params=0, out_shape=None,
                      dtype=dtype, aten_ops=(op,), attrs=attrs or {})


def test_two_timelines():
    """Each op: 10 µs of host, then its kernel: 1 µs floor + bytes / 1 TB/s. The GPU starts a kernel at
    max(its launch, the previous kernel's end)."""
    # GPU-bound: kernels of 1 + 19 = 20 µs launched at 10, 20, 30: they run 10-30, 30-50, 50-70
    slow = model.simulate([_node("elementwise", 19_000_000)] * 3, _GPU, _FIT)
    assert (slow.eager_ms, slow.served_ms, slow.host_ms) == pytest.approx((0.070, 0.060, 0.030))
    assert [round(n[0], 6) for n in slow.nodes] == [0.030, 0.020, 0.020]  # how far each moves the run: 70 µs
    # host-bound: kernels of 1 + 4 = 5 µs, launched at 10, 20, 30: the run ends at 35 µs, the GPU waited
    fast = model.simulate([_node("elementwise", 4_000_000)] * 3, _GPU, _FIT)
    assert (fast.eager_ms, fast.served_ms, fast.host_ms) == pytest.approx((0.035, 0.015, 0.030))
    assert fast.host_bound and not slow.host_bound and [n[2] for n in fast.nodes] == ["host"] * 3


def test_causal_attention_is_priced_as_executed():
    """is_causal: the fused kernel skips the masked blocks, as written and as served. An explicit mask
    (a window): eager PyTorch computes every pair, a serving engine's kernel only those it leaves."""
    dense = 2_000_000_000_000  # bf16: 2e12 multiply-adds at 0.5 x 2e12/s = 2 s
    causal = _node("attention", 0, dense, attrs={"causal": True, "executed_flops": dense // 2})
    windowed = _node("attention", 0, dense, attrs={"masked": True, "executed_flops": dense // 4})
    (w,) = model.node_work(causal)
    assert model.kernel_us(w, _GPU, _FIT) == (1.0 + 1e6, "compute")  # 1 µs floor + 1 s
    assert model.kernel_us(w, _GPU, _FIT, served=True)[0] == 1.0 + 1e6
    (w,) = model.node_work(windowed)
    assert model.kernel_us(w, _GPU, _FIT)[0] == 1.0 + 2e6
    assert model.kernel_us(w, _GPU, _FIT, served=True)[0] == 1.0 + 0.5e6


def test_peaks_by_dtype_and_class():
    """bf16 on tensor cores; fp32 convolutions on TF32 (half of bf16); fp32 matmuls on CUDA cores."""
    h200 = gpu("h200")
    assert model.peak_macs(h200, "bfloat16", "gemm") == 989.4e12 / 2
    assert model.peak_macs(h200, "float32", "conv") == 989.4e12 / 4
    assert model.peak_macs(h200, "float32", "gemm") == 67e12 / 2


def test_the_report_says_what_predicted():
    """latency.execution_model: the GPU's name with the GPU model (and both predictions), 'cpu' with a
    CPU profile; a training step's time per phase on a GPU."""
    on_gpu = archscan.scan(f"{Path(__file__).parent}/models/toy.py:Net", "2,3,16,16", profile=datasheet_profile("h200"),
                           recommend=False, rules=[], train=True)
    lat = on_gpu.latency
    assert lat["execution_model"] == "h200" and lat["served_ms"] <= lat["predicted_ms"]
    assert lat["predicted_ms"] == pytest.approx(sum(n.predicted_ms for n in on_gpu.nodes))
    step = on_gpu.training_step["time"]
    assert set(step["phases"]) >= {"forward", "backward", "optimizer"} and step["execution_model"] == "h200"
    assert step["predicted_ms"] == pytest.approx(sum(p["predicted_ms"] for p in step["phases"].values()))
    cpu = dataclasses.replace(datasheet_profile("h200"), device="cpu", name="a CPU")
    assert apply_predictions(on_gpu, cpu).latency["execution_model"] == "cpu"
    assert "served_ms" not in apply_predictions(dataclasses.replace(on_gpu, latency=None), cpu).latency

