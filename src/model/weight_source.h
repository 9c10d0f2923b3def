// Where a model's tensors come from: a Hugging Face checkpoint on disk (memory-mapped), or
// synthetic random weights at the real shapes of a named preset (speed measurements without files).
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "io/checkpoint.h"

namespace perry::model {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const io::ModelConfig& config() const = 0;
  virtual bool has(const std::string& name) const = 0;
  // The tensor (throws perry::Error naming it when missing). For synthetic sources the bytes are
  // generated on first request and stay valid as long as the source lives.
  virtual const io::TensorView& get(const std::string& name) const = 0;
  // The tensor's storage type without producing its bytes (a synthetic source generates on get()).
  virtual DType dtype(const std::string& name) const { return get(name).dtype; }
  // Drops a tensor's bytes once the model has converted it (keeps quantizing a synthetic 8B model
  // within memory). No-op for memory-mapped checkpoints.
  virtual void release(const std::string& name) const {}
  virtual std::string describe() const = 0;
};

class CheckpointWeights : public WeightSource {
 public:
  explicit CheckpointWeights(std::shared_ptr<const io::Checkpoint> ckpt) : ckpt_(std::move(ckpt)) {}
  const io::ModelConfig& config() const override { return ckpt_->config(); }
  bool has(const std::string& name) const override { return ckpt_->has(name); }
  const io::TensorView& get(const std::string& name) const override { return ckpt_->tensor(name); }
  std::string describe() const override { return ckpt_->dir(); }
  const io::Checkpoint& checkpoint() const { return *ckpt_; }

 private:
  std::shared_ptr<const io::Checkpoint> ckpt_;
};

// Presets: llama3.2-1b, llama3-8b, qwen3-0.6b, qwen3-1.7b, qwen3-8b, qwen2.5-1.5b.
std::vector<std::string> synthetic_preset_names();
std::optional<io::ModelConfig> synthetic_preset(const std::string& name);

class SyntheticWeights : public WeightSource {
 public:
  // Random bf16 weights (seeded, never zeros): linear weights ~ U(-a, a) with a = sqrt(3/K) so
  // activations keep unit scale through the layers, norm weights ~ 1 ± 0.1.
  SyntheticWeights(io::ModelConfig cfg, std::string preset, uint64_t seed = 1234);
  const io::ModelConfig& config() const override { return cfg_; }
  bool has(const std::string& name) const override;
  const io::TensorView& get(const std::string& name) const override;
  DType dtype(const std::string& name) const override { return has(name) ? DType::BF16 : get(name).dtype; }
  void release(const std::string& name) const override;
  std::string describe() const override { return "synthetic " + preset_; }

 private:
  struct Slot {
    io::TensorView view;
    AlignedBuffer<uint16_t> data;
    bool is_norm = false, is_bias = false;
  };
  io::ModelConfig cfg_;
  std::string preset_;
  uint64_t seed_;
  mutable std::map<std::string, Slot> slots_;
};

}  // namespace perry::model
