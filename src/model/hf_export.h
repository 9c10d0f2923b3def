// Writes any WeightSource (above all a synthetic preset) as a Hugging Face checkpoint directory:
// config.json that transformers loads as LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM,
// generation_config.json, and the tensors under their HF names in their stored dtype (bf16 for
// synthetic weights) — one model.safetensors, or HF-style shards model-0000i-of-0000n.safetensors
// with model.safetensors.index.json when the total exceeds the shard size. Streams one tensor at a
// time (get → write → release), so an 8B model never has two copies in memory. The result loads
// with perry's own loader bit-identically (tests/model/test_export.cpp) and lets peers (transformers,
// llama.cpp converters) run on exactly the weights perry measures. No tokenizer is written.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/weight_source.h"

namespace perry::model {

struct HfExportOptions {
  uint64_t max_shard_bytes = 5000000000ull;  // HF's default; 0 = always one model.safetensors
  // Called after each tensor is written: (tensors done, tensors total, name).
  std::function<void(int64_t, int64_t, const std::string&)> progress;
  // Called after each safetensors file is complete: (path, bytes of tensor data).
  std::function<void(const std::string&, uint64_t)> file_done;
};

struct HfExportResult {
  std::vector<std::string> files;  // safetensors files written, in order
  uint64_t total_bytes = 0;        // tensor data bytes (the index's metadata.total_size)
  int64_t tensors = 0;
};

// The config.json perry writes for `cfg` (model_config_to_json plus the fields transformers
// expects to find: hidden_act, use_cache, ...).
nlohmann::json hf_config_json(const io::ModelConfig& cfg);

// Creates `out_dir` if needed and replaces any model*.safetensors / index / config files in it.
// Throws perry::Error on a missing tensor or an I/O failure (a partial shard is removed).
HfExportResult export_hf_checkpoint(const WeightSource& src, const std::string& out_dir,
                                    const HfExportOptions& opts = {});

}  // namespace perry::model
