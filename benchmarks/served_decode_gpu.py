"""A decode step as served, measured: the GPU time model's ``served_ms`` against a CUDA graph.

    python benchmarks/served_decode_gpu.py measure OUT.json   # on a GPU (about a minute)
    python benchmarks/served_decode_gpu.py report OUT.json    # anywhere: archscan's predictions beside it

``measure`` builds the recorded Llama-1B shape (``tests/gpu_truth/models.py:llama_1b``, bf16, random
weights) and times one decode step after 2,048 cached tokens at batch 1 and 16 three ways (median of
20 CUDA-event timings after warm-ups): eager with Hugging Face's ``DynamicCache`` (the cache grown by
``torch.cat``), eager with ``StaticCache`` (written in place), and the ``StaticCache`` step replayed
from a CUDA graph: what ``served_ms`` stands for. ``--dry`` runs it on the CPU with a toy config.
``report`` predicts the same steps with archscan on the GPU's datasheet profile.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONTEXT, BATCHES = 2048, (1, 16)


def _model(dry: bool, device: str):
    import transformers

    config = (transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096) if dry
              else transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                            num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                            max_position_embeddings=16384))
    config.attn_implementation = "sdpa"
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


def _median_ms(fn, cuda: bool, reps: int = 20, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter(); fn(); times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def measure(out: str, dry: bool = False) -> None:
    from transformers import DynamicCache

    cuda = not dry
    device = "cuda" if cuda else "cpu"
    model = _model(dry, device)
    cfg = model.config
    context = 64 if dry else CONTEXT
    rec = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "context": context, "steps": {}}
    for b in BATCHES:
        tok = torch.randint(0, cfg.vocab_size, (b, 1), device=device)
        pos = torch.full((b, 1), context, device=device, dtype=torch.long)
        row = {}
        with torch.inference_mode():
            dyn = DynamicCache()
            hd = cfg.hidden_size // cfg.num_attention_heads
            for i in range(cfg.num_hidden_layers):
                k = torch.randn(b, cfg.num_key_value_heads, context, hd, device=device, dtype=torch.bfloat16)
                dyn.update(k, torch.randn_like(k), i)

            def dynamic():
                model(tok, past_key_values=dyn, use_cache=True, position_ids=pos)
                dyn.crop(-1)

            row["eager_dynamic_ms"] = _median_ms(dynamic, cuda)
            try:
                _static(model, cfg, b, context, tok, pos, device, cuda, row)
            except Exception as exc:  # another transformers' StaticCache: say so, keep the eager figure
                row["static_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rec["steps"][str(b)] = row
        print(b, row, flush=True)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(rec, fh, indent=1)


def _static(model, cfg, b: int, context: int, tok, pos, device: str, cuda: bool, row: dict) -> None:
    """The step with a StaticCache: eager, and replayed from a CUDA graph on a GPU."""
    from transformers import StaticCache

    with torch.inference_mode():
        try:
            static = StaticCache(config=cfg, max_cache_len=context + 8)
        except TypeError:
            static = StaticCache(config=cfg, max_batch_size=b, max_cache_len=context + 8, device=device,
                                 dtype=torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, (b, context), device=device)
        model(ids, past_key_values=static, use_cache=True, cache_position=torch.arange(context, device=device))
        at = torch.tensor([context], device=device)
        counters = [layer.cumulative_length for layer in getattr(static, "layers", ())
                    if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]

        def step():  # the same position every time: a counting cache (transformers 5.2x) counted back
            out = model(tok, past_key_values=static, use_cache=True, cache_position=at, position_ids=pos)
            for counter in counters:
                counter.sub_(1)
            return out

        row["eager_static_ms"] = _median_ms(step, cuda)
        if cuda:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            row["graph_static_ms"] = _median_ms(graph.replay, cuda)
            del graph


def report(path: str) -> None:
    from archscan.llm.decode import decode_step
    from archscan.load.targets import input_specs, to_target
    from archscan.measure import datasheet_profile
    from archscan.devices.gpus import gpu_named_like

    with open(path, encoding="utf-8") as fh:
        rec = json.load(fh)
    named = gpu_named_like(rec["device"])
    profile = datasheet_profile(named.name if named is not None else "h200")
    print(f"{rec['device']}, torch {rec['torch']}, {rec['date']}; predicted on {profile.name}")
    print(f"{'batch':>5} {'eager dyn':>10} {'pred':>8} {'ratio':>6} {'graph':>8} {'served':>8} {'ratio':>6} {'eager static':>13}")
    for b, row in rec["steps"].items():
        out = decode_step(to_target(f"{ROOT}/tests/gpu_truth/models.py:llama_1b"), input_specs([f"{b},1:int64"],
                          torch.bfloat16), rec["context"], dtype=torch.bfloat16, profile=profile)["phases"]["decode"]
        graph = row.get("graph_static_ms")
        print(f"{b:>5} {row['eager_dynamic_ms']:>10.3f} {out['predicted_ms']:>8.3f} "
              f"{out['predicted_ms'] / row['eager_dynamic_ms']:>6.2f} "
              + (f"{graph:>8.3f} {out['served_ms']:>8.3f} {out['served_ms'] / graph:>6.2f}" if graph else f"{'-':>24}")
              + f" {row['eager_static_ms']:>13.3f}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("measure", "report"):
        sys.exit(__doc__)
    if sys.argv[1] == "measure":
        measure(sys.argv[2], dry="--dry" in sys.argv)
    else:
        report(sys.argv[2])
