"""GPU truth for archscan: what a real GPU allocates and how long its kernels take, recorded once
so that archscan's GPU memory and latency models can be built and tested on CPU-only machines.

The held-out set on a lent GPU machine, from the repository root; the whole command ends within
420 s (the script skips what its --deadline cannot fit, `timeout` is the backstop), and $OUT gets one
file, heldout.tar.gz, of the output folder and its log (split into 15 MB parts heldout.tar.gz.NN,
joined with `cat`, only if it were over the 16 MiB that one returned file may hold):

    D=/tmp/heldout; rm -rf $D; mkdir -p $D; PYTHONUNBUFFERED=1 timeout -k 5 395 python3 tests/gpu_truth/capture.py --set heldout --out $D --deadline 370 2>&1 | tee $D/log.txt; tar czf $OUT/heldout.tar.gz -C /tmp heldout; if [ $(stat -c %s $OUT/heldout.tar.gz) -gt 16000000 ]; then split -b 15M -d $OUT/heldout.tar.gz $OUT/heldout.tar.gz.; rm $OUT/heldout.tar.gz; fi; ls -l $OUT

For every configuration it writes, under OUT/NAME/:
  trace.json.gz     torch.profiler's Chrome trace of the measured run (CPU ops with input shapes,
                    CUDA kernels with durations, and with --memory configs the allocator's
                    [memory] events: Addr, Bytes, Total Allocated, Total Reserved)
  snapshot.json.gz  torch.cuda.memory._snapshot() after a run under _record_memory_history:
                    the caching allocator's segments and its trace of alloc / free / segment events
  and one line in OUT/summary.jsonl: the configuration, memory_stats peaks (allocated, reserved,
  active), the bytes resident before the run and the run's own tensors, and median times of the
  run without the profiler (CUDA events), eager and, for forwards, replayed from a CUDA graph.
  Largest-batch searches (kind maxbatch, held-out set) write only their summary line.

Sets: `--set recorded` (the default) is the recorded set of README.md; `--set heldout` runs other
models for checking archscan on models its GPU models were not fitted to (README.md, "Held-out
set"). Each held-out configuration carries its estimated GPU seconds: one whose estimate would end
past --deadline (seconds since the script started) is skipped and recorded as skipped.

Runs on torch with CUDA; --dry runs every path it can on the CPU with toy sizes (the largest-batch
search then runs under a fake budget, DRY_FAKE_LARGEST, that raises torch.OutOfMemoryError).
"""

from __future__ import annotations

import time

T0 = time.time()  # before torch's import: --deadline counts from the start of the process

import argparse
import contextlib
import gc
import gzip
import json
import os
import traceback

import torch
import torch.nn.functional as F

P = argparse.ArgumentParser()
P.add_argument("--dry", action="store_true")
P.add_argument("--out", default=os.environ.get("OUT", "out"))
P.add_argument("--only", default="", help="run only the configurations whose id contains one of these comma-separated strings")
P.add_argument("--set", default="recorded", choices=("recorded", "heldout", "budgets"))
P.add_argument("--deadline", type=float, default=None, help="seconds; default 240 (recorded), 370 (heldout)")
ARGS = P.parse_args(None if __name__ == "__main__" else [])  # imported (by a test): defaults, no CUDA touched
DEV = torch.device("cpu" if ARGS.dry else "cuda")
CUDA = DEV.type == "cuda"
DEADLINE_S = {"recorded": 240.0, "heldout": 370.0, "budgets": 200.0}
DEADLINE = ARGS.deadline if ARGS.deadline is not None else DEADLINE_S[ARGS.set]


def sync():
    if CUDA:
        torch.cuda.synchronize()


def say(*a):
    print(f"[{time.time() - T0:6.1f} s]", *a, flush=True)


# ---- models (random weights, built on the device) ----------------------------------------------
def resnet50():
    import torchvision
    return torchvision.models.resnet18(num_classes=10) if ARGS.dry else torchvision.models.resnet50()


def mobilenet_v2():
    import torchvision
    return torchvision.models.mobilenet_v2(width_mult=0.25, num_classes=10) if ARGS.dry else torchvision.models.mobilenet_v2()


