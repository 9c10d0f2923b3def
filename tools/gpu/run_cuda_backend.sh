#!/usr/bin/env bash
# The GPU machine's whole job in one call (the device tool gives ~30 min a session): unpack the
# bundle built here by tools/gpu/make_bundle.sh, run every CUDA test program, perry info/run on
# the GPU, and the end-to-end benchmarks. Everything lands in OUT (at most 8 files come back):
#   summary.md  tests.log  perry.log  bench-*.md/json  bench-op-cuda.md/json  peers-transformers.md
#
#   tools/gpu/run_cuda_backend.sh OUT [tests|quick|full|ops|peers] [bench args...]
#     tests: tests + info/run only; quick (default): + bench llama3-8b bf16/w8a8/w4a8-g128;
#     full: + bench llama3-8b and qwen3-8b in every mode issue 5 names, + the ops benchmark;
#     ops: only `perry bench-op --device cuda` (every perry CUDA mode vs cuBLAS / cuBLASLt at the
#       Llama-3-8B and 4B-class linear shapes): summary.md, bench-op-cuda.md, bench-op-cuda.json.
#     peers: no tests; bench llama3-8b bf16/w8a8/w4a8-g128, then Hugging Face transformers bf16
#       (sdpa) on the same weights (`perry export` to /tmp, tools/gpu/peer_transformers.py, export
#       deleted): summary.md, bench-llama3-8b.md/json, peers-transformers.md. In `full` the peer's
#       table goes into summary.md only (the 8-file limit).
#     timeline: the decode step block by block (timeline() below): summary.md, timeline-MODE.md.
set -uo pipefail
OUT=${1:?usage: run_cuda_backend.sh OUT [tests|quick|full|ops|peers]}
LEVEL=${2:-quick}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
T=/tmp/perry-gpu
rm -rf "$T" && mkdir -p "$T"
B="$ROOT/gpu-bundle/perry-gpu.txz"
[ -f "$B" ] || { echo "no bundle: run tools/gpu/make_bundle.sh first"; exit 2; }
if command -v xz >/dev/null; then tar xJf "$B" -C "$T"; else python3 -c "import tarfile,sys; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2])" "$B" "$T"; fi || exit 2
CUDA_LIB=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/lib64
export LD_LIBRARY_PATH="$T/lib:$CUDA_LIB:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PERRY_SOURCE_DIR="$ROOT"
START=$(date +%s)
S="$OUT/summary.md"
say() { echo "$*" | tee -a "$S"; }
: > "$S"
say "# perry CUDA run $(date -u +%FT%TZ)"
say ""
say "- bundle commit: $(cat "$T/COMMIT" | tr '\n' ' ')"
say "- gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1)"
# (A model left behind by the device transfer may leave its folder empty: count only checkpoints.)
say "- models present: $(for d in "$ROOT"/models/*/; do [ -f "$d/config.json" ] && basename "$d"; done | tr '\n' ' ')"
missing=$(ldd "$T/bin/perry" | grep "not found" || true)
[ -n "$missing" ] && say "- MISSING LIBRARIES: $missing"

P="$T/bin/perry"
# `final` (one call of < 10 min): the tests without the timing prints, no perry.log.
[ "$LEVEL" = final ] && TEST_FILTER='-*Timing*:*Perf*'
# `decode`: the decode-path tests only (TESTS_ONLY names the programs), then decode A/B below.
[ "$LEVEL" = decode ] && TESTS_ONLY=${TESTS_ONLY:-"test_cuda_gemv_decode test_cuda_attention test_cuda_model"}
# `prefill`: the prefill-path tests, then prefill A/B below (and decode pairs if DECODE_PAIRS is set).
[ "$LEVEL" = prefill ] && TESTS_ONLY=${TESTS_ONLY:-"test_cuda_attention test_cuda_elementwise test_cuda_model"}
# `measure`: the tests TESTS_ONLY names, then bench llama3-8b in MEASURE_MODES (prompts BENCH_PROMPTS).
# `testsonly`: the test programs (TESTS_ONLY, or all) and nothing else.
[ "$LEVEL" = measure ] && TESTS_ONLY=${TESTS_ONLY:-"test_cuda_model"}
# `timeline`: the tests TESTS_ONLY names (default: none), then the decode timeline below.
[ "$LEVEL" = timeline ] && TESTS_ONLY=${TESTS_ONLY:-none}
if [ "$LEVEL" != ops ] && [ "$LEVEL" != peers ] && [ "$LEVEL" != run3 ]; then  # (steps 1 and 2; `ops`, `peers`, `run3` skip them)
# 1. Tests: every CUDA test program, each bounded.
: > "$OUT/tests.log"
say ""
say "## tests"
for t in "$T"/bin/test_cuda_*; do
  name=$(basename "$t")
  [ -n "${TESTS_ONLY:-}" ] && ! echo " $TESTS_ONLY " | grep -q " $name " && continue
  timeout ${TEST_TIMEOUT:-300} "$t" --gtest_color=no ${TEST_FILTER:+--gtest_filter=$TEST_FILTER} > "$T/$name.log" 2>&1
  rc=$?
  echo $rc > "$T/rc-$name"  # a later step skips what a hung or crashed program would hang again
  cat "$T/$name.log" >> "$OUT/tests.log"
  say "- $name: exit $rc, $(grep -c '^\[       OK \]' "$T/$name.log") passed, $(grep -cE '^\[  FAILED  \].*ms\)' "$T/$name.log") failed, $(grep -cE '^\[  SKIPPED \].*ms\)' "$T/$name.log") skipped"
