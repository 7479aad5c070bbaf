#!/usr/bin/env bash
# Regenerates the example reports in reports/examples/:
#   <model>.html, <model>.md            static analysis, no device: byte-for-byte the same on every run
#                                       (same archscan, torch and matplotlib versions)
#   <model>-measured-<device>.html|md   measured on this machine's device (the page names device and date)
#   table8-<device>.html|md|json        the ShuffleNetV2 paper's Table 8 models side by side, measured
#
#   usage: benchmarks/make_reports.sh [cpu|cuda]      (default cpu; run it on a quiet machine)
set -euo pipefail
cd "$(dirname "$0")/.."
device=${1:-cpu}
out=reports/examples
mkdir -p "$out"

no_profile=$(mktemp -d)  # an empty cache: no calibrated profile, so the static reports predict nothing
trap 'rm -rf "$no_profile"' EXIT
for model in shufflenet_v2_x1_0 mobilenet_v2 resnet50; do
    ARCHSCAN_CACHE_DIR=$no_profile archscan "zoo:$model" --report "$out/$model.html" --markdown "$out/$model.md" >/dev/null
done

archscan zoo:shufflenet_v2_x1_0 --measure --device "$device" \
    --report "$out/shufflenet_v2_x1_0-measured-$device.html" --markdown "$out/shufflenet_v2_x1_0-measured-$device.md" >/dev/null

# Table 8: equal-FLOPs groups of ShuffleNetV2, MobileNetV2, ShuffleNetV1 (g=3) and MobileNetV1, batch 1
archscan compare 'zoo:shufflenet_v2_*' zoo:mobilenet_v2 zoo:mobilenet_v2_140 zoo:shufflenet_v1_g3_x0_5 \
    zoo:shufflenet_v1_g3_x1_0 zoo:shufflenet_v1_g3_x1_5 zoo:shufflenet_v1_g3_x2_0 zoo:mobilenet_v1_050 zoo:mobilenet_v1 \
    --input 1,3,224,224 --measure --device "$device" --sort flops \
    --report "$out/table8-$device.html" --markdown "$out/table8-$device.md" --json > "$out/table8-$device.json"
