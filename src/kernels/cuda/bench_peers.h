// What perry's CUDA benchmarks (`perry bench-op --device cuda`, the kernel lab bench/cuda/) share:
// the library peers perry is measured against — cuBLAS bf16 and cuBLASLt int8 / fp8 GEMMs, called
// directly with the library's best heuristic — and device helpers for timing: reproducible random
// fills (never zeros) and a spin kernel that holds the stream while the host queues timed work.
//
// Layouts are perry's: W [N, K] row-major (one output channel per row), X [M, K] row-major,
// Y [M, N] row-major. Column-major libraries see Yᵀ[N, M] = op(W)·X, i.e. the "TN" call that
// cuBLASLt's int8 and fp8 kernels require.
// Errors throw perry::Error naming the call (fmt-free: the lab compiles this with plain nvcc).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace perry::cuda {

// Throws perry::Error("<what> failed: CUBLAS_STATUS_... (text)") unless s is CUBLAS_STATUS_SUCCESS.
void check_cublas_status(cublasStatus_t s, const char* what);

// Y[M, N] = X[M, K] · W[N, K]ᵀ with cublasGemmEx: bf16 inputs (raw uint16 bits), fp32 compute,
// out = BF16 (the plain library GEMM) or F32 (what perry's bf16 linear asks for). Runs on the
// handle's stream.
void cublas_gemm_bf16(cublasHandle_t h, const uint16_t* w, const uint16_t* x, void* y, DType out, int M, int N,
                      int K);

enum class LtGemmKind {
  I8_I32,     // int8 × int8 → int32, int32 compute, alpha = 1 (the raw accumulators)
  I8_I8,      // int8 × int8 → int8, int32 compute, fp32 alpha (requantized output)
  E4M3_BF16,  // fp8 e4m3 × e4m3 → bf16, fp32 compute with fast accumulation (the inference setting)
};
const char* lt_gemm_kind_name(LtGemmKind k);

// One cuBLASLt matmul for fixed (kind, M, N, K): descriptors made once, the first (best)
// algorithm of cublasLtMatmulAlgoGetHeuristic for the given workspace. When cuBLASLt has no
// algorithm (unsupported device or shape) available() is false and note() says why.
class LtGemm {
 public:
  LtGemm(cublasLtHandle_t lt, LtGemmKind kind, int M, int N, int K, size_t workspace_bytes, float alpha = 1.0f);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  bool available() const { return ok_; }
  // "algo 21 tile 15 stages 12 waves 0.87 ws 0 B", or why it is not available.
  const std::string& note() const { return note_; }
  LtGemmKind kind() const { return kind_; }
  float alpha() const { return alpha_; }
  // y [M, N] = alpha · x · wᵀ in the kind's types; workspace of at least the constructor's bytes.
  void run(const void* w, const void* x, void* y, void* workspace, cudaStream_t stream) const;

 private:
  void release();
  cublasLtHandle_t lt_;
  LtGemmKind kind_;
  float alpha_;
  size_t ws_bytes_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool ok_ = false;
  std::string note_;
};

// Reproducible pseudo-random device fills (a hash of (index, seed)), asynchronous on `stream`:
void fill_random_i8(int8_t* p, size_t n, uint64_t seed, cudaStream_t stream);    // [-127, 127]
void fill_random_int4(uint8_t* p, size_t n, uint64_t seed, cudaStream_t stream); // 2 nibbles in [-7, 7]
void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, float scale, cudaStream_t stream);   // U(-s, s)
void fill_random_f32(float* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream);  // U(lo, hi)
void fill_random_e4m3(uint8_t* p, size_t n, uint64_t seed, float scale, cudaStream_t stream);  // e4m3(U(-s, s))

// A one-thread kernel that busy-waits `ns` nanoseconds (device global timer). Launched before a
// batch of timed calls, it keeps the GPU busy while the host queues them, so no timing includes
// host launch latency.
void spin_stream(int64_t ns, cudaStream_t stream);

}  // namespace perry::cuda
