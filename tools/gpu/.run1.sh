#!/usr/bin/env bash
cd "$(dirname "$0")/../.."
TESTS_ONLY="test_cuda_quant_linear test_cuda_bench_op test_cuda_model" TEST_TIMEOUT=240 \
  TEST_FILTER='CudaGemmQuantWgmma.TwoLevel*:CudaBenchOp.*:*CudaModeVsCpu*' \
  GEMM_MODES='w4a8-g128 w4a8' GEMM_MS='768 1024 1536 2048 3072 4096' GEMM_TIMEOUT=150 \
  GEMM_VARIANTS='new: notail:PERRY_TWO_LEVEL_SPLIT_TAIL=0 tlexp:PERRY_INT4_TWO_LEVEL_EXPAND=1 new2:' \
  PREFILL_PAIRS='w4a8-g128:base w4a8-g128:notltail' PREFILL_LENGTHS='1024 2048 4096' \
  GEMM_NCU_SHAPE=2560x10240 GEMM_NCU_M=1024 GEMM_NCU_MODES=w4a8-g128 GEMM_NCU_KERNELS=two_level GEMM_NCU_COUNT=1 GEMM_NCU_SASS=1 \
  bash tools/gpu/run_cuda_backend.sh $OUT/g gemmvar
cd $OUT && tar czf g.tgz g && rm -rf g
