#!/usr/bin/env bash
# Lab (not a test): one decode GEMV kernel in full under Nsight Compute, from one or more of the
# bundle's binaries (perry, and perry-alt of `ALT_REV=rev tools/gpu/make_bundle.sh`), so that two
# versions of a kernel are read side by side: the details page (speed of light, warp states,
# scheduler, instruction mix, occupancy) and the source page (warp-stall samples per SASS
# instruction, with the SASS), both as CSV.
#   OUT=dir LAB_MODE=w8a16 LAB_KERNEL=ILi1ELb0ELb1ELi0ELi2E [LAB_SKIP=4] [LAB_BINS="perry perry-alt"] \
#     bash tools/gpu/lab_gemv_profile.sh
# LAB_KERNEL: a regex on the mangled name, template arguments <weight kind (0 bf16, 1 int8, 2 int4),
# int8 x, grouped, input (0 RMSNorm, 1 plain), output (0 store, 1 accumulate, 2 SwiGLU, 3 RoPE+KV)>;
# the example is w8a16's gate|up. LAB_SKIP: launches of that kernel skipped first (one a layer a
# token; the 16-token prompt's prefill does not use it). One profile takes ~40–60 s. Outputs:
# OUT/prof-LABEL-details.csv, OUT/prof-LABEL-source.csv (LABEL = LAB_TAG or mode-kernel-binary).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lab_ncu_env.sh"
MODE=${LAB_MODE:-w8a16}
K=${LAB_KERNEL:-ILi1ELb0ELb1ELi0ELi2E}
for bin in ${LAB_BINS:-perry}; do
  [ -x "$T/bin/$bin" ] || { echo "$bin: not in the bundle"; continue; }
  label=${LAB_TAG:-$MODE-$K}-$bin
  rep="$T/prof-$label"
  timeout ${LAB_TIMEOUT:-150} "$NCU" --clock-control none --set full --import-source no \
    --kernel-name-base mangled --kernel-name "regex:$K" --launch-skip "${LAB_SKIP:-4}" --launch-count 1 \
    -f -o "$rep" "$T/bin/$bin" run --device cuda --synthetic llama3-8b --quant "$MODE" --prompt-tokens 16 -n 3 \
    --no-cuda-graphs > "$OUT/prof-$label.log" 2>&1
  echo "$label: ncu exit $?"
  "$NCU" -i "$rep.ncu-rep" --page details --csv > "$OUT/prof-$label-details.csv" 2>&1
  "$NCU" -i "$rep.ncu-rep" --page source --print-source sass --csv > "$OUT/prof-$label-source.csv" 2>&1
  echo "  details $(wc -l < "$OUT/prof-$label-details.csv") lines, source $(wc -l < "$OUT/prof-$label-source.csv") lines"
done
