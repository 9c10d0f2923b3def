// A linear layer y = x·Wᵀ (+ b) in any perry mode: float (the baseline, FloatLinear) or quantized
// (QuantizedLinear: w8a8, w4a8-g128, ...). The kernel is chosen inside by M (rows).
#pragma once
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kernels/cpu/float_linear.h"
#include "quant/quant.h"

namespace perry::model {

class Linear {
 public:
  // From a float weight view [N, K] (bf16/f16/f32): float mode keeps (or packs) it; a quantized
  // mode quantizes it now. bias may be null.
  static Linear from_float(const io::TensorView& w, const io::TensorView* bias, quant::QuantMode mode,
                           bool pack_for_cpu = true);
  // From a perry-quantized checkpoint: qweight (I8 [N,K], U8 [N,ceil(K/2)] packed int4, or
  // F8_E4M3 [N,K] for w8a8-fp8) + scales (F32 [N,G]). The weights are validated (QuantizedLinear).
  static Linear from_quantized(quant::QuantMode mode, const io::TensorView& qweight, const io::TensorView& scales,
                               const io::TensorView* bias, int64_t N, int64_t K, bool pack_for_cpu = true);

  void forward(const float* x, int64_t M, float* y) const;
  // Several layers on the same input x (q|k|v, gate|up), out[i] = (layer, its y): quantized
  // layers share one activation quantization and, in decode, one parallel region
  // (QuantizedLinear::forward_many); anything else runs forward() layer by layer.
  struct Output {
    const Linear* layer;
    float* y;
  };
  static void forward_many(std::initializer_list<Output> out, const float* x, int64_t M);
  int64_t rows() const { return n_; }
  int64_t cols() const { return k_; }
  quant::QuantMode mode() const { return mode_; }
  std::string kernel_name(int64_t M) const;
  size_t weight_bytes() const;  // bytes the kernels stream per forward (for bandwidth figures)
  const quant::QuantizedLinear* quantized() const { return q_.get(); }
  const kernels::FloatLinear* float_linear() const { return f_.get(); }
  const std::vector<float>& bias() const { return bias_; }

 private:
  quant::QuantMode mode_ = quant::QuantMode::BF16;
  int64_t n_ = 0, k_ = 0;
  size_t float_bytes_ = 0;
  std::shared_ptr<kernels::FloatLinear> f_;
  std::shared_ptr<quant::QuantizedLinear> q_;
  std::vector<float> bias_;
};

// Converts any float view to fp32 (norm weights, biases, quantization input).
std::vector<float> to_f32(const io::TensorView& t);

}  // namespace perry::model
