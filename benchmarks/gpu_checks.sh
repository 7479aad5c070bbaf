#!/usr/bin/env bash
# Everything that needs a GPU, in one run (e.g. on a lent device machine that already has torch and
# archscan's dependencies, offline), most important first: calibrate and time decode steps of a
# Llama-3-8B shape, the allocator's peak memory of forwards and training steps, the CUDA tests,
# fidelity, the guideline tables and ResNet-50 examples.
#     bash benchmarks/gpu_checks.sh [decode] [memory] [tests] [fidelity] [guidelines] [examples]
# (none named: all). Each step has a time limit, and one failing does not stop the rest. Results
# land in $OUT (when set) or reports/gpu-<date>/; the decode timings and the peaks become the
# predicted-against-measured tables anywhere, with no GPU:
#     python benchmarks/bench_decode_gpu.py report <that folder>/decode
#     python benchmarks/bench_memory_gpu.py report <that folder>/memory
set -uo pipefail
only="$*"   # the steps to run (decode memory tests fidelity guidelines examples); none named: all
cd "$(dirname "$0")/.."
day=$(date -u +%F)
out=${OUT:-reports/gpu-$day}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 ARCHSCAN_CACHE_DIR="${TMPDIR:-/tmp}/archscan-gpu-checks"
export PATH="$(python -c 'import sys, os; print(os.path.dirname(sys.executable))'):$PATH"  # the python that has torch
if ! python -c 'import archscan.zoo, typer' 2>/dev/null; then
  python -m pip install -q --no-deps --no-build-isolation -e . >"$ARCHSCAN_CACHE_DIR.install.log" 2>&1 || cat "$ARCHSCAN_CACHE_DIR.install.log"
fi
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,power.limit,driver_version --format=csv
step() { local limit=$1; shift; echo "== $*"; local t0=$SECONDS; timeout "$limit" "$@"; echo "== rc $? in $((SECONDS - t0)) s"; }
wanted() { [ -z "$only" ] || [[ " $only " == *" $1 "* ]]; }
if wanted decode; then step 150 python benchmarks/bench_decode_gpu.py measure --out "$out/decode" --calibrate; fi
if wanted memory; then step 120 python benchmarks/bench_memory_gpu.py measure --out "$out/memory"; fi
if wanted tests; then step 60 python -m pytest -q -p no:cacheprovider tests/test_measure.py; fi
if wanted fidelity; then step 120 python benchmarks/bench_fidelity.py --device cuda --runs 3 --out "$out"; fi
if wanted guidelines; then
  gpu=$(python -c 'import torch; print(torch.cuda.get_device_name())')
  { echo "# ShuffleNetV2 guideline benchmarks on $gpu"; echo
    echo "Date $day, torch $(python -c 'import torch; print(torch.__version__)'), produced by \`archscan guidelines --device cuda\`."; echo
    echo '```text'; timeout 60 archscan guidelines --device cuda; echo; timeout 60 archscan guidelines --device cuda --scale 4
    echo '```'; } > "$out/guidelines-cuda-$day.md"
  echo "== guidelines: $(wc -l < "$out/guidelines-cuda-$day.md") lines"
fi
if wanted examples; then
  timeout 60 archscan zoo:resnet50 --input 8,3,224,224 --measure --device cuda --depth 1 > "$out/resnet50-cuda-$day.txt"
  echo "== resnet50: rc $?"
  for b in 1 8; do  # every node's measured and predicted time, for the roofline's per-node check
    timeout 45 archscan zoo:resnet50 --input $b,3,224,224 --measure --device cuda --json > "$out/resnet50-b$b-cuda-$day.json"
    echo "== resnet50 batch $b json: rc $?"
  done
fi