def vit_b_16():
    import torchvision
    if ARGS.dry:
        from torchvision.models.vision_transformer import VisionTransformer
        return VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                                 num_classes=10)
    return torchvision.models.vit_b_16()


def roberta_base():
    import transformers
    c = (transformers.RobertaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                    vocab_size=1000, max_position_embeddings=80) if ARGS.dry
         else transformers.RobertaConfig(vocab_size=50265, max_position_embeddings=514))
    c.attn_implementation = "sdpa"
    return transformers.RobertaForMaskedLM(c)


def llama_1b():
    import transformers
    c = (transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096) if ARGS.dry
         else transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                       max_position_embeddings=16384))
    c.attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(c)


def pythia_160m():
    import transformers
    c = (transformers.GPTNeoXConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
                                    vocab_size=1000, max_position_embeddings=2048) if ARGS.dry
         else transformers.GPTNeoXConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                         intermediate_size=3072, vocab_size=50304, max_position_embeddings=2048))
    c.attn_implementation = "sdpa"
    return transformers.GPTNeoXForCausalLM(c)


# held-out models: shapes of the published ones, random weights (the dry variants are toys of the same family)
def convnext_tiny():
    import torchvision
    if ARGS.dry:
        from torchvision.models.convnext import CNBlockConfig, ConvNeXt
        return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], stochastic_depth_prob=0.1, num_classes=10)
    return torchvision.models.convnext_tiny()


def efficientnet_b0():
    import torchvision
    return torchvision.models.efficientnet_b0(num_classes=10) if ARGS.dry else torchvision.models.efficientnet_b0()


def swin_t():
    import torchvision
    if ARGS.dry:
        from torchvision.models.swin_transformer import SwinTransformer
        return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=[4, 4],
                               stochastic_depth_prob=0.2, num_classes=10)
    return torchvision.models.swin_t()


def bert_base():
    import transformers
    c = (transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                 vocab_size=1000, max_position_embeddings=80) if ARGS.dry
         else transformers.BertConfig(vocab_size=30522, max_position_embeddings=512))  # dropout 0.1: the default
    c.attn_implementation = "sdpa"
    return transformers.BertForMaskedLM(c)


def gpt2():
    import transformers
    c = (transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=80,
                                 bos_token_id=0, eos_token_id=0) if ARGS.dry
         else transformers.GPT2Config(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024))
    c.attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(c)


def qwen2_0_5b():
    """Qwen2-0.5B's shape: 494,032,768 parameters, the output projection tied to the embedding as there."""
    import transformers
    c = (transformers.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  intermediate_size=128, vocab_size=1000, max_position_embeddings=128,
                                  tie_word_embeddings=True) if ARGS.dry
         else transformers.Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                       intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
                                       tie_word_embeddings=True))
    c.attn_implementation = "sdpa"
    return transformers.Qwen2ForCausalLM(c)


def mistral_7b():
    """Mistral-7B v0.3's shape (7,241,732,096 parameters with vocab 32000), full attention (no sliding window).
    build() makes it under torch.device("cuda") with bf16 as the default dtype: no float32 copy, and the
    initialisations (nn.Linear's, then HF's normal_) are two passes of GPU kernels over 14.5 GB."""
    import transformers
    c = (transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128,
                                    sliding_window=None) if ARGS.dry
         else transformers.MistralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                         num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                         max_position_embeddings=32768, sliding_window=None))
    c.attn_implementation = "sdpa"
    return transformers.MistralForCausalLM(c)


def mixtral_small():
    """A small Mixtral-shaped mixture of experts: 8 experts, top-2, 795,427,840 parameters."""
    import transformers
    c = (transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=1000,
                                    max_position_embeddings=128, sliding_window=None) if ARGS.dry
         else transformers.MixtralConfig(hidden_size=1024, intermediate_size=3584, num_hidden_layers=8,
                                         num_attention_heads=16, num_key_value_heads=8, num_local_experts=8,
                                         num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=32768,
                                         sliding_window=None))
    c.attn_implementation = "sdpa"
    return transformers.MixtralForCausalLM(c)


