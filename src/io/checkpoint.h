// A Hugging Face checkpoint directory: config.json, model.safetensors or a sharded set
// (model.safetensors.index.json), tokenizer files, generation_config.json.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "io/safetensors.h"

namespace perry::io {

struct GenerationDefaults {
  std::vector<int32_t> eos_token_ids;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  std::optional<bool> do_sample;
};

class Checkpoint {
 public:
  // Opens and validates everything but the tokenizer (loaded by the tokenizer layer from
  // tokenizer_json_path()). Throws perry::Error naming the file and the problem.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const GenerationDefaults& generation_defaults() const { return generation_; }
  const nlohmann::json& tokenizer_config() const { return tokenizer_config_; }  // {} if absent
  std::string tokenizer_json_path() const { return dir_ + "/tokenizer.json"; }
  std::optional<std::string> chat_template() const;  // tokenizer_config.json or chat_template.jinja

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor, or a perry::Error naming the missing tensor and the checkpoint.
  const TensorView& tensor(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  size_t total_bytes() const;

 private:
  std::string dir_;
  ModelConfig config_;
  GenerationDefaults generation_;
  nlohmann::json tokenizer_config_ = nlohmann::json::object();
  std::string chat_template_file_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

GenerationDefaults parse_generation_config(const std::string& json_text, const std::string& origin);

}  // namespace perry::io