done
grep -E '^\[  FAILED  \].*ms\)' "$OUT/tests.log" | head -30 | sed 's/^/  - /' | tee -a "$S"
grep -E '^\[cuda-vs-cpu\]|TFLOP|GB/s' "$OUT/tests.log" | head -90 | sed "s/^/    /" | tee -a "$S"

# 2. perry itself on the GPU: info, a short generation with the embedded model.
[ "$LEVEL" != final ] && [ "$LEVEL" != decode ] && [ "$LEVEL" != prefill ] && [ "$LEVEL" != measure ] &&
  [ "$LEVEL" != testsonly ] && [ "$LEVEL" != gemmvar ] && [ "$LEVEL" != timeline ] && {
  echo "== perry info --device cuda"; timeout 60 "$P" info --device cuda
  echo "== perry info --device cuda --quant w8a8"; timeout 60 "$P" info --device cuda --quant w8a8
  echo "== perry run --device cuda"; timeout 60 "$P" run --device cuda -n 48 -p "The ship sailed"
  echo "== perry run --device cuda --quant w4a8-g128"; timeout 60 "$P" run --device cuda --quant w4a8-g128 -n 48 -p "The ship sailed"
  echo "== perry ppl per mode (cpu vs cuda)"
  for m in bf16 w8a8 w4a8-g128; do
    for d in cpu cuda; do timeout 120 "$P" ppl --device $d --quant $m --ctx 512 -f "$ROOT/tests/data/heldout.txt" 2>&1 | tail -1 | sed "s/^/$m $d: /"; done
  done
  echo "== errors: --device cuda:7"; timeout 30 "$P" run --device cuda:7 -n 4 -p x; echo "exit $?"
} > "$OUT/perry.log" 2>&1
[ -f "$OUT/perry.log" ] && say "" && say "## perry on the GPU (perry.log)" && grep -E "^\[perry\]|ppl|exit|runs on|CUDA:" "$OUT/perry.log" | head -20 | sed 's/^/    /' | tee -a "$S"
fi

# Whether test program $1 ran into its timeout above (a later step that would hang the same way is skipped).
hung() { [ "$(cat "$T/rc-$1" 2>/dev/null || echo 0)" = 124 ]; }

