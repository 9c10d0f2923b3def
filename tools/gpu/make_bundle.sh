#!/usr/bin/env bash
# Builds perry with the CUDA backend and its CUDA test programs HERE (where the Debian libraries
# are), and packs them, with the shared libraries the GPU machine lacks, into
# gpu-bundle/perry-gpu.txz (ignored by git). The device tool then carries gpu-bundle/ and
# tools/gpu/run_cuda_backend.sh unpacks it there: the GPU machine has the CUDA toolkit but not
# pcre2/utf8proc/fmt/oneDNN/OpenBLAS/httplib, so building there would mean re-creating them.
#
#   tools/gpu/make_bundle.sh            (BUILD=build-gpu, JOBS=2 by default)
# ALT_REV=rev also packs rev's perry as bin/perry-alt (run_cuda_backend.sh's decode variant `alt`), so
# that one GPU call can A/B two commits: the source files that differ are swapped in, perry is
# rebuilt incrementally, and the files are swapped back before the bundle's own build.
# LINEINFO=1 compiles the kernels with -lineinfo (the same code, plus the line table), so that
# Nsight Compute's source counters (tools/gpu/lab_prologue.sh) can name the CUDA line of each SASS
# instruction; switching it on or off rebuilds every CUDA file.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
B=${BUILD:-$ROOT/build-gpu}
cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPERRY_CUDA=ON -DPERRY_CUDA_ARCHITECTURES=90a \
  -DCMAKE_CUDA_FLAGS="${LINEINFO:+-lineinfo}" >/dev/null
TESTS=$(cd "$ROOT/tests/cuda" && ls test_cuda_*.cpp | sed 's/\.cpp$//')
STAGE=$(mktemp -d)
mkdir -p "$STAGE/bin" "$STAGE/lib"
# build_alt REV NAME: REV's perry as bin/NAME (the files that differ swapped in and back).
build_alt() {
  local rev=$1 name=$2 SAVED CHANGED
  SAVED=$(mktemp -d)
  # (--no-renames: a renamed file is its old path and its new path, both swapped.)
  CHANGED=$(git -C "$ROOT" diff --no-renames --name-only "$rev" -- src include CMakeLists.txt)
  for f in $CHANGED; do mkdir -p "$SAVED/$(dirname "$f")"; [ -e "$ROOT/$f" ] && cp -p "$ROOT/$f" "$SAVED/$f"; done
  restore() { for f in $CHANGED; do if [ -e "$SAVED/$f" ]; then cp "$SAVED/$f" "$ROOT/$f"; touch "$ROOT/$f"; else rm -f "$ROOT/$f"; fi; done; }
  trap restore EXIT  # (set before the swap: a failure half-way still puts every file back)
  for f in $CHANGED; do
    if git -C "$ROOT" cat-file -e "$rev:$f" 2>/dev/null; then
      mkdir -p "$ROOT/$(dirname "$f")"
      git -C "$ROOT" show "$rev:$f" > "$ROOT/$f"
    else
      rm -f "$ROOT/$f"
    fi
  done
  ninja -C "$B" -j"${JOBS:-2}" perry_cli
  cp "$B/perry" "$STAGE/bin/$name"
  restore
  trap - EXIT
  echo "$name: $(git -C "$ROOT" rev-parse --short "$rev")" >> "$STAGE/ALT_COMMIT"
}
# ALT2_REV=rev: a third perry, bin/perry-alt2 (decode variant `alt2`, gemmvar names alt2*).
if [ -n "${ALT_REV:-}" ]; then build_alt "$ALT_REV" perry-alt; fi
if [ -n "${ALT2_REV:-}" ]; then build_alt "$ALT2_REV" perry-alt2; fi
# ONLY (below) also limits what is built: a fresh build directory then compiles just those programs.
TARGETS="perry_cli lab_cuda_gemm_w8a8 lab_cuda_weight_stream $TESTS"
[ -n "${ONLY:-}" ] && TARGETS=$(for t in $ONLY; do [ "$t" = perry ] && echo perry_cli || echo "$t"; done)
ninja -C "$B" -j"${JOBS:-2}" $TARGETS
cp "$B/perry" "$STAGE/bin/"
for l in lab_cuda_gemm_w8a8 lab_cuda_weight_stream; do
  cp "$B/src/kernels/cuda/$l" "$STAGE/bin/" 2>/dev/null || find "$B" -name $l -type f -exec cp {} "$STAGE/bin/" \;
done
for t in $TESTS; do find "$B" -name "$t" -type f -perm -u+x -exec cp {} "$STAGE/bin/" \;; done
# ONLY="perry test_cuda_model ...": pack just these programs (perry-alt, perry-alt2 kept with perry) — a
# smaller bundle, so the tree with the models stays under the device tool's 64 MiB.
if [ -n "${ONLY:-}" ]; then
  for f in "$STAGE"/bin/*; do
    b=$(basename "$f"); case $b in perry-alt*) b=perry ;; esac
    case " $ONLY " in *" $b "*) ;; *) rm -f "$f" ;; esac
  done
fi
# Every shared library the programs load, except the C runtime, the C++ runtime (newer on the GPU
# machine) and CUDA's own (the GPU machine's toolkit matches its driver).
for f in "$STAGE"/bin/*; do ldd "$f"; done | awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt)\.so' |
  while read -r lib; do cp -L "$lib" "$STAGE/lib/"; done
{ git -C "$ROOT" rev-parse --short HEAD; git -C "$ROOT" diff --quiet HEAD -- src tests || echo "(+ uncommitted changes)"
  cat "$STAGE/ALT_COMMIT" 2>/dev/null || true; } > "$STAGE/COMMIT"
strip "$STAGE"/bin/* 2>/dev/null || true
# xz: the device tool carries at most 64 MiB with the tree and the embedded model (~18 MB vs 37 gzip).
mkdir -p "$ROOT/gpu-bundle"
rm -f "$ROOT"/gpu-bundle/perry-gpu.*
tar cf - -C "$STAGE" . | xz -9 -T"${JOBS:-2}" > "$ROOT/gpu-bundle/perry-gpu.txz"
rm -rf "$STAGE"
ls -la "$ROOT/gpu-bundle/perry-gpu.txz"