FACTORIES = {f.__name__: f for f in (resnet50, mobilenet_v2, vit_b_16, roberta_base, llama_1b, pythia_160m,
                                     convnext_tiny, efficientnet_b0, swin_t, bert_base, gpt2, qwen2_0_5b, mistral_7b,
                                     mixtral_small)}


def build(name, dtype=None):
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        with torch.device(DEV):
            m = FACTORIES[name]()
    finally:
        torch.set_default_dtype(prev)
    return m.to(dtype) if dtype is not None else m


def image(b):
    s = 32 if ARGS.dry else 224
    return torch.randn(b, 3, s, s, device=DEV)


def tokens(b, n, vocab):
    n = min(n, 64) if ARGS.dry else n
    return torch.randint(0, 1000 if ARGS.dry else vocab, (b, n), device=DEV)


def output_tensors(value):
    """The tensors in a model's output, through containers and objects (archscan's stand-in loss sums them)."""
    out, seen, stack = [], set(), [value]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif x is None or isinstance(x, (int, float, bool, str, bytes, torch.nn.Module)) or id(x) in seen:
            continue
        else:
            seen.add(id(x))
            if isinstance(x, dict):
                stack.extend(reversed(list(x.values())))
            elif isinstance(x, (list, tuple)):
                stack.extend(reversed(x))
            elif hasattr(x, "__dict__"):
                stack.extend(reversed(list(vars(x).values())))
    return out


def storage_bytes(tensors):
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == DEV.type:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


# ---- runs --------------------------------------------------------------------------------------
def train_run(model, inputs, kwargs, loss_kind, amp):
    """A closure running one training step: AdamW (foreach, torch's GPU default), zero_grad(set_to_none).
    loss_kind 'sum': archscan's stand-in (the sum of every floating output, released before backward);
    'model': the model's own loss from labels (HF), its output object alive until the step ends."""
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    ctx = (lambda: torch.autocast(DEV.type, dtype=torch.bfloat16)) if amp else (lambda: torch.autocast(DEV.type, enabled=False))

    def step():
        with ctx():
            out = model(*inputs, **kwargs)
        if loss_kind == "sum":
            outs = [t for t in output_tensors(out) if t.is_floating_point() and t.requires_grad]
            loss = outs[0].sum()
            for t in outs[1:]:
                loss = loss + t.sum()
            del out, outs
            loss.backward()
        else:
            out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, opt


def forward_run(model, inputs, kwargs):
    model.eval()

    def step():
        with torch.inference_mode():
            model(*inputs, **kwargs)
    return step


def median_ms(fn, reps=20, warm=3):
    if not CUDA:
        t = time.perf_counter(); fn(); return (time.perf_counter() - t) * 1e3
    for _ in range(warm):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def graph_ms(model, inputs):
    """A forward replayed from a CUDA graph (static inputs), median of 20."""
    if not CUDA:
        return None
    model.eval()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(*inputs)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        model(*inputs)
    ms = median_ms(g.replay)
    del g
    return ms


def write_gz(path, obj):
    with gzip.open(path, "wt") as f:
        json.dump(obj, f, default=str)


def profiled(name, step, memory):
    """One more run of `step` under the profiler (and the allocator's history on a GPU): writes its trace and snapshot."""
    from torch.profiler import ProfilerActivity, profile
    d = os.path.join(ARGS.out, name)
    os.makedirs(d, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    if CUDA and memory:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=2_000_000)
    with profile(activities=acts, record_shapes=True, profile_memory=memory) as prof:
        step()
        sync()
    raw = os.path.join(d, "trace.json")
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb") as g:
        g.write(f.read())
    os.remove(raw)
    if CUDA and memory:
        try:
            snap = torch.cuda.memory._snapshot()
            write_gz(os.path.join(d, "snapshot.json.gz"), snap)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)


def memory_stats():
    if not CUDA:
        return {}
    s = torch.cuda.memory_stats()
    keys = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak", "requested_bytes.all.peak",
            "allocated_bytes.all.current", "reserved_bytes.all.current", "segment.all.peak", "num_alloc_retries",
            "allocation.all.peak")
    return {k: s.get(k) for k in keys}


