#!/usr/bin/env bash
# End-to-end CPU measurements for docs/perf (run on a quiet machine; results depend on load).
#   bash tools/measure_cpu.sh [BUILD_DIR]      → docs/perf/cpu-e2e-<date>.{md,json} and friends
set -euo pipefail
cd "$(dirname "$0")/.."
B="${1:-build}"
D="$(date -u +%Y-%m-%d)"
OUT=docs/perf
echo "load before: $(cat /proc/loadavg)"
# 1. Memory read bandwidth (2 threads, transparent huge pages) — the decode ceiling.
"$B/bench/lab_float_linear" --only bw | tee "$OUT/cpu-bandwidth-$D.txt"
# 2. Llama-3.2-1B shapes (issue: float path vs memory bound; w8a8 / w4a8 vs bf16).
"$B/perry" bench --synthetic llama3.2-1b --modes bf16 w8a8 w4a8-g128 -p 512 -n 64 -r 3 -o "$OUT/cpu-e2e-llama3.2-1b-$D"
# 3. Qwen3-1.7B shapes: prefill 1024 and decode, w8a8 vs bf16.
"$B/perry" bench --synthetic qwen3-1.7b --modes bf16 w8a8 -p 1024 -n 32 -r 3 -o "$OUT/cpu-e2e-qwen3-1.7b-$D"
# 4. Decode GEMV bandwidth per mode (M = 1) on Llama-3-8B layer shapes.
"$B/perry" bench-op --m 1 -o "$OUT/cpu-bench-op-m1-$D"
echo "load after: $(cat /proc/loadavg)"
