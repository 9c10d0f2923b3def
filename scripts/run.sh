#!/usr/bin/env bash
# Builds perry and runs it on the embedded default model (the README's first command).
#   bash scripts/run.sh [perry run flags...]     e.g. bash scripts/run.sh -p "Call me Ishmael" -n 64
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target perry_cli
if [ "$#" -eq 0 ]; then set -- -p "Call me Ishmael. Some years ago" -n 64; fi
exec ./build/perry run "$@"