CONFIGS = [
    # name, model, kind, batch/inputs, extra
    ("mem_resnet50_train_b32", "resnet50", "train", dict(b=32)),
    ("mem_mobilenet_v2_train_b64", "mobilenet_v2", "train", dict(b=64)),
    ("mem_vit_b_16_train_b16", "vit_b_16", "train", dict(b=16)),
    ("mem_roberta_base_train_8x512", "roberta_base", "train", dict(b=8, n=512)),
    ("mem_roberta_base_train_8x512_bf16", "roberta_base", "train", dict(b=8, n=512, amp=True)),
    ("mem_roberta_base_train_8x512_labels", "roberta_base", "train", dict(b=8, n=512, loss="model")),
    ("mem_pythia_160m_train_4x1024", "pythia_160m", "train", dict(b=4, n=1024)),
    ("mem_llama_1b_train_2x2048_bf16w", "llama_1b", "train", dict(b=2, n=2048, dtype=torch.bfloat16)),
    ("mem_llama_1b_train_2x2048_bf16w_labels", "llama_1b", "train", dict(b=2, n=2048, dtype=torch.bfloat16, loss="model")),
    ("mem_resnet50_fwd_b64", "resnet50", "forward", dict(b=64)),
    ("mem_vit_b_16_fwd_b64", "vit_b_16", "forward", dict(b=64)),
    ("mem_llama_1b_fwd_1x8192_bf16", "llama_1b", "forward", dict(b=1, n=8192, dtype=torch.bfloat16)),
    ("lat_resnet50_fwd_b64_bf16", "resnet50", "latency", dict(b=64, dtype=torch.bfloat16)),
    ("lat_resnet50_fwd_b64_fp32", "resnet50", "latency", dict(b=64)),
    ("lat_mobilenet_v2_fwd_b128_bf16", "mobilenet_v2", "latency", dict(b=128, dtype=torch.bfloat16)),
    ("lat_vit_b_16_fwd_b64_bf16", "vit_b_16", "latency", dict(b=64, dtype=torch.bfloat16)),
    ("lat_resnet50_train_b32_fp32", "resnet50", "latency_train", dict(b=32)),
    ("lat_llama_1b_prefill_1x2048_bf16", "llama_1b", "latency", dict(b=1, n=2048, dtype=torch.bfloat16)),
    ("lat_llama_1b_decode_b1_l2048_bf16", "llama_1b", "decode", dict(b=1, n=2048, dtype=torch.bfloat16)),
    ("lat_llama_1b_decode_b16_l2048_bf16", "llama_1b", "decode", dict(b=16, n=2048, dtype=torch.bfloat16)),
]

