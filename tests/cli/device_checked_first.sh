#!/usr/bin/env bash
# Argument errors must stop perry before it loads or quantizes anything (a wrong --device used to
# be reported only after all of an 8B model was quantized: minutes on a machine without a GPU),
# with a message that says what is wrong, and a non-zero exit.
set -u
perry=${1:?usage: device_checked_first.sh PERRY_BINARY}
fails=0
# expect_early_error PATTERN ARGS...: exit != 0, PATTERN in the output, nothing loaded first.
expect_early_error() {
  local pattern=$1 out rc
  shift
  out=$("$perry" "$@" 2>&1)
  rc=$?
  echo "\$ perry $*"
  echo "$out" | tail -3
  if [ $rc -eq 0 ]; then echo "FAIL: exit status 0"; fails=$((fails + 1))
  elif echo "$out" | grep -qE "quantizing|loading|uploading|\[bench\]"; then echo "FAIL: loaded before the check"; fails=$((fails + 1))
  elif ! echo "$out" | grep -qE "$pattern"; then echo "FAIL: no message matching /$pattern/"; fails=$((fails + 1))
  fi
}
# Whatever this machine has — no CUDA build, no driver, no GPU, or fewer than 100 GPUs — index 99
# cannot be used. (A binary built without CUDA refused --device cuda before loading already; on
# such a build only the --modes case below tests the early checks.)
device_msg="this machine has [0-9]+ GPU|no CUDA GPU found|no usable CUDA driver|built without the CUDA backend"
expect_early_error "$device_msg" run --device cuda:99 --synthetic llama3-8b --quant w8a8 --prompt-tokens 4 -n 1
expect_early_error "$device_msg" bench --device cuda:99 --synthetic llama3-8b --modes w8a8 -p 4 -n 2
# A bad mode late in --modes stops the bench before the first mode is measured.
expect_early_error "unknown --quant mode \"w9a9\"" bench --synthetic llama3-8b --modes bf16 w9a9 -p 4 -n 2
# Text for a model without a tokenizer (it used to be ignored: the prompt became random ids).
expect_early_error "no tokenizer" run --synthetic llama3-8b --prompt "hello" -n 1
[ $fails -eq 0 ] && echo PASS
exit $fails
