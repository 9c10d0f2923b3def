#include "model/weight_source.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/tensor_names.h"

namespace perry::model {

namespace {

io::ModelConfig preset_config(io::Architecture arch, int64_t vocab, int64_t hidden, int64_t inter, int64_t layers,
                              int64_t heads, int64_t kv_heads, int64_t head_dim, double theta, bool tied,
                              int64_t max_pos) {
  io::ModelConfig c;
  c.arch = arch;
  c.architecture_name = std::string(io::architecture_name(arch));
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  c.tie_word_embeddings = tied;
  c.max_position_embeddings = max_pos;
  c.rms_norm_eps = 1e-5;
  c.attention_bias = arch == io::Architecture::Qwen2;
  c.qk_norm = arch == io::Architecture::Qwen3;
  return c;
}

}  // namespace

std::vector<std::string> synthetic_preset_names() {
  return {"llama3.2-1b", "llama3-8b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-8b", "qwen2.5-1.5b"};
}

std::optional<io::ModelConfig> synthetic_preset(const std::string& name) {
  using io::Architecture;
  if (name == "llama3.2-1b") {
    auto c = preset_config(Architecture::Llama, 128256, 2048, 8192, 16, 32, 8, 64, 500000.0, true, 131072);
    c.rope_scaling = {io::RopeType::Llama3, 32.0, 1.0, 4.0, 8192};
    return c;
  }
  if (name == "llama3-8b")
    return preset_config(Architecture::Llama, 128256, 4096, 14336, 32, 32, 8, 128, 500000.0, false, 8192);
  if (name == "qwen3-0.6b")
    return preset_config(Architecture::Qwen3, 151936, 1024, 3072, 28, 16, 8, 128, 1000000.0, true, 40960);
  if (name == "qwen3-1.7b")
    return preset_config(Architecture::Qwen3, 151936, 2048, 6144, 28, 16, 8, 128, 1000000.0, true, 40960);
  if (name == "qwen3-8b")
    return preset_config(Architecture::Qwen3, 151936, 4096, 12288, 36, 32, 8, 128, 1000000.0, false, 40960);
  if (name == "qwen2.5-1.5b")
    return preset_config(Architecture::Qwen2, 151936, 1536, 8960, 28, 12, 2, 128, 1000000.0, true, 32768);
  return std::nullopt;
}

SyntheticWeights::SyntheticWeights(io::ModelConfig cfg, std::string preset, uint64_t seed)
    : cfg_(std::move(cfg)), preset_(std::move(preset)), seed_(seed) {
  for (const TensorSpec& s : expected_tensors(cfg_)) {
    Slot slot;
    slot.view.name = s.name;
    slot.view.dtype = DType::BF16;
    slot.view.shape = s.shape;
    slot.is_norm = s.kind == TensorKind::Norm;
    slot.is_bias = s.kind == TensorKind::Bias;
    slots_.emplace(s.name, std::move(slot));
  }
}

bool SyntheticWeights::has(const std::string& name) const { return slots_.count(name) != 0; }

const io::TensorView& SyntheticWeights::get(const std::string& name) const {
  auto it = slots_.find(name);
  if (it == slots_.end()) fail("synthetic {}: no tensor '{}'", preset_, name);
  Slot& s = it->second;
  if (s.view.data) return s.view;
  const int64_t n = s.view.numel();
  s.data.resize(size_t(n));
  uint64_t name_hash = 1469598103934665603ull;
  for (char ch : name) name_hash = (name_hash ^ uint8_t(ch)) * 1099511628211ull;
  const int64_t k = s.view.shape.back();
  const float amp = s.is_norm ? 0.1f : s.is_bias ? 0.02f : std::sqrt(3.0f / float(k));
  const float center = s.is_norm ? 1.0f : 0.0f;
  uint16_t* out = s.data.data();
  const uint64_t seed = seed_ ^ name_hash;
  // Counter-based generator (splitmix64) so threads fill disjoint ranges deterministically.
  thread_pool().parallel_for(size_t(n), 1 << 16, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      uint64_t z = seed + (uint64_t(i) + 1) * 0x9e3779b97f4a7c15ull;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      float u = float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
      out[i] = f32_to_bf16(center + amp * u);
    }
  });
  s.view.data = reinterpret_cast<const uint8_t*>(out);
  s.view.nbytes = size_t(n) * 2;
  return s.view;
}

void SyntheticWeights::release(const std::string& name) const {
  auto it = slots_.find(name);
  if (it == slots_.end()) return;
  it->second.data.resize(0);
  it->second.view.data = nullptr;
  it->second.view.nbytes = 0;
}

}  // namespace perry::model
