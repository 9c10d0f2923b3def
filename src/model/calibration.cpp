#include "model/calibration.h"

#include "core/error.h"
#include "model/linear.h"
#include "model/tensor_names.h"

namespace perry::model {

SmoothingPlan compute_smoothing_plan(const WeightSource& src, const CalibrationStats& stats, double alpha) {
  const auto& c = src.config();
  PERRY_CHECK(int64_t(stats.attn_in.size()) == c.num_layers && stats.tokens > 0,
              "SmoothQuant needs calibration statistics for every layer (run the model over --calib text first)");
  SmoothingPlan plan;
  plan.alpha = alpha;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l);
    std::vector<float> wa, wm;
    for (const char* n : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}) {
      auto w = to_f32(src.get(p + n));
      quant::fold_column_absmax(w.data(), int64_t(w.size()) / c.hidden_size, c.hidden_size, wa);
    }
    for (const char* n : {"mlp.gate_proj.weight", "mlp.up_proj.weight"}) {
      auto w = to_f32(src.get(p + n));
      quant::fold_column_absmax(w.data(), int64_t(w.size()) / c.hidden_size, c.hidden_size, wm);
    }
    plan.attn.push_back(quant::smoothing_factors(stats.attn_in[size_t(l)].max_abs, wa, alpha));
    plan.mlp.push_back(quant::smoothing_factors(stats.mlp_in[size_t(l)].max_abs, wm, alpha));
  }
  return plan;
}

}  // namespace perry::model
