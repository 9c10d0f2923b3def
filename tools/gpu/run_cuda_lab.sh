#!/usr/bin/env bash
# Builds and runs the CUDA W8A8 kernel lab (and, when the full CMake build is possible, the
# gtest `ctest -L cuda`) on the GPU machine. Finishes within 8 minutes (every step has a timeout).
#
#   tools/gpu/run_cuda_lab.sh OUT [--quick]
#
# OUT receives: lab_cuda_gemm_w8a8.{json,md} (timings + every check line), lab.log, build.log,
# ctest.log (if run), summary.md. Exit status: 0 when every check passed, 1 otherwise.
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
    src/kernels/cuda/quantize_per_token.cu -lcublas -lcublasLt ) > "$OUT/build.log" 2>&1 &
LAB_BUILD=$!

# 2. In parallel, the gtest through CMake when cmake and the project's dependencies are present.
CTEST_STATUS="not run (cmake missing)"
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
  timeout 240 "$WORK/lab_cuda_gemm_w8a8" "$OUT" "${LAB_ARGS[@]}" 2>&1 | tee "$OUT/lab.log"
  LAB_RC=${PIPESTATUS[0]}
  summary "- lab exit status: $LAB_RC ($( [ $LAB_RC -eq 0 ] && echo 'all checks passed' || echo 'FAILURES or error, see lab.log'))"
  summary "- checks: $(grep -c '^PASS' "$OUT/lab.log") passed, $(grep -c '^FAIL' "$OUT/lab.log") failed"
  grep '^FAIL' "$OUT/lab.log" | head -20 | sed 's/^/  - /' | tee -a "$OUT/summary.md"
fi

if [ -n "$TEST_BUILD" ]; then
  wait $TEST_BUILD
  TB=$?
  if [ $TB -eq 0 ] && [ $(( $(date +%s) - START )) -gt 400 ]; then
    CTEST_STATUS="built but not run (no time left inside the 8-minute bound)"
  elif [ $TB -eq 0 ]; then
    ( cd "$WORK/build" && timeout 60 ctest -L cuda --output-on-failure ) > "$OUT/ctest.log" 2>&1
    CT=$?
    CTEST_STATUS="ctest -L cuda exit $CT: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
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
