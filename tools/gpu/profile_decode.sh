#!/usr/bin/env bash
# Per-kernel time of decode steps on the GPU machine (Nsight Compute, durations only, caches
# and clocks left alone): where a token's time goes beyond the weight reads.
#   tools/gpu/profile_decode.sh OUT [modes...]      (default: bf16 w8a8 w4a8-g128)
# Needs the bundle of tools/gpu/make_bundle.sh. For each mode: `perry run --synthetic llama3-8b`
# with a 16-token prompt and 3 new tokens, eager launches (--no-cuda-graphs), every kernel timed;
# OUT/profile-MODE.csv is the raw ncu table, OUT/profile.md the per-kernel sums of the last
# decode step (tools/gpu/profile_report.py; PROFILE_FIRST=1: the first forward, e.g. a prefill
# with PROFILE_TOKENS=2048 PROFILE_N=1).
set -uo pipefail
OUT=${1:?usage: profile_decode.sh OUT [modes...]}
shift
MODES=${*:-bf16 w8a8 w4a8-g128}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$OUT"
T=/tmp/perry-gpu
if [ ! -x "$T/bin/perry" ]; then
  rm -rf "$T" && mkdir -p "$T"
  tar xJf "$ROOT/gpu-bundle/perry-gpu.txz" -C "$T" || exit 2
fi
CUDA_LIB=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/lib64
export LD_LIBRARY_PATH="$T/lib:$CUDA_LIB:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 2; }
for m in $MODES; do
  # NCU_METRICS: more metrics (comma-separated; each extra pass replays the kernel); NCU_ARGS:
  # e.g. --kernel-name regex:gemv_decode --launch-count 226 to profile only part of the run.
  # shellcheck disable=SC2086
  timeout ${PROFILE_TIMEOUT:-200} "$NCU" --clock-control none --cache-control none \
    --metrics "${NCU_METRICS:-gpu__time_duration.sum}" ${NCU_ARGS:-} \
    --csv --page raw --log-file "$OUT/profile-$m.csv" \
    "$T/bin/perry" run --device cuda --synthetic llama3-8b --quant "$m" --prompt-tokens ${PROFILE_TOKENS:-16} -n ${PROFILE_N:-3} --no-cuda-graphs \
    ${PROFILE_ARGS:-} > "$T/perry-$m.out" 2> "$T/perry-$m.err"
  echo "$m: exit $? $(wc -l < "$OUT/profile-$m.csv") lines; $(tail -2 "$T/perry-$m.err" | tr '\n' ' ')"
done
python3 "$ROOT/tools/gpu/profile_report.py" ${PROFILE_FIRST:+--first} "$OUT"/profile-*.csv > "$OUT/profile.md" 2>&1
cat "$OUT/profile.md"
