# Sourced by the Nsight Compute labs (lab_prologue.sh, lab_gemv_profile.sh) on the GPU machine:
# OUT checked, the bundle unpacked into T=/tmp/perry-gpu (once), its libraries on the path, NCU
# found (exit 2 without it).
OUT=${OUT:?set OUT}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
T=/tmp/perry-gpu
[ -x $T/bin/perry ] || { mkdir -p $T && tar xJf "$ROOT/gpu-bundle/perry-gpu.txz" -C $T; } || exit 2
export LD_LIBRARY_PATH=$T/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 2; }
