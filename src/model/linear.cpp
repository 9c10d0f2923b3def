#include "model/linear.h"

#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"

namespace perry::model {

std::vector<float> to_f32(const io::TensorView& t) {
  const int64_t n = t.numel();
  if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
    fail("tensor '{}': dtype {} is not a float type", t.name, dtype_name(t.dtype));
  std::vector<float> out(static_cast<size_t>(n));
  // Parallel: loading a quantized 8B model converts ~7e9 weights.
  thread_pool().parallel_for(size_t(n), 1 << 16, [&](size_t b, size_t e) {
    switch (t.dtype) {
      case DType::F32: std::memcpy(out.data() + b, t.data + b * 4, (e - b) * 4); break;
      case DType::BF16: {
        const auto* p = reinterpret_cast<const uint16_t*>(t.data);
        for (size_t i = b; i < e; ++i) out[i] = bf16_to_f32(p[i]);
        break;
      }
      default: {
        const auto* p = reinterpret_cast<const uint16_t*>(t.data);
        for (size_t i = b; i < e; ++i) out[i] = f16_to_f32(p[i]);
        break;
      }
    }
  });
  return out;
}

Linear Linear::from_float(const io::TensorView& w, const io::TensorView* bias, quant::QuantMode mode,
                         bool pack_for_cpu) {
  PERRY_CHECK(w.shape.size() == 2, "tensor '{}': expected a 2-D weight, got shape {}", w.name, w.shape_str());
  Linear l;
  l.mode_ = mode;
  l.n_ = w.shape[0];
  l.k_ = w.shape[1];
  if (bias) l.bias_ = to_f32(*bias);
  if (!quant::is_quantized(mode)) {
    // Float modes compute with the stored dtype (bf16 stays bf16: the library GEMMs and our GEMV
    // read it directly). An f32 request on a bf16 checkpoint still reads bf16 weights.
    l.f_ = std::make_shared<kernels::FloatLinear>(w.data, w.dtype, l.n_, l.k_);
    l.float_bytes_ = w.nbytes;
    return l;
  }
  std::vector<float> wf = to_f32(w);
  l.q_ = std::make_shared<quant::QuantizedLinear>(quant::quantize_weight(wf.data(), l.n_, l.k_, mode), pack_for_cpu);
  return l;
}

Linear Linear::from_quantized(quant::QuantMode mode, const io::TensorView& qweight, const io::TensorView& scales,
                              const io::TensorView* bias, int64_t N, int64_t K, bool pack_for_cpu) {
  const quant::QuantScheme s = quant::quant_scheme(mode);
  const int64_t groups = s.group_size ? (K + s.group_size - 1) / s.group_size : 1;
  quant::QuantizedWeight qw;
  qw.mode = mode;
  qw.N = N;
  qw.K = K;
  if (s.fp8) {
    PERRY_CHECK(qweight.dtype == DType::F8_E4M3 && qweight.shape == std::vector<int64_t>({N, K}),
                "tensor '{}': expected F8_E4M3 [{}, {}] for mode {}, got {} {}", qweight.name, N, K,
                quant::quant_mode_name(mode), dtype_name(qweight.dtype), qweight.shape_str());
  } else if (s.weight_bits == 8) {
    PERRY_CHECK(qweight.dtype == DType::I8 && qweight.shape == std::vector<int64_t>({N, K}),
                "tensor '{}': expected I8 {} for mode {}, got {} {}", qweight.name, "[" + std::to_string(N) + ", " + std::to_string(K) + "]",
                quant::quant_mode_name(mode), dtype_name(qweight.dtype), qweight.shape_str());
  } else {
    PERRY_CHECK(qweight.dtype == DType::U8 && qweight.shape == std::vector<int64_t>({N, (K + 1) / 2}),
                "tensor '{}': expected U8 [{}, {}] (packed int4) for mode {}, got {} {}", qweight.name, N, (K + 1) / 2,
                quant::quant_mode_name(mode), dtype_name(qweight.dtype), qweight.shape_str());
  }
  PERRY_CHECK(scales.dtype == DType::F32 && scales.shape == std::vector<int64_t>({N, groups}),
              "tensor '{}': expected F32 [{}, {}] scales for mode {}, got {} {}", scales.name, N, groups,
              quant::quant_mode_name(mode), dtype_name(scales.dtype), scales.shape_str());
  qw.qweight.assign(reinterpret_cast<const int8_t*>(qweight.data),
                    reinterpret_cast<const int8_t*>(qweight.data) + qweight.nbytes);
  qw.scales.assign(reinterpret_cast<const float*>(scales.data), reinterpret_cast<const float*>(scales.data) + N * groups);
  Linear l;
  l.mode_ = mode;
  l.n_ = N;
  l.k_ = K;
  if (bias) l.bias_ = to_f32(*bias);
  try {
    l.q_ = std::make_shared<quant::QuantizedLinear>(std::move(qw), pack_for_cpu);  // validates the values
  } catch (const Error& e) {
    fail("tensor '{}': {}", qweight.name, e.what());  // a bad file: say which tensor
  }
  return l;
}

void Linear::forward(const float* x, int64_t M, float* y) const {
  const float* b = bias_.empty() ? nullptr : bias_.data();
  if (f_) f_->forward(x, M, y, b);
  else q_->forward(x, M, y, b);
}

void Linear::forward_many(std::initializer_list<Output> out, const float* x, int64_t M) {
  PERRY_CHECK(out.size() >= 1 && out.size() <= 4, "Linear::forward_many: {} layers (1..4)", out.size());
  bool quantized = true;
  for (const Output& o : out) quantized = quantized && o.layer->q_;
  if (!quantized) {
    for (const Output& o : out) o.layer->forward(x, M, o.y);
    return;
  }
  const quant::QuantizedLinear* layers[4];
  float* ys[4];
  const float* biases[4];
  int n = 0;
  for (const Output& o : out) {
    layers[n] = o.layer->q_.get();
    ys[n] = o.y;
    biases[n] = o.layer->bias_.empty() ? nullptr : o.layer->bias_.data();
    ++n;
  }
  quant::QuantizedLinear::forward_many(layers, n, x, M, ys, biases);
}

std::string Linear::kernel_name(int64_t M) const { return f_ ? f_->kernel_name(M) : q_->kernel_name(M); }

size_t Linear::weight_bytes() const {
  if (f_) return float_bytes_;
  // From the scheme, not canonical(): that rebuilds (and caches) an unpacked copy.
  const auto s = quant::quant_scheme(mode_);
  const int64_t groups = s.group_size ? (k_ + s.group_size - 1) / s.group_size : 1;
  // w8a8-fp8 on the CPU streams its weights decoded to bf16 (kernels/cpu/qgemm.h, PackedFp8).
  const int64_t wbytes = s.fp8 ? 2 * n_ * k_ : s.weight_bits == 8 ? n_ * k_ : n_ * ((k_ + 1) / 2);
  return size_t(wbytes + n_ * groups * 4);
}

}  // namespace perry::model
