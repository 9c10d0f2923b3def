#!/usr/bin/env bash
# perry vs llama.cpp on the SAME synthetic Llama-3.2-1B weights, CPU, 2 threads, alternating.
#   tools/peers/run_peers.sh            (env: LLAMA_DIR=/tmp/llama.cpp  LLAMA_BUILD=prebuilt|native
#                                        PERRY_BUILD=build-lead  ROUNDS=2  REPS=3  THREADS=2)
# 1. llama.cpp tools from the bundle in node-llama-cpp (tools/peers/build_llama_cpp.sh), outside the repo
# 2. the BF16 GGUF written by tools/peers/synthetic_to_gguf.py, then Q8_0 / Q4_0 by llama-quantize
# 3. equivalence: GGUF tensors read back == numpy generator == perry's SyntheticWeights (synthetic_dump)
# 4. read-bandwidth probe (bench/lab_float_linear --only bw) for the decode memory bound
# 5. ROUNDS x [llama-bench BF16,Q8_0,Q4_0 ; perry bench bf16,w8a8,w4a8-g128], medians over rounds
# 6. docs/perf/peers-llama.cpp-cpu.md
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
LLAMA_DIR=${LLAMA_DIR:-/tmp/llama.cpp}
LLAMA_BUILD=${LLAMA_BUILD:-prebuilt}
PERRY_BUILD=${PERRY_BUILD:-$root/build-lead}
ROUNDS=${ROUNDS:-2} REPS=${REPS:-3} THREADS=${THREADS:-2}
PY=/usr/bin/python3  # Debian python3-numpy
perry=$PERRY_BUILD/perry
bin=$LLAMA_DIR/bin-$LLAMA_BUILD
g=$LLAMA_DIR/gguf
res=${RESULTS:-$LLAMA_DIR/results/$(date +%Y%m%d-%H%M%S)}  # RESULTS=dir REPORT_ONLY=1: redo the report
mkdir -p "$g" "$res"
log() { echo "[run_peers $(date +%T)] $*" >&2; }

load() { echo "$(date +%T) $1: loadavg $(cut -d' ' -f1-3 /proc/loadavg)" >> "$res/loadavg.txt"; }
report() {
  log "report"
  $PY "$here/report.py" --res "$res" --root "$root" --llama-src "$LLAMA_DIR/src" --llama-build "$LLAMA_BUILD" \
    --rounds "$ROUNDS" --reps "$REPS" --threads "$THREADS" --perry "$perry" \
    --out "$root/docs/perf/peers-llama.cpp-cpu.md"
  log "wrote docs/perf/peers-llama.cpp-cpu.md (raw results in $res)"
}
if [[ -n ${REPORT_ONLY:-} ]]; then report; exit 0; fi
[[ -x $perry ]] || { echo "no perry binary at $perry (set PERRY_BUILD)" >&2; exit 1; }
log "llama.cpp tools ($LLAMA_BUILD)"
"$here/build_llama_cpp.sh" "$LLAMA_DIR" "$LLAMA_BUILD"

dump=$LLAMA_DIR/synthetic_dump
if [[ ! -x $dump ]]; then
  log "building synthetic_dump against $PERRY_BUILD's perry_model"
  nice g++ -std=gnu++20 -O2 -I"$root/src" -I"$root/include" "$here/synthetic_dump.cpp" -o "$dump" \
    "$PERRY_BUILD/libperry_model.a" "$PERRY_BUILD/libperry_kernels.a" "$PERRY_BUILD/libperry_core.a" \
    -ldnnl -lopenblas -lfmt -lpthread
fi

base=$g/perry-synth-llama3.2-1b
if [[ ! -s $base-bf16.gguf ]]; then
  log "writing $base-bf16.gguf"
  nice $PY "$here/synthetic_to_gguf.py" --llama-src "$LLAMA_DIR/src" --out "$base-bf16.gguf.tmp"
  mv "$base-bf16.gguf.tmp" "$base-bf16.gguf"
fi
for q in Q8_0 Q4_0; do
  if [[ ! -s $base-${q,,}.gguf ]]; then
    log "llama-quantize $q"
    nice "$bin/llama-quantize" "$base-bf16.gguf" "$base-${q,,}.gguf" "$q" "$THREADS" > "$res/quantize-$q.log" 2>&1
  fi
done
log "equivalence checks"
$PY "$here/synthetic_to_gguf.py" --llama-src "$LLAMA_DIR/src" --check "$base-bf16.gguf" --perry-dump "$dump" \
  | tee "$res/check-bf16.txt"
for q in q8_0 q4_0; do
  $PY "$here/synthetic_to_gguf.py" --llama-src "$LLAMA_DIR/src" --check "$base-$q.gguf" | tee "$res/check-$q.txt"
done

lab=""
for b in "$PERRY_BUILD" "$root"/build-*; do [[ -x $b/bench/lab_float_linear ]] && { lab=$b/bench/lab_float_linear; break; }; done
if [[ -n $lab ]]; then
  log "bandwidth probe ($lab --only bw)"
  "$lab" --only bw > "$res/bandwidth.txt" 2>&1 || true
fi

for r in $(seq 1 "$ROUNDS"); do
  log "round $r/$ROUNDS: llama-bench"; load "round $r llama-bench"
  "$bin/llama-bench" -m "$base-bf16.gguf" -m "$base-q8_0.gguf" -m "$base-q4_0.gguf" \
    -p 512 -n 128 -t "$THREADS" -r "$REPS" -o json > "$res/llama-$r.json" 2> "$res/llama-$r.err"
  log "round $r/$ROUNDS: perry bench"; load "round $r perry bench"
  "$perry" bench --synthetic llama3.2-1b --modes bf16 w8a8 w4a8-g128 -p 512 -n 128 -r "$REPS" -t "$THREADS" \
    -o "$res/perry-$r" > "$res/perry-$r.txt" 2>&1
done

load "end"
report