# The held-out set: models the recorded set does not have, most valuable first (a deadline cuts the tail).
# name, model, kind, batch/inputs and extras, estimated seconds on an H100 (build, warm-ups, runs, trace).
HELDOUT = [
    # memory: allocator peaks, trace with [memory] events, snapshot
    ("mem_bert_base_train_8x512", "bert_base", "train", dict(b=8, n=512), 10),  # the first pays CUDA's start
    ("mem_bert_base_train_8x512_bf16", "bert_base", "train", dict(b=8, n=512, amp=True), 3),
    ("mem_gpt2_train_4x1024", "gpt2", "train", dict(b=4, n=1024), 4),
    ("mem_convnext_tiny_train_b32", "convnext_tiny", "train", dict(b=32), 5),  # torchvision's import
    ("mem_efficientnet_b0_fwd_b256", "efficientnet_b0", "forward", dict(b=256), 3),
    ("mem_efficientnet_b0_train_b64", "efficientnet_b0", "train", dict(b=64), 4),
    ("mem_swin_t_train_b16", "swin_t", "train", dict(b=16), 4),
    ("mem_qwen2_0_5b_train_2x1024_bf16w", "qwen2_0_5b", "train", dict(b=2, n=1024, dtype=torch.bfloat16), 6),
    ("mem_gpt2_train_4x1024_expandable", "gpt2", "train", dict(b=4, n=1024, expandable_segments=True), 4),
    # largest batch under a memory budget: doubling from `start`, then bisection, within cap_s
    ("maxbatch_convnext_tiny_train_12gib", "convnext_tiny", "maxbatch", dict(run="train", budget_gib=12, start=32, cap_s=45), 30),
    ("maxbatch_gpt2_train_x1024_12gib", "gpt2", "maxbatch", dict(run="train", n=1024, budget_gib=12, start=4, cap_s=40), 20),
    ("maxbatch_bert_base_train_x512_8gib", "bert_base", "maxbatch", dict(run="train", n=512, budget_gib=8, start=8, cap_s=40), 20),
    ("maxbatch_efficientnet_b0_fwd_24gib", "efficientnet_b0", "maxbatch", dict(run="forward", budget_gib=24, start=256, cap_s=45), 25),
    # latency
    ("lat_convnext_tiny_fwd_b128_bf16", "convnext_tiny", "latency", dict(b=128, dtype=torch.bfloat16), 5),
    ("lat_convnext_tiny_fwd_b64_fp32", "convnext_tiny", "latency", dict(b=64), 4),
    ("lat_efficientnet_b0_fwd_b256_bf16", "efficientnet_b0", "latency", dict(b=256, dtype=torch.bfloat16), 6),
    ("lat_swin_t_fwd_b64_bf16", "swin_t", "latency", dict(b=64, dtype=torch.bfloat16), 5),
    ("lat_bert_base_train_8x512_fp32", "bert_base", "latency_train", dict(b=8, n=512), 4),
    ("lat_convnext_tiny_train_b32_fp32", "convnext_tiny", "latency_train", dict(b=32), 4),
    # one Mistral-7B (14.5 GB of bf16 weights) built for the first and kept for the next four (KEEP);
    # KV caches: 0.27 GB at 1 x 2,048, 2.1 GB at 1 x 16,384, 8.6 GB at 16 x 4,096 and at 32 x 2,048
    ("lat_mistral_7b_decode_b1_l2048_bf16", "mistral_7b", "decode", dict(b=1, n=2048, dtype=torch.bfloat16), 8),
    ("lat_mistral_7b_decode_b1_l16384_bf16", "mistral_7b", "decode", dict(b=1, n=16384, dtype=torch.bfloat16), 4),
    ("lat_mistral_7b_decode_b16_l4096_bf16", "mistral_7b", "decode", dict(b=16, n=4096, dtype=torch.bfloat16), 5),
    ("lat_mistral_7b_decode_b32_l2048_bf16", "mistral_7b", "decode", dict(b=32, n=2048, dtype=torch.bfloat16), 5),
    ("lat_mistral_7b_prefill_1x4096_bf16", "mistral_7b", "latency", dict(b=1, n=4096, dtype=torch.bfloat16), 6),
    ("lat_mixtral_small_decode_b1_l2048_bf16", "mixtral_small", "decode", dict(b=1, n=2048, dtype=torch.bfloat16), 5),
    ("lat_mixtral_small_decode_b16_l2048_bf16", "mixtral_small", "decode", dict(b=16, n=2048, dtype=torch.bfloat16), 4),
    ("lat_mixtral_small_prefill_1x2048_bf16", "mixtral_small", "latency", dict(b=1, n=2048, dtype=torch.bfloat16), 4),
]
# archscan's own largest batches (--gpu h100, 2026-11-26) checked on the GPU: each search starts
# at archscan's answer (docs/memory.md)
BUDGETS = [
    ("maxbatch_qwen2_0_5b_train_x1024_16gib_bf16w", "qwen2_0_5b", "maxbatch",
     dict(run="train", n=1024, dtype=torch.bfloat16, budget_gib=16, start=6, cap_s=40), 25),
    ("maxbatch_vit_b_16_train_10gib", "vit_b_16", "maxbatch", dict(run="train", budget_gib=10, start=69, cap_s=45), 25),
    ("maxbatch_resnet50_train_8gib", "resnet50", "maxbatch", dict(run="train", budget_gib=8, start=90, cap_s=45), 25),
    ("maxbatch_llama_1b_train_x1024_20gib_bf16w", "llama_1b", "maxbatch",
     dict(run="train", n=1024, dtype=torch.bfloat16, budget_gib=20, start=6, cap_s=45), 25),
]
SETS = {"recorded": [(*c, 0.0) for c in CONFIGS], "heldout": HELDOUT, "budgets": BUDGETS}
VOCAB = {"roberta_base": 50265, "llama_1b": 32000, "pythia_160m": 50304, "bert_base": 30522, "gpt2": 50257,
         "qwen2_0_5b": 151936, "mistral_7b": 32000, "mixtral_small": 32000}
