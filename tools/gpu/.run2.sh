#!/usr/bin/env bash
cd "$(dirname "$0")/../.."
TESTS_ONLY=none \
  GEMM_MODES='w4a8-g128' GEMM_MS='1024 2048 4096' GEMM_TIMEOUT=100 GEMM_REPEATS=10 \
  GEMM_VARIANTS='new: noconv:PERRY_LAB_TL_FLAGS=1 nostore:PERRY_LAB_TL_FLAGS=2 neither:PERRY_LAB_TL_FLAGS=3' \
  GEMM_NCU_SHAPE=2560x10240 GEMM_NCU_M=1024 GEMM_NCU_MODES=w4a8-g128 GEMM_NCU_KERNELS=two_level GEMM_NCU_SKIP=4 GEMM_NCU_COUNT=1 GEMM_NCU_SASS=1 \
  bash tools/gpu/run_cuda_backend.sh $OUT/g gemmvar
cd $OUT && tar czf g.tgz g && rm -rf g
