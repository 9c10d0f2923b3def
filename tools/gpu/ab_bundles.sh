#!/usr/bin/env bash
# Same-run A/B of two builds on the GPU machine (e.g. main against a branch): decode tok/s of each
# bundle, alternated per mode so that drift hits both alike.
#   here:  tools/gpu/make_bundle.sh && mv gpu-bundle/perry-gpu.txz gpu-bundle/a.txz   (build A)
#          git checkout B && tools/gpu/make_bundle.sh && mv gpu-bundle/perry-gpu.txz gpu-bundle/b.txz
#   there: OUT=dir [AB_MODES="w4a8-g128 w8a8"] [AB_REPEAT=2] bash tools/gpu/ab_bundles.sh a b
# Two bundles are ~40 MB of the device tool's 64 MiB: move the larger models aside for the call
# (docs/perf/cuda/s13-run6-warps-ab.md was run this way). One row is one
# `perry bench --device cuda --synthetic llama3-8b --modes M -p 128 -b 1 -n 64 -r 3` (~25 s);
# plan AB_MODES × AB_REPEAT × 2 rows inside the call's time limit.
set -u
OUT=${OUT:?set OUT}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -eq 2 ] || { echo "usage: ab_bundles.sh A B (gpu-bundle/A.txz, gpu-bundle/B.txz)"; exit 2; }
for b in "$@"; do mkdir -p "/tmp/ab-$b" && tar xJf "$ROOT/gpu-bundle/$b.txz" -C "/tmp/ab-$b" || exit 2; done
for m in ${AB_MODES:-w4a8-g128 w8a8}; do
  for rep in $(seq "${AB_REPEAT:-2}"); do
    for b in "$@"; do
      LD_LIBRARY_PATH="/tmp/ab-$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" timeout 90 "/tmp/ab-$b/bin/perry" bench \
        --device cuda --synthetic llama3-8b --modes "$m" -p 128 -b 1 -n 64 -r 3 -o "$OUT/ab-$m-$b-$rep" > /dev/null 2>&1
      echo "$m $b #$rep: $(grep 'decode b=' "$OUT/ab-$m-$b-$rep.md" 2>/dev/null | cut -d'|' -f5 | tr -d ' ') tok/s" |
        tee -a "$OUT/ab-summary.txt"
    done
  done
done
