"""Hugging Face decoders with their default ``use_cache=True``: the whole ``archscan`` process
against the tool a user would otherwise pick, torch's ``FlopCounterMode`` on a real forward
(real weights, real compute), each in a fresh process, wall time and peak RSS side by side.

    python benchmarks/bench_hf.py                  # TinyLlama-1.1B and Llama-2-7B shapes, 1x128 tokens
    python benchmarks/bench_hf.py --models llama2_7b --tokens 512
    python benchmarks/bench_hf.py --models mamba_130m,rwkv_169m --tokens 64
    python benchmarks/bench_hf.py --models mamba_130m,rwkv_169m --tokens 64 --in-process

Models are built from configs (random weights; no download). Needs ``transformers``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CONFIGS = {  # name -> (model class, config class, config arguments as published with the checkpoints)
    "tinyllama_1b": ("LlamaForCausalLM", "LlamaConfig",
                     dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                          num_key_value_heads=4, vocab_size=32000)),
    "llama2_7b": ("LlamaForCausalLM", "LlamaConfig",
                  dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000)),
    # recurrent models whose CPU path loops over the tokens in Python: long graphs of small ops
    "mamba_130m": ("MambaForCausalLM", "MambaConfig",
                   dict(hidden_size=768, num_hidden_layers=24, vocab_size=50280, state_size=16)),
    "rwkv_169m": ("RwkvForCausalLM", "RwkvConfig",
                  dict(hidden_size=768, num_hidden_layers=12, vocab_size=50277, context_length=1024)),
}

MODEL_FILE = """\
import transformers

def build(name):
    model, config, arguments = {configs}[name]
    return getattr(transformers, model)(getattr(transformers, config)(**arguments))
"""

FLOP_COUNTER = """\
import json, sys, torch, transformers
from torch.utils.flop_counter import FlopCounterMode
sys.path.insert(0, {dir!r})
from hf_models import build
model = build({name!r}).eval()
with FlopCounterMode(display=False) as counter, torch.no_grad():
    model(torch.zeros(1, {tokens}, dtype=torch.long))
print(json.dumps({{"flops": counter.get_total_flops() // 2}}))
"""


def timed(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds and peak RSS (GiB, from GNU time) of one child process."""
    t = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t
    lines = out.stderr.strip().splitlines()
    peak_kib = int(lines[-1]) if lines and lines[-1].isdigit() else float("nan")
    return wall, peak_kib / 2**20, out


IN_PROCESS = """\
import json, sys, time, torch, archscan
from torch.utils.flop_counter import FlopCounterMode
sys.path.insert(0, {dir!r})
from hf_models import build
t = time.perf_counter(); model = build({name!r}).eval(); built = time.perf_counter() - t
t = time.perf_counter()
with FlopCounterMode(display=False) as counter, torch.no_grad():
    model(torch.zeros(1, {tokens}, dtype=torch.long))
forward = time.perf_counter() - t
t = time.perf_counter(); report = archscan.scan(model, ["1,{tokens}:int64"]); scanned = time.perf_counter() - t
print(json.dumps({{"build": built, "forward": forward, "scan": scanned, "capture": report.capture,
                  "same": report.totals.flops == counter.get_total_flops() // 2}}))
"""


def in_process(args) -> None:
    """One process per model: build it, then time its real forward under FlopCounterMode and
    ``archscan.scan`` of the built model, each call alone (no imports, no construction)."""
    print(f"{'model':<14}{'build s':>9}{'real forward + FlopCounterMode s':>34}{'archscan.scan s':>17}{'ratio':>7}")
    for name in args.models.split(","):
        out = subprocess.run([sys.executable, "-c", IN_PROCESS.format(dir=args.workdir, name=name, tokens=args.tokens)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{name:<14}failed: {out.stderr.strip()[-300:]}")
            continue
        got = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:<14}{got['build']:>9.1f}{got['forward']:>34.2f}{got['scan']:>17.2f}{got['scan'] / got['forward']:>7.1f}"
              f"  (capture: {got['capture']}; same multiply-adds: {got['same']})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tinyllama_1b,llama2_7b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--workdir", default="/tmp/archscan-bench-hf")
    ap.add_argument("--in-process", action="store_true",
                    help="time the calls alone in one process, the model already built")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "hf_models.py"), "w") as f:
        f.write(MODEL_FILE.format(configs=json.dumps(CONFIGS)))
    if args.in_process:
        in_process(args)
        return
    archscan = os.path.join(os.path.dirname(sys.executable), "archscan")
    print(f"{'model':<14}{'tool':<34}{'wall s':>8}{'peak GiB':>10}{'multiply-adds':>18}")
    for name in args.models.split(","):
        target = f"{args.workdir}/hf_models.py:build"
        wall, peak, out = timed([archscan, target, "--kwargs", f"name='{name}'", "--input",
                                 f"1,{args.tokens}:int64", "--json"])
        if out.returncode != 0:
            print(f"{name:<14}archscan failed: {out.stderr.strip()[-300:]}")
            continue
        data = json.loads(out.stdout)
        print(f"{name:<14}{'archscan (capture: ' + data['capture'] + ')':<34}{wall:>8.1f}{peak:>10.2f}"
              f"{data['totals']['flops']:>18,}")
        code = FLOP_COUNTER.format(dir=args.workdir, name=name, tokens=args.tokens)
        wall_fc, peak_fc, out = timed([sys.executable, "-c", code])
        if out.returncode != 0:
            text = [l for l in out.stderr.strip().splitlines() if not l.isdigit()]
            why = text[-1][:100] if text else f"killed (exit {out.returncode}; out of memory at {peak_fc:.1f} GiB?)"
            print(f"{'':<14}{'FlopCounterMode, real forward':<34}  failed: {why}")
            continue
        flops = json.loads(out.stdout.strip().splitlines()[-1])["flops"]
        print(f"{'':<14}{'FlopCounterMode, real forward':<34}{wall_fc:>8.1f}{peak_fc:>10.2f}{flops:>18,}")
        print(f"{'':<14}{'ratio FlopCounterMode / archscan':<34}{wall_fc / wall:>7.1f}x{peak_fc / peak:>9.1f}x")
    print(f"(1x{args.tokens} tokens; whole processes incl. imports; {os.cpu_count()} CPUs; FlopCounterMode misses "
          "the CPU flash-attention kernel, so its count is lower)")


if __name__ == "__main__":
    main()
