#!/usr/bin/env bash
cd "$(dirname "$0")/../.."
TESTS_ONLY="test_cuda_quant_linear" TEST_TIMEOUT=200 TEST_FILTER='CudaGemmQuantWgmma.TwoLevel*' \
  GEMM_MODES='w4a8-g128' GEMM_MS='768 1024 2048 4096' GEMM_TIMEOUT=100 \
  GEMM_VARIANTS='new: alt: nostore:PERRY_LAB_TL_FLAGS=2 new2: alt2:' \
  PREFILL_PAIRS='w4a8-g128:base w4a8-g128:alt w4a8:base w4a8:alt' PREFILL_LENGTHS='1024 2048 4096' \
  bash tools/gpu/run_cuda_backend.sh $OUT/g gemmvar
cd $OUT && tar czf g.tgz g && rm -rf g
