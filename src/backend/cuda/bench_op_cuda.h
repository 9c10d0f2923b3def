// `perry bench-op --device cuda`: one linear layer on the GPU in every perry mode (bf16 and the
// seven quantized modes, each with its activation quantization, as the CUDA backend runs them)
// against cuBLAS bf16 and cuBLASLt int8 / fp8 measured in the same run, with every timed output
// checked against a host reference. Method and output: bench_op_cuda.cpp.
#pragma once
#include "bench/bench_op.h"
#include "core/dtype.h"

namespace perry::cuda {

struct CudaBenchOpOptions {
  bench::BenchOpOptions common;  // modes, M list, shapes, repeats, output prefix, quick
  int device = 0;
  // false: time perry's layers as the model runs them with PERRY_NO_WGMMA=1 (mma.sync instead of the
  // sm_90 wgmma GEMMs; no w8a8-mma rows) — sets that variable for the process.
  bool wgmma = true;
  // What perry's layers write (F32 or BF16): bf16 by default, as the model's linears and the cuBLAS
  // bf16 baseline do; F32 is the convention of the runs before the thirty-first session.
  DType float_out = DType::BF16;
};

// Prints the table, writes <out>.md / <out>.json; returns 0 when every check passed, 1 when some
// row failed its check, 2 when the run was aborted (the results so far are still written). A
// kernel that hangs (no progress for 20-60 s) ends the process with exit status 3, after writing.
int run_bench_op_cuda(const CudaBenchOpOptions& o);

}  // namespace perry::cuda
