#!/usr/bin/env bash
# Lab (not a test): where a gemv_decode kernel's time goes, instruction by instruction. Nsight
# Compute source counters (warp-stall samples per SASS instruction, CSV) of one decode GEMV of
# Llama-3-8B — launch LAB_SKIP + 1 of the kernel (LAB_SKIP 4: o_proj of layer 2; 5: its
# down_proj) — with the input row built and with the lab switch PERRY_LAB_DECODE_INPUT=read (x
# read, row left at zero; gemv_decode.h, lab_input).
#   OUT=dir [LAB_MODE=w4a8-g128] [LAB_KERNELS="ILi2ELb1ELb1ELi1ELi1E"] [LAB_INPUTS="build read"] [LAB_SKIP=4] \
#     bash tools/gpu/lab_prologue.sh
# LAB_KERNELS: regexes on the mangled name — template arguments <weight kind, int8 x, grouped,
# input (0 RMSNorm, 1 plain), output (0 store, 1 accumulate, 2 SwiGLU, 3 RoPE+KV)>, e.g.
# ILi2ELb1ELb1ELi0ELi2E = gate|up of w4a8-g128. Each profile takes ~40 s (docs/perf/cuda/
# s13-run3-4-prologue-lab.md: 3 of them fit a 240 s call). With a bundle built by
# `LINEINFO=1 tools/gpu/make_bundle.sh`, LAB_SOURCE=cuda,sass (if this ncu accepts both) or cuda
# attributes the samples to CUDA source lines.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lab_ncu_env.sh"
for k in ${LAB_KERNELS:-ILi2ELb1ELb1ELi1ELi1E}; do
  for lab in ${LAB_INPUTS:-build read}; do
    env $([ "$lab" != build ] && echo PERRY_LAB_DECODE_INPUT=$lab) timeout 150 "$NCU" --clock-control none \
      --kernel-name-base mangled --kernel-name "regex:$k" --launch-skip "${LAB_SKIP:-4}" --launch-count 1 \
      --section SourceCounters --print-source "${LAB_SOURCE:-sass}" --page source --csv \
      $T/bin/perry run --device cuda --synthetic llama3-8b --quant "${LAB_MODE:-w4a8-g128}" --prompt-tokens 16 -n 3 \
      --no-cuda-graphs > "$OUT/src-$k-$lab.csv" 2> "$OUT/src-$k-$lab.err"
    echo "$k $lab: exit $? $(wc -l < "$OUT/src-$k-$lab.csv") lines"
  done
done
