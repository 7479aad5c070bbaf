"""Predicted against measured decode-step latency: a Llama-3-8B-shaped model (random weights, bf16)
at batch {1, 8} x context {1k, 8k}, on the GPU at hand.

Two steps, so that the GPU time is spent on timing only:

    python benchmarks/bench_decode_gpu.py measure --out DIR     # on the GPU: calibrate, time the steps
    python benchmarks/bench_decode_gpu.py report DIR            # anywhere: archscan's predictions beside them

``measure`` writes ``DIR/measured.json`` (each point's per-step milliseconds, eager and replayed
from a CUDA graph, with the device, torch and date) and, with ``--calibrate``, ``DIR/profile.json``
(``archscan calibrate`` of that GPU, also saved as the device's cached profile). ``report`` scans
the same models on fake tensors, predicts each point on the GPU's datasheet profile and on the
calibrated one, each as written (a launch overhead per kernel) and without launch overhead (what a
CUDA graph removes), and prints a Markdown table.

Models: the zoo's Llama-3-8B (``zoo/llama.py``: its cache is a list of tensors, concatenated every
step) and, where transformers is installed, Hugging Face's ``LlamaForCausalLM`` with the same
shape (``DynamicCache``). The context is the number of cached tokens; 8,191 rather than 8,192
because both models take 8,192 positions, the new token included. ``--small`` runs a toy shape
(on the CPU too) to check the script itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

POINTS = [(1, 1024), (1, 8191), (8, 1024), (8, 8191)]
SMALL_POINTS = [(1, 64), (2, 127)]
REPEATS = 30
WARMUP = 5

LLAMA3_8B = dict(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                 rope_theta=500000.0, max_seq_len=8192)
SMALL = dict(vocab_size=1000, dim=256, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=512,
             rope_theta=500000.0, max_seq_len=128)


def zoo_llama(small: bool = False):
    """The zoo's Llama with Llama-3-8B's shape (or a toy one)."""
    from zoo.llama import Llama
    return Llama(**(SMALL if small else LLAMA3_8B))


def hf_llama(small: bool = False):
    """Hugging Face's LlamaForCausalLM with the same shape."""
    import transformers
    c = SMALL if small else LLAMA3_8B
    config = transformers.LlamaConfig(
        vocab_size=c["vocab_size"], hidden_size=c["dim"], intermediate_size=c["ffn_dim"],
        num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"], num_key_value_heads=c["n_kv_heads"],
        rope_theta=c["rope_theta"], max_position_embeddings=c["max_seq_len"])
    return transformers.LlamaForCausalLM(config)


FACTORIES = {"zoo": zoo_llama, "hf": hf_llama}


# --- measure (on the GPU) ---------------------------------------------------------------------

def _timed(step, device, repeats: int = REPEATS, between=None) -> list[float]:
    """Milliseconds of each of ``repeats`` calls after ``WARMUP``, device events around each
    (host clock on the CPU); ``between`` runs untimed after each call."""
    import time
    samples = []
    for i in range(WARMUP + repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            step()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            step()
            ms = (time.perf_counter() - t0) * 1e3
        if between is not None:
            between()
        if i >= WARMUP:
            samples.append(ms)
    return samples


def _stats(samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=4)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples),
            "iqr_ms": q[2] - q[0], "repeats": len(samples)}


def _zoo_point(model, batch: int, context: int, device, dtype) -> dict:
    """One decode step of the zoo's Llama after a random cache of ``context`` tokens."""
    attn = model.layers[0].attention
    shape = (batch, attn.n_kv_heads, context, attn.head_dim)
    past = [(torch.randn(shape, device=device, dtype=dtype), torch.randn(shape, device=device, dtype=dtype))
            for _ in model.layers]
    tokens = torch.randint(0, model.vocab_size, (batch, 1), device=device)
    step = lambda: model(tokens, past_key_values=past, use_cache=True)  # noqa: E731
    out = {"eager": _stats(_timed(step, device))}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        out["eager_peak_bytes_over_inputs"] = torch.cuda.max_memory_allocated() - base
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kept = step()
        out["graph"] = _stats(_timed(graph.replay, device))
        del graph, kept
    del past
    return out


def _hf_point(model, batch: int, context: int, device, dtype) -> dict:
    """One decode step of Hugging Face's Llama after a prefill of ``context`` random tokens; the
    cache is cut back to ``context`` after each step (untimed; ``crop`` of minus the tokens to drop,
    which transformers 4.x and 5.x both read so)."""
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (batch, context), device=device)
    cache = model(prompt, use_cache=True, logits_to_keep=1).past_key_values
    del prompt
    tokens = torch.randint(0, vocab, (batch, 1), device=device)
    step = lambda: model(tokens, past_key_values=cache, use_cache=True)  # noqa: E731
    samples = _timed(step, device, between=lambda: cache.crop(context - cache.get_seq_length()))
    if cache.get_seq_length() != context:
        raise RuntimeError(f"the cache holds {cache.get_seq_length()} tokens, not {context}")
    del cache
    return {"eager": _stats(samples)}


