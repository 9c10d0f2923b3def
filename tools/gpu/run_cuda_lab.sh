#!/usr/bin/env bash
# Builds and runs the CUDA W8A8 kernel lab (and, when the full CMake build is possible, the
# gtest `ctest -L cuda`) on the GPU machine. Finishes within 8 minutes (every step has a timeout).
#
#   tools/gpu/run_cuda_lab.sh OUT [--quick]
#
# OUT receives: lab_cuda_gemm_w8a8.{json,md} (timings + every check line), lab.log, build.log,
# lab_cuda_gemm_w8a8_wgmma.md + lab_wgmma.log (experimental sm_90a kernel), cmake.log (CMake
# build + ctest output), summary.md — 8 files at most, so everything comes back from the device tool. Exit status: 0 when every check passed, 1 otherwise.
# The lab is compiled with one direct nvcc line (needs only the CUDA toolkit: cudart, cuBLAS,
# cuBLASLt), so cmake/ninja/fmt/gtest are optional on the GPU machine. PERRY_CUDA_LAB_NO_CMAKE=1
# skips the CMake/gtest part (e.g. to try the script on a machine without a GPU).
set -uo pipefail
OUT=${1:?usage: run_cuda_lab.sh OUT [--quick]}
shift
LAB_ARGS=("$@")
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${PERRY_CUDA_WORK:-/tmp/perry-cuda-lab}
mkdir -p "$WORK"
START=$(date +%s)
DEADLINE=$((START + 420))  # every step's timeout is cut to this, so the script ends inside 8 min
left() { local l=$((DEADLINE - $(date +%s))); [ $l -gt ${1:-10} ] && echo $l || echo ${1:-10}; }
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
GENCODE="-gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80"
summary() { echo "$*" | tee -a "$OUT/summary.md"; }
: > "$OUT/summary.md"

summary "# run_cuda_lab $(date -u +%FT%TZ)"
summary ""
summary "- commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
summary "- gpu: $(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null | head -1)"
summary "- nvcc: $("$NVCC" --version 2>/dev/null | tail -1)"

# 1. The lab: one nvcc line (the library sources compiled in), C++17 for {fmt}-free error types.
echo "== building lab ($NVCC)"
( cd "$ROOT" && timeout 200 "$NVCC" -std=c++17 -O3 -Isrc $GENCODE -lineinfo \
    -o "$WORK/lab_cuda_gemm_w8a8" bench/cuda/lab_gemm_w8a8.cu src/kernels/cuda/gemm_w8a8.cu \
    src/kernels/cuda/gemm_w8a8_sm90.cu src/kernels/cuda/quantize_per_token.cu src/kernels/cuda/bench_peers.cu -lcublas -lcublasLt ) > "$OUT/build.log" 2>&1 &
LAB_BUILD=$!

# 2. In parallel, the gtest through CMake when cmake and the project's dependencies are present.
CTEST_STATUS="not run (cmake missing, or PERRY_CUDA_LAB_NO_CMAKE set)"
if [ -z "${PERRY_CUDA_LAB_NO_CMAKE:-}" ] && command -v cmake >/dev/null 2>&1; then
  GEN=""; command -v ninja >/dev/null 2>&1 && GEN="-G Ninja"
  # One overall bound (380 s) so the script stays inside 8 minutes whatever happens.
  timeout 380 bash -c "cmake -S '$ROOT' -B '$WORK/build' $GEN -DCMAKE_BUILD_TYPE=Release -DPERRY_CUDA=ON \
      -DPERRY_CUDA_ARCHITECTURES='90a;80' -DCMAKE_CUDA_COMPILER='$NVCC' &&
    cmake --build '$WORK/build' -j 8 --target test_cuda_kernels" > "$OUT/cmake.log" 2>&1 &
  TEST_BUILD=$!
else
  TEST_BUILD=""
fi

wait $LAB_BUILD
LAB_BUILD_RC=$?
if [ $LAB_BUILD_RC -ne 0 ]; then
  summary "- lab build FAILED (rc $LAB_BUILD_RC), see build.log:"
  tail -20 "$OUT/build.log" | tee -a "$OUT/summary.md"
  LAB_RC=99
else
  echo "== running lab"
  timeout $(left 60) "$WORK/lab_cuda_gemm_w8a8" "$OUT" "${LAB_ARGS[@]}" 2>&1 | tee "$OUT/lab.log"
  LAB_RC=${PIPESTATUS[0]}
  summary "- lab exit status: $LAB_RC ($( [ $LAB_RC -eq 0 ] && echo 'all checks passed' || echo 'FAILURES or error, see lab.log'))"
  summary "- checks: $(grep -c '^PASS' "$OUT/lab.log") passed, $(grep -c '^FAIL' "$OUT/lab.log") failed"
  grep '^FAIL' "$OUT/lab.log" | head -20 | sed 's/^/  - /' | tee -a "$OUT/summary.md"
  # The EXPERIMENTAL wgmma kernel, in its own process and with its own verdict: a fault there
  # cannot spoil the results above, and its failures do not change this script's exit status.
  echo "== running lab --wgmma (experimental)"
  QUICK=""; for a in "${LAB_ARGS[@]}"; do [ "$a" = --quick ] && QUICK=--quick; done
  timeout $(left 20) "$WORK/lab_cuda_gemm_w8a8" "$OUT" --wgmma $QUICK 2>&1 | tee "$OUT/lab_wgmma.log"
  WG_RC=${PIPESTATUS[0]}
  summary "- EXPERIMENTAL wgmma kernel: exit $WG_RC, checks $(grep -c '^PASS' "$OUT/lab_wgmma.log") passed, $(grep -c '^FAIL' "$OUT/lab_wgmma.log") failed (see lab_cuda_gemm_w8a8_wgmma.md)"
  grep '^FAIL' "$OUT/lab_wgmma.log" | head -5 | sed 's/^/  - /' | tee -a "$OUT/summary.md"
fi

if [ -n "$TEST_BUILD" ]; then
  wait $TEST_BUILD
  TB=$?
  if [ $TB -eq 0 ] && [ $(( $(date +%s) - START )) -gt 420 ]; then
    CTEST_STATUS="built but not run (no time left inside the 8-minute bound)"
  elif [ $TB -eq 0 ]; then
    ( cd "$WORK/build" && timeout $(left 20) ctest -L cuda --output-on-failure ) >> "$OUT/cmake.log" 2>&1
    CT=$?
    CTEST_STATUS="ctest -L cuda exit $CT: $(grep -E 'tests passed|tests failed' "$OUT/cmake.log" | tail -1) (log: cmake.log)"
  else
    CTEST_STATUS="not run (CMake configure/build failed, see cmake.log: $(grep -m1 -iE 'error|could not' "$OUT/cmake.log" | cut -c1-160))"
  fi
fi
summary "- gtest: $CTEST_STATUS"
if [ -f "$OUT/lab_cuda_gemm_w8a8.md" ]; then
  summary ""
  sed -n '/^| M /,/^$/p' "$OUT/lab_cuda_gemm_w8a8.md" >> "$OUT/summary.md"
fi
summary "- total: $(( $(date +%s) - START )) s"
echo "== summary ($OUT/summary.md)"
cat "$OUT/summary.md"
[ "${LAB_RC:-1}" -eq 0 ]
