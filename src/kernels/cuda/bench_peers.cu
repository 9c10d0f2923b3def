// Library peers and timing helpers of perry's CUDA benchmarks (see bench_peers.h).
#include "kernels/cuda/bench_peers.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdio>

#include "kernels/cuda/cuda_error.h"

namespace perry::cuda {

void check_cublas_status(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string(what) + " failed: " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

void cublas_gemm_bf16(cublasHandle_t h, const uint16_t* w, const uint16_t* x, void* y, DType out, int M, int N,
                      int K) {
  if (out != DType::BF16 && out != DType::F32) throw Error("cublas_gemm_bf16: the output must be BF16 or F32");
  const float one = 1.0f, zero = 0.0f;
  check_cublas_status(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, CUDA_R_16BF, K, x, CUDA_R_16BF, K,
                                   &zero, y, out == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
                      out == DType::BF16 ? "cublasGemmEx (bf16 -> bf16)" : "cublasGemmEx (bf16 -> f32)");
}

const char* lt_gemm_kind_name(LtGemmKind k) {
  switch (k) {
    case LtGemmKind::I8_I32: return "int8->int32";
    case LtGemmKind::I8_I8: return "int8->int8";
    case LtGemmKind::E4M3_BF16: return "e4m3->bf16";
  }
  return "?";
}

LtGemm::LtGemm(cublasLtHandle_t lt, LtGemmKind kind, int M, int N, int K, size_t workspace_bytes, float alpha)
    : lt_(lt), kind_(kind), alpha_(kind == LtGemmKind::I8_I32 ? 1.0f : alpha), ws_bytes_(workspace_bytes) {
  if (M <= 0 || N <= 0 || K <= 0) throw Error("LtGemm: M, N and K must be positive");
  cublasComputeType_t compute = CUBLAS_COMPUTE_32I;
  cudaDataType_t scale_t = CUDA_R_32I, ab_t = CUDA_R_8I, cd_t = CUDA_R_32I;
  if (kind == LtGemmKind::I8_I8) {
    scale_t = CUDA_R_32F;
    cd_t = CUDA_R_8I;
  } else if (kind == LtGemmKind::E4M3_BF16) {
    compute = CUBLAS_COMPUTE_32F;
    scale_t = CUDA_R_32F;
    ab_t = CUDA_R_8F_E4M3;
    cd_t = CUDA_R_16BF;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    check_cublas_status(cublasLtMatmulDescCreate(&desc_, compute, scale_t), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check_cublas_status(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
                        "cublasLtMatmulDescSetAttribute(TRANSA)");
    check_cublas_status(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
                        "cublasLtMatmulDescSetAttribute(TRANSB)");
    if (kind == LtGemmKind::E4M3_BF16) {
      const int8_t fast = 1;
      check_cublas_status(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast),
                          "cublasLtMatmulDescSetAttribute(FAST_ACCUM)");
    }
    check_cublas_status(cublasLtMatrixLayoutCreate(&la_, ab_t, K, N, K), "cublasLtMatrixLayoutCreate(W)");
    check_cublas_status(cublasLtMatrixLayoutCreate(&lb_, ab_t, K, M, K), "cublasLtMatrixLayoutCreate(X)");
    check_cublas_status(cublasLtMatrixLayoutCreate(&lc_, cd_t, N, M, N), "cublasLtMatrixLayoutCreate(Y)");
    check_cublas_status(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = workspace_bytes;
    check_cublas_status(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
        "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    cublasLtMatmulHeuristicResult_t res[8] = {};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc_, la_, lb_, lc_, lc_, pref, 8, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    pref = nullptr;
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0 || res[0].state != CUBLAS_STATUS_SUCCESS) {
      note_ = std::string("no cuBLASLt ") + lt_gemm_kind_name(kind) + " algorithm (" +
              cublasGetStatusName(hs != CUBLAS_STATUS_SUCCESS ? hs : res[0].state) + ", " + std::to_string(found) +
              " found)";
      return;
    }
    algo_ = res[0].algo;
    int32_t id = -1;
    uint32_t tile = 0, stages = 0;
    size_t got = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &got);
    char buf[160];
    std::snprintf(buf, sizeof buf, "cublasLt %s algo %d tile %u stages %u waves %.2f ws %zu B",
                  lt_gemm_kind_name(kind), int(id), unsigned(tile), unsigned(stages), double(res[0].wavesCount),
                  res[0].workspaceSize);
    note_ = buf;
    ok_ = true;
  } catch (...) {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    release();
    throw;
  }
}

LtGemm::~LtGemm() { release(); }

void LtGemm::release() {
  if (lc_) cublasLtMatrixLayoutDestroy(lc_);
  if (lb_) cublasLtMatrixLayoutDestroy(lb_);
  if (la_) cublasLtMatrixLayoutDestroy(la_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
  lc_ = lb_ = la_ = nullptr;
  desc_ = nullptr;
}

void LtGemm::run(const void* w, const void* x, void* y, void* workspace, cudaStream_t stream) const {
  if (!ok_) throw Error("LtGemm::run: " + note_);
  const int32_t ione = 1, izero = 0;
  const float fzero = 0.0f;
  const bool int_scale = kind_ == LtGemmKind::I8_I32;
  const void* alpha = int_scale ? static_cast<const void*>(&ione) : static_cast<const void*>(&alpha_);
  const void* beta = int_scale ? static_cast<const void*>(&izero) : static_cast<const void*>(&fzero);
  check_cublas_status(
      cublasLtMatmul(lt_, desc_, alpha, w, la_, x, lb_, beta, y, lc_, y, lc_, &algo_, workspace, ws_bytes_, stream),
      kind_ == LtGemmKind::I8_I32  ? "cublasLtMatmul (int8 -> int32)"
      : kind_ == LtGemmKind::I8_I8 ? "cublasLtMatmul (int8 -> int8)"
                                   : "cublasLtMatmul (e4m3 -> bf16)");
}

// ---------------------------------------------------------------- fills

namespace {

__device__ __forceinline__ uint64_t hash_index(size_t i, uint64_t seed) {
  uint64_t h = (uint64_t(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 32;
  return h;
}
// Uniform in [-1, 1).
__device__ __forceinline__ float unit(uint64_t h) { return float(h >> 40) * (2.0f / 16777216.0f) - 1.0f; }

#define PERRY_GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

__global__ void fill_i8_kernel(int8_t* p, size_t n, uint64_t seed) {
  PERRY_GRID_STRIDE(i, n) p[i] = int8_t(int(hash_index(i, seed) % 255) - 127);
}
__global__ void fill_int4_kernel(uint8_t* p, size_t n, uint64_t seed) {
  PERRY_GRID_STRIDE(i, n) {
    const uint64_t h = hash_index(i, seed);
    const int lo = int(h % 15) - 7, hi = int((h >> 16) % 15) - 7;
    p[i] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
  }
}
__global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint64_t seed, float scale) {
  PERRY_GRID_STRIDE(i, n) p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(scale * unit(hash_index(i, seed))));
}
__global__ void fill_f32_kernel(float* p, size_t n, uint64_t seed, float lo, float hi) {
  PERRY_GRID_STRIDE(i, n) p[i] = lo + (hi - lo) * 0.5f * (unit(hash_index(i, seed)) + 1.0f);
}
__global__ void fill_e4m3_kernel(uint8_t* p, size_t n, uint64_t seed, float scale) {
  PERRY_GRID_STRIDE(i, n) p[i] = __nv_cvt_float_to_fp8(scale * unit(hash_index(i, seed)), __NV_SATFINITE, __NV_E4M3);
}
#undef PERRY_GRID_STRIDE

unsigned fill_blocks(size_t n) { return unsigned(std::min<size_t>((n + 255) / 256, 4096)); }

__global__ void spin_kernel(int64_t ns) {
  uint64_t t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  // The iteration bound only guards against a global timer that does not advance.
  for (int64_t it = 0; it < ns; ++it) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (int64_t(t - t0) >= ns) break;
  }
}

}  // namespace

void fill_random_i8(int8_t* p, size_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_i8_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, seed);
  check_launch("fill_random_i8");
}
void fill_random_int4(uint8_t* p, size_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_int4_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, seed);
  check_launch("fill_random_int4");
}
void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n == 0) return;
  fill_bf16_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, seed, scale);
  check_launch("fill_random_bf16");
}
void fill_random_f32(float* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  if (n == 0) return;
  fill_f32_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, seed, lo, hi);
  check_launch("fill_random_f32");
}
void fill_random_e4m3(uint8_t* p, size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n == 0) return;
  fill_e4m3_kernel<<<fill_blocks(n), 256, 0, stream>>>(p, n, seed, scale);
  check_launch("fill_random_e4m3");
}

void spin_stream(int64_t ns, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  check_launch("spin_stream");
}

}  // namespace perry::cuda