def measure(args) -> None:
    device = torch.device(args.device)
    dtype = torch.bfloat16
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {"device": name, "torch": torch.__version__,
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "dtype": "bfloat16", "small": args.small, "repeats": REPEATS, "warmup": WARMUP, "models": {}}
    try:
        import transformers
        result["transformers"] = transformers.__version__
    except ImportError:
        pass
    path = out / "measured.json"
    if args.calibrate:
        from archscan.measure.profile import calibrate, save_profile
        t0 = dt.datetime.now()
        profile = calibrate(device, quick=args.small)
        (out / "profile.json").write_text(json.dumps(profile.to_json(), indent=1))
        save_profile(profile)  # the cached profile of this device, for the scans that follow
        print(f"calibrated in {(dt.datetime.now() - t0).total_seconds():.1f} s: "
              f"bandwidth {profile.bandwidth / 1e12:.2f} TB/s, "
              f"bf16 {2 * profile.peak_flops.get('bfloat16', 0) / 1e12:.0f} TFLOP/s, "
              f"overhead {profile.launch_overhead_ms * 1e3:.1f} us",
              flush=True)
    points = SMALL_POINTS if args.small else POINTS
    torch.manual_seed(0)
    for which in args.models.split(","):
        try:
            previous = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                with torch.device(device):
                    model = FACTORIES[which](small=args.small)
            finally:
                torch.set_default_dtype(previous)
        except ImportError as exc:
            print(f"{which}: skipped ({exc})", flush=True)
            continue
        model = model.to(device=device, dtype=dtype).eval()  # buffers too, as ``--dtype bf16`` casts them
        rows = result["models"].setdefault(which, [])
        with torch.inference_mode():
            for batch, context in points:
                point = (_zoo_point if which == "zoo" else _hf_point)(model, batch, context, device, dtype)
                rows.append({"batch": batch, "context": context, **point})
                graph = f", graph {point['graph']['median_ms']:.3f} ms" if "graph" in point else ""
                print(f"{which} {batch}x{context}: eager {point['eager']['median_ms']:.3f} ms{graph}", flush=True)
                path.write_text(json.dumps(result, indent=1))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    path.write_text(json.dumps(result, indent=1))


# --- report (anywhere) --------------------------------------------------------------------------

_DATASHEETS = {"H200": "h200", "H100 80GB HBM3": "h100", "H100 PCIe": "h100-pcie", "A100-SXM4-80GB": "a100"}


def _datasheet_for(device: str) -> str | None:
    return next((v for k, v in _DATASHEETS.items() if k in device), None)


def _no_overhead(profile):
    return dataclasses.replace(profile, name=profile.name + ", no launch overhead", launch_overhead_ms=0.0,
                               class_overhead_ms={})


def report(args) -> None:
    import archscan
    from archscan.measure.profile import DeviceProfile, datasheet_profile

    folder = Path(args.dir)
    measured = json.loads((folder / "measured.json").read_text())
    profiles = []
    if (folder / "profile.json").exists():
        calibrated = DeviceProfile.from_json(json.loads((folder / "profile.json").read_text()))
        profiles += [("calibrated", calibrated), ("calibrated, no overhead", _no_overhead(calibrated))]
    sheet = _datasheet_for(measured["device"]) or args.datasheet
    if sheet:
        named = datasheet_profile(sheet)
        profiles += [(f"{sheet} datasheet", named), (f"{sheet} datasheet, no overhead", _no_overhead(named))]
    first, *others = [prof for _, prof in profiles]  # in pairs: ``on`` holds them all
    rows = []
    for which, points in measured["models"].items():
        for p in points:
            rep = archscan.scan(FACTORIES[which], f"{p['batch']},1:int64", kwargs={"small": measured["small"]},
                                dtype="bf16", decode=p["context"], profile=first, decode_on=others, rules=[],
                                recommend=False)
            decode = rep.phases["decode"]
            predicted = {label: decode["on"][prof.name]["predicted_ms"] for label, prof in profiles}
            rows.append({"model": which, "batch": p["batch"], "context": p["context"],
                         "eager_ms": p["eager"]["median_ms"], "graph_ms": p.get("graph", {}).get("median_ms"),
                         "mac_bytes": decode["mac_bytes"], "flops": decode["flops"], "predicted": predicted})
    (folder / "predicted.json").write_text(json.dumps(rows, indent=1))
    text = _markdown(measured, rows, [label for label, _ in profiles])
    (folder / "table.md").write_text(text + "\n")
    print(text)


def _markdown(measured: dict, rows: list[dict], labels: list[str]) -> str:
    head = ["model", "batch x context", "step bytes", "measured eager", "measured graph"] + \
        [f"predicted {label}" for label in labels]
    versions = ", ".join(f"{k} {measured[k]}" for k in ("torch", "transformers") if k in measured)
    lines = [f"Measured on {measured['device']} ({versions}), {measured['date'][:10]}: median of {measured['repeats']} "
             f"steps after {measured['warmup']}, bfloat16, random weights; predicted by archscan {_archscan_version()} "
             f"({_versions_here()}) on fake tensors. `python benchmarks/bench_decode_gpu.py measure` then `report`. "
             "Each prediction's ratio is against the eager step, the no-overhead ones against the CUDA graph's "
             "where there is one.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], f"{r['batch']} x {r['context']:,}", f"{r['mac_bytes'] / 2**30:.2f} GiB",
                 f"{r['eager_ms']:.2f} ms", f"{r['graph_ms']:.2f} ms" if r["graph_ms"] else "-"]
        for label in labels:
            ms = r["predicted"][label]
            against = r["graph_ms"] if "no overhead" in label and r["graph_ms"] else r["eager_ms"]
            cells.append(f"{ms:.2f} ms ({ms / against:.2f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _versions_here() -> str:
    try:
        import transformers
        return f"torch {torch.__version__}, transformers {transformers.__version__}"
    except ImportError:
        return f"torch {torch.__version__}"


def _archscan_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("archscan")
    except PackageNotFoundError:
        return "(from the checkout)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--device", default="cuda")
    m.add_argument("--models", default="zoo,hf")
    m.add_argument("--small", action="store_true")
    m.add_argument("--calibrate", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("dir")
    r.add_argument("--datasheet", help="datasheet profile when the measured device has none mapped")
    args = parser.parse_args()
    (measure if args.cmd == "measure" else report)(args)


if __name__ == "__main__":
    main()
