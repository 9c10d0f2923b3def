#!/usr/bin/env bash
# Lab (not a test): each decode GEMV kernel of one mode alone — duration, instructions executed and
# DRAM bytes read per launch, medians per kernel — from one or more of the bundle's binaries
# (perry, and perry-alt of `ALT_REV=rev tools/gpu/make_bundle.sh`), under Nsight Compute with three
# metrics only, so two versions of the kernels compare in ~35 s a binary. Nsight serializes the
# launches (no PDL overlap, caches flushed between them): the times are the kernels' isolated
# ones, not their share of a decode step (run_cuda_backend.sh `decode` measures that).
#   OUT=dir LAB_MODE=w4a16 [LAB_KERNEL=ILi2ELb0] [LAB_COUNT=48] [LAB_BINS="perry perry-alt"] \
#     bash tools/gpu/lab_gemv_kernel_times.sh
# LAB_KERNEL: a regex on the mangled name after `gemv_decode_kernel` (template arguments: weight
# kind 0 bf16 / 1 int8 / 2 int4, int8 x, grouped, input 0 RMSNorm / 1 plain, output 0 store /
# 1 accumulate / 2 SwiGLU / 3 RoPE+KV); the default takes every int4 weight-only kernel. Prints one
# line a kernel (its input and output kinds) per binary; the raw CSV is OUT/times-MODE-BIN.csv.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lab_ncu_env.sh"
MODE=${LAB_MODE:-w4a16}
K=${LAB_KERNEL:-ILi2ELb0}
for bin in ${LAB_BINS:-perry perry-alt}; do
  [ -x "$T/bin/$bin" ] || { echo "$bin: not in the bundle"; continue; }
  csv="$OUT/times-$MODE-$bin.csv"
  timeout ${LAB_TIMEOUT:-150} "$NCU" --clock-control none \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum \
    --kernel-name-base mangled --kernel-name "regex:gemv_decode_kernel$K" --launch-skip 0 \
    --launch-count "${LAB_COUNT:-48}" --csv \
    "$T/bin/$bin" run --device cuda --synthetic llama3-8b --quant "$MODE" --prompt-tokens 16 -n 3 --no-cuda-graphs \
    > "$csv" 2> "$OUT/times-$MODE-$bin.err"
  echo "$bin ($MODE): ncu exit $?"
  python3 - "$csv" <<'PY'
import collections, csv, re, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("  no kernel rows (see the .err file)")
head, rows = rows[0], rows[1:]
ii, ki, mi, ui, vi = (head.index(c) for c in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
scale = {"ns": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "nsecond": 1.0}
launch = collections.defaultdict(dict)  # ID -> metric -> value (time in ns)
kernel = {}
for r in rows:
    v = float(r[vi].replace(",", ""))
    if r[mi] == "gpu__time_duration.sum":
        v *= scale.get(r[ui], 1.0)
    launch[r[ii]][r[mi]] = v
    kernel[r[ii]] = r[ki]
ins = {"0": "RMSNorm", "1": "plain"}
outs = {"0": "store", "1": "accumulate", "2": "SwiGLU", "3": "RoPE+KV"}
per = collections.defaultdict(list)
for lid, m in launch.items():
    k = re.search(r"gemv_decode_kernel<\d+, \w+, \w+, (\d), (\d)", kernel[lid])
    name = f"{ins.get(k.group(1), '?')} -> {outs.get(k.group(2), '?')}" if k else kernel[lid][:40]
    # Kernels of one form but different shapes (o_proj and down_proj) apart by their bytes.
    per[(name, round(m.get("dram__bytes_read.sum", 0.0) / 1e7))].append(m)
for (name, _), ms in sorted(per.items()):
    med = {x: sorted(m.get(x, 0.0) for m in ms)[len(ms) // 2] for x in ms[0]}
    t, b = med.get("gpu__time_duration.sum", 0.0), med.get("dram__bytes_read.sum", 0.0)
    print(f"  {name:22s} {len(ms):3d} launches  {t / 1e3:7.2f} us  {med.get('smsp__inst_executed.sum', 0) / 1e6:6.2f} M instr"
          f"  {b / 1e6:6.1f} MB  {b / t / 1e3 if t else 0:5.2f} TB/s")
PY
done
