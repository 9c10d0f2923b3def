// The tensors a model family expects, with their shapes (from config.json). Loading checks every
// checkpoint tensor against this list, so a shape that disagrees with config.json is an error
// naming the tensor, not a crash deep inside a kernel.
#pragma once
#include <string>
#include <vector>

#include "io/model_config.h"

namespace perry::model {

enum class TensorKind { Embedding, Linear, Bias, Norm };

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  TensorKind kind;
  bool required = true;
};

std::string layer_prefix(int64_t layer);  // "model.layers.<i>."
std::vector<TensorSpec> expected_tensors(const io::ModelConfig& c);

}  // namespace perry::model
