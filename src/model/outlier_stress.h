// Outlier-stressed copies of a checkpoint whose float function is unchanged. Large LLMs carry a
// few activation channels 10–100× larger than the rest; perry's small trained model does not, so
// per-token W8A8 looks better on it than it would on a real 8B model. This recreates the
// phenomenon: for every layer a few channels of input_layernorm / post_attention_layernorm are
// multiplied by f and the same input columns of q/k/v (resp. gate/up) divided by f. The factors
// are powers of two (16, 32, 64), so in bf16 both scalings are exact and the float model
// computes the very same numbers (tests/model/test_outliers.cpp); only activation quantization
// sees the outliers.
#pragma once
#include <string>

namespace perry::model {

void write_outlier_stressed(const std::string& in_dir, const std::string& out_dir, int channels_per_norm,
                            unsigned seed);

}  // namespace perry::model
