// Calibration for SmoothQuant: per-channel activation absmax at the inputs of the attention and
// MLP linear groups, collected by running the float model over a text, then the smoothing plan
// (per layer, per group factors) that Model::load folds into norms and weights.
#pragma once
#include <vector>

#include "model/weight_source.h"
#include "quant/smooth_quant.h"

namespace perry::model {

struct CalibrationStats {
  std::vector<quant::ChannelAbsMax> attn_in, mlp_in;  // per layer
  int64_t tokens = 0;
};

struct SmoothingPlan {
  double alpha = 0.5;
  std::vector<std::vector<float>> attn, mlp;  // per layer: factors for q/k/v inputs, gate/up inputs
  bool empty() const { return attn.empty(); }
};

SmoothingPlan compute_smoothing_plan(const WeightSource& src, const CalibrationStats& stats, double alpha);

}  // namespace perry::model
