#!/usr/bin/env bash
# Decode only, alternated: per round llama-bench tg (Q8_0, Q4_0) then `perry bench` decode (w8a8,
# w4a8-g128) of each perry binary given, on the same synthetic Llama-3.2-1B weights as
# run_peers.sh (its GGUFs must exist). Prints one line per tool per round with the load average.
# The VM's bandwidth changes between rounds, so compare within a round.
#   tools/peers/decode_rounds.sh ROUNDS PERRY_BINARY...   (env: LLAMA_DIR=/tmp/llama.cpp LLAMA_BUILD=prebuilt
#                                                          N=64 THREADS=2 LOCK=/tmp/perry-cpu.lock)
set -euo pipefail
rounds=$1; shift
LLAMA_DIR=${LLAMA_DIR:-/tmp/llama.cpp} LLAMA_BUILD=${LLAMA_BUILD:-prebuilt}
N=${N:-64} THREADS=${THREADS:-2} LOCK=${LOCK:-/tmp/perry-cpu.lock}
g=$LLAMA_DIR/gguf/perry-synth-llama3.2-1b
load() { cut -d' ' -f1-3 /proc/loadavg; }
for r in $(seq 1 "$rounds"); do
  la=$(load)
  tg=$(flock "$LOCK" "$LLAMA_DIR/bin-$LLAMA_BUILD/llama-bench" -m "$g-q8_0.gguf" -m "$g-q4_0.gguf" -p 0 -n "$N" \
         -t "$THREADS" -r 3 -o csv 2>/dev/null | awk -F, 'NR > 1 { gsub(/"/, "", $(NF-1)); printf "%s ", $(NF-1) }')
  echo "round $r llama.cpp load[$la] Q8_0,Q4_0 tg$N = $tg"
  for b in "$@"; do
    la=$(load)
    out=$(flock "$LOCK" "$b" bench --synthetic llama3.2-1b --modes w8a8 w4a8-g128 -p 16 -n "$N" -r 3 -t "$THREADS" \
            2>/dev/null | awk '/decode/ { printf "%s=%s ", $1, $5 }')
    echo "round $r $b load[$la] $out"
  done
done
