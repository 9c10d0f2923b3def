// SmoothQuant (Xiao et al. 2022): migrate activation outliers into the weights before W8A8.
// For a linear group fed by one normalised activation X (q/k/v after input_layernorm; gate/up
// after post_attention_layernorm), per input channel j:
//   s_j = max|X_j|^α / max_i |W_ij|^(1-α)      (max over all rows of all linears in the group)
// then norm_weight_j /= s_j and W_ij *= s_j: the float model is unchanged, but the activation's
// per-channel range is flattened so per-token int8 quantization loses less.
#pragma once
#include <cstdint>
#include <vector>

namespace perry::quant {

// Per-channel running absmax of activations (calibration statistics).
struct ChannelAbsMax {
  std::vector<float> max_abs;
  void observe(const float* x, int64_t rows, int64_t n);
};

// Smoothing factors for one group. weight_col_absmax[j] = max over the group's rows of |W_ij|.
// Channels with no activation or no weight get s = 1. Factors are clamped to [1e-5, 1e5].
std::vector<float> smoothing_factors(const std::vector<float>& act_absmax, const std::vector<float>& weight_col_absmax,
                                     double alpha);

// max_i |W_ij| over the rows of a row-major [N, K] matrix, folded into `acc` (size K).
void fold_column_absmax(const float* w, int64_t N, int64_t K, std::vector<float>& acc);

}  // namespace perry::quant
