#!/usr/bin/env bash
# SASS instructions per kernel of one CUDA file, read from the sizes of the cubin's .text sections
# (16 bytes an instruction on sm_90), for the working tree and optionally a git revision beside it.
# No GPU and no disassembler needed (this machine's CUDA has neither cuobjdump nor nvdisasm), so a
# change in a hot loop's instruction count shows before any device time is spent — the
# thirty-third session found that ptxas splits `(w & m) ^ x` into two LOP3s this way and confirmed
# the fix (docs/design-notes.md, "Two constants, two instructions").
#   tools/cuda_text_sizes.sh src/kernels/cuda/gemv_decode.cu [REV] [REGEX]
# REGEX keeps the kernels whose mangled name matches (default: all). With REV, prints the kernels
# whose count differs: name, REV's count, the tree's count, the difference; then those found on
# one side only (a changed template signature renames every instance).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FILE=${1:?usage: cuda_text_sizes.sh FILE.cu [REV] [REGEX]}
REV=${2:-}
RE=${3:-.}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
sizes() {  # $1: source root, $2: output
  "$NVCC" -I"$1/src" -O3 -DNDEBUG -std=c++17 --generate-code=arch=compute_90a,code=sm_90a -cubin -x cu \
    "$1/$FILE" -o "$TMP/k.cubin"
  readelf -SW "$TMP/k.cubin" 2>/dev/null | python3 -c '
import re, sys
for line in sys.stdin:
    m = re.search(r"\.text\.(\S+)\s+PROGBITS\s+\S+\s+\S+\s+([0-9a-f]+)", line)
    if m and re.search(sys.argv[1], m.group(1)):
        # The anonymous namespace is mangled with a hash of the file path: drop it, so that two
        # source roots name a kernel alike.
        name = re.sub(r"\d+_GLOBAL__N__\w*?_[0-9a-f]{8}(?=\d)", "(anon)", m.group(1))
        print(name, int(m.group(2), 16) // 16)
' "$RE" | sort > "$2"
}
sizes "$ROOT" "$TMP/tree.txt"
if [ -z "$REV" ]; then
  cat "$TMP/tree.txt"
  exit 0
fi
mkdir -p "$TMP/rev"
git -C "$ROOT" archive "$REV" src | tar -x -C "$TMP/rev"
sizes "$TMP/rev" "$TMP/rev.txt"
join "$TMP/rev.txt" "$TMP/tree.txt" | awk '$2 != $3 { printf "%s %d %d %+d\n", $1, $2, $3, $3 - $2 }'
# Kernels on one side only (a template argument added or removed renames every instance): listed
# with "-" for the missing count, so a change of signature does not print nothing.
join -v 1 "$TMP/rev.txt" "$TMP/tree.txt" | awk '{ printf "%s %d - (only in REV)\n", $1, $2 }'
join -v 2 "$TMP/rev.txt" "$TMP/tree.txt" | awk '{ printf "%s - %d (only in the tree)\n", $1, $2 }'
