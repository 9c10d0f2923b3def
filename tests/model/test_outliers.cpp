// The outlier-stressed model computes the same float function as the original (exact power-of-two
// scalings), while its activations carry large channels; SmoothQuant folding keeps the float
// function too, and with w8a8 it recovers accuracy lost to the outliers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "model/calibration.h"
#include "model/model.h"
#include "model/outlier_stress.h"
#include "tiny_checkpoint.h"

using namespace perry;
using namespace perry::model;

namespace {
std::vector<float> logits_of(const std::string& dir, const std::vector<int32_t>& ids,
                             std::optional<quant::QuantMode> mode = {}, const SmoothingPlan* plan = nullptr,
                             CalibrationStats* stats = nullptr) {
  LoadOptions o;
  o.dir = dir;
  o.quant = mode;
  o.smoothing = plan;
  auto m = Model::load(o);
  if (stats) m->set_calibration(stats);
  auto c = m->make_cache(int64_t(ids.size()), 1);
  std::vector<float> out;
  m->forward({{0, ids.data(), int64_t(ids.size()), true}}, c, out);
  return out;
}
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / den;
}
}  // namespace

TEST(Outliers, FloatFunctionUnchangedAndSmoothQuantRecovers) {
  auto cfg = test_util::tiny_config(io::Architecture::Qwen3);
  const std::string base = test_util::write_tiny_checkpoint("outlier_base", cfg, 3);
  const std::string stressed = (std::filesystem::temp_directory_path() / "perry_test_models" / "outlier_stressed").string();
  write_outlier_stressed(base, stressed, 3, 7);
  std::vector<int32_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 13 + 5) % 97);
  auto f0 = logits_of(base, ids), f1 = logits_of(stressed, ids);
  // Power-of-two scalings are exact in bf16: the float model computes identical numbers.
  EXPECT_EQ(f0, f1);

  // The stressed activations really carry outliers: the calibration statistics show channels
  // ≥ 10× the median channel.
  CalibrationStats stats;
  logits_of(stressed, ids, {}, nullptr, &stats);
  auto v = stats.attn_in[0].max_abs;
  std::vector<float> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(sorted.back(), 10 * sorted[sorted.size() / 2]);

  LoadOptions lo;
  lo.dir = stressed;
  auto m = Model::load(lo);
  auto plan = compute_smoothing_plan(m->weights(), stats, 0.5);

  // SmoothQuant folding in float mode leaves the function unchanged. Checked on an F32 copy so
  // both sides compute in fp32 (the bf16 GEMM's activation rounding would blur the comparison).
  const std::string base32 = test_util::write_tiny_checkpoint("outlier_base32", cfg, 3, DType::F32);
  const std::string stressed32 = (std::filesystem::temp_directory_path() / "perry_test_models" / "outlier_stressed32").string();
  write_outlier_stressed(base32, stressed32, 3, 7);
  CalibrationStats stats32;
  auto f32_ref = logits_of(stressed32, ids, {}, nullptr, &stats32);
  LoadOptions lo32;
  lo32.dir = stressed32;
  auto plan32 = compute_smoothing_plan(Model::load(lo32)->weights(), stats32, 0.5);
  auto fs = logits_of(stressed32, ids, quant::QuantMode::F32, &plan32);
  EXPECT_LT(rel(fs, f32_ref), 1e-4);

  // w8a8 error against float: smoothing must reduce it on the stressed model.
  auto q_plain = logits_of(stressed, ids, quant::QuantMode::W8A8);
  auto q_smooth = logits_of(stressed, ids, quant::QuantMode::W8A8, &plan);
  EXPECT_LT(rel(q_smooth, f0), rel(q_plain, f0));
}