# 3. Benchmarks.
bench() {  # name preset modes...
  local name=$1 preset=$2
  shift 2
  timeout ${BENCH_TIMEOUT:-420} "$P" bench --device cuda --synthetic "$preset" --modes "$@" -p ${BENCH_PROMPTS:-512 2048 8192} \
    -b 1 16 -n ${BENCH_NEW:-32} -r 3 \
    -o "$OUT/bench-$name" > "$OUT/bench-$name.log" 2>&1
  say ""
  say "## bench $name (exit $?)"
  cat "$OUT/bench-$name.md" 2>/dev/null | tail -n +4 >> "$S" || tail -5 "$OUT/bench-$name.log" | tee -a "$S"
  rm -f "$OUT/bench-$name.log"
}
# The operator benchmark: exit 0 all checks passed, 1 some row failed its output check, 2 aborted
# (results so far written), 3 a kernel hung. An abort or crash is retried once without the
# experimental wgmma kernel, the likeliest cause. Its markdown also goes into summary.md; in
# `full` only the .json stays as a file (the 8-file limit).
bench_op() {
  local O="$OUT/bench-op-cuda" rc
  timeout 300 "$P" bench-op --device cuda ${QUICK_OPS:-} -o "$O" > "$T/bench-op.log" 2>&1
  rc=$?
  if [ $rc -ge 2 ] && [ $rc -ne 124 ]; then
    say ""
    say "## bench-op --device cuda FAILED (exit $rc); retrying with --no-wgmma"
    tail -5 "$T/bench-op.log" | sed 's/^/    /' | tee -a "$S"
    timeout 240 "$P" bench-op --device cuda --no-wgmma -o "$O" > "$T/bench-op.log" 2>&1
    rc=$?
  fi
  say ""
  say "## bench-op --device cuda (exit $rc)"
  if [ -f "$O.md" ]; then tail -n +3 "$O.md" >> "$S"; else tail -20 "$T/bench-op.log" | tee -a "$S"; fi
  [ "$LEVEL" = full ] && rm -f "$O.md"
}
# The peer on the same weights: perry's synthetic preset written as a Hugging Face checkpoint
# (16 GB for llama3-8b, in /tmp; the disk is 64 GB), transformers bf16 + SDPA measured the way
# perry bench measures, then the checkpoint deleted. perry's greedy ids for `perry run --synthetic`'s
# prompt go along: both engines run the same weights, so the report says how far they agree.
peer_transformers() {  # preset
  local preset=$1 X="$T/hf-$1" L="$T/peers-transformers.log" R="$T/peers-transformers" rc ids free
  say ""
  say "## peer: transformers bf16 (sdpa) on synthetic $preset, the same weights"
  if ! python3 -c "import torch, transformers, safetensors" > "$L" 2>&1; then
    say "- skipped: python3 cannot import torch, transformers, safetensors: $(tail -1 "$L")"
    return
  fi
  free=$(df -Pk /tmp | awk 'NR==2 {print int($4 / 1048576)}')
  if [ "${free:-0}" -lt 24 ]; then
    say "- skipped: only ${free:-?} GiB free in /tmp (the export needs ~16)"
    return
  fi
  rm -rf "$X"
  timeout ${EXPORT_TIMEOUT:-300} "$P" export --synthetic "$preset" -o "$X" >> "$L" 2>&1
  rc=$?
  say "- perry export: exit $rc; $(grep '^exported' "$L" | tail -1)"
  if [ $rc -eq 0 ]; then
    ids=$(timeout 180 "$P" run --device cuda --synthetic "$preset" --prompt-tokens 128 -n 8 2>>"$L" |
          sed -n 's/^generated ids: *//p')
    say "- perry greedy ids (bf16, cuda): ${ids:-none}"
    PYTHONUNBUFFERED=1 timeout ${PEER_TIMEOUT:-360} python3 "$ROOT/tools/gpu/peer_transformers.py" "$X" "$R" \
      --prompts 512 2048 8192 --decode 32 --batch 1 16 --repeats 3 --perry-ids "$ids" >> "$L" 2>&1
    rc=$?
    say "- peer_transformers.py: exit $rc"
  fi
  rm -rf "$X"
  if [ -f "$R.md" ]; then echo >> "$S"; tail -n +3 "$R.md" >> "$S"; else tail -15 "$L" | sed 's/^/    /' | tee -a "$S"; fi
  if [ "$LEVEL" = peers ] || [ "$LEVEL" = run3 ] || [ "$LEVEL" = final ]; then  # the log up to the report it prints at the end
    { cat "$R.md" 2>/dev/null; echo; echo "## log"; echo '```'; sed '/^# transformers bench/,$d' "$L" | tail -60; echo '```'
      echo; echo "## json"; echo '```json'; cat "$R.json" 2>/dev/null; echo '```'; } > "$OUT/peers-transformers.md"
  fi
}
# Decode at batch 1 (and 16), fused path vs the separate kernels vs no programmatic dependent
# launch, same run; then per-kernel times of one fused decode step (Nsight Compute).
decode_ab() {
  local modes=${DECODE_MODES:-"bf16 w8a8 w4a8-g128 w8a16 w4a16 w8a8-g128"}
  # DECODE_PRESET: the synthetic model of the pairs (default llama3-8b; e.g. qwen2.5-1.5b, whose
  # down_proj has G 70 at g128).
  local preset=${DECODE_PRESET:-llama3-8b}
  say ""
  say "## decode A/B ($preset, 128-token prompt, 64 new tokens, CUDA graphs)"
  # DECODE_PAIRS="mode:variant ..." replaces the modes x variants product; DECODE_BATCHES="1" measures
  # the llama3-8b rows at batch 1 only (~27 s a row instead of ~40; the qwen3-8b rows keep 1 16). The weight-free floor split in one call (s15):
  #   DECODE_BATCHES=1 DECODE_QWEN_MODES= DECODE_PROFILE=0 TESTS_ONLY=test_cuda_gemv_decode \
  #   DECODE_PAIRS="w4a8-g128:fused w4a8-g128:labskipw w4a8-g128:labnoloop w4a8-g128:labnoloop+labnoattn
  #   w4a8-g128:labnoloop+labnoattn+labskip w8a8:labskipw w8a8:labnoloop" run_cuda_backend.sh OUT decode
  local pairs=${DECODE_PAIRS:-}
  if [ -z "$pairs" ]; then
    for m in $modes; do for v in ${DECODE_VARIANTS:-fused separate nopdl}; do pairs="$pairs $m:$v"; done; done
  fi
  for mv in $pairs; do
    m=${mv%%:*} v=${mv#*:}
    # A variant is fused (as it is) or '+'-joined switches, e.g. stages4+nopdl.
    env=() bin=$P
    for sw in ${v//+/ }; do
      case $sw in
        fused) ;;
        alt) bin="$T/bin/perry-alt"  # another commit's perry (make_bundle.sh ALT_REV=rev): A/B of two commits in one call
          [ -x "$bin" ] || { say "- $mv: no perry-alt in the bundle (ALT_REV)"; continue 2; } ;;
        alt2) bin="$T/bin/perry-alt2"  # a third commit's perry (make_bundle.sh ALT2_REV=rev)
          [ -x "$bin" ] || { say "- $mv: no perry-alt2 in the bundle (ALT2_REV)"; continue 2; } ;;
        separate) [ "$m" = bf16 ] || [ "$m" = w8a8 ] || [ "$m" = w4a8-g128 ] || continue 2; env+=(PERRY_NO_FUSED_DECODE=1) ;;
        nopdl) env+=(PERRY_NO_PDL=1) ;;
        ropeqkv) env+=(PERRY_DECODE_ROPE_IN_QKV=1) ;;  # RoPE + KV append in the q|k|v epilogue (Llama; the default)
        noropeqkv) env+=(PERRY_DECODE_ROPE_IN_QKV=0) ;;  # rope_append_qkv as its own kernel
        stages[0-9]*) env+=("PERRY_GEMV_DECODE_STAGES=${sw#stages}") ;;  # weights by bulk copy, N stages a warp (0: registers)
        nopipe) env+=(PERRY_GEMV_DECODE_PIPE=0) ;;  # per-channel w8a8: register loads without the double buffer
        hostpick) env+=(PERRY_BENCH_HOST_PICK=1) ;;  # bench: logits to the host and argmax there (before forward_greedy)
        stepwise) env+=(PERRY_BENCH_STEPWISE=1) ;;  # bench: forward_greedy step by step, the host between steps (before decode_greedy)
        l2next[0-9]*) env+=("PERRY_DECODE_L2_NEXT_MB=${sw#l2next}") ;;  # o_proj prefetches N MB of gate|up into L2 (default 0: off)
        normstages[0-9]*) env+=("PERRY_GEMV_DECODE_NORM_STAGES=${sw#normstages}") ;;  # the RMSNorm-input linears' stages alone
        labskip) env+=(PERRY_LAB_DECODE_INPUT=skip) ;;  # lab (wrong outputs): the GEMVs without building their input row
        labread) env+=(PERRY_LAB_DECODE_INPUT=read) ;;  # lab (wrong outputs): ... reading x but not building the row
        labskipw) env+=(PERRY_LAB_DECODE_WEIGHTS=skip) ;;  # lab (wrong outputs): no weight reads (the step's floor)
        labnoloop) env+=(PERRY_LAB_DECODE_WEIGHTS=noloop) ;;  # lab (wrong outputs): no weight reads, no GEMV loops
        labnoattn) env+=(PERRY_LAB_DECODE_ATTENTION=skip) ;;  # lab (wrong outputs): no decode attention kernels
        attnchunk[0-9]*) env+=("PERRY_DECODE_ATTN_MIN_CHUNK=${sw#attnchunk}") ;;  # decode attention chunks of n keys (16..64)
        labbound[0-9]*) env+=("PERRY_LAB_DECODE_BOUNDARIES=${sw#labbound}") ;;  # lab: an empty N-block kernel after each step
        gsteps[0-9]*) env+=("PERRY_DECODE_GRAPH_STEPS=${sw#gsteps}") ;;  # decode_greedy's steps a launch (1 = a graph a step)
        smalla8max[0-9]*) env+=("PERRY_SMALL_M_A8_MAX_M=${sw#smalla8max}") ;;  # W*A8 batched rows: gemm_small_m up to N, then the wgmma GEMMs
        gemvonly[0-9]*) env+=("PERRY_GEMV_ONLY_MAX_M=${sw#gemvonly}") ;;  # gemv_quant up to N rows
        smallwg[0-9]*) env+=("PERRY_SMALL_M_WGMMA_MAX_M=${sw#smallwg}") ;;  # W*A8 rows: gemm_small_m_wgmma up to N (0: never)
        smallall) env+=(PERRY_SMALL_M_WGMMA_ALL=1) ;;  # ... also for per-channel w8a8 and (two-level) int4 (lab)
        smallring[0-9]*) env+=("PERRY_SMALL_M_RING_KB=${sw#smallring}") ;;  # gemm_small_m_wgmma: the ring's KiB
        smallctas[0-9]*) env+=("PERRY_SMALL_M_CTAS_PER_SM=${sw#smallctas}") ;;  # gemm_small_m_wgmma: CTAs an SM (branch next/small-m-2cta)
        *) say "- unknown decode variant $v"; continue 2 ;;
      esac
    done
    timeout 150 env "${env[@]}" "$bin" bench --device cuda --synthetic "$preset" --modes "$m" -p 128 -b ${DECODE_BATCHES:-1 16} \
      -n 64 -r 3 -o "$T/dec-$m-$v" > "$T/dec-$m-$v.log" 2>&1
    say "- $m $v (exit $?): $(grep 'decode b=' "$T/dec-$m-$v.md" 2>/dev/null | cut -d'|' -f3,5,6 | tr -s ' ' | tr '\n' ' ')"
  done
  for m in ${DECODE_QWEN_MODES-bf16 w8a8 w4a8-g128}; do
    timeout 150 "$P" bench --device cuda --synthetic qwen3-8b --modes "$m" -p 128 -b 1 16 -n 64 -r 3 -o "$T/decq-$m" \
      > "$T/decq-$m.log" 2>&1
    say "- qwen3-8b $m fused (exit $?): $(grep 'decode b=' "$T/decq-$m.md" 2>/dev/null | cut -d'|' -f3,5,6 | tr -s ' ' | tr '\n' ' ')"
  done
  [ "${DECODE_PROFILE:-1}" = 1 ] && PROFILE_TIMEOUT=120 bash "$ROOT/tools/gpu/profile_decode.sh" "$OUT" ${PROFILE_MODES:-bf16 w4a8-g128} > /dev/null 2>&1 &&
    { say ""; cat "$OUT/profile.md" >> "$S"; rm -f "$OUT"/profile-*.csv; }
}
# Prefill (TTFT) per PREFILL_PAIRS="[preset/]mode:variant ..." (llama3-8b unless a preset is given; variants: base, or
# '+'-joined switches as in decode_ab), with the linears alone timed by the same bench (what
# "time outside the GEMMs" is measured against); then per-kernel times of one 2048-token prefill
# (Nsight Compute) for PROFILE_MODES.
prefill_ab() {
  say ""
  say "## prefill A/B (llama3-8b; prefill ms and the linears alone)"
  for mv in ${PREFILL_PAIRS:-bf16:base w8a8:base}; do
    # [preset/]mode:variant, e.g. qwen3-8b/bf16:base (the preset defaults to llama3-8b).
    m=${mv%%:*} v=${mv#*:} preset=llama3-8b
    [[ $m == */* ]] && preset=${m%%/*} m=${m#*/}
    if [[ $m == *-g* || $m == w4a8* ]] && hung test_cuda_quant_linear; then
      say "- $mv skipped: test_cuda_quant_linear hung (gemm_quant_wgmma)"; continue
    fi
    env=() bin="$P"
    for sw in ${v//+/ }; do
      case $sw in
        base) ;;
        alt) bin="$T/bin/perry-alt" ;;  # the bundle's ALT_REV build (make_bundle.sh): two commits in one call
        separate) env+=(PERRY_PREFILL_SEPARATE=1) ;;  # split_qkv + rope + append + fp32 attention out
        deltaf32) env+=(PERRY_DELTA_F32=1) ;;  # o_proj / down_proj outputs in fp32 (not rounded to bf16)
        gateupf32) env+=(PERRY_GATE_UP_F32=1) ;;  # gate|up in fp32
        qkvf32) env+=(PERRY_QKV_F32=1) ;;  # q|k|v in fp32
        pingoff) env+=(PERRY_WGMMA_PINGPONG=0) ;;  # the w8a8 / fp8 wgmma GEMM: cooperative schedule only
        pingon) env+=(PERRY_WGMMA_PINGPONG=1) ;;  # ... ping-pong schedule at every shape
        noping128) env+=(PERRY_WGMMA_PING128=0) ;;  # ... no ping-pong on 128-row tiles (s37's default before it)
        nowgmma) env+=(PERRY_NO_WGMMA=1) ;;  # no sm_90 int8 wgmma GEMMs (mma.sync at every M)
        nosplitk) env+=(PERRY_WGMMA_SPLITK=0) ;;  # the w8a8 wgmma GEMM never split over K
        splitfixup) env+=(PERRY_WGMMA_SPLITK_FIXUP=1) ;;  # ... its split-K sums added inside the GEMM (the default since s31)
        splitkernel) env+=(PERRY_WGMMA_SPLITK_FIXUP=0) ;;  # ... added by the second kernel (before s31)
        tl256) env+=(PERRY_TWO_LEVEL_BX=256) ;;  # w4a8-g128's register-A kernel: 256-token tiles only (s30's choice at M >= 1024)
        notlsplit) env+=(PERRY_TWO_LEVEL_SPLITK=0) ;;  # ... never split over K (before s39)
        notltail) env+=(PERRY_TWO_LEVEL_SPLIT_TAIL=0) ;;  # ... only short prompts split, not the last partial wave (before s40)
        nogqsplit) env+=(PERRY_GQ_SPLITK=0) ;;  # ... nor the grouped W*A8 one (gemm_quant_wgmma)
        noexpand) env+=(PERRY_NO_INT4_EXPAND=1) ;;  # int4 W*A8: the int4 GEMM at every M (no int8 expansion)
        grouped) env+=(PERRY_NO_INT4_TWO_LEVEL=1) ;;  # w4a8-g128: the grouped kernels, not the two-level per-channel path
        tlfrom[0-9]*) env+=("PERRY_INT4_TWO_LEVEL_MIN_M=${sw#tlfrom}") ;;  # ... the two-level path from N rows (lab)
        tlexpand) env+=(PERRY_INT4_TWO_LEVEL_EXPAND=1) ;;  # ... as the expansion pass + gemm_w8a8_wgmma (not the register-A kernel)
        tlrsall) env+=(PERRY_INT4_TWO_LEVEL_RS_MAX_M=1000000000) ;;  # ... the register-A kernel at every M (no switch to the expansion)
        tlrsmax[0-9]*) env+=("PERRY_INT4_TWO_LEVEL_RS_MAX_M=${sw#tlrsmax}") ;;  # ... the register-A kernel below N rows, the expansion from N
        attn64) env+=(PERRY_PREFILL_ATTN=64) ;;  # prefill attention in 64-row blocks
        attn128) env+=(PERRY_PREFILL_ATTN=128) ;;  # prefill attention in 128-row blocks
        attnwgmma)  # the experimental wgmma attention (hd 128, sm_90): only after its test passed
          grep -q '^\[       OK \] CudaAttention.PrefillWgmma' "$OUT/tests.log" 2>/dev/null ||
            { say "- $mv skipped: CudaAttention.PrefillWgmma did not pass"; continue 2; }
          env+=(PERRY_PREFILL_ATTN=wgmma) ;;
        *) say "- unknown prefill variant $v"; continue 2 ;;
      esac
    done
    [ -x "$bin" ] || { say "- $mv skipped: no $bin"; continue; }
    timeout 200 env "${env[@]}" "$bin" bench --device cuda --synthetic "$preset" --modes "$m" -p ${PREFILL_LENGTHS:-2048 4096 8192} \
      -b 1 -n 2 -r 3 -o "$T/pre-$preset-$m-$v" > "$T/pre-$preset-$m-$v.log" 2>&1
    say "- $preset $m $v (exit $?):"
    grep -E "prefill|linears" "$T/pre-$preset-$m-$v.log" | grep -v "^mode" | sed 's/^/    /' | tee -a "$S"
  done
  [ -n "${DECODE_PAIRS:-}" ] && DECODE_QWEN_MODES="" DECODE_PROFILE=0 decode_ab
  # Nsight Compute sections of one launch of each prefill attention kernel (T=8192, Llama-3-8B
  # heads, from the attention perf test): what limits them (issue slots, pipes, stalls, shared memory).
  if [ "${PREFILL_ATTN_NCU:-0}" = 1 ]; then
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    for k in prefill_tc_kernel prefill_tc2_kernel; do
      timeout 150 "$NCU" --clock-control none --kernel-name "regex:$k" --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
        "$T/bin/test_cuda_attention" --gtest_filter='*PerfLlama8bShapes*' > "$T/ncu-$k.txt" 2>&1
      say "- ncu $k: exit $?"
      cat "$T/ncu-$k.txt" >> "$OUT/attn-ncu.txt"
    done
  fi
  # The grouped / int4 wgmma GEMM (gemm_quant_wgmma): the lab's --wgmma table (kernel TOPS against
  # the per-channel kernel and mma.sync, L2 flushed), then the same sections for one of its
  # launches: skip 4 = the first timed launch of w8a8-g128 at M 4096, N 14336, K 4096 (--quick).
  if [ "${GROUPED_GEMM_LAB:-0}" = 1 ] && hung test_cuda_quant_linear; then
    say "- grouped GEMM lab skipped: test_cuda_quant_linear hung"
  elif [ "${GROUPED_GEMM_LAB:-0}" = 1 ]; then
    timeout 200 "$T/bin/lab_cuda_gemm_w8a8" "$OUT" --wgmma --quick > "$T/lab-wgmma.log" 2>&1
    say "- lab --wgmma --quick: exit $?"
    grep -E "^\| (w8a8-g128|w4a8-g128|w8a8-g64|w4a8) " "$OUT/lab_cuda_gemm_w8a8.md" 2>/dev/null | head -40 | tee -a "$S"
    rm -f "$OUT/lab_cuda_gemm_w8a8.json"
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    timeout 150 "$NCU" --clock-control none --kernel-name "regex:gemm_quant_wgmma|quant_wgmma" --launch-skip ${GROUPED_NCU_SKIP:-4} \
      --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
      "$T/bin/lab_cuda_gemm_w8a8" "$T/labncu" --wgmma --quick --time-only > "$OUT/grouped-ncu.txt" 2>&1
    say "- ncu gemm_quant_wgmma: exit $?"
  fi
  [ "${PREFILL_PROFILE:-1}" = 1 ] && PROFILE_FIRST=1 PROFILE_TIMEOUT=150 PROFILE_TOKENS=${PROFILE_TOKENS:-2048} \
    PROFILE_N=1 bash "$ROOT/tools/gpu/profile_decode.sh" "$OUT" ${PROFILE_MODES:-bf16 w8a8} > "$T/profile.log" 2>&1 &&
    { say ""; cat "$OUT/profile.md" >> "$S"; rm -f "$OUT"/profile-*.csv; }
}
# The block-level timeline of decode steps (PERRY_LAB_DECODE_TIMELINE, kernels/cuda/lab_timeline.h) for
# TIMELINE_MODES (default w4a8-g128), each with TIMELINE_ENV (e.g. PERRY_LAB_DECODE_WEIGHTS=noloop):
# a 128-token prompt and 24 new tokens under CUDA graphs, the first 2000 launches left out;
# OUT/timeline-MODE.md (tools/gpu/timeline_report.py).
timeline() {
  # TIMELINE_PAIRS="mode:variant ..." (variants: fused, alt = perry-alt, gstepsN = N decode steps a launch)
  # instead of TIMELINE_MODES (each mode as it is, with TIMELINE_ENV).
  local pairs=${TIMELINE_PAIRS:-}
  [ -z "$pairs" ] && for m in ${TIMELINE_MODES:-w4a8-g128}; do pairs="$pairs $m:fused"; done
  for mv in $pairs; do
    local m=${mv%%:*} v=${mv#*:} bin=$P tag=${mv%%:*} env=(${TIMELINE_ENV:-})
    case $v in
      fused) ;;
      alt) bin="$T/bin/perry-alt" tag="$m-alt" ;;
      gsteps[0-9]*) env+=(PERRY_DECODE_GRAPH_STEPS=${v#gsteps}) tag="$m-$v" ;;  # decode_greedy's steps a launch
      *) say "- unknown timeline variant $v"; continue ;;
    esac
    timeout 150 env "${env[@]}" PERRY_LAB_DECODE_TIMELINE="$T/tl-$tag.bin" "$bin" run --device cuda --synthetic llama3-8b \
      --quant "$m" --prompt-tokens 128 -n 24 > "$T/tl-$tag.log" 2>&1
    local rc=$?
    say ""; say "## timeline $m $v ${TIMELINE_ENV:-} (exit $rc): $(grep -o 'decode [0-9.]* tok/s' "$T/tl-$tag.log")"
    python3 "$ROOT/tools/gpu/timeline_report.py" "$T/tl-$tag.bin" --skip-launches 2000 > "$OUT/timeline-$tag.md" 2>&1
    grep -E '^\| (gemv|attention)|^Token boundary' "$OUT/timeline-$tag.md" | tee -a "$S"
  done
}
case "$LEVEL" in
  decode) decode_ab ;;
  timeline) timeline ;;
  prefill) prefill_ab ;;
  measure) bench llama3-8b llama3-8b ${MEASURE_MODES:-bf16 w8a8 w4a8-g128} ;;
  quick) bench llama3-8b llama3-8b bf16 w8a8 w4a8-g128 ;;
  full)
    bench llama3-8b llama3-8b bf16 w8a16 w4a16 w8a8 w8a8-g128 w4a8-g128
    bench qwen3-8b qwen3-8b bf16 w8a16 w4a16 w8a8 w8a8-g128 w4a8-g128
    bench_op
    peer_transformers llama3-8b ;;
  ops) bench_op ;;
  # `gemmvar`: bench-op (w8a8 + peers, GEMM_SHAPES x GEMM_MS) once per GEMM_VARIANTS entry
  # "name:VAR=v,VAR=v" (environment of that run, e.g. PERRY_WGMMA_PINGPONG=0); one bench-op-NAME.md
  # each, every mode's rows of all of them in summary.md. A name starting with "alt" runs bin/perry-alt ("alt2": bin/perry-alt2)
  # (the bundle's ALT_REV build): two commits' kernels in one call.
  gemmvar)
    for v in ${GEMM_VARIANTS:-base:}; do
      name=${v%%:*}; envs=${v#*:}
      bin="$P"; [[ $name == alt* ]] && bin="$T/bin/perry-alt"; [[ $name == alt2* ]] && bin="$T/bin/perry-alt2"
      [ -x "$bin" ] || { say "- $name skipped: no $bin (bin/perry-alt comes from make_bundle.sh with ALT_REV)"; continue; }
      # A variant of the wgmma GEMM whose kernel test hung would hang here too.
      hung test_cuda_kernels && [[ $envs == *WGMMA* ]] && { say "- $name skipped: test_cuda_kernels hung"; continue; }
      timeout ${GEMM_TIMEOUT:-150} env ${envs//,/ } "$bin" bench-op --device cuda --modes ${GEMM_MODES:-w8a8} \
        --shapes ${GEMM_SHAPES:-14336x4096 4096x14336 6144x4096 10240x2560 2560x10240} -M ${GEMM_MS:-1024 2048 4096 8192} \
        -r ${GEMM_REPEATS:-10} ${GEMM_OUT_TYPE:+--out-type $GEMM_OUT_TYPE} -o "$OUT/bench-op-$name" > "$T/bench-op-$name.log" 2>&1
      rc=$?
      say ""; say "## bench-op $name ($envs): exit $rc"
      grep '^\[gemm_w8a8_wgmma\]' "$T/bench-op-$name.log" | sort -u | head -16 | sed 's/^/    /' | tee -a "$S"
      # (the main table only: the back-to-back table's rows start alike)
      sed -n '1,/^## Back to back/p' "$OUT/bench-op-$name.md" 2>/dev/null |
        grep -E '^\| [0-9]+ \| [0-9]+ \| [0-9]+ \| (bf16|w8a16|w4a16|w8a8|w8a8-fp8|w8a8-g128|w8a8-g64|w4a8|w4a8-g128|cublas-bf16|cublaslt-i8-i32) \|' |
        awk -F'|' '{printf "    %s %s %s %-16s ms %s gemm %s TOPS %s x %s gemm-x %s %s\n", $2, $3, $4, $5, $6, $7, $9, $12, $13, $15}' | tee -a "$S"
      sed -n '/^## Back to back/,/^## Startup/p' "$OUT/bench-op-$name.md" 2>/dev/null | grep '^| [0-9]' |
        awk -F'|' '{printf "    %s %s M=%s %-16s back to back: ms %s GB/s %s (%s) x %s\n", $2, $3, $4, $5, $6, $7, $8, $9}' | tee -a "$S"
      grep -q 'Check failures: \*\*0\*\*' "$OUT/bench-op-$name.md" 2>/dev/null || { say "- check failures or no output:"; tail -5 "$T/bench-op-$name.log" | sed 's/^/    /' | tee -a "$S"; }
      rm -f "$OUT/bench-op-$name.json"  # (the 8-file limit: the .md has every number)
    done
    # Then end to end, if asked (e.g. PREFILL_PAIRS="w8a8:base w8a8:pingoff").
    [ -n "${PREFILL_PAIRS:-}" ] && PREFILL_PROFILE=0 prefill_ab
    # Then Nsight Compute on one shape (GEMM_NCU_SHAPE, GEMM_NCU_M; GEMM_NCU_SASS=1 adds the stall
    # samples per SASS instruction of the first kernel): perry's w8a8 GEMM next to the
    # cuBLAS / cuBLASLt kernels of the same bench-op round (launch stats say their tiles and grids).
    if [ -n "${GEMM_NCU_SHAPE:-}" ]; then
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      timeout ${GEMM_NCU_TIMEOUT:-200} "$NCU" --clock-control none --kernel-name "regex:${GEMM_NCU_KERNELS:-wgmma_kernel|sm90_xmma|cutlass|gemm}" \
        --launch-skip ${GEMM_NCU_SKIP:-0} --launch-count ${GEMM_NCU_COUNT:-8} --section SpeedOfLight --section LaunchStats \
        --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section SchedulerStats ${GEMM_NCU_EXTRA:-} "$P" bench-op --device cuda --modes ${GEMM_NCU_MODES:-w8a8} --shapes "$GEMM_NCU_SHAPE" -M ${GEMM_NCU_M:-4096} -r 1 \
        > "$OUT/gemm-ncu.txt" 2>&1
      rc=$?
      say ""; say "## ncu $GEMM_NCU_SHAPE M ${GEMM_NCU_M:-4096}: exit $rc (gemm-ncu.txt)"
      grep -E '^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Grid Size|Cluster Size|Registers Per|Dynamic Shared' "$OUT/gemm-ncu.txt" | head -80 | sed 's/^/    /' | tee -a "$S"
      # GEMM_NCU_SASS=1: the stall samples of the first profiled kernel, instruction by instruction
      # (tools/gpu/ncu_sass_stalls.py; the SASS view needs no -lineinfo).
      if [ "${GEMM_NCU_SASS:-0}" = 1 ]; then
        timeout ${GEMM_NCU_TIMEOUT:-200} "$NCU" --clock-control none --kernel-name "regex:${GEMM_NCU_KERNELS:-wgmma_kernel|sm90_xmma|cutlass|gemm}" \
          --launch-skip ${GEMM_NCU_SKIP:-0} --launch-count 1 --section WarpStateStats --section SourceCounters \
          -f -o "$T/gemm-ncu-sass" "$P" bench-op --device cuda --modes ${GEMM_NCU_MODES:-w8a8} --shapes "$GEMM_NCU_SHAPE" \
          -M ${GEMM_NCU_M:-4096} -r 1 > "$T/gemm-ncu-sass.log" 2>&1
        "$NCU" --import "$T/gemm-ncu-sass.ncu-rep" --page source --csv --print-source sass > "$T/gemm-ncu-sass.csv" 2>&1
        python3 "$ROOT/tools/gpu/ncu_sass_stalls.py" "$T/gemm-ncu-sass.csv" --top 40 > "$OUT/gemm-ncu-stalls.md" 2>&1
        say "## ncu stall samples per SASS instruction: exit $? (gemm-ncu-stalls.md)"
        sed -n '/^| reason/,/^$/p' "$OUT/gemm-ncu-stalls.md" | sed 's/^/    /' | tee -a "$S"
      fi
    fi ;;
  peers)
    bench llama3-8b llama3-8b bf16 w8a8 w4a8-g128
    peer_transformers llama3-8b ;;
  # The two halves of `full` for two device calls of < 10 minutes each.
  run2)
    bench llama3-8b llama3-8b bf16 w8a16 w4a16 w8a8 w8a8-g128 w4a8-g128
    QUICK_OPS=--quick bench_op ;;
  final)  # everything that must be measured in the last call of a session, bounded to ~9.5 min
    left() { echo $(( 560 - ($(date +%s) - START) )); }
    BENCH_TIMEOUT=170 bench llama3-8b llama3-8b bf16 w8a16 w4a16 w8a8 w8a8-g128 w4a8-g128
    EXPORT_TIMEOUT=120 PEER_TIMEOUT=$(( $(left) - 150 )) peer_transformers llama3-8b
    timeout 45 "$P" bench --device cuda --synthetic llama3-8b --modes bf16 -p 16 -b 1 16 -n 32 -r 3 --no-cuda-graphs \
      > "$T/nograph.log" 2>&1
    say ""; say "## llama3-8b bf16 decode WITHOUT CUDA graphs"; grep -E "decode" "$T/nograph.log" | sed 's/^/    /' | tee -a "$S"
    BENCH_TIMEOUT=$(( $(left) - 5 )) bench qwen3-8b qwen3-8b bf16 w8a8 w4a8-g128 w8a16 w4a16 w8a8-g128 ;;
  run3)
    bench qwen3-8b qwen3-8b bf16 w8a16 w4a16 w8a8 w8a8-g128 w4a8-g128
    # Launch overhead without the decode graph (bf16 llama3-8b, decode only).
    timeout 120 "$P" bench --device cuda --synthetic llama3-8b --modes bf16 -p 16 -b 1 16 -n 32 -r 3 --no-cuda-graphs \
      > "$T/nograph.log" 2>&1
    say ""; say "## llama3-8b bf16 decode WITHOUT CUDA graphs"; grep -E "decode" "$T/nograph.log" | sed 's/^/    /' | tee -a "$S"
    peer_transformers llama3-8b ;;
esac
say ""
say "- total: $(( $(date +%s) - START )) s"
