// Float linear layer y = x · Wᵀ (+ bias) for f32 / f16 / bf16 weights: the honest baseline every
// quantized mode is measured against. Decode-sized M uses our own streaming GEMV (AVX-512 / AVX2),
// prefill-sized M the fastest library GEMM measured on this machine (docs/perf/cpu-float-linear.md).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace perry::kernels {

struct FloatLinearGemm;  // library GEMM state (oneDNN primitives per M), defined in float_linear.cpp

class FloatLinear {
 public:
  // w: row-major [N, K] (HF nn.Linear layout, out x in), dtype F32, F16 or BF16. The pointer may be
  // into a memory-mapped checkpoint; the caller keeps it alive. Nothing is pre-packed: the GEMV
  // streams the checkpoint layout directly, and the measured prefill winners read it as-is too
  // (see float_linear.cpp for the numbers), so the layer costs no memory beyond the weights.
  FloatLinear(const void* w, DType wtype, int64_t N, int64_t K);
  ~FloatLinear();
  FloatLinear(FloatLinear&&) noexcept;
  FloatLinear& operator=(FloatLinear&&) noexcept;

  // y[M, N] = x[M, K] · Wᵀ (+ bias[N]); x, y fp32 row-major, contiguous. Multi-threaded (perry::thread_pool()).
  void forward(const float* x, int64_t M, float* y, const float* bias = nullptr) const;

  int64_t rows() const { return N_; }
  int64_t cols() const { return K_; }
  DType weight_dtype() const { return wtype_; }
  const void* weights() const { return w_; }

  // Which kernel forward() uses for this M (for `perry info` and tests), e.g. "gemv-avx512-bf16".
  std::string kernel_name(int64_t M) const;

  // Copies the weights into memory this object owns (2 MiB-aligned, transparent huge pages), so the
  // GEMV stops depending on how the page cache maps the checkpoint. Costs N*K*elem bytes of RAM
  // (the mmap can then be dropped by the caller). See docs/perf/cpu-float-linear.md for when it helps.
  void copy_weights_to_owned_memory();

 private:
  const void* w_;
  DType wtype_;
  int64_t N_, K_;
  std::unique_ptr<uint8_t, void (*)(void*)> owned_{nullptr, nullptr};
  std::unique_ptr<FloatLinearGemm> gemm_;
};

// Tests compare paths: when set, forward() uses the scalar reference for every M.
void set_float_linear_force_reference(bool);

// For the kernel lab and tests: override the measured plan. Auto / -1 restore the table.
enum class FloatGemm { Auto, OpenBlas, OneDnn };
void set_float_linear_gemm(FloatGemm);          // prefill library (OneDnn applies to bf16 weights)
void set_float_linear_gemv_max_m(int64_t m);    // largest M that uses the GEMV
// Whether oneDNN can run the bf16 matmul on this CPU (not below AVX-512 in oneDNN 2.6): where it
// cannot, bf16 prefill GEMMs take OpenBLAS's sgemm on widened rows, as f16 does.
bool supports_onednn_bf16_matmul();

// Kernel building blocks (one per ISA). gemv_*: y[m, n] for m < M, n in [n0, n1) (+ bias), weights
// [N, K] of dtype wt with row stride K; used for small M, one weight pass for up to 4 rows of x.
namespace ref {
void linear(const void* w, DType wt, int64_t N, int64_t K, const float* x, int64_t M, float* y, const float* bias,
            int64_t n0, int64_t n1);
}
namespace avx512 {
void f32_to_bf16(const float* x, int64_t n, uint16_t* out);  // needs AVX512_BF16
void gemv(const void* w, DType wt, int64_t N, int64_t K, const float* x, int64_t M, float* y, const float* bias,
          int64_t n0, int64_t n1);
}
namespace avx2 {
void gemv(const void* w, DType wt, int64_t N, int64_t K, const float* x, int64_t M, float* y, const float* bias,
          int64_t n0, int64_t n1);
}

}  // namespace perry::kernels
