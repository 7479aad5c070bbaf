#!/usr/bin/env bash
# Everything that needs a GPU, in one run (e.g. on a lent device machine that already has torch):
# install archscan without touching torch, run the CUDA tests, calibrate, measure fidelity and
# reproduce the guideline tables; results land in reports/ (and $OUT when set).
set -euo pipefail
cd "$(dirname "$0")/.."
pip install -q --no-deps -e . && pip install -q networkx tabulate typer pytest
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())"
python -m pytest -q tests/test_measure.py
archscan calibrate --device cuda
python benchmarks/bench_fidelity.py --device cuda --runs 3
day=$(date -u +%F)
{ echo "# ShuffleNetV2 guideline benchmarks on $(python -c 'import torch; print(torch.cuda.get_device_name())')"; echo
  echo "Date $day, torch $(python -c 'import torch; print(torch.__version__)'), produced by \`archscan guidelines --device cuda\`."; echo
  echo '```text'; archscan guidelines --device cuda; echo; archscan guidelines --device cuda --scale 4; echo '```'; } > "reports/guidelines-cuda-$day.md"
archscan zoo:resnet50 --input 8,3,224,224 --measure --sweep --device cuda --depth 1 > "reports/examples/resnet50-cuda-$day.txt"
archscan zoo:resnet50 --input 8,3,224,224 --measure --device cuda --amp bf16 --channels-last --depth 1 > "reports/examples/resnet50-cuda-bf16-cl-$day.txt"
if [ -n "${OUT:-}" ]; then cp -r reports "$OUT/"; fi
