#!/usr/bin/env bash
# Provide llama.cpp's llama-bench and llama-quantize, built from the git bundle shipped in the npm
# package node-llama-cpp (tests/oracle/node_modules), OUTSIDE the repo. Two ways:
#   prebuilt (default): compile only the two tools (4 source files) from the bundle's source against
#     the release libraries node-llama-cpp ships for the same llama.cpp release (libllama,
#     libllama-common, libggml, libggml-base + the per-CPU libggml-cpu-<arch>.so variants that ggml
#     picks at run time: zen4 on the dev box). ~3 minutes on the shared 2-core machine.
#   native: the full CMake build, CPU only, Release, GGML_NATIVE=ON (-march=native), LLAMA_CURL=OFF,
#     -j1 as the machine rules require: ~140 heavy translation units, well over an hour here.
#   usage: build_llama_cpp.sh LLAMA_DIR [prebuilt|native]     -> LLAMA_DIR/bin-<mode>/llama-bench ...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=$1 mode=${2:-prebuilt}
nlc=$root/tests/oracle/node_modules/node-llama-cpp/llama
libs=$root/tests/oracle/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
src=$dir/src
mkdir -p "$dir"
if [[ ! -d $src/.git ]]; then git clone -q "$nlc/gitRelease.bundle" "$src"; fi
out=$dir/bin-$mode
mkdir -p "$out"
if [[ $mode == prebuilt ]]; then
  [[ -f $libs/libllama.v0.5.0.so ]] || { echo "no prebuilt llama.cpp libraries in $libs" >&2; exit 1; }
  for f in "$libs"/*.so; do ln -sf "$f" "$out/"; done
  inc=(-I"$src/include" -I"$src/ggml/include" -I"$src/common" -I"$src/vendor")
  link=(-L"$out" -l:libllama.v0.5.0.so -l:libllama-common.so -l:libggml.v0.5.0.so -l:libggml-base.so
        -Wl,-rpath,'$ORIGIN' -lpthread)
  for t in llama-bench:tools/llama-bench/llama-bench.cpp llama-quantize:tools/quantize/quantize.cpp; do
    name=${t%%:*} file=${t#*:}
    [[ -x $out/$name ]] && continue
    nice g++ -O2 -DNDEBUG -std=c++17 "${inc[@]}" -I"$src/$(dirname "$file")" "$src/$file" \
      "$src/$(dirname "$file")/main.cpp" -o "$out/$name" "${link[@]}"
  done
else
  build=$dir/build-native
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  nice cmake --build "$build" -j1 --target llama-bench llama-quantize
  for f in "$build"/bin/*; do ln -sf "$f" "$out/"; done
fi
ls "$out/llama-bench" "$out/llama-quantize" >/dev/null
