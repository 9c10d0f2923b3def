#!/usr/bin/env bash
# Builds perry and runs the test suite (the README's test command; CI runs it too).
#   bash scripts/test.sh            # release build in build/, all CPU tests
#   PERRY_BUILD_DIR=build-x ...     # another build directory
# GPU tests carry the label "cuda" and are excluded here (no GPU on CI); they run on the GPU
# machine through tools/gpu (results recorded in docs/perf/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD="${PERRY_BUILD_DIR:-build}"
JOBS="${PERRY_JOBS:-$(nproc)}"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${PERRY_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$JOBS"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" -LE cuda ${PERRY_CTEST_ARGS:-}