ENCODERS = ("roberta_base", "bert_base")  # no KV cache: no use_cache argument
KEEP = ("mistral_7b", "mixtral_small")  # built once, kept while consecutive inference configurations use them
INFERENCE = ("forward", "latency", "decode")
DRY_FAKE_LARGEST = 5  # dry runs only: the "budget" of a largest-batch search fits batches up to this


def inputs_for(model_name, kind, ex, model):
    dtype = ex.get("dtype")
    if model_name in VOCAB:
        ids = tokens(ex["b"], ex["n"], VOCAB[model_name])
        kw = {"use_cache": False} if model_name not in ENCODERS else {}
        if ex.get("loss") == "model":
            kw["labels"] = ids
        return [ids], kw
    x = image(ex["b"])
    return [x.to(dtype) if dtype is not None else x], {}


def decode_step(model, b, n):
    """One eager decode step of b tokens after a DynamicCache holding n random tokens per layer (cropped back after)."""
    from transformers import DynamicCache
    cfg = model.config
    n = min(n, 64) if ARGS.dry else n
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache()
    for i in range(cfg.num_hidden_layers):
        k = torch.randn(b, cfg.num_key_value_heads, n, hd, device=DEV, dtype=torch.bfloat16)
        cache.update(k, torch.randn_like(k), i)
    tok = torch.randint(0, cfg.vocab_size, (b, 1), device=DEV)
    pos = torch.full((b, 1), n, device=DEV, dtype=torch.long)
    model.eval()

    def step():
        with torch.inference_mode():
            model(tok, past_key_values=cache, use_cache=True, position_ids=pos)
        cache.crop(-1)
    return step


_KEPT = {}  # (model, dtype) -> the model of KEEP in use


def model_for(model_name, kind, dtype):
    """A fresh model, or for the models of KEEP in inference the one already built (main() releases
    a kept model before a configuration of another)."""
    key = (model_name, dtype)
    if key in _KEPT:
        return _KEPT[key]
    t = time.time()
    model = build(model_name, dtype)
    if model_name in KEEP and kind in INFERENCE:
        _KEPT[key] = model
        say(f"built {model_name} in {time.time() - t:.1f} s, kept")
    return model


def release_kept():
    if _KEPT:
        _KEPT.clear()
        gc.collect()
        if CUDA:
            torch.cuda.empty_cache()


@contextlib.contextmanager
def allocator_settings(expandable):
    """The caching allocator with expandable segments for the duration (on a GPU), then as before."""
    if not (CUDA and expandable):
        yield
        return
    gc.collect(); torch.cuda.empty_cache()  # segments made before stay fixed-size: start from none
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    try:
        yield
    finally:
        gc.collect(); torch.cuda.empty_cache()
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")


