#!/usr/bin/env bash
# Entry point on the GPU machine: trains perry's tokenizer and models and writes transformers
# goldens. Needs corpus/train.txt (tools/corpus/fetch_corpus.sh, carried along: it is gitignored)
# and tests/data/heldout.txt.
#
#   tools/gpu/make_models.sh OUT_DIR [--smoke] [--bundle DIR] [other make_models.py options]
#
# OUT_DIR gets models/, golden/, train_log/, tokenizer/, summary.md, make_models.log.
# --bundle DIR also packs OUT_DIR into <= 8 files (bundle.tgz.partNN + summary/log/status) for
# the device tool's return channel; unpack with tools/gpu/bundle.py unpack.
# --smoke: 1.5 MB of corpus, seconds of training, the whole pipeline (about a minute).
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [--smoke] [--bundle DIR] [--deadline-s S] [--compile]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$1"; shift
mkdir -p "$out"
if [ ! -s "$repo/corpus/train.txt" ]; then
  echo "make_models: $repo/corpus/train.txt missing: run tools/corpus/fetch_corpus.sh and carry corpus/" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export HF_HUB_DISABLE_TELEMETRY=1 TRANSFORMERS_VERBOSITY=error
# Hard stop a little before the device tool's 10-minute limit; the script keeps its own
# deadline (--deadline-s, 500 s by default) well inside this.
timeout --signal=TERM --kill-after=10 570 python3 "$here/make_models.py" "$out" "$@"
rc=$?
echo "make_models: exit $rc"
exit $rc
