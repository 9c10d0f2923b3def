// Quantization modes, the canonical quantized weight format and the quantized linear layer.
//
// Canonical format (what a quantized checkpoint stores, independent of any kernel):
//   qweight  int8 [N, K], or int4 packed [N, ceil(K/2)] (low nibble = even k, two's complement,
//            values in [-7, 7]);
//   scales   float [N, n_groups], n_groups = 1 (per output channel) or ceil(K / group_size).
// Weight scales are absmax/127 (int8) or absmax/7 (int4), values rounded half-to-even.
// Activations of the W*A8 modes are quantized per token (row) online: absmax/127, half-even.
// The weight-only modes (w8a16, w4a16) use groups of 128 along K and bf16 activations.
// w8a8-fp8 (the comparison mode of issue 6): qweight holds fp8 e4m3fn bytes [N, K] (uint8 codes
// in int8_t storage, core/dtype.h's codec), one scale per output channel, and the activations
// are e4m3 per token; both follow quantize_row_fp8_ref (amax/448, no integer path anywhere).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace perry::quant {

enum class QuantMode { F32, BF16, F16, W8A16, W4A16, W8A8, W8A8_G128, W8A8_G64, W4A8, W4A8_G128, W8A8_FP8 };

struct QuantScheme {
  int weight_bits;        // 32/16 for float modes, 8 or 4 otherwise
  int group_size;         // 0 = one scale per output channel
  bool int8_activations;  // W*A8: activations quantized per token, integer dot products
  // w8a8-fp8: weights and per-token activations are fp8 e4m3 codes, fp32 dot products. Such a
  // mode has weight_bits 8 but int8_activations false, so code that only asks those two would
  // take it for w8a16 (int8 weights, float activations): every user must check fp8 first.
  bool fp8;
};

// "w8a8-g128" etc. (the names used by the CLI, file metadata and benchmarks); nullopt if unknown.
std::optional<QuantMode> parse_quant_mode(std::string_view name);
std::string_view quant_mode_name(QuantMode mode);
QuantScheme quant_scheme(QuantMode mode);
bool is_quantized(QuantMode mode);
// Comma-separated list of every mode name, for error messages and --help.
std::string quant_mode_names();

struct QuantizedWeight {
  QuantMode mode = QuantMode::W8A8;
  int64_t N = 0, K = 0;
  std::vector<int8_t> qweight;  // int8 [N, K]; int4: packed [N, ceil(K/2)]
  std::vector<float> scales;    // [N, n_groups]

  int n_groups() const;
  int64_t row_bytes() const;  // bytes of one row of qweight
  // The integer value of weight (n, k) (unpacks int4). Throws for w8a8-fp8, whose bytes are
  // e4m3 codes, not integers: use weight_value().
  int weight(int64_t n, int64_t k) const;
  // The value weight (n, k) stands for before its scale: the integer for int8/int4, the decoded
  // e4m3 value for fp8. dequantize_weight = weight_value · scale.
  float weight_value(int64_t n, int64_t k) const;
  // Throws perry::Error naming the problem if sizes/values are inconsistent (e.g. a bad file).
  void validate() const;
};

// Quantizes a float [N, K] row-major weight. Throws for float modes.
QuantizedWeight quantize_weight(const float* w, int64_t N, int64_t K, QuantMode mode);
// Reconstructs the float weight the quantized one stands for: [N, K] = q * scale.
std::vector<float> dequantize_weight(const QuantizedWeight& w);

// Per-token activation quantization (the exact rule every kernel follows):
//   amax = max|x|, scale = amax/127, inv = 127/amax, q = clamp(rint(x*inv), -127, 127);
//   scale = inv = 0 when amax == 0 or 127/amax overflows (denormal rows), so q = 0, no division by 0.
float quantize_row_ref(const float* x, int64_t K, int8_t* q);

// The e4m3 form (w8a8-fp8), for the activations (per token) and, the same function, the weights
// (per output channel); bit for bit the rule of the GPU's quantize_per_token_fp8:
//   amax = max|x| (NaN elements ignored), scale = amax/448, inv = 448/amax,
//   q = f32_to_e4m3(x*inv) (core/dtype.h: round to nearest even, saturate to ±448);
//   scale = inv = 0 when amax == 0, amax is not finite or 448/amax overflows (q = ±0 then).
// Unlike the int8 rule a NaN element is not mapped to 0: it becomes the NaN code (as
// cvt.rn.satfinite does), so a NaN in the activations reaches the output like in a float model.
// (An infinite element makes scale = inv = 0 and inf·0 a NaN code as well.)
float quantize_row_fp8_ref(const float* x, int64_t K, uint8_t* q);

namespace detail {
struct LinearImpl;
}

class QuantizedLinear {
 public:
  // Repacks into the CPU kernels' layout; pack_for_cpu = false keeps only the canonical form (a
  // model bound for a GPU: no second copy, no packing pass) and packs on a first CPU forward.
  explicit QuantizedLinear(QuantizedWeight w, bool pack_for_cpu = true);
  ~QuantizedLinear();
  QuantizedLinear(QuantizedLinear&&) noexcept;
  QuantizedLinear& operator=(QuantizedLinear&&) noexcept;

  // y[M, N] = x[M, K] · Wᵀ (+ bias[N]); fp32 in and out. Runs on perry::thread_pool(); the
  // activation scratch is per calling thread.
  void forward(const float* x, int64_t M, float* y, const float* bias = nullptr) const;
  // y[i] = x·W_iᵀ (+ bias[i], entries may be null) for n <= 4 layers that read the same x (q|k|v,
  // gate|up): the activations are quantized once and the decode GEMV runs every layer in one
  // parallel region. Layers that differ in mode or K, or a CPU without the AVX-512 kernels, run
  // one forward() after the other (same results either way).
  static void forward_many(const QuantizedLinear* const* layers, int n, const float* x, int64_t M, float* const* y,
                           const float* const* bias);
  // Which kernel forward() uses for M rows, e.g. "w8a8:gemm_avx512_vnni" or "w4a8:reference".
  std::string kernel_name(int64_t M) const;
  const QuantizedWeight& canonical() const;
  int64_t rows() const;  // N (output features)
  int64_t cols() const;  // K (input features)
  QuantMode mode() const;
  // Largest M that still uses the matrix-vector kernel (measured, see docs/quantization.md).
  int64_t gemv_max_m() const;

 private:
  std::unique_ptr<detail::LinearImpl> impl_;
};

// Forces every QuantizedLinear onto the scalar reference kernels (tests, debugging).
void set_quant_force_reference(bool on);
bool quant_force_reference();

}  // namespace perry::quant