def run(cfg):
    name, model_name, kind, ex = cfg
    rec = {"id": name, "model": model_name, "kind": kind,
           **{k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in ex.items()}}
    model = model_for(model_name, kind, ex.get("dtype"))
    rec["params"] = sum(p.numel() for p in model.parameters())
    experts = getattr(getattr(model, "config", None), "num_local_experts", None)
    if experts:
        rec["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    inputs, kw = inputs_for(model_name, kind, ex, model)
    if kind == "decode":
        step = decode_step(model, ex["b"], ex["n"])
    elif kind in ("train", "latency_train"):
        step, opt = train_run(model, inputs, kw, ex.get("loss", "sum"), ex.get("amp", False))
    else:
        step = forward_run(model, inputs, kw)
    torch.backends.cudnn.benchmark = kind.startswith("latency") or kind == "decode"
    step()  # warm-up: optimizer state exists, kernels chosen
    if kind in ("train", "latency_train"):
        step()
    sync(); gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    own = list(model.parameters()) + list(model.buffers()) + inputs + [t for t in kw.values() if isinstance(t, torch.Tensor)]
    if kind in ("train", "latency_train"):
        own += [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    rec["own_bytes"] = storage_bytes(own)
    if CUDA:
        rec["resident_bytes"] = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    memory = kind in ("train", "forward")
    if memory:
        step(); sync()
        rec["stats"] = memory_stats()
        if CUDA:
            rec["max_memory_allocated"] = torch.cuda.max_memory_allocated()
            rec["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    else:
        rec["eager_ms"] = median_ms(step)
        if kind == "latency" and "n" not in ex:
            try:
                rec["graph_ms"] = graph_ms(model, inputs)
            except Exception as e:
                rec["graph_error"] = f"{type(e).__name__}: {e}"[:300]
    profiled(name, step, memory)
    del model, step, inputs, kw
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    return rec


# ---- largest batch under a memory budget ------------------------------------------------------------
def search_largest(fits, start, give_up, limit=1 << 16):
    """The largest batch for which fits(b) is True, by doubling from start then bisection.

    fits(b) -> True (ran), False (out of memory); give_up() -> True when time is up.
    Returns (largest, smallest_oom, complete): largest 0 when not even 1 fits, smallest_oom None when
    no batch up to limit failed; complete False when give_up() or limit stopped the search first.
    """
    largest, smallest_oom, b = 0, None, start
    while True:
        if fits(b):
            largest = b
        else:
            smallest_oom = b
        if smallest_oom is not None and smallest_oom - largest <= 1:
            return largest, smallest_oom, True
        if smallest_oom is None:
            b *= 2  # doubling while everything fits
        elif largest == 0:
            b = smallest_oom // 2  # halving while nothing fits yet
        else:
            b = (largest + smallest_oom) // 2  # bisection
        if give_up() or b > limit:
            return largest, smallest_oom, False


def one_try(model_name, run_kind, ex, b, info):
    """A fresh model (and optimizer) at batch b: a training step twice (the second steady), or a forward
    twice (warm-up and run), under inference_mode. Raises torch.OutOfMemoryError when it does not fit."""
    model = build(model_name, ex.get("dtype"))
    info["params"] = sum(p.numel() for p in model.parameters())
    inputs, kw = inputs_for(model_name, run_kind, {**ex, "b": b}, model)
    step = train_run(model, inputs, kw, ex.get("loss", "sum"), ex.get("amp", False))[0] if run_kind == "train" \
        else forward_run(model, inputs, kw)
    step()
    if ARGS.dry and b > DRY_FAKE_LARGEST:  # dry-only fake budget, raised with the model and its state alive
        raise torch.OutOfMemoryError(f"dry-only fake budget: batch {b} > DRY_FAKE_LARGEST {DRY_FAKE_LARGEST}")
    step()
    sync()


def maxbatch(cfg):
    """The largest batch that runs under torch.cuda.set_per_process_memory_fraction(budget / total)."""
    name, model_name, kind, ex = cfg
    rec = {"id": name, "model": model_name, "kind": kind,
           **{k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in ex.items()}}
    budget = int(ex["budget_gib"] * 2**30)
    rec["budget_bytes"] = budget
    torch.backends.cudnn.benchmark = False  # as the memory configurations
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        rec["fraction"] = budget / total
        rec["resident_bytes"] = torch.cuda.memory_allocated()  # the CUDA libraries' workspaces, within the budget
        rec["resident_reserved_bytes"] = torch.cuda.memory_reserved()
        torch.cuda.set_per_process_memory_fraction(budget / total)
    else:
        rec["dry_fake_largest"] = DRY_FAKE_LARGEST
    tries, best, info = [], {}, {}
    t0 = time.time()

    def fits(b):  # the cache is empty and garbage collected: before the search, and after each try
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        t = time.time()
        entry = {"b": b}
        try:
            one_try(model_name, ex["run"], ex, b, info)
            entry["outcome"] = "ok"
        except torch.OutOfMemoryError:
            entry["outcome"] = "oom"
        except Exception as e:  # not a memory limit: the search stops, its tries so far are kept
            entry.update(outcome="error", error=f"{type(e).__name__}: {e}"[:300])
        entry["s"] = round(time.time() - t, 2)
        gc.collect()  # the failed try's frames and cycles, before the peaks are read and the cache emptied
        if CUDA:
            stats = memory_stats()
            entry.update(allocated_peak=stats["allocated_bytes.all.peak"], reserved_peak=stats["reserved_bytes.all.peak"])
            if entry["outcome"] == "ok" and b > best.get("b", 0):
                best.update(b=b, stats=stats, max_memory_allocated=torch.cuda.max_memory_allocated(),
                            max_memory_reserved=torch.cuda.max_memory_reserved())
            torch.cuda.empty_cache()
            entry["left_bytes"] = torch.cuda.memory_allocated() - rec["resident_bytes"]  # 0 unless a try leaked
        tries.append(entry)
        say(name, entry)
        if entry["outcome"] == "error":
            raise SearchError(entry["error"])
        return entry["outcome"] == "ok"

    def give_up():
        return time.time() - t0 > ex["cap_s"] or time.time() - T0 > DEADLINE

    try:
        largest, smallest_oom, complete = search_largest(fits, ex["start"], give_up)
    except SearchError as e:
        largest, smallest_oom, complete = best.get("b", 0), None, False
        rec.update(ok=False, error=str(e))
    finally:
        if CUDA:
            torch.cuda.set_per_process_memory_fraction(1.0)
    rec.update(largest=largest, smallest_oom=smallest_oom, complete=complete, tries=tries, **info)
    for k in ("stats", "max_memory_allocated", "max_memory_reserved"):
        if k in best:
            rec[k] = best[k]
    return rec


class SearchError(Exception):
    """A try of a largest-batch search failed otherwise than by running out of memory."""


def selected(plan):
    """The configurations of plan whose id contains one of --only's comma-separated strings (all without it)."""
    keys = [k for k in ARGS.only.split(",") if k]
    return [c for c in plan if not keys or any(k in c[0] for k in keys)]


def main():
    os.makedirs(ARGS.out, exist_ok=True)
    env = {"id": "env", "dry": ARGS.dry, "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "set": ARGS.set}
    if CUDA:
        env.update(device=torch.cuda.get_device_name(), capability=torch.cuda.get_device_capability(),
                   total_memory=torch.cuda.get_device_properties(0).total_memory, cudnn=torch.backends.cudnn.version(),
                   matmul_tf32=torch.backends.cuda.matmul.allow_tf32, cudnn_tf32=torch.backends.cudnn.allow_tf32)
    errors = []
    for mod in ("transformers", "torchvision"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as e:
            errors.append(repr(e))
    if errors:
        env["import_error"] = "; ".join(errors)
    gc.freeze()  # the libraries' objects, never garbage: each gc.collect() between runs scans only what came after
    with open(os.path.join(ARGS.out, "summary.jsonl"), "a") as out:
        out.write(json.dumps(env) + "\n"); out.flush()
        say("env", env)
        for *cfg, est_s in selected(SETS[ARGS.set]):
            if time.time() - T0 + est_s > DEADLINE:
                out.write(json.dumps({"id": cfg[0], "skipped": "deadline"}) + "\n"); out.flush()
                say("skip", cfg[0]); continue
            if (cfg[1], cfg[3].get("dtype")) not in _KEPT:
                release_kept()  # the kept model goes before any other is built
            t = time.time()
            try:
                with allocator_settings(cfg[3].get("expandable_segments", False)):
                    rec = maxbatch(cfg) if cfg[2] == "maxbatch" else run(cfg)
                rec.setdefault("ok", True)  # a search that broke off on an error says ok: false itself
            except Exception as e:
                rec = {"id": cfg[0], "ok": False, "error": f"{type(e).__name__}: {e}"[:400],
                       "tb": traceback.format_exc()[-1500:]}
                gc.collect()
                if CUDA:
                    torch.cuda.empty_cache()
            rec["wall_s"] = round(time.time() - t, 2)
            out.write(json.dumps(rec) + "\n"); out.flush()
            say(cfg[0], {k: v for k, v in rec.items() if k not in ("tb", "tries")})
        release_kept()
    say("done")


if __name__ == "__main__":
    main()
